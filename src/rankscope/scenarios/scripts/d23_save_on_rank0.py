"""D23: work gated to rank 0 that hides a collective — the checkpoint that computes a global norm.

Broken: only rank 0 saves the checkpoint (right), but the save routine records the global gradient
norm, which needs an all_reduce (wrong: the other ranks never call it). They go straight to the
barrier that guards reading the checkpoint, and the job freezes at the save.
Fixed (--fix): the norm's all_reduce runs on every rank before the gate; rank 0 alone writes the
file (to a temporary name, then an atomic rename) and every rank meets at the barrier before
reading it.
"""

import argparse
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--fix", action="store_true")
parser.add_argument("--out", default=None)
args = parser.parse_args()

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank = dist.get_rank()
out = Path(args.out or tempfile.gettempdir()) / f"d23-{os.environ.get('MASTER_PORT', 'x')}.pt"
model = torch.nn.Linear(4, 2)
model(torch.randn(8, 4)).sum().backward()


def global_grad_norm() -> float:
    sq = torch.stack([p.grad.pow(2).sum() for p in model.parameters()]).sum().reshape(1)
    dist.all_reduce(sq)
    return sq.sqrt().item()


def save(norm: float) -> None:
    tmp = out.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "grad_norm": norm}, tmp)
    tmp.replace(out)


if args.fix:
    norm = global_grad_norm()
    if rank == 0:
        save(norm)
elif rank == 0:
    save(global_grad_norm())  # BUG: a collective inside the rank-0 gate
dist.barrier()  # nobody reads the checkpoint before it is complete
print(f"rank {rank}: checkpoint has grad_norm {torch.load(out)['grad_norm']:.3f}", flush=True)
dist.barrier()
if rank == 0:
    out.unlink()
dist.destroy_process_group()
