"""The analyzer on tables built in the test: alignment helpers, every branch of diagnose(), the
Diagnosis contract (JSON keys, render, diagnosis.json) and the import boundary."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest

from rankscope import schema
from rankscope.analyze import (
    CAUSES,
    VERDICTS,
    Diagnosis,
    calls_from_flight_recorder,
    calls_from_probe,
    diagnose,
    find_divergences,
    group_members,
    write_diagnosis,
)
from rankscope.rundir import RunDir

T0 = 1_800_000_000.0


def call(rank: int, seq: int, op: str = "all_reduce", **kw: Any) -> dict[str, Any]:
    """One row of the probe's collectives table; completed unless ``done=False``."""
    done = kw.pop("done", True)
    t = kw.pop("t", T0 + seq)
    row = {
        "rank": rank,
        "coll_id": seq + 1,
        "pg": "0",
        "pg_desc": "default_pg",
        "pg_ranks": kw.pop("pg_ranks", "0,1,2"),
        "seq": seq,
        "op": op,
        "shapes": "[[4]]",
        "dtypes": '["float32"]',
        "file": "/home/user/train.py",
        "line": 10 + seq,
        "site": f"train.py:{10 + seq}",
        "t_start_s": t,
        "t_end_s": t + 0.01 if done else None,
        "completed": done,
        "ok": True if done else None,
    }
    row.update(kw)
    return row


def run_of(
    calls: list[dict[str, Any]] = (),
    *,
    exits: dict[int, int | None] | None = None,
    events: list[dict[str, Any]] = (),
    errors: list[dict[str, Any]] = (),
    stacks: list[dict[str, Any]] = (),
    world: int = 3,
    info: dict[str, Any] | None = None,
    fr: list[dict[str, Any]] = (),
    nodes: dict[int, str] | None = None,
) -> SimpleNamespace:
    """A stand-in for a collect Run: the tables diagnose() reads, built with schema.conform.
    ``nodes``: the SLURM node of each rank."""
    exits = {r: 0 for r in range(world)} if exits is None else exits
    ranks = [
        {
            "rank": r,
            "world_size": world,
            "exit_code": c,
            "ended_s": T0 + 100 if c is not None else None,
            "node": (nodes or {}).get(r),
        }
        for r, c in exits.items()
    ]
    starts = [{"rank": r, "ev": "start", "t_s": T0} for r in exits]
    return SimpleNamespace(
        collectives=schema.conform("collectives", pd.DataFrame(list(calls))),
        ranks=schema.conform("ranks", pd.DataFrame(ranks)),
        events=schema.conform("events", pd.DataFrame(starts + list(events))),
        errors=schema.conform("errors", pd.DataFrame(list(errors))),
        stack_summary=schema.conform("stack_summary", pd.DataFrame(list(stacks))),
        flight_recorder=schema.conform("flight_recorder", pd.DataFrame(list(fr))),
        info=info or {},
        path=None,
    )


def steps(ranks: range, n: int) -> list[dict[str, Any]]:
    return [call(r, s) for r in ranks for s in range(1, n + 1)]


# --- alignment helpers ------------------------------------------------------------------------
def test_probe_calls_count_collectives_only_per_group():
    rows = [
        call(0, 1, op="init_process_group", pg=None),
        call(0, 1),
        call(0, 2, op="send", peer="1"),
        call(0, 3),
        call(0, 4, op="destroy_process_group"),
        call(1, 1),
        call(1, 2, op="recv", peer="0"),
        call(1, 3),
    ]
    calls = calls_from_probe(schema.conform("collectives", pd.DataFrame(rows)))
    coll = calls[calls["seq"].notna()]
    # seq is the n-th collective on the group, whatever the probe's own count said (older
    # events counted the point-to-point calls too)
    assert coll[["rank", "seq"]].values.tolist() == [[0, 1], [0, 2], [1, 1], [1, 2]]
    p2p = calls[calls["seq"].isna()]
    assert p2p["op"].tolist() == ["send", "recv"] and p2p["peer"].tolist() == [1, 0]
    assert p2p["p2p_seq"].tolist() == [1, 1]
    # Same op, shapes and dtypes: same key.
    assert coll["key"].nunique() == 1


