"""DDP with uneven data: rank 1's shard has one batch fewer; it leaves the loop and waits in the
final barrier while rank 0 runs one more step, whose gradient all_reduce (issued by DDP from
C++, seen only by the flight recorder) has no partner."""
# expect: {"ranks": 2, "verdict": "hang", "cause": "uneven_inputs", "recipe": "D9", "culprits": [1], "site": "barrier"}

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(5 - (1 if rank == 1 else 0)):
    model(torch.randn(4, 8)).pow(2).mean().backward()  # site: backward
    opt.step()
    opt.zero_grad()
dist.barrier()  # site: barrier
dist.destroy_process_group()
