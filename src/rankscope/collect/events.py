"""The probe's events (``ranks/<rank>/events.jsonl``) and the collective calls they describe.

A rank's last calls are also in its ring files (``calls-<pid>.ring``, written as each call is
entered and returns, so they survive a process that dies before its events are flushed): a call
the ring holds and the events do not is added from the ring, with its facts from the ``facts``
lines, which the probe writes before the first call that has them goes on. Its ``call`` and
``enter`` lines name their facts by id (``rankscope.rundir.EVENT_KINDS``): a call line gives
the events table an enter row and an exit row, as an older probe's enter and exit lines did.
A call's facts name its call path by id (its ``path`` line, written before them): the
``collectives`` table's ``path``, whose frames are the ``paths`` table's rows.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from rankscope import schema
from rankscope._values import as_float, as_int, as_str
from rankscope.collect._common import (
    Problems,
    Source,
    SourceLike,
    as_sources,
    columns,
    decode_text,
    finish,
    problem_list,
    read_bytes,
    split_lines,
)
from rankscope.rundir import (
    RING_HEADER,
    RING_MAGIC,
    RING_SLOT,
    RING_SLOT_FIELDS,
    RING_VERSION,
    as_enter_exit,
    cell_message,
    read_path,
    ring_step,
    valid_id,
)

READER = "events"
RING_READER = "ring"

_EVENT_COLUMNS = ("rank", "ev", "t_s", "coll_id", "op", "pg", "seq", "step", "done", "ok")
_EVENT_COLUMNS += ("code", "message", "capture_id")
_ENTER_COLUMNS = ("rank", "life", "coll_id", "pg", "pg_desc", "pg_ranks", "pg_size", "seq", "op")
_ENTER_COLUMNS += ("peer", "shapes", "dtypes", "async_op", "file", "line", "func", "site", "path")
_ENTER_COLUMNS += ("thread", "t_start_s")
_EXIT_COLUMNS = ("rank", "life", "coll_id", "x_op", "x_pg", "x_seq", "duration_s", "t_end_s")
_EXIT_COLUMNS += ("ok", "error")
_DONE_COLUMNS = ("rank", "life", "coll_id", "t_done_s", "done_ok")
_PATH_COLUMNS = tuple(schema.PATHS)


class EventTables(NamedTuple):
    """What :func:`parse_events` reads: the tables of :mod:`rankscope.schema` of those names."""

    events: pd.DataFrame
    collectives: pd.DataFrame
    paths: pd.DataFrame


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
    return parse_events(sources, problems=problems).collectives


def read_paths(sources: Iterable[SourceLike], *, problems: Problems | None = None) -> pd.DataFrame:
    """The call paths the probe recorded, one row per frame, from the outermost.

    Example::

           rank  path  depth                  file      func  line
        0     0     1      0  /home/user/train.py  <module>    20
        1     0     1      1  /home/user/train.py      sync     9

    A call's ``path`` in the collectives table is its frames' ``path`` here (with its rank).
    """
    return parse_events(sources, problems=problems).paths


def parse_events(
    sources: Iterable[SourceLike],
    *,
    rings: Iterable[SourceLike] = (),
    problems: Problems | None = None,
) -> EventTables:
    """The three tables from one pass over the files: events, collectives and paths.

    ``rings`` are the probe's ring files (``calls-<pid>.ring``): calls they hold that the events
    files lack (a rank that died before its thread wrote them) are added, as ``enter`` and
    ``exit`` events of the process (``life``) whose ``start`` event has the ring's pid.

    A process numbers its paths from 1: a rank's later process (a restart) has its numbers
    moved past its earlier ones', in both tables, so that a rank's path names one path.
    """
    problems = problem_list(problems)
    events: list[tuple[Any, ...]] = []
    enters: list[tuple[Any, ...]] = []
    exits: list[tuple[Any, ...]] = []
    dones: list[tuple[Any, ...]] = []
    paths: list[tuple[Any, ...]] = []
    lives: dict[int | None, list[_Life]] = {}
    for source in as_sources(sources):
        data = read_bytes(source, problems, READER)
        if data is None:
            continue
        bad: list[int] = []
        bad_paths: list[int] = []
        mine = lives.setdefault(source.rank, [])
        life = _Life(number=0) if not mine else mine[-1]
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
            if kind == "start":
                base = life.path_base + life.path_max
                life = _Life(number=life.number + 1, pid=as_int(ev.get("pid")), rank=rank)
                life.works = ev.get("works") is True
                life.path_base = base
                lives.setdefault(source.rank, []).append(life)
            if kind == "path":
                read = read_path(ev)
                if read is None:
                    bad_paths.append(no)
                else:
                    pid, cut, frames = read
                    life.path_max = max(life.path_max, pid)
                    pid += life.path_base
                    paths.extend(
                        (rank, pid, cut + depth, *frame) for depth, frame in enumerate(frames)
                    )
                continue
            if kind == "facts":
                fid = as_int(ev.get("facts"))
                if fid is not None:
                    life.facts[fid] = ev
                continue
            if kind == "done":
                dones.extend(_dones(ev, rank, life.number))
            if kind == "step":
                life.step_t = as_float(ev.get("t"))
            # a call line is the call's enter and exit rows; an enter line has its facts'
            for one in as_enter_exit(ev, life.facts):
                kind = one["ev"] if one is not ev else kind
                events.append(_event(one, kind, rank))
                if kind == "enter":
                    enters.append(_enter(one, rank, life))
                    life.entered.add(as_int(one.get("id")))
                elif kind == "exit":
                    exits.append(_exit(one, rank, life.number))
                    life.exited.add(as_int(one.get("id")))
        if bad:
            problems.add(
                source,
                READER,
                f"{len(bad)} line(s) are not JSON objects and were skipped "
                f"(first: line {bad[0]}; a write torn by a kill, or not an events file)",
            )
        if bad_paths:
            problems.add(
                source,
                READER,
                f"{len(bad_paths)} path line(s) are malformed and were skipped (first: line "
                f"{bad_paths[0]}): the calls that name them have a path without frames",
            )
    for source in as_sources(rings):
        ring = read_ring(source, problems)
        if ring is None:
            continue
        life = _life_of(ring, source, lives, problems)
        for ev in _ring_events(ring, life):
            kind = ev["ev"]
            events.append(_event(ev, kind, ev["rank"]))
            if kind == "enter":
                enters.append(_enter(ev, ev["rank"], life))
            elif kind == "exit":
                exits.append(_exit(ev, ev["rank"], life.number))
    follows = {(life.rank, life.number) for mine in lives.values() for life in mine if life.works}
    return EventTables(
        finish("events", columns(_EVENT_COLUMNS, events)),
        _pair(
            columns(_ENTER_COLUMNS, enters),
            columns(_EXIT_COLUMNS, exits),
            columns(_DONE_COLUMNS, dones),
            follows,
        ),
        finish("paths", columns(_PATH_COLUMNS, paths)) if paths else schema.empty("paths"),
    )


@dataclass
class _Life:
    """One process of a rank, as its events file tells it (from its ``start`` event on)."""

    number: int
    pid: int | None = None
    rank: int | None = None
    facts: dict[int, dict[str, Any]] = field(default_factory=dict)
    entered: set[int | None] = field(default_factory=set)
    exited: set[int | None] = field(default_factory=set)
    works: bool = False
    """Its probe follows async calls' Works to completion (``done`` events)."""
    path_base: int = 0
    """Added to its path ids: the highest of its rank's earlier processes (see parse_events)."""
    path_max: int = 0
    """The highest path id it wrote."""
    step_t: float | None = None
    """When it marked the last step its events file has."""