def test_find_divergences_names_the_first_position_and_the_missing_rank():
    rows = [*steps(range(3), 3), call(0, 4, done=False), call(1, 4, done=False)]
    calls = calls_from_probe(schema.conform("collectives", pd.DataFrame(rows)))
    members = group_members(calls)
    assert members == {"0": (0, 1, 2)}
    (d,) = find_divergences(calls, members=members, ranks={0, 1, 2}, complete={0, 1, 2})
    assert (d.pg, d.seq, d.missing, d.present, d.mismatched) == ("0", 4, (2,), (0, 1), False)


def test_find_divergences_compares_a_ring_buffer_only_where_every_rank_has_records():
    # Rank 1's buffer forgot collectives 1-2; that is not a divergence. Rank 2 differs at 5.
    entries = []
    for rank in range(3):
        for seq in range(3 if rank == 1 else 1, 6):
            entries.append(
                fr_entry(rank, seq, op="all_gather" if (rank, seq) == (2, 5) else "all_reduce")
            )
    calls = calls_from_flight_recorder(schema.conform("flight_recorder", pd.DataFrame(entries)))
    (d,) = find_divergences(calls, members={"0": (0, 1, 2)}, ranks={0, 1, 2}, complete={0, 2})
    assert (d.seq, d.mismatched, d.missing) == (5, True, ())


def fr_entry(
    rank: int, seq: int, *, op: str = "all_reduce", done: bool = True, **kw: Any
) -> dict[str, Any]:
    row = {
        "rank": rank,
        "source": f"nccl_trace_rank_{rank}",
        "version": "2.10",
        "pg_name": "0",
        "pg_desc": "default_pg",
        "pg_ranks": "0,1,2",
        "record_id": seq - 1,
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "profiling_name": f"nccl:{op}",
        "backend": "nccl",
        "op": op,
        "is_p2p": False,
        "input_sizes": "[[4]]",
        "input_dtypes": '["Float"]',
        "output_sizes": "[[4]]",
        "output_dtypes": '["Float"]',
        "state": "completed" if done else "started",
        "time_created_ns": int((T0 + seq) * 1e9),
        "retired": done,
    }
    row.update(kw)
    return row


def test_flight_recorder_calls_keep_the_latest_dump_and_map_p2p_peers_to_global_ranks():
    old = [fr_entry(0, 1, source="evidence/capture-1/rank0.fr.pkl")]
    new = [fr_entry(0, 1), fr_entry(0, 2)]
    p2p = fr_entry(
        0,
        2,
        op="recv",
        profiling_name="nccl:recv 0<-1",
        is_p2p=True,
        p2p_seq_id=1,
        record_id=2,
        pg_name="1",
        pg_ranks="4,6",
        done=False,
    )
    # A coalesced group: two entries that share one collective_seq_id count once.
    coalesced = fr_entry(0, 2, record_id=3, input_sizes="[[8]]")
    table = schema.conform("flight_recorder", pd.DataFrame([*old, *new, coalesced, p2p]))
    calls = calls_from_flight_recorder(table)
    assert calls[calls["seq"].notna()][["seq", "order"]].values.tolist() == [[1, 0], [2, 1]]
    recv = calls[calls["seq"].isna()].iloc[0]
    assert (recv["op"], recv["peer"], recv["p2p_seq"], bool(recv["completed"])) == (
        "recv",
        6,
        1,
        False,
    )


# --- diagnose() on tables ---------------------------------------------------------------------
def test_clean_tables_are_ok_with_no_culprit():
    d = diagnose(run_of(steps(range(3), 3)))
    assert (d.verdict, d.cause, d.culprit_ranks, d.waiting_ranks, d.recipe) == (
        "ok",
        None,
        [],
        [],
        None,
    )
    assert d.collective is None and "All 3 ranks exited 0" in d.summary


def test_rooted_collectives_may_pass_different_tensors():
    # gather: only the destination passes the list of outputs; that is not a shape mismatch.
    rows = steps(range(3), 1) + [
        call(r, 2, op="gather", shapes="[[4], [4], [4], [4]]" if r == 0 else "[[4]]")
        for r in range(3)
    ]
    assert diagnose(run_of(rows)).verdict == "ok"


