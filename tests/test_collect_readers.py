"""Each collector on committed captures of real gloo jobs and on NCCL-format files."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import pandas as pd
import pytest

from rankscope import schema
from rankscope.collect import (
    SIGNATURES,
    Problems,
    Source,
    find_errors,
    load_run,
    read_collectives,
    read_events,
    read_flight_recorder,
    read_fr_frames,
    read_logs,
    read_nccl,
    read_nccl_comms,
    read_pg_status,
    read_stacks,
    summarize_stacks,
)
from rankscope.collect.events import parse_events
from rankscope.collect.flight_recorder import parse_ranks
from rankscope.collect.stacks import is_user_file
from rankscope.rundir import library_of

from .conftest import as_probe_lines, older_lines

DATA = Path(__file__).parent / "data"
HANG = DATA / "gloo_barrier_hang" / "run"
CLEAN = DATA / "gloo_clean" / "run"
FOREIGN = DATA / "foreign_slurm"
VERSIONS = DATA / "fr_versions"


def ranked(run: Path, name: str) -> list[Source]:
    return [
        Source(p, p.relative_to(run).as_posix(), rank=int(p.parent.name))
        for p in sorted(run.glob(f"ranks/*/{name}"))
    ]


# --- events and collectives --------------------------------------------------------------------
def test_events_of_a_hang():
    events = read_events(ranked(HANG, "events.jsonl"))
    schema.validate("events", events)
    assert set(events["rank"]) == {0, 1, 2, 3}
    assert {"start", "enter", "exit", "heartbeat", "capture"} <= set(events["ev"])
    capture = events[events["ev"] == "capture"]
    assert set(capture["capture_id"]) == {1} and set(capture["message"]) == {"stall:no_progress"}


def test_collectives_pair_enter_and_exit():
    calls = read_collectives(ranked(HANG, "events.jsonl"))
    schema.validate("collectives", calls)
    in_flight = calls[~calls["completed"]].set_index("rank")
    assert in_flight.loc[0, "op"] == "barrier" and in_flight.loc[0, "site"] == "worker.py:13"
    assert in_flight.loc[0, "func"] == "validate"
    assert (in_flight.loc[[1, 2, 3], "op"] == "all_reduce").all()
    assert in_flight["t_end_s"].isna().all() and in_flight["ok"].isna().all()
    done = calls[calls["completed"] & (calls["op"] == "all_reduce")]
    assert len(done) == 12 and done["ok"].all()
    assert (done["pg_ranks"] == "0,1,2,3").all() and (done["pg_size"] == 4).all()
    assert set(done["shapes"]) == {"[[8]]"} and set(done["dtypes"]) == {'["float32"]'}
    assert (done["duration_s"] > 0).all()
    assert list(done[done["rank"] == 0]["seq"]) == [1, 2, 3]


def test_each_exit_and_done_pairs_with_its_call(tmp_path):
    """The pairing on lines written by hand: an async call completed by its done event (one
    failed, one whose done came before its exit), a call in flight, an exit whose enter was
    lost, and a call id written twice."""

    def enter(cid, seq, op="all_reduce", async_op=False):
        return {
            "ev": "enter",
            "id": cid,
            "seq": seq,
            "op": op,
            "pg": "0",
            "t": 10.0 + cid,
            "async_op": async_op,
            "file": "/w/t.py",
            "line": 7,
        }

    def leave(cid, ok=True, error=None):
        return {
            "ev": "exit",
            "id": cid,
            "op": "all_reduce",
            "pg": "0",
            "seq": cid,
            "dur_s": 0.5,
            "ok": ok,
            "error": error,
            "t": 10.5 + cid,
        }

    lines = [
        {"ev": "start", "pid": 7, "works": True, "t": 1.0},
        enter(1, 1),
        leave(1),
        enter(2, 2, async_op=True),
        leave(2),
        {"ev": "done", "ids": [2], "t": 14.0},
        enter(3, 3, async_op=True),
        leave(3),
        {"ev": "done", "ids": [3], "failed": [3], "t": 15.0},
        enter(4, 4, async_op=True),
        {"ev": "done", "ids": [4], "t": 14.2},
        leave(4),
        enter(5, 5, async_op=True),
        leave(5),  # its Work not completed yet
        leave(6, ok=False, error="boom"),  # its enter line lost
        enter(7, 7),
        leave(7),
        leave(7),  # a call id written twice
        enter(8, 8, op="barrier"),  # in flight
    ]
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(ev) + "\n" for ev in lines))
    calls = read_collectives([Source(path, "events.jsonl", rank=0)])
    schema.validate("collectives", calls)
    got = {
        cid: (row["completed"], None if pd.isna(row["ok"]) else bool(row["ok"]), row["t_done_s"])
        for cid, row in zip(calls["coll_id"], calls.to_dict("records"), strict=True)
        if cid != 7
    }
    assert got == {
        1: (True, True, 11.5),
        2: (True, True, 14.0),
        3: (True, False, 15.0),
        4: (True, True, 14.2),
        5: (False, True, None),
        6: (True, False, 16.5),
        8: (False, None, None),
    }
    assert list(calls["coll_id"]) == [1, 2, 3, 4, 5, 6, 7, 7, 8]
    alone = calls[calls["coll_id"] == 6].iloc[0]
    assert (alone["op"], alone["seq"], alone["error"]) == ("all_reduce", 6, "boom")
    assert pd.isna(alone["t_start_s"]) and alone["duration_s"] == 0.5
    assert calls.loc[calls["coll_id"] == 8, "site"].item() == "t.py:7"


def test_a_torn_events_line_is_skipped_and_reported(tmp_path):
    lines = (HANG / "ranks/0/events.jsonl").read_text().splitlines()
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join([*lines[:5], lines[5][:17], *lines[6:]]) + "\n")
    problems = Problems()
    events = read_events([Source(path, "events.jsonl", rank=0)], problems=problems)
    assert len(events) == len(lines) - 1
    assert problems.rows[0][0] == "events.jsonl" and "line 6" in problems.rows[0][2]
    with pytest.raises(ValueError, match=r"events\.jsonl: 1 line"):
        read_events([Source(path, "events.jsonl", rank=0)])


def _as_files(tmp_path: Path, by_rank: dict[int, list[dict]]) -> list[Source]:
    out = []
    for rank, events in by_rank.items():
        path = tmp_path / str(rank) / "events.jsonl"
        path.parent.mkdir(parents=True)
        path.write_text("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events))
        out.append(Source(path, f"ranks/{rank}/events.jsonl", rank=rank))
    return out


@pytest.mark.parametrize("run", ["older_lines", *sorted(p.parent.name for p in DATA.glob("*/run"))])
def test_the_probe_s_call_lines_make_the_tables_an_older_probe_s_lines_made(tmp_path, run):
    """The probe names a call's facts by id and writes a call that returned before a flush
    in one line: the tables are those of an older probe's lines for the same calls (an exit
    row's time is the call line's t + dur_s, to the microsecond)."""
    if run == "older_lines":
        old = {0: older_lines()}
    else:
        old = {
            int(p.parent.name): [json.loads(line) for line in p.read_text().splitlines()]
            for p in sorted((DATA / run / "run").glob("ranks/*/events.jsonl"))
        }
    new = {rank: as_probe_lines(events) for rank, events in old.items()}
    assert sum(e["ev"] == "call" for events in new.values() for e in events) > 0
    was = parse_events(_as_files(tmp_path / "old", old))
    now = parse_events(_as_files(tmp_path / "new", new))
    for before, after in zip(was, now, strict=True):
        assert before.columns.tolist() == after.columns.tolist() and len(before) == len(after)
        floats = [c for c in before.columns if c.endswith("_s")]
        pd.testing.assert_frame_equal(before.drop(columns=floats), after.drop(columns=floats))
        pd.testing.assert_frame_equal(before[floats], after[floats], rtol=0, atol=1.5e-6)


# --- logs --------------------------------------------------------------------------------------
def test_logs_map_node_and_local_rank_to_global_rank():
    logs = load_run(HANG).logs
    schema.validate("logs", logs)
    rank_files = logs[logs["stream"] == "stderr"]
    by_source = rank_files.groupby("source")["rank"].first()
    node1 = {s: r for s, r in by_source.items() if s.startswith("logs/node1/")}
    assert sorted(node1.values()) == [2, 3]
    launcher = logs[(logs["stream"] == "launcher") & (logs["node"] == 1)]
    tee = launcher[launcher["local_rank"].notna()]
    assert set(zip(tee["local_rank"], tee["rank"], strict=True)) == {(0, 2), (1, 3)}
    assert not tee["text"].str.startswith("[default").any()


def test_rank_prefixes_are_stripped_and_win():
    run = load_run(DATA / "monitored_barrier" / "run")
    line = run.logs[run.logs["text"].str.contains("ProcessGroupGloo.cpp:67", regex=False)]
    assert set(line["rank"]) == {0}
    assert all(t.startswith("[E") for t in line["text"])  # [default0]:[rank0]: removed
    assert line["t_s"].notna().all()


def test_error_json_becomes_lines():
    logs = load_run(DATA / "gloo_rank_raises" / "run").logs
    err = logs[(logs["stream"] == "error_file") & (logs["rank"] == 1)]
    assert err["text"].iloc[0] == "ValueError: corrupt shard on rank 1"
    assert err["t_s"].notna().all()
    assert err["text"].str.contains("in load_batch").any()


def test_slurm_log_with_rank_prefixes():
    logs = read_logs([FOREIGN / "slurm-4242.out"])
    oom = logs[logs["text"].str.contains("CUDA out of memory", regex=False)]
    assert list(oom["rank"]) == [2] and oom["text"].iloc[0].startswith(" torch.OutOfMemoryError")
    assert set(logs["rank"].dropna()) == {0, 1, 2, 3}
    assert (logs["stream"] == "stdout").all()


# --- NCCL ---------------------------------------------------------------------------------------
def test_nccl_lines_per_process_files():
    files = sorted(FOREIGN.glob("nccl.*.log"))
    nccl = read_nccl(files)
    schema.validate("nccl", nccl)
    assert set(nccl["rank"]) == {0, 1, 2, 3}  # from each process's Init lines
    warn = nccl[nccl["level"] == "WARN"].set_index("line_no")
    assert warn.loc[15, "file"] == "transport/net.cc" and warn.loc[15, "line"] == 1143
    assert warn.loc[15, "message"].startswith("Socket recv failed")
    assert warn.loc[15, "t_s"] > 0 and warn.loc[15, "tid"] == 5137 + 61
    assert warn.loc[18, "file"] == "proxy.cc"  # 2.30.7 puts "(function)" after file:line
    info = nccl[(nccl["level"] == "INFO") & (nccl["host"] == "gpu-a02")]
    assert set(info["pid"]) == {5120, 5137} and set(info["device"]) == {0, 1}
    assert set(nccl[nccl["level"] == "VERSION"]["message"]) == {"2.21.5+cuda12.4"}


def test_nccl_comms_and_version():
    comms = read_nccl_comms(sorted(FOREIGN.glob("nccl.*.log")))
    schema.validate("nccl_comms", comms)
    assert len(comms) == 8 and set(comms["state"]) == {"START", "COMPLETE"}
    assert set(comms["comm_id"]) == {"0x996ee6f117cb8e1e"} and set(comms["nranks"]) == {4}
    assert list(comms["rank"]) == list(comms["nccl_rank"])
    assert set(comms["nccl_version"]) == {"2.21.5+cuda12.4"}


def test_nccl_lines_mixed_into_a_log(tmp_path):
    path = tmp_path / "stderr.log"
    path.write_bytes(
        b"Traceback (most recent call last):\r\n"
        b"[default0]:gpu-a01:41230:41230 [0] NCCL INFO Using network IB\r\n"
        b"RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error\r\n"
        b"host-b:7:9 NCCL CALL ncclSend(0x7f, 1024)\r\n"
        b"host-b:7:9 [1] 12.345 ncclProxyProgress:88 NCCL TRACE progress\r\n"
        b"no newline at the end: NCCL INFO is not at a line header here"
    )
    nccl = read_nccl([Source(path, "stderr.log", rank=5)])
    assert list(nccl["level"]) == ["INFO", "CALL", "TRACE"]
    assert list(nccl["message"]) == ["Using network IB", "ncclSend(0x7f, 1024)", "progress"]
    assert list(nccl["line_no"]) == [2, 4, 5] and set(nccl["rank"]) == {5}
    assert nccl["file"].iloc[2] == "ncclProxyProgress" and nccl["line"].iloc[2] == 88


def test_nccl_chunks_join_at_line_ends(tmp_path, monkeypatch):
    from rankscope.collect import nccl as module

    monkeypatch.setattr(module, "CHUNK_BYTES", 64)
    lines = [f"h:1:2 [0] NCCL INFO message number {i}" for i in range(50)]
    path = tmp_path / "nccl.log"
    path.write_text("\n".join(lines) + "\n")
    out = read_nccl([path])
    assert list(out["message"]) == [f"message number {i}" for i in range(50)]
    assert list(out["line_no"]) == list(range(1, 51))


def test_nccl_many_distinct_headers(tmp_path):
    # Thousands of processes in one file: the scan's header table grows several times, and two
    # headers that differ only in their last byte stay apart.
    lines = [f"node{i % 7}:{1000 + i}:{i} [{i % 8}] NCCL INFO from {i}" for i in range(3000)]
    lines += ["node0:1000:0 [0] NCCL WARN again", "node0:1000:0 [1] NCCL WARN other device"]
    path = tmp_path / "nccl.log"
    path.write_text("\n".join(lines) + "\n")
    out = read_nccl([path])
    assert len(out) == 3002
    assert list(out["pid"][:3000]) == [1000 + i for i in range(3000)]
    assert list(out["tid"][:3000]) == list(range(3000))
    assert list(out["host"][:14]) == [f"node{i % 7}" for i in range(14)]
    assert list(out["device"][-2:]) == [0, 1] and list(out["level"][-2:]) == ["WARN", "WARN"]


# --- flight recorder -----------------------------------------------------------------------------
def test_gloo_dump_quirks():
    fr = read_flight_recorder(ranked(CLEAN, "fr.pkl"))
    schema.validate("flight_recorder", fr)
    assert set(fr["backend"]) == {"gloo"} and set(fr["state"]) == {"scheduled"}
    assert fr["time_discovered_started_ns"].isna().all()
    assert fr["time_discovered_completed_ns"].isna().all()
    world = fr[fr["pg_name"] == "0"]
    sub = fr[fr["pg_name"] == "1"]
    assert set(world["pg_desc"]) == {"default_pg"} and len(sub) == 2
    # pg_config is {'': {..., 'ranks': '[]'}}: nobody can say which group that is
    assert fr["pg_ranks"].isna().all()
    gather = fr[fr["op"] == "all_gather"]
    assert set(gather["output_sizes"]) == {"[[2, 4]]"} and set(gather["input_dtypes"]) == {
        '["Float"]'
    }
    assert set(sub["input_sizes"]) == {"[[2, 3]]"}


def test_gloo_pg_ranks_from_the_quirky_config():
    fr = read_flight_recorder(ranked(HANG, "fr.pkl"))
    assert set(fr["pg_ranks"]) == {"0,1,2,3"}  # one group in the dump: the '' entry is it
    last = fr.sort_values("record_id").groupby("rank").tail(1).set_index("rank")
    assert last.loc[0, "op"] == "barrier" and not last.loc[0, "retired"]
    assert (last.loc[[1, 2, 3], "op"] == "all_reduce").all()


def test_json_dump_matches_pickle_dump():
    pkl = read_flight_recorder(ranked(CLEAN, "fr.pkl")).drop(columns=["source"])
    js = read_flight_recorder(ranked(CLEAN, "fr.json")).drop(columns=["source"])
    n = len(js)  # the JSON dump was taken before the final barrier
    common = ["rank", "record_id", "profiling_name", "collective_seq_id", "input_sizes"]
    pd.testing.assert_frame_equal(js[common], pkl[common].iloc[:n], check_categorical=False)
    assert js["time_discovered_completed_ns"].isna().all()  # 0 in JSON means unknown


@pytest.mark.parametrize("version", ["2.3", "2.4", "2.5", "2.7", "2.10"])
def test_every_format_version(version):
    pkl = read_flight_recorder([VERSIONS / f"v{version}_rank_0.pkl"])
    js = read_flight_recorder([VERSIONS / f"v{version}_rank_0.json"])
    for fr in (pkl, js):
        schema.validate("flight_recorder", fr)
        assert list(fr["version"]) == [version] * 3
        assert list(fr["state"]) == ["completed", "completed", "started"]
        assert fr["time_discovered_completed_ns"].isna().tolist() == [False, False, True]
        assert list(fr["op"]) == ["all_reduce", "_allgather_base", "_reduce_scatter_base"]
        assert set(fr["pg_ranks"]) == {"0,1,2,3"} and set(fr["rank"]) == {0}
    assert pkl["thread_name"].isna().all() != (version == "2.10")


def test_json_dump_without_entries_and_pg_status_strings():
    files = [VERSIONS / "no_entries_rank_1.json", VERSIONS / "v2.10_rank_0.json"]
    fr = read_flight_recorder(files)
    assert set(fr["rank"]) == {0}
    status = read_pg_status(files)
    schema.validate("pg_status", status)
    row = status.set_index("rank").loc[1]
    assert row["last_enqueued_collective"] == 0 and pd.isna(row["last_completed_collective"])


def test_foreign_nccl_dumps():
    files = [*sorted(FOREIGN.glob("nccl_trace_rank_*")), FOREIGN / "comm_lib_trace_rank_3"]
    fr = read_flight_recorder(files)
    assert fr.groupby("rank").size().to_dict() == {0: 7, 1: 7, 2: 6, 3: 7}
    assert set(fr["version"]) == {"2.10", "2.7", "2.5"}
    started = fr[fr["state"] == "started"]
    assert set(started["rank"]) == {0, 1, 3} and set(started["collective_seq_id"]) == {7}
    assert fr.loc[fr["state"] == "completed", "duration_ms"].notna().all()
    status = read_pg_status(files).set_index("rank")
    assert status.loc[2, "last_enqueued_collective"] == 6


@pytest.mark.slow
def test_worker_processes_send_bounded_parts(monkeypatch):
    # A part per file, from workers and in this process: the same table as one part.
    from rankscope.collect import _fr_parse
    from rankscope.collect import flight_recorder as module

    # The files given in no order of rank: the rows come by rank all the same, each dump's
    # in its own order, from workers too (the analysis needs no sort of the rows).
    files = [FOREIGN / "comm_lib_trace_rank_3", *sorted(FOREIGN.glob("nccl_trace_rank_*"))[::-1]]
    alone = read_flight_recorder(files, workers=1)
    assert alone["rank"].is_monotonic_increasing
    monkeypatch.setattr(_fr_parse, "PART_FILES", 1)
    assert len(module._run("entries", module.as_sources(files), 1)) == len(files)
    shared = read_flight_recorder(files, workers=2)
    pd.testing.assert_frame_equal(shared, alone, check_categorical=False)
    frames = module.read_fr_frames(files, workers=2)
    assert frames["rank"].is_monotonic_increasing
    pd.testing.assert_frame_equal(
        frames, module.read_fr_frames(files, workers=1), check_categorical=False
    )


def test_frames_are_their_own_table():
    frames = read_fr_frames(ranked(HANG, "fr.pkl"))
    schema.validate("fr_frames", frames)
    user = frames[frames["filename"].str.endswith("worker.py")]
    barrier = frames[(frames["rank"] == 0) & (frames["depth"] == 0)]
    assert "barrier" in set(barrier["name"])
    assert set(user["line"]) >= {13, 20, 22, 23}


def test_ranks_text_is_parsed_not_evaluated():
    assert parse_ranks("[0, 1, 2]") == "0,1,2"
    assert parse_ranks("[]") == ""
    assert parse_ranks("__import__('os').system('true')") is None
    assert parse_ranks([0, 1]) is None


# --- stacks -------------------------------------------------------------------------------------
def test_faulthandler_and_pyspy_stacks():
    run = load_run(HANG)
    stacks = run.stacks
    schema.validate("stacks", stacks)
    assert set(stacks["tool"]) == {"faulthandler", "py-spy"}
    assert set(stacks["capture_id"]) == {1}
    fh = stacks[(stacks["tool"] == "faulthandler") & (stacks["rank"] == 0)]
    assert fh["t_s"].notna().all() and fh["is_current"].any()
    spy = stacks[(stacks["tool"] == "py-spy") & (stacks["rank"] == 0)]
    assert set(spy["thread_name"]) == {"MainThread", "rankscope-probe"}
    summary = run.stack_summary.set_index(["tool", "rank"])
    schema.validate("stack_summary", run.stack_summary)
    for tool in ("faulthandler", "py-spy"):
        assert summary.loc[(tool, 0), "waiting_in"] == "barrier"
        assert summary.loc[(tool, 0), "site"] == "worker.py:13"
        assert summary.loc[(tool, 0), "func"] == "validate"
        assert summary.loc[(tool, 3), "waiting_in"] == "all_reduce"
        assert summary.loc[(tool, 3), "site"] == "worker.py:23"


def test_pyspy_json():
    stacks = read_stacks([FOREIGN / "rank2.pyspy.json"])
    assert list(stacks["func"]) == ["barrier", "_exception_logger.<locals>.wrapper", "<module>"]
    assert list(stacks["is_user"]) == [False, False, True] and set(stacks["rank"]) == {2}
    summary = summarize_stacks(stacks)
    assert summary["waiting_in"].iloc[0] == "barrier" and summary["site"].iloc[0] == "train.py:6"


def test_faulthandler_crash_dump_in_stderr(tmp_path):
    path = tmp_path / "stderr.log"
    path.write_text(
        "step 3\nFatal Python error: Segmentation fault\n\n"
        "Thread 0x00007f0000000001 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 331 in wait\n\n'
        "Current thread 0x00007f0000000002 (most recent call first):\n"
        '  File "/home/u/model.py", line 7 in forward\n'
        '  File "/home/u/train.py", line 30 in <module>\n\n'
        "Extension modules: numpy (total: 1)\n"
    )
    stacks = read_stacks([Source(path, "stderr.log", rank=1, stream="stderr")])
    assert list(stacks["func"]) == ["wait", "forward", "<module>"]
    assert set(stacks["reason"]) == {"SIGSEGV"}  # the capture's reason: the fatal signal
    summary = summarize_stacks(stacks)
    assert summary["func"].iloc[0] == "forward" and summary["waiting_in"].isna().all()
    assert summary["reason"].tolist() == ["SIGSEGV"] and summary["source"].tolist() == [
        "stderr.log"
    ]


def test_captures_and_fatal_dumps_in_one_stacks_file(tmp_path):
    """The probe's stacks.txt: a capture at a stall, one at the teardown's SIGTERM, then an
    abort's dump (faulthandler writes no marker: its first line names the signal)."""
    path = tmp_path / "stacks.txt"
    thread = 'Current thread 0x00007f0000000002 (most recent call first):\n  File "/u/t.py", line {} in <module>\n'
    path.write_text(
        "# rankscope capture id=3 t=1800000000.5 reason=stall pid=7\n"
        + thread.format(10)
        + "# rankscope capture id=None t=1800000001.0 reason=SIGTERM pid=7\n"
        + thread.format(11)
        + "Fatal Python error: Aborted\n\n"
        + thread.format(12)
        + "Fatal Python error: Something else broke\n\n"
        + thread.format(13)
    )
    summary = summarize_stacks(read_stacks([Source(path, "ranks/0/stacks.txt", rank=0)]))
    assert summary[["capture_id", "reason", "line"]].astype(object).values.tolist() == [
        [3, "stall", 10],
        [pd.NA, "SIGTERM", 11],
        [pd.NA, "SIGABRT", 12],
        [pd.NA, "fatal: Something else broke", 13],
    ]


