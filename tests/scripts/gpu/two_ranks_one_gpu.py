"""Two ranks mapped to one GPU (a set_device that ignores LOCAL_RANK): NCCL refuses the
communicator with 'Duplicate GPU detected' at the first collective."""

import torch
import torch.distributed as dist

torch.cuda.set_device(0)
dist.init_process_group("nccl")
dist.all_reduce(torch.ones(1, device="cuda"))
dist.destroy_process_group()