def test_minority_op_is_the_culprit():
    rows = [
        *steps(range(3), 2),
        call(0, 3, done=False),
        call(1, 3, op="all_gather", done=False, site="train.py:40"),
        call(2, 3, done=False),
    ]
    d = diagnose(run_of(rows, exits=dict.fromkeys(range(3))))
    assert (d.verdict, d.cause, d.recipe) == ("hang", "op_mismatch", "D19")
    assert (d.culprit_ranks, d.waiting_ranks) == ([1], [0, 2])
    c = d.collective
    assert (c.pg, c.seq, c.pg_ranks) == ("0", 3, [0, 1, 2])
    assert c.op_by_rank == {0: "all_reduce", 1: "all_gather", 2: "all_reduce"}
    assert c.site_by_rank == {0: "train.py:13", 1: "train.py:40", 2: "train.py:13"}


def test_with_two_ranks_the_call_never_made_before_is_the_odd_one():
    # 1 against 1: the all_gather is new on this group, the all_reduce is what both did before.
    rows = [
        *steps(range(2), 2),
        call(0, 3, op="all_gather", done=False, pg_ranks="0,1"),
        call(1, 3, done=False, pg_ranks="0,1"),
    ]
    rows = [dict(r, pg_ranks="0,1") for r in rows]
    d = diagnose(run_of(rows, exits={0: None, 1: None}, world=2))
    assert (d.cause, d.culprit_ranks, d.waiting_ranks) == ("op_mismatch", [0], [1])


def test_shape_and_dtype_mismatches():
    base = steps(range(3), 1)
    shape = base + [call(r, 2, done=False, shapes="[[5]]" if r == 2 else "[[4]]") for r in range(3)]
    d = diagnose(run_of(shape, exits=dict.fromkeys(range(3))))
    assert (d.cause, d.culprit_ranks, d.collective.shapes_by_rank[2]) == (
        "shape_mismatch",
        [2],
        "[[5]]",
    )
    dtype = base + [
        call(r, 2, done=False, dtypes='["bfloat16"]' if r == 0 else '["float32"]') for r in range(3)
    ]
    d = diagnose(run_of(dtype, exits=dict.fromkeys(range(3))))
    assert (d.cause, d.culprit_ranks, d.recipe) == ("dtype_mismatch", [0], "D19")


def test_a_barrier_on_one_side_is_a_rank_conditional_collective():
    rows = [
        *steps(range(3), 2),
        call(0, 3, op="barrier", shapes="[]", dtypes="[]", done=False, site="train.py:30"),
        call(1, 3, done=False),
        call(2, 3, done=False),
    ]
    d = diagnose(run_of(rows, exits=dict.fromkeys(range(3))))
    assert (d.verdict, d.cause, d.recipe, d.culprit_ranks, d.waiting_ranks) == (
        "hang",
        "rank_conditional_collective",
        "D21",
        [0],
        [1, 2],
    )


def test_a_rank_that_exited_0_is_the_culprit_even_if_torchrun_names_another():
    rows = [
        *steps(range(2), 3),
        call(
            0,
            4,
            done=True,
            ok=False,
            error="RuntimeError: Connection closed by peer",
            pg_ranks="0,1",
        ),
    ]
    rows = [dict(r, pg_ranks="0,1") for r in rows]
    events = [
        {
            "rank": 0,
            "ev": "exception",
            "t_s": T0 + 9,
            "message": "RuntimeError: Connection closed by peer",
        }
    ]
    errors = [
        {"rank": 0, "kind": "gloo_connection_closed", "message": "Connection closed by peer"},
        {
            "kind": "torchrun_child_failed",
            "message": "ChildFailedError",
            "fields": {"root_rank": 0},
        },
    ]
    d = diagnose(run_of(rows, exits={0: 1, 1: 0}, events=events, errors=errors, world=2))
    assert (d.verdict, d.cause, d.recipe) == ("hang", "early_exit", "D9")
    assert (d.culprit_ranks, d.waiting_ranks, d.collective.seq) == ([1], [0], 4)
    assert any("torchrun" in n and "rank 0" in n for n in d.notes)


def test_a_rank_caught_in_the_probe_s_exit_handler_has_left():
    # Rank 1's script returned; the stall capture found it writing its final dumps.
    rows = [dict(r, pg_ranks="0,1") for r in steps(range(2), 3)] + [
        call(0, 4, done=False, pg_ranks="0,1")
    ]
    run = run_of(rows, exits={0: -15, 1: -15}, world=2, info={"stop_reason": "stall"})
    run.stacks = schema.conform(
        "stacks",
        pd.DataFrame(
            [
                {
                    "rank": 1,
                    "capture_id": 1,
                    "depth": 0,
                    "func": "capture",
                    "file": "/x/rankscope/probe/_core.py",
                },
                {
                    "rank": 1,
                    "capture_id": 1,
                    "depth": 1,
                    "func": "end",
                    "file": "/x/rankscope/probe/_core.py",
                },
                {"rank": 0, "capture_id": 1, "depth": 0, "func": "<module>", "file": "/x/train.py"},
            ]
        ),
    )
    d = diagnose(run)
    assert (d.cause, d.culprit_ranks, d.waiting_ranks) == ("early_exit", [1], [0])
    assert "finished its script" in d.reason


