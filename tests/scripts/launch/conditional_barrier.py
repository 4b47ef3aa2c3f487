"""Rank 0 alone enters a barrier (the rank-conditional collective, recipe D21); the rest wait
elsewhere, so the job freezes with no error."""

import os
import time

import torch
import torch.distributed as dist

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank = dist.get_rank()
t = torch.ones(8)
for _ in range(3):
    dist.all_reduce(t)
if rank == 0:
    dist.barrier()  # only rank 0 gets here
time.sleep(600)
