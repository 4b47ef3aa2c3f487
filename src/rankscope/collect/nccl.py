"""NCCL_DEBUG output: per-process files (``NCCL_DEBUG_FILE=nccl.%h.%p``) or lines mixed into a
rank's stdout/stderr.

Line formats (NCCL's ``debug.cc``)::

    NCCL version 2.21.5+cuda12.4
    host:pid:tid [dev] NCCL INFO message
    [2026-01-02 10:11:12] host:pid:tid [dev] file.cc:123 NCCL WARN message      (2.26+: stamped)
    host:pid:tid [dev] file.cc:123 (function) NCCL WARN message                (2.30.7+)
    host:pid:tid [dev] 12.345 function:123 NCCL TRACE message
    host:pid:tid NCCL CALL ncclSend(...)

Logs of hundreds of megabytes are normal, so lines are never handled one by one in Python: each
chunk of the file goes through one compiled pass (:mod:`rankscope.collect._nccl_scan`) that
finds the NCCL lines, their level and header and copies their messages into an Arrow buffer;
only the distinct line headers (``host:pid:tid [dev]``: a few per process) are parsed in Python.
Chunks run on a thread pool (the pass releases the GIL).
"""

from __future__ import annotations

import mmap
import os
import re
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from rankscope import schema
from rankscope.collect._common import (
    Problems,
    Source,
    SourceLike,
    as_sources,
    categorical,
    code_type,
    finish,
    pooled_empty,
    problem_list,
)
from rankscope.collect.logs import line_time

READER = "nccl"
CHUNK_BYTES = 16 << 20
LEVELS = ("INFO", "WARN", "TRACE", "CALL", "ABORT", "VERSION")
#: What every NCCL line holds (``_nccl_scan._keyword`` finds it at a word's start).
_KEYWORD = b"NCCL "

#: What comes before ``NCCL <LEVEL>``: torchrun/torch prefixes, NCCL's WARN timestamp, then
#: ``host:pid:tid``, the device, the TRACE clock, ``file:line`` and ``(function)``.
_HEADER = re.compile(
    r"(?P<prefixes>(?:\[[A-Za-z_][\w\-]*?\d+\]:)*)"
    r"(?:\[(?P<stamp>\d{4}-\d\d-\d\d[ _T]\d\d:\d\d:\d\d[^\]]*)\] )?"
    r"(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+)"
    r"(?: \[(?P<dev>-?\d+)\])?"
    r"(?: (?P<clock>\d+\.\d+))?"
    r"(?: (?P<file>[^\s:()]+):(?P<line>\d+))?"
    r"(?: \((?P<func>[^)\s]*)\))?"
)
_PREFIX_RANK = re.compile(r"\[rank(\d+)\]:")
#: Communicator set-up and tear-down (init.cc), with or without the newest ``[Rank N]`` prefix.
_COMM = re.compile(
    r"comm (?P<comm>0x[0-9a-fA-F]+) rank (?P<rank>-?\d+) nranks (?P<nranks>\d+) "
    r"cudaDev (?P<dev>-?\d+)(?: nvmlDev -?\d+)? busId (?P<bus>[0-9a-fA-Fx]+)"
    r"(?:.*? commId (?P<comm_id>0x[0-9a-fA-F]+))?.*? - (?P<what>Init|Destroy) (?P<state>START|COMPLETE)"
)


@dataclass(frozen=True)
class NcclTables:
    """The NCCL lines and the communicators they announce, from one pass over the files."""

    lines: pd.DataFrame
    comms: pd.DataFrame


@dataclass
class _Part:
    """One chunk's NCCL lines: per-line arrays (rows are line indices within the chunk)."""

    source: int
    n_lines: int
    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    level: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    header: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    message: pa.Array = field(default_factory=lambda: pa.array([], type=pa.large_string()))
    init_lines: list[tuple[int, str]] = field(default_factory=list)
    not_utf8: bool = False


