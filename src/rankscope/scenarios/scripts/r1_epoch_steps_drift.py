"""Reported deadlock (deepmd-kit PR 5570): epoch-derived step counts drift across ranks.

The number of training steps is derived from the number of epochs and the sampler's weights. Each
rank normalises its copy of the weights itself, and floating-point noise in that sum (here: the
order of summation differs per rank) can move the batch total across an integer boundary, so one
rank computes one batch more per epoch than the others. The full-validation schedule is derived from the same
count, so the ranks disagree on when validation starts and how long training lasts: ranks enter
different collectives and the job freezes at the end of the schedule.
Fixed (--fix): rank 0's total is broadcast and every rank derives its schedule from it.
"""

import argparse
import math
import os
import random

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--fix", action="store_true")
args = parser.parse_args()

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank = dist.get_rank()

# Per-system sampling weights, normalised to 1 and then summed by each rank in the order of its
# own shuffled view: the sums differ in the last bit (1.0000000000000002 vs 1.0 on ranks 0 and 1).
rng = random.Random(3)
raw = [rng.random() for _ in range(50)]
weights = [w / sum(raw) for w in raw]
random.Random(rank).shuffle(weights)
batches_per_epoch = math.ceil(sum(weights) * 40)  # 40 batches' worth of samples per epoch
if args.fix:
    shared = [batches_per_epoch]
    dist.broadcast_object_list(shared, src=0)
    batches_per_epoch = shared[0]
num_steps = 2 * batches_per_epoch
validation_start = num_steps - 2  # full validation over the last two steps
print(f"rank {rank}: {batches_per_epoch} batches per epoch -> {num_steps} steps", flush=True)

grad = torch.ones(4)
for step in range(num_steps):
    if step >= validation_start:
        metric = torch.tensor([float(step)])
        dist.all_reduce(metric, op=dist.ReduceOp.MAX)  # validation metric
    else:
        dist.all_reduce(grad)  # training gradients
dist.barrier()
dist.destroy_process_group()
