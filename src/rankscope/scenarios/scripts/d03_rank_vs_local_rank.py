"""D3: RANK numbers the processes of the whole job; LOCAL_RANK numbers them within one node.

Each rank reads its shard of the data through a DistributedSampler, then trains a few steps.
Before training, the ranks all-gather the sample indices they were given and each checks that no
lower rank holds the same samples (a cheap sanity check of the data split).
Broken: the sampler is built with ``rank=LOCAL_RANK``. On one node the two numbers are equal and
the bug hides; on the second node of a two-node job LOCAL_RANK starts again at 0, so its ranks
read the first node's shards, and half the data is read twice while the other half is never
read. The check fails on the second node's ranks.
Fixed (--fix): the data shard is chosen by the global RANK. LOCAL_RANK is for what belongs to one
machine: on GPUs, ``torch.cuda.set_device(LOCAL_RANK)``. The reverse mix-up,
``set_device(RANK)``, fails on the second node with "invalid device ordinal" (RANK is larger
than the number of GPUs in a node); on CPU there is no device to pick, so this script shows the
same index mix-up on the data instead.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--fix", action="store_true")
args = parser.parse_args()

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank, world = dist.get_rank(), dist.get_world_size()
local_rank = int(os.environ["LOCAL_RANK"])

data = TensorDataset(torch.arange(64, dtype=torch.float32).unsqueeze(1))
shard = rank if args.fix else local_rank  # BUG unfixed: LOCAL_RANK repeats on every node
sampler = DistributedSampler(data, num_replicas=world, rank=shard, shuffle=False)
loader = DataLoader(data, batch_size=8, sampler=sampler)

mine = torch.tensor(list(sampler), dtype=torch.int64)
everyone = [torch.empty_like(mine) for _ in range(world)]
dist.all_gather(everyone, mine)
for other in range(rank):
    shared = set(everyone[other].tolist()) & set(mine.tolist())
    if shared:
        raise RuntimeError(
            f"rank {rank} (local rank {local_rank}) reads the same {len(shared)} samples as "
            f"rank {other}: the data was split by a per-node index"
        )

model = torch.nn.Linear(1, 1)
for (x,) in loader:
    model(x).pow(2).mean().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    model.zero_grad()
print(f"rank {rank}: trained on samples {mine[0].item()}..{mine[-1].item()}", flush=True)
dist.barrier()
dist.destroy_process_group()
