"""A rank asleep outside the collectives: rank 2 backs off before a retry it never needed,
for longer than the others will wait; ranks 0 and 1 wait in the next all_reduce."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "stuck_outside", "recipe": "D19", "culprits": [2], "site": "sleep", "activity": "sleep"}

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(4)
for step in range(4):
    dist.all_reduce(x)  # site: loop
    if rank == 2 and step == 1:
        time.sleep(120)  # site: sleep
dist.destroy_process_group()
