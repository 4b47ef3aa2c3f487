"""Every rank initialises the process group on a TCP port that another program holds (D4).

torchrun's agent already serves a store, and tells the ranks to only connect to it; a script that
starts its own rendezvous on a fixed port (as a copied single-node command line does) binds the
port itself, which is what fails here.
"""

import datetime
import os

import torch.distributed as dist

os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
dist.init_process_group(
    os.environ.get("RANKSCOPE_BACKEND", "gloo"),
    init_method=f"tcp://127.0.0.1:{os.environ['BUSY_PORT']}",
    rank=int(os.environ["RANK"]),
    world_size=int(os.environ["WORLD_SIZE"]),
    timeout=datetime.timedelta(seconds=5),
)
dist.barrier()
