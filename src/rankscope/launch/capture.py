"""Capturing evidence from every rank of a live job, before anything is killed.

One capture: write ``control/capture.json`` (each rank's probe thread polls it and answers with
stacks, flight-recorder dumps and a ``capture`` event); run ``py-spy dump`` on every rank where the
OS permits; for a rank whose probe does not answer quickly (its thread cannot get the GIL), append
a marker to its stacks file and send SIGUSR1, which faulthandler answers without the GIL. Then
copy what arrived into ``evidence/capture-<id>/`` with a manifest saying what came, how and when.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rankscope.launch.procs import RankProc
from rankscope.rundir import EventTail, RunDir, atomic_write_json

PROBE_GRACE_S = 1.0
"""How long a rank's probe thread gets to answer before the signal fallback is used (on a
quiet machine: see :func:`load_factor`)."""
PYSPY_TIMEOUT_S = 3.0
#: The capture's waits stretch with the load it measures (:func:`load_factor`), at most this
#: many times: a loaded machine answers late, not never, and a stall's evidence is worth
#: seconds more; but a rank that does not answer must not hold the stop for ever.
MAX_LOAD_FACTOR = 4.0


def load_factor() -> float:
    """How many times longer than on a quiet machine a rank may take to answer: the processes
    that want a core now (``procs_running``, this one left out) or over the last minute (the
    load average), per core; 1 on a machine with a core to spare, at most
    :data:`MAX_LOAD_FACTOR`."""
    cores = os.cpu_count() or 1
    try:
        recent = os.getloadavg()[0]
    except OSError:
        recent = 0.0
    running = 0
    with contextlib.suppress(OSError, ValueError), open("/proc/stat", "rb") as f:
        for line in f:
            if line.startswith(b"procs_running "):
                running = int(line.split()[1]) - 1
                break
    return min(MAX_LOAD_FACTOR, max(1.0, max(recent, running) / cores))


def _plain_env() -> dict[str, str]:
    """This process's environment as it is now (SLURM_CONF and friends reach srun), without
    what a notebook kernel sets to force colour on: py-spy's dump must be plain."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "CLICOLOR_FORCE")}
    return {**env, "NO_COLOR": "1"}


def pyspy_path() -> str | None:
    """py-spy next to this Python (a virtual environment's bin/) or on PATH."""
    local = Path(sys.executable).with_name("py-spy")
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which("py-spy")


def next_capture_id(run: RunDir) -> int:
    holder: list[int] = []

    def bump(d: dict[str, Any]) -> None:
        d["captures"] = int(d.get("captures", 0)) + 1
        holder.append(d["captures"])

    run.update_run(bump)
    return holder[0]


