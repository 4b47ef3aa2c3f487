"""The worker side of flight-recorder loading: dumps in, compact columns out.

This module imports only the standard library, NumPy and the restricted unpickler, so that
``python -m rankscope.collect._fr_parse`` starts fast in a worker process. A worker reads a JSON
task on stdin (``{"what": "entries" | "frames", "items": [[index, path], ...]}``) and writes
a part on stdout for every :data:`PART_FILES` files (:func:`encode`): a JSON header (category lists, ``pg_status`` rows, problems,
the arrays' types and lengths) and the arrays' raw bytes, which the parent reads straight into
its arrays. Nothing is pickled on the way back, so the parent unpickles nothing.
"""

from __future__ import annotations

import functools
import gc
import json
import pickle
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter, methodcaller
from typing import Any, BinaryIO

import numpy as np

from rankscope._values import as_int, as_str
from rankscope.collect import safe_pickle
from rankscope.rundir import MACHINERY, PATH_DEPTH, is_machinery

try:
    from rankscope.collect import _fr_scan
except ImportError:  # not built (no C compiler at install): the Python reader does it all
    _fr_scan = None

INT_FIELDS = (
    "record_id",
    "pg_id",
    "collective_seq_id",
    "p2p_seq_id",
    "op_id",
    "time_created_ns",
    "time_discovered_started_ns",
    "time_discovered_completed_ns",
    "timeout_ms",
)
#: Timestamps where 0 means unknown (the JSON dumps write 0 where the pickles write None).
TIME_FIELDS = ("time_discovered_started_ns", "time_discovered_completed_ns")
BOOL_FIELDS = ("retired", "is_p2p")
TEXT_FIELDS = ("profiling_name", "state", "thread_id", "thread_name")
#: Nested lists kept as JSON text.
JSON_FIELDS = ("input_sizes", "input_dtypes", "output_sizes", "output_dtypes")
#: The categories a worker builds: the text fields, JSON fields, the group's name/desc/ranks,
#: the format version and the entry's call path (:func:`path_text`).
CODED = (*TEXT_FIELDS, *JSON_FIELDS, "pg_name", "pg_desc", "pg_ranks", "version", "path")
PG_STATUS_FIELDS = ("last_enqueued_collective", "last_started_collective")
PG_STATUS_FIELDS += ("last_completed_collective",)
_RANKS_TEXT = re.compile(r"\s*\[\s*(?:-?\d+\s*(?:,\s*-?\d+\s*)*)?,?\s*\]\s*")
#: The str() of nested lists of ints and of plain words ('Float'), which map to JSON one to one.
_REPR_SAFE = re.compile(r"\[[\w\[\], '\-]*\]")
#: Frames beyond this depth are not kept (a real stack is far shorter; a hostile one is not).
MAX_FRAMES = 512


