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

    python bench/startup.py [--pairs 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=8)
    args = parser.parse_args()
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
