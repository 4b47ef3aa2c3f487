"""Reported deadlock (xtuner PR 1852): barrier imbalance in a distributed checkpoint save.

Every rank writes its shard into ``<ckpt>.incomplete/``; rank 0 first removes a stale directory
left by a crashed run (on a slow shared filesystem, so it lags). Broken: nothing orders the cleanup
before the writes, so rank 0 deletes the shard rank 1 already wrote. Rank 1 finds its shard
missing, classifies that as retryable and goes round the retry loop (barrier, rewrite, barrier);
rank 0 saw no error and went on training. The ranks now disagree on how many collectives the save
takes: rank 0 waits in the next step's all_reduce, rank 1 in the retry barrier.
Fixed (--fix): a barrier after rank 0's cleanup, and the retry decision all-reduced (MAX) so every
rank retries, or none.
"""

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--fix", action="store_true")
parser.add_argument("--dir", default=None)
args = parser.parse_args()

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank = dist.get_rank()
root = Path(args.dir or tempfile.gettempdir()) / f"r2-{os.environ.get('MASTER_PORT', 'x')}"
staging = root / "step-10.incomplete"
if rank == 0:
    staging.mkdir(parents=True, exist_ok=True)  # left behind by an earlier, crashed save
dist.barrier()
state = {"w": torch.randn(4)}


def write_shard() -> Path:
    staging.mkdir(parents=True, exist_ok=True)
    shard = staging / f"shard-{rank}.pt"
    torch.save(state, shard)
    return shard


if rank == 0:
    time.sleep(1.0)  # the shared filesystem is slow to list the stale directory
    shutil.rmtree(staging)
    staging.mkdir(parents=True)
if args.fix:
    dist.barrier()  # nobody writes before the cleanup is complete
shard = write_shard()
dist.barrier()  # every shard written
for attempt in range(3):
    retry = torch.tensor([0 if shard.exists() else 1])
    if args.fix:
        dist.all_reduce(retry, op=dist.ReduceOp.MAX)  # one decision for all ranks
    if not retry.item():
        break
    print(f"rank {rank}: shard missing, retrying the save (attempt {attempt + 1})", flush=True)
    dist.barrier()
    shard = write_shard()
    dist.barrier()
if rank == 0:
    staging.rename(root / "step-10")
dist.all_reduce(torch.ones(4))  # the next training step
dist.barrier()
if rank == 0:
    shutil.rmtree(root)
dist.destroy_process_group()
