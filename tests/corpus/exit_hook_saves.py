"""Healthy: rank 0 registers an exit hook that compresses its last checkpoint, several seconds
of work after the script ends, while the other ranks have exited. A process that works in its
exit is slow, not stuck: no stall may be called, and the job ends on its own."""
# expect: {"ranks": 3, "verdict": "ok"}

import atexit
import io
import time
import zlib

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Linear(64, 64)


def compress_checkpoint(seconds: float = 6.0) -> None:
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    data, until = buffer.getvalue(), time.monotonic() + seconds
    while time.monotonic() < until:  # a slow codec, standing in for a large checkpoint
        data = zlib.compress(zlib.decompress(zlib.compress(data, 9)), 9)


if rank == 0:
    atexit.register(compress_checkpoint)

optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(5):
    optimizer.zero_grad()
    model(torch.randn(4, 64)).pow(2).mean().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    optimizer.step()
dist.destroy_process_group()
