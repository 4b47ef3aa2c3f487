"""A healthy job: every rank runs the same collectives and exits 0."""

import os

import torch
import torch.distributed as dist

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
x = torch.ones(4)
for _ in range(3):
    dist.all_reduce(x)
dist.barrier()
dist.destroy_process_group()
