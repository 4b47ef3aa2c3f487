"""D19: ranks enqueue different collectives — the case the debug switches turn into a message.

Broken: rank 0 gathers per-rank token counts with all_gather while the other ranks sum them with
all_reduce (two code paths that drifted apart). Without debug switches the job freezes until the
collective timeout; with TORCH_DISTRIBUTED_DEBUG=DETAIL it fails at once naming both collectives.
Fixed (--fix): every rank calls the same collective.
"""

import argparse
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--fix", action="store_true")
args = parser.parse_args()

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank, world = dist.get_rank(), dist.get_world_size()
tokens = torch.tensor([1000.0 + rank])
for _ in range(2):
    dist.all_reduce(torch.ones(4))  # a few healthy steps first

if rank == 0 or args.fix:
    counts = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(counts, tokens)
    total = torch.cat(counts).sum()
else:
    total = tokens.clone()
    dist.all_reduce(total)  # BUG: rank 0 is in all_gather
print(f"rank {rank}: {total.item():.0f} tokens this step", flush=True)
dist.barrier()
dist.destroy_process_group()
