"""Rank 0 starts a log-shipping process beside its training and registers an exit hook that
waits for it to finish, but nothing ever tells the shipper to stop (it should be terminated,
then waited for). The ranks train and end; rank 0's interpreter runs the hook at exit and waits
for ever. The other ranks exit 0."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "stuck_at_exit", "culprits": [0], "site": "wait"}

import atexit
import subprocess
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()

# The shipper stands in for a log uploader or a tensorboard server: it runs until told to stop.
SHIPPER = "import signal; signal.pause()"


def close_shipper(shipper: subprocess.Popen) -> None:
    shipper.wait()  # site: wait


if rank == 0:
    atexit.register(close_shipper, subprocess.Popen([sys.executable, "-c", SHIPPER]))

weights = torch.zeros(8)
dist.broadcast(weights, src=0)  # the same start on every rank
for _ in range(4):
    update = torch.randn(8) * 0.1
    dist.all_reduce(update)
    weights -= update / dist.get_world_size()
dist.destroy_process_group()