def read_nccl(
    sources: Iterable[SourceLike],
    *,
    pid_ranks: Mapping[tuple[str, int], int] | None = None,
    problems: Problems | None = None,
) -> pd.DataFrame:
    """NCCL_DEBUG lines, one row each; other lines of the files are ignored.

    ``rank`` is the job rank of the process that wrote the line: a ``[rankN]:`` prefix, else the
    file's rank, else ``pid_ranks[(host, pid)]``, else the rank of the process's largest
    communicator (its world communicator) in its ``Init`` lines. Example::

           rank    host    pid    tid  device level                  t_s             file  line                          message                source  line_no
        0     0  gpu-a1  41234  41300       0  INFO                 <NA>             <NA>  <NA>  Bootstrap : Using eth0:10.0.1.9<0>  nccl.gpu-a1.41234.log        2
        1     0  gpu-a1  41234  41311       0  WARN  1.767345e+09  transport/net.cc   800  Socket recv failed ...           nccl.gpu-a1.41234.log       10

    Args:
        sources: NCCL_DEBUG_FILE outputs or stdout/stderr logs that hold NCCL lines.
        pid_ranks: (host, pid) -> rank, from other evidence (the probe's start events).
        problems: where unreadable files are reported; ``None`` raises ``ValueError``.
    """
    return load_nccl(sources, pid_ranks=pid_ranks, problems=problems).lines


def read_nccl_comms(
    sources: Iterable[SourceLike],
    *,
    pid_ranks: Mapping[tuple[str, int], int] | None = None,
    problems: Problems | None = None,
) -> pd.DataFrame:
    """Communicators announced in NCCL_DEBUG=INFO output, with the NCCL version of their process.

    Example::

           rank    host    pid            comm             comm_id  nccl_rank  nranks  cuda_dev bus_id     state nccl_version                 source  line_no
        0     0  gpu-a1  41234  0x55d4c8a0b2c0  0x5ae77eb5ea4ec1ee          0       4         0  1b000     START  2.21.5+cuda12.4  nccl.gpu-a1.41234.log  5
        1     0  gpu-a1  41234  0x55d4c8a0b2c0  0x5ae77eb5ea4ec1ee          0       4         0  1b000  COMPLETE  2.21.5+cuda12.4  nccl.gpu-a1.41234.log  9
    """
    return load_nccl(sources, pid_ranks=pid_ranks, problems=problems).comms


def load_nccl(
    sources: Iterable[SourceLike],
    *,
    pid_ranks: Mapping[tuple[str, int], int] | None = None,
    problems: Problems | None = None,
    threads: int = 2,
) -> NcclTables:
    """Both NCCL tables from one pass over the files (see :func:`read_nccl`)."""
    problems = problem_list(problems)
    sources = as_sources(sources)
    heads = _Heads()
    parts: list[_Part] = []
    with ThreadPoolExecutor(max(1, threads)) as pool:
        pending: deque[Future[_Part]] = deque()
        for index, data in _chunks(sources, problems):
            pending.append(pool.submit(_parse_chunk, index, data, heads))
            while len(pending) > 2 * threads:  # bounded read-ahead: memory stays a few chunks
                parts.append(pending.popleft().result())
        parts.extend(f.result() for f in pending)
        if not parts and not any(source.stream is None for source in sources):
            # no NCCL line anywhere (a gloo job's logs): nothing to build
            return NcclTables(schema.empty("nccl"), schema.empty("nccl_comms"))
        for index in sorted({p.source for p in parts if p.not_utf8}):
            problems.add(
                sources[index], READER, "not UTF-8 text; undecodable bytes are shown as U+FFFD"
            )
        found = {p.source for p in parts if len(p.level)}
        for index, source in enumerate(sources):
            if source.stream is None and index not in found and _has_content(source):
                # A file of its own (NCCL_DEBUG_FILE) without one NCCL line is not what it claims.
                problems.add(source, READER, "no NCCL_DEBUG line in the file")
        return _tables(parts, sources, heads.parsed, pid_ranks or {}, pool)


def _has_content(source: Source) -> bool:
    try:
        return source.path.stat().st_size > 0
    except OSError:
        return False


