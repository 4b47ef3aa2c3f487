"""The tables a diagnosis reads, and the per-rank facts derived from them.

:class:`Evidence` takes the tables lazily from a :class:`rankscope.collect.Run` (or from anything
with the same attributes, such as a namespace of frames built in a test): a table that is not
there reads as empty, so partial evidence still gives an answer.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import pandas as pd

from rankscope import schema
from rankscope.collect import (
    SIGNATURES,
    VICTIM_ROLES,
    is_user_file,
    latest_captures,
    short_site,
    victims_words,
)
from rankscope.state import OWN_ENDS, RankEnd, rank_end, signal_name, stopping

ROLE_OF_KIND = {s.kind: s.role for s in SIGNATURES}

#: Reports by ranks that were left waiting: the ranks DETAIL compared, monitored_barrier's rank 0.
WAITER_KINDS = frozenset({"collective_mismatch", "monitored_barrier"})
#: What each fatal signal usually means, for a rank that died of it.
SIGNAL_TEXT = {
    "SIGKILL": "killed from outside: the kernel's OOM killer, a scheduler's limit or kill -9",
    "SIGSEGV": "a segmentation fault in native code",
    "SIGABRT": "aborted: a C++ exception or a failed assertion in native code",
    "SIGBUS": "a bus error (a truncated memory-mapped file, or shared memory exhausted)",
    "SIGILL": "an illegal instruction (native code built for another CPU)",
    "SIGFPE": "an arithmetic fault in native code",
}

_TRACE_FILE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<func>\S+))?')
#: The probe's exit handler (``Probe.end``): on a rank's stack, its script has returned.
_PROBE_FILE = re.compile(r"rankscope[/\\]probe[/\\]_core\.py$")


class Evidence:
    """Lazy access to the collected tables of one run, plus its run.json (``info``)."""

    def __init__(self, run: Any):
        self.run = run
        self._tables: dict[str, pd.DataFrame] = {}
        self._frames: dict[int, pd.DataFrame] = {}

    def table(self, name: str) -> pd.DataFrame:
        """The table ``name`` of :mod:`rankscope.schema`; empty when the run does not have it."""
        cache = self._tables
        if name not in cache:
            value = getattr(self.run, name, None)
            table = schema.empty(name) if value is None else value
            if name == "errors" and table["role"].isna().any():
                # a table built by hand: each kind's role is its signature's
                role = table["role"].astype(object).fillna(table["kind"].map(ROLE_OF_KIND))
                table = table.assign(role=role.astype("category"))
            cache[name] = table
        return cache[name]

    def fr_frames(self, ranks: set[int]) -> pd.DataFrame:
        """Flight-recorder frames of some ranks: from a :class:`rankscope.collect.Run`, only
        these ranks' dumps (``Run.fr_frames_for``); else the ``fr_frames`` table's rows."""
        some = getattr(self.run, "fr_frames_for", None)
        if some is None:
            frames = self.table("fr_frames")
            return frames[frames["rank"].isin(list(ranks))]
        cache = self._frames
        new = set(ranks) - set(cache)
        if new:  # each rank's dump is read once, however the samples fall
            read = some(new)
            for rank in new:
                cache[rank] = read[read["rank"] == rank]
        return (
            pd.concat([cache[r] for r in sorted(ranks)], ignore_index=True)
            if ranks
            else (schema.empty("fr_frames"))
        )

    @cached_property
    def info(self) -> dict[str, Any]:
        """run.json of a rankscope run directory; ``{}`` for a folder of foreign artifacts."""
        info = getattr(self.run, "info", None)
        return info if isinstance(info, dict) else {}

    @cached_property
    def path(self) -> str | None:
        path = getattr(self.run, "path", None)
        return None if path is None else str(path)

    @cached_property
    def stopped(self) -> bool:
        """Whether the job was ended by a stop (a stall, the user, a time limit)."""
        return stopping(self.info)

    @cached_property
    def stalls(self) -> list[dict[str, Any]]:
        return list(self.info.get("stalls") or [])

    @cached_property
    def world(self) -> list[int]:
        """Every rank the evidence knows of (from any table, and the job's world size)."""
        seen: set[int] = set()
        for name in ("ranks", "events", "collectives", "errors", "stack_summary"):
            seen |= set(self.table(name)["rank"].dropna().astype(int).tolist())
        fr = self.table("pg_status")
        seen |= set(fr["rank"].dropna().astype(int).tolist())
        sizes = self.table("ranks")["world_size"].dropna().astype(int).tolist()
        size = max([*sizes, int(self.info.get("world_size") or 0)], default=0)
        return sorted(seen | set(range(size)))

    @cached_property
    def ranks(self) -> dict[int, RankFacts]:
        """What is known of every rank's process: exit, exception, where it was last seen."""
        facts = {r: RankFacts(rank=r) for r in self.world}
        ranks = self.table("ranks")
        for pos, row in zip(range(len(ranks)), ranks.itertuples(index=False), strict=True):
            if pd.isna(row.rank):
                continue
            f = facts[int(row.rank)]
            f.row = pos
            f.exit_code = None if pd.isna(row.exit_code) else int(row.exit_code)
            f.ended_s = None if pd.isna(row.ended_s) else float(row.ended_s)
            f.signal = signal_name(f.exit_code) if pd.isna(row.signal) else str(row.signal)
            f.end_reason = None if pd.isna(row.end_reason) else str(row.end_reason)
            f.last_seen_s = None if pd.isna(row.last_event_s) else float(row.last_event_s)
            f.ring = bool(row.ring) if not pd.isna(row.ring) else False
            f.main_thread = None if pd.isna(row.main_thread) else str(row.main_thread)
            f.end_how = None if pd.isna(row.end_how) else str(row.end_how)
            f.end_site = None if pd.isna(row.end_site) else str(row.end_site)
            f.last_output = None if pd.isna(row.last_output) else str(row.last_output)
            if not pd.isna(row.cell_state):
                f.cell = None if pd.isna(row.cell) else int(row.cell)
                f.cell_run = None if pd.isna(row.cell_run) else int(row.cell_run)
                f.cell_state = str(row.cell_state)
                f.cell_s = None if pd.isna(row.cell_s) else float(row.cell_s)
                f.cell_error = None if pd.isna(row.cell_error) else str(row.cell_error)
                f.cell_error_site = (
                    None if pd.isna(row.cell_error_site) else str(row.cell_error_site)
                )
            f.stopped = self.stopped
        events = self.table("events")
        special = events[events["ev"].isin(["exception", "end", "start"])]
        for pos, row in zip(special.index, special.itertuples(index=False), strict=True):
            f = facts.get(int(row.rank))
            if f is None:
                continue
            if row.ev == "start":
                f.started = True
            elif row.ev == "exception" and f.exception is None:
                f.exception = str(row.message)
                f.exception_s = float(row.t_s)
                f.exception_row = int(pos)
            elif row.ev == "end":
                f.end_row = int(pos)
                f.ended_s = float(row.t_s) if f.ended_s is None else f.ended_s
                f.end_code = None if pd.isna(row.code) else int(row.code)
                if f.exit_code is None:
                    f.exit_code = f.end_code
        for rank in self._exiting():
            if rank in facts:
                facts[rank].exiting = True
        for f in facts.values():
            if f.end_how in OWN_ENDS and self.terminated(f.exit_code):
                f.exiting = True  # its own end came first; the teardown found it exiting
        summary = self.table("stack_summary")
        if not summary.empty:
            positioned = summary.assign(pos=range(len(summary)))
            for row in latest_captures(positioned).itertuples(index=False):
                f = facts.get(int(row.rank))
                if f is not None:
                    f.stack_site = None if pd.isna(row.site) else str(row.site)
                    f.stack_waiting_in = None if pd.isna(row.waiting_in) else str(row.waiting_in)
                    f.stack_reason = None if pd.isna(row.reason) else str(row.reason)
                    f.stack_row = int(row.pos)
        return facts

    def _exiting(self) -> set[int]:
        """Ranks whose latest captured stack runs the probe's exit handler."""
        stacks = self.table("stacks")
        if stacks.empty:
            return set()
        latest = stacks.groupby("rank")["capture_id"].transform("max")
        last = stacks[stacks["capture_id"].eq(latest).fillna(False).astype(bool)]
        func = last["func"].fillna("").astype(str)
        in_end = func.isin(["end", "Probe.end"]) & last["file"].fillna("").str.contains(_PROBE_FILE)
        return set(last.loc[in_end.to_numpy(), "rank"].dropna().astype(int).tolist())

    @cached_property
    def waiters(self) -> set[int]:
        """Ranks whose own texts say they waited on others: a victim's error (a timeout, a
        peer's exit, a mismatch) in their logs or as the exception they raised (a teardown
        signal may end a rank before its traceback reaches the logs), or a report made while
        waiting (DETAIL, monitored_barrier)."""
        errors = self.table("errors")
        waiting = errors["role"].isin(list(VICTIM_ROLES)) | errors["kind"].isin(list(WAITER_KINDS))
        events = self.table("events")
        raised = events[(events["ev"] == "exception").to_numpy(dtype=bool)]
        said = [
            int(r)
            for r, m in zip(raised["rank"], raised["message"], strict=True)
            if not pd.isna(r) and isinstance(m, str) and victims_words(m)
        ]
        return set(errors.loc[waiting, "rank"].dropna().astype(int).tolist()) | set(said)

    def terminated(self, code: int | None) -> bool:
        """An exit by SIGTERM, SIGINT or SIGHUP (torchrun or a stop ending a live rank), or by
        any signal in a job that was stopped: the rank was alive until then, it did not fail."""
        if code is None or code >= 0:
            return False
        return -code in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP) or self.stopped

    def traceback_path(self, rank: int, message: str | None) -> list[tuple[str, str, int]]:
        """The frames ``(file, function, line)``, outermost first, of the traceback a rank
        printed for ``message`` (from its stderr in the ``logs`` table); empty without one."""
        logs = self.table("logs")
        if logs.empty or not message:
            return []
        texts = logs.loc[(logs["rank"] == rank) & logs["text"].notna(), "text"].tolist()
        needle = message.split("\n", 1)[0][:80]
        hit = next((i for i, text in enumerate(texts) if needle in text), None)
        if hit is None:
            return []
        frames = []
        for text in reversed(texts[:hit]):
            if text.startswith("Traceback (most recent call last)"):
                break
            m = _TRACE_FILE.match(text)
            if m:
                frames.append((m["file"], m["func"] or "<module>", int(m["line"])))
        return frames[::-1]

    def traceback_site(self, rank: int, message: str | None) -> str | None:
        """``file:line`` of the innermost user frame of the traceback a rank printed for
        ``message`` (from its stderr in the ``logs`` table)."""
        logs = self.table("logs")
        if logs.empty or not message:
            return None
        mine = logs[(logs["rank"] == rank) & logs["text"].notna()]
        texts = mine["text"].tolist()
        needle = message.split("\n", 1)[0][:80]
        hits = [i for i, text in enumerate(texts) if needle in text]
        if not hits:
            return None
        for text in reversed(texts[: hits[0]]):
            m = _TRACE_FILE.match(text)
            if m and is_user_file(m["file"]):
                return short_site(m["file"], m["line"])
        return None


