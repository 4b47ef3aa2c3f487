"""The run directory: the one contract between rankscope's layers.

Every writer (the launcher, the probe inside each rank, the stall watchdog) and every reader (the
collectors, the CLI, the widgets) finds files through :class:`RunDir`, so the layout below is the
only place it is spelled out::

    <run>/
      run.json                 spec, commands, pids, times, state, exit codes per rank (atomic)
      launcher.log             torchrun agent output for node 0 (ChildFailedError summary lands here)
      launcher.node<k>.log     the same for simulated node k > 0 (under SLURM: every node's srun
                               task output, node 0's too)
      slurm.sbatch             the batch script (launcher="slurm"), and slurm-<job id>.out, its
                               output
      logs/node<k>/            torchrun --log-dir: <rdzv_id>_<random>/attempt_<n>/<local_rank>/...
      control/capture.json     the latest evidence request {"id", "t", "reason"} (the probe polls it)
      ranks/<rank>/
        events.jsonl           probe events, one JSON object per line (see EVENT_KINDS)
        calls-<pid>.ring       the last RING_SLOTS calls of process <pid>, written at entry and
                               exit through a shared memory map, and the last step it marked
                               (see RING_HEADER, RING_STEP, RING_SLOT)
        stacks.txt             faulthandler dumps of every thread, each after a "# rankscope" marker
        values.jsonl           with each capture, and where a call raised, the simple values its
                               threads' conditions read (rankscope.probe._values: numbers,
                               strings, booleans, None only)
        fr.pkl                 the latest dump of torch's flight recorder (pickle, as torch writes it)
        fr_nccl.pkl            the latest dump of the NCCL flight recorder, when the backend is nccl
        nccl.log               NCCL_DEBUG output, when the nccl_debug preset is on
      evidence/capture-<id>/   what one capture gathered: manifest.json, copies of the dumps, py-spy
      diagnosis.json           the last verdict
      accelerate_config.yaml   what `accelerate launch` read (launcher="accelerate")
      hostfile.cfg             what DeepSpeed's launcher read (launcher="deepspeed", hostfile=...)
      repro.py                 the replay written from the workbench (rankscope.replay)
      cells/<cell N>           a cell session's (rankscope.cells) cell N as its ranks ran it; the
                               ranks compile it under this path, so sites read "<cell N>:line"
      cells/cells.jsonl        one line per cell run: {"cell", "ranks", "t", "replay"}, then its
                               end {"cell", "end", "t", "ok", "failed"}; an interrupt of it:
                               {"cell", "interrupt" (the ranks sent it), "t"}
      cells/session.json       the session: its folder, this incarnation's number, the previous one

This module imports only the standard library: the probe loads it inside every rank.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import fcntl
import functools
import json
import os
import re
import secrets
import struct
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

try:  # a fifth of the json module's time per line (EventTail.read); the probe needs neither
    import orjson
except ImportError:  # an environment that cannot install it (a site without the package)
    orjson = None

from rankscope._values import as_float, as_int, as_str
from rankscope.state import call_state

#: Event kinds the probe writes to ``events.jsonl``. Every event has ``ev`` (the kind), ``t``
#: (wall-clock seconds since the epoch; to the microsecond in call, enter and exit events, as is
#: their ``dur_s``) and ``rank``. A call's facts (what repeats from call to call at a call site:
#: op, group, peer, shapes, dtypes, site) are written once, in a ``facts`` line, and its
#: ``call`` or ``enter`` line names them by id (``facts``); a probe older than that wrote them
#: in every ``enter`` line, which readers still take. :func:`as_enter_exit` gives a call's
#: events in that older form, enter and exit, whatever wrote them.
EVENT_KINDS = {
    "start": "pid, host, argv, python, torch, main_tid and the torchrun env contract (env: dict)",
    "heartbeat": "done (collectives completed), step, coll (id of the collective in flight or "
    "null), op, fr (flight recorder per group: [last enqueued, last completed]), cpu (the main "
    "thread's CPU seconds), at ([file, line, function] of the main thread's innermost user "
    "frame)",
    "facts": "facts (their id, in the ring and in call and enter lines), op, pg, pg_desc, pg_ranks "
    "(every member of the group), peer, shapes, dtypes, async_op, file, line, func, path (the id "
    "of the call's path line; older probes: none); written at once, before the first call that "
    "has them proceeds",
    "path": "path (its id, in facts lines), frames ([file, func, line] of each frame from the "
    "outermost to the one that called torch.distributed, MACHINERY left out), cut (how many "
    "outer frames were left out past PATH_DEPTH); written at once, before the first facts line "
    "that names it",
    "call": "id, seq (the n-th collective of the rank on the group, from 1; point-to-point calls "
    "are numbered apart), tid, facts, dur_s, ok (true): a call that returned before the flush that "
    "writes it, in one line; t is its enter time, t + dur_s its end. A call that raised is "
    "written as an enter and an exit line",
    "enter": "id, seq, tid, facts: a call in flight at a flush (older probes: no facts, but op, "
    "pg, pg_desc, pg_ranks, peer, shapes, dtypes, async_op, file, line, func)",
    "exit": "id, op, pg, seq, dur_s, ok, error: the end of a call whose enter line was written",
    "step": "step (the user's step marker)",
    "exception": "type, message, traceback",
    "cell": "cell (N of the cell's file <cell N>), run (the session's number for this run of "
    "it), phase (start, or end: however it ended on this rank), threads (at its end: threads "
    "the cell started that still run), ok (at its end: false where the cell raised), error and "
    "site (where it raised: 'ValueError: bad batch', '<cell 7>:3'); written by a cell "
    "session's rank (rankscope.probe.cells)",
    "capture": "id, reason, files (what the probe wrote for an evidence request)",
    "dropped": "since (the time of the first write that failed), writes (how many failed), error "
    "(the OS's word: No space left on device): what the probe could not write to this file and "
    "dropped, said when it can write again; the line before it may be torn",
    "end": "code (the process exit code, when the probe saw it), reason (exit, exception, "
    "os._exit, or the name of the signal that ended the process: SIGTERM), how (returned: the "
    "script ran to its end; sys_exit: SystemExit, whatever its code; exception: uncaught; "
    "os._exit; or the signal's name; null where the probe cannot tell: an exit seen only by "
    "atexit, without the bootstrap), stack (for sys_exit, exception and os._exit: where it was "
    "raised or called, [[file, function, line], ...] outermost first, without the probe's and "
    "runpy's frames; also written to stacks.txt as a capture with how as its reason), fr (as "
    "the heartbeat's, at the end)",
}

#: Point-to-point calls: an ``enter`` event's ``seq`` numbers them apart from the group's
#: collectives, so a collective's ``seq`` is the n-th collective of the rank on its group.
P2P_OPS = frozenset(
    {"send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list", "recv_object_list"}
)

#: Recorded calls that are not collectives: process-group set-up and teardown. They take a
#: number in the probe's sequence of their group, but only the ranks that make them do (a group
#: made with ``use_local_synchronization``), so collectives are numbered without them.
MANAGEMENT_OPS = frozenset(
    {
        "init_process_group",
        "destroy_process_group",
        "new_group",
        "new_subgroups",
        "new_subgroups_by_enumeration",
    }
)

#: How many of a rank's latest collectives on each group its record keeps the facts of
#: (:attr:`RankRecord.recent`): a rank blocked at one collective holds every member within one
#: blocking call of it, and the few kept stay cheap at a thousand ranks (fewer objects for the
#: garbage collector to walk).
RECENT_CALLS = 8

#: How many facts ids a probe process keeps: once it has issued this many since it last forgot
#: them, it forgets them all and names calls by ids it issues anew (keeping a rank's memory
#: bounded when its shapes never repeat). A line written by then names facts among the latest
#: ``2 * FACTS_KEPT`` its process issued, unless the call stayed in flight while the process
#: issued ``FACTS_KEPT`` new facts more: a reader keeps that many (:func:`keep_facts`).
FACTS_KEPT = 50_000

#: Frames that belong to no decision of the user's: the interpreter's start-up, rankscope's own
#: code and the body of torch.distributed's calls (the decision is above them). A call's path
#: leaves them out (the probe's ``path`` lines, the analyzer's paths of captured stacks); the
#: libraries the user's code calls (Lightning, transformers, torch.distributed.fsdp) stay.
#: rankscope's own frames among :data:`MACHINERY` (the probe's wrappers, its captures, the
#: bootstrap that runs the user's script, and what forks a rank from the template).
OWN_FRAMES = (
    "/rankscope/probe/",
    "/rankscope/launch/",
    "/rankscope/_template.py",
    "/rankscope/_warm.py",
    "/rankscope/torchrun.py",
)
MACHINERY = (
    "<frozen ",
    "/runpy.py",
    *OWN_FRAMES,
    "/torch/distributed/distributed_c10d.py",
    "/torch/distributed/c10d_logger.py",
    "/torch/utils/_contextlib.py",
    # A cell session's engines (rankscope.cells): what runs a cell is not the user's code (nor
    # is the line the engine compiles to run it, in ipykernel_<pid>/).
    "/ipyparallel/",
    "/ipykernel/",
    "/ipykernel_",
    "/IPython/",
    "/tornado/",
    "/zmq/",
)

_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ()))
_STDLIB_DIR = re.compile(r"/lib(?:64)?/python\d(?:\.\d+)?/")
_INSTALLED = ("site-packages", "dist-packages")
#: File names of code that torch generates (torch.fx's graph modules, as torch.compile runs
#: them), and the interpreter's frozen modules: never the user's, whatever the ``<`` says.
_GENERATED = ("<frozen", "<eval_with_key>")
#: A version in an installed folder's name (``lightning-2.6.6``): the package is the same.
_VERSION = re.compile(r"-\d[\w.+]*$")


def is_user_file(path: str | None) -> bool:
    """Whether a frame of ``path`` is the user's (the script, its own package, a notebook cell)
    rather than a library's: torch, rankscope, the standard library, an installed package
    (site-packages: Lightning, transformers, accelerate, DeepSpeed) or frozen bootstrap code.
    The one test of it: the probe's paths, the stacks' ``is_user``, the call sites and the
    parting line all read it here. Works on full paths (faulthandler, flight recorder) and on
    py-spy's short ones (``threading.py``, ``torch/distributed/distributed_c10d.py``)."""
    if not path:
        return False
    if path.startswith("<"):  # exec'd text, a notebook cell: the user's; not torch's own
        return not path.startswith(_GENERATED)
    norm = path.replace("\\", "/")
    if "rankscope/scenarios/scripts/" in norm:
        return True  # the scenarios are user scripts that happen to ship with rankscope
    parts = norm.split("/")
    if {*_INSTALLED, "torch", "rankscope"} & set(parts):
        return False
    if _STDLIB_DIR.search(norm):
        return False
    if "/" not in norm:  # py-spy's short name of a top-level module: threading.py
        return norm.removesuffix(".py") not in _STDLIB
    return parts[0] not in _STDLIB  # "importlib/__init__.py"; "" for an absolute path


