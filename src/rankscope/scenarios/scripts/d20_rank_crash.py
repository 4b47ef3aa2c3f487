"""D20: one rank diverges (a NaN from a bad sample) and raises; the others wait for it.

Broken: rank 1 draws a corrupt sample at step 3, its loss is NaN, and its guard raises. The other
ranks are already inside the gradient all_reduce of step 3: the crash is the cause, the hang (or,
on gloo, the "connection closed" error on the survivors) is the symptom.
Fixed (--fix): the data pipeline drops non-finite samples before they reach the model.
"""

import argparse
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--fix", action="store_true")
parser.add_argument("--steps", type=int, default=6)
args = parser.parse_args()

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)


def batch(step: int) -> torch.Tensor:
    x = torch.randn(8, 4)
    if rank == 1 and step == 3:
        x[2, 1] = float("nan")  # the corrupt sample lands on rank 1 only
    if args.fix:
        x = x[torch.isfinite(x).all(dim=1)]
    return x


for step in range(args.steps):
    loss = model(batch(step)).pow(2).mean()
    if not torch.isfinite(loss):
        raise FloatingPointError(f"rank {rank}: loss is {loss.item()} at step {step}")
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    model.zero_grad()
dist.destroy_process_group()
