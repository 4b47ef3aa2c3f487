"""D5: ``accelerate launch`` decides from its config and flags which launcher runs underneath.

A plain torch data-parallel loop, launched with ``accelerate launch`` as many people launch any
script: it joins the process group through the environment (``env://``) and averages a gradient.
Broken: the job is launched with ``accelerate launch --cpu`` and a config asking for 2
processes, which reads as the natural way to say "2 processes on CPU". In accelerate 1.x,
``--cpu`` (like ``distributed_type: MULTI_CPU`` in a config) selects the path that expects
``mpirun`` to start the processes; without mpirun it starts ONE plain ``python`` process that
gets MASTER_ADDR and MASTER_PORT but no RANK or WORLD_SIZE, so ``init_process_group`` fails
(recipe D1). A script built on accelerate's ``Accelerator`` fails quieter: it trains alone.
Fixed: nothing in the script changes; the launch keeps the config's
``distributed_type: MULTI_GPU``, accelerate's name for "start the processes with
torch.distributed.run", which works on CPU too. (A script using ``Accelerator`` additionally
needs ``ACCELERATE_USE_CPU=true`` or ``Accelerator(cpu=True)`` on a machine without GPUs, or
each process believes it runs alone.)
"""

import os

import torch
import torch.distributed as dist

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)
model = torch.nn.Linear(8, 1)
for _ in range(3):
    model(torch.randn(16, 8)).pow(2).mean().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    model.zero_grad()
print(f"rank {rank} of {world}: done", flush=True)
dist.barrier()
dist.destroy_process_group()
