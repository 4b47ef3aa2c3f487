"""Rank 1 computes for a while (CPU-bound, outside any collective) before the second all_reduce,
while rank 0 already waits in it: a straggler, not a hang. ``sleep`` pauses instead, idle."""

import os
import sys
import time

import torch
import torch.distributed as dist

seconds = float(sys.argv[1])
idle = len(sys.argv) > 2 and sys.argv[2] == "sleep"
dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank = dist.get_rank()
x = torch.ones(4)
dist.all_reduce(x)
if rank == 1:
    if idle:
        time.sleep(seconds)
    else:
        deadline = time.monotonic() + seconds
        a = torch.randn(64, 64)
        while time.monotonic() < deadline:
            a = torch.tanh(a @ a)
dist.all_reduce(x)
dist.destroy_process_group()
