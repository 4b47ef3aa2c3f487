"""A rank-0-only evaluation that crashes: rank 0 evaluates after step 2 and raises there; rank 1
waits in the next all_reduce."""
# expect: {"ranks": 2, "verdict": "crash", "cause": "rank_crashed", "recipe": "D20", "culprits": [0], "site": "eval"}

import torch
import torch.distributed as dist


def evaluate(step: int) -> float:
    scores = {}
    return scores["accuracy"]  # site: eval


dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(4)
for step in range(5):
    dist.all_reduce(x)  # site: loop
    if rank == 0 and step == 2:
        evaluate(step)
dist.destroy_process_group()
