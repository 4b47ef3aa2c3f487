"""Mismatched collectives under TORCH_DISTRIBUTED_DEBUG=DETAIL: rank 0 calls all_gather while
rank 1 calls all_reduce, so the check before the collective fails on both ranks at once."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(4)
dist.all_reduce(t)
if rank == 0:
    dist.all_gather([torch.zeros(4) for _ in range(2)], t)
else:
    dist.all_reduce(t)
dist.destroy_process_group()
