"""Gathering a full state dict on the main rank only: at step 2 rank 0 alone all-reduces every
rank's weights (64 elements, to gather a full state dict) under `if step == 2 and rank == 0:`, while the others
reduce the next step's 8-element gradient. gloo sees the sizes disagree and aborts a rank: the
abort is a consequence; the cause is the collective only rank 0 made."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [0], "site": "gather", "parting": "decide"}

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
weights = torch.ones(64)
for step in range(5):
    dist.all_reduce(torch.ones(8))
    if step == 2 and rank == 0:  # site: decide
        dist.all_reduce(weights)  # site: gather
dist.destroy_process_group()
