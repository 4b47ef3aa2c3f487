"""An evaluation interval each rank derives from its own shard: `eval_every` is a third of the
rank's batches per epoch, 3 on ranks 0 and 1 (9 batches) and 2 on rank 2 (8 batches, its shard
is shorter). The model is a line, y = w x + b, so its gradients and the evaluation's
[loss sum, count] are both two numbers: gloo pairs rank 2's first evaluation all_reduce (#3 of
the default group, after step 1) with the others' training all_reduce of step 2 without
complaint, and the ranks run on, rank 2 one evaluation ahead. After 9 steps rank 2 has evaluated
4 times and the others 3: ranks 0 and 1 wait in the final barrier (#13) while rank 2 waits in
its last evaluation's all_reduce (#13)."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [2], "site": "eval", "parting": "every", "values": ["eval_every"], "first": {"pg": "default_pg", "seq": 3}}

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
g = torch.Generator().manual_seed(rank)
n_samples = 72 if rank < 2 else 64  # the dataset does not split evenly
shard_x = torch.randn(n_samples, generator=g)
shard_y = 3 * shard_x + 1
val_x, val_y = shard_x[:16], shard_y[:16]
params = torch.zeros(2, requires_grad=True)  # w, b
batch_size = 8
eval_every = (n_samples // batch_size) // 3


def loss_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((params[0] * x + params[1] - y) ** 2).mean()


def evaluate() -> float:
    with torch.no_grad():
        stats = torch.stack([loss_fn(val_x, val_y) * len(val_x), torch.tensor(len(val_x) * 1.0)])
    dist.all_reduce(stats)  # site: eval
    return (stats[0] / stats[1]).item()


for step in range(9):
    x = shard_x[step * batch_size : (step + 1) * batch_size]
    y = shard_y[step * batch_size : (step + 1) * batch_size]
    params.grad = None
    loss_fn(x, y).backward()
    dist.all_reduce(params.grad)  # site: train
    with torch.no_grad():
        params -= 0.01 * params.grad / world
    if (step + 1) % eval_every == 0:  # site: every
        print(f"rank {rank} step {step}: val loss {evaluate():.3f}", flush=True)
dist.barrier()  # site: final
dist.destroy_process_group()
