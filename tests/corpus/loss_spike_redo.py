"""A loss-spike guard that redoes a step on one rank: at step 3 rank 2's loss comes out ten
times its running average, and its guard restores the weights it kept and runs the step
again through the same `train_step` (and its `all_reduce_grads`) from the guard's line. So
collective #5 of the default group is, on every rank, the gradients' all_reduce, reached by
rank 2 from the redo line and by ranks 0, 1, 3 from the step line: the paths part there, at the
guard. gloo pairs the calls by number, so the job runs on, rank 2 one call ahead, until ranks
0, 1, 3 wait in the final barrier (#9) and rank 2 in its last step's gradient all_reduce (#9)."""
# expect: {"ranks": 4, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [2], "site": "grads", "parting": "spike", "values": ["loss", "avg"], "first": {"pg": "default_pg", "seq": 5}}

import copy

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def all_reduce_grads() -> None:
    for p in model.parameters():
        p.grad /= world
    flat = torch.cat([p.grad.flatten() for p in model.parameters()])
    dist.all_reduce(flat)  # site: grads


def train_step(x: torch.Tensor, y: torch.Tensor) -> float:
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    all_reduce_grads()
    opt.step()
    return loss.item()


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * rank + step)
    x = torch.randn(16, 8, generator=g)
    scale = 20.0 if (rank == 2 and step == 3) else 1.0  # one bad shard on rank 2
    return x, scale * x.sum(dim=1, keepdim=True)


avg = None
for step in range(8):
    x, y = batch(step)
    saved = copy.deepcopy(model.state_dict())
    loss = train_step(x, y)  # site: step
    if avg is not None and loss > 10 * avg:  # site: spike
        print(f"rank {rank}: loss spike at step {step} ({loss:.1f}), redoing it", flush=True)
        model.load_state_dict(saved)
        loss = train_step(x, y.clamp(-5, 5))  # site: redo
    avg = loss if avg is None else 0.9 * avg + 0.1 * loss
dist.barrier()  # site: final
dist.destroy_process_group()
