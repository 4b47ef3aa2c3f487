"""The stall rule on synthetic looks: every case the README's "What counts as a stall" names."""

from __future__ import annotations

import pytest

from rankscope.launch.watchdog import BUSY_LIMIT, Look, stall_decision

STALL, STARTUP = 3.0, 60.0


def look(**kw) -> Look:
    base = dict(
        now=100.0,
        launched_at=0.0,
        ranks_up=4,
        world_size=4,
        waiting=True,
        waiting_since=0.0,
        progressed_at=100.0,
        busy_at=0.0,
    )
    return Look(**{**base, **kw})


def decide(lk: Look) -> str | None:
    return stall_decision(lk, stall_timeout_s=STALL, startup_timeout_s=STARTUP)


def test_no_progress_while_a_rank_waits_in_a_collective_is_a_stall():
    assert decide(look(progressed_at=100.0 - STALL - 0.1)) == "no_progress"


def test_progress_within_the_stall_timeout_is_no_stall():
    assert decide(look(progressed_at=100.0 - STALL + 0.1)) is None
    assert decide(look(progressed_at=100.0 - STALL)) is None  # exactly the timeout: not yet


def test_no_rank_in_a_collective_is_no_stall_however_long():
    # every rank computes, loads or sleeps outside the collectives: nothing waits for anyone
    assert decide(look(waiting=False, progressed_at=0.0)) is None


def test_the_timeout_counts_only_while_a_rank_waits():
    # Both ranks waited on a compiler one of them started (no progress, no CPU on their main
    # threads) for far longer than the timeout; then one entered a collective.
    quiet = dict(progressed_at=0.0, busy_at=0.0)
    assert decide(look(waiting_since=100.0 - 0.2, **quiet)) is None
    assert decide(look(waiting_since=100.0 - STALL + 0.1, **quiet)) is None
    assert decide(look(waiting_since=100.0 - STALL - 0.1, **quiet)) == "no_progress"


@pytest.mark.parametrize("idle", [STALL + 0.1, 5 * STALL, BUSY_LIMIT * STALL])
def test_a_working_rank_outside_the_collectives_is_a_busy_stall_at_the_timeout(idle):
    # the others wait for it in a collective, but it was seen working a moment ago: it keeps
    # them waiting (called) and may yet come (not no_progress, which a job may be stopped for)
    assert decide(look(progressed_at=100.0 - idle, busy_at=99.5)) == "busy"


def test_a_working_rank_within_the_timeout_is_no_stall():
    assert decide(look(progressed_at=100.0 - STALL + 0.1, busy_at=99.5)) is None


def test_a_busy_rank_that_never_comes_is_no_progress_after_the_busy_limit():
    idle = BUSY_LIMIT * STALL + 0.1
    assert decide(look(progressed_at=100.0 - idle, busy_at=99.5)) == "no_progress"


def test_a_busy_rank_that_stops_working_is_no_progress_after_the_timeout():
    # it spun, then went to sleep outside the collectives: nothing works for the others
    lk = look(progressed_at=100.0 - 2 * STALL, busy_at=100.0 - STALL - 0.1)
    assert decide(lk) == "no_progress"


def test_a_rank_that_sleeps_or_waits_on_a_lock_is_a_stall_after_the_timeout():
    # not working (its last sign of work is older than the stall timeout) while others wait
    lk = look(progressed_at=100.0 - STALL - 0.1, busy_at=100.0 - STALL - 0.1)
    assert decide(lk) == "no_progress"


def test_the_stall_timeout_counts_once_every_rank_has_started():
    lk = look(ranks_up=3, progressed_at=0.0, now=STARTUP - 1)
    assert decide(lk) is None


def test_a_rank_not_started_after_the_startup_timeout_is_a_startup_stall():
    assert decide(look(ranks_up=3, now=STARTUP + 0.1, progressed_at=STARTUP)) == "startup"
    assert decide(look(ranks_up=0, now=STARTUP + 0.1, waiting=False)) == "startup"


def test_a_process_that_outlives_its_script_idle_past_the_timeout_is_an_exit_stall():
    # every rank ended its script; one process has not exited, and was not seen working
    ended = dict(waiting=False, progressed_at=0.0)
    assert decide(look(lingering_since=100.0 - STALL - 0.1, **ended)) == "exit"
    assert decide(look(lingering_since=100.0 - STALL + 0.1, **ended)) is None  # not yet
    assert decide(look(lingering_since=None, **ended)) is None  # every process exited
    # a rank still waiting in a collective is the other rules' to call, not an exit
    waiting = look(lingering_since=0.0, progressed_at=100.0 - STALL - 0.1)
    assert decide(waiting) == "no_progress"