def test_a_thread_importing_torch_distributed_is_not_the_blocked_one(tmp_path):
    # Seen on a loaded machine: the probe's warm-up thread still importing torch.distributed
    # modules when the watchdog's SIGUSR1 arrived, while the main thread sat in a barrier.
    path = tmp_path / "stacks.txt"
    path.write_text(
        "# rankscope capture id=1 t=1795291941.927052 reason=stall:no_progress pid=1 via=signal\n"
        "Thread 0x00007fcfe26256c0 (most recent call first):\n"
        '  File "/v/site-packages/torch/distributed/_functional_collectives.py", line 1325 in '
        "<module>\n"
        '  File "<frozen importlib._bootstrap>", line 241 in _call_with_frames_removed\n'
        '  File "/v/site-packages/torch/distributed/tensor/__init__.py", line 4 in <module>\n'
        '  File "/home/u/rankscope/probe/_core.py", line 700 in _warm_up\n\n'
        "Current thread 0x00007fd000000001 (most recent call first):\n"
        '  File "/v/site-packages/torch/distributed/distributed_c10d.py", line 5356 in barrier\n'
        '  File "/home/u/train.py", line 13 in validate\n'
        '  File "/home/u/train.py", line 22 in <module>\n'
    )
    summary = summarize_stacks(read_stacks([Source(path, "stacks.txt", rank=0)]))
    row = summary.iloc[0]
    assert (row["thread"], row["waiting_in"], row["site"]) == (
        "0x00007fd000000001",
        "barrier",
        "train.py:13",
    )
    assert row["capture_id"] == 1 and row["t_s"] == pytest.approx(1795291941.927052)


