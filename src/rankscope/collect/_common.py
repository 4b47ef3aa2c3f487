"""What every reader shares: the file descriptions, the problem list and column builders."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from rankscope import schema


@dataclass(frozen=True, slots=True)
class Source:
    """One file a reader reads, with what its place in the folder says about it.

    ``name`` is what the tables show in their ``source`` column: the path relative to the folder
    that was loaded. Every other field is ``None`` where the layout does not say.
    """

    path: Path
    name: str
    rank: int | None = None
    node: int | None = None
    local_rank: int | None = None
    attempt: int | None = None
    stream: str | None = None
    capture_id: int | None = None
    t_s: float | None = None


SourceLike = Source | str | os.PathLike[str]


def as_sources(items: Iterable[SourceLike]) -> list[Source]:
    """Accept paths where a reader takes sources: the rank comes from the file name if it has one."""
    out = []
    for item in items:
        if isinstance(item, Source):
            out.append(item)
        else:
            path = Path(item)
            out.append(Source(path=path, name=path.name, rank=rank_from_name(path.name)))
    return out


@dataclass
class Problems:
    """Files (or parts of files) that could not be read, each with the reason.

    A reader given ``problems=None`` has nobody to tell, so it raises :class:`ValueError` naming
    the file instead; :func:`rankscope.collect.load_run` always passes a list and keeps going.
    """

    rows: list[tuple[str, str, str]] = field(default_factory=list)
    strict: bool = False

    def add(self, source: Source | str, reader: str, reason: str) -> None:
        name = source.name if isinstance(source, Source) else source
        if self.strict:
            raise ValueError(f"{name}: {reason}")
        self.rows.append((name, reader, reason))

    def frame(self) -> pd.DataFrame:
        df = pd.DataFrame(self.rows, columns=["source", "reader", "reason"])
        return schema.conform("problems", df.drop_duplicates(ignore_index=True))


def problem_list(problems: Problems | None) -> Problems:
    return Problems(strict=True) if problems is None else problems


def read_bytes(source: Source, problems: Problems, reader: str) -> bytes | None:
    try:
        return source.path.read_bytes()
    except OSError as exc:
        problems.add(source, reader, f"cannot read the file: {exc.strerror or exc}")
        return None


def decode_text(data: bytes, source: Source, problems: Problems, reader: str) -> str:
    """UTF-8 text; bytes that are not UTF-8 become U+FFFD and the file is reported once."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        problems.add(
            source,
            reader,
            f"not UTF-8 text from byte {exc.start} on (binary data?); "
            "undecodable bytes are shown as U+FFFD",
        )
        return data.decode("utf-8", errors="replace")


def split_lines(text: str) -> list[str]:
    """Lines without their ending; a final line without a newline is kept."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


_RANK_WORD = re.compile(r"rank[_\-.]?(\d{1,7})", re.IGNORECASE)
_TRAILING = re.compile(r"(\d{1,7})$")
_EXTENSIONS = (".txt", ".json", ".jsonl", ".pkl", ".pickle", ".log", ".out", ".err", ".pyspy")


def strip_extensions(name: str) -> str:
    changed = True
    while changed:
        changed = False
        for ext in _EXTENSIONS:
            if name.lower().endswith(ext) and len(name) > len(ext):
                name = name[: -len(ext)]
                changed = True
    return name


def rank_from_name(name: str, *, trailing: bool = False) -> int | None:
    """The rank a file name carries: ``rank3``, ``rank_3``, ``..._rank_3.pkl``.

    With ``trailing=True`` a bare number at the end also counts, as in torch's flight-recorder
    dumps ``<prefix><rank>`` (``nccl_trace_rank_3``, ``comm_lib_trace_rank_12``, ``dump7``).
    Numbers elsewhere (``slurm-4242.out``, ``nccl.host.1234.log``) are job ids and pids, not ranks.
    """
    stem = strip_extensions(name)
    found = _RANK_WORD.findall(stem)
    if found:
        return int(found[-1])
    if trailing:
        m = _TRAILING.search(stem)
        if m:
            return int(m.group(1))
    return None


def categorical(codes: np.ndarray, values: Sequence[Any]) -> pd.Categorical:
    """A categorical column from integer codes into ``values`` (a negative code, or a None
    value, is <NA>; repeated values are merged), without a Python object per row."""
    table: dict[Any, int] = {}
    lookup = [-1 if v is None else table.setdefault(v, len(table)) for v in values]
    codes = np.asarray(codes)
    if lookup != list(range(len(values))):  # values repeat or hold None: renumber
        codes = np.array([*lookup, -1], dtype=np.int32)[codes] if len(codes) else codes
    return pd.Categorical.from_codes(codes, categories=pd.Index(list(table), dtype=object))


def code_type(n: int) -> type[np.signedinteger]:
    """The narrowest integer type for codes into ``n`` categories (and -1)."""
    return np.int8 if n < 1 << 7 else np.int16 if n < 1 << 15 else np.int32


def first_rows(codes: np.ndarray, count: int, *, where: np.ndarray | None = None) -> np.ndarray:
    """For each of ``count`` codes (-1 being the last), the first row that has it (of the rows
    ``where`` is true), or ``len(codes)`` where none has. A million rows at a time: no array of
    every row's position is made."""
    first = np.full(count, len(codes), dtype=np.int64)
    step = 1 << 20
    for at in range(0, len(codes), step):
        part = codes[at : at + step]
        if where is None:
            np.minimum.at(first, part, np.arange(at, at + len(part)))
        else:
            rows = np.flatnonzero(where[at : at + step])
            np.minimum.at(first, part[rows], rows + at)
    return first


def columns(names: Sequence[str], rows: list[tuple[Any, ...]]) -> dict[str, list[Any]]:
    """Rows read one by one (tuples in the order of ``names``) as the columns of a table."""
    values = zip(*rows, strict=True) if rows else ([] for _ in names)
    return {name: list(col) for name, col in zip(names, values, strict=True)}


@functools.cache
def _pool() -> pa.MemoryPool:
    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:  # a pyarrow built without it
        return pa.default_memory_pool()


def pooled_empty(n: int, dtype: Any) -> np.ndarray:
    """``np.empty(n, dtype)`` in memory from Arrow's jemalloc pool (its default pool without).

    A big table's columns are hundreds of megabytes. NumPy takes large blocks fresh from the
    kernel, as transparent huge pages where it can, which the kernel zeroes 2 MB at a time
    first; on a virtual machine those often lie in memory the host has not backed yet, and each
    costs it a fault too. jemalloc reuses the memory it freed, in small pages. On a 2-core VM
    a 520 MB NCCL log took 0.25-0.75 s to read with NumPy's blocks, 0.24-0.29 s with these
    (``bench/collect_nccl_logs.py``). The array keeps its buffer alive.
    """
    dtype = np.dtype(dtype)
    buffer = pa.allocate_buffer(max(n, 1) * dtype.itemsize, memory_pool=_pool())
    return np.frombuffer(buffer, dtype=dtype, count=n)


def finish(name: str, columns: dict[str, Any]) -> pd.DataFrame:
    """Build the table ``name`` from column arrays, in its schema's columns and dtypes."""
    return schema.conform(name, pd.DataFrame(columns, copy=False))
