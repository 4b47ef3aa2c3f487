"""The probe that runs inside every rank.

It imports only the standard library and torch. A recorded call costs the rank about a
microsecond: its record is the call's id, sequence number and two times, and one reference to
its "facts" (op, group, peer, tensor shapes and dtypes, call site), which a call site keeps and
reuses while they repeat. That microsecond is paid right after a collective returns, when the
rank's caches are cold: a step that takes 0.1 us in a warm loop takes several times that there,
and on a busy machine a rank's delay delays its peers. So the hot path is C (``_fast.c``, built
at install where a C compiler exists): one-tensor calls (all_reduce, broadcast, send, ...) are
read where their arguments lie and recorded as plain C structs, with no Python object made: a
tensor's sizes and dtype are read from the tensor (``_meta.cpp``, built against the installed
torch) and compared with the call site's last ones, where torch's getters would make a torch.Size
at every call; other calls go to ``Probe._enter``, whose ``_Call`` becomes the same kind of
record. Without the C the same steps run in Python (``_twins``: each C function's twin, in a
table), a few microseconds more a call; the rank's log says so once, and why.

The probe's daemon thread wakes every ``HEARTBEAT_S`` to write a heartbeat and turn the
records into JSON lines appended to an ``O_APPEND`` descriptor (``State.write``, in C where
built), and between heartbeats it looks, every ``POLL_S``, for a capture request and for a call
still in flight since its last look. Every wake-up costs the loop: what the thread does with
the GIL held delays the main thread when its collective returns, and with it every rank waiting
on it; on a small machine the thread also takes a core from a rank. So the looks are skipped
while the rank completes calls (its calls are progress the watchdog sees, and a stall is
exactly when they stop): a busy rank's thread wakes twice a second, one that waits or idles
ten times. Completed calls are formatted in batches into a buffer the State keeps (a fresh one
would fault its pages in at every flush): times are written to the microsecond with integer
arithmetic, not ``repr``, and the ``write`` runs with the GIL released. A flush costs about a
tenth of a microsecond of the thread's time per call. A call names its facts by id (their ``facts``
line, below), and one that returned before the flush is one ``call`` line (its enter time and
duration); every flush writes the ``enter`` line of the call in flight, whose ``exit`` line a
later flush writes (``rankscope.rundir.EVENT_KINDS``). Between heartbeats a call in flight for
half a look gets its line at once (a call entered after a quiet while is looked at again at that
age), so a blocked rank is visible within about ``POLL_S``. Capture, exception and exit flush the
queue first.

A collective is in flight until the backend completes it, not until the call returns. An
async call's Work (``async_op=True``, isend, ...) is handed by the wrapper to the State (in C,
as C numbers and the Work's reference); the thread takes them at every wake-up, follows each
with ``is_completed()`` and writes one ``done`` event a look with the ids completed. A Work its
caller waited on and the backend completed is let go at once by ``Work.wait`` as the probe
installs it (``_fast.c``'s ``WaitHook``, :func:`~rankscope.probe._twins.waited_hook` without
the C), and counted done at the next look. What no Python call returns (nccl's blocking calls,
the collectives torch issues from C++) is read from the flight recorder: the per-group counters
at every heartbeat, and the uncompleted entries (``fr_active``) while something stays
uncompleted from one heartbeat to the next (see ``Probe._fr_active``).

Evidence survives any death. Every call is also written, as it is entered and as it returns, into
a ring of fixed-size slots in a file the probe maps shared (``calls-<pid>.ring``, layout in
:mod:`rankscope.rundir`): a store into that memory is in the kernel's page cache at once, so the
file keeps it however the process ends (SIGKILL, an abort in a C++ thread, a segfault a
microsecond later). A slot holds numbers only: ids, times, the thread and the id of the call's
facts, whose ``facts`` line is written to ``events.jsonl`` (one ``write``) before the first call
that has them proceeds. The facts hold the id of the call's path (``Probe._path_id``: its
frames from the outermost, without ``rankscope.rundir.MACHINERY``'s), whose ``path`` line is
written once, before them; the C wrapper compares the raw frames (code object and instruction
of each) with the ones a path was last seen with, and asks for it only when they change. The
thread's batches stay the history; the ring is the last calls,
whatever happened to the batches. A SIGTERM (torchrun tearing the job down because another rank
failed, or a stop) is a capture: stacks of all threads and the flight recorder are written, then
the process dies of the signal as it would have; a thread that waits in ``os.read`` on Python's
signal wake-up pipe does it while the main thread is blocked in a C++ collective. Fatal signals
(abort, segfault, bus error, illegal instruction) leave faulthandler's dump of every thread in
``stacks.txt``.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import datetime
import faulthandler
import functools
import inspect
import json
import os
import pickle
import runpy
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from rankscope.probe import _values
from rankscope.probe._twins import (
    C_OFF,
    _Call,
    _call_line,
    _Counter,
    _enter_line,
    _exit_line,
    _facts_line,
    _fast,
    _line,
    _Lines,
    _path_line,
    _python_wrapper,
    _Ring,
    _Spec,
    _State,
    waited_hook,
)
from rankscope.rundir import (
    DIST_ENV,
    ENV_RUN_DIR,
    FACTS_KEPT,
    P2P_OPS,
    PATH_DEPTH,
    RunDir,
    atomic_write_bytes,
    is_machinery,
)


def _meta_reader() -> Any:
    """``_meta.cpp``'s reader of a tensor's sizes and dtype, for the C wrapper: None where it was
    not built, was built for another torch than this one (it reads torch's own structs), or
    fills another layout of ``_tensor_meta.h`` than the wrapper's (built from other sources)."""
    if _fast is None:
        return None
    try:
        from rankscope.probe import _meta
    except ImportError:
        return None
    if _meta.torch_build != f"{torch.__version__} {torch.version.git_version}":  # see setup.py
        return None
    if getattr(_meta, "layout", None) != _fast.TENSOR_META:
        return None
    return _meta.read


#: Where it is None, the C wrapper asks torch's ``.shape`` and ``.dtype`` getters at every call.
_META = _meta_reader()

HEARTBEAT_S = 0.5  # heartbeat and flush; the only wake-up while the rank completes calls
POLL_S = 0.1  # looks for a capture request or a blocked call, while the rank completes none
FAILED_VALUES = 8  # lines of values a process writes where its calls raised (_call_failed)
DEFAULT_FR_BUFFER = "2000"

#: Public torch.distributed calls that the probe records. ``peer`` names the argument that holds
#: the other side of a point-to-point call or the root of a rooted collective.
COLLECTIVES: dict[str, str | None] = {
    "all_reduce": None,
    "all_reduce_coalesced": None,
    "all_gather": None,
    "all_gather_coalesced": None,
    "all_gather_into_tensor": None,
    "all_gather_single": None,  # FSDP2's all-gather (torch 2.13)
    "all_gather_object": None,
    "all_to_all": None,
    "all_to_all_single": None,
    "barrier": None,
    "monitored_barrier": None,
    "broadcast": "src",
    "broadcast_object_list": "src",
    "reduce": "dst",
    "reduce_scatter": None,
    "reduce_scatter_single": None,  # FSDP2's reduce-scatter (torch 2.13)
    "reduce_scatter_tensor": None,
    "gather": "dst",
    "gather_object": "dst",
    "scatter": "src",
    "scatter_object_list": "src",
    "send": "dst",
    "recv": "src",
    "isend": "dst",
    "irecv": "src",
    "send_object_list": "dst",
    "recv_object_list": "src",
    "batch_isend_irecv": None,
    "new_group": None,
    "new_subgroups": None,
    "new_subgroups_by_enumeration": None,
    "init_process_group": None,
    "destroy_process_group": None,
}

#: Environment variables recorded in the start event (plus every TORCH*/NCCL_*/RANKSCOPE_* one).
ENV_CONTRACT = (
    *DIST_ENV,
    "OMP_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    # where it runs under SLURM: the watchdog and captures reach it through srun there
    "SLURM_JOB_ID",
    "SLURMD_NODENAME",
    "SLURM_NODEID",
)
ENV_PREFIXES = ("TORCH", "NCCL_", "RANKSCOPE_", "GLOO_")

# Frames in these files are not a call site: torch itself, the probe's wrappers, runpy.
_INTERNAL_DIRS = (
    str(Path(torch.__file__).parent),
    str(Path(__file__).resolve().parent),
    str(Path(functools.__file__).parent / "contextlib.py"),
    "<frozen ",
)

_probe: Probe | None = None


#: (is the NCCL recorder, dump function) for the recorders this torch build has.
_DUMPS = [
    (nccl, fn)
    for nccl, name in ((False, "_dump_fr_trace"), (True, "_dump_nccl_trace"))
    if (fn := getattr(torch._C._distributed_c10d, name, None)) is not None
]


class _Leaving(NamedTuple):
    """How a rank is ending, said before its end runs (:meth:`Probe.leaving`)."""

    how: str
    thread: int
    stack: list[list[Any]]
    frame: Any
    exc: BaseException | None


class Probe:
    """Records one rank's collectives, heartbeats and evidence into ``<run>/ranks/<rank>/``."""

    def __init__(self, run: RunDir, rank: int):
        self.run = run
        self.rank = rank
        self.dir = run.rank_dir(rank)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(run.events(rank), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._stacks = open(run.stacks(rank), "a")  # noqa: SIM115  (faulthandler keeps the fd)
        self._ring = _Ring(run.ring(rank, os.getpid()), rank)
        self._local = threading.local()
        self._write_lock = threading.Lock()
        self._drop_lock = threading.Lock()
        # Writes to events.jsonl that failed and were dropped: (since, how many, why); see
        # _write_failed.
        self._dropped: tuple[float, int, str] | None = None
        self._said: set[str] = set()  # see _say_once
        self._unwritten: list[str] = []  # facts and path lines a failed write kept back
        if self._ring.error is not None:
            self._say_once(
                f"no ring file ({self._ring.error.strerror or self._ring.error}): its calls are "
                "kept in memory only, and a kill loses those not yet in events.jsonl"
            )
        self._capture_lock = threading.Lock()
        self._end_lock = threading.RLock()  # a second end() waits for the first to finish
        self._entered: set[int] = set()  # calls whose enter line is written, exit not yet
        # Calls that returned a Work (async_op=True, isend, ...) the backend has not completed:
        # the thread looks at them at every wake-up (see _take_returned, _look_works).
        self._works: dict[int, Any] = {}  # call id -> its Work, or a tuple of its Works
        # async calls done at the next look: they returned no Work, or their caller waited on
        # it and the backend completed it
        self._no_work: list[int] = []
        self._fr_seen: tuple[Any, Any] = (None, None)  # (what was uncompleted, its entries)
        # JSON fragments of exit lines, by (op, pg).
        self._static: dict[Any, str] = {}
        self._enter_line = functools.partial(_enter_line, rank)
        self._exit_line = functools.partial(_exit_line, self._static, rank)
        lines = _Lines(
            entered=self._entered,
            statics=self._static,
            enter_line=self._enter_line,
            call_line=functools.partial(_call_line, rank),
            exit_line=self._exit_line,
            event_line=_line,
            rank=rank,
            in_flight=self._in_flight_line,
        )
        self._state = (
            _fast.State(_Call, self._ring.map, lines)
            if _fast is not None
            else _State(self._ring, lines)
        )
        self._facts: dict[Any, int] = {}  # facts id by the facts' value, see _facts_id
        self._fids = _Counter(1)
        self._fids_kept = 0  # ids issued since the probe last forgot them
        # Call paths: their id by their frames, and by the raw frames (code, instruction) that
        # gave them; forgotten with the facts (see _path_id).
        self._paths: dict[tuple[Any, ...], int] = {}
        self._path_keys: dict[tuple[int, ...], tuple[int, list[Any]]] = {}
        self._pids = _Counter(1)
        self._machinery: dict[Any, bool] = {}  # code object -> its file is MACHINERY's
        self._stop = threading.Event()
        self._ids = _Counter(1)  # call ids; per-group sequence numbers in _seqs
        self._step: int | None = None
        self._seqs: dict[str | None, Iterator[int]] = {}
        self._pg_cache: dict[Any, tuple[str | None, str | None, list[int] | None]] = {}
        self._sites: dict[tuple[Any, int], tuple[str | None, int | None, str | None]] = {}
        self._internal: dict[Any, bool] = {}  # code object -> in torch or rankscope
        self._served_capture = _pending_capture_id(run)  # requests older than this rank
        self._request_path = str(run.capture_request)  # stat()ed at every look
        self._request_stamp: tuple[int, int] | None = None
        self._originals: list[tuple[Any, str, Any]] = []
        self._ended = False
        self._ending: int | None = None  # the thread inside end(), until it is done
        self._leaving: _Leaving | None = None  # how the rank is ending, before end() runs
        self._told: BaseException | None = None  # the exception on_exception last wrote
        self._pid = os.getpid()  # a forked child (a DataLoader worker) is not the rank
        self._thread = threading.Thread(target=self._loop, name="rankscope-probe", daemon=True)
        self._symbolized = False  # a dump with stack traces was written (capture)
        self._failed_values = 0  # lines of values written where a call raised (_call_failed)

    # --- writing ----------------------------------------------------------------------------
    def emit(self, ev: str, **fields: Any) -> None:
        """Queue an event; it is written at the next flush (at most ``HEARTBEAT_S`` later).
        Its time is now, or ``t`` where given (a time the ring holds too: :meth:`step`)."""
        fields["ev"] = ev
        fields.setdefault("t", time.time())
        fields["rank"] = self.rank
        self._state.append((fields,))

    def flush(self) -> None:
        """Write everything queued, and the enter line of a call that is still in flight."""
        with self._write_lock:
            try:
                self._resume_writing()
                self._state.write(self._fd)
            except OSError as exc:
                self._write_failed(exc)

    def _write_line(self, line: str) -> bool:
        """Write one line at once (a facts or a path line); False where it was dropped."""
        try:
            self._resume_writing()
            data = memoryview(line.encode())
            while data:
                data = data[os.write(self._fd, data) :]
        except OSError as exc:
            # Kept back, written first when it can write again: the ring names its facts.
            if not self._write_failed(exc, keep=line):
                self._forget_facts()  # too many kept back: the calls after name new facts
            return False
        return True

    def _say_once(self, text: str) -> None:
        """Say on the rank's stderr what the probe could not do, once for each thing."""
        if text not in self._said:
            self._said.add(text)
            self._tell(text)

    def _tell(self, text: str) -> None:
        """A line on the rank's stderr, which may be a file on the disk that is full: what
        cannot be written now stays in its buffer, and the rank is never stopped by it."""
        with contextlib.suppress(OSError, ValueError):
            print(f"rankscope: rank {self.rank}: {text}", file=sys.stderr, flush=True)

    def _write_failed(self, exc: OSError, *, keep: str | None = None) -> bool:
        """A write to ``events.jsonl`` failed (the disk is full, the file system went away):
        the rank goes on, what that write held is dropped (but facts and path lines, which
        wait: calls in the ring and after name them), and the probe says so once here and in
        a ``dropped`` line when it can write again. ``keep``: a line to write then; False
        where there were too many to keep."""
        with self._drop_lock:
            if self._dropped is None:
                self._dropped = (time.time(), 0, f"{exc.strerror or exc}")
                # Once per outage: the line that ends it says how much was lost.
                self._tell(
                    f"cannot write {self.run.events(self.rank)} ({exc.strerror or exc}); the "
                    "rank goes on, and its probe drops what it cannot write until it can again"
                )
            since, n, error = self._dropped
            self._dropped = (since, n + 1, error)
            if keep is None:
                return True
            if len(self._unwritten) < FACTS_KEPT:
                self._unwritten.append(keep)
                return True
            self._unwritten.clear()
            return False

    def _resume_writing(self) -> None:
        """After dropped writes: end the line a write may have torn, then the ``dropped``
        line saying since when, how many writes and why (raises OSError while it cannot)."""
        if self._dropped is None:
            return
        with self._drop_lock:
            if self._dropped is None:
                return
            since, n, error = self._dropped
            fields = {"since": since, "writes": n, "error": error, "ev": "dropped"}
            fields.update(t=time.time(), rank=self.rank)
            data = memoryview("".join(["\n", *self._unwritten, _line(fields)]).encode())
            while data:
                data = data[os.write(self._fd, data) :]
            self._dropped = None
            self._unwritten.clear()
        # Whole on its own: the line that said it could not write may have been lost with it
        # (stderr is often a file on the same disk).
        self._tell(
            f"writes its record again after {time.time() - since:.1f} s in which it could not "
            f"({error}); {n} write(s) dropped"
        )

    def _forget_facts(self) -> None:
        """Forget every facts and path id: the C wrappers' call sites ask anew
        (``facts_epoch``), and new lines are written for them."""
        self._facts.clear()
        self._static.clear()
        self._paths.clear()
        self._path_keys.clear()
        self._state.facts_epoch += 1
        self._fids_kept = 0

    def _in_flight_line(self) -> str | None:
        """The enter line of the call in flight, once (its exit line comes when it ends)."""
        cur = self._state.current
        if cur is None or cur.cid in self._entered:
            return None
        self._entered.add(cur.cid)
        return self._enter_line(cur)

    def _facts_id(self, *facts: Any) -> int:
        """The id of these facts (what repeats from call to call at a call site). New facts get
        the next id and their ``facts`` line is written at once, before the call that has them
        goes on: the ring's slots and the call and enter lines name their facts by this id.
        ``_fast.c`` calls this when a call site's facts change; the Python wrapper at every
        call. ``facts`` are :func:`~rankscope.probe._twins._fragment`'s arguments.

        Shapes that never repeat would grow the cache without end: once ``FACTS_KEPT`` ids are
        issued since it last did, the probe forgets them all, and the C wrappers' call sites
        ask anew (``facts_epoch``), so a call names an id among the latest its process issued
        (a reader keeps as many: ``rankscope.rundir.FACTS_KEPT``)."""
        op, pg, pg_desc, pg_ranks, peer, shapes, dtypes, async_op, site, path = facts
        peer_key = peer if isinstance(peer, (int, str, type(None))) else repr(peer)
        ranks_key = tuple(pg_ranks) if isinstance(pg_ranks, list) else pg_ranks
        key: Any = (op, pg, pg_desc, ranks_key, peer_key, shapes, dtypes, async_op, site, path)
        try:
            fid = self._facts.get(key)
        except TypeError:  # an unhashable part: new facts every time
            fid, key = None, None
        if fid is not None:
            return fid
        if self._fids_kept >= FACTS_KEPT:
            self._forget_facts()
        fid = next(self._fids) & 0xFFFFFFFF  # a u32 in the ring
        self._fids_kept += 1
        if key is not None:
            self._facts[key] = fid
        self._write_line(_facts_line(self.rank, fid, facts, time.time()))
        return fid

    # --- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        env = {
            k: v for k, v in os.environ.items() if k in ENV_CONTRACT or k.startswith(ENV_PREFIXES)
        }
        self.emit(
            "start",
            pid=os.getpid(),
            host=socket.gethostname(),
            argv=sys.argv,
            python=sys.version.split()[0],
            torch=torch.__version__,
            main_tid=threading.main_thread().ident,
            env=env,
            works=True,  # async calls stay in flight until a "done" event (_take_returned)
        )
        self.flush()
        if _fast is None:  # said once, in the rank's log: a C path off costs every call
            print(
                "rankscope probe: collectives are recorded by the Python wrapper, not the C one: "
                + (C_OFF or "the C wrapper was turned off in this process"),
                file=sys.stderr,
                flush=True,
            )
        # A fatal signal (abort, segfault, bus error, illegal instruction) leaves every
        # thread's Python stack here; the collectors read it as a capture with that reason.
        faulthandler.enable(file=self._stacks, all_threads=True)
        if signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
            # Fallback for a rank whose probe thread cannot run (the GIL held by a stuck C call):
            # the watchdog writes a marker line and sends SIGUSR1; faulthandler needs no GIL.
            # Ignored first, so that what faulthandler restores as the interpreter finalizes is
            # "ignore", not "die": a capture's signal that reaches a rank in its last moments
            # (its probe has ended and no longer answers) must not kill it. A program it execs
            # gets the default (the handler is reset by exec while faulthandler holds it).
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
            faulthandler.register(signal.SIGUSR1, file=self._stacks, all_threads=True)
        self._catch_teardown()
        self._patch()
        self._thread.start()
        atexit.register(self.end, None, reason="exit")

    def end(
        self,
        code: int | None,
        *,
        reason: str = "exit",
        how: str | None = None,
        stack: list[list[Any]] | None = None,
        frame: Any = None,
        thread: int | None = None,
        dying: bool = False,
    ) -> None:
        """Final dump and end event; runs once (bootstrap, atexit, ``os._exit`` or a teardown
        signal), and a second caller waits until the first is done. ``dying``: the process is
        about to be ended by a signal, not to finalize. Nothing in a forked child of the rank
        (a DataLoader worker exiting, or terminated by its parent).

        ``how`` the rank ended (``returned``, ``sys_exit``, ``exception``, ``os._exit``, a
        signal's name; by default ``reason`` where that says it, None for an exit the probe
        cannot tell apart: atexit without the bootstrap) and ``stack`` where (:func:`tb_stack`,
        :func:`frame_stack`): the end event carries both, and the stack is also written to
        ``stacks.txt`` as the calling thread's, a capture of its own with ``how`` as its
        reason, after the capture of every thread. ``frame``: the innermost frame of that
        stack while it is still alive (a traceback's), whose values the capture reads for the
        thread that left (the condition that decided the exit): ``thread``, by default the
        calling one."""
        if os.getpid() != self._pid:
            return
        if how is None and reason != "exit":
            how = reason
        with self._end_lock:
            if self._ended:
                return
            self._ended = True
            self._ending = threading.get_ident()
            # Evidence first: a rank that fails is often sent SIGTERM by torchrun moments later.
            left = thread or threading.get_ident()
            ending = (how or reason, left, stack) if stack else None
            self.capture(reason=reason, ending=ending, ending_frame=frame)
            self._stop.set()  # no heartbeat after the end event
            if self._thread.is_alive() and self._thread is not threading.current_thread():
                self._thread.join(timeout=2)
            # The recorder's count at the end: every collective this rank will ever have
            # issued on each group (the stall prover's "ended before calling it").
            fr = _fr_progress() if _fr_enabled() and c10d.is_initialized() else None
            self.emit("end", code=code, reason=reason, how=how, stack=stack or None, fr=fr)
            self.flush()
            self._ending = None

    def leaving(
        self,
        how: str,
        stack: list[list[Any]],
        frame: Any,
        exc: BaseException | None = None,
    ) -> None:
        """Say how the rank is ending (as :meth:`end` takes it), before the work its ending
        does: formatting a traceback, writing it to stderr. A teardown signal that lands in
        that window (torchrun's SIGTERM, moments after another rank failed) then ends the rank
        as it was ending, with ``exc``'s event and the values of ``frame``, not as a rank
        stopped in no frame of its own. From the thread that is leaving."""
        self._leaving = _Leaving(how, threading.get_ident(), stack, frame, exc)

    def on_exception(self, exc: BaseException) -> None:
        """The rank's uncaught error as an event, once (the teardown of a rank that was
        ending with it may write it from another thread)."""
        told = {
            "type": type(exc).__name__,
            "message": str(exc),
            "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        }
        with self._end_lock:
            if exc is self._told:
                return
            self.emit("exception", **told)
            self._told = exc
        self.flush()

    def _write_values(
        self, capture_id: int | None, reason: str, where: dict[int, Any] | None = None
    ) -> None:
        """Append one line of values (:func:`_values.capture_line`) in one ``write``, so that
        lines written from two threads never interleave."""
        line = _values.capture_line(capture_id, reason, _values.own_threads(), where).encode()
        fd = os.open(self.run.values(self.rank), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def _call_failed(self) -> None:
        """A collective raised an error in the calling thread: the values its frames read,
        while they are on its stack. The user's code may catch the error and go on (a helper
        that logs and returns), and a capture later, when the hang is proven, would find the
        rank elsewhere, or gone. At most ``FAILED_VALUES`` lines a process (a loop that retries
        a failing call); never an error of its own."""
        if self._failed_values >= FAILED_VALUES or os.getpid() != self._pid:
            return
        self._failed_values += 1
        with contextlib.suppress(Exception):
            self._write_values(None, "call_failed")

    # --- teardown ---------------------------------------------------------------------------
    def _catch_teardown(self) -> None:
        """Make a SIGTERM a capture, from the main thread, where Python lets handlers be set.
        Where SIGTERM is left to its default (it kills the process) the probe's handler
        captures and ends the rank; where the script or its framework handles it (Lightning
        does, before or after the probe), that handler decides what happens and the capture is
        still taken, by the watcher thread below.

        Python runs a signal's handler in the main thread between bytecodes, which a main
        thread blocked in a C++ collective never reaches; but its C-level handler writes the
        signal's number to the wake-up fd at once, and a thread blocked in ``os.read`` on that
        pipe does the capture. Where the script has a wake-up fd of its own (asyncio), that is
        left alone and only the Python handler catches the signal."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, self._on_signal)
        # else a handler set before the probe (a framework's): it decides, and the watcher
        # below still captures at the signal, as where a framework takes SIGTERM over later
        read, write = os.pipe()
        os.set_blocking(write, False)
        try:
            previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        except ValueError:
            previous = -2
        if previous != -1:  # the script's own wake-up fd (or none could be set): keep it
            if previous >= 0:
                signal.set_wakeup_fd(previous)
            os.close(read)
            os.close(write)
            return
        watcher = threading.Thread(
            target=self._watch_signals, args=(read,), name="rankscope-signals", daemon=True
        )
        watcher.start()

    def take_sigterm(self) -> None:
        """Make SIGTERM a capture again over a handler the program set since the probe
        started (an IPython Parallel engine sets one that stops its loop, which the rank would
        end on as an exception: a stop would read as a crash). From the main thread only."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)

    def _watch_signals(self, fd: int) -> None:
        while True:
            try:
                data = os.read(fd, 64)
            except InterruptedError:
                continue
            except OSError:
                return
            if not data:
                return
            if signal.SIGTERM in data:
                if signal.getsignal(signal.SIGTERM) == self._on_signal:  # bound: == not is
                    self._teardown(signal.SIGTERM)
                else:  # the script took SIGTERM over since: its handler decides; keep evidence
                    self.capture(reason="SIGTERM")

    def _on_signal(self, signum: int, frame: Any) -> None:
        if os.getpid() != self._pid:  # a forked child inherited the handler: as without it
            _die_of(signum)
        self._teardown(signum)

    def _teardown(self, signum: int) -> None:
        """Capture and end as the signal's name, then die of the signal (exit code -signum).
        A signal that lands in a thread already inside end() (the rank was exiting anyway) lets
        that end finish: the process is on its way out with its own exit code. One that lands
        while the rank was getting ready to end (:meth:`leaving`) ends it as it was ending."""
        if self._ending == threading.get_ident():
            return
        name, left = signal.Signals(signum).name, self._leaving
        with contextlib.suppress(Exception):
            if left is None:
                self.end(-signum, reason=name, dying=True)
            else:
                if left.exc is not None:
                    self.on_exception(left.exc)
                self.end(
                    -signum,
                    reason=name,
                    how=left.how,
                    stack=left.stack,
                    frame=left.frame,
                    thread=left.thread,
                    dying=True,
                )
        _die_of(signum)

    # --- the daemon thread ------------------------------------------------------------------
    def _loop(self) -> None:
        next_beat = 0.0
        seen: int | None = None  # the call in flight at the previous look
        done = -1  # calls completed at the previous look
        fr_on = _fr_enabled()
        main_clock = _main_clock()  # looked up once: every heartbeat reads it
        while not self._stop.is_set():
            now = time.monotonic()
            beat = now >= next_beat
            if self._state.returned or self._works:
                self._look_works()
            if beat:
                cur = self._state.current
                fr = _fr_progress() if fr_on and c10d.is_initialized() else None
                self.emit(
                    "heartbeat",
                    done=self._state.done,
                    step=self._step,
                    coll=cur.cid if cur else None,
                    op=cur.op if cur else None,
                    fr=fr,
                    fr_active=self._fr_active(fr),
                    cpu=_main_cpu(main_clock),
                    at=self._main_at(),
                )
                next_beat = now + HEARTBEAT_S
            with contextlib.suppress(Exception):
                self._poll_request()
            cur = self._state.current
            cid = cur.cid if cur is not None else None
            # A call still in flight at two looks, or entered a while before this one, is
            # written now: a rank that waits in it is seen waiting within about POLL_S.
            stuck = (
                cur is not None
                and cur.cid not in self._entered
                and (cur.cid == seen or time.time() - cur.t >= POLL_S / 2)
            )
            seen = cid
            if stuck or beat:
                self.flush()
            # Busy: calls completed since the last look, the last a moment ago. A rank whose
            # last call completed long before (its step, then a call that blocks) is looked at
            # again soon, not at its next heartbeat.
            state = self._state
            busy = state.done != done and time.time() - state.t_done < POLL_S
            done = state.done
            wait = max(next_beat - now, 0.0) if busy else POLL_S
            if not busy and cur is not None and not stuck and cur.cid not in self._entered:
                # A call entered a moment ago, after a while without one (the step's work,
                # then a call that may block): looked at again once it is half a look old.
                wait = min(wait, max(0.0, POLL_S / 2 - (time.time() - cur.t)) + 0.002)
            self._stop.wait(wait)

    def _take_returned(self) -> None:
        """Follow the async calls the wrappers handed the State since the last look
        (``take_returned``): each (call id, what it returned, async_op), or the call id alone
        once its caller waited on its Work and the backend completed it (``waited_hook``). A
        call that returned a Work, or a list of them (``batch_isend_irecv``), stays in flight
        until the backend completes them; an async call that returned no Work (a rank outside
        the group) is done at once.

        The C wrappers keep these as C numbers and the thread makes the Python objects here:
        making them in the wrapper, or calling a Python method for each async call, measured a
        few per cent on a gloo loop of ``all_reduce(async_op=True).wait()``."""
        works = self._works
        for entry in self._state.take_returned():
            if type(entry) is int:  # waited on and completed: let go at its wait
                self._no_work.append(entry)
                continue
            cid, result, async_op = entry
            if isinstance(result, _WORK):  # the usual: one Work, kept as it is
                works[cid] = result
            elif type(result) is list and result and all(isinstance(w, _WORK) for w in result):
                works[cid] = tuple(result)
            elif async_op:
                self._no_work.append(cid)

    def _look_works(self) -> None:
        """The thread's look at the async calls: one ``done`` event for those the backend has
        completed since the last look, their ids and those that failed (one line a look, not
        one a call). ``is_completed()`` costs about 0.15 us (gloo: a flag under a mutex; nccl:
        a CUDA event query). Only this thread touches ``_works``.

        A loop of ``all_reduce(async_op=True).wait()`` makes a call in about 300 us on 2
        cores, and each microsecond here is 0.3 % of it: a single Work is kept as it is and
        looked at without a generator, and the dict is rebuilt rather than deleted from (about
        0.7 us a Work, against 3 us before). Freeing the Works the look lets go costs about
        2 us each more (a Work freed long after its call is no longer in the cache)."""
        self._take_returned()
        done: list[int] = []
        failed: list[int] = []
        pending: dict[int, Any] = {}
        for cid, work in self._works.items():
            try:
                if type(work) is tuple:
                    if not all(w.is_completed() for w in work):
                        pending[cid] = work
                        continue
                    bad = any(w.exception() is not None for w in work)
                elif not work.is_completed():
                    pending[cid] = work
                    continue
                else:
                    bad = work.exception() is not None
            except Exception:  # a Work torn down with its group: completed, not by us
                bad = True
            if bad:
                failed.append(cid)
            done.append(cid)
        self._works = pending
        done += self._no_work
        self._no_work.clear()
        if done:
            self.emit("done", ids=done, failed=failed)

    def _fr_active(self, fr: dict[str, list[int]] | None) -> list[list[Any]] | None:
        """The flight recorder's entries not yet completed, while something stays uncompleted
        from one heartbeat to the next: a group whose last completed collective is behind its
        last enqueued one (collectives torch issued from C++ included), or a followed Work.

        On nccl the read (``onlyActive``, no stack traces) holds only the uncompleted entries
        and is repeated at every such heartbeat, for their state (scheduled, started). gloo
        counts every entry as active (a read of 500 entries measured 15 ms on 2 cores) and
        never changes their state, so there it is read once per uncompleted set."""
        oldest = min(self._works, default=None)
        key = (
            tuple(sorted((pg, c) for pg, (e, c) in (fr or {}).items() if e > c)),
            oldest,
        )
        last_key, last = self._fr_seen
        if key == ((), None):
            self._fr_seen = (key, None)
            return None
        if key != last_key:  # newly uncompleted: read at the next heartbeat if it stays
            self._fr_seen = (key, None)
            return None
        if last is not None and not _backend_is_nccl():
            return last
        entries = _fr_active_entries()
        self._fr_seen = (key, entries)
        return entries

    def _poll_request(self) -> None:
        # open, not stat: on NFS an open revalidates the file's attributes (close-to-open
        # consistency) where a stat may answer from a cache seconds old.
        try:
            fd = os.open(self._request_path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self._request_stamp:
            return
        self._request_stamp = stamp
        with open(self._request_path) as f:
            req = json.load(f)
        if int(req.get("id", 0)) > self._served_capture:
            self.capture(reason=str(req.get("reason", "request")), capture_id=int(req["id"]))

    # --- evidence ---------------------------------------------------------------------------
    def capture(
        self,
        *,
        reason: str,
        capture_id: int | None = None,
        ending: tuple[str, int, list[list[Any]]] | None = None,
        ending_frame: Any = None,
    ) -> list[str]:
        """Write every thread's Python stack and the flight-recorder dump(s); return the files.
        ``ending``: (how, thread ident, stack) of a rank's end (see :meth:`end`), written after
        the dump of every thread as a capture of that thread alone."""
        files: list[str] = []
        self.flush()
        with self._capture_lock:
            if capture_id is not None:
                self._served_capture = max(self._served_capture, capture_id)
            try:
                self._stacks.write(
                    f"# rankscope capture id={capture_id} t={time.time():.6f} "
                    f"reason={reason} pid={os.getpid()}\n"
                )
                self._stacks.flush()
                faulthandler.dump_traceback(file=self._stacks, all_threads=True)
                if ending is not None:
                    self._stacks.write(_end_capture(*ending))
                self._stacks.flush()
                files.append(self.run.stacks(self.rank).name)
            except (OSError, ValueError):
                pass
            with contextlib.suppress(Exception):  # never let the values cost the stacks
                where = {ending[1]: ending_frame} if ending and ending_frame is not None else None
                self._write_values(capture_id, reason, where)
                files.append(self.run.values(self.rank).name)
            # Stack traces are symbolized only where that costs nothing (below); on nccl the
            # first dump that holds entries with them takes seconds even then (4.7 s on an
            # H200, torch 2.11; under a millisecond after): answer with a dump without them
            # first, then replace it (README, "Checked on a GPU").
            traces = _symbolizing_is_free()
            later = traces and not self._symbolized and _backend_is_nccl()
            written = []
            for nccl, fn in _DUMPS:
                try:
                    data = fn(includeStackTraces=traces and not later)
                except Exception:
                    continue
                if data:
                    path = self.run.fr_dump(self.rank, nccl=nccl)
                    try:  # the dump before it stays whole where this one cannot be written
                        atomic_write_bytes(path, data)
                    except OSError as exc:
                        self._say_once(f"cannot write {path.name} ({exc.strerror or exc})")
                        continue
                    files.append(path.name)
                    written.append((fn, path))
            self.emit("capture", id=capture_id, reason=reason, files=files)
            self.flush()
        if later:
            for fn, path in written:
                with contextlib.suppress(Exception):
                    atomic_write_bytes(path, fn(includeStackTraces=True))
            self._symbolized = True
        return files

    # --- collectives ------------------------------------------------------------------------
    def _patch(self) -> None:
        for name, peer in COLLECTIVES.items():
            fn = getattr(c10d, name, None)
            if fn is None or getattr(fn, "__rankscope__", False):
                continue
            wrapper = self._wrap(name, fn, peer)
            for module in (c10d, dist):
                if getattr(module, name, None) is fn:
                    self._originals.append((module, name, fn))
                    setattr(module, name, wrapper)
        wait = _WORK.wait
        if not getattr(wait, "__rankscope__", False):
            self._originals.append((_WORK, "wait", wait))
            hook = waited_hook if isinstance(self._state, _State) else _fast.WaitHook
            _WORK.wait = functools.update_wrapper(hook(wait, self._state), wait)
            _WORK.wait.__rankscope__ = True
        real_exit = os._exit

        def _exit(code: int) -> None:
            with contextlib.suppress(Exception):
                caller = sys._getframe(1)
                self.end(code, reason="os._exit", stack=frame_stack(caller), frame=caller)
            real_exit(code)

        os._exit = _exit

    def _wrap(self, name: str, fn: Any, peer: str | None) -> Any:
        params = list(inspect.signature(fn).parameters)
        spec = _Spec(
            name=name,
            group_at=params.index("group") if "group" in params else None,
            peer=peer,
            peer_at=params.index(peer) if peer in params else None,
            async_at=params.index("async_op") if "async_op" in params else None,
            always_async=name in ("isend", "irecv", "batch_isend_irecv"),
            # The only tensor argument is the first one, named "tensor": all_reduce, broadcast,
            # reduce, send, recv and friends take the short path.
            one_tensor=params[:1] == ["tensor"]
            and not any(p in _TENSOR_PARAMS for p in params[1:]),
            p2p=name in P2P_OPS,
        )
        before = after = None
        if name == "init_process_group":

            def before(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
                _default_timeout(kwargs, args, params)

        if name in ("init_process_group", "destroy_process_group"):
            after = self._groups_changed
        if isinstance(self._state, _State):  # made without the C extension
            wrapper = _python_wrapper(self, fn, spec, before, after)
        else:
            wrapper = _fast.Wrapper(fn, spec, self, before, after, torch.Tensor, _META)
        functools.update_wrapper(wrapper, fn)
        wrapper.__rankscope__ = True
        return wrapper

    def _enter(
        self, spec: _Spec, args: tuple[Any, ...], kwargs: dict[str, Any] | None, frame: Any
    ) -> _Call:
        # The hot path of every collective. Right after a collective returns the rank's caches
        # are cold and each Python step here costs several times what it costs in a warm loop,
        # so the common case (one tensor, a cached group, a cached call site) takes few steps.
        group = kwargs.get("group") if kwargs else None
        if group is None and spec.group_at is not None and len(args) > spec.group_at:
            group = args[spec.group_at]
        peer_val = None
        if spec.peer is not None:
            peer_val = kwargs.get(spec.peer)
            if peer_val is None and spec.peer_at is not None and len(args) > spec.peer_at:
                peer_val = args[spec.peer_at]
        if spec.one_tensor:
            tensor = args[0] if args else kwargs.get("tensor")
            if isinstance(tensor, torch.Tensor):
                shapes, dtypes = (tensor.shape,), (tensor.dtype,)
            else:
                shapes, dtypes = (), ()
        else:
            if spec.name == "batch_isend_irecv" and args:
                ops = list(args[0])
                tensors = [op.tensor for op in ops]
                peer_val = [f"{op.op.__name__}:{op.peer}" for op in ops]
                if ops and group is None:
                    group = ops[0].group
            else:
                tensors = []
                _collect_tensors(args, tensors)
                if kwargs:
                    _collect_tensors(kwargs.values(), tensors)
            shapes = tuple(t.shape for t in tensors[:8])
            dtypes = tuple(t.dtype for t in tensors[:8])
        try:
            pg, pg_desc, pg_ranks = self._pg_cache[group]
        except (KeyError, TypeError):
            pg, pg_desc, pg_ranks = self._describe_group(group)
        counter = (pg, "p2p") if spec.p2p else pg
        seqs = self._seqs.get(counter) or self._seqs.setdefault(counter, _Counter(1))
        async_op = kwargs.get("async_op") if kwargs else None
        if async_op is None and spec.async_at is not None and len(args) > spec.async_at:
            async_op = args[spec.async_at]
        site = self._sites.get((frame.f_code, frame.f_lasti)) or self._call_site(frame)
        path = self._path_id(frame)
        async_op = spec.always_async or bool(async_op)
        fid = self._facts_id(
            spec.name, pg, pg_desc, pg_ranks, peer_val, shapes, dtypes, async_op, site, path
        )
        # next() on a counter is atomic under the GIL: ids stay unique across calling threads.
        return tuple.__new__(
            _Call,
            (
                next(self._ids),
                next(seqs),
                time.time(),
                threading.get_ident(),
                spec.name,
                pg,
                pg_desc,
                pg_ranks,
                peer_val,
                shapes,
                dtypes,
                async_op,
                site,
                path,
                fid,
            ),
        )

    def _groups_changed(self) -> None:
        """After init/destroy_process_group: what is cached about groups is stale, and the
        call's return is written out at once. A rank whose main thread then holds the GIL
        (a long C call, a regex) leaves the probe's thread no chance to write it, and would
        read as still inside init_process_group rather than working outside the collectives."""
        self._pg_cache.clear()
        self._state.epoch += 1
        self.flush()

    def _describe_group(self, group: Any) -> tuple[str | None, str | None, list[int] | None]:
        # On a miss of the cache _enter looks in first. The default group is cached under None;
        # init/destroy_process_group clear the cache.
        key = group
        if group is None:
            if not c10d.is_initialized():
                return None, None, None
            group = c10d._get_default_group()
        try:
            info = (
                c10d._get_process_group_name(group),
                getattr(group, "group_desc", None),
                c10d.get_process_group_ranks(group),
            )
        except Exception:
            info = (str(group), None, None)
        with contextlib.suppress(TypeError):
            self._pg_cache[key] = info
        return info

    def _main_at(self) -> list[Any] | None:
        """[file, line, function] of the main thread's innermost frame of the user's code: the
        line it runs now (or waits at), for the live view."""
        frame = sys._current_frames().get(threading.main_thread().ident or 0)
        file, line, func = self._call_site(frame) if frame is not None else (None, None, None)
        return None if file is None else [file, line, func]

    def _call_site(self, frame: Any) -> tuple[str | None, int | None, str | None]:
        """(file, line, function) of the first frame from ``frame`` outwards outside torch and
        rankscope; cached per code object and instruction, so a loop pays for it once."""
        sites, internal = self._sites, self._internal
        while frame is not None:
            code = frame.f_code
            key = (code, frame.f_lasti)
            site = sites.get(key)
            if site is not None:
                return site
            inside = internal.get(code)
            if inside is None:
                inside = internal[code] = code.co_filename.startswith(_INTERNAL_DIRS)
            if not inside:
                if len(sites) > 50_000:  # generated code that never repeats: stay bounded
                    sites.clear()
                site = sites[key] = (code.co_filename, frame.f_lineno, code.co_name)
                return site
            frame = frame.f_back
        return None, None, None

    def _path_id(self, frame: Any) -> int | None:
        """The id of the call path that leads to ``frame`` (None: no frame). A path new to the
        probe gets the next id and its ``path`` line is written at once, before the facts line
        that names it: the frames from the outermost to ``frame``, each ``(file, func, line)``,
        without MACHINERY's (``rankscope.rundir``), the innermost ``PATH_DEPTH`` of them.

        The raw frames (code object and instruction of each) are looked up first, so a path
        that repeats is not filtered again; ``_fast.c`` keeps the raw frames it last saw and
        calls this only when they change. Paths are forgotten together with the facts
        (``_facts_id``), whose key holds the path's id."""
        if frame is None:
            return None
        # By the code objects' ids (a code object's hash hashes its names and constants, at
        # every call); the entry holds the code objects, so that no id is reused meanwhile.
        codes = []
        lastis = []
        f = frame
        while f is not None:
            codes.append(f.f_code)
            lastis.append(f.f_lasti)
            f = f.f_back
        key = (*map(id, codes), *lastis)
        known = self._path_keys.get(key)
        if known is not None:
            return known[0]
        frames = []
        machinery = self._machinery
        for code, f_lineno in zip(codes, _linenos(frame), strict=True):
            drop = machinery.get(code)
            if drop is None:
                if len(machinery) > 50_000:  # generated code that never repeats
                    machinery.clear()
                drop = machinery[code] = is_machinery(code.co_filename)
            if not drop:
                frames.append((code.co_filename, code.co_name, f_lineno))
        cut = max(0, len(frames) - PATH_DEPTH)
        frames = frames[:PATH_DEPTH][::-1]
        value = (tuple(frames), cut)
        pid = self._paths.get(value)
        if pid is None:
            pid = self._paths[value] = next(self._pids)
            self._write_line(_path_line(self.rank, pid, frames, cut, time.time()))
        if len(self._path_keys) >= FACTS_KEPT:  # raw frames that never repeat: stay bounded
            self._path_keys.clear()
        self._path_keys[key] = (pid, codes)
        return pid

    def step(self, n: int | None = None) -> None:
        self._step = (self._step or 0) + 1 if n is None else int(n)
        t = time.time()
        with contextlib.suppress(struct.error):  # a step beyond int64 stays an event only
            self._ring.step(self._step, t)
        self.emit("step", step=self._step, t=t)


def _linenos(frame: Any) -> Iterator[int | None]:
    """The line each frame from ``frame`` outwards is at."""
    while frame is not None:
        yield frame.f_lineno
        frame = frame.f_back


#: Parameters of torch.distributed's functions that hold tensors or lists of tensors.
_TENSOR_PARAMS = frozenset(
    {
        "tensor",
        "tensors",
        "tensor_list",
        "input_tensor_list",
        "output_tensor_list",
        "output_tensor_lists",
        "input_tensor",
        "output_tensor",
        "input",
        "output",
        "input_list",
        "gather_list",
        "scatter_list",
    }
)


#: Frames of the probe, the bootstrap and runpy: not in the stack an end records.
_NOT_THE_USERS = (
    str(Path(__file__).parent),
    str(Path(__file__).resolve().parent),
    runpy.__file__,
    "<frozen ",
)
#: The most frames an end's stack keeps (the innermost, as faulthandler keeps 100).
END_STACK_MAX = 100


def _without_probe(frames: list[list[Any]]) -> list[list[Any]]:
    kept = [f for f in frames if not str(f[0]).startswith(_NOT_THE_USERS)]
    return kept[-END_STACK_MAX:]


def tb_stack(tb: Any) -> list[list[Any]]:
    """``[[file, function, line], ...]`` of a traceback, outermost first, down to where the
    exception was raised (``sys.exit`` is C: its caller's line), without the probe's frames."""
    frames = []
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append([code.co_filename, code.co_name, tb.tb_lineno])
        tb = tb.tb_next
    return _without_probe(frames)


def frame_stack(frame: Any) -> list[list[Any]]:
    """The same for the frames from ``frame`` outwards (where ``os._exit`` was called)."""
    frames = []
    while frame is not None:
        frames.append([frame.f_code.co_filename, frame.f_code.co_name, frame.f_lineno])
        frame = frame.f_back
    return _without_probe(frames[::-1])


def _end_capture(how: str, tid: int, stack: list[list[Any]]) -> str:
    """An end's stack as a capture in ``stacks.txt``: a marker with ``how`` as its reason, then
    the thread as faulthandler writes one (innermost frame first), for the same reader."""
    lines = [
        f"# rankscope capture id=None t={time.time():.6f} reason={how} pid={os.getpid()}",
        f"Current thread 0x{tid:016x} (most recent call first):",
    ]
    lines += [f'  File "{file}", line {line} in {func}' for file, func, line in reversed(stack)]
    return "\n".join(lines) + "\n\n"


def _die_of(signum: int) -> None:
    """End the process by ``signum`` with its default action, as if no handler had caught it
    (torchrun then reports the signal), from any thread: Python's ``signal.signal`` may only be
    called from the main thread, libc's ``signal`` from any."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
        libc.signal(signum, None)  # SIG_DFL
        os.kill(os.getpid(), signum)
        time.sleep(5)  # delivered to some thread meanwhile
    finally:
        os._exit(128 + signum)


#: The first torch release checked to read TORCH_FR_BUFFER_SIZE and to warn, in every rank, that
#: TORCH_NCCL_TRACE_BUFFER_SIZE is deprecated.
_FR_NAME_FROM = (2, 13)


def _one_buffer_size_name() -> None:
    """A job's environment often sets both names of the flight recorder's size, for whichever
    torch reads it; where this torch reads the new one, drop the old one (the same value) so
    that no rank's log starts with torch's deprecation warning."""
    new, old = (
        os.environ.get("TORCH_FR_BUFFER_SIZE"),
        os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE"),
    )
    if new is not None and new == old and torch.__version__ >= _FR_NAME_FROM:
        del os.environ["TORCH_NCCL_TRACE_BUFFER_SIZE"]


def _main_clock() -> int | None:
    """The main thread's CPU-time clock (Linux, macOS); None where there is none."""
    try:
        return time.pthread_getcpuclockid(threading.main_thread().ident or 0)
    except (AttributeError, OSError, OverflowError):
        return None


def _main_cpu(clock: int | None) -> float | None:
    """CPU seconds of the main thread: whether it works, as the watchdog reads it from another
    node (on this host it reads /proc too)."""
    if clock is None:
        return None
    try:
        return round(time.clock_gettime(clock), 4)
    except OSError:
        return None


def _fr_enabled() -> bool:
    size = os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE")
    return size not in (None, "", "0")


def _fr_progress() -> dict[str, list[int]] | None:
    """Per process group, [last enqueued, last completed] collective from the flight recorder.

    This sees collectives that torch issues from C++ (DDP's gradient buckets, FSDP), which the
    Python wrappers do not; it asks for no entries and no stacks, so it costs microseconds.
    """
    out: dict[str, list[int]] = {}
    for _, fn in _DUMPS:
        try:
            status = pickle.loads(fn(includeCollectives=False, includeStackTraces=False))
        except Exception:
            continue
        for pg, st in (status.get("pg_status") or {}).items():
            out[str(pg)] = [
                int(st.get("last_enqueued_collective", -1)),
                int(st.get("last_completed_collective", -1)),
            ]
    return out or None


#: What an async call returns: the backend's handle on the collective it enqueued.
_WORK = c10d.Work
#: Entries of a live read of the flight recorder kept in a heartbeat: the oldest uncompleted.
FR_ACTIVE_MAX = 8


def _fr_active_entries() -> list[list[Any]]:
    """The flight recorder's uncompleted entries, oldest first.

    Each is ``[group, seq, op, state, created_s, started_s]`` with the group's name as the probe
    records it, ``seq`` the recorder's ``collective_seq_id``, ``op`` without its backend prefix
    and ``state`` the recorder's (``scheduled``, ``started``; gloo stays ``scheduled``). No
    stack traces."""
    out: list[list[Any]] = []
    timing = os.environ.get("TORCH_NCCL_ENABLE_TIMING", "").lower() in ("1", "true", "yes", "on")
    for _, fn in _DUMPS:
        try:
            dump = pickle.loads(
                fn(includeCollectives=True, includeStackTraces=False, onlyActive=True)
            )
        except Exception:
            continue
        for e in dump.get("entries") or ():
            if e.get("retired") or e.get("state") == "completed" or e.get("is_p2p"):
                continue
            pg = e.get("process_group")
            name = pg[0] if isinstance(pg, (list, tuple)) and pg else e.get("pg_id")
            started = e.get("time_discovered_started_ns")
            backend, _, op = str(e.get("profiling_name") or "").rpartition(":")
            # gloo never moves an entry past "scheduled", nor nccl without its timing events:
            # there "scheduled" says nothing about whether the device started it.
            state = e.get("state") if backend == "nccl" and timing else None
            out.append(
                [
                    str(name),
                    e.get("collective_seq_id"),
                    op,
                    state,
                    _ns_to_s(e.get("time_created_ns")),
                    _ns_to_s(started),
                ]
            )
    return out[:FR_ACTIVE_MAX]


def _ns_to_s(ns: Any) -> float | None:
    return round(ns / 1e9, 6) if type(ns) is int else None


def _symbolizing_is_free() -> bool:
    """Whether a dump may carry its entries' stack traces now. torch symbolizes them through
    ``torch._inductor.codecache``, importing the compiler where the job has not: about 1.4 s
    of CPU holding the GIL (torch 2.13), and an import on this thread while the main thread
    imports a piece of the same package can hand the main thread a half-initialized module
    (a DDP constructor failed with ``ImportError: cannot import name 'IndentedBuffer'`` so).
    A job that imported the compiler itself (DDP's constructor does, 1.5 s of its own;
    torch.compile) leaves only ``codecache`` to import, about 0.1 s: then, and only while no
    module is being imported, the traces cost next to nothing. Without them nothing is lost for
    the calls the wrappers recorded (their events carry every call site, the captured stacks
    every thread's)."""
    inductor = sys.modules.get("torch._inductor")
    if inductor is None:
        return False
    return not any(
        getattr(getattr(m, "__spec__", None), "_initializing", False)
        for m in list(sys.modules.values())
    )


def _backend_is_nccl() -> bool:
    try:
        return "nccl" in str(c10d.get_backend())
    except Exception:
        return False


def _pending_capture_id(run: RunDir) -> int:
    try:
        return int(json.loads(run.capture_request.read_text()).get("id", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


def _collect_tensors(values: Any, out: list[Any]) -> None:
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)) and v and isinstance(v[0], torch.Tensor):
            out.extend(x for x in v if isinstance(x, torch.Tensor))


def _default_timeout(kwargs: dict[str, Any], args: tuple[Any, ...], params: list[str]) -> None:
    """Apply the job's collective timeout when the script does not pass one itself."""
    seconds = os.environ.get("RANKSCOPE_COLLECTIVE_TIMEOUT")
    if not seconds or "timeout" in kwargs or len(args) > params.index("timeout"):
        return
    kwargs["timeout"] = datetime.timedelta(seconds=float(seconds))


def install(run_dir: str | os.PathLike[str] | None = None, *, rank: int | None = None) -> Probe:
    """Install the probe in this process; safe to call more than once.

    Call it at the top of a training script launched without rankscope (torchrun by hand, SLURM):
    the events and dumps go to ``run_dir`` (default ``$RANKSCOPE_RUN_DIR``, else
    ``./runs/probe-<TORCHELASTIC_RUN_ID or pid of the launcher>``), under ``ranks/<RANK>/``.
    The flight recorder is switched on unless the environment already sets a buffer size; it has
    to be on before the first process group is created, so install before ``init_process_group``.
    """
    global _probe
    if _probe is not None:
        return _probe
    if run_dir is None:
        run_dir = os.environ.get(ENV_RUN_DIR) or os.path.join(
            "runs", f"probe-{os.environ.get('TORCHELASTIC_RUN_ID', os.getppid())}"
        )
    os.environ[ENV_RUN_DIR] = str(run_dir)
    if rank is None:
        rank = int(os.environ.get("RANK", "0"))
    run = RunDir(run_dir)
    if (
        "TORCH_FR_BUFFER_SIZE" not in os.environ
        and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in os.environ
    ):
        os.environ["TORCH_FR_BUFFER_SIZE"] = DEFAULT_FR_BUFFER
    if os.environ.get("NCCL_DEBUG") and "NCCL_DEBUG_FILE" not in os.environ:
        run.rank_dir(rank).mkdir(parents=True, exist_ok=True)
        os.environ["NCCL_DEBUG_FILE"] = str(run.nccl_log(rank))
    os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", str(run.rank_dir(rank) / "torch_fr_rank_"))
    # nccl records an event as each collective starts on its stream only with timing on: the
    # recorder's "started" state (a collective issued but not started: its stream is busy).
    os.environ.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")
    _one_buffer_size_name()
    _probe = Probe(run, rank)
    _probe.start()
    if not hasattr(sys, "_rankscope_bootstrap"):
        previous = sys.excepthook

        def hook(tp: type[BaseException], exc: BaseException, tb: Any) -> None:
            if _probe is not None:
                stack = tb_stack(tb)
                _probe.leaving("exception", stack, None, exc)
                _probe.on_exception(exc)
                _probe.end(1, reason="exception", stack=stack)
            previous(tp, exc, tb)

        sys.excepthook = hook
    return _probe


def step(n: int | None = None) -> None:
    """Mark a training step (progress for the stall watchdog); a no-op without a probe."""
    if _probe is not None:
        _probe.step(n)


def capture(reason: str = "user") -> list[str]:
    """Write stacks and flight-recorder dumps now; returns the files written (none without probe)."""
    return _probe.capture(reason=reason) if _probe is not None else []


def current() -> Probe | None:
    return _probe
