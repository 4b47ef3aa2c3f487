"""The probe's events (``ranks/<rank>/events.jsonl``) and the collective calls they describe."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from rankscope.collect._common import (
    Problems,
    SourceLike,
    as_sources,
    columns,
    decode_text,
    finish,
    problem_list,
    read_bytes,
    split_lines,
)
from rankscope.collect._values import as_float, as_int, as_str

READER = "events"

_EVENT_COLUMNS = ("rank", "ev", "t_s", "coll_id", "op", "pg", "seq", "step", "done", "ok")
_EVENT_COLUMNS += ("code", "message", "capture_id")
_ENTER_COLUMNS = ("rank", "life", "coll_id", "pg", "pg_desc", "pg_ranks", "pg_size", "seq", "op")
_ENTER_COLUMNS += ("peer", "shapes", "dtypes", "async_op", "file", "line", "func", "site")
_ENTER_COLUMNS += ("t_start_s",)
_EXIT_COLUMNS = ("rank", "life", "coll_id", "x_op", "x_pg", "x_seq", "duration_s", "t_end_s")
_EXIT_COLUMNS += ("ok", "error")


def read_events(sources: Iterable[SourceLike], *, problems: Problems | None = None) -> pd.DataFrame:
    """The probe's events, one row per line of every ``events.jsonl``.

    Lines that are not JSON objects (a write torn by a kill, garbage) are skipped and counted in
    ``problems``. Example::

           rank         ev           t_s  coll_id          op   pg   seq  step  done    ok  code  message  capture_id
        0     0      enter  1.795290e+09        2  all_reduce    0     1  <NA>  <NA>  <NA>  <NA>     <NA>        <NA>
        1     0       exit  1.795290e+09        2  all_reduce    0     1  <NA>  <NA>  True  <NA>     <NA>        <NA>

    Args:
        sources: ``events.jsonl`` files (paths, or :class:`~rankscope.collect.Source` with a rank).
        problems: where unreadable files and lines are reported; ``None`` raises ``ValueError``.
    """
    return parse_events(sources, problems=problems)[0]


def read_collectives(
    sources: Iterable[SourceLike], *, problems: Problems | None = None
) -> pd.DataFrame:
    """One row per collective or point-to-point call per rank: the probe's enter and exit paired.

    A call with an enter and no exit is still in flight (``completed`` False, ``ok`` and
    ``t_end_s`` null); that is what a hung rank looks like. Example::

           rank  coll_id pg     pg_desc pg_ranks  pg_size  seq          op  peer shapes   dtypes  async_op                    file  line    func         site     t_start_s       t_end_s  duration_s  completed    ok error
        0     0        2  0  default_pg      0,1        2    1  all_reduce  <NA>  [[4]]  ["float32"]  False  /home/user/train.py     9  <module>  train.py:9  1.795290e+09  1.795290e+09    0.003585       True  True  <NA>
        1     0        7  0  default_pg      0,1        2    6     barrier  <NA>     []       []     False  /home/user/train.py    13  <module> train.py:13  1.795290e+09          <NA>        <NA>      False  <NA>  <NA>
    """
    return parse_events(sources, problems=problems)[1]


def parse_events(
    sources: Iterable[SourceLike], *, problems: Problems | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Both tables from one pass over the files: (events, collectives)."""
    problems = problem_list(problems)
    events: list[tuple[Any, ...]] = []
    enters: list[tuple[Any, ...]] = []
    exits: list[tuple[Any, ...]] = []
    for source in as_sources(sources):
        data = read_bytes(source, problems, READER)
        if data is None:
            continue
        bad: list[int] = []
        life = 0
        for no, line in enumerate(split_lines(decode_text(data, source, problems, READER)), 1):
            if not line.strip():
                continue
            try:
                ev = json.loads(line)
            except (ValueError, RecursionError):
                ev = None
            if not isinstance(ev, dict):
                bad.append(no)
                continue
            kind = as_str(ev.get("ev"))
            rank = as_int(ev.get("rank"))
            rank = source.rank if rank is None else rank
            life += kind == "start"
            events.append(_event(ev, kind, rank))
            if kind == "enter":
                enters.append(_enter(ev, rank, life))
            elif kind == "exit":
                exits.append(_exit(ev, rank, life))
        if bad:
            problems.add(
                source,
                READER,
                f"{len(bad)} line(s) are not JSON objects and were skipped "
                f"(first: line {bad[0]}; a write torn by a kill, or not an events file)",
            )
    return (
        finish("events", columns(_EVENT_COLUMNS, events)),
        _pair(columns(_ENTER_COLUMNS, enters), columns(_EXIT_COLUMNS, exits)),
    )


