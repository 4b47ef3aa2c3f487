"""The one per-rank record, folded from a rank's events: what each event sets, what counts as
progress, malformed events, and how a finished job's ranks read."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from rankscope import rundir
from rankscope.launch.tracker import doing_now, in_collective, snapshot
from rankscope.rundir import RankRecord, RunDir, rank_records

from .conftest import as_probe_lines, older_lines

START = {
    "ev": "start",
    "t": 10.0,
    "pid": 4242,
    "host": "node1",
    "main_tid": 139_000_000_000_000,
    "env": {"LOCAL_RANK": "1", "GROUP_RANK": "0", "WORLD_SIZE": "4"},
}


def test_a_rank_s_events_fold_into_its_record():
    r = RankRecord(rank=1)
    assert r.apply(START)
    assert (r.pid, r.host, r.local_rank, r.group_rank, r.world_size) == (4242, "node1", 1, 0, 4)
    assert r.main_thread == f"0x{139_000_000_000_000:016x}" and r.started_at == 10.0
    enter = {"ev": "enter", "t": 11.0, "op": "barrier", "pg": "0", "seq": 4}
    assert not r.apply({**enter, "file": "/x/train.py", "line": 16})
    assert r.site == "train.py:16" and r.in_collective_since == 11.0 and in_collective(r)
    assert r.apply({"ev": "exit", "t": 12.0}) and r.done == 1 and not in_collective(r)
    assert r.apply({"ev": "step", "t": 12.5, "step": 3}) and r.step == 3
    assert not r.apply({"ev": "exception", "t": 13.0, "type": "ValueError", "message": "bad"})
    assert r.exception == "ValueError: bad"
    assert r.apply({"ev": "end", "t": 14.0, "code": 1, "reason": "exception"})
    assert (r.ended, r.exit_code, r.end_reason, r.ended_at) == (True, 1, "exception", 14.0)
    assert r.summary() == {
        "pid": 4242,
        "host": "node1",
        "local_rank": 1,
        "group_rank": 0,
        "started_at": 10.0,
        "exit_code": 1,
        "ended_at": 14.0,
    }


def test_the_flight_recorder_s_completions_are_progress():
    r = RankRecord(rank=0)
    assert r.apply({"ev": "heartbeat", "t": 1.0, "fr": {"0": [5, 4]}})  # first sight
    assert in_collective(r)  # enqueued 5, completed 4: issued from C++ and waiting
    assert not r.apply({"ev": "heartbeat", "t": 2.0, "fr": {"0": [5, 4]}})
    assert r.apply({"ev": "heartbeat", "t": 3.0, "fr": {"0": [5, 5]}})
    assert not in_collective(r)


def test_a_rank_under_slurm_knows_its_node_and_its_main_thread_s_cpu():
    r = RankRecord(rank=2)
    r.apply({**START, "env": {**START["env"], "SLURM_JOB_ID": "17", "SLURMD_NODENAME": "node2"}})
    assert (r.node, r.slurm_job) == ("node2", "17")
    r.apply({"ev": "heartbeat", "t": 11.0, "cpu": 3.0})
    assert r.cpu_share is None  # one heartbeat is no rate
    r.apply({"ev": "heartbeat", "t": 11.5, "cpu": 3.4})
    assert abs(r.cpu_share - 0.8) < 1e-9
    r.apply({"ev": "heartbeat", "t": 12.0, "cpu": 3.4})
    assert r.cpu_share == 0.0


def test_malformed_events_change_nothing_they_cannot_say():
    r = RankRecord(rank=0)
    for ev in (
        {"ev": "start", "pid": "not a pid", "env": ["not", "a", "dict"], "t": "soon"},
        {"ev": "heartbeat", "fr": {"0": "x"}},
        {"ev": "heartbeat", "fr": {"0": [1, 2, 3]}},
        {"ev": "enter", "seq": {"a": 1}, "line": None, "file": 7},
        {"ev": "end", "code": True},
    ):
        r.apply(ev)
    assert r.pid is None and r.local_rank is None and r.started_at is None and r.fr is None
    assert r.seq is None and r.site is None and r.exit_code is None and r.ended


def test_a_stopped_job_s_ranks_read_stopped_not_failed():
    ended = {"state": "stopped", "ranks": {"1": {"exit_code": -9}}}
    by_sigterm = RankRecord(rank=0, ended=True, exit_code=-15, end_reason="SIGTERM")
    silent = RankRecord(rank=1)  # never wrote its end (killed)
    crashed = RankRecord(rank=2, ended=True, exit_code=1, end_reason="exception")
    assert snapshot(by_sigterm, 0.0, job_ended=ended)["status"] == "stopped"
    gone = snapshot(silent, 0.0, job_ended=ended)
    assert gone["status"] == "stopped" and gone["exit_code"] == -9
    assert snapshot(crashed, 0.0, job_ended=ended)["status"] == "failed"
    # while the job is not over, a SIGTERM no stop sent is the launcher's teardown
    assert snapshot(by_sigterm, 0.0)["status"] == "ended"
    assert snapshot(by_sigterm, 0.0, stopping=True)["status"] == "stopped"


def test_what_a_rank_does_now_is_apart_from_what_it_last_completed():
    r = RankRecord(rank=1)
    r.apply({**START, "pid": os.getpid()})  # a live process: it runs, it is not dead
    r.apply(
        {
            "ev": "enter",
            "t": 11.0,
            "op": "all_reduce",
            "pg": "0",
            "seq": 3,
            "file": "/x/t.py",
            "line": 8,
        }
    )
    r.apply({"ev": "exit", "t": 11.5})
    r.apply({"ev": "heartbeat", "t": 12.0, "at": ["/x/t.py", 14, "step"]})
    snap = snapshot(r, now=13.0)
    assert snap["last_done"] == "all_reduce (group 0 #3)" and snap["at"] == "t.py:14"
    assert doing_now(snap) == "at t.py:14"  # asleep at line 14, not "in all_reduce"
    r.apply(
        {
            "ev": "enter",
            "t": 14.0,
            "op": "barrier",
            "pg": "0",
            "seq": 4,
            "file": "/x/t.py",
            "line": 20,
        }
    )
    snap = snapshot(r, now=16.5)
    assert doing_now(snap) == "waiting in barrier (group 0 #4) at t.py:20 for 2.5 s"
    assert snap["last_done"] == "all_reduce (group 0 #3)"
    r.apply({"ev": "heartbeat", "t": 17.0, "at": "not a list"})
    assert r.at == "t.py:14"


def _async_record() -> RankRecord:
    r = RankRecord(rank=0)
    r.apply({**START, "pid": os.getpid()})  # a live process
    site = {"file": "/x/train.py", "line": 41, "async_op": True, "op": "all_reduce", "pg": "0"}
    for cid, seq in ((7, 6), (8, 7)):
        assert not r.apply({"ev": "enter", "t": 20.0 + cid / 10, "id": cid, "seq": seq, **site})
        assert r.apply({"ev": "exit", "t": 20.1 + cid / 10, "id": cid, "op": "all_reduce"})
    r.apply({"ev": "heartbeat", "t": 21.0, "at": ["/x/train.py", 50, "<module>"]})
    return r


def test_an_async_call_waits_from_its_call_until_the_backend_completes_it():
    """Returned from, an async call is issued, not completed: the rank waits in the oldest one
    (its line, and the line where it waits), and nothing counts it as the last completed."""
    r = _async_record()
    assert in_collective(r) and r.last_done is None and sorted(r.issued) == [7, 8]
    snap = snapshot(r, now=32.4)
    assert snap["status"] == "waiting" and snap["waiting"]["seq"] == 6
    assert doing_now(snap) == (
        "waiting in all_reduce (group 0 #6) issued at train.py:41 11.7 s ago, not completed, "
        "waited at train.py:50"
    )
    # the done of #7 may come before its exit line; #6's is progress, then the last completed
    assert r.apply({"ev": "done", "t": 33.0, "ids": [7], "failed": []})
    assert r.last_done == "all_reduce (group 0 #6)" and list(r.issued) == [8]
    assert r.apply({"ev": "done", "t": 33.1, "ids": [8, "junk"], "failed": []})
    assert not in_collective(r) and snapshot(r, now=34.0)["status"] == "running"
    # a failed completion (a group aborted under it) is no completion
    r = _async_record()
    r.apply({"ev": "done", "t": 33.0, "ids": [7], "failed": [7]})
    assert r.last_done is None and list(r.issued) == [8]


def test_the_recorder_s_state_says_whether_the_device_started_it():
    """nccl with timing: the recorder's entry of the same group and number says scheduled (the
    stream has not reached it) or started; an entry no Python call made is torch's own."""
    r = _async_record()
    entry = ["0", 6, "all_reduce", "scheduled", 20.5, None]
    r.apply({"ev": "heartbeat", "t": 22.0, "at": ["/x/train.py", 50, "f"], "fr_active": [entry]})
    text = doing_now(snapshot(r, now=32.4))
    assert ", not started (the stream is still busy with earlier work), waited at" in text
    entry[3:] = ["started", 20.5, 30.0]
    r.apply({"ev": "heartbeat", "t": 22.5, "at": ["/x/train.py", 50, "f"], "fr_active": [entry]})
    assert ", started 2.4 s ago, not completed, waited at train.py:50" in doing_now(
        snapshot(r, now=32.4)
    )
    # DDP's bucket all_reduce, from C++: no Python call of the rank's made it
    ddp = RankRecord(rank=1)
    ddp.apply({**START, "pid": os.getpid()})
    beat = {"ev": "heartbeat", "t": 22.0, "at": ["/x/train.py", 21, "<module>"]}
    assert ddp.apply({**beat, "fr": {"0": [8, 7]}}) is True
    assert doing_now(snapshot(ddp, now=23.0)) == (
        "waiting in a collective (group 0 #8, issued by torch), not completed, "
        "waited at train.py:21"
    )
    ddp.apply(
        {**beat, "fr": {"0": [8, 7]}, "fr_active": [["0", 8, "all_reduce", None, 21.0, None]]}
    )
    assert doing_now(snapshot(ddp, now=23.0)) == (
        "waiting in all_reduce (group 0 #8, issued by torch) 2.0 s ago, not completed, "
        "waited at train.py:21"
    )
    # the entries are the truth: nccl's counters lag behind them (all completed, counters not)
    ddp.apply({**beat, "fr": {"0": [8, 7]}, "fr_active": []})
    assert not in_collective(ddp)


