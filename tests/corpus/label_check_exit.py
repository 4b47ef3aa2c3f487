"""A data check that exits with an error code on one rank: every batch goes through
`validate`, and at step 5 a label on rank 2's shard is out of range, so it prints the error and
calls sys.exit(1). Each step makes three all_reduces (the loss for the log, then the weight's
and the bias's gradients), so step 5's loss all_reduce is #16 of the default group on ranks 0
and 1 and absent on rank 2: the check's `if` is where the paths part. The exit
code 1 makes torchrun stop the other ranks."""
# expect: {"ranks": 3, "verdict": "crash", "cause": "rank_crashed", "recipe": "D20", "culprits": [2], "site": "exit", "parting": "check", "values": ["bad"], "first": {"pg": "default_pg", "seq": 16}}

import sys

import torch
import torch.distributed as dist
from torch import nn

NUM_CLASSES = 10
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Linear(8, NUM_CLASSES)
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def validate(labels: torch.Tensor, step: int) -> None:
    bad = int((labels >= NUM_CLASSES).sum())
    if bad:  # site: check
        print(f"rank {rank}: {bad} labels out of range at step {step}", file=sys.stderr)
        sys.exit(1)  # site: exit


for step in range(10):
    g = torch.Generator().manual_seed(10 * rank + step)
    x, labels = torch.randn(32, 8, generator=g), torch.randint(0, NUM_CLASSES, (32,), generator=g)
    if rank == 2 and step == 5:
        labels[7] = NUM_CLASSES  # a mislabelled record
    validate(labels, step)
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), labels)
    loss.backward()
    dist.all_reduce(loss.detach())  # site: loss
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
dist.destroy_process_group()
