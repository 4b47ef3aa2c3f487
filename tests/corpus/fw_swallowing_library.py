"""A library that swallows the collective's error: after training, rank 0 alone asks a metrics
library for the mean loss; the library's sync all-reduces and, on any RuntimeError, logs a
warning and returns the local value. Ranks 1-2 never call it: they leave after the last step,
rank 0's all_reduce fails with "Connection closed by peer" when they go, the library swallows
it and every rank exits 0. The card names the user's line that led into the library and the
user's `if`, not the library's `except`, as the parting line, and says the library caught the
error."""
# expect: {"ranks": 3, "verdict": "crash", "cause": "swallowed_errors", "run": {"on_stall": "keep"}, "culprits": [0], "site": "report", "parting": "main", "first": {"pg": "default_pg", "seq": 7}, "caught": "quietmetrics"}

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).parent / "site-packages"))
import quietmetrics

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
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
    mean = quietmetrics.synced_mean(torch.tensor(losses).mean())  # site: report
    print(f"mean loss {mean.item():.4f}", flush=True)
dist.destroy_process_group()
