"""Probe overhead on a loop of 1-element gloo all_reduces, 2 ranks (requirement: at most 3 %).

Two measurements in one run:
  * in-process A/B: inside one job under the probe, torch's own all_reduce, the probe's wrapper
    (C where the extension is built) and its Python wrapper are called in turn, one call each,
    and every call is timed. The least noisy: neighbouring calls see the same machine. The
    probe thread's formatting of records runs during all arms alike, so this counts what the
    wrapper adds on the rank's own path;
  * whole job: the same loop under plain torchrun with torch's flight recorder on (the probe
    turns it on, so both sides pay for it) versus under rankscope's bootstrap, alternated.
    Everything counts here, and so does the noise between separate jobs.
Prints per-call times and ratios (probed / plain). On a shared machine single calls are
disturbed now and then; the A/B prints the ratio of means and of the fastest 95 % of calls.

    python bench/probe_overhead.py [--calls 20000] [--loop 8000] [--jobs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rankscope.launch.spec import free_port
from rankscope.probe._core import DEFAULT_FR_BUFFER

WORKER = Path(__file__).parent / "_probe_loop.py"


def launch(*, probe: bool, mode: str, calls: int, run_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2"]
    cmd.append(f"--master-port={free_port()}")
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE=DEFAULT_FR_BUFFER)
    if probe:
        env["RANKSCOPE_RUN_DIR"] = str(run_dir)
        cmd += ["-m", "rankscope.probe.bootstrap"]
    cmd += [str(WORKER), f"--mode={mode}", f"--calls={calls}"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("{")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000, help="A/B calls per arm")
    ap.add_argument("--loop", type=int, default=8000, help="calls per whole-job loop")
    ap.add_argument("--jobs", type=int, default=3, help="whole-job pairs (plain, probed)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ab = launch(probe=True, mode="ab", calls=args.calls, run_dir=Path(tmp) / "ab")
        wrapper = "C" if ab.pop("c_wrapper") else "Python (no C extension built)"
        torch_arm = ab.pop("torch")
        print(f"in-process A/B, {args.calls} calls per arm, probe wrapper in {wrapper}:")
        print(
            f"  {'arm':8s} {'mean us':>9s} {'fastest 95% us':>15s} {'ratio':>7s} {'ratio 95%':>10s}"
        )
        for name, arm in {"torch": torch_arm, **ab}.items():
            r_mean = arm["mean_us"] / torch_arm["mean_us"]
            r_trim = arm["trim_us"] / torch_arm["trim_us"]
            print(
                f"  {name:8s} {arm['mean_us']:9.1f} {arm['trim_us']:15.1f} "
                f"{r_mean:7.3f} {r_trim:10.3f}"
            )
        print("  requirement: probe ratio <= 1.03")
        plain_jobs, probed_jobs = [], []
        for i in range(args.jobs):
            run = Path(tmp) / f"j{i}"
            for probe, out in ((False, plain_jobs), (True, probed_jobs)):
                res = launch(probe=probe, mode="loop", calls=args.loop, run_dir=run)
                out.append(res["loop_us"])
        if args.jobs:
            a, b = statistics.median(plain_jobs), statistics.median(probed_jobs)
            print(
                f"whole jobs, {args.jobs} pairs of {args.loop}-call loops, flight recorder on in both:"
            )
            print(
                f"  plain torchrun {a:8.1f} us/call   bootstrap {b:8.1f} us/call   ratio {b / a:.3f}"
            )


if __name__ == "__main__":
    main()
