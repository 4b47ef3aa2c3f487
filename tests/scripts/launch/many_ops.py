"""One call of each kind the probe records, on the world group and on a subgroup (2 ranks)."""

import os

import torch
import torch.distributed as dist

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank = dist.get_rank()
world = dist.get_world_size()
x = torch.ones(3)
dist.all_reduce(x)
dist.broadcast(x, src=0)
dist.all_gather([torch.zeros(3) for _ in range(world)], x)
dist.all_gather_object([None] * world, {"rank": rank})
dist.broadcast_object_list([rank], src=0)
dist.all_to_all_single(torch.zeros(world * 2), torch.ones(world * 2))
if rank == 0:
    dist.send(torch.ones(2), dst=1)
else:
    dist.recv(torch.zeros(2), src=0)
sub = dist.new_group([0, 1])
dist.all_reduce(torch.ones(5, dtype=torch.float64), group=sub)
dist.monitored_barrier()
dist.barrier()
dist.destroy_process_group()
