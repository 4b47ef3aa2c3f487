"""Rank 0 waits in a barrier; rank 1 runs a catastrophic regex that holds the GIL, so its probe
thread cannot answer and the watchdog must fall back to SIGUSR1 + faulthandler."""

import os
import re

import torch.distributed as dist

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
if dist.get_rank() == 0:
    dist.barrier()
else:
    re.match(r"(a+)+$", "a" * 40 + "b")  # exponential backtracking without releasing the GIL
