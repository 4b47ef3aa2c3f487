"""FSDP2 with uneven data: rank 1 runs out of batches one step early and goes on to the final
barrier, while rank 0 all-gathers the parameters of the next step's forward."""
# expect: {"ranks": 2, "verdict": "hang", "cause": "uneven_inputs", "recipe": "D9", "culprits": [1], "site": "barrier"}

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(4 - (1 if rank == 1 else 0)):
    model(torch.randn(4, 16)).pow(2).mean().backward()  # site: step
    opt.step()
    opt.zero_grad()
dist.barrier()  # site: barrier
dist.destroy_process_group()
