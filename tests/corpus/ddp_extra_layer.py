"""DDP over a model that one rank builds differently: a config flag read from the rank's own
environment gives rank 2 an extra layer. DDP's constructor compares the parameters across ranks
and every rank raises; the texts name rank 2's count against the others'."""
# expect: {"ranks": 3, "verdict": "crash", "cause": "ddp_model_mismatch", "recipe": "D19", "culprits": [2]}

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
layers = [torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)]
if rank == 2:  # site: decide
    layers.append(torch.nn.Linear(4, 4))
model = DDP(torch.nn.Sequential(*layers))
model(torch.ones(2, 4)).sum().backward()
dist.destroy_process_group()
