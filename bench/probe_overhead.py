"""Probe overhead on a loop of 1-element gloo all_reduces, 2 ranks (requirement: at most 3 %).

Two measurements in one run:
  * in-process A/B: inside one job under the probe, blocks through the probe's wrapper alternate
    with blocks through torch's own all_reduce (same peers, same moment; the least noisy);
  * whole job: the same loop under plain torchrun versus under rankscope's bootstrap, alternated.
Prints per-call times and the ratios (probed / plain) from medians.

    python bench/probe_overhead.py [--block 2000] [--repeats 7] [--jobs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
WORKER = HERE / "_probe_loop.py"


def launch(*, probe: bool, block: int, repeats: int, run_dir: Path) -> dict:
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=2",
        f"--master-port={port}",
    ]
    env = None
    if probe:
        import os

        env = dict(os.environ, RANKSCOPE_RUN_DIR=str(run_dir))
        cmd += ["-m", "rankscope.probe.bootstrap"]
    cmd += [str(WORKER), str(block), str(repeats)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=True)
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("{"))
    return json.loads(line)


def _free_port() -> int:
    from rankscope.launch.spec import free_port

    return free_port()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--block", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--jobs", type=int, default=3, help="whole-job pairs (plain, probed)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ab = launch(probe=True, block=args.block, repeats=args.repeats, run_dir=Path(tmp) / "ab")
        plain_us = statistics.median(ab["plain_s"]) * 1e6
        probed_us = statistics.median(ab["probed_s"]) * 1e6
        pairs = [b / a for a, b in zip(ab["plain_s"], ab["probed_s"], strict=True)]
        print(f"in-process A/B, {args.repeats} x {args.block} calls per path:")
        print(f"  torch all_reduce   {plain_us:8.1f} us/call")
        print(f"  through the probe  {probed_us:8.1f} us/call")
        print(f"  ratio probed/plain {probed_us / plain_us:8.3f}  (requirement <= 1.03)")
        print(f"  median of per-round ratios {statistics.median(pairs):.3f}")

        plain_jobs, probed_jobs = [], []
        for i in range(args.jobs):
            plain_jobs.append(
                statistics.median(
                    launch(probe=False, block=args.block, repeats=3, run_dir=Path(tmp))["plain_s"]
                )
            )
            res = launch(probe=True, block=args.block, repeats=3, run_dir=Path(tmp) / f"j{i}")
            probed_jobs.append(statistics.median(res["probed_s"]))
        a = statistics.median(plain_jobs) * 1e6
        b = statistics.median(probed_jobs) * 1e6
        print(f"whole jobs, {args.jobs} pairs (plain torchrun vs rankscope bootstrap):")
        print(f"  plain {a:8.1f} us/call   probed {b:8.1f} us/call   ratio {b / a:6.3f}")


if __name__ == "__main__":
    main()