def test_an_nccl_blocking_call_that_returned_at_enqueue_is_waited_in_at_its_line():
    """nccl returns from a blocking all_reduce once it is enqueued: the recorder's entry of
    that call (same group, number and op) says it never started, and where it was issued."""
    r = RankRecord(rank=0)
    r.apply({**START, "pid": os.getpid()})
    call = {"op": "all_reduce", "pg": "0", "seq": 6, "id": 9, "file": "/x/train.py", "line": 13}
    r.apply({"ev": "enter", "t": 20.0, **call})
    r.apply({"ev": "exit", "t": 20.001, "id": 9})
    assert r.last_done == "all_reduce (group 0 #6)" and not in_collective(r)
    entry = ["0", 6, "all_reduce", "scheduled", 20.0, None]
    beat = {"ev": "heartbeat", "t": 21.0, "at": ["/x/train.py", 14, "<module>"]}
    r.apply({**beat, "fr": {"0": [6, 5]}, "fr_active": [entry]})
    assert doing_now(snapshot(r, now=32.4)) == (
        "waiting in all_reduce (group 0 #6) issued at train.py:13 12.4 s ago, not started "
        "(the stream is still busy with earlier work), waited at train.py:14"
    )
    assert snapshot(r, now=32.4)["last_done"] is None  # returned from at enqueue, not completed


