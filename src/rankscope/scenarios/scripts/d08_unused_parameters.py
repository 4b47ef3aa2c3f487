"""D8: a parameter that gets no gradient — DDP's "Expected to have finished reduction" error.

Broken: the model has an auxiliary head whose output the training loop drops (a detached head left
over from an experiment). DDP waits for a gradient from every parameter; the head's bucket never
fills, and the next iteration fails on every rank with "Expected to have finished reduction in the
prior iteration", listing the parameter indices.
Fixed (--fix): the head's output takes part in the loss, as intended (the best fix; setting
``find_unused_parameters=True`` would only hide the bug and slow every step).
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--fix", action="store_true")
args = parser.parse_args()


class TwoHeads(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(8, 8)
        self.main = torch.nn.Linear(8, 1)
        self.aux = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.body(x))
        return self.main(h), self.aux(h)


dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
model = DDP(TwoHeads())
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(3):
    main, aux = model(torch.randn(16, 8))
    loss = main.pow(2).mean()
    if args.fix:
        loss = loss + 0.1 * aux.pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
print(f"rank {dist.get_rank()}: 3 steps done", flush=True)
dist.destroy_process_group()
