"""Rank 1 computes for a while (CPU-bound, outside any collective) before the second all_reduce,
while rank 0 already waits in it: a straggler, not a hang. ``sleep`` pauses instead, idle;
``child`` waits for a process it started that computes (a compiler, say): busy."""

import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist

seconds = float(sys.argv[1])
how = sys.argv[2] if len(sys.argv) > 2 else "compute"
dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank = dist.get_rank()
x = torch.ones(4)
dist.all_reduce(x)
if rank == 1:
    if how == "sleep":
        time.sleep(seconds)
    elif how == "child":
        spin = f"import time\nt = time.monotonic() + {seconds}\nwhile time.monotonic() < t: pass"
        subprocess.run([sys.executable, "-c", spin], check=True)
    else:
        deadline = time.monotonic() + seconds
        a = torch.randn(64, 64)
        while time.monotonic() < deadline:
            a = torch.tanh(a @ a)
dist.all_reduce(x)
dist.destroy_process_group()