@pytest.mark.parametrize(
    ("path", "user"),
    [
        ("/home/u/train.py", True),
        ("train.py", True),
        ("<string>", True),
        ("<frozen runpy>", False),
        ("/usr/lib/python3.11/threading.py", False),
        ("threading.py", False),
        ("importlib/__init__.py", False),
        ("/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", False),
        ("torch/distributed/c10d_logger.py", False),
        ("/home/u/rankscope/src/rankscope/probe/_core.py", False),
        ("/opt/conda/lib/python3.11/site-packages/numpy/core.py", False),
        ("<eval_with_key>.3", False),  # torch.fx's generated graph code (torch.compile)
        ("<ipython-input-3-0a1b>", True),
        (None, False),
    ],
)
def test_is_user_file(path, user):
    assert is_user_file(path) is user


@pytest.mark.parametrize(
    ("path", "library"),
    [
        ("/v/lib/python3.11/site-packages/lightning/pytorch/loops/fit_loop.py", "lightning"),
        # a version the corpus never saw, in the folder's name: the same package
        ("/v/site-packages/lightning-9.9.9-py3.11.egg/lightning/pytorch/trainer.py", "lightning"),
        ("/v/site-packages/transformers-99.0.0/trainer.py", "transformers"),
        # a framework nobody told rankscope about is still a library, by its own name
        ("/v/dist-packages/newframework/loops/batch.py", "newframework"),
        ("/v/site-packages/six.py", "six"),
        ("<eval_with_key>.12", "torch"),
        ("<string>", None),
        ("/home/u/train.py", None),
    ],
)
def test_library_of_reads_any_package_and_version(path, library):
    assert library_of(path) == library


