"""Two groups taken in the opposite order on one rank: every rank all_reduces on group a, then
on group b, except rank 1, which does b first (an `if rank == 1` around two calls). Rank 1 waits
in b for the others, which wait in a for rank 1."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [1], "site": "b first", "chain": [1]}

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
a = dist.new_group([0, 1, 2])
b = dist.new_group([0, 1, 2])
x = torch.ones(4)
dist.all_reduce(x)  # site: warm
for _ in range(2):
    if rank == 1:
        dist.all_reduce(x, group=b)  # site: b first
        dist.all_reduce(x, group=a)
    else:
        dist.all_reduce(x, group=a)  # site: a first
        dist.all_reduce(x, group=b)
dist.destroy_process_group()