class _Heads:
    """The distinct line headers seen so far, parsed once each; shared by the chunk threads."""

    def __init__(self) -> None:
        self.ids: dict[bytes, int] = {}
        self.parsed: list[tuple[Any, ...]] = []
        self._lock = threading.Lock()

    def lookup(self, raws: list[bytes]) -> np.ndarray:
        """Ids of the headers (-1: not an NCCL header), with a trailing -1 for lookups."""
        missing = [raw for raw in raws if raw not in self.ids]
        if missing:
            with self._lock:
                for raw in missing:
                    if raw not in self.ids:
                        head = _parse_head(raw)
                        self.ids[raw] = -1 if head is None else len(self.parsed)
                        if head is not None:
                            self.parsed.append(head)
        return np.array([self.ids[raw] for raw in raws] + [-1], dtype=np.int32)


def _ints(values: Sequence[Any]) -> np.ndarray:
    """Ints with -1 for none (no real value is negative)."""
    return np.array([-1 if v is None or v < 0 else v for v in values], dtype=np.int64)


def _categories(values: Sequence[Any]) -> tuple[list[Any], np.ndarray]:
    """Distinct values (None left out) and each value's code in them, in the smallest int type
    (what pandas keeps for a categorical's codes)."""
    table: dict[Any, int] = {}
    codes = [-1 if v is None else table.setdefault(v, len(table)) for v in values]
    return list(table), np.array(codes, dtype=code_type(len(table)))


