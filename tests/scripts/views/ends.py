"""A tiny gloo job that ends the way argv[1] says: clean, abort (rank 1 makes its last
all_reduce of another shape: gloo aborts a rank), sigkill (rank 1 kills itself after a barrier), stall (rank 1
sleeps while the others wait in a barrier), hang (rank 1 calls all_reduce where the others call
barrier: a proven mismatch). Each rank marks steps 0-2 (rankscope.probe.step) as its loop
passes them."""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import rankscope.probe

how = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range(3):
    dist.all_reduce(torch.ones(16))
    rankscope.probe.step(step)
if how == "abort":
    dist.all_reduce(torch.ones(4 if rank == 1 else 16))  # rank 1's of another shape
elif how == "sigkill":
    # every rank has marked its last step before rank 1 dies: without this barrier rank 1
    # can leave its last all_reduce while another rank still receives its part of it
    dist.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
elif how == "stall" and rank == 1:
    time.sleep(300)
elif how == "hang" and rank == 1:
    dist.all_reduce(torch.ones(16))
dist.barrier()
dist.destroy_process_group()
