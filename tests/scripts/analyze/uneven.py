"""Uneven inputs: rank 1 has one batch fewer, leaves the loop and exits 0 while rank 0 still
reduces its last gradient (recipe D9)."""

import os

import torch
import torch.distributed as dist

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank = dist.get_rank()
batches = 3 if rank == 1 else 4
grad = torch.ones(4)
for _ in range(batches):
    dist.all_reduce(grad)  # site: all_reduce
