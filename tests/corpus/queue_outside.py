"""A rank waiting on a queue nobody fills: rank 0's prefetch thread dies on a bad record, and
the main thread waits in `queue.get()` for the next batch while rank 1 waits in the all_reduce."""
# expect: {"ranks": 2, "verdict": "hang", "cause": "stuck_outside", "recipe": "D19", "culprits": [0], "site": "get", "activity": "queue"}

import queue
import threading

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
batches: queue.Queue = queue.Queue()


def prefetch() -> None:
    for i in range(10):
        if rank == 0 and i == 2:
            return  # a bad record ends the producer without a word
        batches.put(torch.ones(4) * i)


threading.Thread(target=prefetch, name="prefetch", daemon=True).start()
for _ in range(10):
    batch = batches.get()  # site: get
    dist.all_reduce(batch)  # site: loop
dist.destroy_process_group()
