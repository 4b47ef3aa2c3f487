"""A DataLoader worker deadlocked by fork: on rank 1 a cache-refresh thread holds the cache's lock
at the moment the DataLoader starts its worker process. The worker is a fork: it gets the lock
held, and no thread to release it, so its first `__getitem__` blocks for ever at `with
cache_lock:`. Rank 1's training loop waits for a batch that never comes while rank 0 waits for it
in the all_reduce."""
# expect: {"ranks": 2, "verdict": "hang", "cause": "stuck_outside", "recipe": "D19", "culprits": [1], "site": "batch", "activity": "dataloader"}

import threading
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

dist.init_process_group("gloo")
rank = dist.get_rank()
cache_lock = threading.Lock()
cache: dict[int, torch.Tensor] = {}


class Cached(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        with cache_lock:
            if i not in cache:
                cache[i] = torch.full((4,), float(i))
            return cache[i]


def refresh_cache() -> None:
    with cache_lock:
        time.sleep(2.0)  # reads the cache's index from disk
        cache.clear()


if rank == 1:
    threading.Thread(target=refresh_cache, name="cache-refresh", daemon=True).start()
    time.sleep(0.2)
loader = DataLoader(Cached(), batch_size=8, num_workers=1, multiprocessing_context="fork")
for batch in loader:  # site: batch
    dist.all_reduce(batch)
dist.destroy_process_group()
