"""torch's flight-recorder dumps: pickle or JSON, format versions 2.3 to 2.10, gloo and nccl.

A dump is one rank's ring buffer of recent collectives (``entries``), the process groups it knows
(``pg_config``) and per-group progress (``pg_status``). Pickles are read with
:mod:`rankscope.collect.safe_pickle`, never with ``pickle.load``; the ``ranks`` strings
(``"[0, 1]"``) are parsed as text, never ``eval``'d.

A pickle's entries are read by a compiled scanner straight into columns (``_fr_scan``); one it
cannot vouch for, or every one where it is not built, by the restricted unpickler (the same
table). Large loads (many ranks) run in worker processes, one per core: each reads its share
and sends back compact columns (integer arrays and category codes) every 256 files, so neither
the dumps nor one Python object per entry cross the process boundary. Of the stack frames that
pass keeps each entry's call path (the ``path`` column: the frames outermost first, without
:data:`rankscope.rundir.MACHINERY`'s, one JSON text per distinct path); the frames themselves
are read only when :func:`read_fr_frames` is asked for them.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import subprocess
import sys
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rankscope.collect import _fr_parse
from rankscope.collect._common import (
    Problems,
    Source,
    SourceLike,
    as_sources,
    categorical,
    finish,
    problem_list,
)
from rankscope.collect._fr_parse import (
    BOOL_FIELDS,
    CODED,
    INT_FIELDS,
    PG_STATUS_FIELDS,
    parse_ranks,
)

READER = "flight_recorder"
#: Below this many bytes in all, worker processes cost more than they save.
POOL_MIN_BYTES = 32 << 20
_SRC = str(Path(__file__).resolve().parents[2])  # the folder that holds the rankscope package

__all__ = [
    "FlightRecorderTables",
    "load_flight_recorder",
    "parse_ranks",
    "read_flight_recorder",
    "read_fr_frames",
    "read_pg_status",
]


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _run(what: str, sources: list[Source], workers: int | None) -> list[dict[str, Any]]:
    """Parts for the files, one for every :data:`~rankscope.collect._fr_parse.PART_FILES`
    files (what is held besides the finished parts stays bounded whatever the number of ranks):
    in this process for small loads, else in one worker process per core.

    The files are read in the order of their ranks (a file of no known rank last), and the parts
    come back in that order: the rows of the tables are by rank, then as the dump lists them,
    which is the order the analysis works in (no copy of 32 million rows to sort them; file
    names alone put rank 10 before rank 2).

    Workers are fresh interpreters (``python -m rankscope.collect._fr_parse``), not forks: they
    re-run nothing of the caller's script and inherit none of its threads, and they send back
    raw arrays behind a JSON header, not pickles. A worker that fails has its share redone here.
    """
    order = sorted(range(len(sources)), key=lambda i: _rank_key(sources[i]))
    items = [(i, str(sources[i].path)) for i in order]
    size = sum(_size(s) for s in sources)
    if workers is None:
        workers = _cpu_count() if size >= POOL_MIN_BYTES else 1
    step = _fr_parse.PART_FILES
    chunks = [items[at : at + step] for at in range(0, len(items), step)]
    workers = max(1, min(workers, len(chunks)))
    task = _fr_parse.TASKS[what]
    if workers == 1:
        return [task(chunk) for chunk in chunks] or [task([])]
    # Chunks dealt out in turn (neighbouring ranks' dumps are alike in size); worker w's j-th
    # part is chunk w + j * workers.
    shares = [chunks[w::workers] for w in range(workers)]
    with ThreadPoolExecutor(workers) as pool:
        done = list(pool.map(lambda share: _in_worker(what, share), shares))
    return [done[k % workers][k // workers] for k in range(len(chunks))]


def _rank_key(source: Source) -> tuple[bool, int]:
    return source.rank is None, source.rank or 0


def _in_worker(what: str, chunks: list[list[tuple[int, str]]]) -> list[dict[str, Any]]:
    """One part for each of the chunks (each full but the last), from a worker process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_SRC, env.get("PYTHONPATH")) if p)
    try:
        with subprocess.Popen(
            [sys.executable, "-m", "rankscope.collect._fr_parse"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        ) as proc:
            assert proc.stdin is not None and proc.stdout is not None
            with proc.stdin:
                share = [item for chunk in chunks for item in chunk]
                task = {"what": what, "items": share, "part_files": _fr_parse.PART_FILES}
                proc.stdin.write(json.dumps(task).encode())
            try:
                parts = _fr_parse.decode_all(proc.stdout)
            finally:
                proc.stdout.close()
        if proc.returncode == 0 and len(parts) == len(chunks):
            return parts
    except (OSError, ValueError):
        pass
    # A worker that died or sent back a damaged part: its share is redone here.
    return [_fr_parse.TASKS[what](chunk) for chunk in chunks]


def _size(source: Source) -> int:
    try:
        return source.path.stat().st_size
    except OSError:
        return 0


# --- public readers ---------------------------------------------------------------------------
@dataclass(frozen=True)
class FlightRecorderTables:
    """What one pass over the dumps gives: the entries and the per-group status."""

    entries: pd.DataFrame
    pg_status: pd.DataFrame


def load_flight_recorder(
    sources: Iterable[SourceLike],
    *,
    problems: Problems | None = None,
    workers: int | None = None,
) -> FlightRecorderTables:
    """Entries and ``pg_status`` of every dump in one pass (see :func:`read_flight_recorder`)."""
    problems = problem_list(problems)
    sources = as_sources(sources)
    parts = _run("entries", sources, workers)
    _report(parts, sources, problems)
    _give_back()
    with _small_pages():
        entries = _entries_table(parts, sources)
    _give_back()
    return FlightRecorderTables(entries=entries, pg_status=_pg_status_table(parts, sources))


def read_flight_recorder(
    sources: Iterable[SourceLike],
    *,
    problems: Problems | None = None,
    workers: int | None = None,
) -> pd.DataFrame:
    """Entries of flight-recorder dumps, one row per entry per rank.

    ``profiling_name`` is split into ``backend`` and ``op`` (``nccl:send 0->1`` -> ``nccl``,
    ``send``); timestamps that the dump does not know are null (gloo never records start or end;
    JSON dumps write 0 for unknown); ``input_sizes`` and friends are JSON text. A file that is not
    a readable dump becomes a ``problems`` row and the rest still load. Example::

           rank           source version pg_name     pg_desc pg_ranks  record_id  pg_id  collective_seq_id  p2p_seq_id  op_id   profiling_name backend          op  is_p2p input_sizes input_dtypes output_sizes output_dtypes      state      time_created_ns  time_discovered_started_ns  time_discovered_completed_ns  duration_ms  retired  timeout_ms        thread_id thread_name
        0     0  ranks/0/fr.pkl     2.10       0  default_pg      0,1          0      0                  1           0      1  gloo:all_reduce    gloo  all_reduce   False       [[4]]    ["Float"]        [[4]]     ["Float"]  scheduled  1795290142579614927                        <NA>                          <NA>         <NA>     True     1800000  140512300915584      python
        1     0  ranks/0/fr.pkl     2.10       0  default_pg      0,1          5      0                  5           0      5    gloo:barrier    gloo     barrier   False          []           []           []            []  scheduled  1795290142590212345                        <NA>                          <NA>         <NA>    False     1800000  140512300915584      python

    Args:
        sources: dump files; a file's rank comes from its :class:`~rankscope.collect.Source` or
            from its name (``<prefix><rank>``, as torch names them).
        problems: where unreadable files are reported; ``None`` raises ``ValueError``.
        workers: processes to use; ``None`` uses every core for large loads and this process for
            small ones.
    """
    return load_flight_recorder(sources, problems=problems, workers=workers).entries


def read_pg_status(
    sources: Iterable[SourceLike],
    *,
    problems: Problems | None = None,
    workers: int | None = None,
) -> pd.DataFrame:
    """Per-rank, per-group progress from the dumps' ``pg_status``; -1 ("none yet") is null.

    Example::

           rank pg_id  last_enqueued_collective  last_started_collective  last_completed_collective          source
        0     0     0                         4                     <NA>                          3  ranks/0/fr.pkl
        1     1     0                         4                     <NA>                          3  ranks/1/fr.pkl
    """
    return load_flight_recorder(sources, problems=problems, workers=workers).pg_status


def read_fr_frames(
    sources: Iterable[SourceLike],
    *,
    problems: Problems | None = None,
    workers: int | None = None,
) -> pd.DataFrame:
    """Stack frames of flight-recorder entries (pickle dumps only: JSON dumps carry none).

    Example::

           rank  record_id  depth        name                                     filename  line
        0     0          0      0  all_reduce  /venv/.../torch/distributed/distributed_c10d.py  3245
        1     0          0      3    <module>                          /home/user/train.py     9
    """
    problems = problem_list(problems)
    sources = as_sources(sources)
    parts = _run("frames", sources, workers)
    _report(parts, sources, problems)
    file_index = _joined(parts, "file_index", np.int32)
    frame, distinct = _merge(
        [(p["arrays"]["frame"], [tuple(f) for f in p["meta"]["frames"]]) for p in parts]
    )
    names, filenames, lines = (
        (list(col) for col in zip(*distinct, strict=True)) if distinct else ([], [], [])
    )
    line_of = np.array([-1 if v is None else v for v in lines] + [-1], dtype=np.int64)
    return finish(
        "fr_frames",
        {
            "rank": _ranks(sources, file_index),
            "record_id": _masked(_joined(parts, "record_id", np.int64)),
            "depth": _masked(_joined(parts, "depth", np.int64)),
            "name": categorical(frame, names),
            "filename": categorical(frame, filenames),
            "line": _masked(line_of[frame]),
        },
    )


@contextlib.contextmanager
def _small_pages() -> Iterator[None]:
    """NumPy asks the kernel for transparent huge pages for every array of 4 MiB or more. Where
    the kernel must compact memory to find them (``defrag=madvise``, a host that has run for a
    while), each such array stalls; the entries table is a few dozen of them, and was measured
    three times slower to build with huge pages than without. Off while it is built."""
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:  # NumPy 1.x
        try:
            from numpy.core.multiarray import _set_madvise_hugepage
        except ImportError:
            _set_madvise_hugepage = None
    if _set_madvise_hugepage is None:
        yield
        return
    previous = _set_madvise_hugepage(False)
    try:
        yield
    finally:
        _set_madvise_hugepage(previous)


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim`` (from the symbols this process has loaded), or None elsewhere."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def _give_back() -> None:
    """Return the memory freed so far to the system. glibc keeps freed blocks for reuse, and
    it raises its threshold for a fresh mapping after a large free, so the parts' arrays come
    from its heap; the table's columns, larger, are fresh mappings that never reuse it. Without
    this, the parts stay in the resident set beside the table (2.6 GB more at 16384 ranks)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _report(parts: list[dict[str, Any]], sources: list[Source], problems: Problems) -> None:
    for part in parts:
        for index, reason in part["meta"]["problems"]:
            problems.add(sources[index], READER, reason)


def _joined(parts: list[dict[str, Any]], key: str, dtype: Any) -> np.ndarray:
    """The parts' arrays of ``key`` as one, taken out of the parts: a column's pieces are freed
    as soon as it is built, so the peak is the parts plus one column, not two whole tables."""
    arrays = [p["arrays"].pop(key) for p in parts if key in p["arrays"]]
    if len(arrays) == 1:
        return arrays[0]  # a part's own array, made for this table
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype)


def _ranks(sources: list[Source], file_index: np.ndarray) -> pd.arrays.IntegerArray:
    return _masked(np.array([_rank_code(s) for s in sources] + [-1], dtype=np.int64)[file_index])


def _rank_code(source: Source) -> int:
    return -1 if source.rank is None else source.rank


def _masked(values: np.ndarray) -> pd.arrays.IntegerArray:
    """Int64 with negative values (the missing-value codes used in transit) as <NA>."""
    return pd.arrays.IntegerArray(values.astype(np.int64, copy=False), values < 0)


def _merge(parts: list[tuple[np.ndarray, list[Any]]]) -> tuple[np.ndarray, list[Any]]:
    """One code space for categories coded separately in each worker (code -1 stays -1)."""
    table: dict[Any, int] = {}
    out = []
    for codes, local in parts:
        lookup = [table.setdefault(v, len(table)) for v in local]
        if lookup != list(range(len(local))):
            codes = np.array([*lookup, -1], dtype=np.int32)[codes]
        out.append(codes)
    return (np.concatenate(out) if out else np.zeros(0, np.int32)), list(table)


def _entries_table(parts: list[dict[str, Any]], sources: list[Source]) -> pd.DataFrame:
    file_index = _joined(parts, "file_index", np.int32)
    out: dict[str, Any] = {
        "rank": _ranks(sources, file_index),
        "source": categorical(file_index, [s.name for s in sources]),
    }
    for k in CODED:
        codes, names = _merge(
            [
                (p["arrays"].pop(f"code:{k}"), p["meta"]["categories"][k])
                for p in parts
                if f"code:{k}" in p["arrays"]
            ]
        )
        out[k] = categorical(codes, names)
        if k == "profiling_name":
            split = [_split_profiling_name(n) for n in names]
            out["backend"] = categorical(codes, [b for b, _ in split])
            out["op"] = categorical(codes, [o for _, o in split])
        _give_back()
    for k in INT_FIELDS:
        out[k] = pd.arrays.IntegerArray(
            _joined(parts, f"int:{k}", np.int64), _joined(parts, f"mask:{k}", bool)
        )
        _give_back()
    duration = _joined(parts, "duration_ms", np.float64)
    out["duration_ms"] = pd.arrays.FloatingArray(duration, np.isnan(duration))
    for k in BOOL_FIELDS:
        flag = _joined(parts, f"bool:{k}", np.int8)
        out[k] = pd.arrays.BooleanArray(flag == 1, flag < 0)
    return finish("flight_recorder", out)


def _split_profiling_name(name: Any) -> tuple[str | None, str | None]:
    """``"nccl:send 0->1"`` -> ``("nccl", "send")``; ``"gloo:all_reduce"`` -> ``("gloo", ...)``."""
    if not isinstance(name, str):
        return None, None
    backend, sep, rest = name.partition(":")
    if not sep:
        backend, rest = None, name
    op = rest.strip().split(" ", 1)[0] or None
    return backend or None, op


def _pg_status_table(parts: list[dict[str, Any]], sources: list[Source]) -> pd.DataFrame:
    rows = [row for part in parts for row in part["meta"]["pg_status"]]
    cols = list(zip(*rows, strict=True)) if rows else [[]] * 5
    return finish(
        "pg_status",
        {
            "rank": [sources[i].rank for i in cols[0]],
            "pg_id": list(cols[1]),
            **{k: list(v) for k, v in zip(PG_STATUS_FIELDS, cols[2:], strict=True)},
            "source": [sources[i].name for i in cols[0]],
        },
    )
