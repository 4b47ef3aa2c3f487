"""A NaN guard that ends the rank quietly: `check_finite` is called on every rank at every step,
and at step 7 rank 1's loss is NaN (a record of its shard holds a NaN), so the guard prints
"loss is nan at step 7, stopping" and calls sys.exit(0). Rank 1 leaves after 14 gradient
all_reduces (two a step: weight and bias); ranks 0 and 2 enter the default group's #15 without
it, and gloo fails their call when rank 1's connections close. The guard's `if` is where the paths part; its stacks are gone,
its log line and exit code 0 remain."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "early_exit", "culprits": [1], "site": "exit", "parting": "guard", "values": ["value"], "first": {"pg": "default_pg", "seq": 15}}

import math
import sys

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def check_finite(loss: torch.Tensor, step: int) -> None:
    value = loss.item()
    if math.isnan(value) or math.isinf(value):  # site: guard
        print(f"loss is nan at step {step}, stopping", flush=True)
        sys.exit(0)  # site: exit


def load(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    if rank == 1 and step == 7:
        x[3, 5] = float("nan")
    return x, y


for step in range(12):
    x, y = load(step)
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    check_finite(loss, step)
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)  # site: grads
    opt.step()
dist.destroy_process_group()
