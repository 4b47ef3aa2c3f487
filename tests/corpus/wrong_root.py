"""A broadcast from the wrong root: ranks 0 and 1 broadcast from rank 0, rank 2 believes it is
the root (it computed `src` from a group rank)."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "root_mismatch", "recipe": "D19", "culprits": [2], "site": "wrong root"}

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(4)
dist.all_reduce(x)  # site: warm
if rank == 2:
    dist.broadcast(x, src=2)  # site: wrong root
else:
    dist.broadcast(x, src=0)  # site: root
dist.all_reduce(x)
dist.destroy_process_group()
