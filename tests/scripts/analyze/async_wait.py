"""Bucketed async all_reduces overlapped with compute, waited on before the optimizer step (as
hand-written DDP, FSDP and pipeline schedules do); at step 3 one rank diverges (argv[1]):

- ``barrier``: rank 1 enters a barrier first; the others block in ``work.wait()`` of an
  all_reduce that never completes;
- ``lock``: the last rank issues its all_reduces, then blocks on a lock nobody releases; the
  others complete those and wait in the next step's.
"""

import os
import sys
import threading
import time

import torch
import torch.distributed as dist

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank, world = dist.get_rank(), dist.get_world_size()
how = sys.argv[1]
buckets = [torch.ones(64) for _ in range(3)]
stuck = threading.Lock()
stuck.acquire()
# Let the probe warm up first (a second or two after the group forms): while it imports, a rank
# waiting on a lock could be a computing rank it keeps off the GIL, so the watchdog calls it busy.
time.sleep(3)
for step in range(6):
    if step == 3 and how == "barrier" and rank == 1:
        dist.barrier()  # site: barrier
    works = [dist.all_reduce(b, async_op=True) for b in buckets]  # site: issue
    if step == 3 and how == "lock" and rank == world - 1:
        stuck.acquire()  # site: lock
    for work in works:
        work.wait()  # site: wait
dist.destroy_process_group()
