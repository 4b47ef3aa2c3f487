"""A checkpoint barrier that only rank 0 reaches: inside the training loop, under a condition on
the step and the rank. The ranks never leave the loop; rank 0 took a branch the others did not."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [0], "site": "barrier", "parting": "decide", "values": ["step", "rank"]}

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
grads = torch.ones(8)
for step in range(6):
    dist.all_reduce(grads)
    time.sleep(0.1)
    if step == 2 and rank == 0:  # site: decide
        dist.barrier()  # site: barrier
dist.destroy_process_group()