def _event(ev: dict[str, Any], kind: str | None, rank: Any) -> tuple[Any, ...]:
    message = None
    if kind == "exception":
        message = f"{as_str(ev.get('type')) or 'Exception'}: {as_str(ev.get('message')) or ''}"
    elif kind == "exit":
        message = as_str(ev.get("error"))
    elif kind == "capture":
        message = as_str(ev.get("reason"))
    coll = ev.get("coll") if kind == "heartbeat" else ev.get("id")
    return (
        rank,
        kind,
        as_float(ev.get("t")),
        as_int(coll) if kind in ("enter", "exit", "heartbeat") else None,
        as_str(ev.get("op")),
        as_str(ev.get("pg")),
        as_int(ev.get("seq")),
        as_int(ev.get("step")),
        as_int(ev.get("done")),
        ev.get("ok") if isinstance(ev.get("ok"), bool) else None,
        as_int(ev.get("code")),
        message,
        as_int(ev.get("id")) if kind == "capture" else None,
    )


def _enter(ev: dict[str, Any], rank: Any, life: int) -> tuple[Any, ...]:
    ranks = ev.get("pg_ranks")
    ranks = [r for r in ranks if type(r) is int] if isinstance(ranks, list) else None
    file, line = as_str(ev.get("file")), as_int(ev.get("line"))
    return (
        rank,
        life,
        as_int(ev.get("id")),
        as_str(ev.get("pg")),
        as_str(ev.get("pg_desc")),
        None if ranks is None else ",".join(map(str, ranks)),
        None if ranks is None else len(ranks),
        as_int(ev.get("seq")),
        as_str(ev.get("op")),
        _peer(ev.get("peer")),
        _json(ev.get("shapes")),
        _json(ev.get("dtypes")),
        ev.get("async_op") if isinstance(ev.get("async_op"), bool) else None,
        file,
        line,
        as_str(ev.get("func")),
        None if file is None else f"{_basename(file)}:{line}",
        as_float(ev.get("t")),
    )


def _exit(ev: dict[str, Any], rank: Any, life: int) -> tuple[Any, ...]:
    return (
        rank,
        life,
        as_int(ev.get("id")),
        as_str(ev.get("op")),
        as_str(ev.get("pg")),
        as_int(ev.get("seq")),
        as_float(ev.get("dur_s")),
        as_float(ev.get("t")),
        ev.get("ok") if isinstance(ev.get("ok"), bool) else None,
        as_str(ev.get("error")),
    )


def _pair(enters: dict[str, list[Any]], exits: dict[str, list[Any]]) -> pd.DataFrame:
    """Join each exit to its enter by (rank, process lifetime, call id); keep the unmatched."""
    keys = ["rank", "life", "coll_id"]
    enter = pd.DataFrame(enters).astype({"rank": "Int64", "life": "int64", "coll_id": "Int64"})
    leave = pd.DataFrame(exits).astype({"rank": "Int64", "life": "int64", "coll_id": "Int64"})
    both = enter.merge(leave, on=keys, how="outer", indicator=True, sort=False)
    exited = both["_merge"] != "left_only"
    for col in ("op", "pg", "seq"):
        both[col] = both[col].astype(object).where(both[col].notna(), both[f"x_{col}"])
    missing_duration = both["duration_s"].isna() & both["t_end_s"].notna()
    both.loc[missing_duration, "duration_s"] = (both["t_end_s"] - both["t_start_s"])[
        missing_duration
    ]
    both["completed"] = exited
    both = both.sort_values(["rank", "life", "coll_id"], kind="stable", ignore_index=True)
    return finish(
        "collectives",
        both.drop(columns=["life", "x_op", "x_pg", "x_seq", "_merge"]),
    )


def _peer(value: Any) -> str | None:
    if isinstance(value, list):
        return ",".join(str(v) for v in value if type(v) in (int, str))
    return as_str(value)


def _json(value: Any) -> str | None:
    if value is None:
        return None
    try:
        return json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return None


def _basename(path: str) -> str:
    return Path(path.replace("\\", "/")).name
