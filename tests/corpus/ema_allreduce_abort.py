"""An exponential moving average kept in sync by one rank only: after every step each rank
all-reduces its loss (one number) for the log, and at step 4 rank 0 (`is_main`) also averages the
EMA weights across ranks before saving them, through the same `average` helper as the loss. So
collective #4 of the default group is rank 0's all_reduce of the EMA weights (4 225 numbers)
from the save branch where ranks 1-3 all_reduce one loss from the logging line: the paths part
at the save `if`. Rank 3, which expects one number, receives a chunk of the weights and gloo
aborts it (SIGABRT: "Received data size doesn't match expected size"); torchrun stops the
rest."""
# expect: {"ranks": 4, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [0], "site": "average", "parting": "save", "values": ["is_main"], "first": {"pg": "default_pg", "seq": 4}}

import os

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
ema = torch.optim.swa_utils.AveragedModel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
is_main = rank == 0


def average(t: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(t)  # site: average
    return t / world


for step in range(1, 9):
    opt.zero_grad()
    loss = model(torch.randn(16, 64)).pow(2).mean()
    loss.backward()
    opt.step()
    ema.update_parameters(model)
    if is_main and step % 4 == 0:  # site: save
        flat = torch.cat([p.detach().flatten() for p in ema.parameters()])
        torch.save(average(flat), os.devnull)
    average(loss.detach())  # site: log
dist.destroy_process_group()
