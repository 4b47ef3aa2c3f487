"""The live layer at cluster scale: following a simulated job of many ranks.

A writer process plays the job in a run directory: every rank appends to its ``events.jsonl``
the lines the probe writes, formatted by the probe's own formatters (``rankscope.probe._twins``):
the ``facts`` line of its collective (every member of the world group in it) before its first
call; then one write per flush, every ``HEARTBEAT_S``: a heartbeat, the exit line of the call in
flight at the last flush, a ``call`` line for each collective completed since (``--calls-per-s``
of them), and the enter line of the one in flight now; a step every flush. After ``--steady``
seconds every rank but one enters one more collective and never leaves it; the culprit keeps
beating outside any collective. The ranks answer a capture request as the probe does (stacks,
then a ``capture`` event, at their next poll).

This process follows the job with the real parts, :class:`rankscope.launch.tracker.RankTracker`
and :class:`rankscope.launch.watchdog.Watchdog`, as from a cluster's login node: every rank is
on a SLURM node of its own eight (the CPU checks read the heartbeats); the capture reaches them
through the run directory (their pid, for it, is one sleeping process here). It measures:

- the CPU share of one core used by this process while it follows the steady job;
- the delay from the last rank's hang event written to the live state showing every rank in
  the collective;
- the delay of the stall decision past what the rule asks (the last progress plus the stall
  timeout);
- a capture (:func:`rankscope.launch.capture.capture_evidence`, without py-spy): request to
  every rank answered and copied.

    python bench/live_scale.py [--ranks 1024] [--steady 10] [--stall-timeout 3]

This process imports no torch; the writer does (the probe's formatters live with the probe).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from rankscope.launch.capture import capture_evidence
from rankscope.launch.procs import RankProc
from rankscope.launch.tracker import RankTracker
from rankscope.launch.watchdog import Watchdog
from rankscope.rundir import RunDir

#: The probe's flush and poll periods (``rankscope.probe._core``, which imports torch: not here).
HEARTBEAT_S, POLL_S = 0.5, 0.1

#: The budgets of issue 34, at 1024 ranks.
CPU_BUDGET, STALL_BUDGET_S, CAPTURE_BUDGET_S = 0.15, 0.5, 2.0


# --- the simulated job (the writer process) ----------------------------------------------------
def _line(ev: dict) -> str:
    return json.dumps(ev, separators=(",", ":")) + "\n"


def play(folder: Path, *, ranks: int, calls_per_s: float, steady_s: float, culprit: int) -> None:
    """Write every rank's events until killed; print (wall clock) when every rank had hung and
    when the rule's clock began (the later of the last progress and the first wait)."""
    # the probe's formatters (importing the probe imports torch: in this process only)
    from rankscope.probe._twins import (
        _Call,
        _call_line,
        _enter_line,
        _exit_line,
        _facts_line,
        _seconds,
    )

    run = RunDir(folder)
    # one call site's facts, as a rank's probe records them: the world group, every member
    facts = ("all_reduce", "0", "default_pg", list(range(ranks)), None)
    facts += (((4096,),), ("float32",), False, ("t.py", 9, "step"), None)  # no path line
    statics: dict = {}  # the exit lines' fragments, as the probe keeps them

    def call_at(n: int, t: float) -> _Call:
        return _Call(n, n, t, 1, *facts, 1)  # id, seq, t, tid, facts, facts id

    sleeper = int(os.environ["LIVE_SCALE_PID"])
    files = {}
    for r in range(ranks):
        run.rank_dir(r).mkdir(parents=True, exist_ok=True)
        files[r] = open(run.events(r), "a", buffering=1)  # noqa: SIM115 (kept open: a rank's file)
    t0 = time.time()
    for r, f in files.items():
        # as on a cluster followed from its login node: every rank on a SLURM node, 8 a node
        env = {"SLURMD_NODENAME": f"sim{r // 8}", "SLURM_JOB_ID": "1"}
        start = {"ev": "start", "t": t0, "pid": sleeper, "host": f"sim{r // 8}", "env": env}
        f.write(_line({**start, "main_tid": 1}) + _facts_line(r, 1, facts, t0))
    ticks = max(1, round(HEARTBEAT_S / POLL_S))  # ranks flush in turn, one share per poll
    per_flush = max(1, round(calls_per_s * HEARTBEAT_S))
    seq = dict.fromkeys(range(ranks), 0)
    flying: dict[int, _Call] = {}  # the call in flight at a rank's last flush
    hang_at = t0 + steady_s
    hung: set[int] = set()
    first_enter = None
    told = False
    answered: set[int] = set()
    capture_id = None
    last_progress = t0
    tick = 0
    while True:
        now = time.time()
        request = run.capture_request
        if capture_id is None and request.exists():
            capture_id = json.loads(request.read_text())["id"]
        for r, f in files.items():
            if capture_id is not None and r not in answered:
                _answer(run, r, f, capture_id)
                answered.add(r)
            if r % ticks != tick % ticks:
                continue
            text = _line({"ev": "heartbeat", "t": now, "cpu": 0.0})
            if r in flying and r not in hung:  # the call in flight at the last flush completed
                text += _exit_line(statics, r, flying.pop(r), now, True, None)
                last_progress = now
            if now < hang_at:
                # the calls completed since (a line each), and the one in flight now (its enter)
                for _ in range(per_flush - 1):
                    seq[r] += 1
                    text += _call_line(r, call_at(seq[r], now), now)
                seq[r] += 1
                flying[r] = call_at(seq[r], now)
                text += _enter_line(r, flying[r])
                text += _line({"ev": "step", "t": now, "step": seq[r]})
                last_progress = now
            elif r not in hung:
                hung.add(r)
                if r != culprit:
                    text += _enter_line(r, call_at(seq[r] + 1, now))
                    # as the line has it: to the microsecond
                    first_enter = float(_seconds(now)) if first_enter is None else first_enter
            f.write(text)
            if len(hung) == ranks and not told:  # the last rank's hang is written
                told = True
                # the rule's clock: from the last progress or the first wait, the later
                began = max(last_progress, first_enter or now)
                hang = {"hung_at": time.time(), "waits_from": began, "entered": first_enter}
                print(json.dumps(hang), flush=True)
        tick += 1
        time.sleep(max(0.0, POLL_S - (time.time() - now)))


