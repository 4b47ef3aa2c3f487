"""The probe's Python side of what ``_fast.c`` does in C: read it as the probe, without the C.

Where the C extension is built (and its layouts are these), the C runs; else, or with
``RANKSCOPE_PYTHON_PROBE=1``, these do the same steps and write the same bytes (the tests run
both and compare). Each C function and its Python twin:

=====================================  =====================================================
C (``_fast.c``)                        Python (here)
=====================================  =====================================================
``Wrapper`` (``wrapper_call``,         :func:`_python_wrapper` (``Probe._enter`` reads the
``fast_enter``, ``enter_site``,        arguments of calls the C reads itself)
``finish``)
``State`` (``state_append``,           :class:`_State` (``append``, ``write``, ``current``,
``state_write``, ``current``,          ``done``, ``epoch``, ``facts_epoch``,
``take_returned``, ``Returned``)       ``take_returned``, ``calls_returned``)
``format_records``                     :meth:`_State.write`'s loop, with :class:`_Lines`
``enter_line``, ``call_line``,         :func:`_enter_line`, :func:`_call_line`,
``exit_line``                          :func:`_exit_line`
``put_seconds``                        :func:`_seconds`
``ring_enter``, ``ring_exit``          :meth:`_Ring.enter`, :meth:`_Ring.exit`
``RingSlot``                           :data:`rankscope.rundir.RING_SLOT_FIELDS`
``path_of`` (``entry_matches``,        ``Probe._path_id`` (its dict of raw frames; the C
``path_entry_fill``)                   calls it where its own entries miss)
``Counter``                            :func:`itertools.count` (:data:`_Counter`)
``WaitHook``                           :func:`waited_hook`
``Record`` (read from a ``_Call``,     :class:`_Call`, :class:`_Spec` (the C reads them by
``CALL_FIELDS``, ``SPEC_FIELDS``)      position: it serves only where their fields match)
=====================================  =====================================================

Why the C is off, where it is, is :data:`C_OFF`; the probe says it once in the rank's log.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import mmap
import os
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from rankscope.rundir import (
    RING_HEADER,
    RING_MAGIC,
    RING_SLOT,
    RING_SLOT_OFFSETS,
    RING_SLOTS,
    RING_STEP,
    RING_STEP_AT,
    RING_VERSION,
)

#: The wrapper in C (``_fast.c``), built at install where a compiler exists; without it, or with
#: ``RANKSCOPE_PYTHON_PROBE=1`` in the environment, the same steps run in Python.
_fast: Any = None
#: Why the C wrapper is off in this process (None: it is on).
C_OFF: str | None = "RANKSCOPE_PYTHON_PROBE is set"
if not os.environ.get("RANKSCOPE_PYTHON_PROBE"):
    try:
        from rankscope.probe import _fast
    except ImportError as exc:
        C_OFF = f"the C extension is not built or does not load ({exc})"
    else:
        C_OFF = None


#: Call ids and sequence numbers: the C wrappers bump a ``_fast.Counter`` without making ints.
_Counter: Any = _fast.Counter if _fast is not None else itertools.count


class _Spec(NamedTuple):
    """What a wrapper knows about its function, worked out once when it is wrapped."""

    name: str
    group_at: int | None
    peer: str | None
    peer_at: int | None
    async_at: int | None
    always_async: bool
    one_tensor: bool
    p2p: bool  # numbered among the group's point-to-point calls, not its collectives


class _Call(NamedTuple):
    """One recorded call, as taken on the rank's hot path (formatted later, off it)."""

    cid: int
    seq: int
    t: float
    tid: int  # threading.get_ident() of the calling thread
    # The call's "facts": what repeats from call to call at a call site.
    op: str
    pg: str | None
    pg_desc: str | None
    pg_ranks: list[int] | None
    peer: Any
    shapes: tuple[Any, ...]  # torch.Size objects
    dtypes: tuple[Any, ...]  # torch.dtype objects
    async_op: bool
    site: tuple[str | None, int | None, str | None]  # file, line, function
    path: int | None  # the id of the call's path (Probe._path_id), None without a frame
    fid: int  # the facts' id (Probe._facts_id)


