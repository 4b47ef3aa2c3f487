"""Python stacks: faulthandler dumps (the probe's ``stacks.txt``, crash output in stderr) and
py-spy dumps (text and ``--json``), as one table of frames and a per-capture summary."""

from __future__ import annotations

import json
import linecache
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from rankscope._values import as_int, as_str
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
from rankscope.rundir import is_user_file
from rankscope.state import FATAL_LINE, FATAL_SIGNALS

READER = "stacks"

_MARKER = re.compile(r"# rankscope capture id=(?P<id>\S+) t=(?P<t>\S+)(?: reason=(?P<reason>\S+))?")
_FH_THREAD = re.compile(
    r"(?P<current>Current thread|Thread) (?P<tid>0x[0-9a-fA-F]+)(?: \[(?P<name>[^\]]*)\])?"
    r" \(most recent call first\):|Stack \(most recent call first\):"
)
_FH_FRAME = re.compile(r'\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)')
_SPY_PROCESS = re.compile(r"Process (?P<pid>\d+): ")
_SPY_THREAD = re.compile(r'Thread (?P<tid>\S+) \((?P<status>[^)]*)\)(?:: "(?P<name>.*)")?\s*$')
_SPY_FRAME = re.compile(r"    (?P<func>\S.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)\s*$")
#: py-spy --json: a list of thread objects (or one object).
_JSON_DUMP = re.compile(rb"\[\s*[{\]]|\{")


@dataclass
class _Thread:
    tid: str | None
    name: str | None = None
    current: bool | None = None
    frames: list[tuple[str | None, str | None, int | None]] = field(default_factory=list)


@dataclass
class _Capture:
    tool: str
    capture_id: int | None
    t_s: float | None
    reason: str | None = None
    threads: list[_Thread] = field(default_factory=list)


def _in_torch_distributed(frame: dict[str, Any]) -> bool:
    """A frame of torch.distributed code that runs (a module being imported does not count: a
    thread importing torch is not blocked in a collective)."""
    path = frame["file"]
    return (
        bool(path)
        and frame["func"] != "<module>"
        and "torch/distributed/" in path.replace("\\", "/")
    )


def _in_collective(frame: dict[str, Any]) -> bool:
    return _in_torch_distributed(frame) and str(frame["file"]).endswith("distributed_c10d.py")


def _faulthandler(
    lines: list[str], cut: list[str] | None = None, partial: str | None = None
) -> Iterator[_Capture]:
    """Dumps in a text.

    Each starts at a rankscope marker, at faulthandler's ``Fatal Python error:`` line (its
    reason: the signal), or at the first thread header after a blank line or other text. A text
    that ends inside a dump (a log cut short: ``partial`` is its last line, without a newline,
    left out of ``lines``) keeps its complete frames; what was lost is said in ``cut``."""
    capture: _Capture | None = None
    thread: _Thread | None = None
    pending: tuple[int | None, float | None, str | None] = (None, None, None)  # id, t, reason
    for line in lines:
        fatal = FATAL_LINE.match(line) if line.startswith("Fatal Python error") else None
        if line.startswith("# rankscope capture") or fatal:
            if capture is not None and capture.threads:
                yield capture
            if fatal:
                pending = (None, None, FATAL_SIGNALS.get(fatal["what"], f"fatal: {fatal['what']}"))
            else:
                m = _MARKER.match(line)
                pending = (as_int(m["id"]), _float(m["t"]), m["reason"]) if m else (None,) * 3
            capture, thread = None, None
            continue
        m = _FH_THREAD.match(line)
        if m:
            if capture is None:
                capture = _Capture("faulthandler", *pending)
                pending = (None, None, None)
            thread = _Thread(tid=m["tid"], name=m["name"], current=m["current"] == "Current thread")
            if m["tid"] is None:
                thread.current = True
            capture.threads.append(thread)
            continue
        m = _FH_FRAME.fullmatch(line) if thread is not None else None
        if m and thread is not None:
            thread.frames.append((m["func"], m["file"], int(m["line"])))
        elif line.strip() and not line.startswith("  ") and thread is not None:
            thread = None  # other text ends the thread; a new header starts the next dump
            if capture is not None and capture.threads:
                yield capture
            capture = None
    if cut is not None and partial is not None and thread is not None:
        cut.append(
            f"a faulthandler dump is cut short ({partial.strip()[:60]!r}): its complete frames "
            "are kept, the outer ones are missing"
        )
    elif cut is not None and capture is None:
        fatal = pending[2] if pending[2] is not None else (partial or "")[:40]
        if fatal.startswith(("SIG", "fatal", "Fatal Python error")):
            cut.append(f"a faulthandler dump ({fatal}) ends before its first thread")
    if capture is not None and capture.threads:
        yield capture


