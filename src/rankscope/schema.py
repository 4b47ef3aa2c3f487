"""Column names and dtypes of every table rankscope produces, declared once.

Readers build a frame, then call :func:`conform` (cast and order the columns) at the end; tests and
consumers call :func:`validate`. Conventions: snake_case, units as suffixes (``_s`` seconds since
the epoch or durations, ``_ns``, ``_ms``), nullable ``Int64``/``boolean``/``string`` instead of
sentinels, ``category`` for repeated strings, upstream names kept where they exist (the flight
recorder's ``collective_seq_id``, ``profiling_name``, ``state``, ...).

This module imports nothing from rankscope.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import pandas as pd

Columns = Mapping[str, str]

#: Per-rank facts: identity, process, exit. One row per rank seen anywhere in the evidence.
RANKS: Columns = {
    "rank": "Int64",
    "pid": "Int64",
    "host": "string",
    "node": "string",  # the SLURM node it ran on (SLURMD_NODENAME); null outside SLURM
    "local_rank": "Int64",
    "group_rank": "Int64",
    "world_size": "Int64",
    "started_s": "Float64",
    "ended_s": "Float64",
    # negative: killed by that signal (-9 SIGKILL). The launcher's, else the probe's end event,
    # else the fatal signal a faulthandler dump of the rank names (it re-raises that signal).
    "exit_code": "Int64",
    "signal": "string",  # the signal's name when exit_code is negative: SIGKILL, SIGTERM, ...
    "end_reason": "string",  # the probe's end event: exit, exception, os._exit, SIGTERM, ...
    "last_event_s": "Float64",  # the rank's last recorded event or call (ring included)
    "ring": "boolean",  # its calls were recorded durably (a ring file): none is missing
    "main_thread": "string",  # its main thread's ident, "0x00007f..." (as in stacks, calls)
    # How it ended: its end event's "how" (returned, sys_exit, exception, os._exit, SIGTERM, ...;
    # rankscope.rundir.EVENT_KINDS), else the signal it died of (SIGABRT, SIGKILL, ...).
    "end_how": "string",
    # "train.py:12": the user's innermost frame where it ended (the stacks the end or the fatal
    # signal left, whose reason is end_how); null for a script that returned.
    "end_site": "string",
    # The last non-empty line the rank printed itself: stdout's, else stderr's; not tracebacks,
    # faulthandler dumps, warnings, torch's, NCCL's or rankscope's own lines.
    "last_output": "string",
    # How it ended in one word and in words (rankscope.state.RankEnd: status, words): "aborted",
    # "aborted itself: SIGABRT (-6)"; null while it has not ended.
    "status": "string",
    "end": "string",
    # In a cell session (rankscope.cells), its latest cell as its cell events say: N of the
    # cell, the session's number for that run of it, where it stands (RankRecord.cell_state:
    # running, finished, raised, threads) and when that was written; where it raised, what
    # and at which line of the cell ("ValueError: bad batch", "<cell 7>:3"). Null outside a
    # cell session.
    "cell": "Int64",
    "cell_run": "Int64",
    "cell_state": "string",
    "cell_s": "Float64",
    "cell_error": "string",
    "cell_error_site": "string",
}

#: The probe's events, one row per line of ranks/<rank>/events.jsonl.
EVENTS: Columns = {
    "rank": "Int64",
    "ev": "category",  # start heartbeat enter exit done step exception capture end cell
    "t_s": "Float64",
    "coll_id": "Int64",  # enter/exit: the rank's call counter
    "op": "category",
    "pg": "category",
    "seq": "Int64",  # cell: the session's number for this run of the cell (its "run")
    "step": "Int64",  # cell: N of the cell (its file <cell N>)
    "done": "Int64",  # heartbeat: collectives completed so far; cell end: threads left running
    "ok": "boolean",  # exit: the call returned normally; cell end: the cell did not raise
    "code": "Int64",  # end: exit code
    # exception: "Type: message"; exit: error text; capture, end: reason; cell: start or end,
    # and for an end that raised, where and what: "end: <cell 7>:3: ValueError: bad batch"
    "message": "string",
    "capture_id": "Int64",  # capture: the evidence request it answered (null at exit/exception)
}

#: One row per collective or point-to-point call per rank (probe enter and exit paired).
COLLECTIVES: Columns = {
    "rank": "Int64",
    "coll_id": "Int64",
    "pg": "category",  # process-group name as torch names it ("0" is the world group)
    "pg_desc": "category",
    "pg_ranks": "string",  # "0,1,2,3" (global ranks of the group)
    "pg_size": "Int64",
    "seq": "Int64",  # the n-th collective of the rank on the group (p2p calls: numbered apart)
    "op": "category",  # torch.distributed function name: all_reduce, barrier, send, ...
    "peer": "string",  # src/dst/root as passed, or "isend:1,irecv:0" for batch_isend_irecv
    "shapes": "string",  # JSON: [[4], [2, 3]]
    "dtypes": "string",  # JSON: ["float32"]
    "async_op": "boolean",
    "file": "string",
    "line": "Int64",
    "func": "string",
    "site": "string",  # "train.py:12"
    "path": "Int64",  # the call's path: its frames are the paths table's rows of (rank, path)
    "thread": "string",  # the calling thread's ident as faulthandler prints it: "0x00007f..."
    "t_start_s": "Float64",
    "t_end_s": "Float64",  # when the call returned; null while in flight
    "t_done_s": "Float64",  # when the backend completed it: an async call's Work, later
    "duration_s": "Float64",
    "completed": "boolean",  # by the backend: an async call when its Work completed
    "ok": "boolean",  # null while in flight
    "error": "string",
}

#: The call paths the probe recorded: one row per frame of each (rank, path), from the
#: outermost (depth 0; a path cut to its innermost frames starts at the depth of its first).
PATHS: Columns = {
    "rank": "Int64",
    "path": "Int64",  # the collectives table's path
    "depth": "Int64",
    "file": "string",
    "func": "string",
    "line": "Int64",
}

#: Every line of every rank's stdout/stderr (torchrun --log-dir) and of the launcher logs.
LOGS: Columns = {
    "rank": "Int64",  # null for launcher lines that carry no rank prefix
    "local_rank": "Int64",
    "node": "Int64",
    "attempt": "Int64",
    "stream": "category",  # stdout stderr launcher
    "line_no": "Int64",  # 1-based within the source file
    "text": "string",  # the line with torchrun's [rankN]: / [defaultN]: prefix removed
    "source": "string",  # path relative to the run directory
    "t_s": "Float64",  # the line's own time (glog header, error.json timestamp), when it has one
}

#: NCCL_DEBUG output lines.
NCCL: Columns = {
    "rank": "Int64",
    "host": "category",
    "pid": "Int64",
    "tid": "Int64",
    "device": "Int64",
    "level": "category",  # VERSION INFO WARN TRACE
    "t_s": "Float64",  # from the WARN timestamp prefix, when present
    "file": "category",
    "line": "Int64",
    "message": "string",
    "source": "category",
    "line_no": "Int64",
}

#: Communicators NCCL reported (``... commId 0x... - Init START|COMPLETE``) and its version.
NCCL_COMMS: Columns = {
    "rank": "Int64",  # the job rank of the process that logged it, when known
    "host": "string",
    "pid": "Int64",
    "comm": "string",  # communicator pointer, "0x557fe785f7a0"
    "comm_id": "string",
    "nccl_rank": "Int64",
    "nranks": "Int64",
    "cuda_dev": "Int64",
    "bus_id": "string",
    "state": "category",  # START COMPLETE
    "nccl_version": "string",
    "source": "string",
    "line_no": "Int64",
}

#: Entries of torch's flight-recorder dumps (pickle or JSON, format 2.3-2.10, gloo or nccl).
FLIGHT_RECORDER: Columns = {
    "rank": "Int64",
    "source": "category",
    "version": "category",
    "pg_name": "category",
    "pg_desc": "category",
    "pg_ranks": "category",  # "0,1" from pg_config, when the dump has it (one copy per group)
    "record_id": "Int64",
    "pg_id": "Int64",
    "collective_seq_id": "Int64",
    "p2p_seq_id": "Int64",
    "op_id": "Int64",
    "profiling_name": "category",  # "nccl:all_reduce", "gloo:broadcast", "nccl:send 0->1"
    "backend": "category",  # nccl gloo ...
    "op": "category",  # all_reduce, send, ...
    "is_p2p": "boolean",
    "input_sizes": "category",  # JSON
    "input_dtypes": "category",
    "output_sizes": "category",
    "output_dtypes": "category",
    "state": "category",  # scheduled started completed
    "time_created_ns": "Int64",
    "time_discovered_started_ns": "Int64",
    "time_discovered_completed_ns": "Int64",
    "duration_ms": "Float64",
    "retired": "boolean",
    "timeout_ms": "Int64",
    "thread_id": "category",
    "thread_name": "category",
    # the entry's call path from its frames: JSON [[file, func, line], ...] outermost first,
    # rankscope.rundir.MACHINERY left out; null without frames (JSON dumps) or malformed ones
    "path": "category",
}

#: Stack frames of flight-recorder entries (depth 0 = innermost).
FR_FRAMES: Columns = {
    "rank": "Int64",
    "record_id": "Int64",
    "depth": "Int64",
    "name": "category",
    "filename": "category",
    "line": "Int64",
}

#: Per-rank, per-group status from the dumps' ``pg_status``.
PG_STATUS: Columns = {
    "rank": "Int64",
    "pg_id": "string",
    "last_enqueued_collective": "Int64",
    "last_started_collective": "Int64",
    "last_completed_collective": "Int64",
    "source": "string",  # the dump it comes from
}

#: Python stack frames from faulthandler dumps and py-spy dumps (depth 0 = innermost).
STACKS: Columns = {
    "rank": "Int64",
    "capture_id": "Int64",  # rankscope capture id, when the dump carries one
    "capture": "Int64",  # 0-based index of the dump within its source
    "t_s": "Float64",
    "tool": "category",  # faulthandler py-spy
    "reason": "string",  # why it was taken: stall, request, exception, exit, SIGTERM, SIGABRT, ...
    "thread": "string",  # thread id as printed
    "thread_name": "string",
    "is_current": "boolean",
    "depth": "Int64",
    "func": "string",
    "file": "string",
    "line": "Int64",
    "is_user": "boolean",  # outside torch, the standard library and rankscope
    "code": "string",  # the frame's source line, for the user's frames whose file is readable
    "source": "string",
}

#: One row per (capture, thread, frame, name): the simple values (numbers, strings, booleans,
#: None) that a frame's conditions read, captured with the stacks (ranks/<r>/values.jsonl).
VALUES: Columns = {
    "rank": "Int64",
    "capture_id": "Int64",
    "capture": "Int64",  # 0-based index of the capture within its file
    "t_s": "Float64",
    "reason": "string",
    "thread": "string",  # thread id as faulthandler prints it
    "depth": "Int64",  # 0 is the outermost frame kept
    "file": "string",
    "func": "string",
    "line": "Int64",
    "name": "string",
    "value": "object",  # the value itself: bool, int, float, str or None
    "source": "string",
}

#: One row per (rank, capture): the innermost user frame of the thread that matters.
STACK_SUMMARY: Columns = {
    "rank": "Int64",
    "capture_id": "Int64",
    "capture": "Int64",
    "t_s": "Float64",
    "tool": "category",
    "reason": "string",
    "thread": "string",
    "func": "string",
    "file": "string",
    "line": "Int64",
    "site": "string",  # "train.py:12"
    "waiting_in": "string",  # innermost torch.distributed function on that stack, if any
    "source": "string",  # the file the capture is in
}

#: Known error signatures found in logs.
ERRORS: Columns = {
    "rank": "Int64",
    "t_s": "Float64",
    "kind": "category",  # the signature kind: gloo_timeout, nccl_watchdog_timeout, ...
    "role": "category",  # what the text says of the rank: mismatch peer_exit timeout own ...
    "recipe": "category",  # D1..D23 the signature points to, or null
    "message": "string",  # the matching text
    "fields": "object",  # dict of parsed fields (seq, op_type, timeout_ms, ranks, ...)
    "source": "string",
    "line_no": "Int64",
}

#: Files that could not be read, one row each, with the reason.
PROBLEMS: Columns = {
    "source": "string",
    "reader": "category",
    "reason": "string",
}

#: The analyzer's calls: every rank's collective and point-to-point calls, the probe's and the
#: flight recorder's merged into one sequence per rank (rankscope.analyze.calls). Not a table of
#: a run: diagnose() builds it and the plots and the replay read it (Diagnosis.calls).
CALLS: Columns = {
    "rank": "int64",
    "pg": "category",  # process-group name ("0" is the world group)
    "pg_desc": "category",
    "pg_ranks": "category",  # "0,1,2,3" when the source knows the members
    "seq": "Int64",  # the n-th collective of the rank on the group, from 1; <NA> for p2p calls
    "p2p_seq": "Int64",  # the n-th point-to-point call of the rank on the group; <NA> otherwise
    "op": "category",
    "shapes": "category",
    "dtypes": "category",
    "key": "int64",  # equal keys: the same call (op, shapes and dtypes)
    "peer": "Int64",  # global rank of the other side of a p2p call, when known
    "root": "Int64",  # the root of a rooted collective (broadcast's src, reduce's dst; probe)
    "completed": "boolean",  # the backend completed it (not only returned: nccl, async calls)
    # issued (not completed; on gloo the device has no say), started (on the device: nccl with
    # TORCH_NCCL_ENABLE_TIMING), completed
    "state": "category",
    "ok": "boolean",  # the call returned normally (probe only)
    "error": "category",
    "t_start_s": "Float64",
    "t_end_s": "Float64",
    "site": "category",  # "train.py:12" of the user's call (probe; fr_sites for the recorder)
    # the call's path (its frames, outermost first): equal codes, the same path on any rank;
    # -1 where no source recorded it (analyze.paths.CallPaths holds the frames of each code)
    "path": "int64",
    "thread": "category",  # the calling thread's ident, "0x00007f..." (probe; recorder 2.10+)
    "order": "int64",  # position of the call in its rank's merged sequence, from 0
    "row": "int64",  # row of the source table: the evidence reference
    "source": "category",  # the table of that row: collectives or flight_recorder
}

TABLES: dict[str, Columns] = {
    "ranks": RANKS,
    "events": EVENTS,
    "collectives": COLLECTIVES,
    "paths": PATHS,
    "logs": LOGS,
    "nccl": NCCL,
    "nccl_comms": NCCL_COMMS,
    "flight_recorder": FLIGHT_RECORDER,
    "fr_frames": FR_FRAMES,
    "pg_status": PG_STATUS,
    "stacks": STACKS,
    "stack_summary": STACK_SUMMARY,
    "values": VALUES,
    "errors": ERRORS,
    "problems": PROBLEMS,
}


class SchemaError(ValueError):
    """A table does not match its declared schema."""


def empty(name: str) -> pd.DataFrame:
    """An empty frame with the table's columns and dtypes (a frame of its own: changing it
    changes no other)."""
    return _empty(name).copy(deep=False)


@functools.cache
def _empty(name: str) -> pd.DataFrame:
    cols = _columns(name)
    return pd.DataFrame({c: pd.Series([], dtype=t) for c, t in cols.items()})


def conform(name: str, df: pd.DataFrame) -> pd.DataFrame:
    """Return ``df`` with exactly the table's columns, in order, cast to their dtypes.

    Missing columns are added as nulls; extra columns are an error (a reader bug).
    """
    cols = _columns(name)
    extra = [c for c in df.columns if c not in cols]
    if extra:
        raise SchemaError(f"table {name!r}: unexpected columns {extra}")
    # A diagnosis builds a dozen tables, most of a few rows: what is right already is kept as
    # it is (a column read out of a frame costs more than a small table's arithmetic).
    has = dict(zip(df.columns, map(str, df.dtypes), strict=True))
    index = df.index
    plain = isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1
    if plain and list(has) == list(cols) and all(has[c] == t for c, t in cols.items()):
        return df
    out = {}
    n = len(df)
    for col, dtype in cols.items():
        if col in has:
            s = df[col]
            if has[col] != dtype:
                s = _cast(s, dtype)
            if not plain:
                s = s.reset_index(drop=True)
        else:
            s = pd.Series([None] * n, dtype=dtype if dtype != "object" else object)
        out[col] = s
    # No copy: with copy-on-write, changing either frame later copies then, not now.
    return pd.DataFrame(out, copy=False)


def _cast(s: pd.Series, dtype: str) -> pd.Series:
    if dtype == "object":
        return s.astype(object)
    if dtype in ("Int64", "Float64"):
        return pd.to_numeric(s, errors="coerce").astype(dtype)
    if dtype == "string":
        return s.astype("string")
    return s.astype(dtype)


def validate(name: str, df: pd.DataFrame) -> pd.DataFrame:
    """Raise :class:`SchemaError` unless ``df`` has exactly the table's columns and dtypes."""
    cols = _columns(name)
    if list(df.columns) != list(cols):
        raise SchemaError(f"table {name!r}: columns {list(df.columns)} != {list(cols)}")
    has = dict(zip(df.columns, map(str, df.dtypes), strict=True))
    wrong = {c: has[c] for c, t in cols.items() if has[c] != t}
    if wrong:
        raise SchemaError(f"table {name!r}: wrong dtypes {wrong}; expected {dict(cols)}")
    return df


#: Tables that no reader makes, built from the others.
DERIVED: dict[str, Columns] = {"calls": CALLS}


def _columns(name: str) -> Columns:
    try:
        return TABLES[name] if name in TABLES else DERIVED[name]
    except KeyError:
        raise SchemaError(f"unknown table {name!r}; known: {sorted([*TABLES, *DERIVED])}") from None
