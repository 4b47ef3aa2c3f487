"""D15: one ``torch.save`` per rank of an FSDP2 state dict — a checkpoint tied to its world size.

Under FSDP2 ``model.state_dict()`` holds DTensors: each rank's file keeps that rank's rows of every
parameter and the mesh they were sharded on. Broken: every rank writes its own
``model-rank<r>.pt``. Reloading it anywhere else fails: one process (world size 1) gets rank 0's
half of each tensor, still a DTensor of a 2-rank mesh, and ``load_state_dict`` refuses it; three
ranks find no file for rank 2, and ranks 0 and 1 are refused because the mesh differs.
Fixed (--fix): Distributed Checkpoint. ``dcp.save`` writes every rank's shard plus metadata that
records which rows of which tensor each file holds; ``dcp.load`` reads into whatever layout the
loading job has (any world size, or one process without a process group).

Phases (--phase): ``both`` (default, what the catalogue runs) trains and saves at this job's world
size, then rank 0 leaves the process group and reloads the checkpoint as a single process into the
plain model, the way an export or an evaluation would; ``save`` stops after saving; ``load`` builds
the sharded model at this job's world size and loads (run it with another world size than the
save). Each load checks the loaded weights against ``fingerprint.json``, the norms of the full
tensors recorded at save time. Each rank prints ``rankscope-shards {json}`` after saving and after
loading: the rows of each parameter it holds.
"""

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

parser = argparse.ArgumentParser()
parser.add_argument("--fix", action="store_true")
parser.add_argument("--phase", choices=("both", "save", "load"), default="both")
parser.add_argument("--dir", default=None, help="checkpoint folder (default: a temporary one)")
args = parser.parse_args()


def plain_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 40), torch.nn.ReLU(), torch.nn.Linear(40, 40), torch.nn.ReLU(),
        torch.nn.Linear(40, 5),
    )  # fmt: skip


def sharded_model(mesh) -> torch.nn.Module:
    model = plain_model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def check(state: dict, where: str) -> None:
    """Compare every loaded tensor's norm with the one recorded at save time."""
    recorded = json.loads((ckpt / "fingerprint.json").read_text())
    got = {name: full(t).norm().item() for name, t in state.items()}
    wrong = [n for n in recorded if abs(got.get(n, float("nan")) - recorded[n]) > 1e-5]
    if wrong:
        raise SystemExit(f"{where}: loaded weights differ from the saved ones: {wrong}")
    print(f"{where}: all {len(recorded)} tensors match the saved ones", flush=True)


def shard_rows(model: torch.nn.Module) -> dict[str, int]:
    return {n: p.to_local().shape[0] for n, p in model.named_parameters()}


backend = os.environ.get("RANKSCOPE_BACKEND", "gloo")
dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
if backend == "nccl":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
device_type = "cuda" if backend == "nccl" else "cpu"
mesh = init_device_mesh(device_type, (world,))
temporary = args.dir is None
port = os.environ.get("MASTER_PORT", "x")  # one folder per job
ckpt = Path(tempfile.gettempdir(), f"d15-{port}") if temporary else Path(args.dir)

if args.phase in ("both", "save"):
    model = sharded_model(mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1 + rank)
    for _ in range(3):
        model(torch.randn(8, 16, generator=gen).to(device_type)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    norms = {n: full(t).norm().item() for n, t in model.state_dict().items()}  # collective
    if rank == 0:
        ckpt.mkdir(parents=True, exist_ok=True)
        (ckpt / "fingerprint.json").write_text(json.dumps(norms))
    dist.barrier()
    if args.fix:
        dcp.save(get_model_state_dict(model), checkpoint_id=ckpt)
    else:
        torch.save(model.state_dict(), ckpt / f"model-rank{rank}.pt")  # BUG: tied to this layout
    dist.barrier()
    report = {"rank": rank, "world": world, "phase": "save", "rows": shard_rows(model)}
    print("rankscope-shards " + json.dumps(report), flush=True)

if args.phase == "load":
    model = sharded_model(mesh)
    if args.fix:
        state = get_model_state_dict(model)
        dcp.load(state, checkpoint_id=ckpt)  # reshards to this job's world size
        set_model_state_dict(model, state)
    else:
        model.load_state_dict(torch.load(ckpt / f"model-rank{rank}.pt"))
    report = {"rank": rank, "world": world, "phase": "load", "rows": shard_rows(model)}
    print("rankscope-shards " + json.dumps(report), flush=True)
    check(model.state_dict(), f"rank {rank} at world size {world}")  # collective: full tensors
    dist.barrier()

dist.destroy_process_group()

if args.phase == "both" and rank == 0:
    try:
        # World size 1: one process, no process group, the plain (unsharded) model.
        single = plain_model()
        if args.fix:
            state = single.state_dict()
            dcp.load(state, checkpoint_id=ckpt)
            single.load_state_dict(state)
        else:
            single.load_state_dict(torch.load(ckpt / "model-rank0.pt"))
        check(single.state_dict(), "one process")
    finally:
        if temporary:
            shutil.rmtree(ckpt, ignore_errors=True)
