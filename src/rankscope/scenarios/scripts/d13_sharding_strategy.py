"""D13: a sharding strategy that saves communication on a job whose binding constraint is memory.

FSDP2 spells the strategies of FSDP1 with ``fully_shard`` arguments: ``reshard_after_forward=True``
is FULL_SHARD (ZeRO-3: a unit's parameters are freed after its forward and all-gathered again in
backward), ``reshard_after_forward=False`` is SHARD_GRAD_OP (ZeRO-2: they stay gathered from the
forward to the end of the backward, one all-gather fewer per unit and step), and a 2-D mesh
``(replicate, shard)`` is HYBRID_SHARD (sharded within a node, replicated across nodes).
Broken: every block is its own unit, but with ``reshard_after_forward=False`` to cut the
all-gathers; by the end of the forward every block is gathered at once, over the job's memory plan
(a quarter of the model gathered at once), and the script's check fails.
Fixed (--fix): ``reshard_after_forward=True``; the price is one more all-gather per block and step.
``--hybrid`` shards within each node and replicates across nodes (nodes as torchrun counts them:
world size / LOCAL_WORLD_SIZE); on a single node it is plain FSDP.

Each rank prints ``rankscope-memory {json}`` as D12's script does (local shard bytes, peak bytes of
gathered parameters, ru_maxrss), with the strategy, the mesh, the rank's node and the ranks of
the groups it shards and replicates over.
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
parser.add_argument("--hybrid", action="store_true")
parser.add_argument("--steps", type=int, default=3)
args = parser.parse_args()

BLOCKS, WIDTH, BATCH = 8, 512, 16
BUDGET_FRACTION = 0.25  # of the whole model, gathered at once


def maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


backend = os.environ.get("RANKSCOPE_BACKEND", "gloo")
dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
node = int(os.environ.get("GROUP_RANK", rank // per_node))
if backend == "nccl":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
device = torch.device("cuda" if backend == "nccl" else "cpu")
if args.hybrid:
    # Rows of the mesh are nodes: all-gathers and reduce-scatters run inside a node, and only
    # the gradient all-reduce between replicas crosses nodes.
    shape = (world // per_node, per_node)
    mesh = init_device_mesh(device.type, shape, mesh_dim_names=("replicate", "shard"))
    strategy = "HYBRID_SHARD"
else:
    shape = (world,)
    mesh = init_device_mesh(device.type, shape)
    strategy = "FULL_SHARD" if args.fix else "SHARD_GRAD_OP"
reshard = args.fix or args.hybrid
if args.hybrid:
    shard_group = dist.get_process_group_ranks(mesh.get_group("shard"))
    replicate_group = dist.get_process_group_ranks(mesh.get_group("replicate"))
else:
    shard_group, replicate_group = list(range(world)), [rank]
rss_start = maxrss_bytes()

torch.manual_seed(0)
blocks = [
    torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()) for _ in range(BLOCKS)
]
model = torch.nn.Sequential(*blocks, torch.nn.Linear(WIDTH, 1)).to(device)
model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
for block in blocks:
    fully_shard(block, mesh=mesh, reshard_after_forward=reshard)  # BUG without --fix: False
fully_shard(model, mesh=mesh)


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def nbytes(tensors) -> int:
    return sum(local(t).numel() * local(t).element_size() for t in tensors)


gathered_peak = 0  # plain (non-DTensor) parameters are the gathered ones; see D12's script


def sample(*_: object) -> None:
    global gathered_peak
    gathered = nbytes(p for p in model.parameters() if not isinstance(p, DTensor))
    gathered_peak = max(gathered_peak, gathered)


def sample_in_backward(module: torch.nn.Module, inputs: object, output: torch.Tensor) -> None:
    output.register_hook(sample)


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
    "node": node,
    "strategy": strategy,
    "reshard_after_forward": reshard,
    "mesh": list(shape),
    "shard_group": shard_group,
    "replicate_group": replicate_group,
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
        f"{budget / 2**20:.1f} MiB planned: {strategy} keeps every block gathered until backward"
    )
