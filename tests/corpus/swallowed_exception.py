"""An exception swallowed on one rank: loading rank 1's third batch fails, and its handler logs
it and waits in a barrier to "resynchronise" while the others, whose load worked, all_reduce."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [1], "site": "barrier", "parting": "handler"}

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()


def load(step: int) -> torch.Tensor:
    if rank == 1 and step == 2:
        raise ValueError("corrupt record")
    return torch.ones(4)


for step in range(5):
    try:
        batch = load(step)
        dist.all_reduce(batch)
    except ValueError:  # site: handler
        print(f"rank {rank}: skipping a bad batch", flush=True)
        dist.barrier()  # site: barrier
dist.destroy_process_group()
