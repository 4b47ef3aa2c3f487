"""Reported failure (slime PR 2065): a micro-batch alignment target the samples cannot reach.

Rank 0 builds the step's schedule and broadcasts it. It packs samples into micro-batches (long
samples: one per micro-batch) and rounds the count up to a multiple of the data-parallel size so
every rank gets the same number. With 5 single-sample micro-batches at DP 2 the target is 6, but a
single-sample micro-batch cannot be split, so the schedule builder fails its assertion — on rank 0
only, while the other ranks wait in the broadcast for a schedule that never comes.
Fixed (--fix): whole trailing rollouts are dropped until the sample count tiles by the DP size,
and the kept count is recorded, so the target is always reachable.
"""

import argparse
import os

import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--fix", action="store_true")
args = parser.parse_args()

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank, dp = dist.get_rank(), dist.get_world_size()
rollouts = [1, 1, 2, 1] + [1] * (2 * dp - 5) if dp > 2 else [1, 2, 1, 1]  # samples per rollout


def build_schedule(sizes: list[int]) -> dict[str, object]:
    if args.fix:
        while sum(sizes) % dp and sum(sizes) > dp:
            sizes = sizes[:-1]  # drop a whole trailing rollout, never part of one
    samples = sum(sizes)
    target = -(-samples // dp) * dp  # round up to a multiple of the DP size
    assert samples >= target, f"could only produce {samples} micro-batches; need {target}"
    return {"rollouts": len(sizes), "micro_batches": target}


schedule = [build_schedule(rollouts) if rank == 0 else None]
dist.broadcast_object_list(schedule, src=0)
print(f"rank {rank}: schedule {schedule[0]}", flush=True)
dist.destroy_process_group()