def test_a_waiting_rank_names_the_members_that_have_not_called_its_collective(tmp_path):
    """Ranks 0 and 1 issued all_reduce #6 of group 0 [0, 1, 2] and wait on its Work; rank 2
    called #5 last: the live view says whom they wait for."""
    import json

    from rankscope.launch.tracker import RankTracker
    from rankscope.rundir import RunDir

    run = RunDir(tmp_path / "run")
    for rank, last in ((0, 6), (1, 6), (2, 5)):
        run.rank_dir(rank).mkdir(parents=True)
        evs = [{**START, "pid": os.getpid(), "rank": rank}]
        for seq in range(5, last + 1):
            call = {"id": seq, "op": "all_reduce", "pg": "0", "seq": seq, "pg_ranks": [0, 1, 2]}
            call |= {"file": "/x/train.py", "line": 41, "async_op": seq == 6}
            evs += [
                {"ev": "enter", "t": 20.0 + seq, **call},
                {"ev": "exit", "t": 20.1 + seq, "id": seq},
            ]
        run.events(rank).write_text("".join(json.dumps(e) + "\n" for e in evs))
    tracker = RankTracker(run)
    tracker.update()
    snaps = {s["rank"]: s for s in tracker.snapshots(now=40.0)}
    assert snaps[0]["waiting"]["waiting_for"] == [2]
    assert "not completed, waiting for rank 2" in doing_now(snaps[0])
    assert snaps[2]["waiting"] is None


