"""D2: every node of a multi-node job must join one rendezvous: same id, endpoint and size.

The script reports where each rank landed (its node, local and global rank) and counts the ranks
with one all_reduce, so a run of the fixed job shows the shape the rendezvous built.
Broken: the job is two nodes, and the second node's torchrun is given a different
``--rdzv-id`` (a launch script that derives the id on each node, from a timestamp or the host
name, does this). Both agents reach the same c10d endpoint, but each waits in its own round for
two nodes that never come: no worker is ever started, nothing fails and nothing is printed. Only
a startup watchdog notices.
Fixed: nothing in the script changes; every node's command line carries the same
``--rdzv-id``, ``--rdzv-endpoint`` and ``--nnodes``. A single-node job needs none of it:
``torchrun --standalone`` hosts its own rendezvous on a free local port.
"""

import os

import torch
import torch.distributed as dist

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank, world = dist.get_rank(), dist.get_world_size()
node, local = int(os.environ["GROUP_RANK"]), int(os.environ["LOCAL_RANK"])
print(f"rank {rank} of {world}: node {node}, local rank {local}", flush=True)

members = torch.ones(1)
dist.all_reduce(members)
print(f"rank {rank}: {members.item():.0f} ranks answered the all_reduce", flush=True)
dist.barrier()
dist.destroy_process_group()
