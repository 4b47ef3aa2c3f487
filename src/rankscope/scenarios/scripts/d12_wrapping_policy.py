"""D12: fully_shard on the root module only — the whole model is one FSDP unit, gathered at once.

FSDP2 shards every parameter on dim 0 across the ranks, whatever the wrapping: at rest each rank
holds 1/world of the parameters, gradients and optimizer state. What the wrapping decides is how
much is *gathered* (unsharded) at once: each ``fully_shard`` call makes one unit whose parameters
are all-gathered together before its forward and backward. Broken: ``fully_shard(model)`` only, so
the single unit is the whole model and every rank holds all of it unsharded from the start of the
forward to the end of the backward (the root unit is not resharded after forward). Its memory plan
leaves room for a quarter of the model gathered at once; the script measures the peak and fails.
Fixed (--fix): ``fully_shard`` on every block first, then on the root: one block is gathered at a
time (plus the root's own head).

Each rank prints one line ``rankscope-memory {json}``: bytes of its local shards of parameters,
gradients and optimizer state, the peak bytes of gathered parameters (sampled when every linear
layer runs forward and backward), and the process's peak resident memory (ru_maxrss: the whole
process, torch's own runtime included) before building the model and at the end.
"""

import argparse
import json
import os
import resource

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

parser = argparse.ArgumentParser()
parser.add_argument("--fix", action="store_true")
parser.add_argument("--steps", type=int, default=3)
args = parser.parse_args()

BLOCKS, WIDTH, BATCH = 8, 512, 16
BUDGET_FRACTION = 0.25  # of the whole model, gathered at once


def maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


backend = os.environ.get("RANKSCOPE_BACKEND", "gloo")
dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
if backend == "nccl":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
device = torch.device("cuda" if backend == "nccl" else "cpu")
mesh = init_device_mesh(device.type, (world,))
rss_start = maxrss_bytes()

torch.manual_seed(0)
blocks = [
    torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()) for _ in range(BLOCKS)
]
model = torch.nn.Sequential(*blocks, torch.nn.Linear(WIDTH, 1)).to(device)
model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
if args.fix:
    for block in blocks:
        fully_shard(block, mesh=mesh)
fully_shard(model, mesh=mesh)  # BUG without --fix: the only unit is the whole model


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def nbytes(tensors) -> int:
    return sum(local(t).numel() * local(t).element_size() for t in tensors)


# Outside a unit's forward and backward FSDP2 registers its parameters as sharded DTensors; while
# the unit is gathered they are plain tensors. Summing the plain ones gives what is gathered now.
gathered_peak = 0


def sample(*_: object) -> None:
    global gathered_peak
    gathered = nbytes(p for p in model.parameters() if not isinstance(p, DTensor))
    gathered_peak = max(gathered_peak, gathered)


def sample_in_backward(module: torch.nn.Module, inputs: object, output: torch.Tensor) -> None:
    output.register_hook(sample)  # runs when the gradient of this layer's output is computed


for layer in model.modules():
    if isinstance(layer, torch.nn.Linear):
        layer.register_forward_pre_hook(sample)
        layer.register_forward_hook(sample_in_backward)

opt = torch.optim.Adam(model.parameters(), lr=1e-3)
gen = torch.Generator().manual_seed(1 + rank)
for step in range(args.steps):
    x = torch.randn(BATCH, WIDTH, generator=gen).to(device)
    model(x).pow(2).mean().backward()
    opt.step()
    if step < args.steps - 1:
        opt.zero_grad()

params = list(model.parameters())
report = {
    "rank": rank,
    "world": world,
    "wrapping": "per block" if args.fix else "root only",
    "units": BLOCKS + 1 if args.fix else 1,
    "steps": args.steps,
    "model_bytes": model_bytes,
    "param_bytes": nbytes(params),
    "grad_bytes": nbytes(p.grad for p in params if p.grad is not None),
    "optim_bytes": nbytes(
        v for state in opt.state.values() for v in state.values() if torch.is_tensor(v)
    ),
    "gathered_peak_bytes": gathered_peak,
    "budget_bytes": int(BUDGET_FRACTION * model_bytes),
    "maxrss_start_bytes": rss_start,
    "maxrss_bytes": maxrss_bytes(),
}
if device.type == "cuda":
    report["device_peak_bytes"] = torch.cuda.max_memory_allocated()
print("rankscope-memory " + json.dumps(report), flush=True)
dist.destroy_process_group()

budget = report["budget_bytes"]
if gathered_peak > budget:
    raise SystemExit(
        f"rank {rank}: {gathered_peak / 2**20:.1f} MiB of parameters gathered at once, over the "
        f"{budget / 2**20:.1f} MiB planned: the whole model is one FSDP unit"
    )
