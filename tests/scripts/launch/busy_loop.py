"""The last rank spins in a Python loop (outside any collective) for SECONDS (``forever``: it
never leaves) before its fourth all_reduce, while the others already wait in it."""

import os
import sys
import time

import torch
import torch.distributed as dist

seconds = float("inf") if sys.argv[1] == "forever" else float(sys.argv[1])
dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank, last = dist.get_rank(), dist.get_world_size() - 1
x = torch.ones(4)
for _ in range(3):
    dist.all_reduce(x)
if rank == last:
    err, tol = 1.0, 1e-3
    until = time.monotonic() + seconds
    while err > tol:
        err = 1.0 if time.monotonic() < until else 0.0
dist.all_reduce(x)
dist.destroy_process_group()
