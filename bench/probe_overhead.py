"""Probe overhead on a loop of 1-element gloo all_reduces, 2 ranks (requirement: at most 3 %).

Measured inside one job under the probe, after its one-off warm-up (see _probe_loop.py):
  * per call: torch's own all_reduce, the probe's wrapper (C where the extension is built) and
    a Python wrapper (of a probe made without the C extension) called in turn, one call each,
    every call timed: where the wrapper's time lands on its own rank (its peer's share lands on
    the next call, another arm's);
  * in blocks: the probe off (torch's all_reduce, the probe thread asleep) and on (the wrapper
    and the probe thread at its own pace) alternating in short blocks: everything the probe
    does on a running rank. This is the ratio the requirement is about.
Then, for comparison, separate jobs: plain torchrun with torch's flight recorder on (the probe
turns it on, so both sides pay for it) versus rankscope's bootstrap, alternated. These include
what happens once per job (imports, the warm-up) and the spread between separate jobs on a
shared machine, which is printed with them.

Prints per-call times and ratios (probed / plain). On a shared machine single calls are
disturbed now and then; the per-call A/B prints the ratio of means and of the fastest 95 %.

    python bench/probe_overhead.py [--calls 20000] [--blocks 1000] [--block 200] [--jobs 3]
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
from rankscope.probe._core import DEFAULT_FR_BUFFER, POLL_S

WORKER = Path(__file__).parent / "_probe_loop.py"


def launch(*, probe: bool, run_dir: Path, args: list[str]) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2"]
    cmd.append(f"--master-port={free_port()}")
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE=DEFAULT_FR_BUFFER)
    if probe:
        env["RANKSCOPE_RUN_DIR"] = str(run_dir)
        cmd += ["-m", "rankscope.probe.bootstrap"]
    cmd += [str(WORKER), *args]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=True)
    return json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("{")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000, help="per-call A/B: calls per arm")
    ap.add_argument("--blocks", type=int, default=1000, help="pairs of off/on blocks")
    ap.add_argument("--block", type=int, default=200, help="calls per block")
    ap.add_argument("--loop", type=int, default=8000, help="calls per separate-job loop")
    ap.add_argument("--jobs", type=int, default=3, help="separate-job pairs (plain, probed)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        res = launch(
            probe=True,
            run_dir=Path(tmp) / "probe",
            args=[
                "--mode=probe",
                f"--calls={args.calls}",
                f"--blocks={args.blocks}",
                f"--block={args.block}",
            ],
        )
        wrapper = "C" if res["c_wrapper"] else "Python (no C extension built)"
        arms = res["per_call"]
        torch_arm = arms["torch"]
        print(f"per call, {args.calls} calls per arm, in turn; the probe's wrapper in {wrapper}:")
        print(
            f"  {'arm':8s} {'mean us':>9s} {'fastest 95% us':>15s} {'ratio':>7s} {'ratio 95%':>10s}"
        )
        for name, arm in arms.items():
            r_mean = arm["mean_us"] / torch_arm["mean_us"]
            r_trim = arm["trim_us"] / torch_arm["trim_us"]
            print(
                f"  {name:8s} {arm['mean_us']:9.1f} {arm['trim_us']:15.1f} "
                f"{r_mean:7.3f} {r_trim:10.3f}"
            )
        b = res["blocks"]
        pairs = b["pair_ratios"]
        print(
            f"in blocks, {args.blocks} pairs of {args.block} calls, the probe off / on"
            " (wrapper and probe thread):"
        )
        print(
            f"  off {b['off_us']:7.1f} us/call   on {b['on_us']:7.1f} us/call   "
            f"ratio {b['on_us'] / b['off_us']:.3f}   (pairs: median "
            f"{statistics.median(pairs):.3f}, middle half {pairs[len(pairs) // 4]:.3f}"
            f"-{pairs[3 * len(pairs) // 4]:.3f})"
        )
        print(
            f"  the probe thread looked {b['looks'] / b['on_s']:.1f} times a second of 'on' blocks"
            f" (it looks every {POLL_S} s on a running rank)"
        )
        print("  requirement: ratio <= 1.03")
        plain, probed = [], []
        for i in range(args.jobs):
            for is_probe, out in ((False, plain), (True, probed)):
                job = launch(
                    probe=is_probe,
                    run_dir=Path(tmp) / f"j{i}",
                    args=["--mode=loop", f"--calls={args.loop}"],
                )
                out.append(job["loop_us"])
        if args.jobs:
            a, b = statistics.median(plain), statistics.median(probed)
            print(
                f"separate jobs, {args.jobs} pairs of {args.loop}-call loops, flight recorder on"
                " in both (one-off costs included):"
            )
            print(
                f"  plain torchrun {a:8.1f} us/call (jobs {min(plain):.1f}-{max(plain):.1f})   "
                f"bootstrap {b:8.1f} us/call (jobs {min(probed):.1f}-{max(probed):.1f})   "
                f"ratio {b / a:.3f}"
            )


if __name__ == "__main__":
    main()
