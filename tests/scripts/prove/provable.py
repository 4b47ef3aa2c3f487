"""Three ranks agree on three all_reduces, then freeze in a way their live state proves
(argv[1] picks which):

- ``mismatch``: rank 2 calls all_gather where the others call all_reduce (D19);
- ``conditional``: rank 0 alone calls a barrier, the others the next all_reduce (D21);
- ``exited``: rank 2 leaves its loop early and exits 0, the others call one more all_reduce;
  its exit hook (a metrics logger's flush, as ``wandb.finish`` does) keeps the process a few
  seconds after its script ended: under gloo the others' call fails the moment the process
  is gone (NCCL's waits on), and a rank with nothing to hold it there goes within a few
  hundredths of a second, less than the watchdog's look. The prover is what is tested here;
  a job that ends before any stall is called is the corpus's (``nan_guard_exit`` and others).
- ``p2p``: ranks 0 and 1 each receive from the other before sending; rank 2 all_reduces;
- ``cross``: rank 0 skips an all_reduce on group {0, 1} and waits on the world group, where
  rank 1 waits in the group-{0, 1} call (a cycle across two groups);
- ``ddp``: uneven data under DDP (D9): rank 2's shard has one batch fewer; it waits in the
  final barrier while the others' backward waits in DDP's gradient all_reduce, which torch
  issues from C++ (only the flight recorder numbers it).
"""

import atexit
import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank = dist.get_rank()
pair = dist.new_group([0, 1])
how = sys.argv[1]
x = torch.ones(4)
for _ in range(3):
    dist.all_reduce(x)
# The ranks involved take their step in turn, the last of them last: the onset is its step.
involved = [0, 1] if how in ("p2p", "cross") else [0, 1, 2]
time.sleep(0.5 * rank if rank in involved else 0.0)
if how == "mismatch":
    if rank == 2:
        dist.all_gather([torch.zeros(4) for _ in range(3)], x)
    else:
        dist.all_reduce(x)
elif how == "conditional":
    if rank == 0:
        dist.barrier()
    dist.all_reduce(x)
elif how == "exited":
    if rank == 2:
        atexit.register(time.sleep, 3.0)
        sys.exit(0)
    dist.all_reduce(x)
elif how == "p2p":
    if rank < 2:
        buf = torch.zeros(4)
        dist.recv(buf, src=1 - rank)
        dist.send(x, dst=1 - rank)
    else:
        dist.all_reduce(x)
elif how == "ddp":
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(torch.nn.Linear(4, 4))
    for _ in range(3 if rank == 2 else 4):
        model(torch.ones(2, 4)).sum().backward()
    dist.barrier()
elif how == "cross":
    if rank == 1:
        dist.all_reduce(x, group=pair)
    dist.all_reduce(x)
    if rank == 0:
        dist.all_reduce(x, group=pair)
dist.destroy_process_group()
