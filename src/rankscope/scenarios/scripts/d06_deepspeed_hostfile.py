"""D6: DeepSpeed's launcher finds its nodes and process counts in a hostfile, not in torchrun flags.

A minimal DeepSpeed job: ``deepspeed.init_distributed`` joins the process group from the
environment that the ``deepspeed`` launcher sets (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT; it also sets CROSS_RANK and LOCAL_SIZE, and neither GROUP_RANK nor
LOCAL_WORLD_SIZE), then averages a gradient through ``deepspeed.comm``. On CPU it runs with
``DS_ACCELERATOR=cpu`` and the gloo backend.
Broken: the hostfile says ``localhost:2``, the ``host:count`` form of MPICH's machine files. The
launcher accepts only MPI-style lines, ``<host> slots=<n>``, so it refuses the file before
starting any process: "Hostfile contains a bad entry".
Fixed: nothing in the script changes; the hostfile reads ``localhost slots=2``. With a hostfile
the slots set how many processes each node runs (``--num_gpus``, when given, overrides them).
"""

import os

import torch
import torch.distributed as dist

backend = os.environ.get("RANKSCOPE_BACKEND", "gloo")
if backend == "gloo":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # read when deepspeed is imported
import deepspeed  # noqa: E402
import deepspeed.comm as ds_dist  # noqa: E402

deepspeed.init_distributed(dist_backend=backend)
rank, world = ds_dist.get_rank(), ds_dist.get_world_size()
torch.manual_seed(rank)
model = torch.nn.Linear(8, 1)
for _ in range(3):
    model(torch.randn(16, 8)).pow(2).mean().backward()
    for p in model.parameters():
        ds_dist.all_reduce(p.grad)
        p.grad /= world
    model.zero_grad()
print(f"rank {rank} of {world}: done", flush=True)
ds_dist.barrier()
dist.destroy_process_group()
