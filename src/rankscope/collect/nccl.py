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
chunk of the file is scanned with NumPy for line ends and the ``NCCL <LEVEL>`` keyword, messages
are cut out by Arrow without decoding, and only the distinct line headers (``host:pid:tid
[dev]``: a few per process) are parsed in Python. Chunks run on a thread pool (NumPy and Arrow
release the GIL).
"""

from __future__ import annotations

import re
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from rankscope.collect._common import (
    Problems,
    Source,
    SourceLike,
    as_sources,
    categorical,
    finish,
    problem_list,
)
from rankscope.collect.logs import line_time

READER = "nccl"
CHUNK_BYTES = 4 << 20
LEVELS = ("INFO", "WARN", "TRACE", "CALL", "ABORT", "VERSION")
_WORDS = tuple(w.encode() for w in ("INFO", "WARN", "TRACE", "CALL", "ABORT", "version"))

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
    for index in sorted({p.source for p in parts if p.not_utf8}):
        problems.add(
            sources[index], READER, "not UTF-8 text; undecodable bytes are shown as U+FFFD"
        )
    found = {p.source for p in parts if len(p.level)}
    for index, source in enumerate(sources):
        if source.stream is None and index not in found and _has_content(source):
            # A file of its own (NCCL_DEBUG_FILE) without one NCCL line is not what it claims.
            problems.add(source, READER, "no NCCL_DEBUG line in the file")
    return _tables(parts, sources, heads, pid_ranks or {})


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


def _chunks(sources: list[Source], problems: Problems) -> Iterator[tuple[int, memoryview]]:
    """(source index, bytes ending at a line end) in file order, each in a fresh buffer."""
    for index, source in enumerate(sources):
        try:
            f = open(source.path, "rb", buffering=0)  # noqa: SIM115  (closed by the with below)
        except OSError as exc:
            problems.add(source, READER, f"cannot read the file: {exc.strerror or exc}")
            continue
        with f:
            carry = b""
            while True:
                buf = bytearray(len(carry) + CHUNK_BYTES)
                buf[: len(carry)] = carry
                try:
                    got = f.readinto(memoryview(buf)[len(carry) :])
                except OSError as exc:
                    problems.add(source, READER, f"read failed: {exc.strerror or exc}")
                    break
                size = len(carry) + (got or 0)
                if not got:
                    if carry:
                        yield index, memoryview(carry + b"\n")
                    break
                cut = buf.rfind(b"\n", 0, size) + 1
                carry = bytes(buf[cut:size])
                if cut:
                    yield index, memoryview(buf)[:cut]


def _parse_chunk(index: int, data: memoryview, heads: _Heads) -> _Part:
    a = np.frombuffer(data, dtype=np.uint8)
    n = len(a)
    ends = np.flatnonzero(a == 10)
    part = _Part(source=index, n_lines=len(ends))
    starts = np.empty_like(ends)
    starts[:1] = 0
    starts[1:] = ends[:-1] + 1
    # "NCCL " where a word starts: after a space, a line start, a prefix's ':' or a stamp's ']'.
    words = _words(data, n)
    c = np.flatnonzero(a == 78)
    c = c[c + 6 < n]
    c = c[words[c + 1] == _CCL]
    before = a[np.maximum(c - 1, 0)]
    c = c[(c == 0) | (before == 32) | (before == 10) | (before == 58) | (before == 93)]
    if not len(c):
        return part
    k = np.searchsorted(c, starts)
    has = k < len(c)
    key = c[np.minimum(k, len(c) - 1)]
    has &= key < ends
    rows = np.flatnonzero(has)
    key, s, e = key[has], starts[has], ends[has]
    # The level: the word after "NCCL ", compared four bytes at a time.
    word = key + 5
    first4 = words[np.minimum(word, n - 4)]
    level = np.full(len(rows), -1, dtype=np.int8)
    for code, (head, width) in enumerate(_LEVEL_WORDS):
        fits = first4 == head
        if width > 4:  # TRACE, ABORT, version: the bytes after the first four
            for i, ch in enumerate(_WORDS[code][4:], 4):
                fits &= a[np.minimum(word + i, n - 1)] == ch
        end = word + width
        after = a[np.minimum(end, n - 1)]
        fits &= (end <= e) & ((end == e) | (after == 32) | (after == 13))
        level[fits & (level < 0)] = code
    buffer = pa.py_buffer(data)
    encoded = pc.dictionary_encode(_slices(buffer, s, np.maximum(key - 1, s), n))
    ids = heads.lookup(encoded.dictionary.to_pylist())
    header = ids[encoded.indices.to_numpy(zero_copy_only=False)]
    # A line is NCCL's if its header parses (the bare version line has none).
    keep = (level >= 0) & ((header >= 0) | (level == _VERSION))
    rows, key, e, level, header = rows[keep], key[keep], e[keep], level[keep], header[keep]
    if not len(rows):
        return part
    widths = np.array([len(w) for w in _WORDS], dtype=np.int64)
    msg = np.minimum(key + 5 + widths[level] + 1, e)
    e = e - ((e > msg) & (a[np.maximum(e - 1, 0)] == 13))  # a CRLF file
    messages = _slices(buffer, msg, e, n)
    try:
        part.message = messages.cast(pa.large_string())
    except pa.ArrowInvalid:
        part.message = pa.array(
            [b.decode("utf-8", "replace") for b in messages.to_pylist()], type=pa.large_string()
        )
        part.not_utf8 = True
    part.rows, part.level, part.header = rows, level, header
    part.init_lines = _init_lines(words, msg, e, data)
    return part


def _slices(buffer: pa.Buffer, begin: np.ndarray, end: np.ndarray, n: int) -> pa.Array:
    """The byte ranges [begin, end) of one buffer as a binary array, copied once by Arrow.

    The ranges are laid out as every other value of a zero-copy array over the buffer
    (offsets begin0, end0, begin1, end1, ..., n) and the even values are taken.
    """
    offsets = np.empty(2 * len(begin) + 1, dtype=np.int64)
    offsets[0:-1:2] = begin
    offsets[1::2] = end
    offsets[-1] = n
    whole = pa.Array.from_buffers(
        pa.large_binary(), len(offsets) - 1, [None, pa.py_buffer(offsets), buffer]
    )
    return pc.take(whole, pa.array(np.arange(0, len(offsets) - 1, 2, dtype=np.int64)))


def _codes(values: pa.Array) -> tuple[np.ndarray, list[bytes]]:
    encoded = pc.dictionary_encode(values)
    return (
        encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64),
        encoded.dictionary.to_pylist(),
    )


def _words(data: memoryview, n: int) -> np.ndarray:
    """Every position's next four bytes as one little-endian uint32 (an overlapping view)."""
    if n < 4:
        return np.zeros(max(n, 1), dtype="<u4")
    return np.ndarray(shape=(n - 3,), dtype="<u4", buffer=data, strides=(1,))


