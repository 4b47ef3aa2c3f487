"""A rank stuck on a lock outside the collectives: on rank 1 a logging thread takes the log
lock and then sleeps while holding it; the main thread blocks at `with log_lock:` before its
next all_reduce, which rank 0 waits in."""
# expect: {"ranks": 2, "verdict": "hang", "cause": "stuck_outside", "recipe": "D19", "culprits": [1], "site": "lock", "activity": "lock"}

import threading
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
log_lock = threading.Lock()


def flush_logs() -> None:
    with log_lock:
        time.sleep(120)  # site: holder


x = torch.ones(4)
for step in range(4):
    dist.all_reduce(x)  # site: loop
    if rank == 1 and step == 1:
        threading.Thread(target=flush_logs, name="log-flusher", daemon=True).start()
        time.sleep(0.3)
    with log_lock:  # site: lock
        pass
dist.destroy_process_group()