def capture_evidence(
    run: RunDir,
    procs: dict[int, RankProc],
    *,
    reason: str,
    timeout_s: float = 4.0,
    pyspy: bool = True,
) -> dict[str, Any]:
    """Ask every rank in ``procs`` (rank -> where its process runs) for evidence; return the
    manifest. A rank on another SLURM node answers through the shared run directory; py-spy
    and the signal reach it through ``srun --overlap``.

    Bounded by ``timeout_s`` on a quiet machine, stretched by the load it measures
    (:func:`load_factor`: the deadline and the probe's grace before the signal, at most
    :data:`MAX_LOAD_FACTOR` times; the manifest's ``load_factor`` and ``deadline_s``). Ranks
    that answered after ``timeout_s`` are listed under ``late`` (their evidence is there, it
    took the stretch); ranks that did not answer by the deadline under ``missing``.
    """
    factor = load_factor()
    base_s, timeout_s = timeout_s, timeout_s * factor
    grace_s = PROBE_GRACE_S * factor
    cid = next_capture_id(run)
    out = run.capture_dir(cid)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    start = time.monotonic()
    tails = {}
    stack_offsets = {}
    for rank in procs:
        tail = EventTail(run.events(rank))
        tail.skip_to_end()
        tails[rank] = tail
        stack_offsets[rank] = _size(run.stacks(rank))
    atomic_write_json(run.capture_request, {"id": cid, "t": t0, "reason": reason})

    spy_results: dict[int, str] = {}
    spy_threads = []
    spy = pyspy_path() if pyspy else None
    for rank, proc in procs.items():
        if spy is None:
            spy_results[rank] = "skipped: py-spy is not installed"
            continue
        th = threading.Thread(
            target=_pyspy, args=(spy, proc, out / f"rank{rank}.pyspy.txt", spy_results, rank)
        )
        th.start()
        spy_threads.append(th)

    ranks: dict[int, dict[str, Any]] = {
        r: {
            "pid": proc.pid,
            "node": proc.node,
            "alive": proc.alive() is not False,
            "via": None,
            "answered_at": None,
            "answered_after_s": None,
            "files": [],
        }
        for r, proc in procs.items()
    }
    signalled: dict[int, float] = {}
    while time.monotonic() - start < timeout_s:
        waiting = [r for r, info in ranks.items() if info["via"] is None and info["alive"]]
        for rank in waiting:
            for ev in tails[rank].read():
                if ev.get("ev") == "capture" and ev.get("id") == cid:
                    ranks[rank].update(
                        via="probe",
                        answered_at=ev.get("t"),
                        files=list(ev.get("files") or []),
                        answered_after_s=time.monotonic() - start,
                    )
            if ranks[rank]["via"] is None:
                ranks[rank]["alive"] = procs[rank].alive() is not False
        waiting = [r for r, info in ranks.items() if info["via"] is None and info["alive"]]
        if not waiting:
            break
        elapsed = time.monotonic() - start
        for rank in waiting:
            if rank not in signalled and elapsed > grace_s:
                if _probe_answering(run, rank, stack_offsets[rank], cid):
                    continue  # its stacks are written; its dumps take longer (first import)
                signalled[rank] = _signal_stacks(run, rank, procs[rank], cid, reason)
            elif rank in signalled and time.monotonic() - signalled[rank] > 0.3:
                ranks[rank].update(
                    via="signal",
                    answered_at=time.time(),
                    files=["stacks.txt"],
                    answered_after_s=time.monotonic() - start,
                )
        time.sleep(0.02)

    for th in spy_threads:
        th.join(max(0.0, timeout_s - (time.monotonic() - start)) + 0.5)

    for rank, info in ranks.items():
        copied = []
        for name in info["files"]:
            src = run.rank_dir(rank) / name
            if name == "stacks.txt":
                dst = out / f"rank{rank}.stacks.txt"
                _copy_from(src, dst, stack_offsets[rank])
            else:
                dst = out / f"rank{rank}.{name}"
                with contextlib.suppress(OSError):
                    shutil.copyfile(src, dst)
            if dst.exists():
                copied.append(dst.name)
        info["copied"] = copied
        info["pyspy"] = spy_results.get(rank, "skipped: no result in time")
    manifest = {
        "id": cid,
        "reason": reason,
        "requested_at": t0,
        "completed_at": time.time(),
        "duration_s": time.monotonic() - start,
        "load_factor": factor,
        "deadline_s": timeout_s,
        "ranks": {str(r): info for r, info in sorted(ranks.items())},
        "late": sorted(
            r for r, info in ranks.items() if (info.get("answered_after_s") or 0.0) > base_s
        ),
        "missing": sorted(r for r, info in ranks.items() if info["via"] is None),
    }
    atomic_write_json(out / "manifest.json", manifest)
    return manifest


def _probe_answering(run: RunDir, rank: int, offset: int, cid: int) -> bool:
    """The rank's probe has begun this capture: its stacks marker is written (the flight-recorder
    dump comes next; a job's first dump with entries imports torch._inductor, a second or two)."""
    try:
        with open(run.stacks(rank), "rb") as f:
            f.seek(offset)
            text = f.read(1 << 20)
    except OSError:
        return False
    marker = f"# rankscope capture id={cid} ".encode()
    return any(line.startswith(marker) and b"via=signal" not in line for line in text.splitlines())


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _copy_from(src: Path, dst: Path, offset: int) -> None:
    with contextlib.suppress(OSError), open(src, "rb") as f:
        f.seek(offset)
        dst.write_bytes(f.read())


def _signal_stacks(run: RunDir, rank: int, proc: RankProc, cid: int, reason: str) -> float:
    """Fallback: a marker line, then SIGUSR1 (faulthandler writes all stacks without the GIL)."""
    with contextlib.suppress(OSError), open(run.stacks(rank), "a") as f:
        f.write(
            f"# rankscope capture id={cid} t={time.time():.6f} reason={reason} "
            f"pid={proc.pid} via=signal\n"
        )
    proc.send(signal.SIGUSR1)
    return time.monotonic()


def _pyspy(spy: str, rank_proc: RankProc, dst: Path, results: dict[int, str], rank: int) -> None:
    # On another node py-spy runs there, beside the rank, through srun (slower to start).
    timeout = PYSPY_TIMEOUT_S + (3.0 if rank_proc.remote else 0.0)
    try:
        proc = subprocess.run(
            rank_proc.beside([spy, "dump", "--pid", str(rank_proc.pid), "--nonblocking"]),
            capture_output=True,
            timeout=timeout,
            text=True,
            env=_plain_env(),
        )
    except subprocess.TimeoutExpired:
        results[rank] = f"skipped: py-spy did not answer within {timeout:.0f} s"
        return
    except OSError as exc:
        results[rank] = f"skipped: {exc}"
        return
    if proc.returncode == 0 and proc.stdout.strip():
        dst.write_text(proc.stdout)
        results[rank] = "ok"
    else:
        why = (proc.stderr or proc.stdout).strip().splitlines()
        results[rank] = "skipped: " + (why[0] if why else f"py-spy exited {proc.returncode}")
