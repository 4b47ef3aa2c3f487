"""A rank killed in a collective (the OOM killer): rank 1 enters the third all_reduce and dies
of SIGKILL; torchrun ends the others."""
# expect: {"ranks": 3, "verdict": "crash", "cause": "rank_killed", "recipe": "D20", "culprits": [1], "site": "killed"}

import os
import signal
import threading
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(4)
for step in range(3):
    if rank == 1 and step == 2:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
        dist.all_reduce(x)  # site: killed
    elif step == 2:
        time.sleep(30)  # the others are in a long step
    else:
        dist.all_reduce(x)
dist.destroy_process_group()
