"""A checkpoint helper as a library might write it: only the leader writes, then everyone is
meant to meet in a barrier, but the barrier sits inside the leader's branch."""

import os

import torch
import torch.distributed as dist


def is_leader() -> bool:
    return os.environ.get("LOCAL_RANK") == "0"


def save(state: torch.Tensor, every: int, step: int) -> None:
    if step % every:
        return
    leader = is_leader()
    if leader:  # site: lib_decide
        torch.save(state, os.devnull)
        dist.barrier()  # site: lib_barrier