# The C reads a _Call and a _Spec by position, in the layouts it declares: it serves only where
# they are these classes' fields (a field added or moved here, and the Python path runs).
if _fast is not None and (
    getattr(_fast, "CALL_FIELDS", None) != _Call._fields
    or getattr(_fast, "SPEC_FIELDS", None) != _Spec._fields
):
    _fast = None
    C_OFF = (
        "the C extension was built for other fields of _Call or _Spec than these "
        "(rebuild it: make install)"
    )


def _python_wrapper(probe: Any, fn: Any, spec: _Spec, before: Any, after: Any) -> Any:
    """The wrapper of ``fn`` for ``probe`` (a :class:`~rankscope.probe._core.Probe`) without the
    C extension; ``_fast.c``'s ``Wrapper`` does the same steps."""
    local = probe._local
    state = probe._state
    ring = probe._ring
    returned = state.calls_returned
    clock = time.time

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if getattr(local, "busy", False):  # a call made by another recorded call
            return fn(*args, **kwargs)
        local.busy = True
        try:
            if before is not None:
                before(args, kwargs)
            try:
                call = probe._enter(spec, args, kwargs, sys._getframe(1))
                ring.enter(call)  # in the file before anything can see the call in flight
                state.current = call
            except Exception:  # the probe must never break the user's collective
                call = None
            error = result = None
            try:
                result = fn(*args, **kwargs)
                return result
            except BaseException as exc:
                error = f"{type(exc).__name__}: {exc}"
                if call is not None and isinstance(exc, Exception):
                    probe._call_failed()
                raise
            finally:
                if call is not None:  # the exit record, inline: the hot path
                    t_end = clock()
                    ring.exit(call, t_end, error is None)
                    if state.current is call:
                        state.current = None
                    state.done += 1
                    state.t_done = t_end
                    if result is not None or call.async_op:
                        returned.append((call.cid, result, call.async_op))
                    state.append((call, t_end, error is None, error))
                if after is not None:  # after the exit record, which it may write out
                    after()
        finally:
            local.busy = False

    return wrapper


def waited_hook(wait: Any, state: _State) -> Any:
    """``Work.wait`` as the probe installs it (``_fast.c``'s ``WaitHook`` does the same): where
    the Work waited on is the last async call's, still among ``state``'s calls returned for the
    probe thread, and the backend completed it (gloo's wait returns then; nccl's once the GPU
    stream waits, so its Work stays followed), the entry becomes the call's id alone: the Work
    is let go at once and the thread's next look counts the call done. A Work kept until that
    look (up to half a second of them in a loop of ``all_reduce(async_op=True).wait()``) is
    freed long after its call, out of the cache: ``bench/probe_overhead.py --async-op``
    measured 1.055 without the hook. Anything else is the thread's to follow, as before."""

    def waited(work: Any, *args: Any, **kwargs: Any) -> Any:
        out = wait(work, *args, **kwargs)
        returned = state.calls_returned
        try:  # the thread takes the list's items from its front, under the GIL
            entry = returned[-1]
            if type(entry) is tuple and entry[1] is work and work.is_completed():
                returned[-1] = entry[0]
        except Exception:  # taken already, or a Work torn down with its group
            pass
        return out

    return waited


