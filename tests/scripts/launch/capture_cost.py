"""A capture made by hand, then what it cost: whether the compiler (``torch._inductor``) was
imported and how long the capture took, as JSON in the file named by the first argument.
``plain``: collectives called from Python only; ``ddp``: a DDP step (its constructor imports
the compiler itself, and its gradient all_reduce is issued from C++)."""

import json
import sys
import time

import torch
import torch.distributed as dist

import rankscope.probe

out, mode = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
if mode == "ddp":
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(torch.nn.Linear(4, 4))
    model(torch.ones(2, 4)).sum().backward()
else:
    for _ in range(3):
        dist.all_reduce(torch.ones(4))
time.sleep(2.0)  # a job that has run a while: the probe's thread has looked several times
before = "torch._inductor" in sys.modules
start = time.monotonic()
rankscope.probe.current().capture(reason="by_hand")
took = time.monotonic() - start
with open(out, "w") as f:
    json.dump(
        {
            "inductor_before": before,
            "inductor": "torch._inductor" in sys.modules,
            "capture_s": took,
        },
        f,
    )
dist.destroy_process_group()
