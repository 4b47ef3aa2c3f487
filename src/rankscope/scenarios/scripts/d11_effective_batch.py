"""D11: N ranks multiply the effective batch by N, and the learning rate tuned for one is now wrong.

The run's recipe was tuned on one process: batch 16, learning rate 0.05. Under DDP every rank
keeps batch 16, so one optimizer step averages 16 x world samples. The script trains a small
regression, compares the loss after a fixed number of samples with the single-process reference
trained the same way, and fails when the two disagree by more than the tolerance.
Fixed (--fix): the learning rate is scaled with the effective batch (the linear-scaling rule),
and the effective batch is printed so it can be recorded with the run.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--fix", action="store_true")
args = parser.parse_args()

BATCH, LR, SAMPLES = 16, 0.05, 1024
dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank, world = dist.get_rank(), dist.get_world_size()
true_w = torch.arange(1.0, 5.0)


def train(lr: float, *, batch: int, parallel: bool) -> float:
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 1, bias=False)
    model = DDP(net) if parallel else net
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(1 + (rank if parallel else 0))
    for _ in range(SAMPLES // (batch * (world if parallel else 1))):
        x = torch.randn(batch, 4, generator=gen)
        (model(x).squeeze(1) - x @ true_w).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return (net.weight.detach().squeeze(0) - true_w).norm().item()


reference = train(LR, batch=BATCH, parallel=False)
lr = LR * world if args.fix else LR
distributed = train(lr, batch=BATCH, parallel=True)
if rank == 0:
    print(
        f"effective batch {BATCH * world} (batch {BATCH} x {world} ranks), lr {lr}: weight error "
        f"{distributed:.3f} vs {reference:.3f} on one process",
        flush=True,
    )
dist.destroy_process_group()
if distributed > 2 * reference + 0.05:
    raise SystemExit(
        f"rank {rank}: after {SAMPLES} samples the model is {distributed / reference:.1f}x further "
        "from the solution than the single-process run: the learning rate was not scaled"
    )
