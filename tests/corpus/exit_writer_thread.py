"""Rank 0 writes its metrics from a background thread that drains a queue. The script never
tells the thread to stop, and it is not a daemon: rank 0 returns from its script, and its
interpreter waits at exit for the thread, which waits for a metric that never comes. The other
ranks exit 0; torchrun waits for rank 0 for ever."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "stuck_at_exit", "culprits": [0], "site": "get", "activity": "queue"}

import os
import queue
import threading

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
metrics: queue.Queue = queue.Queue()


def write_metrics(path: str) -> None:
    with open(path, "a") as out:
        while True:
            step, loss = metrics.get()  # site: get
            out.write(f"{step} {loss:.4f}\n")
            out.flush()


if rank == 0:
    threading.Thread(target=write_metrics, args=(os.devnull,), name="metrics-writer").start()

model = torch.nn.Linear(8, 1)
for step in range(5):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    if rank == 0:
        metrics.put((step, loss.item()))
dist.destroy_process_group()
