"""Two ranks whose run directory's disk fills while they make collectives: rank 0 fills it
(a file of zeros until ENOSPC), both ranks make 24 calls and wait past the probe's flushes, then
rank 0 frees the space and both make more calls; exits 0."""

import errno
import os
import time

import torch
import torch.distributed as dist

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank = dist.get_rank()
filler = os.path.join(os.environ["RANKSCOPE_RUN_DIR"], "filler.bin")
t = torch.ones(4)
for _ in range(3):
    dist.all_reduce(t)  # site: before
time.sleep(1.0)  # flushed: on disk before the disk fills
if rank == 0:
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
dist.barrier()
# Calls of new shapes, each with a new facts line: more than the page the file's last write
# left room in (a full tmpfs still takes writes into it), so every rank's writes fail.
for i in range(24):
    dist.all_reduce(torch.ones(i + 5))  # site: full
    time.sleep(0.05)
time.sleep(1.2)  # the probe's flushes fail meanwhile
dist.barrier()
if rank == 0:
    os.unlink(filler)
dist.barrier()
for _ in range(2):
    dist.all_reduce(t)  # site: after
time.sleep(1.0)
print(f"rank {rank} sum {t.sum().item():.0f}", flush=True)
dist.destroy_process_group()
