"""monitored_barrier names the late rank: rank 1 sleeps through the barrier's timeout, rank 0's
monitored_barrier fails naming rank 1, and torchrun ends rank 1 while it still sleeps."""
# expect: {"ranks": 2, "verdict": "hang", "cause": "stuck_outside", "recipe": "D19", "culprits": [1], "site": "sleep", "activity": "sleep"}

import datetime
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
dist.all_reduce(torch.ones(4))  # site: warm
if rank == 1:
    time.sleep(120)  # site: sleep
dist.monitored_barrier(timeout=datetime.timedelta(seconds=3))  # site: barrier
dist.destroy_process_group()
