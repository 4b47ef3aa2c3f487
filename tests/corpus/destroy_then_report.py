"""Uneven shards, and a rank that finishes its loop does not exit: it destroys its process group
and writes its report, which takes a while. The others wait for it in their last batch's
all_reduce; its stacks show it busy with the report, far from any collective, but what parted
it from them is the loop it left early (one batch fewer), not what it does now."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "uneven_inputs", "recipe": "D9", "culprits": [2], "site": "destroy", "parting": "loop"}

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
shard = [torch.ones(4) for _ in range(6 if rank < world - 1 else 5)]
for batch in shard:  # site: loop
    dist.all_reduce(batch)
dist.destroy_process_group()  # site: destroy
report = []
deadline = time.monotonic() + 120
while time.monotonic() < deadline:  # writing the report
    report.append(sum(range(1000)))
    time.sleep(0.01)
