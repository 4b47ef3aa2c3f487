"""Every rank of a running job, as its events arrive: one :class:`~rankscope.rundir.RankRecord`
per rank, kept up to date from its ``events.jsonl``, and what the processes show that the events
cannot (alive or dead, working or idle)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from typing import Any

import psutil

from rankscope.launch.procs import RankProc
from rankscope.rundir import EventTail, RankRecord, RunDir

#: A live rank outside every collective that used at least this share of a core since the last
#: look (its main thread and the processes it started) is busy (computing, loading, saving,
#: compiling), not stuck: the others wait for a straggler.
BUSY_CPU_SHARE = 0.2
#: Between looks a rank's events file is read only when a stat shows it grew, but every file is
#: opened and read at least this often: on NFS a stat may return the size the client cached
#: (the attribute cache, 3 s and more), while an open revalidates it (close-to-open), so what
#: a rank on another node wrote is seen within this, whatever the mount's caching.
FULL_READ_S = 1.0


def rank_status(record: RankRecord) -> str:
    """``running``, ``waiting`` (inside a collective), ``exited``, ``failed`` or ``dead``."""
    if record.ended:
        return "exited" if record.exit_code in (0, None) else "failed"
    if (
        record.pid is not None
        and RankProc(record.pid, record.node, record.slurm_job).alive() is False
    ):
        return "dead"
    return "waiting" if record.in_collective_since is not None else "running"


def snapshot(
    record: RankRecord, now: float | None = None, *, job_ended: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The record as a dict with its status and ages relative to ``now``.

    ``job_ended`` (the final run.json) freezes a rank that never reported its end: its exit code
    comes from run.json, its status is ``stopped`` when the job was stopped, and no age keeps
    growing. A rank of a stopped job that ended of the stop's SIGTERM is ``stopped`` too.
    """
    now = time.time() if now is None else now
    d = dataclasses.asdict(record)
    d["status"] = rank_status(record)
    d["heartbeat_age_s"] = None if record.last_event_at is None else now - record.last_event_at
    d["in_collective_s"] = (
        None if record.in_collective_since is None else now - record.in_collective_since
    )
    stopped = job_ended is not None and job_ended.get("state") == "stopped"
    if job_ended is not None and not record.ended:
        info = (job_ended.get("ranks") or {}).get(str(record.rank), {})
        d["exit_code"] = info.get("exit_code")
        d["status"] = "stopped" if stopped else "dead"
        d["heartbeat_age_s"] = d["in_collective_s"] = None
    elif stopped and record.end_reason == "SIGTERM":
        d["status"] = "stopped"  # ended by the stop's SIGTERM, not a failure of its own
    return d


def exit_text(code: int | None) -> str:
    """An exit code as people read it: a negative one is the signal that ended the process,
    ``SIGTERM (-15)``."""
    if code is None:
        return ""
    if code < 0:
        try:
            return f"{signal.Signals(-code).name} ({code})"
        except ValueError:
            return f"signal {-code} ({code})"
    return str(code)


def doing_now(snap: dict[str, Any]) -> str:
    """What a rank's snapshot says it does now, in words.

    ``waiting in all_reduce (group 0 #3) at train.py:8 for 4.2 s``, or ``at train.py:14`` (its
    main thread's line, when its probe reported it), or nothing for a rank that ended.
    """
    if snap.get("in_collective_s") is not None:
        return (
            f"waiting in {snap['op']} (group {snap['pg']} #{snap['seq']}) at {snap['site']} "
            f"for {snap['in_collective_s']:.1f} s"
        )
    if snap.get("status") == "running" and snap.get("at"):
        return f"at {snap['at']}"
    return ""


def in_collective(record: RankRecord) -> bool:
    """Inside a collective: one the probe saw it enter, or one the flight recorder has enqueued
    but not completed (issued from C++: DDP, FSDP)."""
    fr = record.fr or {}
    return record.in_collective_since is not None or any(e > c for e, c in fr.values())


