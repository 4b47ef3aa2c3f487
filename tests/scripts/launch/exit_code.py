"""Every rank exits with code 3 + rank, rank 1 before any collective: sys.exit codes per rank."""

import os
import sys

import torch.distributed as dist

rank = int(os.environ["RANK"])
if rank == 1:
    sys.exit(4)
dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
sys.exit(3 + rank)
