"""Which file is what: the discovery of a run's artifacts.

A rankscope run directory is read through its documented layout (:mod:`rankscope.rundir`): each
rank's folder, the evidence captures, torchrun's log folders. Any other folder (files copied
from a cluster, attached to a bug report) is walked and each file is recognised by its name and
its first bytes. :func:`discover` returns an :class:`Inventory`: the files by the reader that
takes them, and what the layout says about ranks. :class:`~rankscope.collect.run.Run` is the lazy
cache of tables over it.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankscope._values import as_float, as_int
from rankscope.collect._common import Problems, Source, rank_from_name
from rankscope.collect.logs import stream_of
from rankscope.rundir import RING_MAGIC

_ATTEMPT = re.compile(r"attempt_(\d+)$")
_NODE = re.compile(r"node(\d+)$")
_CAPTURE = re.compile(r"capture-(\d+)$")
_LAUNCHER = re.compile(r"launcher(?:\.node(\d+))?\.log$")
_RING = re.compile(r"calls-\d+\.ring")
_NCCL_LINE = re.compile(
    rb"(?m)^(?:\[[^\]\n]*\][: ]?)*\S+:\d+:\d+ (?:\[-?\d+\] )?.{0,80}?NCCL (?:INFO|WARN|TRACE|CALL) |^NCCL version "
)
_FR_NAME = re.compile(r"(?:nccl_trace|comm_lib_trace|fr_trace|trace_rank|_fr_|^fr[_.])", re.I)
_LOG_SUFFIXES = {".log", ".out", ".err", ".txt", ""}
_SKIP_NAMES = {"run.json", "manifest.json", "diagnosis.json", "capture.json", "supervisor.log"}
_SNIFF = 1 << 16
#: Files a folder of artifacts often holds besides artifacts; skipped without a word.
_NOT_ARTIFACTS = {".py", ".md", ".sh", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".ipynb"}


@dataclass
class Inventory:
    """Every file found, by the reader that takes it, and what the layout says about ranks."""

    events: list[Source] = field(default_factory=list)
    rings: list[Source] = field(default_factory=list)
    logs: list[Source] = field(default_factory=list)
    nccl: list[Source] = field(default_factory=list)
    flight_recorder: list[Source] = field(default_factory=list)
    stacks: list[Source] = field(default_factory=list)
    values: list[Source] = field(default_factory=list)
    local_ranks: dict[tuple[int, int], int] = field(default_factory=dict)
    pid_ranks: dict[tuple[str, int], int] = field(default_factory=dict)
    starts: dict[int, dict[str, Any]] = field(default_factory=dict)


def _walk(root: Path) -> list[Path]:
    """Regular files under ``root``, without following links or entering hidden folders."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            path = Path(dirpath, name)
            try:
                if stat.S_ISREG(path.lstat().st_mode):
                    found.append(path)
            except OSError:
                continue
    return found


def discover(root: Path, is_rundir: bool, info: dict[str, Any], problems: Problems) -> Inventory:
    inv = Inventory()
    files = _walk(root)
    rel = {p: p.relative_to(root).as_posix() for p in files}
    if is_rundir:
        _rundir_events(root, files, rel, inv)
    rank_dumps = {
        r
        for r, s in ((_rank_dir(rel[p]), p) for p in files)
        if r is not None and _is_dump_name(s.name)
    }
    rank_stacks = {
        r for p in files if (r := _rank_dir(rel[p])) is not None and p.name == "stacks.txt"
    }
    manifests = _manifests(files, rel)
    for path in files:
        name = rel[path]
        parts = name.split("/")
        if path.name in _SKIP_NAMES or parts[0] == "control" or path.suffix in _NOT_ARTIFACTS:
            continue
        rank_dir = _rank_dir(name)
        capture = _capture_dir(parts)
        if rank_dir is not None and len(parts) == 3:
            _rank_file(inv, path, name, rank_dir)
        elif capture is not None:
            _evidence_file(inv, path, name, capture, manifests, rank_dumps, rank_stacks)
        elif (m := _LAUNCHER.fullmatch(name)) is not None:
            inv.logs.append(Source(path, name, node=int(m.group(1) or 0), stream="launcher"))
        elif (log := _torchrun_log(path, name, parts, inv, info)) is not None:
            _add_log(inv, log)
        else:
            _foreign_file(inv, path, name, problems)
    return inv


def _rank_dir(name: str) -> int | None:
    parts = name.split("/")
    if len(parts) == 3 and parts[0] == "ranks" and parts[1].isdigit():
        return int(parts[1])
    return None


def _capture_dir(parts: list[str]) -> int | None:
    if len(parts) == 3 and parts[0] == "evidence" and (m := _CAPTURE.fullmatch(parts[1])):
        return int(m.group(1))
    return None


def _is_dump_name(name: str) -> bool:
    return name in ("fr.pkl", "fr.json", "fr_nccl.pkl", "fr_nccl.json") or name.startswith(
        "torch_fr_rank_"
    )


