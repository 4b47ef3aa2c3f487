"""Ranks that die fast, in real gloo jobs under torchrun: what the run directory keeps of each
rank, and what the diagnosis says. rankscope's own watchdog is kept out of the way (a long stall
timeout, no stop), so what happens is torchrun's: it sees a rank die and ends the others with
SIGTERM within a second."""

from __future__ import annotations

import pytest

from rankscope.analyze import diagnose
from rankscope.collect import load_run

from .conftest import site_of

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

SCRIPT = "analyze/die.py"
SPEC = {"stall_timeout_s": 30.0, "on_stall": "keep", "collective_timeout_s": 30.0}


def site(tag: str) -> str:
    return site_of(SCRIPT, tag)


def run_job(start_job, how: str, ranks: int):
    job = start_job(SCRIPT, args=(how,), nproc_per_node=ranks, **SPEC)
    assert job.wait(timeout=90) is not None, "the job did not end"
    assert not job.info().get("stop_reason"), "torchrun, not rankscope, was to end this job"
    return load_run(job.run.path)


def exit_codes(run) -> dict[int, int]:
    return dict(zip(run.ranks["rank"].tolist(), run.ranks["exit_code"].tolist(), strict=True))


def in_flight(run, rank: int):
    calls = run.collectives
    return calls[(calls["rank"] == rank) & ~calls["completed"].fillna(False).astype(bool)]


def captured(run, ranks: list[int], reasons: tuple[str, ...] = ("SIGTERM",)) -> None:
    """Each of these ranks wrote its stacks and flight recorder on its way out: torchrun's
    SIGTERM (or, for a rank that saw its peer's connection close first, its own exception)."""
    stacks = run.stack_summary
    for rank in ranks:
        mine = stacks[(stacks["rank"] == rank) & stacks["reason"].isin(reasons)]
        assert len(mine), f"rank {rank} left no stacks taken at {reasons}"
        ends = run.events[(run.events["rank"] == rank) & (run.events["ev"] == "end")]
        assert ends["message"].tolist()[-1:] in [[r] for r in reasons], ends
    assert set(ranks) <= set(run.pg_status["rank"].dropna().astype(int).tolist())


@pytest.mark.parametrize("how", ["kill_blocked", "kill_at_entry"])
def test_a_rank_killed_in_a_collective(start_job, how):
    """SIGKILL half a second into a call, or as soon as the call is in flight: either way the
    call is in the rank's record, the rank is named, and the others were only torn down."""
    run = run_job(start_job, how, 3)
    assert exit_codes(run) == {0: -15, 1: -15, 2: -9}
    flying = in_flight(run, 2)
    assert flying[["op", "pg", "seq", "site"]].values.tolist() == [
        ["all_reduce", "0", 3, site("killed")]
    ]
    if how == "kill_at_entry":
        # Killed long before the probe's thread could write it: the ring kept it.
        cid = int(flying["coll_id"].iloc[0])
        text = run.path.joinpath("ranks", "2", "events.jsonl").read_text()
        assert f'"id":{cid},' not in text
    d = diagnose(run)
    assert (d.verdict, d.cause, d.recipe, d.culprit_ranks) == ("crash", "rank_killed", "D20", [2])
    assert "SIGKILL" in d.summary and "?" not in d.render()
    c = d.collective
    assert c is not None and (c.pg, c.seq) == ("0", 3), d.render()
    assert c.site_by_rank[2] == site("killed")
    for rank in (0, 1):  # their record is whole: known not to have made the call
        assert c.state_by_rank[rank].startswith("never called it"), c.state_by_rank
        assert c.site_by_rank[rank] == site("long step"), c.site_by_rank
    assert any("rank 2" in m and "SIGKILL" in m for m in d.missing), d.missing
    captured(run, [0, 1])