# --- errors -------------------------------------------------------------------------------------
def errors_of(folder: Path) -> pd.DataFrame:
    errors = load_run(folder).errors
    schema.validate("errors", errors)
    return errors


def test_catalogue_is_data_with_recipes():
    kinds = [s.kind for s in SIGNATURES]
    assert len(kinds) == len(set(kinds))
    for sig in SIGNATURES:
        assert re.fullmatch(r"D([1-9]|1\d|2[0-3])", sig.recipe or ""), sig.kind
        assert sig.doc


def test_detail_mismatch_fingerprints():
    errors = errors_of(DATA / "gloo_detail_mismatch" / "run")
    mismatch = errors[errors["kind"] == "collective_mismatch"].set_index("rank")
    assert set(mismatch.index) == {0, 1} and set(mismatch["recipe"]) == {"D19"}
    fields = mismatch.loc[0, "fields"]
    assert fields["op_type_a"] == "ALLGATHER" and fields["op_type_b"] == "ALLREDUCE"
    assert fields["rank_a"] == 0 and fields["rank_b"] == 1
    assert fields["seq_a"] == fields["seq_b"] == 1
    assert fields["shape_a"] == "[4]" and fields["dtypes_b"] == "Float"
    assert any("Op type" in d for d in fields["differences"])


