"""D21, far from the hang: a retry after an out-of-memory error that only one rank takes.

Broken: each step averages the gradients with one all_reduce (``average_gradients``). A step
whose batch does not fit in memory is retried in two halves, and the retry averages each half's
gradients as it goes: two all_reduces where the others make one. Rank 1's batch at step 3 is too
big, so rank 1 is one collective ahead from then on. Nothing stops yet: every all_reduce has a
partner of the same shape. At the end the others' last all_reduce meets rank 1's barrier, and
the job freezes nine collectives after the branch that caused it.
Fixed (--fix): the halves accumulate their gradients locally and the step averages them once,
so a retried step makes the same collectives as any other.
"""

import argparse
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--fix", action="store_true")
parser.add_argument("--steps", type=int, default=12)
args = parser.parse_args()

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
MAX_ROWS = 64  # what fits in memory at once


def batch_for(step: int) -> torch.Tensor:
    rows = 96 if (rank == 1 and step == 3) else 32  # one oversized batch, on one rank
    return torch.randn(rows, 8)


def backward(x: torch.Tensor) -> None:
    if x.shape[0] > MAX_ROWS:
        raise torch.OutOfMemoryError(f"{x.shape[0]} rows do not fit (at most {MAX_ROWS})")
    model(x).pow(2).mean().backward()


def average_gradients() -> None:
    flat = torch.cat([p.grad.flatten() for p in model.parameters()])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for p in model.parameters():
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()


for step in range(args.steps):
    x = batch_for(step)
    opt.zero_grad()
    try:
        backward(x)
    except torch.OutOfMemoryError:
        opt.zero_grad()
        for half in x.chunk(2):
            backward(half)
            if not args.fix:
                average_gradients()  # each half averaged on its own: one collective too many
        if not args.fix:
            opt.step()
            continue
    average_gradients()
    opt.step()

dist.barrier()  # every rank done before the checkpoint
if rank == 0:
    print(f"trained {args.steps} steps", flush=True)
dist.destroy_process_group()
