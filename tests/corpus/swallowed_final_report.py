"""A final report only the main rank asks for, whose helper swallows the error: after training,
rank 0 calls `report_metrics`, which all-reduces the final metrics and, on any RuntimeError,
logs a warning and returns the local figures. Ranks 1 and 2 never call it: they leave after the
last step. Rank 0's all_reduce (#7 of the default group, after six steps' gradients) fails with
"Connection closed by peer" when they go, the helper swallows it, and every rank exits 0; the
ranks made different numbers of calls on the default group, and the paths part at `if rank == 0`."""
# expect: {"ranks": 3, "verdict": "crash", "cause": "swallowed_errors", "run": {"on_stall": "keep"}, "culprits": [0], "site": "report", "parting": "main", "values": ["rank"], "first": {"pg": "default_pg", "seq": 7}}

import logging

import torch
import torch.distributed as dist
from torch import nn

log = logging.getLogger("train")
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def report_metrics(metrics: torch.Tensor) -> torch.Tensor:
    try:
        dist.all_reduce(metrics)  # site: report
        return metrics / world
    except RuntimeError as err:
        log.warning("could not reduce the metrics (%s); reporting this rank's", err)
        return metrics


losses = []
for _step in range(6):
    opt.zero_grad()
    loss = model(torch.randn(16, 8)).pow(2).mean()
    loss.backward()
    flat = torch.cat([p.grad.flatten() for p in model.parameters()])
    dist.all_reduce(flat)
    opt.step()
    losses.append(loss.item())
if rank == 0:  # site: main
    print("final:", report_metrics(torch.tensor([sum(losses) / len(losses), losses[-1]])))
dist.destroy_process_group()