def _pyspy_text(lines: list[str], source: Source) -> Iterator[_Capture]:
    capture: _Capture | None = None
    thread: _Thread | None = None
    for line in lines:
        if _SPY_PROCESS.match(line):
            if capture is not None and capture.threads:
                yield capture
            capture, thread = _Capture("py-spy", source.capture_id, source.t_s), None
            continue
        m = _SPY_THREAD.match(line)
        if m:
            if capture is None:
                capture = _Capture("py-spy", source.capture_id, source.t_s)
            thread = _Thread(tid=m["tid"], name=m["name"])
            capture.threads.append(thread)
            continue
        m = _SPY_FRAME.match(line) if thread is not None else None
        if m and thread is not None:
            thread.frames.append(
                (m["func"], m["file"], None if m["line"] is None else int(m["line"]))
            )
    if capture is not None and capture.threads:
        yield capture


def _pyspy_json(data: Any, source: Source) -> Iterator[_Capture]:
    if isinstance(data, dict):  # one process (py-spy versions differ)
        data = data.get("threads", [data])
    if not isinstance(data, list):
        raise ValueError(f"a py-spy --json dump is a list of threads, not a {type(data).__name__}")
    capture = _Capture("py-spy", source.capture_id, source.t_s)
    for item in data:
        if not isinstance(item, dict):
            continue
        tid = item.get("os_thread_id", item.get("thread_id"))
        thread = _Thread(tid=as_str(tid), name=as_str(item.get("thread_name")))
        for frame in item.get("frames") or []:
            if isinstance(frame, dict):
                file = as_str(frame.get("short_filename")) or as_str(frame.get("filename"))
                line = as_int(frame.get("line"))
                thread.frames.append((as_str(frame.get("name")), file, line or None))
        capture.threads.append(thread)
    if capture.threads:
        yield capture


def _mtime(source: Source) -> float | None:
    try:
        return source.path.stat().st_mtime
    except OSError:
        return None


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "None") else None
    except ValueError:
        return None


def _captures(source: Source, problems: Problems) -> list[_Capture]:
    data = read_bytes(source, problems, READER)
    if data is None:
        return []
    head = data[:512].lstrip()
    if source.stream is None and _JSON_DUMP.match(head):  # a log is never a py-spy dump
        try:
            return list(_pyspy_json(json.loads(data), source))
        except (ValueError, RecursionError) as exc:
            problems.add(source, READER, f"not a py-spy --json dump: {exc}")
            return []
    text = decode_text(data, source, problems, READER)
    lines = split_lines(text)
    if head.startswith(b"Process ") or (lines and _SPY_THREAD.match(lines[0])):
        found = list(_pyspy_text(lines, source))
        what = "py-spy dump"
    else:
        cut: list[str] = []
        # A last line without its newline: a log cut short (faulthandler ends every line),
        # or a dump written by hand where it reads as a whole frame.
        whole = source.stream is None and lines and _FH_FRAME.fullmatch(lines[-1])
        partial = lines.pop() if lines and not text.endswith("\n") and not whole else None
        if "most recent call first" in text or "Fatal Python error" in text:
            found = list(_faulthandler(lines, cut, partial))
        else:
            found = []
        for reason in cut:
            problems.add(source, READER, reason)
        if source.stream is not None:  # a log: a fatal signal's dump is its process's last word
            for capture in found:
                if capture.t_s is None and (capture.reason or "").startswith("SIG"):
                    capture.t_s = _mtime(source)
        what = "faulthandler dump"
    if not found and source.stream is None and text.strip():  # logs may hold none
        problems.add(source, READER, f"no {what} found in the file")
    return found


