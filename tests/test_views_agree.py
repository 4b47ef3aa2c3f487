"""Every view of a job states the same facts for each rank (issue 44): how it ended (in one
word and in words, with its number), how many collectives it completed and the last one, and
the state of its last call (issued, completed, failed; rankscope.state.call_state) in the live
panel, the calls table, the sequence ladder, the timeline and the card. Real gloo jobs under
torchrun, ending every way: clean, an abort, a SIGKILL, a stall then Stop, a proven hang then
Stop."""

from __future__ import annotations

import contextlib
import io
import time

import pandas as pd
import pytest

from rankscope import cli, plot
from rankscope.analyze import diagnose
from rankscope.analyze.evidence import Evidence
from rankscope.collect import load_run
from rankscope.launch import Job
from rankscope.launch.job import state_text
from rankscope.launch.tracker import doing_now
from rankscope.plot._common import as_calls
from rankscope.plot.ladder import ladder_table
from rankscope.plot.timeline import STATE_WORDS
from rankscope.rundir import MANAGEMENT_OPS
from rankscope.state import CALL_STATES, STEP_LABEL, state_words
from rankscope.widgets.live import ranks_html

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
        said = tuple(None if pd.isna(v) else v for v in (row.status, row.end, row.exit_code))
        assert (snap["status"], snap["end"], snap["exit_code"]) == said, (rank, snap, said)
        # the card's words for a rank that did not end cleanly
        if snap["exit_code"] not in (0, None):
            assert facts[rank].died == snap["end"], rank
        # the CLI's status line of the rank, and the notebook's table
        line = next(s for s in status if s.startswith(f"  rank {rank:>3}"))
        assert f" {snap['status']} " in line and snap["end"] in line, line
        # the step: the last one it marked (rankscope.state.STEP_LABEL), the same number in
        # the CLI, the live panel, the notebook's table and the progress plot
        # (a rank that dies by a signal before its thread writes its last events still has
        # its calls and its last step in its ring)
        step = snap["step"]
        assert step == 2, snap
        assert f"done {snap['done']:>5}  {STEP_LABEL} {step or '-':>5}" in line, line
        assert f"<td>{snap['end']}</td>" in html
        # counts: done beside the last completed call, on the one group these jobs use
        if snap["last_done"] is not None:
            assert snap["last_done"].endswith(f"#{snap['done']})"), snap
    assert "running" not in state_text(job.info(), list(snaps.values()))
    assert f"<th>{STEP_LABEL}</th>" in html and "<th>last completed</th>" in html
    progress = plot.progress(run.events, collectives=run.collectives)
    assert [a.text for a in progress.layout.annotations][:2] == [
        "collectives completed",
        STEP_LABEL,
    ]
    for rank, snap in snaps.items():
        for axis, number in (("y", snap["done"]), ("y2", snap["step"])):
            line = [t for t in progress.data if t.yaxis == axis and t.name == f"rank {rank}"]
            drawn = [y for y in line[0].y if y == y][-1] if line else None
            assert drawn == number, (rank, axis, line)
    _last_calls_agree(job, snaps)
    return snaps


def _last_calls_agree(job: Job, snaps: dict[int, dict]) -> dict[int, str]:
    """Each rank's last collective and its state, as the calls table, the live record, the
    live panel, the ladder, the timeline and the card state it: the same everywhere."""
    run = load_run(job.run.path)
    calls = as_calls(run.collectives)
    last = calls.sort_values("order").groupby("rank").tail(1).set_index("rank")
    ladder = ladder_table(run.collectives).set_index(["pg", "rank"])
    timeline = plot.rank_timeline(run.collectives)
    hovers = [t for trace in timeline.data if trace.name == "calls" for t in trace.hovertext]
    card = diagnose(run)
    panel = ranks_html(list(snaps.values()))
    assert f">{STEP_LABEL}<" in panel
    parted = card.first_divergence
    if parted and parted.get("step") is not None:  # the culprits' step, as every view says it
        assert {snaps[r]["step"] for r in parted["culprits"]} == {parted["step"]}, parted
        assert f"last step marked: {parted['step']}" in card.render()
    states = {}
    for rank, call in last.iterrows():
        op, pg, seq, state = str(call["op"]), str(call["pg"]), int(call["seq"]), call["state"]
        assert state in CALL_STATES, state
        states[rank] = state
        # the live record (its latest call, where it is this collective, not a group's teardown)
        snap = snaps[rank]
        if snap["op"] not in MANAGEMENT_OPS:
            assert (snap["op"], snap["pg"], snap["seq"], snap["last_state"]) == (
                op,
                pg,
                seq,
                state,
            ), (rank, snap, call)
            now = doing_now(snap)
            if state != "completed":  # the panel says the call and its state
                assert now == f"ended in {op} (group {pg} #{seq}) {state_words(state, ended='')}"
                assert now in panel, now
        # the ladder: the last call entered on its group, its state, and no completion of it
        row = ladder.loc[(pg, rank)]
        assert (int(row["entered"]), row["state"]) == (seq, state), (rank, row)
        assert (int(row["completed"]) == seq) == (state == "completed"), (rank, row)
        # the timeline's hover of that call
        hover = [
            h for h in hovers if h.startswith(f"rank {rank}<br><b>{op}</b> on group {pg} #{seq}<")
        ]
        assert len(hover) == 1 and STATE_WORDS[state] in hover[0], (rank, hover)
        # the card, where the collective it names is this call
        coll = card.collective
        if coll is not None and str(coll.pg) == pg and coll.seq == seq:
            said = coll.state_by_rank[rank]
            assert said.split(",")[0].split(":")[0] == state, (rank, said)
    return states


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
    # #4 completed nowhere: the rank that raised failed it, the others ended in it
    assert {s["last_state"] for s in snaps.values()} <= {"failed", "issued"}, snaps
    assert "issued" in {s["last_state"] for s in snaps.values()}


@pytest.mark.slow
def test_a_sigkill(start_job):
    snaps = _views(_ended(start_job, "sigkill", stop=False))
    assert snaps[1]["status"] == "killed" and snaps[1]["end"].startswith("killed: SIGKILL (-9)")
    assert snaps[1]["done"] == 4  # from its ring: the loop's three, and the barrier
    assert {snaps[0]["status"], snaps[2]["status"]} <= {"failed", "ended"}


@pytest.mark.slow
@pytest.mark.parametrize("how", ["stall", "hang"])
def test_a_stalled_or_proven_hang_then_stop(start_job, how):
    snaps = _views(_ended(start_job, how, stop=True))
    assert {r["status"] for r in snaps.values()} == {"stopped"}, snaps
    assert all(r["end"].startswith("stopped: SIG") for r in snaps.values())