def test_an_exception_outside_collectives_is_a_crash():
    rows = [*steps(range(2), 1), call(0, 2, done=False)]
    rows = [dict(r, pg_ranks="0,1") for r in rows]
    events = [{"rank": 1, "ev": "exception", "t_s": T0 + 2, "message": "ValueError: bad shard"}]
    d = diagnose(run_of(rows, exits={0: None, 1: 1}, events=events, world=2))
    assert (d.verdict, d.cause, d.recipe, d.culprit_ranks, d.waiting_ranks) == (
        "crash",
        "rank_crashed",
        "D20",
        [1],
        [0],
    )
    assert d.collective.seq == 2 and d.collective.op_by_rank == {0: "all_reduce", 1: None}
    for text, cause in (
        ("FloatingPointError: loss is nan", "nan"),
        ("torch.OutOfMemoryError: CUDA out of memory", "oom"),
    ):
        events = [{"rank": 1, "ev": "exception", "t_s": T0 + 2, "message": text}]
        assert diagnose(run_of(rows, exits={0: None, 1: 1}, events=events, world=2)).cause == cause


@pytest.mark.parametrize(
    ("kind", "cause", "recipe"),
    [
        ("env_missing", "env_contract_missing", "D1"),
        ("address_in_use", "address_in_use", "D4"),
        ("invalid_device_ordinal", "invalid_device_ordinal", "D3"),
    ],
)
def test_launch_errors(kind, cause, recipe):
    errors = [{"rank": 1, "kind": kind, "message": f"the {kind} text", "t_s": T0}]
    d = diagnose(run_of([], exits={0: 1, 1: 1}, errors=errors, world=2))
    assert (d.verdict, d.cause, d.recipe, d.culprit_ranks) == ("launch_error", cause, recipe, [1])


def test_error_kinds_that_are_a_rank_s_own_failure():
    rows = [dict(r, pg_ranks="0,1") for r in steps(range(2), 2)]
    errors = [
        {
            "rank": 1,
            "kind": "ddp_unused_parameters",
            "message": "Expected to have finished reduction",
        }
    ]
    d = diagnose(run_of(rows, exits={0: 1, 1: 1}, errors=errors, world=2))
    assert (d.verdict, d.cause, d.recipe, d.culprit_ranks) == (
        "crash",
        "ddp_unused_parameters",
        "D8",
        [1],
    )


def test_a_rank_without_evidence_is_named_when_the_others_wait():
    rows = [*steps(range(2), 1), call(0, 2, done=False), call(1, 2, done=False)]
    run = run_of(rows, exits={0: None, 1: None}, world=3)
    d = diagnose(run)
    assert (d.verdict, d.cause, d.culprit_ranks, d.waiting_ranks) == (
        "hang",
        "silent_rank",
        [2],
        [0, 1],
    )
    assert any("rank 2" in m for m in d.missing)


def test_every_rank_in_the_same_collective_is_stuck_below_python():
    rows = steps(range(3), 1) + [call(r, 2, done=False) for r in range(3)]
    d = diagnose(run_of(rows, exits=dict.fromkeys(range(3))))
    assert (d.verdict, d.cause, d.culprit_ranks, d.waiting_ranks) == (
        "hang",
        "stuck_collective",
        [],
        [0, 1, 2],
    )
    assert d.collective.seq == 2


def test_a_rank_alive_outside_collectives_while_others_wait():
    """Its stacks show it outside every collective, waiting on nothing: it computes (never a
    rank-conditional call on that alone)."""
    rows = [*steps(range(3), 2), call(0, 3, done=False), call(1, 3, done=False)]
    stacks = [{"rank": 2, "capture_id": 1, "site": "train.py:77", "func": "evaluate"}]
    d = diagnose(run_of(rows, exits=dict.fromkeys(range(3)), stacks=stacks))
    assert (d.cause, d.culprit_ranks, d.waiting_ranks) == (
        "busy_outside",
        [2],
        [0, 1],
    )
    assert d.collective.site_by_rank[2] == "train.py:77"
    assert any(ref.table == "stack_summary" and ref.rank == 2 for ref in d.evidence)


