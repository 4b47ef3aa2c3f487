"""Worker for probe_overhead.py: times blocks of 1-element gloo all_reduces.

Under the probe it alternates blocks through the probe's wrapper and through torch's own function
(same process, same peer, same moment), so the ratio isolates what the probe adds per call.
Without the probe it times plain blocks. Rank 0 prints one JSON line.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

BLOCK = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
REPEATS = int(sys.argv[2]) if len(sys.argv) > 2 else 7


def block(fn, t):
    start = time.perf_counter()
    for _ in range(BLOCK):
        fn(t)
    return (time.perf_counter() - start) / BLOCK


dist.init_process_group("gloo")
t = torch.ones(1)
wrapped = dist.all_reduce
original = wrapped
probe = None
if os.environ.get("RANKSCOPE_RUN_DIR"):
    import rankscope.probe

    probe = rankscope.probe.current()
    original = next(fn for mod, name, fn in probe._originals if name == "all_reduce")
    assert getattr(wrapped, "__rankscope__", False), "the probe is not installed"
    deadline = time.monotonic() + 30
    while probe._warmup is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if probe._warmup is not None:
        probe._warmup.join()  # steady state: the one-off import of the first dump is paid
block(original, t)  # warm up both paths
block(wrapped, t)
plain, probed = [], []
for i in range(REPEATS):
    # ABBA order: whichever path runs first after a barrier is not always the same one
    for fn, out in ((original, plain), (wrapped, probed))[:: 1 if i % 2 else -1]:
        distributed_c10d.barrier()
        out.append(block(fn, t))
if dist.get_rank() == 0:
    print(json.dumps({"plain_s": plain, "probed_s": probed, "probe": probe is not None}))
dist.destroy_process_group()
