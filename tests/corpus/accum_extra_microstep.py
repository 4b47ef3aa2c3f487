"""Gradient accumulation whose micro-batch count follows the local batch size: each rank splits
its batch into micro-batches of 8 and all-reduces every micro-batch's loss for the log; at step
1 rank 3's batch has 33 samples (the others' 32), so it runs a fifth micro-batch. Collective #10
of the default group is, on ranks 0-2, the gradients' all_reduce after the loop, and on rank 3
the fifth micro-batch's loss all_reduce inside it: the paths part there, at the loop. The calls
do not match in size (a gradient of 68 numbers against one loss): rank 3, expecting one number,
receives a chunk of nine, and gloo aborts it (SIGABRT) with "Received data size doesn't match
expected size"; torchrun then stops the others, which wait in the gradients' all_reduce."""
# expect: {"ranks": 4, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [3], "site": "log", "parting": "loop", "values": ["n_micro"], "first": {"pg": "default_pg", "seq": 10}}

import math

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
MICRO = 8


def local_batch(step: int) -> torch.Tensor:
    n = 33 if (rank == 3 and step == 1) else 32  # a sampler that hands out the remainder
    return torch.randn(n, 16)


def log_loss(loss: torch.Tensor) -> None:
    value = loss.detach().clone()
    dist.all_reduce(value)  # site: log


def sync_grads() -> None:
    flat = torch.cat([p.grad.flatten() for p in model.parameters()])
    dist.all_reduce(flat)  # site: grads
    flat /= world


for step in range(4):
    batch = local_batch(step)
    n_micro = math.ceil(len(batch) / MICRO)
    opt.zero_grad()
    for i in range(n_micro):  # site: loop
        loss = model(batch[i * MICRO : (i + 1) * MICRO]).pow(2).mean() / n_micro
        loss.backward()
        log_loss(loss)
    sync_grads()
    opt.step()
dist.barrier()
dist.destroy_process_group()
