"""Stall onset to evidence complete on a 4-rank CPU job (requirement: at most 5 s).

Runs a real 4-rank gloo job in which rank 0 alone enters a barrier, with the default stall
timeout, and reads back from the run directory:
  onset     the last progress any rank made (its last completed collective),
  detected  when the watchdog declared the stall,
  complete  when evidence (stacks, flight recorder, py-spy) from every rank was on disk.
Prints each interval and the ratio of onset->complete to the 5 s budget.

    python bench/stall_capture.py [--repeats 3] [--nproc 4] [--stall-timeout 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from rankscope.launch import Job, JobSpec
from rankscope.rundir import RunDir

SCRIPT = Path(__file__).resolve().parent.parent / "tests/scripts/launch/conditional_barrier.py"
BUDGET_S = 5.0


def last_progress(run: RunDir) -> float:
    return max(
        ev["t"]
        for rank in run.rank_ids()
        for ev in run.iter_events(rank)
        if ev.get("ev") in ("exit", "step", "start")
    )


def one(root: Path, *, nproc: int, stall_timeout: float) -> tuple[float, float, float]:
    spec = JobSpec(
        script=str(SCRIPT), nproc_per_node=nproc, stall_timeout_s=stall_timeout, on_stall="stop"
    )
    job = Job(spec, runs_root=root).start()
    try:
        job.wait(timeout=120)
    finally:
        if job.poll() is None:
            job.stop()
    (stall,) = job.info()["stalls"]
    assert not stall["missing"], f"ranks without evidence: {stall['missing']}"
    onset = last_progress(job.run)
    return (
        stall["detected_at"] - onset,
        stall["evidence_complete_at"] - stall["detected_at"],
        stall["evidence_complete_at"] - onset,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--stall-timeout", type=float, default=JobSpec.stall_timeout_s)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            rows.append(one(Path(tmp) / str(i), nproc=args.nproc, stall_timeout=args.stall_timeout))
            print(
                f"run {i}: onset->detected {rows[-1][0]:.2f} s  detected->complete "
                f"{rows[-1][1]:.2f} s  onset->complete {rows[-1][2]:.2f} s"
            )
    total = statistics.median(r[2] for r in rows)
    capture = statistics.median(r[1] for r in rows)
    print(
        f"{args.nproc} ranks, stall timeout {args.stall_timeout:g} s: median onset->complete "
        f"{total:.2f} s (detected->complete {capture:.2f} s); ratio to the {BUDGET_S:g} s "
        f"budget {total / BUDGET_S:.2f} (requirement <= 1.00)"
    )


if __name__ == "__main__":
    main()