def _u32(text: bytes) -> int:
    return int.from_bytes(text[:4], "little")


_CCL = _u32(b"CCL ")
_LEVEL_WORDS = tuple((_u32(w), len(w)) for w in _WORDS)
#: How messages that announce a communicator begin (init.cc): "comm 0x...", "ncclCommInitRank
#: comm ...", "ncclCommSplit comm ...", newest "[Rank 3] ncclCommInitRankConfig comm ...".
_INIT_STARTS = np.array([_u32(b"comm"), _u32(b"nccl"), _u32(b"[Ran")], dtype="<u4")


def _init_lines(
    words: np.ndarray, msg: np.ndarray, end: np.ndarray, data: memoryview
) -> list[tuple[int, str]]:
    """(index among the chunk's NCCL lines, message) of the lines that may announce a
    communicator, picked by their first four bytes; the regex runs on those few only."""
    room = msg + 4 <= end
    starts = words[np.minimum(msg, len(words) - 1)]
    maybe = np.flatnonzero(room & np.isin(starts, _INIT_STARTS))
    return [(int(i), bytes(data[msg[i] : end[i]]).decode("utf-8", "replace")) for i in maybe]


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
    heads: _Heads,
    pid_ranks: Mapping[tuple[str, int], int],
) -> NcclTables:
    header = _join([p.header for p in parts])
    level = _join([p.level for p in parts])
    source = _join([np.full(len(p.level), p.source, dtype=np.int32) for p in parts])
    # Line numbers: a chunk's row plus the lines of the earlier chunks of the same file.
    first = {}
    line_no = []
    for part in parts:
        base = first.get(part.source, 1)
        line_no.append(part.rows + base)
        first[part.source] = base + part.n_lines
    line_no = _join(line_no)
    table = [*heads.parsed, _NO_HEAD]  # code -1 (no header) picks the last
    fields = [list(col) for col in zip(*table, strict=True)]
    prefix, pid, tid, device, line = (_ints(fields[i], header) for i in (0, 2, 3, 4, 6))
    stamps = np.array([np.nan if v is None else v for v in fields[7]], dtype=np.float64)[header]
    file_rank = np.array([_rank(s) for s in sources] + [-1], dtype=np.int64)[source]
    rank = np.where(prefix >= 0, prefix, file_rank)

    offsets = np.cumsum([0] + [len(p.level) for p in parts])
    messages = pa.chunked_array([p.message for p in parts], type=pa.large_string())
    comm_rows = [
        (int(offsets[i] + pos), m)
        for i, part in enumerate(parts)
        for pos, text in part.init_lines
        if (m := _COMM.search(text))
    ]
    comm_at = np.array([pos for pos, _ in comm_rows], dtype=np.int64)
    comm_host = [table[h][1] for h in header[comm_at]]
    # A process without a rank: the rank it has in its largest communicator (the world's).
    known = dict(pid_ranks)
    by_size = sorted(range(len(comm_rows)), key=lambda i: -int(comm_rows[i][1]["nranks"]))
    for i in by_size:
        known.setdefault((comm_host[i], int(pid[comm_at[i]])), int(comm_rows[i][1]["rank"]))
    if known and (rank < 0).any():
        process = np.array([known.get((h[1], h[2]), -1) for h in table], dtype=np.int64)
        rank = np.where(rank >= 0, rank, process[header])
    rank = _fill_from_file(rank, source)
    lines = finish(
        "nccl",
        {
            "rank": _int64(rank),
            "host": categorical(header, fields[1]),
            "pid": _int64(pid),
            "tid": _int64(tid),
            "device": _int64(device),
            "level": pd.Categorical.from_codes(level.astype(np.int64), categories=list(LEVELS)),
            "t_s": pd.array(stamps, dtype="Float64"),
            "file": categorical(header, fields[5]),
            "line": _int64(line),
            "message": pd.arrays.ArrowStringArray(messages),
            "source": categorical(source, [s.name for s in sources]),
            "line_no": _int64(line_no),
        },
    )
    versions = _versions(messages, level, source)
    comms = finish(
        "nccl_comms",
        {
            "rank": _int64(rank[comm_at]),
            "host": pd.array(comm_host, dtype="string"),
            "pid": _int64(pid[comm_at]),
            "comm": [m["comm"] for _, m in comm_rows],
            "comm_id": [m["comm_id"] for _, m in comm_rows],
            "nccl_rank": [int(m["rank"]) for _, m in comm_rows],
            "nranks": [int(m["nranks"]) for _, m in comm_rows],
            "cuda_dev": [int(m["dev"]) for _, m in comm_rows],
            "bus_id": [m["bus"] for _, m in comm_rows],
            "state": [m["state"] if m["what"] == "Init" else "DESTROYED" for _, m in comm_rows],
            "nccl_version": [versions.get(int(source[p])) for p in comm_at],
            "source": [sources[int(source[p])].name for p in comm_at],
            "line_no": _int64(line_no[comm_at]),
        },
    )
    return NcclTables(lines=lines, comms=comms)


