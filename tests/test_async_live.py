"""Collectives the backend completes after the Python call returns, in real gloo jobs: async
all_reduces waited on later (``work.wait()``) and DDP's bucket all_reduces issued from C++. A
rank blocked on one that never completes is waiting in it: the stall is called within the
stall timeout, ``rankscope status`` says where it was issued and where the rank waits, and the
diagnosis names the rank the others wait for."""

from __future__ import annotations

import re
import time

import pytest

from rankscope.analyze import diagnose
from rankscope.cli import main
from rankscope.collect import load_run

from .conftest import site_of

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

STALL_S = 2.0
HANG = {"stall_timeout_s": STALL_S, "on_stall": "keep", "collective_timeout_s": 30.0}


def stalled(job, capsys, *, until: str | None = None) -> str:
    """Wait for the stall; return what ``rankscope status`` prints then (or, given ``until``,
    once every waiting rank's line says it, within a few heartbeats), and stop the job."""
    deadline = time.monotonic() + 90
    while job.status() != "stalled":
        assert time.monotonic() < deadline, f"no stall: {job.status()}"
        time.sleep(0.1)
    settle = time.monotonic() + 5.0
    while True:
        capsys.readouterr()
        assert main(["status", str(job.run.path)]) == 0
        out = capsys.readouterr().out
        if until is None or out.count(until) >= 2 or time.monotonic() > settle:
            break
        time.sleep(0.2)
    (stall,) = job.info()["stalls"]
    # called within the stall timeout (and the watchdog's look, and a loaded box's second)
    assert stall["idle_s"] < STALL_S + 1.5, stall
    job.stop(grace_s=5.0)
    return out


def rank_line(out: str, rank: int) -> str:
    return next(line for line in out.splitlines() if re.match(rf"\s+rank\s+{rank}\s", line))


def test_ranks_blocked_in_work_wait_wait_in_the_all_reduce_they_issued(start_job, capsys):
    """Three ranks wait in ``work.wait()`` for bucketed async all_reduces (#10-#12) that never
    complete, because rank 1 went to a barrier first."""
    job = start_job("analyze/async_wait.py", args=("barrier",), nproc_per_node=4, **HANG)
    out = stalled(job, capsys)
    issued, waited = (
        site_of("analyze/async_wait.py", "issue"),
        site_of("analyze/async_wait.py", "wait"),
    )
    for rank in (0, 2, 3):
        line = rank_line(out, rank)
        assert f"waiting in all_reduce (group 0 #10) issued at {issued}" in line, out
        assert f"not completed, waited at {waited}" in line, out
        assert "last completed all_reduce (group 0 #9)" in line, out
    barrier = site_of("analyze/async_wait.py", "barrier")
    assert f"waiting in barrier (group 0 #10) at {barrier}" in rank_line(out, 1), out
    d = diagnose(load_run(job.run.path))
    assert (d.verdict, d.culprit_ranks, d.waiting_ranks) == ("hang", [1], [0, 2, 3]), d.render()
    assert d.cause == "rank_conditional_collective", d.render()  # not out of data: it is there
    assert d.parting["source"].startswith("if step == 3"), d.render()
    assert (d.collective.pg, d.collective.seq) == ("0", 10), d.render()
    assert d.collective.site_by_rank[0] == issued and d.collective.site_by_rank[1] == barrier
    calls = d.calls[(d.calls["rank"] == 0) & (d.calls["seq"] >= 10)]
    assert calls["completed"].tolist() == [False, False, False], "issued, never completed"


def test_a_rank_blocked_on_a_lock_after_issuing_is_the_culprit(start_job, capsys):
    """The last rank issues its async all_reduces (they complete: every rank issued them), then
    blocks on a lock; the others wait in the next step's."""
    job = start_job("analyze/async_wait.py", args=("lock",), nproc_per_node=3, **HANG)
    out = stalled(job, capsys)
    issued = site_of("analyze/async_wait.py", "issue")
    for rank in (0, 1):
        assert f"waiting in all_reduce (group 0 #13) issued at {issued}" in rank_line(out, rank)
    lock = site_of("analyze/async_wait.py", "lock")
    assert "running  done" in rank_line(out, 2) and f"at {lock}" in rank_line(out, 2), out
    d = diagnose(load_run(job.run.path))
    assert (d.verdict, d.culprit_ranks, d.waiting_ranks) == ("hang", [2], [0, 1]), d.render()
    assert d.cause == "stuck_outside", d.render()
    assert "lock" in d.render()


def test_ddp_s_bucket_all_reduce_from_cpp_is_a_wait(start_job, capsys):
    """The last rank skipped a backward, so DDP's reducer made one gradient all_reduce fewer
    there; the others wait in their backward for theirs, which no Python call made."""
    job = start_job("analyze/ddp_skip_backward.py", args=("barrier",), nproc_per_node=3, **HANG)
    # Proven as soon as one waiting rank's recorder entries are read; a rank whose entries are
    # not read yet is "waiting in a collective (group 0 #8, issued by torch)" until they are.
    out = stalled(job, capsys, until="waiting in all_reduce (group 0 #8, issued by torch)")
    backward = site_of("analyze/ddp_skip_backward.py", "backward")
    for rank in (0, 1):
        line = rank_line(out, rank)
        assert "waiting in all_reduce (group 0 #8, issued by torch)" in line, out
        assert f"waited at {backward}" in line, out
    d = diagnose(load_run(job.run.path))
    assert (d.verdict, d.culprit_ranks, d.waiting_ranks) == ("hang", [2], [0, 1]), d.render()
    assert (d.collective.pg, d.collective.seq) == ("0", 8), d.render()


def test_ddp_rank_that_skipped_a_backward_and_exited_is_the_culprit(start_job):
    """The same skip, and the rank then leaves cleanly: the others' bucket all_reduce fails
    with gloo's 'Connection closed by peer' (a victim's text), raised in their backward. gloo's
    recorder retires that failed entry as if it had completed; the rank that left is named."""
    job = start_job("analyze/ddp_skip_backward.py", args=("exit",), nproc_per_node=3, **HANG)
    job.wait(timeout=90)
    d = diagnose(load_run(job.run.path))
    assert (d.verdict, d.cause, d.culprit_ranks) == ("hang", "early_exit", [2]), d.render()
    assert d.waiting_ranks == [0, 1], d.render()
    assert (d.collective.pg, d.collective.seq) == ("0", 8), d.render()