# --- one worker's share -------------------------------------------------------------------------
@dataclass
class _Chunk:
    """Columns for the entries of some files, as built in one worker."""

    file_index: list[np.ndarray] = field(default_factory=list)
    ints: dict[str, list[tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)
    duration_ms: list[np.ndarray] = field(default_factory=list)
    bools: dict[str, list[np.ndarray]] = field(default_factory=dict)
    codes: dict[str, list[np.ndarray]] = field(default_factory=dict)
    categories: dict[str, dict[Any, int]] = field(default_factory=dict)
    pg_status: list[tuple[int, str, int | None, int | None, int | None]] = field(
        default_factory=list
    )
    problems: list[tuple[int, str]] = field(default_factory=list)
    memo: dict[tuple[Any, ...], np.ndarray] = field(default_factory=dict)

    def code(self, name: str, values: Sequence[Any]) -> np.ndarray:
        """Codes of ``values`` in this chunk's table for ``name`` (None: -1). The dumps of a job
        repeat one another's values: a list of values met before takes its codes from a memo
        (a value's code never changes once given)."""
        try:
            key = (name, *values)
            known = self.memo.get(key)
        except TypeError:  # an unhashable value
            return self._code(name, values)
        if known is None:
            known = self.memo[key] = self._code(name, values)
        return known

    def _code(self, name: str, values: Sequence[Any]) -> np.ndarray:
        table = self.categories.setdefault(name, {None: -1})  # None first, never a category
        try:
            if values and values.count(values[0]) == len(values):  # one value: most columns
                first = values[0]
                code = table.setdefault(first, len(table) - 1)
                return np.full(len(values), code, dtype=np.int32)
            for v in dict.fromkeys(values):  # the distinct values, new ones numbered
                table.setdefault(v, len(table) - 1)
            return np.fromiter(map(table.__getitem__, values), dtype=np.int32, count=len(values))
        except TypeError:  # an unhashable value where a string belongs
            codes = [table.setdefault(as_str(v), len(table) - 1) for v in values]
        return np.array(codes, dtype=np.int32)

    def packed(self) -> dict[str, Any]:
        """The part sent back: concatenated arrays, categories as strings, rows, problems. The
        chunk is emptied as its columns are made: a worker holds its rows once, and one column
        twice, not the whole share twice."""
        arrays = {
            "file_index": _cat(self.file_index, np.int32),
            "duration_ms": _cat(self.duration_ms, np.float64),
        }
        self.file_index, self.duration_ms = [], []
        while self.ints:
            k, v = self.ints.popitem()
            values, masks = [a for a, _ in v], [m for _, m in v]
            v.clear()
            arrays[f"int:{k}"] = _cat(values, np.int64)
            del values
            arrays[f"mask:{k}"] = _cat(masks, bool)
            del masks
        while self.bools:
            k, v = self.bools.popitem()
            arrays[f"bool:{k}"] = _cat(v, np.int8)
        categories = {}
        for key, table in self.categories.items():
            fix = _json_category if key in JSON_FIELDS else path_text if key == "path" else as_str
            lookup, uniques = normalise(list(table)[1:], fix)  # [0] is None
            small = np.int8 if len(uniques) < 128 else np.int16 if len(uniques) < 2**15 else None
            lookup = lookup.astype(small or np.int32)  # codes in the least room
            arrays[f"code:{key}"] = lookup[_cat(self.codes.pop(key, []), np.int32)]
            categories[key] = uniques
        meta = {"categories": categories, "pg_status": self.pg_status, "problems": self.problems}
        return {"arrays": arrays, "meta": meta}


def normalise(values: list[Any], fix: Callable[[Any], str | None]) -> tuple[np.ndarray, list[str]]:
    """Codes of ``values`` (plus a trailing -1 for code -1) into the distinct fixed strings."""
    fixed = [fix(v) for v in values]
    table: dict[str, int] = {}
    codes = [-1 if v is None else table.setdefault(v, len(table)) for v in fixed]
    return np.array([*codes, -1], dtype=np.int32), list(table)


def _cat(arrays: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype)


def _is_json(data: bytes) -> bool:
    return data[:64].lstrip().startswith(b"{")


def load_dump(data: bytes) -> Any:
    """A dump's content: JSON when the bytes start with ``{``, else a restricted unpickle."""
    return json.loads(data) if _is_json(data) else safe_pickle.loads(data)


def _read_dump(index: int, path: str, problems: list[tuple[int, str]]) -> dict[str, Any] | None:
    data = _read_bytes(index, path, problems)
    return None if data is None else _decode(index, data, problems)


def _read_bytes(index: int, path: str, problems: list[tuple[int, str]]) -> bytes | None:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        problems.append((index, f"not a readable dump: {type(exc).__name__}: {exc}"))
        return None
    if not data:
        problems.append((index, "truncated or corrupted dump: ValueError: the file is empty"))
        return None
    return data


def _decode(index: int, data: bytes, problems: list[tuple[int, str]]) -> dict[str, Any] | None:
    try:
        dump = load_dump(data)
    except safe_pickle.UnsafePickleError as exc:
        problems.append((index, str(exc)))
        return None
    except (
        EOFError,
        ValueError,
        OverflowError,
        MemoryError,
        RecursionError,
        pickle.UnpicklingError,
    ) as exc:
        problems.append((index, f"truncated or corrupted dump: {type(exc).__name__}: {exc}"))
        return None
    except Exception as exc:
        problems.append((index, f"not a readable dump: {type(exc).__name__}: {exc}"))
        return None
    if not isinstance(dump, dict):
        problems.append((index, f"the dump is a {type(dump).__name__}, not a dict"))
        return None
    return dump


def _entries(index: int, dump: dict[str, Any], problems: list[tuple[int, str]]) -> list[dict]:
    entries = dump.get("entries", [])  # JSON dumps leave the key out when there are none
    if not isinstance(entries, list):
        problems.append((index, f"'entries' is a {type(entries).__name__}, not a list"))
        return []
    kept = entries if set(map(type, entries)) <= {dict} else [e for e in entries if type(e) is dict]
    if len(kept) < len(entries):
        problems.append((index, f"{len(entries) - len(kept)} entries are not dicts (skipped)"))
    return kept


@dataclass
class _Columns:
    """One dump's entries as columns, before coding: what the compiled scanner and the Python
    reader both give. ``coded`` holds, per field, its distinct values (a value the pickle stores
    once is one object) and each entry's index among them."""

    n: int
    ints: dict[str, tuple[np.ndarray, np.ndarray]]
    duration: np.ndarray
    bools: dict[str, np.ndarray]
    coded: dict[str, tuple[list[Any], np.ndarray]]
    paths: tuple[list[CallPath], np.ndarray, int]
    """The distinct call paths of the entries' frames (:func:`entry_paths`), each entry's index
    among them (-1: none) and how many entries' frames are malformed."""


def parse_entries(items: Sequence[tuple[int, str]]) -> dict[str, Any]:
    """Worker: read the files and build entry columns (frames are not touched).

    A pickle goes to the compiled scanner first; one it declines (anything unusual, a hostile
    pickle included), a JSON dump, or every dump where the scanner is not built, is read with the
    restricted unpickler and :func:`_columns` (the same table, several times slower)."""
    chunk = _Chunk()
    with _gc_paused():
        for index, path in items:
            data = _read_bytes(index, path, chunk.problems)
            if data is None:
                continue
            scanned = _scan(data)
            if scanned is not None:
                dump, cols = scanned
            else:
                dump, cols = _decode(index, data, chunk.problems), None
                if dump is None:
                    continue
            del data
            try:
                _add_dump(chunk, index, dump, cols)
            except Exception as exc:
                chunk.problems.append((index, f"malformed dump: {type(exc).__name__}: {exc}"))
    return chunk.packed()


#: What the scanner returns of a dump besides its entries.
HEAD_KEYS = ("pg_status", "pg_config", "version")
#: The entry fields coded as categories, ``process_group`` last (its name and desc).
COLUMN_CODED = (*TEXT_FIELDS, *JSON_FIELDS, "process_group")


def _scan(data: bytes) -> tuple[dict[str, Any], _Columns] | None:
    """The dump's head and entry columns by the compiled scanner, or None where it is not built,
    the dump is JSON, or the scanner leaves the pickle to the restricted unpickler."""
    if _fr_scan is None or _is_json(data):
        return None
    out = _fr_scan.scan(
        data, INT_FIELDS, "duration_ms", BOOL_FIELDS, COLUMN_CODED, HEAD_KEYS, MACHINERY, PATH_DEPTH
    )
    if out is None:
        return None
    head, n, ints, masks, floats, bools, coded, (paths, path_at, bad) = out
    cols = _Columns(
        n=n,
        ints={
            k: (np.frombuffer(a, np.int64), np.frombuffer(m, bool))
            for k, a, m in zip(INT_FIELDS, ints, masks, strict=True)
        },
        duration=np.frombuffer(floats, np.float64),
        bools={k: np.frombuffer(b, np.int8) for k, b in zip(BOOL_FIELDS, bools, strict=True)},
        coded={
            k: (objs, np.frombuffer(at, np.int32))
            for k, (objs, at) in zip(COLUMN_CODED, coded, strict=True)
        },
        paths=(paths, np.frombuffer(path_at, np.int32), bad),
    )
    return head, cols


def _columns(entries: list[dict[str, Any]]) -> _Columns:
    """The Python reader's columns of unpickled entries."""
    cols = _fields(entries)
    return _Columns(
        n=len(entries),
        ints={k: _int_column(cols[k]) for k in INT_FIELDS},
        duration=_float_column(list(map(_DURATION, entries))),
        bools={k: _bool_column(cols[k]) for k in BOOL_FIELDS},
        coded={k: _distinct(cols[k]) for k in COLUMN_CODED},
        paths=entry_paths([e.get("frames") for e in entries]),
    )


def _add_dump(chunk: _Chunk, index: int, dump: dict[str, Any], cols: _Columns | None) -> None:
    """Add a dump's rows to the chunk: ``dump`` is the whole dump, or its head where the scanner
    gave ``cols``."""
    status = dump.get("pg_status")
    if isinstance(status, dict):
        for pg_id, st in status.items():
            if isinstance(st, dict):
                values = (_no_sentinel(as_int(st.get(k))) for k in PG_STATUS_FIELDS)
                chunk.pg_status.append((index, str(pg_id), *values))  # type: ignore[arg-type]
    if cols is None:
        entries = _entries(index, dump, chunk.problems)
        if not entries:
            return
        cols = _columns(entries)
    n = cols.n
    if not n:
        return
    # All columns below are built before any is added: a file adds all of its rows or none.
    ints = dict(cols.ints)
    for k in TIME_FIELDS:
        values, mask = ints[k]
        ints[k] = (values, mask | (values == 0))
    codes = {}
    for k in TEXT_FIELDS:
        distinct, at = cols.coded[k]
        codes[k] = chunk.code(k, distinct)[at]
    for k in JSON_FIELDS:
        distinct, at = cols.coded[k]
        codes[k] = chunk.code(k, _hashable(distinct, flat=k.endswith("dtypes")))[at]
    groups, group_at = cols.coded["process_group"]
    if groups.count(groups[0]) == len(groups):  # the usual dump: every entry on one group
        distinct, name_at = [_pair(groups[0])], np.zeros(n, dtype=np.int64)
    else:
        table: dict[Any, int] = {}
        first = [table.setdefault(_hashable_pair(g), len(table)) for g in groups]
        distinct, name_at = list(table), np.array(first, dtype=np.int64)[group_at]
    # Each distinct (name, desc) is looked up once; entries take theirs by index.
    names = [name for name, _ in distinct]
    codes["pg_name"] = chunk.code("pg_name", names)[name_at]
    codes["pg_desc"] = chunk.code("pg_desc", [desc for _, desc in distinct])[name_at]
    codes["pg_ranks"] = chunk.code("pg_ranks", _group_ranks(dump.get("pg_config"), names))[name_at]
    codes["version"] = np.repeat(chunk.code("version", [as_str(dump.get("version"))]), n)
    paths, path_at, bad = cols.paths
    codes["path"] = np.append(chunk.code("path", paths), np.int32(-1))[path_at]
    if bad:
        chunk.problems.append(
            (
                index,
                f"{bad} entries have malformed frames (not a list of dicts of name, filename "
                "and line): they have no call path",
            )
        )
    chunk.file_index.append(np.full(n, index, dtype=np.int32))
    for k, v in ints.items():
        chunk.ints.setdefault(k, []).append(v)
    chunk.duration_ms.append(cols.duration)
    for k, b in cols.bools.items():
        chunk.bools.setdefault(k, []).append(b)
    for k, c in codes.items():
        chunk.codes.setdefault(k, []).append(c)


#: A frame of a call path: (file, function, line); a path: its frames, outermost first.
Frame = tuple[str, str, int]
CallPath = tuple[Frame, ...]


def entry_paths(frames: Sequence[Any]) -> tuple[list[CallPath], np.ndarray, int]:
    """The call path of each entry's ``frames`` (innermost first, as torch records them): the
    frames outermost first, :data:`~rankscope.rundir.MACHINERY`'s left out, the innermost
    :data:`~rankscope.rundir.PATH_DEPTH` kept, as the probe's paths are. Returns the distinct
    paths, each entry's index among them (-1: no frames, or only the machinery's) and how many
    entries' frames are malformed (not a list of dicts with a str ``name`` and ``filename`` and
    an int ``line``: no path). The compiled scanner gives the same for the pickles it reads."""
    table: dict[CallPath, int] = {}
    seen: dict[int, int] = {}  # id(frames list) -> index: a list shared by entries, once
    at = np.full(len(frames), -1, dtype=np.int32)
    bad = 0
    for e, value in enumerate(frames):
        if value is None:
            continue
        known = seen.get(id(value))
        if known is None:
            path = _path(value)
            known = -2 if path is None else table.setdefault(path, len(table)) if path else -1
            seen[id(value)] = known
        if known == -2:
            bad += 1
        else:
            at[e] = known
    return list(table), at, bad


def _path(frames: Any) -> CallPath | None:
    """One entry's path (empty: only machinery), or None where its frames are malformed."""
    if type(frames) is not list:
        return None
    kept: list[Frame] = []
    for f in frames:
        if type(f) is not dict:
            return None
        file, name, line = f.get("filename"), f.get("name"), f.get("line")
        if type(file) is not str or type(name) is not str or type(line) is not int:
            return None
        if len(kept) < PATH_DEPTH and not is_machinery(file):
            kept.append((file, name, line))
    return tuple(reversed(kept))


def path_text(path: CallPath) -> str:
    """A path as the ``path`` category of the entries table.

    JSON, ``[[file, func, line], ...]``, outermost first."""
    return json.dumps([list(f) for f in path])


def _pair(group: Any) -> tuple[Any, Any]:
    """(name, desc) of an entry's ``process_group``, a 2-tuple (a 2-list in JSON dumps)."""
    return tuple(group) if type(group) in (tuple, list) and len(group) == 2 else (None, None)


def _hashable_pair(group: Any) -> tuple[str | None, str | None]:
    name, desc = _pair(group)
    return as_str(name), as_str(desc)


_DURATION = methodcaller("get", "duration_ms")  # a key torch leaves out while it is None
_ENTRY_KEYS = (*INT_FIELDS, *BOOL_FIELDS, *TEXT_FIELDS, *JSON_FIELDS, "process_group")


def _fields(entries: list[dict[str, Any]]) -> dict[str, Sequence[Any]]:
    """Each field as a column, one C-level ``map`` of an ``itemgetter`` per field (three times
    faster than transposing one tuple per entry); a field some entry lacks takes ``dict.get``."""
    cols: dict[str, Sequence[Any]] = {}
    for k in _ENTRY_KEYS:
        try:
            cols[k] = list(map(itemgetter(k), entries))
        except KeyError:
            cols[k] = [e.get(k) for e in entries]
    return cols


def _int_column(values: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    try:
        arr = np.array(values, dtype=np.int64)
        if arr.ndim == 1:
            return arr, np.zeros(len(arr), dtype=bool)
    except (TypeError, ValueError, OverflowError):
        pass
    try:  # ints and None (timestamps not known yet): still no Python loop
        obj = np.array(values, dtype=object)
        if obj.ndim == 1:
            mask = np.equal(obj, None)
            obj[mask] = 0
            if all(type(v) is int for v in obj[~mask][:1]):
                return obj.astype(np.int64), mask
    except (TypeError, ValueError, OverflowError):
        pass
    clean = [as_int(v) for v in values]
    clean = [v if v is not None and -(2**63) < v < 2**63 else None for v in clean]
    mask = np.array([v is None for v in clean], dtype=bool)
    return np.array([0 if v is None else v for v in clean], dtype=np.int64), mask


def _float_column(values: list[Any]) -> np.ndarray:
    try:
        arr = np.array(values, dtype=np.float64)  # None becomes NaN
        if arr.ndim == 1:
            return arr
    except (TypeError, ValueError):
        pass
    return np.array(
        [float(v) if type(v) in (int, float) else np.nan for v in values], dtype=np.float64
    )


def _bool_column(values: list[Any]) -> np.ndarray:
    if set(map(type, values)) <= {bool}:  # the usual column: no Python loop
        return np.array(values, dtype=np.int8)
    return np.array([1 if v is True else 0 if v is False else -1 for v in values], dtype=np.int8)


def _distinct(values: Sequence[Any]) -> tuple[list[Any], np.ndarray]:
    """The distinct objects of ``values`` by identity, and each value's index among them. A
    dump's pickle stores a repeated list once and refers to it from every entry, so a column of
    2000 sizes is a handful of objects: each is made a key once, not once per entry."""
    ids = list(map(id, values))
    first = dict(zip(ids, values, strict=True))  # the values stay alive: ids are not reused
    index = {k: i for i, k in enumerate(first)}
    at = np.fromiter(map(index.__getitem__, ids), dtype=np.int64, count=len(ids))
    return list(first.values()), at


def _hashable(values: Sequence[Any], *, flat: bool) -> list[Any]:
    """Keys for coding nested lists, built without a Python-level loop: a tuple for a flat list
    of names (dtypes), a tuple of tuples for a list of lists (sizes), else the ``str()``;
    :func:`_json_category` turns each distinct key into JSON once."""
    try:
        if flat:
            keys = list(map(tuple, values))
        else:  # [[4, 8], [2]] -> ((4, 8), (2,))
            keys = list(map(tuple, map(map, repeat(tuple), values)))
        hash(tuple(keys))
        return keys
    except TypeError:  # a None, a number or a deeper list where lists belong
        return list(map(_str_or_none, values))


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _json_category(key: Any) -> str | None:
    """JSON text for a key made by :func:`_hashable`; None for anything that is not a nested
    list of ints or plain words."""
    if isinstance(key, tuple):
        if all(type(x) in (str, int) for x in key):
            return json.dumps(list(key))
        if all(type(x) is tuple and all(type(y) is int for y in x) for x in key):
            return json.dumps(key)
        if all(type(x) is list for x in key):
            key = str(list(key))
        else:
            return None
    if not isinstance(key, str) or len(key) > 4096 or not _REPR_SAFE.fullmatch(key):
        return None
    candidate = key.replace("'", '"')
    try:
        json.loads(candidate)
    except ValueError:
        return None
    return candidate


def parse_ranks(text: Any) -> str | None:
    """``"[0, 1, 2]"`` -> ``"0,1,2"``, parsed as text; anything else is None."""
    if not isinstance(text, str):
        return None
    # The dump before this one most often has the same text: compared, it is not hashed (the
    # world's members are 100 kB of text at 16k ranks; a hash of them costs more than a compare)
    last_text, last_parsed = _last_ranks
    if text == last_text:
        return last_parsed
    parsed = _parse_ranks(text)
    _last_ranks[:] = [text, parsed]
    return parsed


#: The text parse_ranks parsed last, and what it gave.
_last_ranks: list[Any] = [None, None]


@functools.lru_cache(maxsize=256)
def _parse_ranks(text: str) -> str | None:
    # Every dump of a job repeats its groups' members: the world's is 16k numbers at 16k ranks,
    # milliseconds to match, so each distinct text is parsed once per worker.
    if not _RANKS_TEXT.fullmatch(text):
        return None
    return ",".join(re.findall(r"-?\d+", text))


def _group_ranks(pg_config: Any, names: list[Any]) -> list[str | None]:
    """Each entry's group ranks from ``pg_config``.

    Groups are looked up by name. gloo dumps of this torch version have a single ``pg_config``
    key ``''`` (name and desc empty, the ranks of whichever group registered last) while entries
    name their group (``'0'``); those ranks are attributed only when every entry of the dump is on
    one group, since otherwise nobody can say which group they belong to.
    """
    if not isinstance(pg_config, dict):
        return [None] * len(names)
    table: dict[Any, str | None] = {}
    for key, info in pg_config.items():
        if isinstance(info, dict):
            table[key] = parse_ranks(info.get("ranks"))
    distinct = {n for n in names if isinstance(n, str)}
    if "" in table and "" not in distinct and len(distinct) == 1 and table[""]:
        table.setdefault(next(iter(distinct)), table[""])
    return [table.get(n) if isinstance(n, str) else None for n in names]


def _no_sentinel(value: int | None) -> int | None:
    return None if value is None or value < 0 else value


# --- frames ------------------------------------------------------------------------------------
def parse_frames(items: Sequence[tuple[int, str]]) -> dict[str, Any]:
    """Worker: frames of every entry, as codes into the distinct frames of these files.

    A pickle goes to the compiled scanner first (:func:`_scan_frames`); one it declines, or
    every one where it is not built, is unpickled and read by :func:`_dump_frames` (the same
    rows)."""
    problems: list[tuple[int, str]] = []
    table: dict[tuple[Any, Any, Any], int] = {}
    files, records, depths, codes = [], [], [], []
    with _gc_paused():
        for index, path in items:
            data = _read_bytes(index, path, problems)
            if data is None:
                continue
            rows = _scan_frames(data)
            if rows is None:
                dump = _decode(index, data, problems)
                if dump is None:
                    continue
                rows = _dump_frames(_entries(index, dump, problems))
            del data
            distinct, record, depth, code = rows
            lookup = [table.setdefault(key, len(table)) for key in distinct]
            files.append(np.full(len(code), index, dtype=np.int32))
            records.append(record)
            depths.append(depth)
            codes.append(np.array(lookup, dtype=np.int64)[code] if len(code) else code)
    arrays = {
        "file_index": _cat(files, np.int32),
        "record_id": _cat(records, np.int64),
        "depth": _cat(depths, np.int64),
        "frame": _cat(codes, np.int64),
    }
    return {"arrays": arrays, "meta": {"frames": list(table), "problems": problems}}


#: A dump's frames as rows: the distinct frames, (name, filename, line), in the order the rows
#: meet them, and per row its entry's ``record_id`` (-1: none), its depth and its frame's index.
FrameRows = tuple[list[tuple[Any, Any, Any]], np.ndarray, np.ndarray, np.ndarray]


def _scan_frames(data: bytes) -> FrameRows | None:
    """A pickle's frame rows by the compiled scanner, or None where it is not built, the dump
    is JSON, or the scanner leaves the pickle (or a frame of it) to the Python reader."""
    if _fr_scan is None or _is_json(data):
        return None
    out = _fr_scan.scan(
        data, ("record_id",), "duration_ms", (), (), (), MACHINERY, PATH_DEPTH, MAX_FRAMES
    )
    if out is None:
        return None
    ints, masks = out[2], out[3]
    distinct, entry, depth, code = out[8]
    record = np.where(np.frombuffer(masks[0], bool), -1, np.frombuffer(ints[0], np.int64))
    entry = np.frombuffer(entry, np.int32)
    depth, code = np.frombuffer(depth, np.int32), np.frombuffer(code, np.int32)
    return distinct, record[entry], depth.astype(np.int64), code.astype(np.int64)


def _dump_frames(entries: list[dict[str, Any]]) -> FrameRows:
    """The frame rows of unpickled entries. torch's pickles store each distinct frame once and
    refer to it from every entry, so frames are recognised by identity first and only new
    objects are looked at."""
    table: dict[tuple[Any, Any, Any], int] = {}
    records, depths, codes = [], [], []
    seen: dict[int, int] = {}  # id(frame dict) -> code, valid while the dump is alive
    for entry in entries:
        frames = entry.get("frames")
        if not isinstance(frames, list):
            continue
        record = as_int(entry.get("record_id"))
        if record is None or not -(2**63) < record < 2**63:  # none, or no int64
            record = -1
        frames = frames[:MAX_FRAMES]
        known = list(map(seen.get, map(id, frames)))
        if None not in known:  # every frame seen before (the usual entry): no loop
            n = len(known)
            records.extend(repeat(record, n))
            depths.extend(range(n))
            codes.extend(known)
            continue
        for depth, frame in enumerate(frames):
            code = seen.get(id(frame))
            if code is None:
                if not isinstance(frame, dict):
                    continue
                key = (
                    as_str(frame.get("name")),
                    as_str(frame.get("filename")),
                    as_int(frame.get("line")),
                )
                code = seen[id(frame)] = table.setdefault(key, len(table))
            records.append(record)
            depths.append(depth)
            codes.append(code)
    return (
        list(table),
        np.array(records, dtype=np.int64),
        np.array(depths, dtype=np.int64),
        np.array(codes, dtype=np.int64),
    )


# --- the pool ---------------------------------------------------------------------------------
class _gc_paused:
    """Pause the cyclic GC while building many small containers; restore it after, always."""

    def __enter__(self) -> None:
        self.was_enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self.was_enabled:
            gc.enable()


# --- transport ---------------------------------------------------------------------------------
TASKS: dict[str, Callable[[Sequence[tuple[int, str]]], dict[str, Any]]] = {
    "entries": parse_entries,
    "frames": parse_frames,
}


#: The array types a part may hold: plain numbers, nothing that unpickles.
PART_DTYPES = frozenset(np.dtype(t).str for t in ("i1", "i2", "i4", "i8", "f8", "bool"))
#: Longest header a part may have (category lists, pg_status rows, problems).
MAX_HEADER = 1 << 30


def encode(part: dict[str, Any], out: BinaryIO) -> None:
    """Write a part to ``out``: an 8-byte length, a JSON header (the meta, and each array's
    name, type and length), then each array's raw bytes. Streamed: nothing is copied."""
    arrays = {k: np.ascontiguousarray(v) for k, v in part["arrays"].items()}
    header = {
        "meta": part["meta"],
        "arrays": [[k, a.dtype.str, len(a)] for k, a in arrays.items()],
    }
    data = json.dumps(header).encode()
    out.write(len(data).to_bytes(8, "little"))
    out.write(data)
    for a in arrays.values():
        out.write(memoryview(a).cast("B"))
    out.flush()


def decode(stream: BinaryIO) -> dict[str, Any]:
    """The next part :func:`encode` wrote, read from ``stream`` straight into its arrays (no
    copy of the whole part is ever held). Only plain number types are accepted.

    Raises:
        ValueError: the stream ends early, or its header is not what :func:`encode` writes.
    """
    return _decode_part(stream, _read_exactly(stream, 8))


def decode_all(stream: BinaryIO) -> list[dict[str, Any]]:
    """Every part :func:`encode` wrote to ``stream``, up to its end."""
    parts = []
    while head := stream.read(8):
        if len(head) != 8:
            raise ValueError("a part ends early")
        parts.append(_decode_part(stream, head))
    return parts


def _decode_part(stream: BinaryIO, head: bytes) -> dict[str, Any]:
    size = int.from_bytes(head, "little")
    if size > MAX_HEADER:
        raise ValueError(f"a part's header of {size} bytes")
    header = json.loads(_read_exactly(stream, size))
    arrays = {}
    for name, dtype, n in header["arrays"]:
        if dtype not in PART_DTYPES or not isinstance(n, int) or n < 0:
            raise ValueError(f"a part's array {name!r} of type {dtype!r}, length {n!r}")
        arrays[name] = a = np.empty(n, dtype=np.dtype(dtype))
        _read_into(stream, memoryview(a).cast("B"))
    return {"arrays": arrays, "meta": header["meta"]}


def _read_exactly(stream: BinaryIO, n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise ValueError("a part ends early")
    return data


def _read_into(stream: BinaryIO, view: memoryview) -> None:
    done = 0
    while done < len(view):
        got = stream.readinto(view[done:])  # a pipe gives what it has
        if not got:
            raise ValueError("a part ends early")
        done += got


#: A worker sends back a part every this many files: what it holds at once stays bounded
#: (256 dumps of 2000 entries are about 80 MB of columns) however large its share.
PART_FILES = 256


def main() -> None:
    task = json.loads(sys.stdin.buffer.read())
    items = [(int(i), str(p)) for i, p in task["items"]]
    step = max(1, int(task.get("part_files", PART_FILES)))
    for at in range(0, len(items), step):
        encode(TASKS[task["what"]](items[at : at + step]), sys.stdout.buffer)


if __name__ == "__main__":
    main()