class RankTracker:
    """Follows every rank's events.jsonl incrementally and keeps a record of each."""

    def __init__(self, run: RunDir):
        self.run = run
        self.tails: dict[int, EventTail] = {}
        self.records: dict[int, RankRecord] = {}
        self._sizes: dict[int, int] = {}  # rank -> its events file's size at the last read
        self._listed: tuple[int, float] | None = None  # (ranks/ mtime, when), last listing
        self._full_at = 0.0
        self._cpu: dict[int, tuple[float, float]] = {}  # rank -> (monotonic time, CPU seconds)
        #: When an update last read progress (monotonic). Whoever reads the events (the
        #: watchdog, a live panel through ``Job.ranks()``), the watchdog sees it here.
        self.progressed_at = time.monotonic()

    def update(self) -> bool:
        """Read new events; return True if any rank made progress (started, completed,
        stepped), and then stamp :attr:`progressed_at`."""
        progress = False
        now = time.monotonic()
        if self._relist(now):
            for rank in self.run.rank_ids():
                if rank not in self.tails:
                    self.tails[rank] = EventTail(self.run.events(rank))
                    self.records[rank] = RankRecord(rank=rank)
        full = now >= self._full_at
        if full:
            self._full_at = now + FULL_READ_S
        for rank, tail in self.tails.items():
            if not full:  # a stat costs a third of an open and a read: most files are idle
                try:
                    size = os.stat(tail.path).st_size
                except OSError:
                    continue
                if size == self._sizes.get(rank):
                    continue
                self._sizes[rank] = size
            record = self.records[rank]
            for ev in tail.read():
                progress |= record.apply(ev)
        if progress:
            self.progressed_at = time.monotonic()
        return progress

    def _relist(self, now: float) -> bool:
        """Whether to list ``ranks/`` for new ranks: when its mtime changed (a rank's directory
        was made) or is recent (mtimes tick coarsely: a second directory made in the same tick
        leaves it as it was), and at least every ``FULL_READ_S`` (an NFS client may cache it)."""
        try:
            mtime = os.stat(self.run.ranks).st_mtime_ns
        except OSError:
            return False
        recent = time.time_ns() - mtime < FULL_READ_S * 1e9
        if self._listed is not None and self._listed[0] == mtime and now < self._listed[1]:
            return recent
        self._listed = (mtime, now + FULL_READ_S)
        return True

    def snapshots(
        self, now: float | None = None, *, job_ended: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        return [snapshot(self.records[r], now, job_ended=job_ended) for r in sorted(self.records)]

    def procs(self, *, alive_only: bool = True) -> dict[int, RankProc]:
        """Where each rank's process runs; with ``alive_only``, those not ended (and, on this
        host, still running)."""
        out = {}
        for r, s in self.records.items():
            if s.pid is None:
                continue
            proc = RankProc(s.pid, node=s.node, slurm_job=s.slurm_job)
            if not alive_only or (not s.ended and proc.alive() is not False):
                out[r] = proc
        return out

    def busy_outside_collectives(self) -> bool:
        """Some live rank outside every collective used CPU since the last call, on its main
        thread or in a process it started (a compiler, torch.compile's workers; see
        :data:`BUSY_CPU_SHARE`): it is working, and the ranks waiting for it are not stuck."""
        busy = False
        now = time.monotonic()
        for rank, record in self.records.items():
            if record.ended or record.pid is None or in_collective(record):
                self._cpu.pop(rank, None)
                continue
            if RankProc(record.pid, record.node, record.slurm_job).remote:
                # On another node: its heartbeats carry its main thread's CPU time.
                fresh = (
                    record.last_event_at is not None and time.time() - record.last_event_at < 2.0
                )
                share = record.cpu_share if fresh else None
                busy |= record.warming or (share is not None and share >= BUSY_CPU_SHARE)
                continue
            if record.warming and _main_thread_may_want_the_gil(record.pid):
                # The probe's warm-up import holds the GIL for a second or two: a computing
                # main thread waits for it (a futex) and gets little CPU meanwhile. One that
                # sleeps, or waits on a socket or a pipe, is idle all the same.
                busy = True
                continue
            # The main thread only: the probe's own threads are not the rank's work.
            if _main_thread_runs(record.pid):  # running or runnable, or in disk I/O, right now
                busy = True
                continue
            cpu = _work_cpu(record.pid)
            if cpu is None:
                continue
            last = self._cpu.get(rank)
            self._cpu[rank] = (now, cpu)
            if last is not None and now > last[0]:
                busy |= (cpu - last[1]) / (now - last[0]) >= BUSY_CPU_SHARE
        return busy

    def waiting_in_collective(self) -> bool:
        """A live rank is inside a collective."""
        return any(not s.ended and in_collective(s) for s in self.records.values())


def _work_cpu(pid: int) -> float | None:
    """CPU seconds of a local rank's main thread and of the processes it started, running or
    ended; None when the rank cannot be read."""
    try:
        proc = psutil.Process(pid)
        main = [t for t in proc.threads() if t.id == pid]
        if not main:
            return None
        times = proc.cpu_times()  # its children's, once it has waited for them
        total = (
            main[0].user_time + main[0].system_time + times.children_user + times.children_system
        )
        children = proc.children(recursive=True)
    except psutil.Error:
        return None
    for child in children:
        with contextlib.suppress(psutil.Error):
            child_times = child.cpu_times()
            total += child_times.user + child_times.system
    return total


def _main_thread_runs(pid: int) -> bool:
    """Linux: the scheduler state of the process's main thread is R (running or waiting for a
    core: on a loaded machine a computing rank gets little CPU but stays runnable) or D (disk).
    False where /proc does not say."""
    try:
        with open(f"/proc/{pid}/task/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] in (b"R", b"D")


def _main_thread_may_want_the_gil(pid: int) -> bool:
    """Linux: the main thread waits on a futex (where a thread waits for the GIL), or where it
    waits cannot be read (kernels that hide it say ``0``): it may be a working thread that the
    GIL keeps off the CPU. False when it runs (the other checks see that) or sleeps elsewhere
    (``hrtimer_nanosleep``, ``poll_schedule_timeout``, a pipe's read)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/wchan") as f:
            where = f.read().strip()
    except OSError:
        return True
    return where in ("", "0") or "futex" in where