def _fill_from_file(rank: np.ndarray, source: np.ndarray) -> np.ndarray:
    """Lines without a process (the version line) take the rank of their file's one process."""
    missing = rank < 0
    if not missing.any():
        return rank
    known = pd.DataFrame({"source": source[~missing], "rank": rank[~missing]})
    ranks = known.groupby("source")["rank"].agg(["min", "max"])
    single = ranks[ranks["min"] == ranks["max"]]["min"]
    lookup = np.full(int(source.max()) + 1 if len(source) else 1, -1, dtype=np.int64)
    lookup[single.index.to_numpy()] = single.to_numpy()
    return np.where(missing, lookup[source], rank)


def _versions(messages: pa.ChunkedArray, level: np.ndarray, source: np.ndarray) -> dict[int, str]:
    """The NCCL version each file announced first (``NCCL version 2.21.5+cuda12.4``)."""
    at = np.flatnonzero(level == _VERSION)
    found: dict[int, str] = {}
    for pos, text in zip(at, messages.take(pa.array(at)).to_pylist(), strict=True):
        if text:
            found.setdefault(int(source[pos]), text.split()[0])
    return found


def _join(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)


def _ints(values: list[Any], codes: np.ndarray) -> np.ndarray:
    """Per-line ints from per-header values; -1 stands for none (no real value is negative)."""
    per_head = np.array([-1 if v is None or v < 0 else v for v in values], dtype=np.int64)
    if (per_head == per_head[0]).all():  # no header has one (or all agree): no per-line lookup
        return np.full(len(codes), per_head[0], dtype=np.int64)
    return per_head[codes]


def _rank(source: Source) -> int:
    return -1 if source.rank is None else source.rank


def _int64(values: np.ndarray) -> pd.arrays.IntegerArray:
    return pd.arrays.IntegerArray(values.astype(np.int64, copy=False), values < 0)
