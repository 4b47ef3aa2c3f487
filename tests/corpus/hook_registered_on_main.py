"""A gradient-norm monitor: a tensor hook that all-reduces each step's gradient norm so that the
logged value is the global one. It is registered inside the block that sets up logging, which
only the main rank runs; on rank 0 every backward now makes one all_reduce more, from inside
autograd, while ranks 1-2 go on to the step's gradient all_reduce. No branch on any rank's stack
separates them: what parted them is the `if` that registered the hook on one rank alone."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [0], "site": "monitor", "parting": "logging"}

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Linear(16, 4)
log_every = 10


def global_grad_norm(grad: torch.Tensor) -> torch.Tensor:
    norm = grad.norm().reshape(1)
    dist.all_reduce(norm)  # site: monitor
    return grad


if rank == 0:  # site: logging
    print(f"logging every {log_every} steps")
    model.weight.register_hook(global_grad_norm)

for _step in range(4):
    loss = model(torch.randn(8, 16)).pow(2).mean()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    model.zero_grad()
dist.destroy_process_group()
