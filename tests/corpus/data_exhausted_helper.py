"""Uneven shards behind a helper: each rank's epoch runs in run_epoch(), over a list whose length
depends on the rank; rank 1's list is shorter, so it returns from the helper to the barrier after
it while rank 0 is still in the helper's loop."""
# expect: {"ranks": 2, "verdict": "hang", "cause": "uneven_inputs", "recipe": "D9", "culprits": [1], "site": "barrier", "parting": "loop"}

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
shard = [torch.ones(4) for _ in range(5 - rank)]


def run_epoch() -> None:
    for batch in shard:  # site: loop
        dist.all_reduce(batch)


run_epoch()
dist.barrier()  # site: barrier
dist.destroy_process_group()