def _chunks(sources: list[Source], problems: Problems) -> Iterator[tuple[int, memoryview]]:
    """(source index, bytes ending at a line end) in file order.

    Files are memory-mapped, so a chunk is a view of the page cache, not a copy; only a last line
    without its newline is copied, to add one. A file without the keyword (a gloo job's rank
    log) yields nothing: one search, and the compiled pass is not even loaded (Numba's import
    and cache cost a second, the first time in a process).
    """
    for index, source in enumerate(sources):
        try:
            with open(source.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        except (OSError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            problems.add(source, READER, f"cannot read the file: {reason}")
            continue
        if data.find(_KEYWORD) < 0:
            continue
        view, n, start = memoryview(data), len(data), 0
        while start < n:
            cut = n
            if start + CHUNK_BYTES < n:
                cut = data.rfind(b"\n", start, start + CHUNK_BYTES) + 1
                if cut <= start:  # a line longer than a chunk
                    cut = data.find(b"\n", start + CHUNK_BYTES) + 1 or n
            if data[cut - 1] == 10:
                yield index, view[start:cut]
            else:
                yield index, memoryview(bytes(view[start:cut]) + b"\n")
            start = cut


def _parse_chunk(index: int, data: memoryview, heads: _Heads) -> _Part:
    from rankscope.collect import _nccl_scan  # Numba: loaded on first use, not on import

    a = np.frombuffer(data, dtype=np.uint8)
    rows, level, local, flags, offsets, text, head_at, head_len, n_lines, not_ascii = (
        _nccl_scan.scan(a)
    )
    part = _Part(source=index, n_lines=n_lines)
    if not len(rows):
        return part
    ids = heads.lookup(
        [bytes(data[s : s + n]) for s, n in zip(head_at.tolist(), head_len.tolist(), strict=True)]
    )
    header = ids[local]
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(text)]
    if not_ascii:  # Arrow checks the UTF-8
        messages = pa.Array.from_buffers(pa.large_binary(), len(rows), buffers)
        try:
            messages = messages.cast(pa.large_string())
        except pa.ArrowInvalid:
            messages = pa.array(
                [b.decode("utf-8", "replace") for b in messages.to_pylist()],
                type=pa.large_string(),
            )
            part.not_utf8 = True
    else:
        messages = pa.Array.from_buffers(pa.large_string(), len(rows), buffers)
    # A line is NCCL's if its header parses (the bare version line has none).
    keep = (header >= 0) | (level == _VERSION)
    if not keep.all():
        rows, level, header, flags = rows[keep], level[keep], header[keep], flags[keep]
        messages = messages.filter(pa.array(keep))
    part.rows, part.level, part.header, part.message = rows, level, header, messages
    maybe = np.flatnonzero(flags & _nccl_scan.MAY_ANNOUNCE)
    part.init_lines = list(
        zip(maybe.tolist(), messages.take(pa.array(maybe)).to_pylist(), strict=True)
    )
    return part


# --- assembling the tables ----------------------------------------------------------------------
#: prefix rank, host, pid, tid, device, file, line, t_s: what a header says (nothing, here).
_NO_HEAD: tuple[Any, ...] = (None,) * 8
_VERSION = LEVELS.index("VERSION")


def _parse_head(raw: bytes) -> tuple[Any, ...] | None:
    """What one distinct header says, or None if it is not an NCCL header."""
    text = raw.decode("utf-8", "replace")
    if not text:
        return _NO_HEAD
    m = _HEADER.fullmatch(text)
    if m is None:
        return None
    ranks = _PREFIX_RANK.findall(m["prefixes"] or "")
    stamp = m["stamp"]
    return (
        int(ranks[-1]) if ranks else None,
        m["host"],
        int(m["pid"]),
        int(m["tid"]),
        None if m["dev"] is None else int(m["dev"]),
        m["file"] or m["func"],
        None if m["line"] is None else int(m["line"]),
        None if stamp is None else line_time(f"[{stamp}]", 0),
    )


def _tables(
    parts: list[_Part],
    sources: list[Source],
    parsed: list[tuple[Any, ...]],
    pid_ranks: Mapping[tuple[str, int], int],
    pool: ThreadPoolExecutor,
) -> NcclTables:
    """Both tables from the chunks' parts.

    Every per-line column is allocated once at its final size and each part fills its slice on
    the pool: millions of lines cost one write per column, no concatenation.
    """
    head = [*parsed, _NO_HEAD]  # code -1 (no header) picks the last
    fields = list(zip(*head, strict=True))
    pid_of = _ints(fields[2])
    sizes = [len(p.level) for p in parts]
    offsets = np.cumsum([0, *sizes])
    announced = [  # (row, header id, match) of every communicator line
        (int(offsets[i] + pos), int(part.header[pos]), m)
        for i, part in enumerate(parts)
        for pos, text in part.init_lines
        if (m := _COMM.search(text))
    ]
    # A process without a rank: the rank it has in its largest communicator (the world's).
    known = dict(pid_ranks)
    for _, h, m in sorted(announced, key=lambda row: -int(row[2]["nranks"])):
        known.setdefault((head[h][1], int(pid_of[h])), int(m["rank"]))
    process = np.array([known.get((h[1], h[2]), -1) for h in head], dtype=np.int64)
    prefix = _ints(fields[0])
    hosts, host_code = _categories(fields[1])
    files, file_code = _categories(fields[5])
    stamps = np.array([np.nan if v is None else v for v in fields[7]], dtype=np.float64)
    # Integer columns per header: the rank (a [rankN]: prefix, else the file's, else the
    # process's, known above; one table per file rank), pid, tid, device, line.
    ints = ("rank", "pid", "tid", "device", "line")
    rest = np.stack([pid_of, _ints(fields[3]), _ints(fields[4]), _ints(fields[6])], axis=1)
    per_file = {
        r: np.column_stack([np.where(prefix >= 0, prefix, r if r >= 0 else process), rest])
        for r in {_rank(sources[p.source]) for p in parts}
    }
    line_base, next_line = [], {}
    for part in parts:  # a chunk's rows count on from the lines of the file's earlier chunks
        line_base.append(next_line.get(part.source, 1))
        next_line[part.source] = line_base[-1] + part.n_lines

    n = int(offsets[-1])
    out = {k: pooled_empty(n, np.int64) for k in ints}
    missing = {k: pooled_empty(n, bool) for k in ints}
    t_s, t_missing = pooled_empty(n, np.float64), pooled_empty(n, bool)
    host, file = pooled_empty(n, host_code.dtype), pooled_empty(n, file_code.dtype)
    line_no = pooled_empty(n, np.int64)
    source = pooled_empty(n, np.int32)

    def fill(i: int) -> None:
        from rankscope.collect import _nccl_scan  # Numba: only where there are NCCL lines

        part, at = parts[i], slice(offsets[i], offsets[i + 1])
        _nccl_scan.fill(
            part.header,
            per_file[_rank(sources[part.source])],
            stamps,
            host_code,
            file_code,
            tuple(out[k][at] for k in ints),
            tuple(missing[k][at] for k in ints),
            t_s[at],
            t_missing[at],
            host[at],
            file[at],
        )
        np.add(part.rows, line_base[i], out=line_no[at])
        source[at] = part.source

    list(pool.map(fill, range(len(parts))))
    rank = _fill_from_file(out["rank"], source, missing["rank"])
    messages = pa.chunked_array([p.message for p in parts], type=pa.large_string())
    lines = finish(
        "nccl",
        {
            "rank": pd.arrays.IntegerArray(rank, missing["rank"]),
            "host": pd.Categorical.from_codes(host, categories=hosts),
            **{k: pd.arrays.IntegerArray(out[k], missing[k]) for k in ("pid", "tid", "device")},
            "level": pd.Categorical.from_codes(
                _join([p.level for p in parts], np.int8), categories=list(LEVELS)
            ),
            "t_s": pd.arrays.FloatingArray(t_s, t_missing),
            "file": pd.Categorical.from_codes(file, categories=files),
            "line": pd.arrays.IntegerArray(out["line"], missing["line"]),
            "message": pd.arrays.ArrowStringArray(messages),
            "source": categorical(source, [s.name for s in sources]),
            "line_no": pd.arrays.IntegerArray(line_no, np.zeros(n, dtype=bool)),
        },
    )
    comm_at = np.array([pos for pos, _, _ in announced], dtype=np.int64)
    matches = [m for _, _, m in announced]
    versions = _versions(parts)
    comms = finish(
        "nccl_comms",
        {
            "rank": _int64(rank[comm_at]),
            "host": pd.array([head[h][1] for _, h, _ in announced], dtype="string"),
            "pid": _int64(out["pid"][comm_at]),
            "comm": [m["comm"] for m in matches],
            "comm_id": [m["comm_id"] for m in matches],
            "nccl_rank": [int(m["rank"]) for m in matches],
            "nranks": [int(m["nranks"]) for m in matches],
            "cuda_dev": [int(m["dev"]) for m in matches],
            "bus_id": [m["bus"] for m in matches],
            "state": [m["state"] if m["what"] == "Init" else "DESTROYED" for m in matches],
            "nccl_version": [versions.get(int(source[p])) for p in comm_at],
            "source": [sources[int(source[p])].name for p in comm_at],
            "line_no": _int64(line_no[comm_at]),
        },
    )
    return NcclTables(lines=lines, comms=comms)


def _fill_from_file(rank: np.ndarray, source: np.ndarray, missing: np.ndarray) -> np.ndarray:
    """Lines without a process (the version line) take the rank of their file's one process.

    A file's lines are one run of ``source`` (chunks are parsed in file order); the few lines
    without a rank are filled in place, in ``rank`` and its ``missing`` mask.
    """
    lost = np.flatnonzero(missing)
    if not len(lost):
        return rank
    starts = np.flatnonzero(np.r_[True, source[1:] != source[:-1]])
    ends = np.r_[starts[1:], len(source)]
    for i in np.unique(np.searchsorted(starts, lost, side="right") - 1):
        lines = rank[starts[i] : ends[i]]
        top = lines.max()
        if top >= 0 and ((lines == top) | (lines < 0)).all():  # one process in the file
            gap = lines < 0
            lines[gap] = top
            missing[starts[i] : ends[i]][gap] = False
    return rank


def _versions(parts: list[_Part]) -> dict[int, str]:
    """The NCCL version each file announced first (``NCCL version 2.21.5+cuda12.4``)."""
    found: dict[int, str] = {}
    for part in parts:
        at = np.flatnonzero(part.level == _VERSION)
        for text in part.message.take(pa.array(at)).to_pylist() if len(at) else ():
            if text:
                found.setdefault(part.source, text.split()[0])
    return found


def _join(arrays: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype)


def _rank(source: Source) -> int:
    return -1 if source.rank is None else source.rank


def _int64(values: np.ndarray) -> pd.arrays.IntegerArray:
    return pd.arrays.IntegerArray(values.astype(np.int64, copy=False), values < 0)
