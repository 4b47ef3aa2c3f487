"""Every rank of a running job, as its events arrive: one :class:`~rankscope.rundir.RankRecord`
per rank, kept up to date from its ``events.jsonl``, and what the processes show that the events
cannot (alive or dead, working or idle).

A rank waits in a collective from its call until the backend completes it
(:func:`waiting_in`): a blocking call not returned, an async call whose Work has not completed,
a flight-recorder entry not completed (nccl's blocking calls, DDP's buckets from C++), each with
its state (issued, started on the device) and the line where the rank waits."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import time
from typing import Any

import psutil

from rankscope import state
from rankscope._source import loop_at
from rankscope._values import as_int
from rankscope.launch.procs import RankProc
from rankscope.rundir import (
    P2P_OPS,
    EventTail,
    RankRecord,
    RunDir,
    ring_may_add,
    whole_record,
)
from rankscope.state import RankEnd
from rankscope.waitfor import RankState

#: A live rank outside every collective that used at least this share of a core since the last
#: look (its main thread and the processes it started) is busy (computing, loading, saving,
#: compiling), not stuck: the others wait for a straggler.
BUSY_CPU_SHARE = 0.2
#: Between looks a rank's events file is read only when a stat shows it grew, but every file is
#: opened and read at least this long after its last read: on NFS a stat may return the size
#: the client cached (the attribute cache, 3 s and more), while an open revalidates it
#: (close-to-open), so what a rank on another node wrote is seen within this, whatever the
#: mount's caching. A rank that writes often is read as it writes, and opened no more.
FULL_READ_S = 1.0


#: What a record keeps for the stall prover alone (:meth:`RankTracker.states`), not shown.
_PROVER_ONLY = frozenset(
    {
        "collectives",
        "recent",
        "numbered",
        "sent",
        "received",
        "p2p_known",
        "call_thread",
        "threads",
    }
)


def rank_status(record: RankRecord) -> str:
    """``running``, ``waiting`` (inside a collective), ``dead`` (its process gone without an end
    event), or how it ended (:attr:`rankscope.state.RankEnd.status`), from its events alone."""
    if record.ended:
        end = rank_end(record)
        return end.status if end is not None else "dead"
    if (
        record.pid is not None
        and RankProc(record.pid, record.node, record.slurm_job).alive() is False
    ):
        return "dead"
    return "waiting" if in_collective(record) else "running"


def rank_end(
    record: RankRecord, job: dict[str, Any] | None = None, *, stopped: bool = False
) -> RankEnd | None:
    """How the rank ended (:func:`rankscope.state.rank_end`): its end event, and the exit code
    its parent saw where ``job`` (run.json) has it; None while it has not ended."""
    info = ((job or {}).get("ranks") or {}).get(str(record.rank))
    parent = as_int(info.get("exit_code")) if isinstance(info, dict) else None
    return state.rank_end(
        parent_code=parent,
        probe_code=record.exit_code if record.ended else None,
        how=(record.end_how or record.end_reason) if record.ended else None,
        stopped=stopped,
    )


def snapshot(
    record: RankRecord,
    now: float | None = None,
    *,
    job_ended: dict[str, Any] | None = None,
    stopping: bool = False,
) -> dict[str, Any]:
    """The record as a dict with its status, its end and ages relative to ``now``.

    ``job_ended`` (the final run.json) freezes a rank that never reported its end, and gives
    every rank the exit code its parent saw; no age keeps growing. ``stopping``: the job is
    being stopped (its Stop's signals are the stop's, not the launcher's). ``status`` is
    :attr:`rankscope.state.RankEnd.status` once the rank ended, ``end`` its
    :attr:`~rankscope.state.RankEnd.words` (empty while it runs); in a live job, a rank whose
    end event is written but whose process still runs (on this host) is ``exiting``.
    """
    now = time.time() if now is None else now
    d = {
        f.name: copy.deepcopy(getattr(record, f.name))
        for f in dataclasses.fields(record)
        if not f.name.startswith("_") and f.name not in _PROVER_ONLY
    }
    d["status"] = rank_status(record)
    # an ended rank beats no more: the age of its last event says nothing
    ended = record.ended or record.last_event_at is None
    d["heartbeat_age_s"] = None if ended else now - record.last_event_at
    d["in_collective_s"] = (
        None if record.in_collective_since is None else now - record.in_collective_since
    )
    waits = waiting_in(record)
    if waits is not None and waits["since"] is not None:
        waits["for_s"] = max(0.0, now - waits["since"])
    if waits is not None and waits["started_s"] is not None:
        waits["started_for_s"] = max(0.0, now - waits["started_s"])
    d["waiting"] = waits
    if d["last_done"] in record.uncompleted():
        d["last_done"] = None  # nccl returned from it at enqueue: not completed
    stopped = stopping or (job_ended is not None and state.stopping(job_ended))
    end = rank_end(record, job_ended, stopped=stopped) if record.ended or job_ended else None
    if job_ended is not None and not record.ended:
        d["heartbeat_age_s"] = d["in_collective_s"] = d["waiting"] = None
        if end is None:
            end = state.RankEnd(code=None, stopped=stopped)
    if end is not None:
        d["status"], d["exit_code"], d["end"] = end.status, end.code, end.words
    else:
        d["end"] = ""
    live = job_ended is None and record.ended and record.pid is not None
    if live and RankProc(record.pid, record.node, record.slurm_job).alive():
        d["status"] = "exiting"  # its end event is written; its process still runs
        d["end"] = f"script ended ({d['end'] or 'no code'}), process not exited"
    return d


def doing_now(snap: dict[str, Any]) -> str:
    """What a rank's snapshot says it does now, in words.

    ``waiting in all_reduce (group 0 #3) at train.py:8 for 4.2 s``, or ``at train.py:14`` (its
    main thread's line, when its probe reported it); for a rank that ended in a call, or on
    one that failed, ``ended in all_reduce (group 0 #4) failed``; else nothing.
    """
    if snap.get("in_collective_s") is not None:
        return (
            f"waiting in {snap['op']} (group {snap['pg']} #{snap['seq']}) at {snap['site']} "
            f"for {snap['in_collective_s']:.1f} s"
        )
    waits = snap.get("waiting")
    if waits and snap.get("status") == "waiting":
        return waiting_text(waits, at=snap.get("at"))
    if snap.get("status") == "running" and snap.get("at"):
        return f"at {snap['at']}"
    if snap.get("end") and snap.get("op") and snap.get("last_state") not in (None, "completed"):
        # it ended in a call, or on one that raised: the call and its state
        return "ended in " + state.call_text(
            snap["op"], snap.get("pg"), snap.get("seq"), snap["last_state"], ended=""
        )
    return ""


def waiting_text(waits: dict[str, Any], *, at: str | None) -> str:
    """A collective the backend has not completed, in words (see :func:`waiting_in`):
    ``waiting in all_reduce (group 0 #6) issued at train.py:41 12.4 s ago, not started (the
    stream is still busy with earlier work), waited at train.py:50``."""
    what = f"{waits['op'] or 'a collective'} (group {waits['pg']} #{waits['seq']}"
    what += ", issued by torch)" if waits["site"] is None else ")"
    text = f"waiting in {what}"
    if waits["site"] is not None:
        text += f" issued at {waits['site']}"
    if waits.get("for_s") is not None:
        text += f" {waits['for_s']:.1f} s ago"
    state = waits["state"]
    late = waits.get("waiting_for")
    if state == "started":
        started = waits.get("started_for_s")
        text += ", started" + (f" {started:.1f} s ago" if started is not None else "")
        text += f", waiting for {_ranks(late)}" if late else ", not completed"
    elif state == "scheduled":
        text += ", not started (the stream is still busy with earlier work)"
    else:
        text += f", not completed, waiting for {_ranks(late)}" if late else ", not completed"
    return text + (f", waited at {at}" if at else "")


def busy_text(snaps: list[dict[str, Any]]) -> str | None:
    """The ranks that keep the others waiting while they run code outside every collective, in
    words, from the ranks' snapshots: ``rank 2 busy in `while err > tol:` at train.py:10 for
    6.0 s while ranks 0, 1 wait in all_reduce #7``. The loop is the innermost one around the
    line its last heartbeat gave (just that line where no loop holds it, or the source cannot be
    read). None when no rank waits or none runs outside."""
    waiting = [s for s in snaps if s.get("status") == "waiting" and s.get("waiting")]
    running = [s for s in snaps if s.get("status") == "running"]
    if not waiting or not running:
        return None
    waited = max((s["waiting"].get("for_s") or 0.0) for s in waiting)
    calls = sorted(
        {f"{s['waiting']['op'] or 'a collective'} #{s['waiting']['seq']}" for s in waiting}
    )
    busy = [f"rank {s['rank']} busy{_busy_where(s)}" for s in running]
    return (
        f"{', '.join(busy)} for {waited:.1f} s while {_ranks([s['rank'] for s in waiting])} "
        f"wait in {', '.join(calls)}"
    )


def exit_text(snaps: list[dict[str, Any]], lingering: list[int]) -> str | None:
    """The ranks whose process outlived its script, in words, from the ranks' snapshots:
    ``rank 0 ended its script (returned) 4.1 s ago and has not exited; ranks 1, 2 exited``.
    None when there is none."""
    if not lingering:
        return None
    now = time.time()
    ended = [s["last_event_at"] for s in snaps if s["rank"] in lingering and s["last_event_at"]]
    age = f" {now - min(ended):.1f} s ago" if ended else ""
    how = sorted({str(s.get("end_how")) for s in snaps if s["rank"] in lingering} - {"None"})
    said = f" ({', '.join(how)})" if how else ""
    their = "its" if len(lingering) == 1 else "their"
    has = "has" if len(lingering) == 1 else "have"
    text = f"{_ranks(lingering)} ended {their} script{said}{age} and {has} not exited"
    gone = [s["rank"] for s in snaps if s["rank"] not in lingering]
    return text + (f"; {_ranks(gone)} exited" if gone else "")


def _busy_where(snap: dict[str, Any]) -> str:
    at, file = snap.get("at"), snap.get("at_file")
    if not at:
        return ""
    name, _, line = at.rpartition(":")
    loop = loop_at(file, int(line)) if file and line.isdigit() else None
    if loop is None:
        return f" at {at}"
    return f" in `{loop[1]}` at {name}:{loop[0]}"


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def waiting_in(record: RankRecord) -> dict[str, Any] | None:
    """The collective a live rank waits in, or None: its blocking call in flight; else the
    oldest async call it issued that the backend has not completed (its Work); else the oldest
    entry of the flight recorder not completed (issued from C++: DDP's buckets, FSDP), or a
    group whose recorder counts fewer collectives completed than enqueued.

    A dict: op, pg, seq, site (the line that issued it; None for torch's own), since (when it
    was issued), state (the recorder's ``scheduled`` = not started on the device, or
    ``started``; None where the backend does not say: gloo, or nccl without timing) and
    started_s. Where the recorder's entries were read, they are the truth: its per-group
    counters lag behind them on nccl."""
    if record.ended:
        return None
    if record.in_collective_since is not None:
        return _waits(record.op, record.pg, record.seq, record.site, record.in_collective_since)
    active = [e for e in record.fr_active if _entry(e)] if record.fr_active else []
    if record.issued:
        op, pg, seq, site, since = record.issued[min(record.issued)]
        # The probe's numbering is the recorder's where the group has no collective from C++.
        same = next((e for e in active if e[0] == pg and e[1] == seq and e[2] == op), None)
        if same is None:
            return _waits(op, pg, seq, site, since)
        return _waits(op, pg, seq, site, since, state=same[3], started=same[5])
    if active:
        pg, seq, op, state, created, started = active[0][:6]
        # nccl's blocking calls return at enqueue: the recorder's entry of the rank's last call
        # (same group, number and op) is that call's, issued at its line.
        mine = (pg, seq, op) == (record.pg, record.seq, record.op)
        site = record.site if mine else None
        return _waits(op, pg, seq, site, created, state=state, started=started)
    if record.fr_active is None:  # not read: the counters are all there is
        for pg, (enqueued, completed) in (record.fr or {}).items():
            if enqueued > completed:
                return _waits(None, pg, completed + 1, None, None)
    return None


def _waits(
    op: Any,
    pg: Any,
    seq: Any,
    site: Any,
    since: Any,
    *,
    state: Any = None,
    started: Any = None,
) -> dict[str, Any]:
    return {
        "op": op,
        "pg": pg,
        "seq": seq,
        "site": site,
        "since": since,
        "state": state if state in ("scheduled", "started") else None,
        "started_s": started if isinstance(started, (int, float)) else None,
    }


def _entry(e: Any) -> bool:
    """A well-formed entry of a heartbeat's ``fr_active`` (it comes from a file)."""
    return isinstance(e, list) and len(e) >= 6 and isinstance(e[0], str) and type(e[1]) is int


def in_collective(record: RankRecord) -> bool:
    """Waiting in a collective the backend has not completed: a blocking call it is inside, an
    async call's Work, or what the flight recorder has enqueued but not completed (issued from
    C++: DDP, FSDP). See :func:`waiting_in`."""
    if record.ended:
        return False
    # asked of every rank at every look: the probe's own calls need no dict of facts
    return (
        record.in_collective_since is not None
        or bool(record.issued)
        or (waiting_in(record) is not None)
    )


class RankTracker:
    """Follows every rank's events.jsonl incrementally and keeps a record of each."""

    def __init__(self, run: RunDir):
        self.run = run
        self.tails: dict[int, EventTail] = {}
        self.records: dict[int, RankRecord] = {}
        self._listed: tuple[int, float] | None = None  # (ranks/ mtime, when), last listing
        self._opened: dict[int, float] = {}  # rank -> when its file was last read (monotonic)
        self._cpu: dict[int, tuple[float, float]] = {}  # rank -> (monotonic time, CPU seconds)
        #: When an update last read progress (monotonic). Whoever reads the events (the
        #: watchdog, a live panel through ``Job.ranks()``), the watchdog sees it here.
        self.progressed_at = time.monotonic()
        #: Events read so far that change what a rank called or waits in (all but heartbeats):
        #: the prover's facts changed since a look that saw fewer.
        self.changes = 0
        self._wholes: dict[int, RankRecord] = {}  # rank -> its whole record, once the job ended

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
        due, opened = now - FULL_READ_S, self._opened
        changes = 0
        for rank, tail in self.tails.items():
            # Most files are idle at a look: a stat says so. A file not read for FULL_READ_S is
            # read whatever the stat says (a read opens it: NFS revalidates what it cached).
            if opened.get(rank, due) > due and not tail.grew():
                continue
            opened[rank] = now
            apply = self.records[rank].apply
            for ev in tail.read():
                progress |= apply(ev)
                # a heartbeat changes what the prover reads only with the recorder's entries
                changes += ev.get("ev") != "heartbeat" or bool(ev.get("fr_active"))
        self.changes += changes
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
        self,
        now: float | None = None,
        *,
        job_ended: dict[str, Any] | None = None,
        stopping: bool = False,
    ) -> list[dict[str, Any]]:
        """Every rank's :func:`snapshot`; once the job ended, a rank that left no end event, or
        that a signal ended, as its whole record says it (its ring's calls too:
        :func:`rankscope.rundir.whole_record`)."""
        records = self.records
        if job_ended is not None:
            records = {
                r: self._whole(r) if ring_may_add(rec) else rec for r, rec in records.items()
            }
        snaps = [
            snapshot(records[r], now, job_ended=job_ended, stopping=stopping)
            for r in sorted(records)
        ]
        for snap in snaps:
            waits = snap.get("waiting")
            if waits is not None and waits["site"] is not None:
                waits["waiting_for"] = self.not_issued(snap["rank"], waits["pg"], waits["seq"])
        return snaps

    def _whole(self, rank: int) -> RankRecord:
        """The rank's whole record once the job ended (read once)."""
        if rank not in self._wholes:
            self._wholes[rank] = whole_record(self.run, rank) or self.records[rank]
        return self._wholes[rank]

    def not_issued(self, rank: int, pg: str | None, seq: int | None) -> list[int] | None:
        """The members of ``rank``'s group ``pg`` that have not called its collective ``seq``
        yet (by the probe's numbering), or None where the members are not known."""
        members = self.records[rank].members.get(pg) if pg is not None else None
        if members is None or seq is None:
            return None
        return [
            r for r in members if r in self.records and self.records[r].issued_seqs.get(pg, 0) < seq
        ]

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
                busy |= share is not None and share >= BUSY_CPU_SHARE
                continue
            # The main thread only: the probe's own threads are not the rank's work. A process
            # it started (a compiler, a loader's worker) that runs is its work too: on a loaded
            # machine that process gets too little CPU for its share to say so.
            if _works(record.pid):
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

    def lingering(self, world_size: int) -> dict[int, RankProc]:
        """Where every rank of the world has ended its script (its end event is written) or
        its process is gone, the ranks whose process still runs on this host: each has
        outlived its end, in its interpreter's exit (a thread it waits for, an exit hook, a
        destructor). Empty while some rank has not ended, or where no process outlived its
        end that this host can see."""
        records = self.records
        if len(records) < world_size or not any(r.ended for r in records.values()):
            return {}
        for record in records.values():
            if not record.ended and (
                record.pid is None
                or RankProc(record.pid, record.node, record.slurm_job).alive() is not False
            ):
                return {}  # still in its script (or where this host cannot see it)
        procs = {
            rank: RankProc(record.pid, record.node, record.slurm_job)
            for rank, record in records.items()
            if record.ended and record.pid is not None
        }
        return {rank: proc for rank, proc in procs.items() if proc.alive()}

    def working(self, procs: dict[int, RankProc]) -> bool:
        """Whether one of these local ranks' main thread, or a process it started, is running
        or runnable now (see :meth:`busy_outside_collectives`)."""
        return any(_works(p.pid) for p in procs.values())

    def states(self) -> dict[int, RankState]:
        """Every rank as the stall prover reads it (:func:`rankscope.waitfor.prove`): its
        collectives in flight, the call its one calling thread is blocked in, what it called
        and sent, and whether it ended cleanly. What the probe did not record (collectives torch
        issues from C++, seen only in the flight recorder) is left out: it proves nothing."""
        return {rank: _state(record) for rank, record in self.records.items()}

    def backend_states(self) -> dict[int, RankState]:
        """Every rank as the flight recorder numbers its collectives (every collective the
        backend ran on a group, those torch issues from C++ included, where :meth:`states`
        numbers the calls made from Python): its uncompleted entries at its last heartbeat that
        read them (op only: the recorder's live read has no shapes), and, for a rank that
        ended cleanly, how many it had issued per group at its end. A rank whose end did not
        say that count is not taken as ended here: its last heartbeat's count may be stale."""
        return {rank: _backend_state(record) for rank, record in self.records.items()}

    def waiting_in_collective(self) -> bool:
        """A live rank is inside a collective."""
        return any(not s.ended and in_collective(s) for s in self.records.values())


def _state(record: RankRecord) -> RankState:
    sent = record.sent if record.p2p_known else None
    common = {
        "rank": record.rank,
        "members": record.members,
        "called": record.collectives,
        "calls": record.recent,
        "sent": sent,
        "cell": record.cell,
        "cell_finished": record.cell_state in ("finished", "raised"),
    }
    if record.ended:
        return RankState(**common, exited=0 if record.exit_code == 0 else None)
    numbered = record.numbered
    # Point-to-point calls are numbered apart: their seq is no collective's.
    pending = [
        (call[1], n)
        for call in record.issued.values()
        if call[0] not in P2P_OPS and (n := numbered.get((call[1], call[2]))) is not None
    ]
    blocked = receiving = None
    if record.in_collective_since is not None:
        n = None if record.op in P2P_OPS else numbered.get((record.pg, record.seq))
        if n is not None:
            pending.append((record.pg, n))
            blocked = None if record.threads else (record.pg, n)
        elif (
            record.op == "recv"
            and record.p2p_known
            and not record.threads
            and not any(call[0] == "irecv" for call in record.issued.values())
        ):
            # Its earlier receives all completed, each with a message of its own: this one
            # needs one more than they took, whatever the tags (an irecv still in flight may
            # be the one a message is for).
            assert record.peer is not None  # a receive from any source is not p2p_known
            receiving = (record.peer, record.received.get(record.peer, 0))
    return RankState(**common, pending=tuple(pending), blocked=blocked, receiving=receiving)


def _backend_state(r: RankRecord) -> RankState:
    entries = [(e[0], e[1], str(e[2])) for e in r.fr_active or () if _entry(e)]
    return RankState(
        rank=r.rank,
        members=r.members,
        called={pg: c[0] for pg, c in (r.fr or {}).items()},
        calls={(pg, seq): (op, None, None, None) for pg, seq, op in entries},
        pending=tuple((pg, seq) for pg, seq, _ in entries),
        exited=0 if r.ended and r.exit_code == 0 and r.fr_final else None,
    )


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


def _works(pid: int) -> bool:
    """The local process's main thread, or a process it started, runs or is runnable now."""
    return _main_thread_runs(pid) or _a_child_runs(pid)


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


def _a_child_runs(pid: int) -> bool:
    """A process the rank started, or one they started, is running or runnable right now."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return False
    return any(_main_thread_runs(child.pid) for child in children)
