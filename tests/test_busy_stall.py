"""A rank that runs Python code outside every collective while the others wait in one: called a
``busy`` stall at the stall timeout, with every rank's evidence and the loop it spins in; a job
set to stop on a stall is stopped only once that becomes ``no_progress`` (``BUSY_LIMIT`` stall
timeouts); a rank that comes after all clears it, and the card says straggler and how long.

Real torchrun jobs of 3 gloo ranks (``tests/scripts/launch/busy_loop.py``)."""

from __future__ import annotations

import re

import pytest

from rankscope.analyze import diagnose
from rankscope.launch.watchdog import BUSY_LIMIT
from rankscope.rundir import RunDir

pytestmark = pytest.mark.slow

STALL_S = 1.5
#: What a loaded 2-core machine may add to a call at the timeout (a look, a heartbeat, a
#: descheduled watchdog): the bound is generous, the order of events is what is checked.
LATE_S = 6.0


def waited_from(run: RunDir, ranks: list[int], seq: int) -> float:
    """When the last of ``ranks`` entered its collective number ``seq`` on the default group."""
    return max(
        ev["t"]
        for r in ranks
        for ev in run.iter_events(r)
        if ev.get("ev") == "enter" and ev.get("seq") == seq
    )


def test_a_rank_spinning_forever_is_called_busy_at_the_timeout_then_stopped(start_job):
    job = start_job(
        "launch/busy_loop.py",
        args=["forever"],
        nproc_per_node=3,
        stall_timeout_s=STALL_S,
        on_stall="stop",
        timeout_s=240,
    )
    job.wait(timeout=300)
    info = job.info()
    stalls = info["stalls"]
    assert [s["kind"] for s in stalls] == ["busy", "no_progress"], stalls
    busy, stuck = stalls
    onset = waited_from(job.run, [0, 1], 4)
    assert STALL_S <= busy["detected_at"] - onset < STALL_S + LATE_S
    assert re.search(
        r"rank 2 busy in `while err > tol:` at busy_loop\.py:\d+ for [\d.]+ s while ranks 0, 1 "
        r"wait in all_reduce #4",
        busy["summary"],
    ), busy["summary"]
    # its evidence: every rank answered, and rank 2's stacks show it in the loop
    assert busy["missing"] == [] and busy["capture_id"] is not None
    stacks = (job.run.capture_dir(busy["capture_id"]) / "rank2.stacks.txt").read_text()
    assert re.search(r'busy_loop\.py", line 2[01]', stacks), stacks
    # not stopped for the busy stall: only once it had lasted the busy limit
    assert stuck["idle_s"] > BUSY_LIMIT * STALL_S
    assert info["stop_reason"] == "stall" and info["stop_requested_at"] >= stuck["detected_at"]
    assert "cleared_at" not in busy and "cleared_at" not in stuck  # the stop's ends clear nothing
    d = diagnose(job.run.path)
    assert (d.cause, d.culprit_ranks, d.waiting_ranks) == ("busy_outside", [2], [0, 1])


def test_a_rank_slow_once_is_called_busy_then_cleared_and_never_stopped(start_job):
    spin = 4 * STALL_S
    job = start_job(
        "launch/busy_loop.py",
        args=[str(spin)],
        nproc_per_node=3,
        stall_timeout_s=STALL_S,
        on_stall="stop",
        timeout_s=240,
    )
    assert job.wait(timeout=300) == 0
    info = job.info()
    assert "stop_reason" not in info
    [busy] = info["stalls"]
    assert busy["kind"] == "busy" and busy["summary"].startswith("rank 2 busy in `while")
    assert busy["cleared_after_s"] > 0 and busy["cleared_at"] > busy["detected_at"]
    d = diagnose(job.run.path)
    assert (d.verdict, d.cause, d.culprit_ranks) == ("ok", "straggler", [2])
    late = float(re.search(r"([\d.]+) s after the others", d.reason).group(1))
    assert late >= spin - 0.5
    assert any("called a busy stall" in n and "the rank came" in n for n in d.notes), d.notes
