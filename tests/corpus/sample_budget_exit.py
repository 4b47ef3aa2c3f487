"""A library helper that ends the process with os._exit: every rank spends a sample budget of
400 after each step (corpus_lib.budget), counting its own batches. Rank 3's batches hold 34
samples where the others' hold 32 (its shard has the remainder), so after step 11 it has seen
408, spends its budget and calls os._exit(0) inside the library; the others have seen 384 and
enter the default group's #13, the next step's all_reduce, without it. The library's `if` is
where the paths part."""
# expect: {"ranks": 4, "verdict": "hang", "cause": "early_exit", "culprits": [3], "site": "budget_exit", "parting": "budget_decide", "first": {"pg": "default_pg", "seq": 13}}

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from corpus_lib.budget import SampleBudget

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
budget = SampleBudget(limit=400)
per_batch = 34 if rank == 3 else 32

for _step in range(20):
    x = torch.randn(per_batch, 8)
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    flat = torch.cat([p.grad.flatten() for p in model.parameters()])
    dist.all_reduce(flat)  # site: grads
    opt.step()
    budget.spend(len(x))
dist.destroy_process_group()
