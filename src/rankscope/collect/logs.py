"""Every line of every rank's stdout/stderr, of torchrun's own output, and of ``error.json``.

torchrun (``--log-dir``, ``--redirects``, ``--tee``) writes ``<rdzv_id>_<random>/attempt_<n>/
<local_rank>/{stdout.log,stderr.log,error.json}`` and tees each line to its own output with a
``[<role><local_rank>]:`` header (``[default0]:``); torch's C++ logging adds ``[rank<N>]:`` in front
of its lines once ``RANK`` is set. Both prefixes are understood and removed from ``text``.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from rankscope._values import as_int, as_str
from rankscope.collect._common import (
    Problems,
    Source,
    SourceLike,
    as_sources,
    decode_text,
    finish,
    problem_list,
    read_bytes,
    split_lines,
)

READER = "logs"

#: ``[default0]:`` (torchrun's tee header, any role name) then ``[rank3]:`` (torch's C++ logging).
_PREFIX = re.compile(
    r"(?:\[(?P<role>[A-Za-z_][\w\-]*?)(?P<local>\d+)\]:)?(?:\[rank(?P<rank>\d+)\]:)?"
)
#: glog-style headers: ``[E1121 19:43:06.098807575 file.cpp:67]`` (c10) and
#: ``W1121 19:42:48.712000 6190 file.py:1028]`` (torch's Python logging).
_GLOG = re.compile(r"\[?[IWEF](\d{1,2})(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d+))? ")
#: NCCL's WARN timestamp ``[2026-01-02 10:11:12]`` and torchrun's ``time : 2026-11-21_19:42:48``.
_STAMP = re.compile(r"(?:^\[|time\s*:\s*)(\d{4})-(\d\d)-(\d\d)[ _](\d\d):(\d\d):(\d\d)")
_COLUMNS = ("rank", "local_rank", "node", "attempt", "stream", "line_no", "text", "source", "t_s")


def read_logs(
    sources: Iterable[SourceLike],
    *,
    local_ranks: Mapping[tuple[int, int], int] | None = None,
    year: int | None = None,
    problems: Problems | None = None,
) -> pd.DataFrame:
    """Lines of log files as a table; ``error.json`` files become lines of stream ``error_file``.

    A line's rank is its ``[rankN]:`` prefix if it has one, else ``local_ranks[(node, L)]`` for a
    ``[<role>L]:`` header in a launcher log, else the rank of the file. ``t_s`` is filled where the
    line carries a time (glog-style headers, NCCL's WARN timestamp, torchrun's failure summary,
    error.json's timestamp); glog headers have no year, so ``year`` (default: the file's
    modification year) supplies it, in this machine's time zone. Example::

           rank  local_rank  node  attempt  stream  line_no                                  text                          source     t_s
        0     1           1     0        0  stderr        7  ValueError: corrupt shard on rank 1  logs/node0/x_ab/attempt_0/1/stderr.log  <NA>
        1     0           0     0     <NA>  launcher      5          [W1121 19:42:22.26 Utils.hpp:137] ...      launcher.log  1.795290e+09

    Args:
        sources: log files and ``error.json`` files; :class:`~rankscope.collect.Source` fields
            (rank, node, local_rank, attempt, stream) describe where each came from.
        local_ranks: (node, local rank) -> global rank, for torchrun's tee headers.
        year: the year of glog-style timestamps.
        problems: where unreadable files are reported; ``None`` raises ``ValueError``.
    """
    problems = problem_list(problems)
    cols: dict[str, list[Any]] = {c: [] for c in _COLUMNS}
    for source in as_sources(sources):
        data = read_bytes(source, problems, READER)
        if data is None:
            continue
        text = decode_text(data, source, problems, READER)
        file_year = year or _mtime_year(source)
        if source.stream == "error_file" or source.path.name == "error.json":
            lines, stamp = _error_file_lines(text, source, problems)
            _add_lines(cols, source, lines, "error_file", local_ranks, file_year, stamp)
        else:
            _add_lines(cols, source, split_lines(text), None, local_ranks, file_year, None)
    return finish("logs", cols)


def _add_lines(
    cols: dict[str, list[Any]],
    source: Source,
    lines: list[str],
    stream: str | None,
    local_ranks: Mapping[tuple[int, int], int] | None,
    year: int,
    stamp: float | None,
) -> None:
    stream = stream or source.stream or stream_of(source.path.name)
    ranks, local, texts, times = [], [], [], []
    for line in lines:
        rank, local_rank, body = source.rank, source.local_rank, line
        if line.startswith("["):
            m = _PREFIX.match(line)
            if m.end():
                body = line[m.end() :]
                role_rank = m["role"] == "rank"
                if m["rank"] is not None or role_rank:
                    rank = int(m["rank"] if m["rank"] is not None else m["local"])
                if m["local"] is not None and not role_rank:
                    local_rank = int(m["local"])
                    if m["rank"] is None and local_ranks and source.node is not None:
                        rank = local_ranks.get((source.node, local_rank), rank)
        ranks.append(rank)
        local.append(local_rank)
        texts.append(body)
        times.append(stamp if stamp is not None else line_time(body, year))
    n = len(lines)
    cols["rank"] += ranks
    cols["local_rank"] += local
    cols["node"] += [source.node] * n
    cols["attempt"] += [source.attempt] * n
    cols["stream"] += [stream] * n
    cols["line_no"] += range(1, n + 1)
    cols["text"] += texts
    cols["source"] += [source.name] * n
    cols["t_s"] += times


def stream_of(name: str) -> str:
    """``stdout`` for ``*.out``, ``stderr`` for ``*.err`` (SLURM's names), else ``log``."""
    return {".out": "stdout", ".err": "stderr"}.get(Path(name).suffix.lower(), "log")


def line_time(text: str, year: int) -> float | None:
    """Seconds since the epoch from a line's own timestamp, or None.

    c10's headers print nanoseconds of a different clock after the seconds, so only 6-digit
    fractions (Python logging's microseconds) are used.
    """
    if len(text) < 16:
        return None
    m = _GLOG.match(text) if text[0] in "[IWEF" else None
    if m:
        month, day, hour, minute, second, frac = m.groups()
        fields = (year, int(month), int(day), int(hour), int(minute), int(second))
        extra = int(frac) / 1e6 if frac and len(frac) == 6 else 0.0
    else:
        m = _STAMP.search(text, 0, 64)
        if not m:
            return None
        fields = tuple(int(g) for g in m.groups())
        extra = 0.0
    try:
        return time.mktime((*fields, 0, 0, -1)) + extra
    except (OverflowError, ValueError):
        return None


def _mtime_year(source: Source) -> int:
    try:
        return dt.datetime.fromtimestamp(source.path.stat().st_mtime).year
    except (OSError, ValueError, OverflowError):
        return dt.datetime.now().year


def _error_file_lines(
    text: str, source: Source, problems: Problems
) -> tuple[list[str], float | None]:
    """The exception line(s) and the Python traceback recorded by torchrun's ``@record``."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        problems.add(source, READER, f"error.json is not valid JSON: {exc}")
        return [], None
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, str):
        return split_lines(message), None
    if not isinstance(message, dict):
        problems.add(source, READER, "error.json has no 'message' object (not torchrun's format)")
        return [], None
    info = message.get("extraInfo") if isinstance(message.get("extraInfo"), dict) else {}
    lines = split_lines(as_str(message.get("message")) or "")
    lines += split_lines(as_str(info.get("py_callstack")) or "")
    stamp = as_int(info.get("timestamp"))
    return lines, None if stamp is None else float(stamp)


#: Lines that open a block a rank did not write itself: a traceback, a faulthandler dump, a C++
#: abort's message and frames, a Python warning (its source line follows, indented).
_BLOCK = re.compile(
    r"Traceback \(most recent call last\)|During handling of the above exception"
    r"|The above exception was the direct cause|Fatal Python error|Current thread 0x|Thread 0x"
    r"|Stack \(most recent call first\)|Extension modules: |Python runtime state"
    r"|terminate called |Exception raised from |frame #\d+: |\S.*:\d+: \w*Warning: "
)
#: Single lines that are not the rank's own: torch's and torchrun's logging (glog-style
#: headers), NCCL's, rankscope's.
_NOT_OWN = re.compile(r"\[?[IWEF]\d{4} \d\d:\d\d:\d\d|.{0,120}\bNCCL (?:INFO|WARN)\b|rankscope ")
#: How many of a stream's last lines are looked through for the rank's own last line.
_TAIL = 400


def last_output(logs: pd.DataFrame) -> dict[int, str]:
    """Per rank, the last non-empty line it printed itself: its stdout's, else its stderr's
    (no line of a rank's own output carries a time). Tracebacks, faulthandler dumps, a C++
    abort's text, warnings, torch's and NCCL's logging and rankscope's own lines are not the
    rank's: a rank that printed ``loss is nan at step 7, stopping`` before ``sys.exit(0)`` has
    that line, whatever followed it on stderr."""
    out: dict[int, str] = {}
    if logs.empty:
        return out
    own = logs[logs["stream"].isin(["stdout", "stderr"]) & logs["rank"].notna()]
    groups = own.groupby([own["rank"].astype(int), own["stream"].astype(str)], sort=False)
    found = {
        key: _last_own(own["text"].iloc[rows[-_TAIL:]]) for key, rows in groups.indices.items()
    }
    for (rank, stream), line in found.items():
        if line is not None and (stream == "stdout" or found.get((rank, "stdout")) is None):
            out[rank] = line
    return out


def _last_own(texts: pd.Series) -> str | None:
    last, block = None, None  # the kind of block the lines are in: traceback, other
    for text in texts.tolist():
        if not isinstance(text, str) or not text.strip():
            continue  # a blank line neither opens nor closes a block (faulthandler's threads)
        if text[0] in " \t":  # a block's frames and source lines; else the rank's own
            last = last if block else text.strip()
            continue
        m = _BLOCK.match(text)
        if m:
            block = "traceback" if m.group().startswith("Traceback") else "other"
            continue
        ends_traceback, block = block == "traceback", None
        if not ends_traceback and not _NOT_OWN.match(text):  # not "ValueError: ..." after one
            last = text.strip()
    return last
