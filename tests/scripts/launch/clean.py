"""Two all_reduces and a barrier on every rank; exits 0."""

import os

import torch
import torch.distributed as dist

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
t = torch.ones(4)
for _ in range(2):
    dist.all_reduce(t)
dist.barrier()
print(f"rank {dist.get_rank()} sum {t.sum().item():.0f}", flush=True)
dist.destroy_process_group()
