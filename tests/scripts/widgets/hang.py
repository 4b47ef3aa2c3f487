"""Both ranks train for a few steps, printing and marking each; then rank 0 alone enters a
barrier (a rank-conditional collective, recipe D21) and the job freezes with no error."""

import os
import time

import torch
import torch.distributed as dist

import rankscope.probe

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank = dist.get_rank()
grads = torch.ones(8)
for step in range(3):
    dist.all_reduce(grads)
    rankscope.probe.step(step)
    print(f"rank {rank} finished step {step}", flush=True)
    time.sleep(0.5)
if rank == 0:
    dist.barrier()  # only rank 0 gets here
time.sleep(600)
