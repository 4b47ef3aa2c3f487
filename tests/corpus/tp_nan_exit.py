"""A NaN guard that exits one rank of a tensor-parallel pair: tp0 [0, 1] and tp1 [2, 3], each
step an all_reduce of activations on the rank's tp group, then one of the loss on the world.
At step 5 rank 3's local activations hold a NaN and its guard prints "activations are nan at step
5, stopping" and calls sys.exit(0). Its tp partner, rank 2, enters tp1 #6 without it; ranks 0
and 1 get through tp0 #6 and enter the world's #6 without ranks 2 and 3."""
# expect: {"ranks": 4, "verdict": "hang", "cause": "early_exit", "culprits": [3], "site": "exit", "parting": "guard", "values": ["bad"], "first": {"pg": "tp1", "seq": 6}}

import sys

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
rank = dist.get_rank()
tp = [dist.new_group([0, 1], group_desc="tp0"), dist.new_group([2, 3], group_desc="tp1")]
tp = tp[rank // 2]
torch.manual_seed(rank)
layer = nn.Linear(8, 8)


def guard(t: torch.Tensor, step: int) -> None:
    bad = bool(t.isnan().any())
    if bad:  # site: guard
        print(f"activations are nan at step {step}, stopping", flush=True)
        sys.exit(0)  # site: exit


for step in range(8):
    x = torch.randn(4, 8)
    if rank == 3 and step == 5:
        x[0, 0] = float("nan")
    with torch.no_grad():
        act = layer(x)
        guard(act, step)
        dist.all_reduce(act, group=tp)  # site: tp
        dist.all_reduce(act.pow(2).mean().reshape(1))  # site: loss
dist.destroy_process_group()
