"""One rank gathers a full state dict that no other rank gathers: every step all_gathers each
rank's (tiny) throughput figure for the log, and at step 3 rank 0 alone, deciding locally that it
is the saving rank, first all_gathers every parameter of the model to consolidate a checkpoint.
Collective #3 of the default group is then rank 0's all_gather of a 256x256 weight in
`consolidate` where ranks 1 and 2 all_gather one number in `log_throughput`: the paths part at
the save `if`. Rank 1 receives rank 0's weight where it expects one number and gloo aborts it
(SIGABRT: "Received data size doesn't match expected size"); ranks 0 and 2 then fail with
"Connection reset by peer" and torchrun stops them."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [0], "site": "consolidate", "parting": "save", "values": ["is_saver"], "first": {"pg": "default_pg", "seq": 3}}

import os

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
SAVE_EVERY = 3


def consolidate(model: nn.Module) -> dict[str, list[torch.Tensor]]:
    full = {}
    for name, p in model.state_dict().items():
        parts = [torch.empty_like(p) for _ in range(world)]
        dist.all_gather(parts, p)  # site: consolidate
        full[name] = parts
    return full


def log_throughput(samples_per_s: float) -> None:
    mine = torch.tensor([samples_per_s])
    every = [torch.empty(1) for _ in range(world)]
    dist.all_gather(every, mine)  # site: log
    if rank == 0:
        print(f"throughput {sum(t.item() for t in every):.0f} samples/s", flush=True)


for step in range(1, 7):
    model(torch.randn(32, 256)).sum().backward()
    is_saver = rank == int(os.environ.get("SAVE_RANK", "0"))
    if is_saver and step % SAVE_EVERY == 0:  # site: save
        torch.save(consolidate(model), os.devnull)
    log_throughput(1000.0 + rank)
dist.destroy_process_group()
