"""Rank 1 fails between two all_reduces (argv[1]: ``raise``, ``nan`` or ``oom``); rank 0 is left
waiting in the second one (recipe D20)."""

import os
import sys

import torch
import torch.distributed as dist


def next_loss(rank: int, how: str) -> torch.Tensor:
    if rank == 1 and how == "raise":
        raise ValueError("corrupt sample in shard 1")  # site: raise
    if rank == 1 and how == "oom":
        return torch.empty(1 << 60)  # site: oom (more memory than any machine has)
    loss = torch.tensor([float("nan") if rank == 1 else 0.5])
    if not torch.isfinite(loss).all():
        raise FloatingPointError(f"loss is nan on rank {rank}")  # site: nan
    return loss


dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank = dist.get_rank()
dist.all_reduce(torch.ones(4))
loss = next_loss(rank, sys.argv[1])
dist.all_reduce(loss)  # site: all_reduce
dist.destroy_process_group()
