"""Two ranks make one all_reduce, then wait for a file named ``go`` in the run directory; after
it, rank 1 sleeps where rank 0 calls the next all_reduce: a hang that starts on the test's cue."""

import os
import time

import torch
import torch.distributed as dist

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
t = torch.ones(4)
dist.all_reduce(t)
go = os.path.join(os.environ["RANKSCOPE_RUN_DIR"], "go")
while not os.path.exists(go):
    time.sleep(0.1)
if dist.get_rank() == 1:
    time.sleep(600)  # site: culprit
else:
    dist.all_reduce(t)  # site: others
dist.destroy_process_group()
