"""What a rank knows of how it was started, as one JSON line after two unfinished ones (Python's
and the C library's): its parent, session and process
group, argv, environment (``os.environ``, and the variable that finds a job's processes as /proc
shows it), signal dispositions, open descriptors, threads, numpy's first random draw and string
hashing; then it ends as
argv[1] says (``return``, ``raise``, ``exit3``, ``os_exit4``, ``segv``) on rank 1, the others
waiting for it in a barrier."""

import ctypes
import json
import os
import signal
import sys

import numpy as np
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
print("no newline yet, ", end="")  # -u: on disk before the line ends
ctypes.CDLL(None).printf(b"C, ")  # -u: the C library's stream unbuffered too, in order
seen = {
    "rank": rank,
    "pid": os.getpid(),
    "ppid": os.getppid(),
    "own_session": os.getsid(0) == os.getpid() == os.getpgid(0),
    "argv": sys.argv,
    "env_rank": os.environ.get("RANK"),
    "threads": torch.get_num_threads(),
    "numpy": int(np.random.randint(1 << 30)),
    "hash": hash("rankscope"),
    "environ": dict(os.environ),
    "signals": {
        s.name: getattr(signal.getsignal(s), "__qualname__", None) or str(signal.getsignal(s))
        for s in signal.valid_signals()
        if s < 32
    },
    "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
    "cwd": os.getcwd(),
}
with open("/proc/self/cmdline") as f:
    seen["cmdline"] = f.read().split("\0")[:3]
with open("/proc/self/environ", "rb") as f:
    marks = [v for v in f.read().split(b"\0") if v.startswith(b"RANKSCOPE_RUN_DIR=")]
seen["proc_run_dir"] = marks[0].decode().partition("=")[2] if marks else None
print(json.dumps(seen), flush=True)
end = sys.argv[1]
if rank == 1 and end != "return":
    if end == "raise":
        raise ValueError("rank 1 fails")
    if end == "exit3":
        sys.exit(3)
    if end == "os_exit4":
        os._exit(4)
    if end == "segv":
        ctypes.string_at(0)
dist.barrier()
dist.destroy_process_group()