def read_stacks(sources: Iterable[SourceLike], *, problems: Problems | None = None) -> pd.DataFrame:
    """Frames of every thread of every dump; depth 0 is the innermost frame.

    Example::

           rank  capture_id  capture           t_s          tool                thread  thread_name  is_current  depth        func                                    file  line  is_user                 source
        0     0           1        0  1.795290e+09  faulthandler  0x00007f07705c4b80         <NA>       False      0     barrier  /venv/.../torch/distributed/distributed_c10d.py  5356    False      ranks/0/stacks.txt
        1     0           1        0  1.795290e+09  faulthandler  0x00007f07705c4b80         <NA>       False      3    validate                    /home/user/worker.py    11     True      ranks/0/stacks.txt

    Args:
        sources: ``stacks.txt`` files (faulthandler, with or without rankscope markers), py-spy
            text or ``--json`` dumps, and logs that may hold a crash's faulthandler output.
        problems: where unreadable files are reported; ``None`` raises ``ValueError``.
    """
    problems = problem_list(problems)
    rows: list[tuple[Any, ...]] = []
    for source in as_sources(sources):
        for index, capture in enumerate(_captures(source, problems)):
            for thread in capture.threads:
                for depth, (func, file, line) in enumerate(thread.frames):
                    rows.append(
                        (
                            source.rank,
                            capture.capture_id,
                            index,
                            capture.t_s,
                            capture.tool,
                            capture.reason,
                            thread.tid,
                            thread.name,
                            thread.current,
                            depth,
                            func,
                            file,
                            line,
                            is_user_file(file),
                            _source_line(file, line) if is_user_file(file) else None,
                            source.name,
                        )
                    )
    return finish("stacks", columns(_STACK_COLUMNS, rows))


_STACK_COLUMNS = ("rank", "capture_id", "capture", "t_s", "tool", "reason", "thread", "thread_name")
_STACK_COLUMNS += ("is_current", "depth", "func", "file", "line", "is_user", "code", "source")


def _source_line(file: str | None, line: int | None) -> str | None:
    """The text of a frame's line when its file is readable here (the run was made on this
    machine, or its sources were copied along): what the rank was doing, in its own words."""
    if not file or not line or file.startswith("<"):
        return None
    text = linecache.getline(file, line).strip()
    return text[:200] or None