def test_gloo_timeouts_and_child_failed():
    errors = errors_of(DATA / "gloo_timeout" / "run")
    timeouts = errors[errors["kind"] == "gloo_timeout"].set_index("rank")
    assert timeouts.loc[0, "fields"]["operation"] == "send"
    assert timeouts.loc[1, "fields"] == timeouts.loc[1, "fields"] | {
        "operation": "recv",
        "timeout_ms": 3000,
    }
    summary = errors[errors["kind"] == "torchrun_child_failed"]
    assert len(summary) == 1 and summary["source"].iloc[0] == "launcher.log"
    assert summary["fields"].iloc[0]["failures"] == {0: 1, 1: 1}
    # Copies of each timeout (error.json, the launcher's tee, the summary) are one row each.
    assert len(timeouts) == 2 and all(s.endswith("stderr.log") for s in timeouts["source"])
    assert timeouts["t_s"].notna().all()  # from the error.json copy


def test_connection_closed_and_root_cause():
    errors = errors_of(DATA / "gloo_rank_raises" / "run")
    closed = errors[errors["kind"] == "gloo_connection_closed"]
    assert list(closed["rank"]) == [0] and closed["fields"].iloc[0]["how"] == "closed"
    summary = errors[errors["kind"] == "torchrun_child_failed"].iloc[0]
    assert summary["rank"] == 1 and summary["fields"]["root_rank"] == 1
    assert summary["fields"]["exit_code"] == 1 and summary["fields"]["failures"] == {0: -15, 1: 1}
    assert summary["t_s"] > 0


