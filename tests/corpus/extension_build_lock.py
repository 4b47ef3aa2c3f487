"""A C++ extension built just in time on the local leader, under a lock that a killed build left
behind: local rank 0 builds a small op with torch.utils.cpp_extension while the others wait at a
barrier. A build of the same op, killed earlier (a Ctrl-C, an out-of-memory kill, a job's time
limit), left its `lock` file in the build folder (made here as that build would have left it):
torch waits for the lock to go away, without end and without a word, and rank 0 never reaches
the barrier."""
# expect: {"ranks": 2, "verdict": "hang", "cause": "stuck_outside", "recipe": "D19", "culprits": [0], "site": "build", "activity": "build_lock"}

import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.cpp_extension import load_inline

SOURCE = "torch::Tensor scaled(torch::Tensor x, double s) { return x * s; }"

dist.init_process_group("gloo")
# the build folder: in the job's run folder here, so that the test leaves nothing behind
build = Path(os.environ.get("RANKSCOPE_RUN_DIR", "."), "torch_extensions", "scaled")

if int(os.environ["LOCAL_RANK"]) == 0:
    build.mkdir(parents=True, exist_ok=True)
    (build / "lock").touch()  # what the killed build left
    load_inline("scaled", SOURCE, functions=["scaled"], build_directory=str(build))  # site: build
dist.barrier()
ops = load_inline("scaled", SOURCE, functions=["scaled"], build_directory=str(build))
x = ops.scaled(torch.ones(4), 2.0)
dist.all_reduce(x)
dist.destroy_process_group()