class _Ring:
    """A process's ``calls-<pid>.ring`` (layout in :mod:`rankscope.rundir`), mapped shared: what
    is stored in it is in the file whatever becomes of the process. ``_fast.c`` writes the same
    slots into the same map."""

    def __init__(self, path: Path, rank: int, slots: int = RING_SLOTS):
        size = RING_HEADER.size + slots * RING_SLOT.size
        self.error: OSError | None = None
        """Why the ring is in memory only (the disk was full): its calls are not durable."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            # Its blocks taken now: a page of a sparse file that the full disk cannot back
            # would kill the rank with SIGBUS at the call that first touches it.
            os.posix_fallocate(fd, 0, size)
            self.map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            self.error = exc
            with contextlib.suppress(OSError):
                os.unlink(path)
            self.map = mmap.mmap(-1, size)
        finally:
            os.close(fd)
        for at in range(0, size, mmap.PAGESIZE):  # fault every page in now, not at a call
            self.map[at] = 0
        header = (RING_MAGIC, RING_VERSION, RING_SLOT.size, slots, os.getpid(), rank, time.time())
        RING_HEADER.pack_into(self.map, 0, *header, 0, 0.0)
        self.slots = slots

    def step(self, step: int, t: float) -> None:
        """Keep the last step the rank marked, and when, in the header (one store)."""
        RING_STEP.pack_into(self.map, RING_STEP_AT, step, t)

    def _at(self, cid: int) -> int:
        return RING_HEADER.size + cid % self.slots * RING_SLOT.size

    def enter(self, call: _Call) -> None:
        at = self._at(call.cid)
        _U64.pack_into(self.map, at, 0)  # torn until the id is written again, last
        RING_SLOT.pack_into(self.map, at, 0, call.seq, call.t, 0.0, call.fid, 0, call.tid)
        _U64.pack_into(self.map, at, call.cid)

    def exit(self, call: _Call, t_end: float, ok: bool) -> None:
        at = self._at(call.cid)
        if _U64.unpack_from(self.map, at)[0] == call.cid:  # not taken by a later call meanwhile
            _F64.pack_into(self.map, at + _T_END, t_end)
            _U32.pack_into(self.map, at + _STATE, 1 if ok else 2)


_U64, _U32, _F64 = struct.Struct("<Q"), struct.Struct("<I"), struct.Struct("<d")
_T_END, _STATE = RING_SLOT_OFFSETS["t_end"], RING_SLOT_OFFSETS["state"]


@dataclass
class _Lines:
    """How the queued records become lines: what :meth:`_State.write` formats with."""

    entered: set[int]
    """Calls whose enter line is written (at a flush while they were in flight)."""
    statics: dict[Any, str]
    """The JSON fragments of exit lines by (op, pg)."""
    enter_line: Callable[[_Call], str]
    call_line: Callable[[_Call, float], str]
    exit_line: Callable[[_Call, float, bool, str | None], str]
    """(The C writes enter and call lines itself, and an exit line but for its slow cases.)"""
    event_line: Callable[[dict[str, Any]], str]
    rank: int
    in_flight: Callable[[], str | None]
    """The enter line of the call in flight, once; None when there is none to write."""


class _State:
    """What the wrappers and the probe thread share: the records queued for the next write,
    the call in flight and the ring file."""

    __slots__ = (
        "calls_returned",
        "current",
        "done",
        "epoch",
        "facts_epoch",
        "lines",
        "queue",
        "ring",
        "t_done",
    )

    def __init__(self, ring: _Ring | None, lines: _Lines) -> None:
        self.queue: list[tuple[Any, ...]] = []  # records: (fields,) or (call, t_end, ok, error)
        # calls that returned a Work or were async, for the thread: see take_returned
        self.calls_returned: list[Any] = []
        self.current: _Call | None = None  # the call in flight
        self.done = 0  # calls completed
        self.t_done = 0.0  # when the last of them completed (time.time())
        self.epoch = 0  # process groups created or destroyed (see Probe._groups_changed)
        self.facts_epoch = 0  # times the probe forgot its facts ids (see Probe._facts_id)
        self.ring = ring  # the wrapper writes a call's slot at entry and exit
        self.lines = lines

    def append(self, record: tuple[Any, ...]) -> None:
        self.queue.append(record)

    @property
    def returned(self) -> int:
        """How many calls returned since the last :meth:`take_returned`."""
        return len(self.calls_returned)

    def take_returned(self) -> list[Any]:
        """The calls that returned a Work (or a list of them), or were async, since the last
        take, in order: (call id, what it returned, async_op), or the call id alone once its
        caller waited on its Work and the backend completed it (:func:`waited_hook`)."""
        returned = self.calls_returned  # the wrappers hold this list: emptied in place
        taken = returned[:]
        del returned[: len(taken)]  # the wrappers append behind, under the GIL: nothing is lost
        return taken

    def write(self, fd: int) -> None:
        """Take every record queued and write their JSON lines to ``fd``, then the line of the
        call in flight if there is one to write."""
        records, self.queue = self.queue, []
        lines = self.lines
        out = []
        for item in records:
            if len(item) == 1:
                out.append(lines.event_line(item[0]))
                continue
            call, t_end, ok, error = item
            if call.cid in lines.entered:  # written at a flush while the call was in flight
                lines.entered.discard(call.cid)
            elif ok and error is None:  # entered and returned since the last flush: one line
                out.append(lines.call_line(call, t_end))
                continue
            else:  # a call that raised: its error in an exit line, as a call in flight's
                out.append(lines.enter_line(call))
            out.append(lines.exit_line(call, t_end, ok, error))
        try:
            out.append(lines.in_flight() or "")
        finally:  # what is formatted is written even when in_flight() fails
            data = memoryview("".join(out).encode())
            while data:
                data = data[os.write(fd, data) :]


def _enter_line(rank: int, call: _Call) -> str:
    """A call's ``enter`` line (``enter_line`` in C): its facts by id, their ``facts`` line
    written when they were new (``Probe._facts_id``)."""
    return (
        f'{{"id":{call.cid},"seq":{call.seq},"tid":{call.tid},"facts":{call.fid},"ev":"enter",'
        f'"t":{_seconds(call.t)},"rank":{rank}}}\n'
    )


def _call_line(rank: int, call: _Call, t_end: float) -> str:
    """The one line of a call that returned before a flush wrote its enter line (``call_line``
    in C): its enter line's fields, its duration and ``"ok":true``; ``t`` is its enter time."""
    return (
        f'{{"id":{call.cid},"seq":{call.seq},"tid":{call.tid},"facts":{call.fid},'
        f'"dur_s":{_seconds(t_end - call.t)},"ok":true,"ev":"call","t":{_seconds(call.t)},'
        f'"rank":{rank}}}\n'
    )


