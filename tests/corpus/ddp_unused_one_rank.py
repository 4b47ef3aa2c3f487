"""DDP with a parameter unused on one rank only: rank 1 takes a shortcut that skips the head for
one kind of batch, so its head gets no gradient; DDP's reducer waits for it and the next step
fails on rank 1 with 'Expected to have finished reduction in the prior iteration'."""
# expect: {"ranks": 2, "verdict": "crash", "cause": "ddp_unused_parameters", "recipe": "D8", "culprits": [1]}

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, shortcut: bool) -> torch.Tensor:
        h = self.body(x)
        return h.sum(dim=1, keepdim=True) if shortcut else self.head(h)


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(Net())
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(4):
    out = model(torch.randn(4, 8), shortcut=rank == 1 and step == 1)  # site: forward
    out.pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