def test_ddp_unused_parameters_and_monitored_barrier():
    ddp = errors_of(DATA / "ddp_unused" / "run")
    unused = ddp[ddp["kind"] == "ddp_unused_parameters"].set_index("rank")
    assert unused.loc[1, "fields"] == {"grad_rank": 1, "parameter_indices": [4, 5]}
    assert set(unused["recipe"]) == {"D8"}
    barrier = errors_of(DATA / "monitored_barrier" / "run")
    row = barrier[barrier["kind"] == "monitored_barrier"]
    assert len(row) == 1 and row["fields"].iloc[0]["failed_ranks"] == [1]
    assert row["fields"].iloc[0]["timeout_ms"] == 2000


def test_foreign_errors():
    errors = errors_of(FOREIGN)
    kinds = errors.groupby("kind", observed=True)["rank"].apply(lambda r: sorted(r.dropna()))
    assert kinds["nccl_watchdog_timeout"] == [0, 1, 3]
    assert kinds["cuda_oom"] == [2]
    watchdog = errors[errors["kind"] == "nccl_watchdog_timeout"].iloc[0]
    assert watchdog["fields"] == watchdog["fields"] | {
        "seq": 7,
        "op_type": "ALLREDUCE",
        "numel_in": 4096,
        "numel_out": 4096,
        "timeout_ms": 600000,
    }
    assert watchdog["t_s"] > 0
    child = errors[errors["kind"] == "torchrun_child_failed"].iloc[0]
    assert child["rank"] == 2 and child["fields"]["failures"] == {3: -6, 2: 1}
    by_kind = errors.set_index("kind")
    assert by_kind.loc["env_missing", "fields"] == {"variable": "RANK"}
    assert by_kind.loc["env_missing", "recipe"] == "D1"
    assert "port" in by_kind.loc["address_in_use", "fields"]
    assert by_kind.loc["invalid_device_ordinal", "recipe"] == "D3"
    warns = errors[errors["kind"] == "nccl_warn"]
    assert set(warns["rank"]) == {3} and len(warns) == 2