def _fold(events: list[dict]) -> RankRecord:
    r = RankRecord(rank=0)
    for ev in events:
        r.apply(ev)
    return r


def _state(r: RankRecord) -> dict:
    """What a record says, but for what it keeps of the facts lines to say it."""
    fields = dataclasses.asdict(r)
    del fields["_facts"], fields["_members_of"]
    return fields


def test_call_lines_and_facts_ids_fold_as_an_older_probe_s_enter_and_exit_lines():
    """The probe writes a call's facts once and names them by id; a call that returned
    before the flush is one line. The record reads what it read of the older lines."""
    old = older_lines()
    new = as_probe_lines(old)
    kinds = [e["ev"] for e in new]
    assert kinds.count("facts") == 3 and kinds.count("call") == 5  # 1, 3, 4, 6, 7 returned
    assert kinds.count("enter") == 3 and kinds.count("exit") == 2  # 2 raised, 5 at a flush
    assert all("pg_ranks" not in e for e in new if e["ev"] != "facts")
    for upto in range(1, len(old) + 1):  # at every point, as the tracker reads them
        part = as_probe_lines(old[:upto])
        assert _state(_fold(part)) == _state(_fold(old[:upto])), upto
    r = _fold(new)
    # 7 returned, 1 of them (call 2) raised: 6 completed
    assert r.done == 6 and r.op == "all_reduce" and r.seq == 8 and r.site == "train.py:41"
    assert r.members == {"0": [0, 1, 2]} and r.in_collective_since == 28.0
    assert r.last_done == "all_reduce (group 0 #7)" and not r.issued
    assert r.recent[("0", 8)] == ("all_reduce", [[1]], ["float32"], None)


def test_an_async_call_line_is_in_flight_until_its_done_event():
    lines = as_probe_lines(older_lines()[:7])  # up to call 3, async: its done comes later
    assert lines[-1]["ev"] == "call" and lines[-1]["id"] == 3
    r = _fold(lines)
    # call 2 raised: not completed, #1 is the last
    assert list(r.issued) == [3] and r.last_done == "all_reduce (group 0 #1)"
    assert r.apply({"ev": "done", "t": 30.0, "ids": [3], "failed": []})
    assert not r.issued and r.last_done == "all_reduce (group 0 #3)"


def test_unknown_or_malformed_facts_leave_the_fields_unknown():
    r = RankRecord(rank=0)
    facts = {"ev": "facts", "facts": 1, "op": ["x"], "pg": 0, "pg_ranks": "0,1", "line": "9"}
    assert not r.apply({**facts, "peer": "three", "file": "/x/t.py", "shapes": 5})
    call = {"ev": "call", "t": 1.0, "id": 1, "seq": 1, "dur_s": 0.5, "ok": True}
    for fid in (1, 2, "1", [1], {"a": 1}, None, 1.5):
        assert r.apply({**call, "facts": fid})
        assert not r.apply({**call, "ev": "enter", "facts": fid})
        known = fid == 1
        assert (r.op, r.pg, r.peer) == (None, "0" if known else None, None)
        assert r.site == ("t.py:9" if known else None) and r.seq == 1
    assert r.members == {} and r.done == 7 and r.last_event_at == 1.0
    r.apply({**call, "facts": 1, "dur_s": "long", "seq": "x", "t": None})
    assert r.seq is None and r.done == 8