def summarize_stacks(stacks: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, capture): where the thread that matters is, in the user's code.

    The thread that matters is the one blocked in ``torch.distributed`` (else the main thread:
    py-spy's ``MainThread``, or the faulthandler thread whose outermost frame is ``<module>``).
    ``waiting_in`` is the innermost ``torch.distributed`` function on its stack (``barrier``,
    ``all_reduce``, ...). Example::

           rank  capture_id  capture           t_s          tool              thread      func                  file  line          site  waiting_in
        0     0           1        0  1.795290e+09  faulthandler  0x00007f07705c4b80  validate  /home/user/worker.py    11  worker.py:11     barrier
        1     1           1        0  1.795290e+09  faulthandler  0x00007fd308c57b80  <module>  /home/user/worker.py    20  worker.py:20  all_reduce
    """
    records = stacks.astype(object).where(stacks.notna(), None).to_dict("records")
    captures: dict[tuple[Any, Any], dict[Any, list[dict[str, Any]]]] = {}
    for row in records:
        threads = captures.setdefault((row["source"], row["capture"]), {})
        threads.setdefault(row["thread"], []).append(row)
    rows: list[tuple[Any, ...]] = []
    for threads in captures.values():
        tid, frames = _chosen_thread(threads)
        frames.sort(key=lambda r: r["depth"])
        waiting = next((r["func"] for r in frames if _in_torch_distributed(r)), None)
        top = next((r for r in frames if r["is_user"]), None)
        file, line = (top["file"], top["line"]) if top else (None, None)
        first = frames[0]
        rows.append(
            (
                first["rank"],
                first["capture_id"],
                first["capture"],
                first["t_s"],
                first["tool"],
                first["reason"],
                tid,
                top["func"] if top else None,
                file,
                line,
                None if file is None else short_site(file, line),
                waiting,
                first["source"],
            )
        )
    return finish("stack_summary", columns(_SUMMARY_COLUMNS, rows))


_SUMMARY_COLUMNS = ("rank", "capture_id", "capture", "t_s", "tool", "reason", "thread", "func")
_SUMMARY_COLUMNS += ("file",)
_SUMMARY_COLUMNS += ("line", "site", "waiting_in", "source")


def _chosen_thread(threads: dict[Any, list[dict[str, Any]]]) -> tuple[Any, list[dict[str, Any]]]:
    """The thread in a collective (torch.distributed's API), else one in other torch.distributed
    code, else the main thread, else the last one listed."""
    items = list(threads.items())
    for test in (_in_collective, _in_torch_distributed):
        for tid, frames in items:
            if any(test(r) for r in frames):
                return tid, frames
    for tid, frames in items:
        if frames[0]["thread_name"] == "MainThread":
            return tid, frames
    for tid, frames in items:
        if max(frames, key=lambda r: r["depth"])["func"] == "<module>":
            return tid, frames
    return items[-1]


def short_site(file: str, line: object) -> str:
    """``train.py:12``: a frame's file name without its folder, and its line."""
    return f"{file.replace(chr(92), '/').rsplit('/', 1)[-1]}:{line}"


def latest_captures(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of each rank's latest capture, from the ``stacks`` or the ``stack_summary``
    table: a fatal signal's dump in the rank's own log (its stderr, where a script that enables
    faulthandler itself sends it; the process died writing it) unless its own ``stacks.txt``
    has a capture taken after that log was last written (a later attempt's); else the last
    capture of its ``stacks.txt`` where it has one (the probe appends to it, and a fatal
    signal's dump there has no capture id or time); else the newest by capture id and time."""
    if table.empty:
        return table
    source = table["source"].astype(object).fillna("").to_numpy()
    own = np.fromiter(
        (s.endswith("stacks.txt") and not s.startswith("evidence/") for s in source),
        dtype=bool,
        count=len(source),
    )
    capture = table["capture"].astype("Float64").fillna(-1.0).to_numpy(dtype=float)
    cid = table["capture_id"].astype("Float64").fillna(-1.0).to_numpy(dtype=float)
    t = table["t_s"].astype("Float64").fillna(-1.0).to_numpy(dtype=float)
    rank = table["rank"].astype("Float64").fillna(-1.0).to_numpy(dtype=float)
    reason = table["reason"].astype(object).fillna("").to_numpy()
    crash = np.fromiter(
        (
            r.startswith("SIG") and not o and not s.startswith("evidence/") and tt >= 0
            for r, o, s, tt in zip(reason, own, source, t, strict=True)
        ),
        dtype=bool,
        count=len(source),
    )
    if crash.any():  # later than every capture of the rank's stacks.txt
        own_t = pd.Series(np.where(own, t, -1.0)).groupby(rank).transform("max").to_numpy()
        crash &= t >= own_t
    level = np.where(crash, 2, np.where(own, 1, 0))
    # Own captures by their place in the file; others by id, then time. Per rank, the last.
    order = np.lexsort((np.where(own, 0.0, t), np.where(own, capture, cid), level, rank))
    by_rank = rank[order]
    last = order[np.r_[by_rank[1:] != by_rank[:-1], True]]
    # A capture is one (source, capture) of the rank: every row of it is kept.
    chosen = {rank[i]: (source[i], capture[i]) for i in last}
    rows = np.fromiter(
        (chosen[r] == (s, c) for r, s, c in zip(rank, source, capture, strict=True)),
        dtype=bool,
        count=len(rank),
    )
    return table[rows].reset_index(drop=True)
