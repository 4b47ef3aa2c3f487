"""Prints the torchrun env contract of every rank as one JSON line and exits 0."""

import json
import os

import torch.distributed as dist

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
keys = ["RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"]
print(json.dumps({k: os.environ.get(k) for k in keys}), flush=True)
dist.barrier()
dist.destroy_process_group()
