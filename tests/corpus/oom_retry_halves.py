"""A retry on a simulated out-of-memory, far from the hang: at step 2 rank 1's forward pass on
the full batch raises "CUDA out of memory", and its handler retries the batch in two halves,
each through the same `train_step` and `sync_grads` as the normal path. So rank 1 all-reduces
its gradients twice that step: collective #3 of the default group is, on every rank, the
all_reduce in `sync_grads`, but rank 1 reaches it from the retry line where ranks 0 and 2 reach
it from the normal step line; that is where the paths part. gloo pairs the calls by number and
the sizes agree, so nothing fails then: rank 1 simply runs one call ahead. Ten steps later ranks
0 and 2 wait in the final barrier (#11) while rank 1 waits in its last step's all_reduce (#11).
"""
# expect: {"ranks": 3, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [1], "site": "grads", "parting": "retry", "first": {"pg": "default_pg", "seq": 3}}

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def sync_grads(model: nn.Module) -> None:
    flat = torch.cat([p.grad.flatten() for p in model.parameters()])
    dist.all_reduce(flat)  # site: grads
    flat /= world
    offset = 0
    for p in model.parameters():
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()


def forward(batch: torch.Tensor, step: int) -> torch.Tensor:
    if rank == 1 and step == 2 and len(batch) > 32:  # this rank's longest batch
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    return model(batch).pow(2).mean()


def train_step(batch: torch.Tensor, step: int) -> None:
    opt.zero_grad()
    forward(batch, step).backward()
    sync_grads(model)
    opt.step()


for step in range(10):
    batch = torch.randn(64, 16)
    try:
        train_step(batch, step)  # site: step
    except RuntimeError as err:  # site: retry
        if "out of memory" not in str(err):
            raise
        print(f"rank {rank}: OOM at step {step}, retrying in two halves", flush=True)
        for half in batch.chunk(2):
            train_step(half, step)  # site: halves
dist.barrier()  # site: final
dist.destroy_process_group()