def library_of(path: str | None) -> str | None:
    """The installed package a library frame of ``path`` belongs to (``lightning``,
    ``transformers``, ``torch``), None for the user's frames and where the path does not say
    (the standard library, frozen code)."""
    if not path or is_user_file(path):
        return None
    if path.startswith(_GENERATED[1:]):
        return "torch"
    parts = path.replace("\\", "/").split("/")
    for i, part in enumerate(parts[:-1]):
        if part in _INSTALLED:
            name = parts[i + 1]
            if name.endswith(".egg") and i + 2 < len(parts) - 1:
                name = parts[i + 2]  # lightning-2.6.6-py3.11.egg/lightning/...: the package
            return _VERSION.sub("", name.removesuffix(".py")) or None
    for name in ("torch", "rankscope"):
        if name in parts[:-1]:
            return name
    return None


#: A call's path keeps its innermost ``PATH_DEPTH`` frames (after MACHINERY is left out); a
#: ``path`` line's ``cut`` says how many outer ones a deeper path lost.
PATH_DEPTH = 64


def is_machinery(file: str) -> bool:
    """Whether a frame of ``file`` is one of :data:`MACHINERY`'s."""
    return any(m in file for m in MACHINERY)


def user_span(files: Sequence[str]) -> tuple[int, int]:
    """For the files of a stack's frames, outermost first: ``(start, stop)``, the frames from
    the first to the last that is not :data:`MACHINERY`'s, the user's world (the interpreter's
    start-up before it, torch's call and rankscope's capture after it); ``(n, n)`` when every
    frame is machinery."""
    mine = [i for i, f in enumerate(files) if not is_machinery(f)]
    return (mine[0], mine[-1] + 1) if mine else (len(files), len(files))


def without_machinery(path: list[Any]) -> list[Any]:
    """A path (frames ``(file, func, line)``) without :data:`MACHINERY`'s frames."""
    return [f for f in path if not is_machinery(f[0])]


