"""Tensor parallel on the wrong group at one step: groups tp0 [0, 1] and tp1 [2, 3]. A row-parallel
layer all-reduces its partial output on its tp group, except that its helper falls back to the
whole world when `sequence_parallel` is off, which it is on rank 3 alone at step 3 (its batch is
shorter than the threshold that switches it on). Each step ends with a loss all_reduce on the
world, so at collective #4 of the default group ranks 0 and 1 all-reduce the loss while rank 3
all-reduces its activations from the helper's world arm; rank 2 waits in tp1 (#4) for rank 3."""
# expect: {"ranks": 4, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [3], "site": "world", "parting": "sp", "values": ["sequence_parallel"], "first": {"pg": "default_pg", "seq": 4}}

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
tp_groups = [dist.new_group([0, 1], group_desc="tp0"), dist.new_group([2, 3], group_desc="tp1")]
tp = tp_groups[rank // 2]
torch.manual_seed(rank % 2)
shard = nn.Linear(8, 16, bias=False)  # this rank's rows of the weight
MIN_SP_LEN = 16


def reduce_partial(out: torch.Tensor, sequence_parallel: bool) -> torch.Tensor:
    if sequence_parallel:  # site: sp
        dist.all_reduce(out, group=tp)  # site: tp
    else:
        dist.all_reduce(out)  # site: world
    return out


for step in range(6):
    seq_len = 12 if (rank == 3 and step == 3) else 32
    x = torch.randn(seq_len, 8)
    with torch.no_grad():
        out = reduce_partial(shard(x), sequence_parallel=seq_len >= MIN_SP_LEN)
        loss = out.pow(2).mean().reshape(1)
    dist.all_reduce(loss)  # site: loss
dist.barrier()
dist.destroy_process_group()
