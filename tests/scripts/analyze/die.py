"""Ways a rank dies fast (argv[1]); every rank first completes two all_reduces.

- ``kill_blocked``: rank 2 enters the third all_reduce alone (the others are in a long step) and
  is killed with SIGKILL half a second later, as the OOM killer would;
- ``kill_at_entry``: the same, but a thread sends SIGKILL as soon as the probe shows the call in
  flight (within a millisecond of entering it, long before the probe's thread writes anything);
- ``abort``: at the third all_gather_into_tensor rank 1 passes one element more than the others;
  gloo's thread aborts a rank that receives more bytes than it expects (SIGABRT);
- ``segfault``: rank 1 reads address 0 before the third all_reduce, which the others wait in;
- ``teardown`` (4 ranks): ranks 0 and 1 wait in an all_reduce on group [0, 1, 2] for rank 2,
  which is in a long step, when rank 3 raises; torchrun ends the others with SIGTERM while the
  main threads of ranks 0 and 1 are blocked in gloo (C++).
"""

import ctypes
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

import rankscope.probe

how = sys.argv[1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()


def kill_me_in(seconds: float) -> None:
    threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGKILL)).start()


def kill_me_once_entered() -> None:
    state = rankscope.probe.current()._state

    def watch() -> None:
        while state.current is None:
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()


if how == "abort":
    for step in range(3):
        n = 5 if rank == 1 and step == 2 else 4
        out = torch.zeros(world * n)
        dist.all_gather_into_tensor(out, torch.ones(n))  # site: all_gather
    sys.exit(0)

for _ in range(2):
    dist.all_reduce(torch.ones(4))  # site: warm
if how in ("kill_blocked", "kill_at_entry") and rank == 2:
    kill_me_in(0.5) if how == "kill_blocked" else kill_me_once_entered()
    dist.all_reduce(torch.ones(4))  # site: killed
elif how == "kill_blocked" or how == "kill_at_entry":
    time.sleep(60)  # site: long step
elif how == "segfault" and rank == 1:
    ctypes.string_at(0)  # site: segfault
elif how == "teardown":
    trio = dist.new_group([0, 1, 2])
    if rank in (0, 1):
        dist.all_reduce(torch.ones(4), group=trio)  # site: blocked
    elif rank == 2:
        time.sleep(60)  # site: slow
    else:
        time.sleep(1)
        raise ValueError("bad batch on rank 3")  # site: raise
dist.all_reduce(torch.ones(4))  # site: third