@dataclass(kw_only=True)
class RankFacts:
    """What the evidence says about one rank's process."""

    rank: int
    row: int | None = None
    """Row in the ``ranks`` table."""
    started: bool = False
    exit_code: int | None = None
    ended_s: float | None = None
    end_row: int | None = None
    exception: str | None = None
    exception_s: float | None = None
    exception_row: int | None = None
    stack_site: str | None = None
    stack_waiting_in: str | None = None
    stack_row: int | None = None
    exiting: bool = False
    """It was past its script when it was last seen: its last captured stack runs the probe's
    exit handler, or its end event says its own code ended it (:data:`OWN_ENDS`) before the
    teardown signal that its process died of."""
    end_code: int | None = None
    """The code its end event says it meant to exit with (``sys.exit(3)``: 3)."""
    signal: str | None = None
    """The signal that ended the process (``SIGKILL`` for exit code -9)."""
    end_reason: str | None = None
    """Why the probe's end event was written: ``exit``, ``exception``, ``os._exit``, or the
    teardown signal (``SIGTERM``); None when the process ended without one (killed)."""
    last_seen_s: float | None = None
    """Time of the rank's last recorded event or call."""
    ring: bool = False
    """Its calls were recorded durably as they were made (a ring file): none is missing."""
    stack_reason: str | None = None
    """Why its latest stacks were taken: ``stall``, ``SIGTERM``, ``SIGSEGV``, ..."""
    main_thread: str | None = None
    """Its main thread's ident (``0x00007f...``), as the stacks and the calls name threads."""

    end_how: str | None = None
    """How it ended: ``returned``, ``sys_exit``, ``exception``, ``os._exit``, or the signal's
    name (its end event's, else the signal it died of); None when nothing says."""
    end_site: str | None = None
    """``train.py:41``: the user's line where it ended (sys.exit, the raise, os._exit, the
    fatal signal), from the stacks its end left."""
    last_output: str | None = None
    """The last line it printed itself (``loss is nan at step 7, stopping``)."""
    cell: int | None = None
    """In a cell session: N of its latest cell (``<cell N>``)."""
    cell_run: int | None = None
    """The session's number for that run of the cell."""
    cell_state: str | None = None
    """Where it stands with that cell: ``running``, ``finished`` (ended, no thread of it left
    running), ``raised`` (the same, but the cell raised) or ``threads``
    (:attr:`rankscope.rundir.RankRecord.cell_state`); None outside a cell session."""
    cell_s: float | None = None
    """When its latest cell event was written (the cell's start while it runs, else its end)."""
    cell_error: str | None = None
    """What that cell raised on it (``ValueError: bad batch``), where it raised."""
    cell_error_site: str | None = None
    """The cell's line it raised at (``<cell 7>:3``)."""

    @property
    def ending(self) -> str | None:
        """How it ended, in words; None when its end is not known.

        For instance ``called sys.exit(0) at train.py:41 ('loss is nan at step 7, stopping')``.
        """
        meant = self.end_code if self.end_code is not None else self.exit_code
        code = "" if meant is None else str(meant)
        what = {
            "returned": "ran its script to the end",
            "sys_exit": f"called sys.exit({code})",
            "exception": f"raised {self.exception}" if self.exception else "raised an exception",
            "os._exit": f"called os._exit({code})",
        }.get(self.end_how or "")
        if what is None and self.end_how:
            what = (
                f"died of {self.end_how}" if self.end_how != "SIGTERM" else "was ended by SIGTERM"
            )
        if what is None:
            return None
        at = f" at {self.end_site}" if self.end_site and self.end_how != "returned" else ""
        said = f" ({self.last_output!r})" if self.last_output else ""
        return what + at + said

    @property
    def record_complete(self) -> bool:
        """Whether its record of calls is whole up to its end: written durably at every call,
        or flushed by its end event (or a clean exit, which runs it). A rank without either
        may have made calls after its last recorded one."""
        return self.ring or self.end_reason is not None or self.exit_code == 0

    stopped: bool = False
    """The job was stopped (a SIGTERM or SIGKILL was the stop's)."""

    @property
    def end(self) -> RankEnd | None:
        """How it ended (:func:`rankscope.state.rank_end`, as every view says it)."""
        return rank_end(
            parent_code=self.exit_code, how=self.end_how or self.end_reason, stopped=self.stopped
        )

    @property
    def died(self) -> str | None:
        """How it ended when that was not a clean exit, in the words every view uses
        (:attr:`rankscope.state.RankEnd.words`): ``aborted itself: SIGABRT (-6)``, ``failed:
        exit code 3``; None for exit 0 or an unknown exit."""
        if self.exit_code is None or self.exit_code == 0:
            return None
        end = self.end
        return None if end is None else end.words
