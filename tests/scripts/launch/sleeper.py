"""Every rank sleeps for a long time after init and a barrier (for stop/attach/owner tests:
they wait for one collective done)."""

import os
import time

import torch.distributed as dist

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
dist.barrier()
print(f"rank {dist.get_rank()} ready", flush=True)
time.sleep(600)