def test_a_rank_keeps_the_latest_facts_its_probe_can_name(monkeypatch):
    """The probe forgets its facts ids every FACTS_KEPT new ones; a reader keeps twice as
    many, the latest (a process started anew issues ids anew: its facts are the latest)."""
    monkeypatch.setattr(rundir, "FACTS_KEPT", 2)
    r = RankRecord(rank=0)
    for fid in range(1, 7):
        r.apply({"ev": "facts", "facts": fid, "op": f"op{fid}", "pg": "0"})
    assert list(r._facts) == [3, 4, 5, 6]
    r.apply({"ev": "facts", "facts": 3, "op": "again", "pg": "0"})
    r.apply({"ev": "facts", "facts": 7, "op": "op7", "pg": "0"})
    assert list(r._facts) == [5, 6, 3, 7]
    call = {"ev": "call", "t": 1.0, "id": 1, "seq": 1, "dur_s": 0.5, "ok": True}
    ops = []
    for fid in (4, 5, 3, 7):
        r.apply({**call, "facts": fid})
        ops.append(r.op)
    assert ops == [None, "op5", "again", "op7"]


def test_an_older_probe_s_runs_read_as_the_same_calls_in_the_probe_s_lines():
    """tests/data holds runs an older probe wrote (the facts in every enter line): each rank's
    record is the one its calls make written as the probe writes them now."""
    data = Path(__file__).parent / "data"
    for run in (RunDir(p) for p in sorted(data.glob("*/run")) if RunDir(p).is_run()):
        records = rank_records(run)
        assert records
        for rank, record in records.items():
            assert not record._facts
            events = list(run.iter_events(rank))
            assert _state(_fold(as_probe_lines(events))) == _state(record) | {"rank": 0}


def test_a_group_s_members_are_one_list_for_all_its_facts():
    """The calls of a step come from several sites (several facts) on one group: their facts
    share the members' list, so a call tells them unchanged by identity, not by comparing a
    thousand ranks; members that change are taken."""
    r = RankRecord(rank=0)
    world = {"ev": "facts", "op": "all_reduce", "pg": "0", "pg_ranks": list(range(1024))}
    for fid, shapes in ((1, [[4]]), (2, [[8]])):
        r.apply({**world, "facts": fid, "shapes": shapes, "pg_ranks": list(range(1024))})
    assert r._facts[1][2] is r._facts[2][2]
    call = {"ev": "call", "t": 1.0, "dur_s": 0.5, "ok": True}
    for seq in range(1, 5):
        r.apply({**call, "id": seq, "seq": seq, "facts": seq % 2 + 1})
    assert r.members["0"] is r._facts[1][2] and r.recent[("0", 4)][1] == [[4]]
    r.apply({**world, "facts": 3, "pg_ranks": [0, 1]})  # the group made anew, smaller
    r.apply({**call, "id": 5, "seq": 5, "facts": 3})
    assert r.members == {"0": [0, 1]}


def test_a_rank_s_cell_events_say_where_it_stands_with_its_latest_cell():
    """Running, finished, raised (a cell that raised on it) or threads (its cell left a thread
    running): the live prover and the ranks table read the same fold."""
    r = RankRecord(rank=1)
    assert r.cell_state is None
    r.apply({"ev": "cell", "t": 10.0, "cell": 7, "run": 3, "phase": "start"})
    assert (r.cell, r.cell_state, r.cell_at) == ((7, 3), "running", 10.0)
    r.apply(
        {"ev": "cell", "t": 11.0, "cell": 7, "run": 3, "phase": "end", "threads": 0, "ok": True}
    )
    assert (r.cell_state, r.cell_at) == ("finished", 11.0)
    r.apply({"ev": "cell", "t": 12.0, "cell": 8, "run": 4, "phase": "start"})
    r.apply(
        {"ev": "cell", "t": 13.0, "cell": 8, "run": 4, "phase": "end", "threads": 0, "ok": False}
    )
    assert (r.cell, r.cell_state) == ((8, 4), "raised")
    r.apply({"ev": "cell", "t": 14.0, "cell": 9, "run": 5, "phase": "start"})
    r.apply(
        {"ev": "cell", "t": 15.0, "cell": 9, "run": 5, "phase": "end", "threads": 1, "ok": True}
    )
    assert r.cell_state == "threads"
