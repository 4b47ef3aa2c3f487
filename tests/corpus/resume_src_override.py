"""Resuming from a checkpoint: rank 0 is meant to load it and broadcast the weights to the
others, from one line every rank runs. A fallback added later lets a rank that finds a newer
checkpoint on its own local disk use it and name itself the source; only rank 2 finds one, so
it broadcasts as root 2 while ranks 0-1 broadcast from root 0. The call is the same line on
every rank: what parted rank 2 is the branch that set its root, before the call."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "root_mismatch", "recipe": "D19", "culprits": [2], "site": "broadcast", "parting": "local"}

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()


def local_checkpoint_step(rank: int) -> int:
    return 1200 if rank == 2 else -1  # what this rank's scratch disk holds


weights = torch.zeros(16)
shared_step = 1000
src = 0
local_step = local_checkpoint_step(rank)
if local_step > shared_step:  # site: local
    src = rank
    weights = torch.ones(16)
dist.broadcast(weights, src)  # site: broadcast
dist.all_reduce(weights)
dist.destroy_process_group()
