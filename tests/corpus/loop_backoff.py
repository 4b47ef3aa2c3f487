"""A rank asleep later in the loop body than the collective the others wait in: at step 2
every rank is to sync in a barrier at the top of the loop, but rank 2 is still asleep in a
back-off at the bottom of step 1. It has not skipped the barrier; it has not reached it."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "stuck_outside", "recipe": "D19", "culprits": [2], "site": "sleep", "activity": "sleep"}

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(4)
for step in range(4):
    if step == 2:
        dist.barrier()  # site: barrier
    dist.all_reduce(x)
    if rank == 2 and step == 1:
        time.sleep(120)  # site: sleep
dist.destroy_process_group()
