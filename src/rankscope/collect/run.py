"""``load_run``: a run directory, or any folder of artifacts, as lazily loaded tables.

A rankscope run directory is read through its documented layout (:mod:`rankscope.rundir`). Any
other folder (files copied from a cluster, attached to a bug report) is walked and each file is
recognised by its name and its first bytes: flight-recorder dumps (``<prefix><rank>``, pickle or
JSON), NCCL_DEBUG files, py-spy and faulthandler dumps, torchrun's ``attempt_<n>/<local_rank>``
log layout, ``error.json`` files and plain logs (SLURM output with ``[rankN]:`` prefixes).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from rankscope import schema
from rankscope.collect._common import Problems, Source, rank_from_name
from rankscope.collect._values import as_float, as_int
from rankscope.collect.errors import find_errors
from rankscope.collect.events import parse_events
from rankscope.collect.flight_recorder import load_flight_recorder, read_fr_frames
from rankscope.collect.logs import read_logs, stream_of
from rankscope.collect.nccl import load_nccl
from rankscope.collect.stacks import read_stacks, summarize_stacks
from rankscope.rundir import RING_MAGIC, RunDir, signal_name, torchrun_failures

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
    local_ranks: dict[tuple[int, int], int] = field(default_factory=dict)
    pid_ranks: dict[tuple[str, int], int] = field(default_factory=dict)
    starts: dict[int, dict[str, Any]] = field(default_factory=dict)


class Run:
    """The tables of one run directory or artifact folder; each loads on first use and is kept.

    Attributes (all ``pandas.DataFrame``, schemas in :mod:`rankscope.schema`): ``events``,
    ``collectives``, ``logs``, ``nccl``, ``nccl_comms``, ``flight_recorder``, ``fr_frames``,
    ``pg_status``, ``stacks``, ``stack_summary``, ``errors``, ``ranks`` and ``problems`` (which
    loads every other table first, so that it lists every file that could not be read).
    ``info`` is ``run.json`` (empty for a plain folder) and ``inventory`` the files found.
    """

    TABLES = tuple(schema.TABLES)

    def __init__(self, path: Path, *, workers: int | None = None):
        self.path = path
        self.workers = workers
        self._problems = Problems()
        self._cache: dict[str, pd.DataFrame] = {}
        run = RunDir(path)
        self.is_rundir = run.is_run() or run.ranks.is_dir()
        self.info: dict[str, Any] = {}
        if run.run_json.is_file():
            try:
                data = json.loads(run.run_json.read_bytes())
                self.info = data if isinstance(data, dict) else {}
            except (OSError, ValueError, RecursionError) as exc:
                self._problems.add("run.json", "run", f"run.json could not be read: {exc}")
        self.inventory = _discover(path, self.is_rundir, self.info, self._problems)

    def __repr__(self) -> str:
        inv = self.inventory
        kind = "run directory" if self.is_rundir else "folder"
        return (
            f"<Run {kind} {str(self.path)!r}: {len(inv.events)} event files, {len(inv.logs)} logs, "
            f"{len(inv.flight_recorder)} flight-recorder dumps, {len(inv.stacks)} stack dumps, "
            f"{len(inv.nccl)} NCCL sources>"
        )

    def table(self, name: str) -> pd.DataFrame:
        """The table ``name`` (one of :attr:`TABLES`); loaded once, then served from memory."""
        if name not in self.TABLES:
            raise ValueError(f"unknown table {name!r}; known: {', '.join(self.TABLES)}")
        if name == "problems":
            # Every reader reports what it could not read; the frames pass reads the dumps the
            # entries pass reported already.
            for other in self.TABLES:
                if other not in ("problems", "fr_frames"):
                    self.table(other)
            return self._problems.frame()
        if name not in self._cache:
            loader, produces = self._loaders()[name]
            try:
                result = loader()
            except Exception as exc:
                self._problems.add(".", name, f"could not build the table: {exc!r}")
                result = {t: schema.empty(t) for t in produces}
            self._cache.update(result)
        return self._cache[name]

    def reload(self) -> Run:
        """Forget every loaded table and look at the files again (a live job writes more)."""
        self.__init__(self.path, workers=self.workers)  # type: ignore[misc]
        return self

    def _loaders(self) -> dict[str, tuple[Callable[[], dict[str, pd.DataFrame]], tuple[str, ...]]]:
        inv, problems = self.inventory, self._problems

        def events() -> dict[str, pd.DataFrame]:
            ev, coll = parse_events(inv.events, rings=inv.rings, problems=problems)
            return {"events": ev, "collectives": coll}

        def logs() -> dict[str, pd.DataFrame]:
            return {
                "logs": read_logs(
                    inv.logs, local_ranks=inv.local_ranks, year=_year(self.info), problems=problems
                )
            }

        def nccl() -> dict[str, pd.DataFrame]:
            tables = load_nccl(inv.nccl, pid_ranks=inv.pid_ranks, problems=problems)
            return {"nccl": tables.lines, "nccl_comms": tables.comms}

        def fr() -> dict[str, pd.DataFrame]:
            tables = load_flight_recorder(
                inv.flight_recorder, problems=problems, workers=self.workers
            )
            keep = latest_dumps(tables.entries, tables.pg_status)
            return {
                "flight_recorder": _only(tables.entries, keep),
                "pg_status": _only(tables.pg_status, keep),
            }

        def frames() -> dict[str, pd.DataFrame]:
            kept = set(self.table("pg_status")["source"]) | set(self.flight_recorder["source"])
            dumps = [s for s in inv.flight_recorder if s.name in kept]
            # The dumps' problems were reported by the entries pass already.
            return {"fr_frames": read_fr_frames(dumps, problems=Problems(), workers=self.workers)}

        def stacks() -> dict[str, pd.DataFrame]:
            return {"stacks": read_stacks(inv.stacks, problems=problems)}

        def summary() -> dict[str, pd.DataFrame]:
            return {"stack_summary": summarize_stacks(self.table("stacks"))}

        def errors() -> dict[str, pd.DataFrame]:
            return {"errors": find_errors(self.table("logs"), nccl=self.table("nccl"))}

        def ranks() -> dict[str, pd.DataFrame]:
            return {
                "ranks": _ranks_table(self.table("events"), inv, self.info, self._launcher_text())
            }

        return {
            "events": (events, ("events", "collectives")),
            "collectives": (events, ("events", "collectives")),
            "logs": (logs, ("logs",)),
            "nccl": (nccl, ("nccl", "nccl_comms")),
            "nccl_comms": (nccl, ("nccl", "nccl_comms")),
            "flight_recorder": (fr, ("flight_recorder", "pg_status")),
            "pg_status": (fr, ("flight_recorder", "pg_status")),
            "fr_frames": (frames, ("fr_frames",)),
            "stacks": (stacks, ("stacks",)),
            "stack_summary": (summary, ("stack_summary",)),
            "errors": (errors, ("errors",)),
            "ranks": (ranks, ("ranks",)),
        }

    def fr_frames_for(self, ranks: set[int]) -> pd.DataFrame:
        """The flight-recorder frames of some ranks only: their dumps are read again, not every
        rank's (a call site needs a handful of entries, not millions of frames)."""
        if "fr_frames" in self._cache:
            frames = self._cache["fr_frames"]
            return frames[frames["rank"].isin(list(ranks))]
        kept = set(self.table("pg_status")["source"]) | set(self.flight_recorder["source"])
        mine = [s for s in self.inventory.flight_recorder if s.rank in ranks and s.name in kept]
        return read_fr_frames(mine, problems=Problems(), workers=1)

    def _launcher_text(self) -> str:
        text = ""
        for source in self.inventory.logs:
            if source.stream == "launcher":
                try:
                    text += source.path.read_text(errors="replace")
                except OSError:
                    continue
        return text

    # One property per table, so that ``run.events`` reads as the table it is.
    events = property(lambda self: self.table("events"), doc="The probe's events.")
    collectives = property(lambda self: self.table("collectives"), doc="Calls, enter+exit.")
    logs = property(lambda self: self.table("logs"), doc="Every log line.")
    nccl = property(lambda self: self.table("nccl"), doc="NCCL_DEBUG lines.")
    nccl_comms = property(lambda self: self.table("nccl_comms"), doc="NCCL communicators.")
    flight_recorder = property(lambda self: self.table("flight_recorder"), doc="FR entries.")
    fr_frames = property(lambda self: self.table("fr_frames"), doc="FR entries' frames.")
    pg_status = property(lambda self: self.table("pg_status"), doc="FR per-group status.")
    stacks = property(lambda self: self.table("stacks"), doc="Stack frames of every dump.")
    stack_summary = property(lambda self: self.table("stack_summary"), doc="Where each rank is.")
    errors = property(lambda self: self.table("errors"), doc="Known error signatures.")
    ranks = property(lambda self: self.table("ranks"), doc="One row per rank.")
    problems = property(lambda self: self.table("problems"), doc="Files that could not be read.")


