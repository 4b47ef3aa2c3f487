"""D10: BatchNorm statistics are per rank; DDP averages gradients, not buffers.

Each rank's shard has a different mean (rank r's features are centred on 4r). DDP broadcasts rank
0's buffers at every forward, so after training every rank holds rank 0's running mean: statistics
of one shard out of ``world``. The script compares the running mean with the mean of the whole
dataset and fails when they disagree.
Fixed (--fix): batch statistics are made global. On GPUs that is
``nn.SyncBatchNorm.convert_sync_batchnorm(model)`` before wrapping in DDP; SyncBatchNorm refuses
CPU modules, so on CPU the fix all-reduces the running statistics after each step, which gives the
same running mean for equal shard sizes.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--fix", action="store_true")
args = parser.parse_args()

backend = os.environ.get("RANKSCOPE_BACKEND", "gloo")
dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else None
net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4, momentum=None)).to(device)
sync_on_gpu = args.fix and device is not None
if sync_on_gpu:
    net = torch.nn.SyncBatchNorm.convert_sync_batchnorm(net)
model = DDP(net)
bn = net[1]
torch.manual_seed(rank)
for _ in range(20):
    x = torch.randn(32, 4, device=device) + 4.0 * rank  # rank r's shard is centred on 4r
    model(x).pow(2).mean().backward()
    model.zero_grad()
    if args.fix and not sync_on_gpu:
        with torch.no_grad():
            for buf in (bn.running_mean, bn.running_var):
                dist.all_reduce(buf)
                buf /= world

x_global = torch.nn.functional.linear(
    torch.full((1, 4), 2.0 * (world - 1)), net[0].weight, net[0].bias
)
expected = x_global.squeeze(0).to(bn.running_mean.device)
error = (bn.running_mean - expected).abs().max().item()
print(f"rank {rank}: running mean off by {error:.3f} from the global mean", flush=True)
dist.barrier()
dist.destroy_process_group()
if error > 0.25:
    raise SystemExit(f"rank {rank}: BatchNorm running mean reflects one shard, not the dataset")
