"""Rank 0 runs one DDP step more than rank 1, which then idles: rank 0 blocks in DDP's gradient
all_reduce, a collective torch issues from C++ (the probe's wrappers never see it)."""

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank = dist.get_rank()
model = DDP(torch.nn.Linear(4, 1))
for _ in range(3 if rank == 0 else 2):
    model(torch.randn(8, 4)).sum().backward()
time.sleep(600)
