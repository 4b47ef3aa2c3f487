"""Evaluation on the main rank only, with a metric reduction inside it: rank 0 all-reduces a
2-element metric under `if rank == 0` while rank 1 reduces the next step's 8-element gradient."""
# expect: {"ranks": 2, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [0], "site": "metric", "parting": "decide"}

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()


def evaluate() -> float:
    metric = torch.tensor([1.0, 2.0])
    dist.all_reduce(metric)  # site: metric
    return float(metric[0])


for step in range(4):
    dist.all_reduce(torch.ones(8))
    if rank == 0 and step == 1:  # site: decide
        evaluate()
dist.destroy_process_group()