def _answer(run: RunDir, rank: int, events, capture_id: int) -> None:
    """What the probe writes for a capture: a marker and its stacks, then the event."""
    with open(run.stacks(rank), "a") as f:
        f.write(f"# rankscope capture id={capture_id} t={time.time():.6f} reason=bench\n")
        f.write('Thread 0x0000000000000001 (most recent call first):\n  File "t.py", line 9\n')
    ev = {"ev": "capture", "t": time.time(), "id": capture_id, "files": ["stacks.txt"]}
    events.write(_line(ev))


# --- the follower (this process) ----------------------------------------------------------------
def follow(args: argparse.Namespace, folder: Path) -> dict[str, float]:
    run = RunDir(folder)
    run.path.mkdir(parents=True, exist_ok=True)
    run.write_run({"state": "running", "world_size": args.ranks})
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    env = dict(os.environ, LIVE_SCALE_PID=str(sleeper.pid))
    play_args = ["--ranks", str(args.ranks), "--calls-per-s", str(args.calls_per_s)]
    play_args += ["--steady", str(args.steady), "--culprit", str(args.culprit)]
    writer = subprocess.Popen(
        [sys.executable, __file__, "--play", str(folder), *play_args],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    stalls: list[float] = []
    tracker = RankTracker(run)
    lock = threading.Lock()
    dog = Watchdog(
        run,
        tracker,
        world_size=args.ranks,
        stall_timeout_s=args.stall_timeout,
        startup_timeout_s=60.0,
        lock=lock,
        on_stall=lambda kind, idle, proven: stalls.append(time.time()),
        on_new_ranks=lambda: None,
        on_clear=lambda stalled_s: None,
    )
    try:
        dog.start()
        while len(tracker.records) < args.ranks:  # every rank up
            time.sleep(0.2)
        time.sleep(1.0)
        # The steady job: this process's CPU over a window in which it only follows.
        c0, w0, done0 = time.process_time(), time.monotonic(), _done(tracker, lock)
        time.sleep(max(1.0, args.steady - 2.5))
        window = time.monotonic() - w0
        cpu = (time.process_time() - c0) / window
        followed = (_done(tracker, lock) - done0) / window
        hang = json.loads(writer.stdout.readline())
        waiting = [r for r in range(args.ranks) if r != args.culprit]
        seen_at = None
        give_up = time.monotonic() + 4 * args.stall_timeout + 10
        while seen_at is None and time.monotonic() < give_up:
            with lock:
                # every waiting rank in its last call (each was in a call before, in flight)
                since = [tracker.records[r].in_collective_since for r in waiting]
                if all(t is not None and t >= hang["entered"] for t in since):
                    seen_at = time.time()
            time.sleep(0.01)
        deadline = time.monotonic() + 4 * args.stall_timeout + 10
        while not stalls and time.monotonic() < deadline:
            time.sleep(0.01)
        procs = {r: RankProc(sleeper.pid) for r in range(args.ranks)}
        manifest = capture_evidence(run, procs, reason="bench", pyspy=False, timeout_s=10.0)
    finally:
        dog.closing.set()
        writer.kill()
        sleeper.kill()
        writer.wait()
        sleeper.wait()
    return {
        "cpu_share": cpu,
        "followed": followed,
        "event_to_state_s": (seen_at or float("nan")) - hang["hung_at"],
        "stall_late_s": (stalls[0] if stalls else float("nan"))
        - (hang["waits_from"] + args.stall_timeout),
        "capture_s": manifest["duration_s"],
        "capture_missing": len(manifest["missing"]),
    }


def _done(tracker: RankTracker, lock: threading.Lock) -> int:
    """Collectives completed by every rank so far, as followed."""
    with lock:
        return sum(record.done for record in tracker.records.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--calls-per-s", type=float, default=20.0, help="per rank")
    parser.add_argument("--steady", type=float, default=10.0, help="seconds before the hang")
    parser.add_argument("--stall-timeout", type=float, default=3.0)
    parser.add_argument("--culprit", type=int, default=None, help="default: ranks // 2 + 5")
    parser.add_argument("--dir", type=Path, default=None, help="where (default: a temp dir)")
    parser.add_argument("--play", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.culprit = args.ranks // 2 + 5 if args.culprit is None else args.culprit
    if args.play:
        play(
            args.play,
            ranks=args.ranks,
            calls_per_s=args.calls_per_s,
            steady_s=args.steady,
            culprit=args.culprit,
        )
        return 0
    base = Path(tempfile.mkdtemp(prefix="rankscope-live-", dir=args.dir))
    try:
        out = follow(args, base / "run")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(
        f"{args.ranks} ranks, {args.calls_per_s:g} collectives/s each, flushed every "
        f"{HEARTBEAT_S} s; stall timeout {args.stall_timeout} s"
    )
    print(
        f"following (tracker + watchdog): {out['cpu_share']:.1%} of one core "
        f"(budget {CPU_BUDGET:.0%}), {out['followed']:.0f} collectives a second followed "
        f"(the job's {args.ranks * args.calls_per_s:.0f}: fewer when the writer is starved)"
    )
    print(f"hang events written -> live state: {out['event_to_state_s']:.2f} s")
    print(
        f"stall decided {out['stall_late_s']:.2f} s after the rule asks (budget {STALL_BUDGET_S} s)"
    )
    print(
        f"capture of every rank: {out['capture_s']:.2f} s, {out['capture_missing']} missing "
        f"(budget {CAPTURE_BUDGET_S} s)"
    )
    ok = (
        out["cpu_share"] <= CPU_BUDGET
        and out["stall_late_s"] <= STALL_BUDGET_S
        and out["capture_s"] <= CAPTURE_BUDGET_S
    )
    print("within budget: " + ("yes" if ok else "no"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
