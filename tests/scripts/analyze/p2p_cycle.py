"""Both ranks receive before they send: each waits for the other's send forever."""

import os

import torch
import torch.distributed as dist

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank = dist.get_rank()
peer = 1 - rank
dist.all_reduce(torch.ones(2))
buf = torch.zeros(4)
dist.recv(buf, src=peer)  # site: recv
dist.send(torch.ones(4), dst=peer)