def _rank_file(inv: Inventory, path: Path, name: str, rank: int) -> None:
    source = Source(path, name, rank=rank)
    if path.name == "events.jsonl":
        inv.events.append(source)
    elif _RING.fullmatch(path.name):
        inv.rings.append(source)
    elif path.name == "stacks.txt":
        inv.stacks.append(source)
    elif path.name == "values.jsonl":
        inv.values.append(source)
    elif path.name == "nccl.log" or path.name.startswith("nccl"):
        inv.nccl.append(source)
    elif _is_dump_name(path.name):
        inv.flight_recorder.append(source)


def _manifests(files: list[Path], rel: dict[Path, str]) -> dict[int, float | None]:
    """Capture id -> the time the capture was requested (from its manifest)."""
    found: dict[int, float | None] = {}
    for path in files:
        parts = rel[path].split("/")
        capture = _capture_dir(parts)
        if capture is not None and path.name == "manifest.json":
            try:
                data = json.loads(path.read_bytes())
            except (OSError, ValueError, RecursionError):
                data = {}
            found[capture] = as_float(data.get("requested_at")) if isinstance(data, dict) else None
    return found


def _evidence_file(
    inv: Inventory,
    path: Path,
    name: str,
    capture: int,
    manifests: dict[int, float | None],
    rank_dumps: set[int],
    rank_stacks: set[int],
) -> None:
    """``evidence/capture-<id>/rank<r>.{stacks.txt,pyspy.txt,pyspy.json,fr.pkl}``.

    The probe's stacks and dumps in ``ranks/<r>/`` hold the same captures (and later ones), so
    evidence copies are read only for ranks whose own files are missing.
    """
    rank = rank_from_name(path.name)
    source = Source(path, name, rank=rank, capture_id=capture, t_s=manifests.get(capture))
    if "pyspy" in path.name:
        inv.stacks.append(source)
    elif path.name.endswith(".stacks.txt"):
        if rank not in rank_stacks:
            inv.stacks.append(source)
    elif ".fr" in path.name and rank not in rank_dumps:
        inv.flight_recorder.append(source)


def _rundir_events(root: Path, files: list[Path], rel: dict[Path, str], inv: Inventory) -> None:
    """Each rank's start event: the env that maps torchrun's log folders to global ranks."""
    for path in files:
        rank = _rank_dir(rel[path])
        if rank is None or path.name != "events.jsonl":
            continue
        start = _start_event(path)
        if start is None:
            continue
        inv.starts[rank] = start
        host, pid = start.get("host"), as_int(start.get("pid"))
        if isinstance(host, str) and pid is not None:
            inv.pid_ranks[(host, pid)] = rank


