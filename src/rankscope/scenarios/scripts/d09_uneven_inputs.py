"""D9: uneven inputs under DDP — the rank with fewer batches leaves while the others still reduce.

Broken: each rank reads its own shard, and rank 1's shard is one batch shorter (a per-rank filter
dropped samples). Rank 1 finishes its loop and waits in the barrier before saving, while rank 0
runs one more DDP step whose gradient all_reduce has no partner.
Fixed (--fix): the loop runs under DDP's Join context manager, which shadows the finished rank's
collectives until every rank is done.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--fix", action="store_true")
parser.add_argument("--batches", type=int, default=4)
args = parser.parse_args()

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
shard = [torch.randn(8, 4) for _ in range(args.batches - (1 if rank == 1 else 0))]


def train() -> None:
    for x in shard:
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


if args.fix:
    with Join([model]):
        train()
else:
    train()
print(f"rank {rank}: trained on {len(shard)} batches", flush=True)
dist.barrier()  # every rank meets here before the checkpoint
dist.destroy_process_group()
