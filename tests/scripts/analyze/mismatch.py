"""Three ranks agree on three all_reduces; then the last rank diverges (argv[1] picks how).

- ``barrier``: rank 0 alone enters a barrier before the next all_reduce (rank-conditional, D21);
- ``op``: the last rank calls all_gather where the others call all_reduce;
- ``shape``: the last rank all_reduces 5 elements where the others reduce 4.
"""

import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank, world = dist.get_rank(), dist.get_world_size()
odd = rank == world - 1
x = torch.ones(4)
for _ in range(3):
    dist.all_reduce(x)
how = sys.argv[1]
if how == "barrier" and rank == 0:
    dist.barrier()  # site: barrier
if how == "op" and odd:
    dist.all_gather([torch.zeros(4) for _ in range(world)], x)  # site: all_gather
elif how == "shape" and odd:
    dist.all_reduce(torch.ones(5))  # site: odd shape
else:
    dist.all_reduce(x)  # site: all_reduce
dist.destroy_process_group()
