"""D15: a full state dict built on rank 0 only — building it is a collective, so the save hangs.

A single portable file (for export or inference) needs the full, unsharded tensors; under FSDP2 they
come from ``get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
cpu_offload=True))``, which all-gathers every parameter over the ranks that hold its shards.
Broken: the call sits inside ``if rank == 0:`` next to ``torch.save``, because only rank 0 writes.
Rank 0 waits in the first all-gather; the other ranks go on to the barrier that guards the file.
Fixed (--fix): every rank calls it; with ``cpu_offload=True`` only rank 0 keeps the gathered
tensors (in CPU memory) and the others get an empty dict. Rank 0 alone writes the file (to a
temporary name, then a rename), every rank meets at the barrier, and the file is loaded back with
``broadcast_from_rank0=True``: rank 0 reads it, FSDP2 broadcasts and every rank keeps its shard.
"""

import argparse
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

parser = argparse.ArgumentParser()
parser.add_argument("--fix", action="store_true")
parser.add_argument("--out", default=None, help="folder for the file (default: a temporary one)")
args = parser.parse_args()

backend = os.environ.get("RANKSCOPE_BACKEND", "gloo")
dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
if backend == "nccl":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
device_type = "cuda" if backend == "nccl" else "cpu"
mesh = init_device_mesh(device_type, (world,))
out = Path(args.out or tempfile.gettempdir()) / f"d15-full-{os.environ.get('MASTER_PORT', 'x')}.pt"

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
for layer in (model[0], model[2]):
    fully_shard(layer, mesh=mesh)  # moves the parameters to the mesh's device
fully_shard(model, mesh=mesh)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.randn(8, 16, device=device_type)).pow(2).mean().backward()
opt.step()

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def write(state: dict) -> None:
    tmp = out.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(out)


if args.fix:
    state = get_model_state_dict(model, options=FULL)  # every rank: it all-gathers
    if rank == 0:
        write(state)
elif rank == 0:
    write(get_model_state_dict(model, options=FULL))  # BUG: a collective on rank 0 only
dist.barrier()  # nobody reads the file before it is complete

# Load it back the FSDP2 way: rank 0 reads the file, the others pass an empty dict.
loaded = torch.load(out) if rank == 0 else {}
before = [p.full_tensor().norm().item() for p in model.parameters()]
with torch.no_grad():
    for p in model.parameters():
        p.zero_()
set_model_state_dict(
    model, loaded, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
)
after = [p.full_tensor().norm().item() for p in model.parameters()]
if rank == 0:
    print(f"full state dict of {len(loaded)} tensors written, loaded back on {world} ranks")
dist.barrier()
if rank == 0:
    out.unlink()
dist.destroy_process_group()
if max(abs(a - b) for a, b in zip(before, after, strict=True)) > 1e-6:
    raise SystemExit(f"rank {rank}: the weights loaded back differ from the saved ones")
