"""Rank 1 is late for a monitored_barrier: rank 0 reports it after the 2 s timeout."""

import datetime
import time

import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 1:
    time.sleep(4)
else:
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=2))
dist.destroy_process_group()