#: Real texts (from torch's and NCCL's sources and logs in public reports) and what they say of
#: the rank that logged them.
VICTIM_TEXTS = [
    (
        "  what():  [enforce fail at /pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:456] "
        "op.preamble.length <= op.nbytes. 10 vs 8. Received data size doesn't match expected "
        "size. Is there a distributed collective mismatch in your code?",
        "gloo_size_mismatch",
        "mismatch",
        {"got_bytes": 10, "expected_bytes": 8},
    ),
    (
        "terminate called after throwing an instance of 'gloo::EnforceNotMet'",
        "cpp_abort",
        "abort",
        {"exception": "gloo::EnforceNotMet"},
    ),
    (
        "[rank1]:[E1010 06:10:06.000 ProcessGroupNCCL.cpp:758] [Rank 1] To avoid data "
        "inconsistency, we are taking the entire process down.",
        "nccl_async_abort",
        "abort",
        {"reporting_rank": 1},
    ),
    (
        "[E ProcessGroupNCCL.cpp:852] [Rank 16] NCCL watchdog thread terminated with exception: "
        "NCCL error: remote process exited or there was a network error, NCCL version 2.19.3",
        "nccl_remote_error",
        "peer_exit",
        {},
    ),
    (
        "torch.distributed.DistBackendError: NCCL communicator was aborted on rank 1.",
        "nccl_comm_aborted",
        "abort",
        {"comm_rank": 1},
    ),
    (
        "[rank6]:[E703 21:51:54.112142364 ProcessGroupNCCL.cpp:1987] [PG ID 0 PG GUID "
        "0(default_pg) Rank 6] Received a dump signal due to a collective timeout from  rank 7 "
        "and we will try our best to dump the debug info. Last enqueued NCCL work: 56116, last "
        "completed NCCL work: 56116.This is most likely caused by incorrect usages",
        "nccl_dump_signal",
        "timeout",
        {"from_rank": 7, "last_enqueued": 56116, "last_completed": 56116},
    ),
    (
        "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
        "[127.0.0.1]:26835: Connection reset by peer",
        "gloo_connection_closed",
        "peer_exit",
        {"how": "reset"},
    ),
]


