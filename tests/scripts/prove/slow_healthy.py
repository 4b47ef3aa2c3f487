"""Three ranks, slow but healthy (argv[1]: seconds each slow part takes): nothing here is a
hang, and nothing in the ranks' state may be taken for proof of one.

1. a long data step: rank 1 sleeps before the all_reduce the others wait in;
2. a compile: rank 2 waits for a process of its own that computes;
3. uneven but legal point-to-point: rank 1 sends rank 0 three messages, pausing between them,
   while rank 0 receives them (and rank 2 waits in an all_reduce);
4. a side group: ranks 0 and 1 all_reduce on group {0, 1} while rank 2 waits on the world
   group; then everyone meets there;
5. a slow step under DDP: rank 1 sleeps before its backward while the others' backward waits
   in DDP's gradient all_reduce (issued from C++: the flight recorder's numbering).
"""

import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

slow = float(sys.argv[1])
dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
rank = dist.get_rank()
side = dist.new_group([0, 1])
x = torch.ones(4)
dist.all_reduce(x)
if rank == 1:
    time.sleep(slow)  # 1
dist.all_reduce(x)
if rank == 2:
    spin = f"import time\nt = time.monotonic() + {slow}\nwhile time.monotonic() < t: pass"
    subprocess.run([sys.executable, "-c", spin], check=True)  # 2
dist.all_reduce(x)
if rank == 0:  # 3
    for _ in range(3):
        dist.recv(torch.zeros(4), src=1)
elif rank == 1:
    for _ in range(3):
        time.sleep(slow / 3)
        dist.send(x, dst=0)
dist.all_reduce(x)
if rank < 2:  # 4
    for _ in range(5):
        time.sleep(slow / 5)
        dist.all_reduce(x, group=side)
dist.all_reduce(x)
model = DistributedDataParallel(torch.nn.Linear(4, 4))
for step in range(3):
    if rank == 1 and step == 1:
        time.sleep(slow)  # 5
    model(torch.ones(2, 4)).sum().backward()
dist.barrier()
dist.destroy_process_group()
