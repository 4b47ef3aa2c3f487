"""A barrier only rank 0 reaches: after each epoch rank 0 saves a checkpoint and waits in a
barrier meant for everyone, then writes a marker; the other ranks took the other branch and
poll for the marker, which never comes. Their stacks show them past the barrier's line."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [1, 2], "site": "poll"}

import os
import tempfile
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
marker = os.path.join(tempfile.gettempdir(), f"ckpt-{os.getppid()}.done")  # one per job
w = torch.ones(4)
for _epoch in range(2):
    for _step in range(3):
        dist.all_reduce(w)
    if rank == 0:
        torch.save(w, os.devnull)
        dist.barrier()  # site: barrier
        open(marker, "w").close()
    else:
        while not os.path.exists(marker):
            time.sleep(0.2)  # site: poll
dist.destroy_process_group()
