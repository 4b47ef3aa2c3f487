
import torch, torch.distributed as dist
torch.cuda.set_device(0)
dist.init_process_group("nccl")
dist.all_reduce(torch.ones(1, device="cuda"))
dist.destroy_process_group()
