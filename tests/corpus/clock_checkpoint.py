"""A checkpoint on a timer that each rank reads from its own clock: every rank saves "every
SAVE_EVERY_S seconds of training", measured from when its own set-up ended. Rank 0 builds the
tokenizer's cache first and starts its clock 2 s later than the others; when ranks 1 and 2
decide it is time, rank 0 does not, so they enter the save's barrier while rank 0 goes on to
the next step's all_reduce, and the three wait for ever: the culprits are the ranks whose clock
fired, the decision their `if` on the time since `last_save`."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [1, 2], "parting": "timer", "values": ["last_save"], "first": {"pg": "default_pg", "seq": 2, "culprits": [1, 2]}}

import time

import torch
import torch.distributed as dist

SAVE_EVERY_S = 1.5

dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 0:
    time.sleep(2.0)  # builds the tokenizer's cache
last_save = time.monotonic()
w = torch.zeros(4)


def save_checkpoint(step: int) -> None:
    dist.barrier()  # every rank has finished the step before rank 0 writes
    if rank == 0:
        torch.save(w, f"/dev/null/{step}")


for step in range(6):
    w += 0.1
    dist.all_reduce(w)
    time.sleep(0.3)
    if time.monotonic() - last_save > SAVE_EVERY_S:  # site: timer
        save_checkpoint(step)
        last_save = time.monotonic()
dist.barrier()
dist.destroy_process_group()
