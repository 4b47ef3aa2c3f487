"""Stall onset to verdict card, per kind of hang, on real gloo jobs (3 ranks unless told).

Each kind is a real job that freezes one way (``tests/scripts/prove/provable.py``; ``outside``
is ``tests/scripts/launch/conditional_barrier.py``: rank 0 in a barrier while the others sleep,
which nothing proves; ``busy`` is ``tests/scripts/launch/busy_loop.py``: the last rank spins in a
Python loop forever while the others wait in all_reduce, a ``busy`` stall at the timeout). Read
back from the run directory and the job:
  onset     the moment the last rank involved took its wrong step: entered its call, or ended
            (the latest ``enter`` or ``end`` event any rank wrote before the stall was called;
            for ``busy``, the last of the waiting ranks entering all_reduce),
  detected  when the watchdog called the stall (``proven``, or after the stall timeout),
  evidence  when the capture (stacks, flight recorder, py-spy) from every rank was on disk,
  card      when the diagnosis of the frozen job was rendered (``diagnose()``, ``to_html()``),
            as ``rankscope run`` and the workbench show it at the stall.
Prints each run, then per kind the median over the runs of onset->detected, onset->evidence and
onset->card, against the goal: provable kinds within 0.5 s of the onset whatever the stall
timeout; ``busy`` within the stall timeout + 0.5 s; the rest within the stall timeout + 1 s.

    python bench/stall_capture.py [--kinds mismatch p2p ...] [--repeats 3] [--stall-timeout 30]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rankscope.analyze import diagnose
from rankscope.launch import Job, JobSpec
from rankscope.rundir import RunDir

ROOT = Path(__file__).resolve().parent.parent
PROVABLE = ROOT / "tests/scripts/prove/provable.py"
#: kind -> (script, its arguments); every kind but ``outside`` is provable.
KINDS = {
    "mismatch": (PROVABLE, ["mismatch"]),
    "conditional": (PROVABLE, ["conditional"]),
    "exited": (PROVABLE, ["exited"]),
    "p2p": (PROVABLE, ["p2p"]),
    "cross": (PROVABLE, ["cross"]),
    "outside": (ROOT / "tests/scripts/launch/conditional_barrier.py", []),
    "busy": (ROOT / "tests/scripts/launch/busy_loop.py", ["forever"]),
}
PROVEN_GOAL_S = 0.5
#: kind -> its goal past the stall timeout (the provable kinds: PROVEN_GOAL_S, from the onset).
TIMEOUT_GOAL_S = {"outside": 1.0, "busy": 0.5}


def goal_s(kind: str, stall_timeout: float) -> float:
    late = TIMEOUT_GOAL_S.get(kind)
    return PROVEN_GOAL_S if late is None else stall_timeout + late


def onset(run: RunDir, before: float) -> float:
    return max(
        ev["t"]
        for rank in run.rank_ids()
        for ev in run.iter_events(rank)
        if ev.get("ev") in ("enter", "end") and ev["t"] <= before
    )


def one(root: Path, kind: str, *, nproc: int, stall_timeout: float) -> dict[str, Any]:
    script, args = KINDS[kind]
    spec = JobSpec(
        script=str(script),
        args=args,
        nproc_per_node=nproc,
        stall_timeout_s=stall_timeout,
        on_stall="stop",
    )
    cards: list[float] = []
    job = Job(spec, runs_root=root)

    def card(job: Job, stall: dict[str, Any]) -> None:
        diagnose(job.run.path).to_html()
        cards.append(time.time())

    job.on_stall_callbacks.append(card)
    job.start()
    try:
        job.wait(timeout=stall_timeout + 120)
    finally:
        if job.poll() is None:
            job.stop()
    stalls = job.info()["stalls"]
    if not stalls or not cards:
        raise RuntimeError(f"{kind}: no stall was called ({job.run.path})")
    stall = stalls[0]
    start = onset(job.run, stall["detected_at"])
    return {
        "kind": stall["kind"],
        "summary": stall.get("summary"),
        "proven": stall.get("proven"),
        "detected": stall["detected_at"] - start,
        "evidence": stall["evidence_complete_at"] - start,
        "card": cards[0] - start,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", nargs="*", default=list(KINDS), choices=list(KINDS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=3)
    ap.add_argument("--stall-timeout", type=float, default=JobSpec.stall_timeout_s)
    args = ap.parse_args()
    summary = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.kinds:
            rows = []
            for i in range(args.repeats):
                root = Path(tmp) / f"{kind}-{i}"
                rows.append(one(root, kind, nproc=args.nproc, stall_timeout=args.stall_timeout))
                r = rows[-1]
                print(
                    f"{kind:11} run {i}: {r['kind']:11} onset->detected {r['detected']:6.2f} s  "
                    f"->evidence {r['evidence']:6.2f} s  ->card {r['card']:6.2f} s"
                    + (f"  proven: {r['proven']}" if r["proven"] else "")
                    + (f"  ({r['summary']})" if r["kind"] == "busy" else ""),
                    flush=True,
                )
            summary.append((kind, rows))
    print(
        f"\n{args.nproc} ranks, stall timeout {args.stall_timeout:g} s, median of {args.repeats}:"
    )
    for kind, rows in summary:
        med = {k: statistics.median(r[k] for r in rows) for k in ("detected", "evidence", "card")}
        proven = sum(r["kind"] == "proven" for r in rows)
        goal = goal_s(kind, args.stall_timeout)
        print(
            f"  {kind:11} proven {proven}/{len(rows)}  onset->detected {med['detected']:6.2f} s  "
            f"->evidence {med['evidence']:6.2f} s  ->card {med['card']:6.2f} s  (goal {goal:g} s: "
            f"ratio detected {med['detected'] / goal:.2f}, card {med['card'] / goal:.2f})"
        )


if __name__ == "__main__":
    main()
