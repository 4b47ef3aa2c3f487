"""Early stopping decided on each rank's own validation loss, in a `main` wrapped in torchrun's
`record` decorator (as torchrun's documentation recommends). Gradients are averaged, so the
model is the same everywhere, but each rank scores it on its own validation shard: rank 2's
shard has targets unrelated to the inputs, its loss stops improving first, its patience runs
out and it calls sys.exit(0). `record` turns that exit into a return of `main`, so the rank's
script ends with code 0 as if training had finished, while ranks 0 and 1 go into the next
epoch's first gradient all_reduce. The patience check's `if` is where the paths part."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "early_exit", "culprits": [2], "site": "exit", "parting": "patience"}

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record


def shard(rank: int, n: int, noise_only: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(n, 8, generator=g)
    y = torch.randn(n, 1, generator=g) if noise_only else x.sum(dim=1, keepdim=True)
    return x, y


@record
def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    train_x, train_y = shard(rank, 64, noise_only=False)
    val_x, val_y = shard(rank + 10, 32, noise_only=rank == 2)
    best, stale, patience = float("inf"), 0, 2
    for epoch in range(40):
        for i in range(0, 64, 16):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(train_x[i : i + 16]), train_y[i : i + 16])
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)  # site: grads
                p.grad /= dist.get_world_size()
            opt.step()
        with torch.no_grad():
            val = nn.functional.mse_loss(model(val_x), val_y).item()
        if val < best - 1e-3:
            best, stale = val, 0
        else:
            stale += 1
        if stale >= patience:  # site: patience
            print(f"rank {rank}: no improvement for {patience} epochs at epoch {epoch}, stopping")
            sys.exit(0)  # site: exit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