def test_a_rank_aborted_by_a_peers_mismatch_is_not_the_culprit(start_job):
    """gloo's thread aborts the rank that receives more bytes than its call expects; the rank
    that passed the longer tensor is the culprit, at the call where the ranks parted."""
    run = run_job(start_job, "abort", 4)
    codes = exit_codes(run)
    aborted = [r for r, c in codes.items() if c == -6]
    assert aborted and 1 not in aborted, codes
    calls = run.collectives
    third = calls[(calls["op"] == "all_gather_into_tensor") & (calls["seq"] == 3)]
    assert sorted(third["rank"].tolist()) == [0, 1, 2, 3], "every rank's call #3 is recorded"
    d = diagnose(run)
    assert (d.verdict, d.cause, d.culprit_ranks) == ("hang", "shape_mismatch", [1]), d.render()
    assert (d.collective.pg, d.collective.seq) == ("0", 3)
    assert d.collective.site_by_rank[1] == site("all_gather")
    assert d.collective.shapes_by_rank[1] == "[[20], [5]]"
    for rank in aborted:
        note = next(n for n in d.notes if n.startswith(f"rank {rank} "))
        assert "SIGABRT" in note and "doesn't match expected size" in note, note
    assert "?" not in d.render()


def test_a_segfault_leaves_stacks_and_is_named(start_job):
    run = run_job(start_job, "segfault", 3)
    assert exit_codes(run)[1] == -11
    fatal = run.stack_summary[
        (run.stack_summary["rank"] == 1) & (run.stack_summary["reason"] == "SIGSEGV")
    ]
    assert fatal["site"].tolist() == [site("segfault")]
    d = diagnose(run)
    assert (d.verdict, d.cause, d.culprit_ranks) == ("crash", "rank_crashed", [1]), d.render()
    assert "SIGSEGV" in d.reason and site("segfault") in d.reason, d.reason
    assert (d.collective.pg, d.collective.seq) == ("0", 3)
    assert d.waiting_ranks == [0, 2]
    calls = run.collectives
    for rank in (0, 2):  # in flight, or failed when gloo saw rank 1's connection close
        third = calls[(calls["rank"] == rank) & (calls["seq"] == 3) & (calls["op"] == "all_reduce")]
        assert not third["ok"].fillna(False).any(), f"rank {rank}'s call #3 never returned"
    captured(run, [0, 2], reasons=("SIGTERM", "exception"))


def test_sigterm_teardown_captures_ranks_blocked_in_cpp(start_job):
    """Rank 3 raises; torchrun ends the others with SIGTERM while ranks 0 and 1 are inside
    gloo's all_reduce (C++, where no Python signal handler runs): each still writes its stacks
    and flight recorder, then dies of the SIGTERM as it would have."""
    run = run_job(start_job, "teardown", 4)
    assert exit_codes(run) == {0: -15, 1: -15, 2: -15, 3: 1}
    captured(run, [0, 1, 2])
    stacks = run.stacks
    for rank in (0, 1):
        taken = stacks[(stacks["rank"] == rank) & (stacks["reason"] == "SIGTERM")]
        mine = taken[taken["file"].str.endswith("die.py")]
        assert mine["line"].tolist() == [int(site("blocked").split(":")[1])], taken
        # the dump's last entry is the call it was in: open, unless rank 2 ended before this
        # rank wrote its dump (torchrun signals them all at once), which fails the call on gloo
        # and retires its entry
        fr = run.flight_recorder
        last = fr[fr["rank"] == rank].sort_values("record_id").iloc[-1]
        assert (last["op"], last["pg_id"]) == ("all_reduce", 1), "the dump shows the call"
        ends = run.ranks.set_index("rank")["ended_s"]
        assert not last["retired"] or ends[2] < ends[rank], (last, ends)
    summary = run.stack_summary
    slow = summary[(summary["rank"] == 2) & (summary["reason"] == "SIGTERM")]
    assert slow["site"].tolist() == [site("slow")]
    d = diagnose(run)
    assert (d.verdict, d.cause, d.culprit_ranks) == ("crash", "rank_crashed", [3]), d.render()
    assert site("raise") in d.reason and {0, 1} <= set(d.waiting_ranks)
