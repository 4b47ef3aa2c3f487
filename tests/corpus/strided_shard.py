"""World-size dependent sharding: each rank takes every world_size-th sample of 10, so with 3
ranks rank 0 gets 4 samples and ranks 1 and 2 get 3. Ranks 1 and 2 leave the loop for the final
barrier while rank 0 all_reduces its fourth batch."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "uneven_inputs", "recipe": "D9", "culprits": [1, 2], "site": "barrier", "parting": "loop", "values": ["rank", "total", "world"]}

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = 10
w = torch.ones(4)
for _index in range(rank, total, world):  # site: loop
    dist.all_reduce(w)
dist.barrier()  # site: barrier
dist.destroy_process_group()
