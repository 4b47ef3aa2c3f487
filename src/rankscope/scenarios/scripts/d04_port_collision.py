"""D4: two jobs on one host cannot share a rendezvous port.

One cell of a parameter sweep: a short data-parallel run that trains for ``--seconds`` seconds
with a given learning rate. The mistake is not in the script but in how two copies of it are
launched side by side: both with the same fixed port (torchrun's default is 29500). The
first job's torchrun agent serves its store on that port for as long as the job runs; the second
agent cannot bind it and fails before any of its ranks starts, with "address already in use".
The fix is also in the launch: a port per job (``--master-port``, or ``--rdzv-endpoint
localhost:0`` to let torchrun pick a free one; rankscope picks a free port for every job unless
told otherwise). On GPUs, give each job its own devices as well (``CUDA_VISIBLE_DEVICES``).
There is no ``--fix`` switch: the script itself is correct.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--seconds", type=float, default=2.0)
args = parser.parse_args()

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank, world = dist.get_rank(), dist.get_world_size()
print(f"rank {rank}: lr {args.lr}, store on port {os.environ['MASTER_PORT']}", flush=True)
torch.manual_seed(rank)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=args.lr)
deadline = time.monotonic() + args.seconds
steps = 0
while True:
    model(torch.randn(16, 8)).pow(2).mean().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
    opt.zero_grad()
    steps += 1
    done = torch.tensor([float(time.monotonic() > deadline)])
    dist.all_reduce(done)  # every rank stops at the same step
    if done.item() > 0:
        break
    time.sleep(0.05)
print(f"rank {rank}: {steps} steps", flush=True)
dist.barrier()
dist.destroy_process_group()
