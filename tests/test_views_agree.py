"""Every view of a job states the same facts for each rank (issue 44): how it ended (in one
word and in words, with its number), how many collectives it completed and the last one. Real
gloo jobs under torchrun, ending every way: clean, an abort, a SIGKILL, a stall then Stop, a
proven hang then Stop."""

from __future__ import annotations

import contextlib
import io
import time

import pytest

from rankscope import cli
from rankscope.analyze.evidence import Evidence
from rankscope.collect import load_run
from rankscope.launch import Job
from rankscope.launch.job import state_text

SCRIPT = "views/ends.py"
SPEC = {"stall_timeout_s": 4.0, "on_stall": "keep", "collective_timeout_s": 60.0}


def _ended(start_job, how: str, *, stop: bool) -> Job:
    job = start_job(SCRIPT, args=(how,), nproc_per_node=3, **SPEC)
    if stop:
        deadline = time.monotonic() + 120
        while not job.stalls and time.monotonic() < deadline:  # stop it once seen stuck
            assert job.poll() is None, f"{how}: the job ended before it stalled"
            time.sleep(0.5)
        assert job.stalls, f"{how}: no stall caught"
        job.stop(grace_s=2.0)
    assert job.wait(timeout=120) is not None, "the job did not end"
    return Job.attach(job.run.path)


def _views(job: Job) -> dict[int, dict[str, str]]:
    """Each rank as every view states it, checked against the others."""
    snaps = {r["rank"]: r for r in job.ranks()}
    run = load_run(job.run.path)
    table = {int(row.rank): row for row in run.ranks.itertuples(index=False)}
    facts = Evidence(run).ranks
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["status", str(job.run.path)]) == 0
    status = out.getvalue().splitlines()
    html = job._repr_html_()
    assert set(snaps) == set(table), "the live view and the ranks table know other ranks"
    for rank, snap in snaps.items():
        row = table[rank]
        # live (Job.ranks, the live panel's rows) and the loaded run's ranks table
        assert (snap["status"], snap["end"], snap["exit_code"]) == (
            row.status,
            row.end,
            row.exit_code,
        ), rank
        # the card's words for a rank that did not end cleanly
        if snap["exit_code"] not in (0, None):
            assert facts[rank].died == snap["end"], rank
        # the CLI's status line of the rank, and the notebook's table
        line = next(s for s in status if s.startswith(f"  rank {rank:>3}"))
        assert f" {snap['status']} " in line and snap["end"] in line, line
        assert f"<td>{snap['end']}</td>" in html
        # counts: done beside the last completed call, on the one group these jobs use
        if snap["last_done"] is not None:
            assert snap["last_done"].endswith(f"#{snap['done']})"), snap
    assert "running" not in state_text(job.info(), list(snaps.values()))
    return snaps


@pytest.mark.slow
def test_a_clean_job(start_job):
    snaps = _views(_ended(start_job, "clean", stop=False))
    assert {r["status"] for r in snaps.values()} == {"exited"}
    assert {r["end"] for r in snaps.values()} == {"exited 0"}
    assert {r["done"] for r in snaps.values()} == {4}  # 3 all_reduce and the barrier


@pytest.mark.slow
def test_an_abort_reads_the_same_everywhere(start_job):
    snaps = _views(_ended(start_job, "abort", stop=False))
    ends = {r: s["status"] for r, s in snaps.items()}
    # gloo aborts one rank (SIGABRT); the others fail or are ended by torchrun's SIGTERM
    assert "aborted" in ends.values(), ends
    assert set(ends.values()) <= {"aborted", "failed", "ended"}, ends
    aborted = next(s for s in snaps.values() if s["status"] == "aborted")
    assert aborted["end"] == "aborted itself: SIGABRT (-6)"
    # the call that broke completed nowhere: 3 done, #3 last, the aborted rank's (from its
    # ring: it wrote no end) as the others'
    assert {(s["done"], s["last_done"]) for s in snaps.values()} == {(3, "all_reduce (group 0 #3)")}


@pytest.mark.slow
def test_a_sigkill(start_job):
    snaps = _views(_ended(start_job, "sigkill", stop=False))
    assert snaps[1]["status"] == "killed" and snaps[1]["end"].startswith("killed: SIGKILL (-9)")
    assert snaps[1]["done"] == 3  # from its ring
    assert {snaps[0]["status"], snaps[2]["status"]} <= {"failed", "ended"}


@pytest.mark.slow
@pytest.mark.parametrize("how", ["stall", "hang"])
def test_a_stalled_or_proven_hang_then_stop(start_job, how):
    snaps = _views(_ended(start_job, how, stop=True))
    assert {r["status"] for r in snaps.values()} == {"stopped"}, snaps
    assert all(r["end"].startswith("stopped: SIG") for r in snaps.values())
