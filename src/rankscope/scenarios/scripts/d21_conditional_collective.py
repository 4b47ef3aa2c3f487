"""D21: a collective inside ``if rank == 0`` — the metric all_reduce that only rank 0 reaches.

Broken: after training, rank 0 evaluates and averages its validation loss over the world with an
all_reduce inside the rank-0 branch; the other ranks never call it and move on to the final barrier.
Rank 0 waits in all_reduce, the rest wait in barrier: the job freezes without an error.
Fixed (--fix): every rank computes and all-reduces the metric; only the printing is gated.
"""

import argparse
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--fix", action="store_true")
parser.add_argument("--steps", type=int, default=4)
args = parser.parse_args()

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

for _ in range(args.steps):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
    opt.zero_grad()


def validation_loss() -> torch.Tensor:
    with torch.no_grad():
        return model(torch.randn(32, 8)).pow(2).mean().reshape(1)


if args.fix:
    val = validation_loss()
    dist.all_reduce(val)  # every rank takes part in the collective ...
    if rank == 0:  # ... and only the side effect is gated
        print(f"validation loss {val.item() / world:.4f}", flush=True)
elif rank == 0:
    val = validation_loss()
    dist.all_reduce(val)  # BUG: the other ranks never get here
    print(f"validation loss {val.item() / world:.4f}", flush=True)

dist.barrier()
dist.destroy_process_group()
