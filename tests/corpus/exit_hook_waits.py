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

model = torch.nn.Linear(8, 1)
for _ in range(5):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
dist.destroy_process_group()