def test_a_point_to_point_cycle():
    rows = [dict(r, pg_ranks="0,1") for r in steps(range(2), 1)]
    rows += [call(r, 2, op="recv", peer=str(1 - r), done=False, pg_ranks="0,1") for r in range(2)]
    d = diagnose(run_of(rows, exits={0: None, 1: None}, world=2))
    assert (d.verdict, d.cause, d.culprit_ranks) == ("hang", "p2p_cycle", [0, 1])
    assert d.collective.op_by_rank == {0: "recv", 1: "recv"}


def test_a_late_rank_in_a_completed_job_is_a_straggler():
    rows = steps(range(3), 3)
    rows = [dict(r, t_start_s=T0 + 2 + 3.0) if (r["rank"], r["seq"]) == (1, 2) else r for r in rows]
    d = diagnose(run_of(rows))
    assert (d.verdict, d.cause, d.recipe, d.culprit_ranks, d.waiting_ranks) == (
        "ok",
        "straggler",
        "D23",
        [1],
        [0, 2],
    )
    assert d.collective.seq == 2 and "3.0 s" in d.reason
    assert diagnose(run_of(rows), straggler_s=5).cause is None


def test_timeouts_in_logs_alone_say_hang():
    errors = [
        {"rank": r, "kind": "gloo_timeout", "message": "Timed out waiting 8000ms"} for r in (0, 1)
    ]
    d = diagnose(run_of([], exits={0: 1, 1: 1}, errors=errors, world=2))
    assert (d.verdict, d.cause, d.waiting_ranks, d.culprit_ranks) == (
        "hang",
        "collective_timeout",
        [0, 1],
        [],
    )


def test_detail_fingerprints_in_logs_alone_name_the_odd_rank():
    def fp(a: int, op_a: str, b: int, op_b: str) -> dict[str, Any]:
        return {
            "rank_a": a,
            "op_type_a": op_a,
            "seq_a": 3,
            "rank_b": b,
            "op_type_b": op_b,
            "seq_b": 3,
        }

    errors = [
        {
            "rank": 0,
            "kind": "collective_mismatch",
            "message": "Detected mismatch",
            "fields": fp(0, "ALLREDUCE", 2, "ALLGATHER"),
        },
        {
            "rank": 1,
            "kind": "collective_mismatch",
            "message": "Detected mismatch",
            "fields": fp(1, "ALLREDUCE", 2, "ALLGATHER"),
        },
    ]
    d = diagnose(run_of([], exits={0: 1, 1: 1, 2: 1}, errors=errors))
    assert (d.verdict, d.cause, d.culprit_ranks, d.waiting_ranks) == (
        "hang",
        "op_mismatch",
        [2],
        [0, 1],
    )
    assert d.collective.op_by_rank == {0: "ALLREDUCE", 1: "ALLREDUCE", 2: "ALLGATHER"}
    assert d.collective.seq == 3


def test_monitored_barrier_in_logs_alone_names_the_late_rank():
    errors = [
        {
            "rank": 0,
            "kind": "monitored_barrier",
            "message": "Rank 1 failed to pass monitoredBarrier",
            "fields": {"failed_ranks": [1]},
        }
    ]
    d = diagnose(run_of([], exits={0: 1, 1: -15}, errors=errors, world=2))
    assert (d.verdict, d.cause, d.culprit_ranks, d.waiting_ranks) == (
        "hang",
        "lagging_rank",
        [1],
        [0],
    )


def test_nothing_to_diagnose_is_an_error():
    empty = SimpleNamespace(path="/nowhere")
    with pytest.raises(ValueError, match="nothing to diagnose in /nowhere"):
        diagnose(empty)


def test_error_kinds_used_here_are_in_the_collectors_catalogue():
    from rankscope.analyze.causes import FAILURE_KINDS, LAUNCH_KINDS
    from rankscope.analyze.evidence import WAITER_KINDS
    from rankscope.collect import SIGNATURES

    known = {sig.kind for sig in SIGNATURES}
    assert {*LAUNCH_KINDS, *FAILURE_KINDS, *WAITER_KINDS} <= known


