"""Rank-conditional barrier (recipe D21) on 2 simulated nodes x 2 ranks: rank 0 enters a barrier
the others never call; they wait in the next all_reduce. The stall watchdog captures evidence
(stacks, flight recorder, py-spy) and stops the job."""

import time

import torch
import torch.distributed as dist


def validate(rank: int) -> None:
    if rank == 0:
        dist.barrier()  # only rank 0 gets here


dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(8)
for _ in range(3):
    dist.all_reduce(t)
time.sleep(4)  # as in a job that has run a while: the probe's one-off warm-up is over
validate(rank)
dist.all_reduce(t)
dist.destroy_process_group()
