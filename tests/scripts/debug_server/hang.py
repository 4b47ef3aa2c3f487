"""Rank 1 sleeps while rank 0 waits in an all_reduce, under torch's own debug server.

No rankscope probe runs here: the test starts the job with plain torchrun, as a user's job would
be, and reads it through the debug server alone (``rankscope attach``). The frontend's port comes
from ``DEBUG_SERVER_PORT``; rank 1 creates ``READY_FILE`` as it falls asleep. The sleep and the
timeout are bounded, so a job that a crashed test left behind ends by itself.
"""

import datetime
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.debug import start_debug_server

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=150))
start_debug_server(port=int(os.environ["DEBUG_SERVER_PORT"]))
rank = dist.get_rank()
x = torch.ones(4)
for _ in range(3):
    dist.all_reduce(x)
if rank == 1:
    Path(os.environ["READY_FILE"]).touch()
    time.sleep(120)  # site: sleep
dist.all_reduce(x)  # site: wait