def load_run(path: str | os.PathLike[str], *, workers: int | None = None) -> Run:
    """Open a rankscope run directory or a folder of foreign artifacts; tables load lazily.

    Nothing is read until a table is asked for, and no bad file stops the others: it becomes a
    row of ``run.problems``. ``workers`` caps the processes used for flight-recorder dumps
    (default: every core for large loads).

    Raises:
        ValueError: ``path`` does not exist or is not a directory.
    """
    root = Path(path)
    if not root.exists():
        raise ValueError(f"{root} does not exist; pass a run directory or a folder of artifacts")
    if not root.is_dir():
        raise ValueError(
            f"{root} is a file; pass the folder that holds it (load_run reads whole folders)"
        )
    return Run(root.resolve(), workers=workers)


def latest_dumps(entries: pd.DataFrame, pg_status: pd.DataFrame) -> set[str]:
    """The dumps to show: per rank and recorder (gloo, nccl), the one holding the newest entry.

    A run directory keeps a rank's last dump in both pickle and JSON, and evidence captures
    copies: all are snapshots of one ring buffer, and showing several would repeat its entries.
    Ties go to a pickle (it has the stack frames). Dumps of unknown rank are all kept; a dump
    without entries only when its rank has no other.
    """
    if entries.empty:
        return set(pg_status["source"])
    per_dump = entries.groupby("source", sort=False).agg(
        rank=("rank", "first"), backend=("backend", "first"), newest=("time_created_ns", "max")
    )
    per_dump["json"] = per_dump.index.str.endswith(".json")
    per_dump = per_dump.sort_values(["newest", "json"], ascending=[False, True], na_position="last")
    known = per_dump[per_dump["rank"].notna()]
    keep = set(known.drop_duplicates(["rank", "backend"]).index)
    keep |= set(per_dump[per_dump["rank"].isna()].index)
    ranks_with_entries = set(known["rank"])
    empty = pg_status[~pg_status["source"].isin(per_dump.index)]
    keep |= set(empty.loc[~empty["rank"].isin(ranks_with_entries), "source"])
    return keep


