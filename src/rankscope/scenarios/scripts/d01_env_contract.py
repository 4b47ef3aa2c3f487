"""D1: torch.distributed takes the job's shape from environment variables, not from the machine.

The script is an ordinary data-parallel loop: it joins the default process group through the
``env://`` rendezvous, which reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, then averages
a gradient over the ranks for a few steps.
Broken: started as ``python d01_env_contract.py``. The interpreter sets none of those variables,
so ``init_process_group`` fails at once with "environment variable RANK expected, but not set"
(with RANK set by hand, it would go on to ask for the others in turn).
Fixed: nothing in the script changes. The same file started by torchrun runs on every rank,
because torchrun sets the whole contract for each process it starts (RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT).
"""

import os

import torch
import torch.distributed as dist

CONTRACT = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
seen = ", ".join(f"{key}={os.environ.get(key, '(unset)')}" for key in CONTRACT)
print(f"pid {os.getpid()}: {seen}", flush=True)

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))  # env:// by default
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)
weight = torch.zeros(4)
for _ in range(3):
    grad = torch.randn(4)
    dist.all_reduce(grad)
    weight -= 0.1 * grad / world
print(f"rank {rank} of {world}: weight {weight.sum().item():.4f}", flush=True)
dist.barrier()
dist.destroy_process_group()
