"""A collective two helpers deep: train_step calls maybe_log, which all-gathers metrics only on
the steps it logs, and it decides that with a counter only rank 0 advances."""
# expect: {"ranks": 2, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [0], "site": "gather", "parting": "decide", "values": ["logged"]}

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
logged = 0
w = torch.ones(4)


def maybe_log(step: int) -> None:
    global logged
    if rank == 0:
        logged += 1
    if logged == 2:  # site: decide
        out = [torch.zeros(1) for _ in range(dist.get_world_size())]
        dist.all_gather(out, torch.ones(1))  # site: gather


def train_step(step: int) -> None:
    dist.all_reduce(w)
    maybe_log(step)


for step in range(5):
    train_step(step)
dist.destroy_process_group()
