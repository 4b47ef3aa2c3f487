"""Real nccl artifacts from a GPU machine (``tests/data/nccl_gpu/``, made by
``tests/gpu/device_check.sh``: one NVIDIA H200, torch 2.11.0+cu130, NCCL 2.28.9), read on the
CPU: what the recorder, the watchdog and NCCL wrote when a kernel never ended in front of an
all_reduce, with and without timing, a healthy dump, and two ranks on one GPU."""

from __future__ import annotations

import pickle
from pathlib import Path

from rankscope.analyze import diagnose
from rankscope.cli import main
from rankscope.collect import load_run

DATA = Path(__file__).parent / "data" / "nccl_gpu"


def test_a_rankscope_run_whose_kernel_never_ends():
    """The run directory of tests/gpu's stall test: the all_reduce was issued, never started."""
    d = diagnose(load_run(DATA / "spin_stall"))
    assert (d.verdict, d.cause, d.culprit_ranks) == ("hang", "stream_stuck", [0]), d.render()
    assert "all_reduce (group 0, collective #5)" in d.summary
    assert "all_reduce #4 on group 0" in d.summary  # what its stream completed last
    # nccl returned from #5 at enqueue; its recorder entry says it never completed, and the
    # calls table says so too (the probe's return is not the backend's completion)
    calls = d.context.calls
    last = calls[(calls["op"] == "all_reduce") & (calls["seq"] == 5)]
    assert last["completed"].tolist() == [False], calls.tail(3)
    assert calls["state"].tolist()[-2:] == ["completed", "issued"], calls.tail(3)
    assert "waiting in all_reduce at spin_before_all_reduce.py:23" in d.summary


def test_the_status_of_an_ended_rank_names_the_call_never_completed(capsys):
    """nccl returned from the all_reduce at enqueue; its heartbeats' recorder reads show it
    never completed, so it is not the last completed call. The run was made on another
    machine: its script is not here, and the status reads it all the same."""
    assert main(["status", str(DATA / "spin_stall")]) == 0
    out = capsys.readouterr().out
    assert "ended with all_reduce (group 0 #5) never completed" in out, out
    assert "last completed all_reduce (group 0 #5)" not in out, out
    assert " hb " not in out  # an ended rank has no heartbeat age


def test_a_healthy_job_of_long_kernels():
    assert diagnose(load_run(DATA / "long_kernels")).verdict == "ok"


def test_a_watchdog_timeout_of_a_job_started_by_hand():
    """torchrun by hand, no probe: the recorder's dump on timeout holds the entry `scheduled`
    with no start time while timing is on; the watchdog's texts are victims' reports."""
    run = load_run(DATA / "timeout")
    d = diagnose(run)
    assert (d.verdict, d.cause, d.culprit_ranks) == ("hang", "stream_stuck", [0]), d.render()
    assert "all_reduce (group 0, collective #6)" in d.summary
    errors = run.table("errors")
    timeout = errors[errors["kind"] == "nccl_watchdog_timeout"]
    assert len(timeout) == 1, errors[["kind", "source"]]
    assert timeout["role"].iloc[0] == "timeout"
    fields = timeout["fields"].iloc[0]
    assert (fields["seq"], fields["op_type"], fields["timeout_ms"]) == (6, "ALLREDUCE", 10000)
    # torch 2.11 writes two spaces after this line's "[PG ID 0 PG GUID 0(default_pg) Rank 0]"
    (failure,) = errors.loc[errors["kind"] == "nccl_watchdog_failure", "fields"]
    assert (failure["pg"], failure["seq"], failure["last_completed"]) == ("0", 6, 5), failure
    # the log holds stack lines (the failed collective's) and NCCL's INFO lines: each reader
    # that knows a part of it gets it
    assert not run.table("nccl").empty
    assert run.table("problems").empty, run.table("problems")


def test_without_timing_the_card_says_what_it_cannot_know():
    d = diagnose(load_run(DATA / "timeout_untimed"))
    assert d.verdict == "hang" and d.cause != "stream_stuck", d.render()
    assert any("TORCH_NCCL_ENABLE_TIMING" in m for m in d.missing), d.missing


def test_the_entries_are_the_truth_where_the_group_status_lags():
    """A dump right after a healthy job's 50th all_reduce: every entry completed (not yet
    retired), while pg_status still says nothing completed."""
    dump = pickle.loads((DATA / "healthy_dump" / "nccl_trace_rank_0").read_bytes())
    assert dump["pg_status"]["0"]["last_completed_collective"] == -1
    assert {e["state"] for e in dump["entries"]} == {"completed"}
    assert not any(e["retired"] for e in dump["entries"])
    d = diagnose(load_run(DATA / "healthy_dump"))
    assert d.verdict == "ok", d.render()


def test_two_ranks_on_one_gpu():
    d = diagnose(load_run(DATA / "two_ranks_one_gpu"))
    assert (d.verdict, d.cause) == ("launch_error", "duplicate_gpu"), d.render()