#: A ring slot as NumPy reads it (``rankscope.rundir.RING_SLOT_FIELDS``).
_FIELDS = [(name, "<" + code) for name, code in RING_SLOT_FIELDS]
_SLOT = np.dtype([*_FIELDS, ("pad", f"V{RING_SLOT.size - np.dtype(_FIELDS).itemsize}")])
assert _SLOT.itemsize == RING_SLOT.size


@dataclass(frozen=True)
class Ring:
    """A ring file read: its header, and its whole slots in call order."""

    pid: int
    rank: int
    created_s: float
    slots: np.ndarray
    """Structured array (cid, seq, t, t_end, fid, state, tid) of the slots holding a call."""
    data: bytes
    """The file's bytes (its header holds the last step: :func:`rankscope.rundir.ring_step`)."""


def read_ring(source: SourceLike, problems: Problems | None = None) -> Ring | None:
    """One ring file; ``None`` (and a row in ``problems``) when it is not one.

    Slots being written when the process died are left out and reported; so is a file cut
    short (its whole slots are read)."""
    problems = problem_list(problems)
    (source,) = as_sources([source])
    data = read_bytes(source, problems, RING_READER)
    if data is None:
        return None
    if len(data) < RING_HEADER.size or data[:8] != RING_MAGIC:
        problems.add(source, RING_READER, "not a rankscope ring file (no RSRING01 header)")
        return None
    _, version, slot_size, nslots, pid, rank, created, *_ = RING_HEADER.unpack_from(data)
    if version != RING_VERSION or slot_size != RING_SLOT.size:
        problems.add(
            source,
            RING_READER,
            f"ring version {version} with {slot_size}-byte slots; this rankscope reads version "
            f"{RING_VERSION} ({RING_SLOT.size}-byte slots)",
        )
        return None
    body = len(data) - RING_HEADER.size
    whole = min(nslots, body // RING_SLOT.size)
    if whole < nslots:
        problems.add(
            source,
            RING_READER,
            f"cut short: {whole} of {nslots} slots are whole (a copy that did not finish?)",
        )
    elif body > nslots * RING_SLOT.size:
        problems.add(
            source,
            RING_READER,
            f"{body - nslots * RING_SLOT.size} bytes more than its {nslots} slots: not read "
            "(a corrupted file?)",
        )
    slots = np.frombuffer(data, dtype=_SLOT, count=whole, offset=RING_HEADER.size)
    used = slots["cid"] != 0
    raw = np.frombuffer(data, dtype=np.uint8, count=whole * RING_SLOT.size, offset=RING_HEADER.size)
    torn = int((~used & raw.reshape(whole, RING_SLOT.size).any(axis=1)).sum()) if whole else 0
    if torn:
        problems.add(
            source,
            RING_READER,
            f"{torn} slot(s) torn (being written when the process ended); their call is unknown",
        )
    # A call's slot is its id modulo the slots (the probe's _Ring._at), and its state one of
    # in flight, returned or raised: a slot that says otherwise was overwritten by something
    # else, and the slots after it are still read.
    place = np.arange(whole, dtype=np.uint64)
    wrong = used & ((slots["cid"] % np.uint64(max(nslots, 1)) != place) | (slots["state"] > 2))
    if wrong.any():
        problems.add(
            source,
            RING_READER,
            f"{int(wrong.sum())} slot(s) corrupted (an id that is not the slot's, or an unknown "
            "state); skipped, the other slots read",
        )
    slots = slots[used & ~wrong]
    return Ring(
        pid=pid, rank=rank, created_s=created, slots=slots[np.argsort(slots["cid"])], data=data
    )


def _life_of(
    ring: Ring, source: Source, lives: dict[int | None, list[_Life]], problems: Problems
) -> _Life:
    rank = ring.rank if source.rank is None else source.rank
    mine = lives.get(rank) or []
    for life in mine:
        if life.pid == ring.pid:
            return life
    problems.add(
        source,
        RING_READER,
        f"no start event of process {ring.pid} in rank {rank}'s events: its calls are added "
        "without their op, group or call site",
    )
    return _Life(number=(mine[-1].number if mine else 0), pid=ring.pid, rank=rank)


def _ring_events(ring: Ring, life: _Life) -> list[dict[str, Any]]:
    """Enter and exit events, as the probe writes them, for what the ring holds and the events
    file does not, and the step it marked last where the events file lacks it."""
    slots = ring.slots
    known = np.fromiter((c for c in life.entered if c is not None), dtype=np.uint64)
    done = np.fromiter((c for c in life.exited if c is not None), dtype=np.uint64)
    todo = ~np.isin(slots["cid"], known) | ((slots["state"] != 0) & ~np.isin(slots["cid"], done))
    rank = ring.rank if life.rank is None else life.rank
    out = []
    for cid, seq, t, t_end, fid, state, tid, _ in slots[todo].tolist():
        facts = life.facts.get(fid, {})
        if cid not in life.entered:
            enter = {k: v for k, v in facts.items() if k not in ("ev", "facts", "t", "rank")}
            enter.update(ev="enter", id=cid, seq=seq, tid=tid, t=t, rank=rank)
            out.append(enter)
        if state != 0 and cid not in life.exited:
            out.append(
                {
                    "ev": "exit",
                    "id": cid,
                    "op": facts.get("op"),
                    "pg": facts.get("pg"),
                    "seq": seq,
                    "dur_s": t_end - t,
                    "ok": state == 1,
                    "error": None,
                    "t": t_end,
                    "rank": rank,
                }
            )
    step = ring_step(ring.data, life.step_t)
    return [*out, {**step, "rank": rank}] if step is not None else out


def _clock(t_s: float) -> str:
    """``12:43:05.812`` (local time), as the diagnosis writes times."""
    try:
        return dt.datetime.fromtimestamp(t_s).strftime("%H:%M:%S.%f")[:-3]
    except (OverflowError, ValueError, OSError):
        return "an unknown time"


def _event(ev: dict[str, Any], kind: str | None, rank: Any) -> tuple[Any, ...]:
    message = None
    if kind == "exception":
        message = f"{as_str(ev.get('type')) or 'Exception'}: {as_str(ev.get('message')) or ''}"
    elif kind == "exit":
        message = as_str(ev.get("error"))
    elif kind in ("capture", "end"):
        message = as_str(ev.get("reason"))
    elif kind == "dropped":
        since = as_float(ev.get("since"))
        when = _clock(since) if since is not None else "an unknown time"
        message = (
            f"{as_int(ev.get('writes')) or 0} write(s) dropped since {when}: "
            f"{as_str(ev.get('error')) or 'unknown error'}"
        )
    elif kind == "cell":
        message = cell_message(ev)
    coll = ev.get("coll") if kind == "heartbeat" else ev.get("id")
    cell = kind == "cell"  # its numbers in the columns the schema names for it
    return (
        rank,
        kind,
        as_float(ev.get("t")),
        as_int(coll) if kind in ("enter", "exit", "heartbeat") else None,
        as_str(ev.get("op")),
        as_str(ev.get("pg")),
        as_int(ev.get("run" if cell else "seq")),
        as_int(ev.get("cell" if cell else "step")),
        as_int(ev.get("threads" if cell else "done")),
        ev.get("ok") if isinstance(ev.get("ok"), bool) else None,
        as_int(ev.get("code")),
        message,
        as_int(ev.get("id")) if kind == "capture" else None,
    )


def _dones(ev: dict[str, Any], rank: Any, life: int) -> list[tuple[Any, ...]]:
    """A done event's rows: (rank, life, call id, time, ok) for each async call it completes."""
    ids, failed = ev.get("ids"), ev.get("failed")
    failed = {x for x in failed if type(x) is int} if isinstance(failed, list) else set()
    t = as_float(ev.get("t"))
    ids = ids if isinstance(ids, list) else []
    return [(rank, life, cid, t, cid not in failed) for cid in ids if type(cid) is int]


def _enter(ev: dict[str, Any], rank: Any, life: _Life) -> tuple[Any, ...]:
    ranks = ev.get("pg_ranks")
    path = ev.get("path")
    ranks = [r for r in ranks if type(r) is int] if isinstance(ranks, list) else None
    file, line = as_str(ev.get("file")), as_int(ev.get("line"))
    line = line if valid_id(line) else None  # (a number past Int64 would fail the table)
    return (
        rank,
        life.number,
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
        path + life.path_base if valid_id(path) else None,
        _thread(ev.get("tid")),
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


def _pair(
    enters: dict[str, list[Any]],
    exits: dict[str, list[Any]],
    dones: dict[str, list[Any]],
    follows: set[tuple[Any, int]],
) -> pd.DataFrame:
    """Join each exit and done to its enter by (rank, process lifetime, call id); keep the
    unmatched. A blocking call is completed when it returned; an async one (it returned a Work)
    when its done event says the backend completed it, in a process whose probe follows Works
    (``follows``: (rank, life)); in an older one, when it returned.

    Paired as an outer merge pairs rows (a repeated key pairs every enter with every exit of
    it; the later of two dones counts; rows of one key in another order), by dict lookups and
    takes of whole columns: a frozen job's diagnosis is asked for within a second, and a merge
    costs milliseconds however few the rows."""
    e_keys = list(zip(enters["rank"], enters["life"], enters["coll_id"], strict=True))
    x_keys = list(zip(exits["rank"], exits["life"], exits["coll_id"], strict=True))
    n = len(x_keys)
    first = dict(zip(reversed(x_keys), range(n - 1, -1, -1), strict=True))  # a key's first exit
    more: dict[tuple[Any, ...], list[int]] = {}  # its others (a repeated call id)
    if len(first) < n:
        for j, key in enumerate(x_keys):
            if first[key] != j:
                more.setdefault(key, []).append(j)
    # (enter, exit) positions, -1 for none: each enter with its first exit, then its others
    i = np.arange(len(e_keys))
    j = np.array([first.get(key, -1) for key in e_keys], dtype=np.int64)
    if more:
        extra = [(a, b) for a, key in enumerate(e_keys) for b in more.get(key, ())]
        i = np.concatenate([i, [a for a, _ in extra]]).astype(np.int64)
        j = np.concatenate([j, [b for _, b in extra]]).astype(np.int64)
    matched = np.zeros(n, dtype=bool)
    matched[j[j >= 0]] = True
    alone = np.flatnonzero(~matched)  # exits without an enter
    i = np.concatenate([i, np.full(len(alone), -1)])
    j = np.concatenate([j, alone])
    if not len(i):
        return schema.empty("collectives")
    done_keys = zip(dones["rank"], dones["life"], dones["coll_id"], strict=True)
    done_of = dict(zip(done_keys, range(len(dones["rank"])), strict=True))  # the last counts
    d = np.array([*(done_of.get(key, -1) for key in e_keys), -1], dtype=np.int64)[i]
    d[i < 0] = [done_of.get(x_keys[b], -1) for b in j[i < 0].tolist()]

    def key(name: str) -> np.ndarray:  # as floats: an integer or NaN, in NumPy's own loops
        of_enter = np.array([*enters[name], None], dtype=float)[i]
        return np.where(i >= 0, of_enter, np.array([*exits[name], None], dtype=float)[j])

    rank, life, cid = key("rank"), key("life"), key("coll_id")
    order = np.lexsort((cid, life, rank))  # nulls last; stable: ties keep the pairing's order
    rank, life, cid, i, j, d = (x[order] for x in (rank, life, cid, i, j, d))
    out = {name: _take(enters, name, i) for name in _ENTER_COLUMNS if name != "life"}
    out["rank"], out["coll_id"] = rank, cid
    exited = j >= 0
    for name in ("op", "pg", "seq"):  # an enter without them (or none at all): the exit's
        fill = exited & pd.isna(out[name])
        if fill.any():
            out[name] = np.asarray(out[name], dtype=object)
            out[name][fill] = np.asarray(_take(exits, f"x_{name}", j), dtype=object)[fill]
    t_end = np.asarray(_take(exits, "t_end_s", j), dtype=float)
    duration = np.asarray(_take(exits, "duration_s", j), dtype=float)
    t_start = np.asarray(out["t_start_s"], dtype=float)
    duration = np.where(np.isnan(duration), t_end - t_start, duration)
    ok = np.asarray(_take(exits, "ok", j), dtype=object)
    followed = np.zeros(len(i), dtype=bool)
    for r, number in follows:
        followed |= (rank == r) & (life == number)
    async_op = np.asarray(out["async_op"], dtype=object)
    pending = (async_op == True) & followed & exited & (ok != False)  # noqa: E712
    t_done = np.asarray(_take(dones, "t_done_s", d), dtype=float)
    failed = pending & (np.asarray(_take(dones, "done_ok", d), dtype=object) == False)  # noqa: E712
    out.update(
        t_end_s=t_end,
        t_done_s=np.where(pending, t_done, t_end),
        duration_s=duration,
        completed=exited & ~(pending & np.isnan(t_done)),
        ok=np.where(failed, False, ok),
        error=_take(exits, "error", j),
    )
    return finish("collectives", {name: out[name] for name in schema.COLLECTIVES})


def _take(cols: dict[str, list[Any]], name: str, at: np.ndarray) -> Any:
    """``cols[name]`` at the positions ``at`` (None at -1): the list itself where ``at`` is
    every position in order (each call entered and exited once, in order: the usual case)."""
    values = cols[name]
    if len(at) == len(values) and (not len(at) or (at[0] == 0 and (np.diff(at) == 1).all())):
        return values
    taken = np.empty(len(values) + 1, dtype=object)
    taken[:-1] = values
    return taken[at]


def _thread(tid: Any) -> str | None:
    """A thread's ident as faulthandler prints it (``0x00007f...``), to match the stacks."""
    return f"0x{tid:016x}" if type(tid) is int and tid >= 0 else None


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