def _start_event(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            for _ in range(200):
                line = f.readline(1 << 20)
                if not line:
                    break
                try:
                    ev = json.loads(line)
                except (ValueError, RecursionError):
                    continue
                if isinstance(ev, dict) and ev.get("ev") == "start":
                    return ev
    except OSError:
        return None
    return None


#: How much of the end of an events file is read for its end event (whose stack is at most
#: ``END_STACK_MAX`` frames): the probe writes nothing after it.
_END_TAIL = 1 << 18


def end_event(path: Path) -> dict[str, Any] | None:
    """The end event of the rank's latest process (a start event after the last end event is
    a new process that has not ended), read from the end of its events file; None when there is
    none, or the file cannot be read."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - _END_TAIL))
            tail = f.read(_END_TAIL)
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        if b'"end"' not in line and b'"start"' not in line:
            continue
        try:
            ev = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(ev, dict) and ev.get("ev") in ("end", "start"):
            return ev if ev["ev"] == "end" else None
    return None


def _torchrun_log(
    path: Path, name: str, parts: list[str], inv: Inventory, info: dict[str, Any]
) -> Source | None:
    """``[logs/node<k>/]<run>_<random>/attempt_<n>/<local_rank>/{stdout,stderr}.log|error.json``."""
    if len(parts) < 3 or not parts[-2].isdigit() or not _ATTEMPT.fullmatch(parts[-3]):
        return None
    if path.name not in ("stdout.log", "stderr.log", "error.json"):
        return None
    local = int(parts[-2])
    attempt = int(_ATTEMPT.fullmatch(parts[-3]).group(1))  # type: ignore[union-attr]
    node_part = parts[-5] if len(parts) >= 5 else ""
    node = int(m.group(1)) if (m := _NODE.fullmatch(node_part)) else None
    rank = _global_rank(inv, tuple(parts[-5:-1]), node, local, info, path.parent.parent)
    if node is not None and rank is not None:
        inv.local_ranks[(node, local)] = rank
    stream = path.name.removesuffix(".log") if path.name != "error.json" else "error_file"
    return Source(
        path, name, rank=rank, node=node, local_rank=local, attempt=attempt, stream=stream
    )


def _global_rank(
    inv: Inventory,
    key: tuple[str, ...],
    node: int | None,
    local: int,
    info: dict[str, Any],
    attempt_dir: Path,
) -> int | None:
    """The rank whose TORCHELASTIC_ERROR_FILE is this folder's error.json; else
    GROUP_RANK * LOCAL_WORLD_SIZE + local rank; else the local rank."""
    group = None
    for rank, start in inv.starts.items():
        env = start.get("env") if isinstance(start.get("env"), dict) else {}
        error_file = env.get("TORCHELASTIC_ERROR_FILE")
        if isinstance(error_file, str):
            their = tuple(Path(error_file).parts[-5:-1])
            if their == key:
                return rank
            if their[:1] == key[:1]:  # same node: its GROUP_RANK applies
                group = as_int(env.get("GROUP_RANK"))
    if node is None and not inv.starts:
        return local
    group = node if group is None else group
    width = as_int(info.get("nproc_per_node")) or _local_world(attempt_dir)
    return local if group is None else group * width + local


def _local_world(attempt_dir: Path) -> int:
    try:
        return sum(1 for p in attempt_dir.iterdir() if p.name.isdigit()) or 1
    except OSError:
        return 1


def _add_log(inv: Inventory, source: Source) -> None:
    inv.logs.append(source)
    if source.stream in ("stdout", "stderr"):
        # NCCL writes to stdout unless told otherwise, and a crash's faulthandler dump to stderr.
        inv.nccl.append(source)
        inv.stacks.append(source)


def _foreign_file(inv: Inventory, path: Path, name: str, problems: Problems) -> None:
    """Recognise a file of a plain folder by its name, then by its first bytes."""
    try:
        with open(path, "rb") as f:
            head = f.read(_SNIFF)
    except OSError as exc:
        problems.add(name, "run", f"cannot read the file: {exc.strerror or exc}")
        return
    kind = _kind_by_name(path.name.lower()) or _kind_by_content(head, path.suffix.lower())
    rank = rank_from_name(path.name, trailing=kind == "flight_recorder")
    if kind is None:
        if path.suffix.lower() not in _NOT_ARTIFACTS:
            problems.add(name, "run", "not a recognised artifact (skipped)")
    elif kind == "error_file":
        inv.logs.append(Source(path, name, rank=rank, stream="error_file"))
    elif kind == "log" or (kind == "stacks" and _also_a_log(path, head)):
        # A log holds several kinds of text at once (a rank's output with NCCL's lines, the
        # watchdog's C++ stack, a faulthandler dump): every reader that knows one gets it.
        has_nccl = _NCCL_LINE.search(head) is not None
        if has_nccl or "nccl" in path.name.lower():
            inv.nccl.append(Source(path, name, rank=rank))
        if not ("nccl" in path.name.lower() and has_nccl):  # an NCCL_DEBUG_FILE is only that
            inv.logs.append(Source(path, name, rank=rank, stream=stream_of(path.name)))
        if kind == "stacks":  # as a log: the stacks reader does not ask it to hold a dump
            inv.stacks.append(Source(path, name, rank=rank, stream=stream_of(path.name)))
    else:
        getattr(inv, kind).append(Source(path, name, rank=rank))


def _also_a_log(path: Path, head: bytes) -> bool:
    """A text file whose content looked like stacks and that is a log as well: named as logs
    are, not as stacks, and not a dump from its first line (faulthandler's, py-spy's)."""
    if path.suffix.lower() not in _LOG_SUFFIXES or _kind_by_name(path.name.lower()):
        return False
    first = head.lstrip()[:40]
    return not first.startswith((b"Current thread", b"Thread 0x", b"Process ", b"# rankscope"))


def _kind_by_name(name: str) -> str | None:
    if "pyspy" in name or "py-spy" in name or (name.endswith(".txt") and "stacks" in name):
        return "stacks"
    if name.endswith("events.jsonl"):
        return "events"
    if name.endswith(".ring"):
        return "rings"
    if name == "error.json":
        return "error_file"
    if name.endswith((".pkl", ".pickle")) or _FR_NAME.search(name):
        return "flight_recorder"
    return None


def _kind_by_content(head: bytes, suffix: str) -> str | None:
    if head.startswith(RING_MAGIC):
        return "rings"
    lead = head.lstrip()[:1]
    if lead == b"\x80":
        return "flight_recorder"
    if lead == b"{" and any(k in head for k in (b'"pg_config"', b'"entries"', b'"pg_status"')):
        return "flight_recorder"
    if lead in (b"[", b"{") and b'"frames"' in head:
        return "stacks"
    if lead == b"{" and b'"extraInfo"' in head:
        return "error_file"
    if b'"ev":' in head[:4096] and suffix in (".jsonl", ".json", ""):
        return "events"
    if head.startswith(b"Process ") or b"(most recent call first):" in head:
        return "stacks"
    if b"# rankscope capture" in head:
        return "stacks"
    if suffix in _LOG_SUFFIXES or _NCCL_LINE.search(head):
        return "log"
    return None
