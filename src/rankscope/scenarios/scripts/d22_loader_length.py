"""D22: ranks get different numbers of batches, so the short rank stops calling collectives.

Broken: the dataset is split by hand with ``samples[rank::world]``; with 8 samples and batch size 2
on 3 ranks, ranks 0 and 1 get 2 batches and rank 2 only 1. Rank 2 leaves the loop and waits in the
final barrier while the others wait in the gradient all_reduce of their second batch.
Fixed (--fix): DistributedSampler pads the split so every rank sees the same number of batches.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--fix", action="store_true")
parser.add_argument("--samples", type=int, default=8)
args = parser.parse_args()

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank, world = dist.get_rank(), dist.get_world_size()
data = TensorDataset(torch.randn(args.samples, 4), torch.randn(args.samples, 1))
if args.fix:
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=False)
    loader = DataLoader(data, batch_size=2, sampler=sampler)
else:
    loader = DataLoader(Subset(data, range(rank, args.samples, world)), batch_size=2)

model = torch.nn.Linear(4, 1)
for epoch in range(2):
    if args.fix:
        sampler.set_epoch(epoch)
    for x, y in loader:
        (model(x) - y).pow(2).mean().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        model.zero_grad()
    print(f"rank {rank}: epoch {epoch} done after {len(loader)} batches", flush=True)
dist.barrier()
dist.destroy_process_group()