def _only(table: pd.DataFrame, sources: set[str]) -> pd.DataFrame:
    return table[table["source"].isin(sources)].reset_index(drop=True)


# --- discovery ---------------------------------------------------------------------------------
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


def _discover(root: Path, is_rundir: bool, info: dict[str, Any], problems: Problems) -> Inventory:
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
    elif kind == "log":
        has_nccl = _NCCL_LINE.search(head) is not None
        if has_nccl or "nccl" in path.name.lower():
            inv.nccl.append(Source(path, name, rank=rank))
        if not ("nccl" in path.name.lower() and has_nccl):  # an NCCL_DEBUG_FILE is only that
            inv.logs.append(Source(path, name, rank=rank, stream=stream_of(path.name)))
    else:
        getattr(inv, kind).append(Source(path, name, rank=rank))


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


def _year(info: dict[str, Any]) -> int | None:
    created = as_float(info.get("created_at"))
    try:
        return dt.datetime.fromtimestamp(created).year if created else None
    except (OverflowError, ValueError, OSError):
        return None


# --- the ranks table ---------------------------------------------------------------------------
def _thread_ident(tid: Any) -> str | None:
    """A thread's ident as faulthandler prints it: ``0x00007f...``."""
    return f"0x{tid:016x}" if type(tid) is int and tid >= 0 else None


def _ranks_table(
    events: pd.DataFrame, inv: Inventory, info: dict[str, Any], launcher_text: str
) -> pd.DataFrame:
    """One row per rank seen in any file's name or layout, with what the events and run.json
    say about it; exit codes come from the probe's end event, else run.json, else torchrun's
    failure summary."""
    seen = {
        s.rank
        for group in (inv.events, inv.rings, inv.logs, inv.nccl, inv.flight_recorder, inv.stacks)
        for s in group
        if s.rank is not None
    }
    seen |= set(inv.starts)
    recorded = info.get("ranks") if isinstance(info.get("ranks"), dict) else {}
    seen |= {r for r in map(as_int, recorded) if r is not None}
    failures = torchrun_failures(launcher_text)
    by_rank = {r: g for r, g in events.groupby("rank", sort=False)} if len(events) else {}
    ringed = {s.rank for s in inv.rings}
    rows = []
    world = as_int(info.get("world_size"))
    for rank in sorted(seen):
        start = inv.starts.get(rank, {})
        env = start.get("env") if isinstance(start.get("env"), dict) else {}
        evs = by_rank.get(rank)
        ends = evs[evs["ev"] == "end"] if evs is not None else None
        code = (
            as_int(ends["code"].dropna().iloc[-1])
            if ends is not None and ends["code"].notna().any()
            else None
        )
        entry = recorded.get(str(rank)) if isinstance(recorded.get(str(rank)), dict) else {}
        if code is None:
            code = as_int(entry.get("exit_code"))
        if code is None:
            code = failures.get(rank)
        rows.append(
            {
                "rank": rank,
                "pid": as_int(start.get("pid")),
                "host": start.get("host") if isinstance(start.get("host"), str) else None,
                "local_rank": as_int(env.get("LOCAL_RANK")),
                "group_rank": as_int(env.get("GROUP_RANK")),
                "world_size": as_int(env.get("WORLD_SIZE")) or world,
                "started_s": as_float(start.get("t")),
                "ended_s": None if ends is None or not len(ends) else ends["t_s"].iloc[-1],
                "exit_code": code,
                "signal": signal_name(code),
                "end_reason": None if ends is None or not len(ends) else ends["message"].iloc[-1],
                "last_event_s": None if evs is None else evs["t_s"].max(),
                "ring": rank in ringed,
                "main_thread": _thread_ident(start.get("main_tid")),
            }
        )
    columns = list(schema.RANKS)
    return schema.validate("ranks", schema.conform("ranks", pd.DataFrame(rows, columns=columns)))
