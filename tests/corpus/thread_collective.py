"""A collective from a background thread: rank 1 runs a health-check thread that calls a
barrier the other ranks never call, in the middle of the training loop's all_reduces. Rank 0
waits in its all_reduce where rank 1's thread is in the barrier."""
# expect: {"ranks": 2, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [1], "site": "health check", "thread": true}

import threading
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(4)


def health_check() -> None:
    dist.barrier()  # site: health check


for step in range(6):
    dist.all_reduce(x)  # site: loop
    if rank == 1 and step == 2:
        checker = threading.Thread(target=health_check, name="health-check", daemon=True)
        checker.start()
        time.sleep(0.5)
dist.destroy_process_group()
