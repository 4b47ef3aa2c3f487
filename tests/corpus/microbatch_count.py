"""Gradient accumulation with a micro-batch count each rank derives from its own batch: rank 3's
is one shorter, so it leaves the accumulation loop and all-reduces its gradients while the
others still reduce a micro-batch's loss scale inside it."""
# expect: {"ranks": 4, "verdict": "hang", "cause": "uneven_inputs", "recipe": "D9", "culprits": [3], "site": "grads", "parting": "loop", "values": ["micro"]}

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
scale = torch.ones(1)
for step in range(3):
    micro = 3 if (rank == 3 and step == 1) else 4
    for _ in range(micro):  # site: loop
        dist.all_reduce(scale)
    dist.all_reduce(torch.ones(8))  # site: grads
dist.destroy_process_group()
