"""Reported crash-then-hang (slime PR 1860): empty micro-batches forced by a MAX all-reduce.

With dynamic batch sizes each data-parallel rank packs its own samples into micro-batches, so the
counts differ; the ranks agree on one count with ``all_reduce(MAX)`` so they run the same number of
gradient all_reduces. A rank with fewer samples then has to run empty micro-batches, and building
one from no samples dies in ``torch.cat(): expected a non-empty list of Tensors``. The other ranks
are left waiting in the micro-batch's gradient all_reduce.
Fixed (--fix): an empty micro-batch becomes a zero-length placeholder that contributes nothing to
the loss but still takes part in every collective.
"""

import argparse
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--fix", action="store_true")
args = parser.parse_args()

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank = dist.get_rank()
torch.manual_seed(rank)
# Rank 0's rollouts are long (one per micro-batch); the others' are short (four per micro-batch).
lengths = [900] * 5 if rank == 0 else [200] * 8
budget = 1000  # tokens per micro-batch
micro_batches: list[list[torch.Tensor]] = []
for n in lengths:
    if not micro_batches or sum(len(s) for s in micro_batches[-1]) + n > budget:
        micro_batches.append([])
    micro_batches[-1].append(torch.randn(n))
count = torch.tensor([len(micro_batches)])
dist.all_reduce(count, op=dist.ReduceOp.MAX)
micro_batches += [[] for _ in range(int(count.item()) - len(micro_batches))]

weight = torch.zeros(1, requires_grad=True)
for samples in micro_batches:
    # the fix: an empty micro-batch is a zero-length placeholder that joins the same collectives
    tokens = torch.zeros(0) if args.fix and not samples else torch.cat(samples)
    loss = (tokens * weight).sum()
    loss.backward()
    dist.all_reduce(weight.grad)
    weight.grad = None
print(f"rank {rank}: {len(micro_batches)} micro-batches done", flush=True)
dist.destroy_process_group()
