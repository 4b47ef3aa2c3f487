"""A retry that only one rank takes: rank 0's save "fails" once, and its retry branch calls the
barrier meant to follow a successful save again, one barrier more than the others make."""
# expect: {"ranks": 2, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [0], "site": "again", "parting": "decide", "values": ["ok"]}

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
w = torch.ones(4)
for step in range(3):
    dist.all_reduce(w)
    ok = not (rank == 0 and step == 1)  # a save that failed on rank 0 only
    dist.barrier()
    if not ok:  # site: decide
        dist.barrier()  # site: again
dist.destroy_process_group()
