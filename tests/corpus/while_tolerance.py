"""A solver loop that never meets its tolerance on one rank: rank 1 spins in `while err > tol`
(busy, a full core) while rank 0 waits for it in the all_reduce after the loop."""
# expect: {"ranks": 2, "verdict": "hang", "cause": "busy_outside", "culprits": [1], "parting": "loop", "values": ["err", "tol"]}

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
tol = 1e-3
err = 1.0
while err > tol:  # site: loop
    err = err * 0.5 if rank == 0 else max(err * 0.5, 0.01)  # site: spin
dist.all_reduce(torch.ones(4))
dist.destroy_process_group()
