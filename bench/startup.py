"""The CPU time a rank's start and end cost, with torch imported plainly and settled.

Every rank and every torchrun agent that rankscope starts imports torch first, through
:func:`rankscope._settle.import_settled` (the collector paused during the import, then what is
alive frozen). On a machine whose cores the ranks share, their start-up is time taken from the
ranks that already run. Each process here starts, imports, does what the workload says and
exits; its CPU time (user + system, from ``os.wait4``) is what it cost the machine:

- ``torch``: ``import torch`` (a torchrun agent, a rank whose script makes no optimizer);
- ``torch+dynamo``: then ``import torch._dynamo``, as torch does at a rank's first optimizer
  (``torch.optim.Optimizer.__init__`` imports it), with the collector running as the user's
  code runs it.

The two ways alternate, the first of a pair swapped every pair; each figure is the median of
``--pairs`` pairs and the ratio settled / plain (below 1: settled costs less).

``--jobs``: whole jobs instead (three gloo ranks that make an optimizer and all-reduce, started
with :class:`rankscope.launch.Job` and waited for), three ways in turn, each job's wall time
from ``start()`` to ``wait()`` and the machine's busy CPU time over it (``/proc/stat``: run it
on a quiet machine):

- ``new``: ranks started as new interpreters (``RANKSCOPE_FORK_RANKS=0``, ``RANKSCOPE_WARM=0``);
- ``template``: ranks forked from the agent's template (:mod:`rankscope._template`);
- ``warm``: the supervisor forked from this process's warm interpreter, the agent from it, the
  ranks from its template (:mod:`rankscope._warm`; one job first, for it to be ready).

    python bench/startup.py [--pairs 8] [--jobs]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from importlib.metadata import version

WORKLOADS = {"torch": "", "torch+dynamo": "import torch._dynamo"}
IMPORTS = {
    "plain": "import torch",
    "settled": "from rankscope._settle import import_settled; import_settled('torch')",
}


def cpu_seconds(code: str) -> float:
    """User + system CPU time of ``python -c code``, start to exit."""
    proc = subprocess.Popen([sys.executable, "-c", code])
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"python -c {code!r} exited {proc.returncode}")
    return usage.ru_utime + usage.ru_stime


JOB = """
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
model = torch.nn.Linear(8, 8)
torch.optim.SGD(model.parameters(), lr=0.1)  # imports torch._dynamo, as a training script does
for _ in range(3):
    dist.all_reduce(torch.ones(8))
dist.destroy_process_group()
"""
JOB_WAYS = {
    "new": {"RANKSCOPE_FORK_RANKS": "0", "RANKSCOPE_WARM": "0"},
    "template": {"RANKSCOPE_WARM": "0"},
    "warm": {},
}


def busy_s() -> float:
    """The machine's CPU time spent busy so far (every core; /proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle, iowait


def jobs(pairs: int) -> None:
    import tempfile
    from pathlib import Path

    from rankscope import _warm
    from rankscope.launch import Job, JobSpec

    os.environ["PYTHONHASHSEED"] = "0"  # the template's condition (rankscope._template.wanted)
    root = Path(tempfile.mkdtemp(prefix="rankscope-startup-"))
    script = root / "job.py"
    script.write_text(JOB)

    def one(way: str) -> tuple[float, float, bool]:
        spec = JobSpec(script=str(script), nproc_per_node=3, env=JOB_WAYS[way])
        t, cpu = time.monotonic(), busy_s()
        job = Job(spec, runs_root=root / "runs").start()
        if job.wait(timeout=300) != 0:
            raise SystemExit(f"{way}: the job failed; see {job.run.path}")  # type: ignore[union-attr]
        return time.monotonic() - t, busy_s() - cpu, isinstance(job._sup, _warm.Started)

    deadline = time.monotonic() + 120
    while not one("warm")[2]:  # the warm interpreter imports while the first job runs
        if time.monotonic() > deadline:
            raise SystemExit("no warm interpreter became ready in 120 s")
        time.sleep(1.0)
    wall: dict[str, list[float]] = {way: [] for way in JOB_WAYS}
    cpu: dict[str, list[float]] = {way: [] for way in JOB_WAYS}
    for pair in range(pairs):
        ways = list(JOB_WAYS)
        for way in ways[pair % 3 :] + ways[: pair % 3]:
            w, c, warm = one(way)
            if warm != (way == "warm"):
                raise SystemExit(f"{way}: started {'warm' if warm else 'the usual way'}")
            wall[way].append(w)
            cpu[way].append(c)
    print(f"a 3-rank gloo job, median of {pairs} of each way (torch {version('torch')})")
    new_wall, new_cpu = statistics.median(wall["new"]), statistics.median(cpu["new"])
    for way in JOB_WAYS:
        w, c = statistics.median(wall[way]), statistics.median(cpu[way])
        print(
            f"{way:<9} wall {w:5.2f} s ({w / new_wall:.2f})   machine CPU {c:5.2f} s "
            f"({c / new_cpu:.2f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--jobs", action="store_true", help="whole jobs, three ways")
    args = parser.parse_args()
    if args.jobs:
        jobs(args.pairs)
        return
    print(f"CPU seconds per process, median of {args.pairs} pairs (torch {version('torch')})")
    for workload, then in WORKLOADS.items():
        times: dict[str, list[float]] = {way: [] for way in IMPORTS}
        for pair in range(args.pairs):
            ways = list(IMPORTS) if pair % 2 == 0 else list(reversed(IMPORTS))
            for way in ways:
                times[way].append(cpu_seconds(f"{IMPORTS[way]}\n{then}"))
        plain, settled = (statistics.median(times[way]) for way in IMPORTS)
        print(
            f"{workload:<14} plain {plain:5.2f} s   settled {settled:5.2f} s   "
            f"ratio {settled / plain:.2f}"
        )


if __name__ == "__main__":
    main()
