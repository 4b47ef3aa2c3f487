"""A healthy but slow run: rank 1 computes for a while between collectives (busy, not stuck),
so the others wait for it at every step; the job completes and must be reported healthy."""
# expect: {"ranks": 2, "verdict": "ok"}

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(4)
for _ in range(3):
    if rank == 1:
        end = time.monotonic() + 1.5
        while time.monotonic() < end:  # busy: a slow data pipeline or a big layer
            torch.randn(64, 64) @ torch.randn(64, 64)
    dist.all_reduce(x)
dist.destroy_process_group()
