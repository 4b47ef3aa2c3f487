"""Four ranks on two SLURM nodes. After one all_reduce together, local rank 1 of the second node
sleeps where the others call the next all_reduce: they wait for it, it never comes."""

import os
import time

import torch
import torch.distributed as dist

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
t = torch.ones(4)
dist.all_reduce(t)
print(f"rank {dist.get_rank()} on {os.environ.get('SLURMD_NODENAME')}", flush=True)
if os.environ.get("SLURM_NODEID") == "1" and os.environ.get("LOCAL_RANK") == "1":
    time.sleep(600)  # site: culprit
else:
    dist.all_reduce(t)  # site: others
dist.destroy_process_group()
