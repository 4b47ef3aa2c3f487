"""Two nodes of two ranks. A checkpoint helper waits in a barrier for "the main process", which
it takes to be LOCAL_RANK 0: true on one rank of each node (ranks 0 and 2), so those two wait in
the barrier while ranks 1 and 3 went on to the next step's all_reduce."""
# expect: {"ranks": 2, "nodes": 2, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [0, 2], "site": "barrier", "parting": "decide", "values": ["is_main"]}

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
is_main = int(os.environ["LOCAL_RANK"]) == 0
w = torch.ones(4)


def save_checkpoint(step: int) -> None:
    if is_main:  # site: decide
        torch.save(w, os.devnull)
        dist.barrier()  # site: barrier


for step in range(4):
    dist.all_reduce(w)
    save_checkpoint(step)
dist.destroy_process_group()
