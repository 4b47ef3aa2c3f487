"""Rank 1 is slow (3 s of extra work) before the second all_reduce; the job still completes."""

import os
import time

import torch
import torch.distributed as dist

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank = dist.get_rank()
x = torch.ones(4)
dist.all_reduce(x)
if rank == 1:
    time.sleep(3.0)
dist.all_reduce(x)  # site: late
dist.all_reduce(x)
dist.destroy_process_group()
