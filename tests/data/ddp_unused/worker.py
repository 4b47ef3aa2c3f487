"""DDP with a parameter that never gets a gradient (recipe D8): the second iteration fails with
"Expected to have finished reduction in the prior iteration"."""

import torch
import torch.distributed as dist
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 1)
        self.unused = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))


dist.init_process_group("gloo")
model = nn.parallel.DistributedDataParallel(Net())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    loss = model(torch.randn(8, 4)).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