def _exit_line(
    statics: dict[Any, str], rank: int, call: _Call, t_end: float, ok: bool, error: str | None
) -> str:
    """A call's ``exit`` line (``exit_line`` in C)."""
    key = (call.op, call.pg)
    static = statics.get(key)
    if static is None:
        static = f'"op":"{call.op}","pg":{_js(call.pg)}'
        statics[key] = static
    return (
        f'{{"id":{call.cid},{static},"seq":{call.seq},"dur_s":{_seconds(t_end - call.t)},'
        f'"ok":{"true" if ok else "false"},"error":{_js(error)},"ev":"exit",'
        f'"t":{_seconds(t_end)},"rank":{rank}}}\n'
    )


def _facts_line(rank: int, fid: int, facts: tuple[Any, ...], t: float) -> str:
    """The ``facts`` line of facts new to the probe (``Probe._facts_id``): ``facts`` are
    :func:`_fragment`'s arguments."""
    return f'{{"ev":"facts","facts":{fid},{_fragment(*facts)},"t":{_seconds(t)},"rank":{rank}}}\n'


def _path_line(rank: int, pid: int, frames: list[tuple[str, str, int]], cut: int, t: float) -> str:
    """The ``path`` line of a call path new to the probe (``Probe._path_id``): its frames
    ``(file, func, line)`` from the outermost, and how many outer ones were cut."""
    body = json.dumps(frames, separators=(",", ":"), default=str)
    return (
        f'{{"ev":"path","path":{pid},"frames":{body},"cut":{cut},"t":{_seconds(t)},'
        f'"rank":{rank}}}\n'
    )


def _fragment(
    op: str,
    pg: str | None,
    pg_desc: str | None,
    pg_ranks: list[int] | None,
    peer: Any,
    shapes: tuple[Any, ...],
    dtypes: tuple[Any, ...],
    async_op: bool,
    site: tuple[str | None, int | None, str | None],
    path: int | None,
) -> str:
    """The JSON fields of a call's facts, without braces: its ``facts`` line's."""
    return json.dumps(
        {
            "op": op,
            "pg": pg,
            "pg_desc": pg_desc,
            "pg_ranks": pg_ranks,
            "peer": peer,
            "shapes": [list(s) for s in shapes],
            "dtypes": [str(d).removeprefix("torch.") for d in dtypes],
            "async_op": async_op,
            "file": site[0],
            "line": site[1],
            "func": site[2],
            "path": path,
        },
        separators=(",", ":"),
        default=str,
    )[1:-1]


def _js(value: Any) -> str:
    if value is None:
        return "null"
    if type(value) is int:
        return str(value)
    return json.dumps(value, default=str)


def _line(fields: dict[str, Any]) -> str:
    return json.dumps(fields, separators=(",", ":"), default=str) + "\n"


def _seconds(x: float) -> str:
    """Seconds to the microsecond, as JSON (``_fast.c``'s ``put_seconds`` writes the same)."""
    us = x * 1e6
    if not abs(us) < 9e18:  # NaN too
        return "null"
    n = abs(round(us))
    return f"{'-' if us < 0 and n else ''}{n // 1_000_000}.{n % 1_000_000:06d}"