def test_bad_arguments():
    with pytest.raises(ValueError, match="straggler_s"):
        diagnose(run_of([]), straggler_s=0)


def test_thousands_of_ranks_with_half_of_them_gone():
    """4096 ranks x 30 collectives; ranks 2048-4095 leave after 29. Nothing here may take time
    per rank per row (a quadratic step would blow the test's time limit)."""
    world, steps_n = 4096, 30
    rank = np.repeat(np.arange(world), steps_n)
    seq = np.tile(np.arange(1, steps_n + 1), world)
    keep = ~((rank >= world // 2) & (seq == steps_n))
    rank, seq = rank[keep], seq[keep]
    flying = seq == steps_n
    table = pd.DataFrame(
        {
            "rank": rank,
            "coll_id": seq + 1,
            "pg": pd.Categorical.from_codes(np.zeros(len(rank), dtype=np.int8), ["0"]),
            # The members once: a 4096-rank text on every row would be 2 GB of the same.
            "pg_ranks": [",".join(map(str, range(world)))] + [None] * (len(rank) - 1),
            "seq": seq,
            "op": "all_reduce",
            "shapes": "[[4]]",
            "dtypes": '["float32"]',
            "site": "train.py:9",
            "t_start_s": T0 + seq,
            "completed": ~flying,
            "ok": np.where(flying, None, True),
        }
    )
    run = run_of([], exits={r: 0 if r >= world // 2 else None for r in range(world)}, world=world)
    run.collectives = schema.conform("collectives", table)
    d = diagnose(run)
    assert (d.cause, d.collective.seq) == ("early_exit", steps_n)
    assert d.culprit_ranks == list(range(world // 2, world))
    assert d.waiting_ranks == list(range(world // 2))
    assert "ranks 2048-4095 exited with code 0 after 29 collectives" in d.reason
    assert len(d.render().splitlines()) < 12


# --- the contract -----------------------------------------------------------------------------
def test_every_cause_has_a_verdict_and_a_fix():
    for name, cause in CAUSES.items():
        assert cause.name == name and cause.verdict in VERDICTS and cause.fix
        assert cause.recipe is None or (cause.recipe[0] == "D" and 1 <= int(cause.recipe[1:]) <= 23)


def test_json_contract_render_and_file(tmp_path):
    rows = [*steps(range(3), 2), call(0, 3, done=False), call(1, 3, done=False)]
    d = diagnose(run_of(rows, exits=dict.fromkeys(range(3))))
    data = d.to_dict()
    for key in (
        "verdict",
        "cause",
        "culprit_ranks",
        "waiting_ranks",
        "recipe",
        "summary",
        "collective",
    ):
        assert key in data
    assert set(data["collective"]) >= {"pg", "pg_ranks", "seq", "op_by_rank", "site_by_rank"}
    assert data["collective"]["op_by_rank"] == {"0": "all_reduce", "1": "all_reduce", "2": None}
    assert json.loads(json.dumps(data)) == data
    text = d.render()
    assert (
        text.splitlines()[0].startswith("HANG") and "ranks 0-1: all_reduce at train.py:13" in text
    )
    run = RunDir(tmp_path)
    path = write_diagnosis(run, d)
    assert path == run.diagnosis_json and json.loads(path.read_text())["culprit_ranks"] == [2]
    assert isinstance(d, Diagnosis)


@pytest.mark.slow
def test_analyze_imports_without_plotting_or_widgets():
    code = (
        "import sys; sys.modules['plotly'] = None; sys.modules['ipywidgets'] = None\n"
        "import rankscope.analyze as a; print(a.diagnose.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "diagnose"


# --- honest verdicts (deaths, victims, unknown) -------------------------------------------------
def _no_question_marks(d: Diagnosis) -> None:
    text = d.render() + json.dumps(d.to_dict(), default=str)
    assert " ?" not in text and "at ?" not in text and "?," not in text, text


def test_a_rank_killed_between_steps_is_never_ok():
    """Every call completed, nothing was in flight; one rank died of SIGKILL and torchrun ended
    the rest with SIGTERM (each leaving its end event): a crash, named, not 'ok'."""
    rows = steps(range(4), 3)
    events = [
        {"rank": r, "ev": "end", "t_s": T0 + 9, "code": -15, "message": "SIGTERM"}
        for r in (0, 1, 3)
    ]
    ranks = {0: -15, 1: -15, 2: -9, 3: -15}
    d = diagnose(
        run_of([dict(r, pg_ranks="0,1,2,3") for r in rows], exits=ranks, events=events, world=4)
    )
    assert (d.verdict, d.cause, d.recipe, d.culprit_ranks) == ("crash", "rank_killed", "D20", [2])
    assert "SIGKILL" in d.reason and "ranks 0-1, 3" in d.reason
    assert any("rank 2" in m and "SIGKILL" in m for m in d.missing), d.missing
    _no_question_marks(d)


def test_a_signal_death_that_a_peers_mismatch_explains_is_not_the_culprit():
    """A rank aborted by gloo (it received more bytes than it expected) is a victim; the rank
    whose call differs is the culprit."""
    rows = steps(range(3), 2)
    rows += [call(0, 3, done=False), call(1, 3, shapes="[[5]]", ok=False), call(2, 3, done=False)]
    errors = [
        {
            "rank": 2,
            "kind": "gloo_size_mismatch",
            "message": "Received data size doesn't match expected size",
        }
    ]
    d = diagnose(run_of(rows, exits={0: -15, 1: 1, 2: -6}, errors=errors))
    assert (d.cause, d.culprit_ranks, d.collective.seq) == ("shape_mismatch", [1], 3)
    note = next(n for n in d.notes if n.startswith("rank 2 "))
    assert "SIGABRT" in note and "Received data size doesn't match expected size" in note
    assert "gloo_size_mismatch" not in note  # the error's words, not the key of its text
    _no_question_marks(d)


def test_every_rank_terminated_with_no_failure_is_unknown_not_ok():
    rows = steps(range(2), 2)
    d = diagnose(run_of(rows, exits={0: -15, 1: -15}, world=2))
    assert (d.verdict, d.cause, d.culprit_ranks) == ("unknown", None, [])
    assert "SIGTERM" in d.summary and "does not show why" in d.summary
    # the same job stopped by rankscope is over because it was stopped: no mystery
    stopped = diagnose(run_of(rows, exits={0: -15, 1: -15}, world=2, info={"stop_reason": "user"}))
    assert stopped.verdict == "ok" and "stopped" in stopped.summary


def test_a_bare_exit_code_is_a_failure_only_when_nothing_else_explains():
    rows = steps(range(2), 2)
    d = diagnose(run_of(rows, exits={0: 0, 1: 3}, world=2))
    assert (d.verdict, d.cause, d.culprit_ranks) == ("crash", "rank_crashed", [1])
    assert "exit code 3" in d.reason
    _no_question_marks(d)


def test_absence_is_known_only_from_a_whole_record():
    """A rank whose record is whole (a ring, an end event) 'never called' a collective; one
    whose record may stop early has 'no record of it'."""
    rows = [*steps(range(3), 2), call(0, 3, done=False), call(1, 3, done=False)]
    stacks = [{"rank": 2, "capture_id": 1, "site": "train.py:77", "func": "evaluate"}]
    partial = run_of(rows, exits=dict.fromkeys(range(3)), stacks=stacks)
    d = diagnose(partial)
    assert d.collective.state_by_rank[2].startswith("no record of it"), d.collective.state_by_rank
    whole = run_of(rows, exits=dict.fromkeys(range(3)), stacks=stacks)
    whole.ranks = whole.ranks.assign(ring=pd.array([True] * 3, dtype="boolean"))
    d = diagnose(whole)
    assert d.collective.state_by_rank[2].startswith("never called it"), d.collective.state_by_rank
    assert json.loads(json.dumps(d.to_dict()))["collective"]["state_by_rank"]["2"].startswith(
        "never called it"
    )


def test_nothing_readable_is_unknown():
    run = run_of([], exits={}, world=0)
    run.problems = schema.conform(
        "problems",
        pd.DataFrame(
            {"source": ["rank0.pkl"], "reader": ["flight_recorder"], "reason": ["truncated"]}
        ),
    )
    run.events = schema.empty("events")
    d = diagnose(run)
    assert d.verdict == "unknown" and d.missing == ["could not read rank0.pkl: truncated"]


def test_ddp_s_texts_name_the_rank_whose_model_differs():
    """Every rank raises in DDP's constructor; the counts in the texts make rank 2 the odd one."""
    from rankscope.collect import find_errors

    texts = {
        0: "RuntimeError: DDP expects same model across all ranks, but Rank 0 has 4 params, "
        "while rank 2 has inconsistent 6 params.",
        1: "RuntimeError: DDP expects same model across all ranks, but Rank 1 has 4 params, "
        "while rank 2 has inconsistent 6 params.",
        2: "RuntimeError: DDP expects same model across all ranks, but Rank 2 has 6 params, "
        "while rank 0 has inconsistent 4 params.",
    }
    logs = schema.conform(
        "logs",
        pd.DataFrame(
            {
                "rank": list(texts),
                "text": list(texts.values()),
                "source": "stderr.log",
                "line_no": 1,
            }
        ),
    )
    errors = find_errors(logs).to_dict("records")
    d = diagnose(run_of([], exits={0: 1, 1: 1, 2: 1}, errors=errors))
    assert (d.verdict, d.cause, d.culprit_ranks) == ("crash", "ddp_model_mismatch", [2])
    assert "6 parameters where ranks 0-1 have 4 parameters" in d.reason
    # two ranks, one count each: the texts cannot tell which model is the odd one
    pair = [
        dict(errors[0], fields={"rank_a": 0, "count_a": 4, "rank_b": 2, "count_b": 6}),
        dict(errors[2], fields={"rank_a": 2, "count_a": 6, "rank_b": 0, "count_b": 4}),
    ]
    tied = diagnose(run_of([], exits={0: 1, 2: 1}, errors=pair, world=3))
    assert tied.cause != "ddp_model_mismatch"


def test_an_exception_whose_text_makes_a_rank_a_victim_is_not_its_crash():
    """DDP's bucket all_reduce, from C++, fails in ranks 0 and 1 when rank 2 exits: their
    exception is raised outside any Python call, by a text whose role (a peer's exit) makes
    them victims. They are not the culprits of a crash."""
    rows = [dict(r, pg_ranks="0,1,2") for r in steps(range(3), 2)]
    text = (
        "RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:20632"
    )
    events = [{"rank": r, "ev": "exception", "t_s": T0 + 3, "message": text} for r in (0, 1)]
    errors = [
        {"rank": r, "kind": "gloo_connection_closed", "role": "peer_exit", "message": text}
        for r in (0, 1)
    ]
    d = diagnose(run_of(rows, exits={0: 1, 1: 1, 2: 0}, events=events, errors=errors))
    assert not {0, 1} & set(d.culprit_ranks), d.render()
    assert d.cause != "rank_crashed", d.render()
    # The exception's own text says so where the logs do not hold it: torchrun's SIGTERM
    # ended them while their traceback was being printed, so no line of it reached the logs.
    d = diagnose(run_of(rows, exits={0: -15, 1: -15, 2: 0}, events=events))
    assert not {0, 1} & set(d.culprit_ranks), d.render()


@pytest.mark.parametrize("run", [1, 3, 50, 1000])
def test_per_group_min_and_max_are_those_of_the_rows_in_runs_or_not(run):
    """Rows in runs of one group (reduced a run at a time) or scattered: each group's minimum
    and maximum are its rows' own; a group without rows gets lo > hi."""
    from rankscope.analyze.align import _min_max

    rng = np.random.default_rng(run)
    groups = np.repeat(rng.integers(0, 6, size=4000 // run), run)
    values = rng.integers(-(2**40), 2**40, size=len(groups))
    lo, hi = _min_max(groups, values, 8)
    for g in range(8):
        mine = values[groups == g]
        if len(mine):
            assert (lo[g], hi[g]) == (mine.min(), mine.max())
        else:
            assert lo[g] > hi[g]


def test_a_rank_late_to_its_first_call_took_longer_to_start_and_is_no_straggler():
    """Arrival at a rank's first collective measures its start-up (imports, the model, the
    load of the machine): 3 s there is no straggler; 3 s at the second call is."""
    rows = steps(range(3), 3)
    first = [
        dict(r, t_start_s=T0 + 1 + 3.0) if (r["rank"], r["seq"]) == (1, 1) else r for r in rows
    ]
    assert diagnose(run_of(first)).cause is None
    later = [
        dict(r, t_start_s=T0 + 2 + 3.0) if (r["rank"], r["seq"]) == (1, 2) else r for r in rows
    ]
    d = diagnose(run_of(later))
    assert (d.cause, d.culprit_ranks) == ("straggler", [1]), d.render()
