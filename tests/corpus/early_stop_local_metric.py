"""Early stopping on a metric each rank computes from its own shard: rank 2's validation loss
drops under the tolerance first, it breaks out of the loop and waits in the final barrier while
the others run another epoch's all_reduce."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "uneven_inputs", "recipe": "D9", "culprits": [2], "site": "barrier", "parting": "stop", "values": ["local_val_loss"]}

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
w = torch.ones(4)
local_val_loss = 1.0
for _epoch in range(20):
    dist.all_reduce(w)
    local_val_loss *= 0.5 if rank == 2 else 0.9  # each rank's own validation shard
    if local_val_loss < 0.1:  # site: stop
        break
dist.barrier()  # site: barrier
dist.destroy_process_group()
