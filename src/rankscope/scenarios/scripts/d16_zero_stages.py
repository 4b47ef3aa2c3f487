"""D16: ZeRO stage 1 does not shard the parameters; only stage 3 does.

The plan for a model that does not fit on one device: "ZeRO splits the model across the ranks",
and the config asks for stage 1. Stage 1 partitions the optimizer state across the data-parallel
ranks, stage 2 the gradients as well, stage 3 the parameters too. The script trains a small MLP
with DeepSpeed (Adam, two micro-batches per optimizer step) and, after every backward pass, adds
up the bytes of the tensors each rank holds, grouped as parameters, gradients, fp32 master
weights, Adam moments and communication buckets (the largest snapshot is kept). Each rank prints
one line ``memory {json}`` with those numbers and its peak RSS. The plan's check: a rank holds at
most its share of the parameters; at stage 1 every rank still holds all of them, and the check
fails on every rank.
Fixed (--fix): stage 3. ``--stage N`` picks any stage and ``--measure-only`` skips the check (the
notebook's survey of stages 0-3).

On CPU the model stays fp32, so ZeRO 1-3 keep an fp32 master copy of each rank's partition beside
the fp32 parameters; on GPUs with bf16 or fp16 the parameters and gradients take 2 bytes per
element and the master weights and Adam moments 12, which is why sharding the optimizer state
(stage 1) already saves most of the memory there. Stage 3 on GPUs also gathers each layer's
parameters just in time for its forward and backward, so a rank's peak includes the largest
gathered layers, and it is measured with ``torch.cuda.max_memory_allocated`` rather than RSS.
"""

import argparse
import json
import os
import resource

# DeepSpeed picks its accelerator when it is imported; gloo means CPU ranks.
backend = os.environ.get("RANKSCOPE_BACKEND", "gloo")
if backend == "gloo":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--fix", action="store_true")
parser.add_argument("--stage", type=int, choices=[0, 1, 2, 3], default=None)
parser.add_argument("--measure-only", action="store_true")
args = parser.parse_args()
stage = args.stage if args.stage is not None else (3 if args.fix else 1)

KIB = 1024
rss_after_import = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KIB
deepspeed.init_distributed(dist_backend=backend)
rank, world = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)])
model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
config = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
    "zero_optimization": {
        "stage": stage,
        # The defaults (5e8 elements) are sized for GPUs; a bucket that size would dwarf this model.
        "reduce_bucket_size": 300_000,
        "allgather_bucket_size": 300_000,
    },
    "steps_per_print": 1_000_000,
}
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)


def category(path: str) -> str:
    """Which kind of state a tensor found under ``path`` (an attribute path) is."""
    last = path.rsplit(".", 1)[-1].lower()
    if "grad" in last:
        return "gradients"
    if "bucket" in path:
        return "communication buckets"
    if "fp32" in path or "param_groups" in path:
        return "fp32 master weights"
    return "other"


def held_bytes() -> dict[str, int]:
    """Bytes of every tensor storage this rank holds for training, by kind (each storage once).

    Parameters, their gradients and the optimizer's state are registered first; then the
    ZeRO optimizer's attributes are walked for the partitions and buffers it keeps itself.
    """
    seen: set[int] = set()
    out: dict[str, int] = {}

    def add(t: torch.Tensor, kind: str) -> None:
        storage = t.untyped_storage()
        if storage.nbytes() and storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            out[kind] = out.get(kind, 0) + storage.nbytes()

    params = list(engine.module.parameters())
    for p in params:
        add(p.data, "parameters")
        if hasattr(p, "ds_tensor"):  # stage 3: this rank's shard of the parameter
            add(p.ds_tensor, "parameters")
    for p in params:
        if p.grad is not None:
            add(p.grad, "gradients")
    inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
    for state in inner.state.values():
        for value in state.values():
            if torch.is_tensor(value) and value.dim():
                add(value, "Adam moments")

    stack, visited = [(engine.optimizer, "optimizer", 0)], set()
    while stack:
        obj, path, depth = stack.pop()
        if id(obj) in visited or depth > 8 or isinstance(obj, torch.nn.Module):
            continue
        visited.add(id(obj))
        if torch.is_tensor(obj):
            add(obj, category(path))
            if obj.is_leaf and obj.grad is not None:
                add(obj.grad, "gradients")
        elif isinstance(obj, dict):  # optimizer state is keyed by tensors: leave them unnamed
            stack.extend(
                (v, f"{path}[{'tensor' if torch.is_tensor(k) else k}]", depth + 1)
                for k, v in obj.items()
            )
        elif isinstance(obj, (list, tuple)):
            stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(obj))
        elif type(obj).__module__.startswith(("deepspeed", "torch.optim")):
            stack.extend((v, f"{path}.{k}", depth + 1) for k, v in vars(obj).items())
    return out


gen = torch.Generator().manual_seed(rank)
peak: dict[str, int] = {}
for _ in range(4):
    x = torch.randn(4, 512, generator=gen).to(engine.device)
    engine.backward(engine(x).pow(2).mean())
    snapshot = held_bytes()
    if sum(snapshot.values()) > sum(peak.values()):
        peak = snapshot
    engine.step()

report = {
    "rank": rank,
    "world": world,
    "stage": stage,
    "model_bytes": model_bytes,
    "held_bytes": peak,
    "rss_after_import_bytes": rss_after_import,
    "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KIB,
}
print("memory " + json.dumps(report, sort_keys=True), flush=True)
dist.barrier()
dist.destroy_process_group()

share = model_bytes / world
if not args.measure_only and peak.get("parameters", 0) > 1.05 * share:
    raise SystemExit(
        f"rank {rank}: ZeRO stage {stage} left {peak['parameters'] / 2**20:.1f} MiB of parameters "
        f"on this rank, the whole model; the plan needs at most {share / 2**20:.1f} MiB "
        "(1/world): only stage 3 partitions the parameters"
    )
