"""The probe's daemon thread: how often it wakes, and what a blocked call leaves in the file.

In this process and without a process group: the Probe's thread runs, nothing in
torch.distributed is patched, and its calls go to a stand-in with all_reduce's signature.
"""

from __future__ import annotations

import json
import threading
import time

import torch

from rankscope.probe import _core
from rankscope.rundir import RunDir

from .conftest import close_probes


class CountingStop(threading.Event):
    """The thread's stop event, noting when the thread went to sleep and for how long."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[tuple[float, float]] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append((time.monotonic(), timeout if timeout is not None else -1.0))
        return super().wait(timeout)


def test_the_thread_wakes_at_heartbeats_while_calls_complete_and_looks_between_otherwise(
    tmp_path,
):
    probe = _core.Probe(RunDir(tmp_path / "run"), rank=0)
    stop = probe._stop = CountingStop()
    gate = threading.Event()

    def all_reduce(tensor, op=None, group=None, async_op=False):
        if tensor.numel() == 2:  # the call that blocks, as a rank waiting on a lost peer
            gate.wait(30)

    reduce = probe._wrap("all_reduce", all_reduce, None)
    blocked = threading.Thread(target=reduce, args=(torch.ones(2),))
    t = torch.ones(1)
    probe._thread.start()
    try:
        busy_from = time.monotonic() + _core.HEARTBEAT_S  # its first sleep may be a look's
        busy_until = busy_from + 3 * _core.HEARTBEAT_S
        while time.monotonic() < busy_until:
            reduce(t)
            time.sleep(0.001)
        blocked.start()
        blocked_at = time.monotonic()
        deadline = blocked_at + _core.HEARTBEAT_S + 1.5
        seen_at = None
        events = probe.run.events(0)
        while seen_at is None and time.monotonic() < deadline:
            for e in probe.run.iter_events(0):
                if e["ev"] == "enter" and e["shapes"] == [[2]]:
                    seen_at = time.monotonic()
            time.sleep(0.02)
        time.sleep(_core.HEARTBEAT_S + 3 * _core.POLL_S)
        lines = [json.loads(ln) for ln in events.read_text().splitlines()]
    finally:
        released = time.monotonic()  # from here the call completes: the thread sleeps longer
        gate.set()
        stop.set()
        probe._thread.join(timeout=5)
        blocked.join(timeout=5)
        close_probes(probe)

    assert seen_at is not None, "the blocked call's enter line was never written"
    # written at the next heartbeat's flush (+ slack for a loaded machine)
    assert seen_at - blocked_at <= _core.HEARTBEAT_S + 0.5
    busy = [s for at, s in stop.waits if busy_from <= at < busy_until]
    # while calls complete, it sleeps until its next heartbeat: no looks in between
    assert busy and all(s > _core.POLL_S for s in busy[1:]), busy
    assert len(busy) <= 3 + 2, busy  # three heartbeats' worth, and slack for a late wake
    waiting = [s for at, s in stop.waits if seen_at <= at < released]
    # a rank that completes nothing is looked at every POLL_S: a capture request is served
    assert len(waiting) >= 2 and all(s == _core.POLL_S for s in waiting[1:]), waiting
    beats = [e for e in lines if e["ev"] == "heartbeat"]
    assert len(beats) >= 4 and beats[-1]["coll"] is not None  # the blocked call, in flight
