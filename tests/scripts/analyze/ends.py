"""Ways rank 1 leaves (argv[1]) after one all_reduce with the others, inside a function:

- ``sys_exit``: it prints why and calls ``sys.exit(0)`` (a NaN guard);
- ``record_sys_exit``: the same under torch's ``record``, which turns that ``sys.exit(0)`` into a
  return of ``main``;
- ``raise``: an uncaught ValueError;
- ``raise_sigterm``: the same, but the rank is sent SIGTERM (as torchrun's teardown would be)
  while the bootstrap formats that error, before the rank's end is written;
- ``os_exit``: it prints why and calls ``os._exit(3)``;
- ``abort``: the script's ``main`` is wrapped in torch's ``record`` (which enables faulthandler
  on stderr, and would swallow a ``sys.exit(0)``: the other ways go without it); rank 1 passes a longer tensor to all_gather_into_tensor than the
  others, and gloo's thread aborts a rank that receives more bytes than it expects (SIGABRT): the
  dump of its threads lands in its stderr.

The other ranks go on to a second all_reduce, which fails or is torn down.
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

how = sys.argv[1]


class NanLoss(ValueError):
    """With ``raise_sigterm``, formatting it the first time sends this rank SIGTERM and waits
    for the signal to end it."""

    sent = False

    def __str__(self) -> str:
        if how == "raise_sigterm" and not NanLoss.sent:
            NanLoss.sent = True
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)
        return super().__str__()


def guard(step: int, loss: float) -> None:
    if loss != loss:
        print(f"loss is nan at step {step}, stopping", flush=True)
        if how in ("sys_exit", "record_sys_exit"):
            sys.exit(0)  # site: sys_exit
        if how == "os_exit":
            os._exit(3)  # site: os_exit
        raise NanLoss(f"loss is nan at step {step}")  # site: raise


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"rank {rank} up", flush=True)
    dist.all_reduce(torch.ones(4))
    if how == "abort":
        for step in range(3):
            n = 5 if rank == 1 and step == 2 else 4
            out = torch.zeros(dist.get_world_size() * n)
            dist.all_gather_into_tensor(out, torch.ones(n))  # site: all_gather
    if rank == 1:
        guard(7, float("nan"))  # site: guard
    dist.all_reduce(torch.ones(4))


(record(main) if how in ("abort", "record_sys_exit") else main)()
