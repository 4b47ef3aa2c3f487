"""Roles by rank: rank 0 writes the checkpoint, rank 1 evaluates and waits for everyone in a
barrier, the rest go straight to the next step. The elif is the branch that parts rank 1."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [1], "site": "barrier", "parting": "decide"}

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
w = torch.ones(4)
for step in range(4):
    dist.all_reduce(w)
    if rank == 0:
        torch.save(w, os.devnull)
    elif rank == 1 and step == 1:  # site: decide
        dist.barrier()  # site: barrier
dist.destroy_process_group()
