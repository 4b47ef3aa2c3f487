"""A sub-group collective skipped by one rank: group g = [0, 1]; each step does an all_reduce
on g, then one on the default group, but rank 1 skips the one on g at step 4 (a condition on
the rank and the step). Rank 0 waits in g for rank 1; rank 1 went on to the default group."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [1], "site": "default", "chain": [0, 1]}

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
g = dist.new_group([0, 1])
x = torch.ones(4)
for step in range(6):
    if rank in (0, 1) and not (rank == 1 and step == 4):
        dist.all_reduce(x, group=g)  # site: g
    dist.all_reduce(x)  # site: default
dist.destroy_process_group()
