"""A broad try/except around the step swallows one rank's error and, with it, that step's
gradient all_reduce: at step 4 rank 1's augmentation raises, its handler logs and goes on. Every
all_reduce comes from the same line, so gloo pairs rank 1's step-5 call with the others' step-4
call and the ranks run on with rank 1 one call behind. After 8 steps rank 1 has made 7 calls and
leaves; the others' #8 fails with "Connection closed by peer", their handler swallows that too,
and every rank exits 0. The ranks' paths first part at #8 (rank 1 has none), though the decision
that caused it, rank 1's handler at step 4, is on no rank's final stack."""
# expect: {"ranks": 3, "verdict": "crash", "cause": "swallowed_errors", "run": {"on_stall": "keep"}, "culprits": [1], "first": {"pg": "default_pg", "seq": 8}}

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def augment(x: torch.Tensor, step: int) -> torch.Tensor:
    if rank == 1 and step == 4:
        raise ValueError("crop window larger than the image")
    return x + 0.01 * torch.randn_like(x)


for step in range(8):
    try:
        x = augment(torch.randn(16, 8), step)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        flat = torch.cat([p.grad.flatten() for p in model.parameters()])
        dist.all_reduce(flat)  # site: grads
        opt.step()
    except Exception as err:  # site: handler
        print(f"rank {rank}: step {step} failed ({err}), skipping it", flush=True)
dist.destroy_process_group()