#: The ring file (``calls-<pid>.ring``): a header, then ``nslots`` slots; the call with id
#: ``cid`` is in slot ``cid % nslots``. The probe maps the file shared and writes a call's slot
#: as the call is entered and again as it returns, so the kernel keeps both in the file however
#: the process ends (SIGKILL, abort, segfault). A slot's ``cid`` is written last (0 while it is
#: being written); its ``state`` after ``t_end``. ``_fast.c`` writes the same layout.
RING_MAGIC = b"RSRING01"
RING_VERSION = 1
RING_SLOTS = 4096
#: magic, version, slot size, slots, pid, rank, created (time.time()), the last step the rank
#: marked and when (RING_STEP, at RING_STEP_AT: a time of 0.0 is none), then padding to 64 bytes.
RING_HEADER = struct.Struct("<8sIIIIqdqd8x")
#: The header's step and its time (time.time()), stored by the probe at every step it marks: a
#: rank killed before its thread wrote the step's event still has it here.
RING_STEP = struct.Struct("<qd")
RING_STEP_AT = struct.calcsize("<8sIIIIqd")
#: A slot's fields, in order, with their struct codes: cid (0: empty or torn), seq, t (enter),
#: t_end, facts id, state (RING_STATES), thread ident; then padding to 64 bytes. The one
#: definition of the slot: RING_SLOT, RING_SLOT_OFFSETS and the collector's NumPy dtype follow
#: from it, and a test checks ``_fast.c``'s ``RingSlot`` against it.
RING_SLOT_FIELDS: tuple[tuple[str, str], ...] = (
    ("cid", "Q"),
    ("seq", "q"),
    ("t", "d"),
    ("t_end", "d"),
    ("fid", "I"),
    ("state", "I"),
    ("tid", "Q"),
)
_RING_SLOT_USED = struct.calcsize("<" + "".join(code for _, code in RING_SLOT_FIELDS))
RING_SLOT = struct.Struct(
    "<" + "".join(code for _, code in RING_SLOT_FIELDS) + f"{64 - _RING_SLOT_USED}x"
)
#: Each field's offset in a slot.
RING_SLOT_OFFSETS: dict[str, int] = {
    name: struct.calcsize("<" + "".join(code for _, code in RING_SLOT_FIELDS[:i]))
    for i, (name, _) in enumerate(RING_SLOT_FIELDS)
}
#: A slot's state: the call is in flight, returned, or raised.
RING_STATES = ("in_flight", "returned", "raised")

#: Job states recorded in run.json.
STATES = ("starting", "running", "stalled", "exited", "stopped", "failed_to_start")
FINAL_STATES = frozenset({"exited", "stopped", "failed_to_start"})

RUN_JSON = "run.json"
ENV_RUN_DIR = "RANKSCOPE_RUN_DIR"
#: Files of the layout above that other layers name: the launchers' inputs and the replay.
ACCELERATE_CONFIG = "accelerate_config.yaml"
DEEPSPEED_HOSTFILE = "hostfile.cfg"
REPRO = "repro.py"
#: torch.distributed's environment contract, as launchers set it for every process: the probe
#: records it in the start event; the ``python`` launcher starts a process without it.
DIST_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


class RunDirError(ValueError):
    """A path is not a usable run directory; the message says why and what to do."""


