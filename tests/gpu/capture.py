"""Capture real nccl artifacts on a GPU machine, for the fixtures in tests/data and the
figures in the README. Not a test: ``tests/gpu/device_check.sh`` runs it once per lease.

    python tests/gpu/capture.py OUT_DIR

Writes, under OUT_DIR, one folder per case, each a run directory ``rankscope diagnose`` reads:

* ``nccl_timeout``: one rank started by hand (torchrun, no rankscope), a kernel that outlives
  the 10 s collective timeout in front of an all_reduce: NCCL's watchdog times it out, the
  recorder dumps on timeout; NCCL_DEBUG=INFO, timing on.
* ``nccl_timeout_untimed``: the same with ``TORCH_NCCL_ENABLE_TIMING=0``.
* ``nccl_healthy_dump``: 50 all_reduces, then a dump taken right after the last one.
* ``two_ranks_one_gpu``: two ranks that map to one device.

Each folder also holds its ``train.py`` (the scripts below, whose lines the dumps and logs
name; the fixtures in tests/data/nccl_gpu leave them out). ``fr_read_cost.json``: what a live
read of the flight recorder (``onlyActive``, no stack traces) costs on nccl, with nothing and
with 8 collectives uncompleted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

HANG = """
import datetime, os, sys, torch, torch.distributed as dist
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=10))
x = torch.ones(1, device="cuda")
for step in range(6):
    if step == 5:
        # a kernel that outlives the timeout (one that never ends leaves the process hung in
        # its abort, after the dump)
        torch.cuda._sleep(int(25 * torch.cuda.get_device_properties(0).clock_rate * 1000))
    dist.all_reduce(x)
    x.item()
"""

HEALTHY = """
import json, os, pickle, sys, time, torch, torch.distributed as dist
from torch._C._distributed_c10d import _dump_nccl_trace
torch.cuda.set_device(0)
dist.init_process_group("nccl")
x = torch.ones(1 << 10, device="cuda")
for _ in range(50):
    dist.all_reduce(x)
torch.cuda.synchronize()
out = sys.argv[1]
with open(os.path.join(out, "nccl_trace_rank_0"), "wb") as f:
    f.write(_dump_nccl_trace())

def cost(n, **kw):
    t = time.perf_counter()
    for _ in range(n):
        _dump_nccl_trace(**kw)
    return (time.perf_counter() - t) / n * 1e3

active = dict(includeCollectives=True, includeStackTraces=False, onlyActive=True)
for _ in range(1950):
    dist.all_reduce(x)
torch.cuda.synchronize()
figures = {"entries": 2000, "active_read_ms_none_active": cost(200, **active),
           "full_read_ms_no_stacks": cost(20, includeStackTraces=False)}
torch.cuda._sleep(int(3 * torch.cuda.get_device_properties(0).clock_rate * 1000))
for _ in range(8):
    dist.all_reduce(x)
d = pickle.loads(_dump_nccl_trace(**active))
figures["active_read_ms_8_active"] = cost(200, **active)
figures["states_while_blocked"] = [e.get("state") for e in d["entries"]]
torch.cuda.synchronize()
figures["torch"] = torch.__version__
figures["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
figures["device"] = torch.cuda.get_device_name(0)
with open(os.path.join(out, "fr_read_cost.json"), "w") as f:
    json.dump(figures, f, indent=1)
dist.destroy_process_group()
"""

TWO_ON_ONE = """
import torch, torch.distributed as dist
torch.cuda.set_device(0)
dist.init_process_group("nccl")
dist.all_reduce(torch.ones(1, device="cuda"))
dist.destroy_process_group()
"""


def torchrun(out: Path, script: str, *, nproc: int = 1, env: dict[str, str] | None = None):
    out.mkdir(parents=True, exist_ok=True)
    path = out / "train.py"
    path.write_text(textwrap.dedent(script))
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    cmd += ["--master-port=29731", f"--log-dir={out / 'logs'}", "--redirects=3", "--tee=3"]
    cmd += [str(path), str(out)]
    t = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    try:
        text, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        text, _ = proc.communicate()
    (out / "launcher.log").write_text(text)
    print(f"{out.name}: exit {proc.returncode} after {time.monotonic() - t:.1f} s", flush=True)


def main() -> None:
    root = Path(sys.argv[1])
    cases = set(sys.argv[2:])  # only these, where named
    fr = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    for name, timing in (("nccl_timeout", "1"), ("nccl_timeout_untimed", "0")):
        if cases and name not in cases:
            continue
        out = root / name
        env = {**fr, "NCCL_DEBUG": "INFO", "TORCH_NCCL_ENABLE_TIMING": timing}
        env["TORCH_FR_DUMP_TEMP_FILE"] = str(out / "nccl_trace_rank_")
        torchrun(out, HANG, env=env)
    torchrun(root / "nccl_healthy_dump", HEALTHY, env={**fr, "TORCH_NCCL_ENABLE_TIMING": "1"})
    cost = root / "nccl_healthy_dump" / "fr_read_cost.json"
    if cost.exists():
        cost.rename(root / "fr_read_cost.json")
    torchrun(root / "two_ranks_one_gpu", TWO_ON_ONE, nproc=2, env={"NCCL_DEBUG": "WARN"})


if __name__ == "__main__":
    main()
