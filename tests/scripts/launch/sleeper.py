"""Every rank sleeps for a long time after init (for stop/attach/owner tests)."""

import os
import time

import torch.distributed as dist

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
print(f"rank {dist.get_rank()} ready", flush=True)
time.sleep(600)