@pytest.mark.parametrize(("text", "kind", "role", "fields"), VICTIM_TEXTS)
def test_error_texts_say_whether_the_rank_is_a_victim(tmp_path, text, kind, role, fields):
    (tmp_path / "rank3.log").write_text(text + "\n")
    errors = find_errors(read_logs([tmp_path / "rank3.log"]))
    row = errors[errors["kind"] == kind].iloc[0]
    assert row["role"] == role
    assert row["fields"] == row["fields"] | fields


def test_every_signature_has_a_role():
    from rankscope.collect.signatures import ROLES

    assert {sig.role for sig in SIGNATURES} <= set(ROLES)


def test_find_errors_does_not_modify_its_input():
    logs = load_run(DATA / "gloo_timeout" / "run").logs
    before = logs.copy()
    find_errors(logs)
    pd.testing.assert_frame_equal(logs, before)


def test_signature_on_one_line(tmp_path):
    line = (
        "[rank4]:[E318 07:39:53.792630246 ProcessGroupNCCL.cpp:616] [Rank 4] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=610, OpType=COALESCED, NumelIn=56320, "
        "NumelOut=450560, Timeout(ms)=600000) ran for 600086 milliseconds before timing out."
    )
    (tmp_path / "log.txt").write_text(line + "\n")
    row = find_errors(read_logs([tmp_path / "log.txt"])).iloc[0]
    assert row["rank"] == 4 and row["kind"] == "nccl_watchdog_timeout"
    assert row["fields"]["seq"] == 610 and row["fields"]["op_type"] == "COALESCED"
    assert row["fields"]["ran_for_ms"] == 600086


def test_pickles_in_the_fixtures_are_plain():
    from rankscope.collect.safe_pickle import loads

    for path in [*HANG.glob("ranks/*/fr.pkl"), *FOREIGN.glob("nccl_trace_rank_*")]:
        assert loads(path.read_bytes()) == pickle.loads(path.read_bytes())


def test_fixtures_hold_no_path_of_the_machine_they_were_made_on():
    # the top-level folders of the build machine's paths (spelled out, this line would be one)
    machine = [b"/" + top + b"/" for top in (b"work", b"root", b"tmp")]
    for path in DATA.rglob("*"):
        if path.is_file() and path.suffix != ".py":
            data = path.read_bytes()
            assert not any(m in data for m in machine), path


def test_json_of_fields_is_serialisable():
    errors = errors_of(FOREIGN)
    json.dumps(errors["fields"].tolist())


def test_json_logging_in_stderr_is_not_a_stack_dump(tmp_path):
    path = tmp_path / "stderr.log"
    path.write_text('{"level": "info", "msg": "step 1"}\n{"level": "info", "msg": "step 2"}\n')
    problems = Problems()
    stacks = read_stacks([Source(path, "stderr.log", rank=0, stream="stderr")], problems=problems)
    assert stacks.empty and not problems.rows


def test_an_error_file_under_another_name(tmp_path):
    src = next((DATA / "gloo_rank_raises/run/logs").rglob("1/error.json"))
    path = tmp_path / "rank1_error.json"
    path.write_bytes(src.read_bytes())
    run = load_run(tmp_path)
    assert run.logs["text"].iloc[0] == "ValueError: corrupt shard on rank 1"
    assert set(run.logs["rank"]) == {1} and set(run.logs["stream"]) == {"error_file"}


def test_an_empty_nccl_file_is_not_a_problem(tmp_path):
    (tmp_path / "nccl.log").write_text("")
    problems = Problems()
    assert read_nccl([Source(tmp_path / "nccl.log", "nccl.log", rank=0)], problems=problems).empty
    assert not problems.rows
