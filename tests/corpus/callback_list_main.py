"""A hand-written trainer runs a list of end-of-step callbacks. A metrics callback that
averages the step's loss over the ranks was added to the list inside the block that sets up the
progress bar, which only the main rank runs. Rank 0 now makes one all_reduce more each step,
from the callback; ranks 1-2 go on to the next step's gradient all_reduce. Rank 0's stack is in
the loop over the callbacks, but the decision was taken long before: the `if` that added it."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [0], "site": "metrics", "parting": "progress"}

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
is_main = rank == 0


def log_lr(step: int, loss: torch.Tensor) -> None:
    pass


def average_loss(step: int, loss: torch.Tensor) -> None:
    mean = loss.detach().clone()
    dist.all_reduce(mean)  # site: metrics
    mean /= world


callbacks = [log_lr]
if is_main:  # site: progress
    print("progress bar on")
    callbacks.append(average_loss)

weights = torch.ones(8)
for step in range(4):
    loss = (weights * (rank + 1)).sum()
    grads = weights.clone()
    dist.all_reduce(grads)
    for callback in callbacks:
        callback(step, loss)
dist.destroy_process_group()
