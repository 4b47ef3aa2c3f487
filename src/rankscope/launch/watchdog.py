"""The stall watchdog: what counts as a stall (:func:`stall_decision`, a pure function of what
one look at the ranks saw), and the thread that looks at them (every ``POLL_S``, less often
where reading them costs: see ``LOOK_SHARE``) and hands each stall to the job.

The rule, as the README's "What counts as a stall" tells it: no rank has completed a collective
or marked a step for the stall timeout while at least one live rank waits inside a collective,
counted once every rank has started; or some rank has not started after the startup timeout. A
rank outside every collective whose main thread is working keeps the others waiting without
being stuck itself: that is a ``busy`` stall at the timeout (called, its evidence captured,
shown), which progress clears (the rank was a straggler); ``BUSY_LIMIT`` stall timeouts of it
are a ``no_progress`` stall (a rank spinning in a loop it never leaves), the one a job set to
stop on a stall is stopped for. A job whose every rank has ended its script, but where a rank's
process has not exited, idle (neither its main thread nor a process it started runs), for the
stall timeout, never ends on its own: that is an ``exit`` stall (its interpreter waits at exit
for a thread, an exit hook or a destructor that never returns).

Beside the timeout, the prover (:func:`rankscope.waitfor.prove`): at every look that read new
calls while a rank waits (while the ranks make progress, as often as ``PROVE_BUSY_SHARE`` of the
time allows and at least every ``PROVE_BUSY_S``), the ranks' live state is asked whether it
proves that no rank can progress (two calls at one place of a group that are not the same call,
a peer that ended before making the call waited in, a cycle of ranks inside calls that wait for
each other), in
the probe's numbering of the calls made from Python, then in the flight recorder's, which has
the collectives torch issues from C++ (:meth:`RankTracker.backend_states`). When it does, the
stall is ``proven`` at once, with the fact that proves it, whatever the timeout.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from rankscope.launch.tracker import RankTracker
from rankscope.rundir import FINAL_STATES, RunDir, RunDirError
from rankscope.waitfor import Proof, prove

log = logging.getLogger(__name__)

#: A look at the ranks comes every ``POLL_S`` (a few ranks' events cost a tenth of a
#: millisecond to read), and later when the last look's read took more than ``LOOK_SHARE`` of
#: the time since (of one core: its thread's CPU time, whatever the load), but never later than
#: ``LOOK_MAX_S``: at a thousand ranks a look reads what a fifth of a second of the job wrote,
#: and the stall is still decided within a look of what the rule asks.
POLL_S = 0.05
LOOK_SHARE, LOOK_MAX_S = 0.1, 0.25
#: How long a busy rank may keep the others waiting before its ``busy`` stall becomes a
#: ``no_progress`` one (the job is stopped for it where its owner asked), in multiples of the
#: stall timeout.
BUSY_LIMIT = 10.0
#: CPU counters tick coarsely: whether a rank outside the collectives works is looked at this
#: often.
CPU_LOOK_S = 0.5
#: While the ranks make progress the prover takes at most this share of the time (a look costs
#: tens of milliseconds at a thousand ranks, a fraction of one at a few), and looks at least
#: every ``PROVE_BUSY_S``: a rank's progress is no sign that the others are not held (its
#: heartbeat reports collectives completed long before).
PROVE_BUSY_SHARE = 0.005
PROVE_BUSY_S = 1.0
#: Otherwise it waits this many times its last look's duration before the next: at most a fifth
#: of the watchdog's time, so that reading the ranks' events keeps up (nothing, for small jobs).
PROVE_SHARE = 4.0


@dataclass(frozen=True)
class Look:
    """What one look at the job saw; times are monotonic seconds."""

    now: float
    launched_at: float
    """When the watchdog started following the job."""
    ranks_up: int
    """Ranks whose events.jsonl exists."""
    world_size: int
    waiting: bool
    """A live rank is inside a collective."""
    waiting_since: float
    """Since when some live rank has been inside a collective, without a look in between that
    saw none (``now`` when none is)."""
    progressed_at: float
    """The last progress: a collective returned from, a step, a rank coming up."""
    busy_at: float
    """The last time a live rank outside every collective was seen working."""
    lingering_since: float | None = None
    """Since when every rank has ended its script while the process of one lives on, none of
    those seen working since (None: not so)."""


def stall_decision(look: Look, *, stall_timeout_s: float, startup_timeout_s: float) -> str | None:
    """``startup``, ``no_progress``, ``busy`` (the ranks that wait have waited past the timeout
    for a rank that works outside the collectives: it may yet come), ``exit`` (every rank has
    ended its script, and a rank's process has idled past the timeout since: it never exits)
    or None (not a stall) for what one look saw."""
    if look.ranks_up < look.world_size:
        return "startup" if look.now - look.launched_at > startup_timeout_s else None
    if not look.waiting:
        lingering = look.lingering_since
        if lingering is not None and look.now - lingering > stall_timeout_s:
            return "exit"
        return None  # every rank computes, or sleeps outside any collective: not our call
    # The clocks run only while a rank waits: ranks that all work (or all wait on something
    # else, a compiler they started) before one enters a collective have kept no one waiting.
    idle = look.now - max(look.progressed_at, look.waiting_since)
    if idle <= stall_timeout_s:
        return None
    quiet = look.now - max(look.busy_at, look.waiting_since) > stall_timeout_s
    return "no_progress" if quiet or idle > BUSY_LIMIT * stall_timeout_s else "busy"


class Watchdog:
    """Follows a job's ranks until the job ends and calls ``on_stall(kind, idle_s, proven)``
    once per stall (``proven``: the :class:`~rankscope.waitfor.Proof` of a ``proven`` stall,
    else None), and once more where a ``busy`` stall becomes a ``no_progress`` one;
    ``on_clear(stalled_s)`` when progress resumes after one (not after a proven one: what
    proved it cannot change), with how long after it was called."""

    def __init__(
        self,
        run: RunDir,
        tracker: RankTracker,
        *,
        world_size: int,
        stall_timeout_s: float,
        startup_timeout_s: float,
        lock: threading.Lock,
        on_stall: Callable[[str, float, Proof | None], None],
        on_new_ranks: Callable[[], None],
        on_clear: Callable[[float], None],
    ):
        self.run, self.tracker, self.lock = run, tracker, lock
        self.world_size = world_size
        self.stall_timeout_s, self.startup_timeout_s = stall_timeout_s, startup_timeout_s
        self.on_stall, self.on_new_ranks, self.on_clear = on_stall, on_new_ranks, on_clear
        self.closing = threading.Event()
        self.thread = threading.Thread(
            target=self._watch, name=f"rankscope-watchdog-{run.path.name}", daemon=True
        )

    def start(self) -> Watchdog:
        self.thread.start()
        return self

    def _watch(self) -> None:
        run, tracker = self.run, self.tracker
        launched = busy_at = waiting_since = time.monotonic()
        lingering_since: float | None = None
        next_cpu_look = 0.0
        stalled_at: float | None = None
        stalled_kind: str | None = None
        for_good = False  # the stall was proven: it stays one
        known: set[int] = set()
        proved_upto = -1  # the tracker's changes at the prover's last look
        next_proof = next_quiet = 0.0  # the prover's next look while the ranks progress, or not
        while not self.closing.is_set():
            try:
                state = run.read_run()["state"]
            except RunDirError:
                time.sleep(POLL_S)
                continue
            if state in FINAL_STATES:
                break
            if state in ("starting", "queued"):
                # The startup timeout counts from when the job runs, not from its submission.
                launched = busy_at = time.monotonic()
            with self.lock:
                read_from = time.thread_time()
                progress = tracker.update()
                read_cpu = time.thread_time() - read_from
                new = set(tracker.records) - known
                waiting = tracker.waiting_in_collective()
                lingering = {} if waiting else tracker.lingering(self.world_size)
                proven = None
                if (
                    waiting
                    and stalled_at is None
                    and state in ("running", "stalled")
                    and tracker.changes != proved_upto
                    and time.monotonic() >= (next_proof if progress else next_quiet)
                ):
                    began = time.monotonic()
                    proved_upto = tracker.changes
                    proven = prove(tracker.states())
                    if proven is None and (recorded := prove(tracker.backend_states())):
                        proven = recorded.by_recorder()
                    took = time.monotonic() - began
                    next_proof = began + max(
                        min(PROVE_BUSY_S, took / PROVE_BUSY_SHARE), PROVE_SHARE * took
                    )
                    next_quiet = began + (1 + PROVE_SHARE) * took
            now = time.monotonic()
            if new:
                known |= new
                self.on_new_ranks()
                # A rank coming up is progress (its start event may not be written yet): on a
                # loaded machine the last rank may start after the stall timeout.
                tracker.progressed_at = busy_at = now
            # A proven stall stays one: what proved it cannot change, whatever the ranks still
            # do (async calls issued after the proof return at once, a step is marked).
            if stalled_at is not None and not for_good and tracker.progressed_at > stalled_at:
                log.info("%s: progress again after the stall", run.path.name)
                self.on_clear(tracker.progressed_at - stalled_at)
                stalled_at = stalled_kind = None
            # A busy stall is looked at on: it clears, or stays busy, or becomes no_progress.
            open_ = stalled_at is None or stalled_kind == "busy"
            if not waiting:
                waiting_since = now
            if waiting and open_ and now >= next_cpu_look:
                next_cpu_look = now + CPU_LOOK_S
                if tracker.busy_outside_collectives():
                    busy_at = now
            if not lingering:
                lingering_since = None
            elif lingering_since is None or now >= next_cpu_look:
                # a rank working in its exit (saving, uploading) is not stuck there
                next_cpu_look = now + CPU_LOOK_S
                if lingering_since is None or tracker.working(lingering):
                    lingering_since = now
            look = Look(
                now=now,
                launched_at=launched,
                ranks_up=len(tracker.records),
                world_size=self.world_size,
                waiting=waiting,
                waiting_since=waiting_since,
                progressed_at=tracker.progressed_at,
                busy_at=busy_at,
                lingering_since=lingering_since,
            )
            kind = "proven" if proven else None
            if kind is None and open_ and state in ("running", "stalled"):
                kind = stall_decision(
                    look,
                    stall_timeout_s=self.stall_timeout_s,
                    startup_timeout_s=self.startup_timeout_s,
                )
                if kind == stalled_kind:
                    kind = None  # called already
            if kind is not None:
                idle = now - tracker.progressed_at
                log.warning(
                    "%s: stall (%s) after %.1f s without progress%s",
                    run.path.name,
                    kind,
                    idle,
                    f"; proven: {proven}" if proven else "",
                )
                if stalled_at is None:  # a busy stall that became no_progress keeps its start
                    stalled_at = now
                stalled_kind, for_good = kind, kind == "proven"
                self.on_stall(kind, idle, proven)
            time.sleep(min(LOOK_MAX_S, max(POLL_S, read_cpu / LOOK_SHARE)))
