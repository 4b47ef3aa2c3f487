"""DDP, 3 steps; the last rank skips the backward of step 2, so it makes one gradient
all_reduce fewer (the reducer's, issued from C++: no Python call of the rank's makes it). Then
it ends (argv[1]): ``barrier`` waits for the others in a barrier; ``exit`` leaves cleanly.
The others wait in the backward of step 3 for a bucket all_reduce that never completes."""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 2))
for step in range(3):
    loss = model(torch.randn(4, 8)).sum()
    if step == 1 and rank == world - 1:
        continue  # site: skip
    loss.backward()  # site: backward
if sys.argv[1] == "barrier":
    dist.barrier()  # site: barrier
dist.destroy_process_group()
