"""Tensor parallel inside data parallel: groups tp0 [0, 1] and tp1 [2, 3]. Each step does an
all_reduce on the rank's tp group, then one on the default group. At step 5 rank 2 skips its tp
all_reduce: rank 3 waits in tp1 for rank 2, and ranks 0, 1, 2 wait in the default group for
rank 3. The culprit is rank 2, and the explanation is the chain."""
# expect: {"ranks": 4, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [2], "site": "default", "chain": [2, 3]}

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
tp = [dist.new_group([0, 1]), dist.new_group([2, 3])][rank // 2]
x = torch.ones(8)
for step in range(8):
    if not (rank == 2 and step == 5):
        dist.all_reduce(x, group=tp)  # site: tp
    dist.all_reduce(x)  # site: default
dist.destroy_process_group()
