"""7b. ``stuck_at_exit``: every rank ended its script, but a rank's process did not exit (its
interpreter waits at exit for a thread that is not a daemon, an exit hook, a destructor), and
torchrun waits for it for ever. Asked after the waits (a rank that left while others wait for
it in a collective is theirs: an early exit), before the error texts.

A process outlived its end when stacks of it were taken after its end event (the watchdog's
``exit`` stall captures those processes alone), or when the stop ended it a while after that
event (its exit code is the stop's signal, not its script's)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from rankscope.analyze.activity import ExitWait, exit_wait
from rankscope.analyze.causes import Cause
from rankscope.analyze.context import Context
from rankscope.analyze.diagnosis import EvidenceRef
from rankscope.analyze.evidence import RankFacts
from rankscope.analyze.rules.finding import Finding, rule
from rankscope.state import EXITING_S

#: What to do, by what the exit was found waiting for (:attr:`ExitWait.kind`).
EXIT_FIXES = {
    "threads": "The interpreter waits at exit for every thread that is not a daemon. Tell the "
    "thread to stop before the script ends (a sentinel put in its queue, an Event it checks) "
    "and join() it, or start it with daemon=True where it holds nothing that must be written "
    "out.",
    "hook": "An exit hook (atexit) that waits for something nothing will ever do keeps the "
    "process alive after the script ends: stop what it waits for first (terminate a child "
    "process, then wait for it; close a queue), and give the wait a timeout.",
    "objects": "A destructor of one of the script's objects blocks as the interpreter frees "
    "them: release that object explicitly before the script ends (close(), del), after what "
    "it waits for is done.",
    "native": "A destructor in native code blocks as the script's objects are freed. torch's is "
    "the usual one: a model wrapped in DDP (or another object that holds a process group) "
    "that outlives destroy_process_group() frees the group with the GIL held while the "
    "backend's thread needs the GIL (pytorch/pytorch#56297). Delete such objects (del model) "
    "before destroy_process_group(), and call it last.",
}
UNKNOWN_FIX = (
    "What the exit waits for is not in the evidence: capture the rank's stacks while it hangs "
    "(rankscope capture RUN_DIR, or py-spy dump --pid PID), then look for a thread that is not a "
    "daemon, an exit hook (atexit) or a destructor that does not return."
)


@rule(75)
def stuck_at_exit(ctx: Context) -> Finding | None:
    ended = {r: f for r, f in ctx.facts.items() if f.end_row is not None}
    if not ctx.facts or len(ended) < len(ctx.facts):
        return None  # some rank never ended its script: not an exit
    seen = {r: o for r, f in ended.items() if (o := _outlived(ctx, f)) is not None}
    if not seen:
        return None
    culprits = sorted(seen)
    stacks = ctx.ev.table("stacks")
    waits = {
        r: exit_wait(stacks, r, main_thread=ctx.facts[r].main_thread) if o.stacks else None
        for r, o in seen.items()
    }
    found = [w for w in waits.values() if w is not None]
    hows = {ctx.facts[r].end_how for r in culprits} - {None}
    return Finding(
        cause=Cause.stuck_at_exit,
        culprits=culprits,
        waiting=[],
        facts={
            "ended_how": f" ({', '.join(sorted(str(h) for h in hows))})" if hows else "",
            "lingered": f"{max(o.after_s for o in seen.values()):.1f} s",
            "exit_wait": _waits_text(waits, seen),
            "exit_fix": EXIT_FIXES[found[0].kind] if found else UNKNOWN_FIX,
        },
        refs=[ref for r in culprits for ref in _refs(ctx.facts[r], seen[r])],
    )


@dataclass(frozen=True)
class _Outlived:
    """A rank's process seen alive ``after_s`` after its end event; ``stacks``: its latest
    stacks were taken then (else the stop ended it)."""

    after_s: float
    stacks: bool


def _outlived(ctx: Context, f: RankFacts) -> _Outlived | None:
    """Whether the rank's process was seen alive after its end event, and how long after:
    stacks of it taken later, or the stop that ended it; None when nothing shows it."""
    end_t = ctx.ev.table("events")["t_s"].get(f.end_row)
    if end_t is None or pd.isna(end_t):
        return None
    summary = ctx.ev.table("stack_summary")
    captured = None
    if f.stack_row is not None and f.stack_row < len(summary):
        t = summary["t_s"].iloc[f.stack_row]
        captured = None if pd.isna(t) else float(t) - float(end_t)
    stop_t = ctx.ev.info.get("stop_requested_at")
    stopped = None
    if ctx.ev.stopped and f.signal in ("SIGTERM", "SIGKILL") and isinstance(stop_t, float):
        stopped = stop_t - float(end_t)
    after = max((s for s in (captured, stopped) if s is not None), default=0.0)
    if after <= EXITING_S:
        return None
    return _Outlived(after_s=after, stacks=captured is not None and captured > EXITING_S)


def _refs(f: RankFacts, seen: _Outlived) -> list[EvidenceRef]:
    """The rank's end event, and the stacks taken after it."""
    refs = []
    if f.end_row is not None:
        refs.append(EvidenceRef(table="events", row=f.end_row, rank=f.rank, note="its end"))
    if f.stack_row is not None and seen.stacks:
        note = f"its stacks, {seen.after_s:.1f} s after its end"
        refs.append(EvidenceRef(table="stack_summary", row=f.stack_row, rank=f.rank, note=note))
    return refs


def _waits_text(waits: dict[int, ExitWait | None], seen: dict[int, _Outlived]) -> str:
    """What each rank's exit waits for, in words (once where they all wait alike)."""
    said = {
        r: w.what if w is not None else _SHOWN if seen[r].stacks else _NOT_SEEN
        for r, w in waits.items()
    }
    if len(set(said.values())) == 1:
        return next(iter(said.values()))
    return "; ".join(f"rank {r}: {text}" for r, text in sorted(said.items()))


_NOT_SEEN = "what it waits for is not known (no stacks of it were taken after its end)"
_SHOWN = (
    "what it waits for is not known (its stacks taken after its end show no Python frame of "
    "its main thread: the interpreter's own exit, or a destructor in native code)"
)