class RunDir:
    """Paths of one run directory. Cheap to create; touches the filesystem only when asked."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path).resolve()

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __fspath__(self) -> str:
        return str(self.path)

    # --- layout -----------------------------------------------------------------------------
    @property
    def run_json(self) -> Path:
        return self.path / RUN_JSON

    def launcher_log(self, node: int = 0) -> Path:
        return self.path / ("launcher.log" if node == 0 else f"launcher.node{node}.log")

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    def node_logs(self, node: int) -> Path:
        return self.logs / f"node{node}"

    @property
    def control(self) -> Path:
        return self.path / "control"

    @property
    def capture_request(self) -> Path:
        return self.control / "capture.json"

    @property
    def ranks(self) -> Path:
        return self.path / "ranks"

    def rank_dir(self, rank: int) -> Path:
        return self.ranks / str(rank)

    def events(self, rank: int) -> Path:
        return self.rank_dir(rank) / "events.jsonl"

    def stacks(self, rank: int) -> Path:
        return self.rank_dir(rank) / "stacks.txt"

    def values(self, rank: int) -> Path:
        return self.rank_dir(rank) / "values.jsonl"

    def ring(self, rank: int, pid: int) -> Path:
        return self.rank_dir(rank) / f"calls-{pid}.ring"

    def fr_dump(self, rank: int, *, nccl: bool = False) -> Path:
        return self.rank_dir(rank) / ("fr_nccl.pkl" if nccl else "fr.pkl")

    def nccl_log(self, rank: int) -> Path:
        return self.rank_dir(rank) / "nccl.log"

    @property
    def evidence(self) -> Path:
        return self.path / "evidence"

    def capture_dir(self, capture_id: int) -> Path:
        return self.evidence / f"capture-{capture_id}"

    @property
    def diagnosis_json(self) -> Path:
        return self.path / "diagnosis.json"

    @property
    def cells(self) -> Path:
        return self.path / "cells"

    def cell_source(self, cell: int) -> Path:
        """Where cell ``cell`` of a cell session is kept; its file name is the site's name."""
        return self.cells / f"<cell {cell}>"

    @property
    def cells_log(self) -> Path:
        return self.cells / "cells.jsonl"

    @property
    def cells_session(self) -> Path:
        return self.cells / "session.json"

    # --- discovery --------------------------------------------------------------------------
    def rank_ids(self) -> list[int]:
        """Ranks that have a directory under ``ranks/``, sorted."""
        if not self.ranks.is_dir():
            return []
        return sorted(int(p.name) for p in self.ranks.iterdir() if p.name.isdigit())

    def is_run(self) -> bool:
        return self.run_json.is_file()

    # --- run.json ---------------------------------------------------------------------------
    def read_run(self) -> dict[str, Any]:
        """Return run.json; raise :class:`RunDirError` if it is missing or unreadable."""
        try:
            return json.loads(self.run_json.read_text())
        except FileNotFoundError:
            raise RunDirError(
                f"{self.path} has no run.json: it is not a rankscope run directory "
                "(use rankscope.collect.load_run for a folder of foreign artifacts)"
            ) from None
        except (OSError, ValueError) as exc:
            raise RunDirError(f"{self.run_json} could not be read: {exc}") from exc

    def write_run(self, data: dict[str, Any]) -> None:
        atomic_write_json(self.run_json, data)

    def update_run(self, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Read, change and write run.json under an exclusive lock; return the new content.

        Several processes write run.json (the supervisor, the owner's watchdog, ``stop()`` from an
        attached process), so every update goes through this lock.
        """
        with self._lock():
            data = self.read_run()
            change(data)
            self.write_run(data)
            return data

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        fd = os.open(self.path / ".run.lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    # --- events -----------------------------------------------------------------------------
    def iter_events(self, rank: int) -> Iterator[dict[str, Any]]:
        """Yield the rank's events, each call's as :func:`as_enter_exit` gives them (an enter
        event with its facts' fields, and its exit event); a torn or garbled line is skipped
        (the collectors report it)."""
        facts: dict[int, dict[str, Any]] = {}
        for ev in EventTail(self.events(rank)).read():
            if ev.get("ev") == "facts" and type(ev.get("facts")) is int:
                keep_facts(facts, ev["facts"], ev)
            yield from as_enter_exit(ev, facts)


class EventTail:
    """Incremental reader of one ``events.jsonl``: each :meth:`read` returns only new events.

    A line still being written (no newline yet) is kept back until it is complete.
    """

    def __init__(self, path: Path):
        self.path = path
        self._name = os.fspath(path)  # a str: what open and stat take fastest
        self._offset = 0
        self._partial = b""

    def grew(self) -> bool:
        """A stat shows more than was read (a stat costs a fifth of an open and a read). Where
        attributes are cached (NFS) it may not show what was written: :meth:`read` opens it."""
        try:
            return os.stat(self._name).st_size != self._offset
        except OSError:
            return False

    def skip_to_end(self) -> None:
        """Start after what the file holds now: only events written later are read."""
        try:
            self._offset = self.path.stat().st_size
        except OSError:
            self._offset = 0
        self._partial = b""

    def read(self) -> list[dict[str, Any]]:
        # A descriptor and one pread: half the cost of a file object (1024 ranks, 2000 reads a
        # second). The size comes after the open, which revalidates it on NFS.
        try:
            fd = os.open(self._name, os.O_RDONLY)
        except FileNotFoundError:
            return []
        try:
            size = os.fstat(fd).st_size
            chunk = os.pread(fd, size - self._offset, self._offset) if size > self._offset else b""
        finally:
            os.close(fd)
        if not chunk:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk if self._partial else chunk
        end = data.rfind(b"\n")
        self._partial = data[end + 1 :]
        if end < 0:
            return []
        # One parse for the batch, its newlines made commas in one pass (a 1024-rank job
        # writes 40k lines a second; a JSON text holds no raw newline). orjson takes a fifth of
        # the json module's time per line; what it refuses (a damaged line, NaN, an integer
        # past 64 bits) is parsed line by line as the json module reads it.
        try:
            out = orjson.loads(b"[" + data[:end].replace(b"\n", b",") + b"]") if orjson else None
        except orjson.JSONDecodeError:
            out = None
        lines = data.count(b"\n", 0, end + 1)
        if out is None or len(out) != lines or set(map(type, out)) != {dict}:
            out = event_lines(data[:end].split(b"\n"))  # a damaged line, or two values on one
        return out


def event_lines(lines: list[bytes]) -> list[dict[str, Any]]:
    """The JSON objects of ``lines``, each parsed on its own; a line that is not one is
    skipped."""
    out = []
    for line in lines:
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if isinstance(ev, dict):
            out.append(ev)
    return out


def keep_facts(kept: dict[int, Any], fid: int, value: Any) -> None:
    """``kept[fid] = value`` as the latest facts of a rank's process (a process started anew
    issues its ids anew), the oldest dropped past ``2 * FACTS_KEPT``."""
    kept.pop(fid, None)
    kept[fid] = value
    if len(kept) > 2 * FACTS_KEPT:
        del kept[next(iter(kept))]


def read_path(
    ev: dict[str, Any],
) -> tuple[int, int, tuple[tuple[str, str, int | None], ...]] | None:
    """A ``path`` line's id, cut (outer frames left out) and frames from the outermost.

    Each frame is ``(file, func, line)``. None where the line is not one the probe writes (a
    torn or garbled line: its id, a frame's file or function is not what it should be)."""
    pid, frames, cut = ev.get("path"), ev.get("frames"), ev.get("cut", 0)
    if not (valid_id(pid) and isinstance(frames, list) and valid_id(cut)):
        return None
    out = []
    for frame in frames:
        if not (
            isinstance(frame, list)
            and len(frame) == 3
            and isinstance(frame[0], str)
            and isinstance(frame[1], str)
        ):
            return None
        line = frame[2]
        out.append((frame[0], frame[1], line if valid_id(line) else None))
    return pid, cut, tuple(out)


def valid_id(value: Any) -> bool:
    """An int that a table's Int64 column holds with room to spare (ids, counts, lines)."""
    return type(value) is int and 0 <= value < 1 << 48


#: A call line's fields that its enter event has.
_CALL_ENTER = ("id", "seq", "tid", "facts", "t", "rank")


def as_enter_exit(
    ev: dict[str, Any], facts: dict[int, dict[str, Any]]
) -> tuple[dict[str, Any], ...]:
    """A call's events as a probe that wrote the facts in every ``enter`` line wrote them: an
    ``enter`` line that names its facts, with their fields (``facts``: the ``facts`` lines by
    id); a ``call`` line, as its enter event and its exit event (at ``t + dur_s``, to the
    microsecond). Any other event, or an enter line of that older probe, as it is; facts it
    names that are not in ``facts`` add no field."""
    kind = ev.get("ev")
    if kind != "call" and (kind != "enter" or "facts" not in ev):
        return (ev,)
    fid = ev.get("facts")
    known = facts.get(fid, {}) if type(fid) is int else {}
    # (t and rank are the line's, never its facts line's)
    if kind == "enter":
        return ({**known, **ev, "t": ev.get("t"), "rank": ev.get("rank")},)
    enter = {**known, **{k: ev.get(k) for k in _CALL_ENTER}, "ev": "enter"}
    t, dur = as_float(ev.get("t")), as_float(ev.get("dur_s"))
    exit_ = {
        "id": ev.get("id"),
        "op": known.get("op"),
        "pg": known.get("pg"),
        "seq": ev.get("seq"),
        "dur_s": ev.get("dur_s"),
        "ok": ev.get("ok"),
        "error": ev.get("error"),
        "ev": "exit",
        "t": None if t is None or dur is None else round(t + dur, 6),
        "rank": ev.get("rank"),
    }
    return enter, exit_


def atomic_write_json(path: Path, data: Any) -> None:
    """Write JSON so that readers see either the old file or the new one, never a torn one."""
    atomic_write_bytes(path, (json.dumps(data, indent=1, default=str) + "\n").encode())


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


_NAME_OK = re.compile(r"[^A-Za-z0-9_.-]+")


def new_run_dir(base: str | os.PathLike[str] = "runs", *, name: str = "job") -> RunDir:
    """Create a fresh, uniquely named run directory ``<base>/<date>-<time>-<name>-<random>``."""
    stem = _NAME_OK.sub("-", name).strip("-")[:40] or "job"
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base_path = Path(base)
    base_path.mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        path = base_path / f"{stamp}-{stem}-{secrets.token_hex(3)}"
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return RunDir(path)
    raise RunDirError(f"could not create a fresh run directory under {base_path}")


def claim_run_dir(path: str | os.PathLike[str]) -> RunDir:
    """Use ``path`` as a new run directory: create it if absent, refuse one that holds a run."""
    run = RunDir(path)
    if run.run_json.exists():
        raise RunDirError(
            f"{run.path} already holds a run (run.json exists); choose another --run-dir, "
            "or omit it to get a fresh directory under ./runs/"
        )
    if run.path.exists() and not run.path.is_dir():
        raise RunDirError(f"{run.path} exists and is not a directory")
    run.path.mkdir(parents=True, exist_ok=True)
    return run


_FAILURE_BLOCK = re.compile(
    r"rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*(?P<local>\d+)\)\s*\n\s*"
    r"exitcode\s*:\s*(?P<code>-?\d+)",
)


def torchrun_failures(text: str) -> dict[int, int]:
    """Exit codes by global rank from torchrun's ``ChildFailedError`` summary in a launcher log.

    torchrun lists every failed worker as ``rank : R (local_rank: L)`` followed by
    ``exitcode : C`` (negative for a signal). Ranks that are not listed did not fail.
    """
    return {int(m["rank"]): int(m["code"]) for m in _FAILURE_BLOCK.finditer(text)}


@dataclasses.dataclass
class RankRecord:
    """What one rank is, did and how it ended, folded from its probe events in order.

    The one per-rank record: the supervisor writes :meth:`summary` into ``run.json``, the live
    tracker keeps one per rank as events arrive, and the collectors' ``ranks`` table is built
    from one per rank. Fields the events never gave stay None. Every value comes from a file a
    rank wrote, so each is checked for its type as it is read.
    """

    rank: int
    pid: int | None = None
    host: str | None = None
    local_rank: int | None = None
    group_rank: int | None = None
    world_size: int | None = None
    started_at: float | None = None
    main_thread: str | None = None
    """The main thread's ident as faulthandler prints it (``0x00007f...``)."""
    done: int = 0
    """Collectives it completed: a blocking call returned from without an error, an async one
    once the backend completed it (not failed); process-group management (:data:`MANAGEMENT_OPS`)
    left out. The one count every view shows (see :mod:`rankscope.state`)."""
    step: int | None = None
    step_t: float | None = None
    """When it marked ``step`` (its line's ``t``)."""
    op: str | None = None
    """Its latest collective: op, group, number on the group, call site (``train.py:12``)."""
    pg: str | None = None
    seq: int | None = None
    site: str | None = None
    path: tuple[tuple[str, str, int | None], ...] | None = None
    """Its latest call's path: ``(file, func, line)`` of each frame from the outermost (see
    the ``path`` event); None where its probe wrote none or the line is unknown."""
    last_state: str | None = None
    """Its latest call's state (:func:`rankscope.state.call_state`, every view's rule):
    ``issued`` until it returned (an async call: until the backend completed it),
    ``completed`` or ``failed``."""
    _last_id: int | None = dataclasses.field(default=None, repr=False)
    in_collective_since: float | None = None
    """When it entered the (blocking) collective it has not returned from yet."""
    last_done: str | None = None
    """The last collective completed: ``all_reduce (group 0 #3)`` (a blocking call when it
    returned, an async one when the backend completed it)."""
    issued: dict[int, list[Any]] = dataclasses.field(default_factory=dict)
    """Async calls (``async_op=True``, isend, ...) returned from but not completed by the
    backend, by call id: ``[op, pg, seq, site, issued at]``."""
    fr_active: list[list[Any]] | None = None
    """The flight recorder's uncompleted entries at its last heartbeat that read them:
    ``[group, seq, op, state, created_s, started_s]`` (see the probe's ``_fr_active_entries``)."""
    issued_seqs: dict[str, int] = dataclasses.field(default_factory=dict)
    """Per group, the number of the last collective it called (the probe's numbering)."""
    members: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    """Per group it called on, the group's ranks."""
    peer: int | None = None
    """Its latest call's peer (a point-to-point call's) or root (a rooted collective's)."""
    collectives: dict[str, int] = dataclasses.field(default_factory=dict)
    """Per group, the collectives it called (:data:`MANAGEMENT_OPS` left out, as the analyzer
    numbers them; ``issued_seqs`` is the probe's numbering)."""
    recent: dict[tuple[str, int], tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    """Its last ``RECENT_CALLS`` collectives on each group, by group and that number: ``(op,
    shapes, dtypes, root)``, what makes a call the call it is (:func:`rankscope.waitfor.differs`)."""
    numbered: dict[tuple[str, int], int] = dataclasses.field(default_factory=dict)
    """The same calls' numbers by group and the probe's ``seq``."""
    sent: dict[int, int] = dataclasses.field(default_factory=dict)
    """Point-to-point sends it called, per peer (``received``: receives)."""
    received: dict[int, int] = dataclasses.field(default_factory=dict)
    p2p_known: bool = True
    """False once it made a point-to-point call without one peer (``batch_isend_irecv``, a
    receive from any source): ``sent`` and ``received`` no longer count every message."""
    call_thread: int | None = None
    """The thread that made its recorded calls; ``threads`` is True once a second one did."""
    threads: bool = False
    _async: dict[int, list[Any]] = dataclasses.field(default_factory=dict, repr=False)
    """Async calls entered, not yet returned from (their facts, for ``issued``)."""
    _completed: dict[int, bool] = dataclasses.field(default_factory=dict, repr=False)
    """Async calls whose done event came before their exit line: True where it completed,
    False where it failed."""
    _facts: dict[int, tuple[Any, ...]] = dataclasses.field(default_factory=dict, repr=False)
    """Its facts lines by id, as :func:`_call_facts` reads them (the latest, see
    :func:`keep_facts`)."""
    _paths: dict[int, tuple[Any, ...]] = dataclasses.field(default_factory=dict, repr=False)
    """Its path lines' frames by id (the latest, as ``_facts``)."""
    _members_of: dict[Any, Any] = dataclasses.field(default_factory=dict, repr=False)
    """Per group, the members its last facts line gave: the facts of its calls on a group
    share one list while the members are the same, which a call compares by identity."""
    at: str | None = None
    """Where its main thread was at its last heartbeat, in the user's code: ``train.py:14``."""
    at_file: str | None = None
    """The same line's file as the rank named it (its source, read for the live view)."""
    fr: dict[str, list[int]] | None = None
    """Flight recorder per group: [last enqueued, last completed], from the heartbeat (from the
    end event once it ended, where that says it: ``fr_final``)."""
    fr_final: bool = False
    """``fr`` is the count at its end: it issued no collective after."""
    node: str | None = None
    """The SLURM node it runs on (SLURMD_NODENAME), under SLURM."""
    slurm_job: str | None = None
    """The SLURM job id it runs in (SLURM_JOB_ID), under SLURM."""
    cpu_share: float | None = None
    """Its main thread's share of a core between its last two heartbeats."""
    cpu_at: tuple[float, float] | None = None
    """(time, main thread CPU seconds) at its last heartbeat."""
    unfinished: list[str] = dataclasses.field(default_factory=list)
    """Collectives it issued and the backend never completed before its end:
    ``all_reduce (group 0 #5)`` (nccl returns at enqueue, so it had returned from them)."""
    last_event_at: float | None = None
    exception: str | None = None
    ended: bool = False
    ended_at: float | None = None
    exit_code: int | None = None
    end_reason: str | None = None
    """Why the end event was written: ``exit``, ``exception``, ``os._exit`` or the signal."""
    end_how: str | None = None
    """How it ended, as its end event says (``how`` in :data:`EVENT_KINDS`): ``returned``,
    ``sys_exit``, ``exception``, ``os._exit`` or the signal's name."""
    cell: tuple[int | None, int | None] | None = None
    """In a cell session: ``(cell, run)`` of the latest cell it started (its ``cell`` event)."""
    cell_ended: bool = False
    """That cell ended on it (a later cell's start clears it)."""
    cell_threads: int | None = None
    """At that cell's end, the threads the cell started that still ran (None: not said)."""
    cell_at: float | None = None
    """When its latest ``cell`` event was written (that cell's start, or its end)."""
    cell_raised: bool = False
    """That cell ended by raising on it (its end event's ``ok`` is false)."""
    cell_error: str | None = None
    """What it raised there (``ValueError: bad batch``), where its end event says."""
    cell_error_site: str | None = None
    """The line of the cell it raised at (``<cell 7>:3``), where its end event says."""

    @property
    def cell_state(self) -> str | None:
        """In a cell session, where it stands with its latest cell (:attr:`cell`): ``running``
        (started, not ended), ``finished`` (ended, and left no thread of its own running: it
        makes no call of that cell again), ``raised`` (as finished, but the cell raised on
        it), ``threads`` (ended, leaving threads that may still make calls); None outside a
        cell session."""
        if self.cell is None:
            return None
        if not self.cell_ended:
            return "running"
        if self.cell_threads != 0:
            return "threads"
        return "raised" if self.cell_raised else "finished"

    def apply(self, ev: dict[str, Any]) -> bool:
        """Fold one event in; True when it is progress (a start, a collective returned from, a
        step, a flight-recorder completion, the end)."""
        # The live tracker folds 20 000 calls a second at 1024 ranks: they come first, and a
        # value of the right type skips its coercion.
        kind = ev.get("ev")
        t = ev.get("t")
        if type(t) is not float:
            t = as_float(t)
        if t is not None:
            self.last_event_at = t
        if kind == "call":  # entered at t and returned dur_s later, in one line (EVENT_KINDS)
            fid = ev.get("facts")
            self._enter(ev, t, self._facts.get(fid, _NO_FACTS) if type(fid) is int else _NO_FACTS)
            self._exit(ev)
            dur = ev.get("dur_s")
            if t is not None and type(dur) is float:
                self.last_event_at = t + dur
            return True
        if kind == "enter":
            fid = ev.get("facts")
            if fid is None:  # an older probe's line, with the facts in it
                facts = _call_facts(ev)
            else:
                facts = self._facts.get(fid, _NO_FACTS) if type(fid) is int else _NO_FACTS
            self._enter(ev, t, facts)
            return False
        if kind == "exit":
            self._exit(ev)
            return True
        if kind == "path":
            read = read_path(ev)
            if read is not None:
                keep_facts(self._paths, read[0], read[2])
            return False
        if kind == "facts":
            fid = ev.get("facts")
            if type(fid) is int:
                facts = _call_facts(ev)
                pg, ranks = facts[1], facts[2]
                same = self._members_of.get(pg)
                if same is not None and ranks == same:
                    facts = (*facts[:2], same, *facts[3:])
                elif isinstance(ranks, list):
                    self._members_of[pg] = ranks
                keep_facts(self._facts, fid, facts)
            return False
        if kind == "heartbeat":
            where = ev.get("at")
            if isinstance(where, list) and len(where) >= 2:
                site = _site(where[0], as_int(where[1]))
                if site is not None:
                    self.at, self.at_file = site, where[0]
            cpu = as_float(ev.get("cpu"))
            if cpu is not None and t is not None:
                if self.cpu_at is not None and t > self.cpu_at[0]:
                    self.cpu_share = max(0.0, cpu - self.cpu_at[1]) / (t - self.cpu_at[0])
                self.cpu_at = (t, cpu)
            active = ev.get("fr_active")
            self.fr_active = active if isinstance(active, list) else None
            fr = ev.get("fr")
            if not isinstance(fr, dict) or not all(_pair(v) for v in fr.values()):
                return False
            before, self.fr = self.fr or {}, fr
            return any(c > before.get(pg, [0, -1])[1] for pg, (_, c) in fr.items())
        if kind == "done":  # async calls the backend completed: {"ids": [...], "failed": [...]}
            ids, failed = ev.get("ids"), ev.get("failed")
            failed = {x for x in failed if type(x) is int} if isinstance(failed, list) else set()
            for cid in ids if isinstance(ids, list) else ():
                if type(cid) is not int:
                    continue
                call = self.issued.pop(cid, None)
                if cid == self._last_id and (call is not None or self.last_state == "issued"):
                    self.last_state = call_state(completed=True, ok=cid not in failed)
                if call is None:
                    self._completed[cid] = cid not in failed  # its exit line is still to come
                elif cid not in failed:  # not failed (a group aborted under it)
                    self.last_done = f"{call[0]} (group {call[1]} #{call[2]})"
                    self.done += 1
            if len(self._completed) > 1024:
                self._completed.clear()
            return True
        if kind == "step":
            self.step, self.step_t = as_int(ev.get("step")), as_float(ev.get("t"))
            return True
        if kind == "start":
            env = ev.get("env") if isinstance(ev.get("env"), dict) else {}
            self.pid, self.host, self.started_at = as_int(ev.get("pid")), as_str(ev.get("host")), t
            self.local_rank = as_int(env.get("LOCAL_RANK"))
            self.group_rank = as_int(env.get("GROUP_RANK"))
            self.world_size = as_int(env.get("WORLD_SIZE"))
            self.node, self.slurm_job = (
                as_str(env.get("SLURMD_NODENAME")),
                as_str(env.get("SLURM_JOB_ID")),
            )
            tid = ev.get("main_tid")
            self.main_thread = f"0x{tid:016x}" if type(tid) is int and tid >= 0 else None
            return True
        if kind == "cell":
            self.cell = (as_int(ev.get("cell")), as_int(ev.get("run")))
            self.cell_ended = ev.get("phase") == "end"
            self.cell_threads = as_int(ev.get("threads")) if self.cell_ended else None
            self.cell_at = t
            self.cell_raised = self.cell_ended and ev.get("ok") is False
            raised = self.cell_raised or None
            self.cell_error = raised and as_str(ev.get("error"))
            self.cell_error_site = raised and as_str(ev.get("site"))
            return False
        if kind == "exception":
            self.exception = f"{as_str(ev.get('type'))}: {as_str(ev.get('message'))}"
            return False
        if kind == "end":
            self.ended, self.ended_at, self.exit_code = True, t, as_int(ev.get("code"))
            self.end_reason = as_str(ev.get("reason"))
            self.end_how = as_str(ev.get("how"))
            self.in_collective_since = None
            fr = ev.get("fr")
            if isinstance(fr, dict) and all(_pair(v) for v in fr.values()):
                self.fr, self.fr_final = fr, True
            self.unfinished = self.uncompleted()
            if self.last_done in self.unfinished:
                self.last_done = None
            last = f"{self.op} (group {self.pg} #{self.seq})"
            if self.last_state == "completed" and last in self.unfinished:
                self.last_state = call_state(completed=False)
            self.issued.clear()
            self.fr_active = None
            return True
        return False

    def _enter(self, ev: dict[str, Any], t: float | None, facts: tuple[Any, ...]) -> None:
        """A call entered: ``ev`` its line (id, seq, tid), ``facts`` as :func:`_call_facts`."""
        op, pg, ranks, peer, shapes, dtypes, async_op, site, path = facts
        seq = ev.get("seq")
        self.op, self.pg, self.peer, self.site = op, pg, peer, site
        self.path = None if path is None else self._paths.get(path)
        self.seq = seq = seq if type(seq) is int else as_int(seq)
        self.in_collective_since = None if async_op else t
        self.last_state = call_state(completed=False)
        self._last_id = ev.get("id") if type(ev.get("id")) is int else None
        if op in P2P_OPS:
            self._count_p2p()
        elif pg is not None and seq is not None:
            self.issued_seqs[pg] = seq
            # the members come with every call (the same list while its facts are): checked
            # only when they change
            known = self.members.get(pg)
            if (
                ranks is not known
                and isinstance(ranks, list)
                and ranks != known
                and all(type(r) is int for r in ranks)
            ):
                self.members[pg] = ranks
            self.numbered.pop((pg, seq - RECENT_CALLS), None)
            if op not in MANAGEMENT_OPS:
                n = self.collectives[pg] = self.collectives.get(pg, 0) + 1
                self.numbered[(pg, seq)] = n
                self.recent[(pg, n)] = (op, shapes, dtypes, peer)
                self.recent.pop((pg, n - RECENT_CALLS), None)
        tid = ev.get("tid")
        if self.call_thread is None:
            self.call_thread = tid
        elif tid != self.call_thread:
            self.threads = True
        if async_op is True:
            cid = as_int(ev.get("id"))
            if cid is not None:
                self._async[cid] = [op, pg, seq, site, t]

    def _exit(self, ev: dict[str, Any]) -> None:
        """A call returned (its exit line, or its call line after :meth:`_enter`)."""
        self.in_collective_since = None
        call = cid = None
        if self._async:  # an async call entered, not returned from yet
            cid = as_int(ev.get("id"))
            call = self._async.pop(cid, None) if cid is not None else None
        ok = ev.get("ok") is not False
        if cid is None or cid == self._last_id:
            if not ok:
                self.last_state = call_state(completed=True, ok=False)
            elif call is None:  # a blocking call returned
                self.last_state = call_state(completed=True)
            elif self._completed.get(cid) is not None:  # its done event came first
                self.last_state = call_state(completed=True, ok=self._completed[cid])
        if call is not None and ok:
            # It returned its Work: in flight until its done event (which may come first).
            completed = self._completed.pop(cid, None)
            if completed is None:
                self.issued[cid] = call
            elif completed and call[0] not in MANAGEMENT_OPS:
                self.done += 1
                self.last_done = f"{call[0]} (group {call[1]} #{call[2]})"
        elif ok and self.op not in MANAGEMENT_OPS:
            self.done += 1
            if self.op is not None:
                self.last_done = f"{self.op} (group {self.pg} #{self.seq})"

    def uncompleted(self) -> list[str]:
        """``all_reduce (group 0 #5)`` for each call returned from that the backend has not
        completed: its followed Works, and the recorder's uncompleted entries at its last read."""
        calls = [(c[0], c[1], c[2]) for c in self.issued.values()]
        calls += [
            (e[2], e[0], e[1])
            for e in self.fr_active or ()
            if isinstance(e, list) and len(e) >= 3 and (e[2], e[0], e[1]) not in calls
        ]
        return [f"{op} (group {pg} #{seq})" for op, pg, seq in calls]

    def _count_p2p(self) -> None:
        if self.peer is None or self.op not in ("send", "isend", "recv", "irecv"):
            self.p2p_known = False
            return
        counts = self.sent if self.op in ("send", "isend") else self.received
        counts[self.peer] = counts.get(self.peer, 0) + 1

    def summary(self) -> dict[str, Any]:
        """What ``run.json`` keeps of it: who it was and how it ended."""
        keys = ("pid", "host", "local_rank", "group_rank", "started_at", "exit_code", "ended_at")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


#: The facts of a call whose facts line is unknown (or names none that can be read).
_NO_FACTS: tuple[Any, ...] = (None,) * 9


def _call_facts(ev: dict[str, Any]) -> tuple[Any, ...]:
    """What :meth:`RankRecord._enter` takes of a call's facts, from its facts line (or an older
    probe's enter line): op, pg, pg_ranks (a list, unchecked), peer (an int), shapes, dtypes,
    async_op, site (``train.py:14``), path (the id of its path line)."""
    op, pg, peer, path = ev.get("op"), ev.get("pg"), ev.get("peer"), ev.get("path")
    return (
        op if type(op) is str else as_str(op),
        pg if type(pg) is str else as_str(pg),
        ev.get("pg_ranks"),
        None if peer is None else as_int(peer),
        ev.get("shapes"),
        ev.get("dtypes"),
        ev.get("async_op"),
        _site(ev.get("file"), as_int(ev.get("line"))),
        path if valid_id(path) else None,
    )


def _site(file: Any, line: int | None) -> str | None:
    """``train.py:14``, or None where the file or the line is missing or malformed."""
    ok = isinstance(file, str) and file and line is not None
    return _site_text(file, line) if ok else None


@functools.lru_cache(maxsize=4096)
def _site_text(file: str, line: int) -> str:
    # A rank's calls come from a few lines: the live tracker folds 20 000 enter events a second
    # at 1024 ranks, and a Path per event was half the cost of folding one.
    return f"{Path(file).name}:{line}"


def rank_summaries(run: RunDir) -> dict[int, dict[str, Any]]:
    """What ``run.json`` keeps of every rank (:meth:`RankRecord.summary`)."""
    return {rank: record.summary() for rank, record in rank_records(run).items()}


def _pair(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(type(x) is int for x in value)


def rank_records(run: RunDir) -> dict[int, RankRecord]:
    """Every rank's record, from its whole ``events.jsonl`` (and its ring, where
    :func:`ring_may_add`: :func:`whole_record`)."""
    table: dict[int, RankRecord] = {}
    for rank in run.rank_ids():
        record = whole_record(run, rank)
        if record is not None:
            table[rank] = record
    return table


def ring_may_add(record: RankRecord) -> bool:
    """Whether a rank's ring may hold calls its events file does not: it left no end event
    (killed, aborted), or a signal ended it (the probe writes its end at the signal, and the
    main thread may finish a call before the process dies)."""
    return not record.ended or (record.exit_code is not None and record.exit_code < 0)


def whole_record(run: RunDir, rank: int) -> RankRecord | None:
    """A rank's record from its whole ``events.jsonl`` and, where :func:`ring_may_add`, the
    calls its last process's ring file holds that the events file does not (the probe writes
    the file in batches; the ring at every call): what a dead rank completed is counted as the
    ranks table counts it. None for a rank with no events."""
    record = RankRecord(rank=rank)
    entered: set[int] = set()
    exited: set[int] = set()
    seen = False
    for ev in EventTail(run.events(rank)).read():
        record.apply(ev)
        seen = True
        kind, cid = ev.get("ev"), ev.get("id")
        if kind == "start":  # a new process: its calls are numbered from 1 again
            entered.clear()
            exited.clear()
        elif type(cid) is int:
            if kind in ("enter", "call"):
                entered.add(cid)
            if kind in ("exit", "call"):
                exited.add(cid)
    if not seen:
        return None
    if ring_may_add(record) and record.pid is not None:
        lines = ring_lines(
            run.ring(rank, record.pid), entered=entered, exited=exited, step_t=record.step_t
        )
        for ev in lines:
            record.apply(ev)
    return record


#: A cell's end that raised, in the events table's ``message``: ``end: <cell 7>:3: ValueError:
#: bad batch`` (its site, then its error; either may be missing).
_CELL_RAISED = re.compile(r"end(?:: (?P<site><cell \d+>:\d+))?(?:: (?P<error>.*))?", re.S)


def cell_message(ev: dict[str, Any]) -> str | None:
    """A ``cell`` event as the events table's ``message``: its phase, and for an end that
    raised, where and what (:data:`_CELL_RAISED`)."""
    phase = as_str(ev.get("phase"))
    if phase != "end" or ev.get("ok") is not False:
        return phase
    said = [s for s in (as_str(ev.get("site")), as_str(ev.get("error"))) if s]
    return ": ".join(["end", *said])


def cell_fields(message: str | None) -> dict[str, Any]:
    """The ``phase``, ``site`` and ``error`` of a cell event's ``message`` (:func:`cell_message`)."""
    m = _CELL_RAISED.fullmatch(message or "")
    if m is None:
        return {"phase": message}
    return {"phase": "end", "site": m["site"], "error": m["error"]}


def ring_step(data: bytes, step_t: float | None) -> dict[str, Any] | None:
    """The ``step`` line of the last step a ring's header holds (``data``: the file's bytes,
    header checked), where it is later than ``step_t`` (the last step line the events file
    has: its own ``t``); None where it is not, or the rank marked no step."""
    step, t = RING_STEP.unpack_from(data, RING_STEP_AT)
    if not t > 0.0 or (step_t is not None and t <= step_t):
        return None
    return {"ev": "step", "step": step, "t": t}


def ring_lines(
    path: Path, *, entered: set[int], exited: set[int], step_t: float | None = None
) -> list[dict[str, Any]]:
    """The calls a ring file holds, as the probe's ``enter`` and ``exit`` lines, but for those
    ``entered`` and ``exited`` say the events file has, and its last step (:func:`ring_step`);
    none for a file that is missing or not a ring of this version (the collectors report
    those)."""
    try:
        data = path.read_bytes()
    except OSError:
        return []
    if len(data) < RING_HEADER.size or data[:8] != RING_MAGIC:
        return []
    _, version, slot_size, nslots, *_ = RING_HEADER.unpack_from(data)
    if version != RING_VERSION or slot_size != RING_SLOT.size:
        return []
    whole = min(nslots, (len(data) - RING_HEADER.size) // RING_SLOT.size)
    slots = sorted(
        slot
        for slot in (
            RING_SLOT.unpack_from(data, RING_HEADER.size + i * RING_SLOT.size) for i in range(whole)
        )
        if slot[0]
    )
    out: list[dict[str, Any]] = []
    for cid, seq, t, t_end, fid, state, tid in slots:
        if cid not in entered:
            out.append({"ev": "enter", "id": cid, "seq": seq, "tid": tid, "facts": fid, "t": t})
        if state != 0 and cid not in exited:
            out.append({"ev": "exit", "id": cid, "seq": seq, "ok": state == 1, "t": t_end})
    step = ring_step(data, step_t)
    return [*out, step] if step is not None else out
