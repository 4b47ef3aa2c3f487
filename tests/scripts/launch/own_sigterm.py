"""A script that takes SIGTERM over as Lightning's Trainer does (a handler that notes the signal
and lets the process go on), then hangs with every rank inside a C++ call: rank 0 in a barrier
the others never reach, ranks 1-2 in a recv rank 0 never answers."""

import signal

import torch
import torch.distributed as dist

seen = []
signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))

dist.init_process_group("gloo")
rank = dist.get_rank()
dist.all_reduce(torch.ones(4))
if rank == 0:
    dist.barrier()  # site: barrier
else:
    dist.recv(torch.zeros(4), src=0)  # site: recv
dist.destroy_process_group()
