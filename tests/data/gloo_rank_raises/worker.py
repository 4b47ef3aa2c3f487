"""Rank 1 raises after one all_reduce; rank 0 fails when its peer's connection closes."""

import torch
import torch.distributed as dist


def load_batch(rank: int) -> torch.Tensor:
    if rank == 1:
        raise ValueError(f"corrupt shard on rank {rank}")
    return torch.ones(4)


dist.init_process_group("gloo")
rank = dist.get_rank()
dist.all_reduce(torch.ones(4))
batch = load_batch(rank)
dist.all_reduce(batch)
dist.destroy_process_group()
