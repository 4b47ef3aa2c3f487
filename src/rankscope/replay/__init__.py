"""Replay: turn a frozen job's evidence into a small CPU job that freezes the same way.

``build(run)`` reads what the diagnosis was derived from (its ``context``: the calls, from the
probe's events when the run has them, exact call sites, else torch's flight-recorder dumps; each
group's members; the wait-for graph; each rank's facts), derives none of it again, and writes a plain torch script (no
rankscope import) that issues every rank's collectives in the recorded order on gloo: the same
process groups (created in the same order on every rank), ops, dtypes and shapes, up to the call
where each rank was left, and ends each rank as the original ended (exit, raise, or stay alive
outside any collective). ``ranks=K`` keeps at most K ranks that still show the divergence and
remaps them; ``scale_down=N`` caps every tensor at N elements. The script's docstring says what
was kept, dropped, remapped and scaled::

    replay = build(load_run("dumps/"), ranks=8, scale_down=1024)
    replay.write("repro.py")   # torchrun --nproc-per-node 8 repro.py
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankscope.analyze import diagnose
from rankscope.analyze.diagnosis import Diagnosis, compact_ranks
from rankscope.collect import load_run
from rankscope.replay import _plan
from rankscope.replay._plan import WORLD, Plan
from rankscope.replay._script import DEFAULT_TIMEOUT_S, Writer, clean
from rankscope.rundir import REPRO

#: The file name the workbench writes into a run directory.
REPRO_NAME = REPRO

__all__ = ["REPRO_NAME", "Replay", "build"]


@dataclass(frozen=True, kw_only=True)
class Replay:
    """A replay script and what it maps from the original job."""

    script: str = field(repr=False)
    """The script's text, written for the file name ``repro.py`` (see :meth:`write`)."""
    header: str = field(repr=False)
    """The script's docstring: what was kept, dropped, remapped and scaled, and how to run it."""
    world_size: int
    """Ranks of the replay (``torchrun --nproc-per-node world_size``)."""
    rank_map: dict[int, int]
    """Original rank -> replay rank, for every kept rank."""
    group_map: dict[str, str | None]
    """Original process-group name -> its name in the replay (``None``: not created)."""
    calls_kept: dict[int, int]
    """Replay rank -> how many calls it replays."""
    dropped_ranks: list[int]
    roles: dict[str, list[int]]
    """Role function -> the replay ranks that run it."""
    source: str
    """``collectives`` (the probe's events) or ``flight_recorder`` (the dumps)."""
    diagnosis: Diagnosis
    """The original's diagnosis."""
    _render: Callable[[str], tuple[str, str]] = field(repr=False, compare=False)

    def remap(self, ranks: Iterable[int]) -> list[int]:
        """Original ranks as replay ranks (dropped ones left out), sorted."""
        return sorted(self.rank_map[r] for r in ranks if r in self.rank_map)

    @property
    def culprit_ranks(self) -> list[int]:
        """The original's culprits, as replay ranks."""
        return self.remap(self.diagnosis.culprit_ranks)

    def command(self, path: str | os.PathLike[str] = REPRO_NAME) -> str:
        """The torchrun command line that runs the script written to ``path``."""
        return f"torchrun --nproc-per-node {self.world_size} {Path(path).name}"

    def write(self, path: str | os.PathLike[str] = REPRO_NAME) -> Path:
        """Write the script to ``path`` (its run instructions name that file); return the path."""
        path = Path(path)
        if path.is_dir():
            path = path / REPRO_NAME
        script, _ = self._render(path.name)
        path.write_text(script)
        return path


def build(
    run: Any,
    *,
    diagnosis: Diagnosis | None = None,
    ranks: int | None = None,
    scale_down: int | None = None,
) -> Replay:
    """The replay of a diagnosed hang or failure.

    Args:
        run: a :class:`rankscope.collect.Run`, or the path of a run directory or of a folder of
            foreign artifacts (flight-recorder dumps and logs), loaded with
            :func:`rankscope.collect.load_run`.
        diagnosis: the run's diagnosis, when already made (else it is made here).
        ranks: keep at most this many ranks: the culprits, enough of the ranks that made the
            divergent call to outvote them, the ranks they wait for, then one of each kind of
            the others; the rest are dropped and the kept ones renumbered from 0.
        scale_down: cap every tensor at this many elements (shapes that differed still differ).

    Raises:
        ValueError: no record of collective calls, a healthy run (no divergence), a failure
            with no collective where the ranks part, or ``ranks`` too small to keep the
            divergence; the message says what to do.
    """
    if ranks is not None and ranks < 1:
        raise ValueError(f"ranks must be at least 1, got {ranks}")
    if scale_down is not None and scale_down < 1:
        raise ValueError(f"scale_down must be at least 1 element, got {scale_down}")
    if isinstance(run, (str, os.PathLike)):
        run = load_run(run)
    path = getattr(run, "path", None)
    name = Path(path).name if path is not None else "the evidence"
    if run.collectives.empty and run.flight_recorder.empty:
        raise ValueError(_nothing_to_replay(run, name))
    if diagnosis is None:
        diagnosis = diagnose(run)
    _check_replayable(diagnosis, name)
    ctx = _plan.facts_of(run, diagnosis)
    calls, members = ctx.calls, ctx.members
    source = _plan.source_of(calls)
    world = sorted(
        set(ctx.ev.world)
        | set(calls["rank"].unique().tolist())
        | {r for m in members.values() for r in m}
    )
    # A rank with no record (no dump, no probe events) cannot be replayed: what it did is unknown.
    evidence = ctx.evidence_ranks | set(diagnosis.culprit_ranks)
    silent = [r for r in world if r not in evidence]
    candidates = [r for r in world if r in evidence]
    waits = {rank: set(w.waits_for) for rank, w in ctx.graph.waits.items()}
    kept = _plan.choose_ranks(candidates, diagnosis, waits, _plan.signatures(calls), ranks)
    new_rank = {r: i for i, r in enumerate(kept)}
    steps = _plan.steps_of(
        run, calls, kept, members, site_ranks=_site_sample(kept, diagnosis, calls)
    )
    ends = _plan.ends_of(ctx.ev, steps)
    steps, trimmed, left = _plan.trim(steps, kept, new_rank)
    steps, dtype_notes = _plan.gloo_dtypes(steps)
    scaled: dict[tuple[int, ...], tuple[int, ...]] = {}
    if scale_down is not None:
        steps, scaled = _plan.scale(steps, scale_down)
    plan = Plan(
        name=name,
        diagnosis=diagnosis,
        source=source,
        world=world,
        silent=silent,
        kept=kept,
        new_rank=new_rank,
        groups=_plan.groups_of(calls, members, new_rank),
        steps=steps,
        ends=ends,
        trimmed=trimmed,
        left_out=left,
        scaled=scaled,
        scale_down=scale_down,
        dtype_notes=dtype_notes,
        sites=source == "collectives" or any(s.site for m in steps.values() for s in m),
    )
    writer = Writer(plan)

    def render(filename: str) -> tuple[str, str]:
        header = _header(plan, writer, filename)
        return writer.script(header), header

    script, header = render(REPRO_NAME)
    return Replay(
        script=script,
        header=header,
        world_size=len(kept),
        rank_map=dict(new_rank),
        group_map={g.name: g.replay_name for g in plan.groups.values()},
        calls_kept={new_rank[r]: len(steps[r]) for r in kept},
        dropped_ranks=[r for r in world if r not in new_rank],
        roles={role.name: [new_rank[r] for r in role.ranks] for role in writer.roles},
        source=source,
        diagnosis=diagnosis,
        _render=render,
    )


#: Ranks whose flight-recorder frames are read for call sites (the others share their roles').
SITE_SAMPLE = 16


def _site_sample(kept: list[int], d: Diagnosis, calls: Any) -> list[int]:
    """The culprits and one rank of each kind first, up to :data:`SITE_SAMPLE` ranks."""
    if len(kept) <= SITE_SAMPLE:
        return kept
    sig = _plan.signatures(calls)
    order = [r for r in d.culprit_ranks if r in kept]
    order += _plan.round_robin([r for r in kept if r not in order], sig)
    return order[:SITE_SAMPLE]


def _nothing_to_replay(run: Any, name: str) -> str:
    problems = getattr(run, "problems", None)
    unread = []
    if problems is not None and len(problems):
        unread = [f"{s}: {r}" for s, r in zip(problems["source"], problems["reason"], strict=True)]
    text = (
        f"nothing to replay in {name}: no flight-recorder dump entries and no probe events of "
        "collective calls were found"
    )
    if unread:
        text += f" (could not read: {'; '.join(unread[:5])}" + ("; ..." if len(unread) > 5 else "")
        text += ")"
    return text + (
        "; pass a run directory, or a folder with every rank's flight-recorder dump "
        "(nccl_trace_rank_<N>, fr.pkl, ...) taken while the job hung "
        "(TORCH_FR_BUFFER_SIZE > 0 before init_process_group)"
    )


def _check_replayable(d: Diagnosis, name: str) -> None:
    if d.verdict == "ok":
        raise ValueError(
            f"no divergence found in {name}: {d.summary} There is nothing to replay; pass the "
            "dumps of the run that froze or failed (taken while it hung, or by the stall "
            "watchdog: rankscope run --on-stall stop)"
        )
    if d.verdict == "launch_error":
        raise ValueError(
            f"{name} failed before its ranks formed a group ({d.summary}); there are no "
            "collective calls to replay: fix the launch first"
        )
    if d.collective is None:
        raise ValueError(
            f"no divergence found in {name}: {d.summary} The ranks did not part in any "
            "collective, so a replay of their calls would only repeat them; look at the failing "
            "rank's own code instead (rankscope diagnose shows where it failed)"
        )


def _pairs(mapping: dict[int, int]) -> str:
    """``0-6 -> 0-6, 63 -> 7``: contiguous runs of the rank map."""
    items = sorted(mapping.items())
    parts = []
    start = 0
    for i in range(1, len(items) + 1):
        if (
            i == len(items)
            or items[i][0] != items[i - 1][0] + 1
            or items[i][1] != items[i - 1][1] + 1
        ):
            (a, x), (b, y) = items[start], items[i - 1]
            parts.append(f"{a} -> {x}" if a == b else f"{a}-{b} -> {x}-{y}")
            start = i
    return ", ".join(parts)


def _who(ranks: Iterable[int], noun: str = "rank") -> str:
    ranks = sorted(ranks)
    if not ranks:
        return f"no {noun}"
    return f"{noun}{'' if len(ranks) == 1 else 's'} {compact_ranks(ranks)}"


def _header(plan: Plan, writer: Writer, filename: str) -> str:
    d = plan.diagnosis
    k, n = len(plan.kept), len(plan.world)
    new = plan.new_rank
    wrap = textwrap.TextWrapper(width=96, break_on_hyphens=False)
    item = textwrap.TextWrapper(
        width=96, initial_indent="    ", subsequent_indent="      ", break_on_hyphens=False
    )
    out = [
        f"Replay of {clean(plan.name, 120)}: {n} ranks -> {k} ranks on CPU (gloo), written by "
        "`rankscope replay`.",
        "",
    ]
    head = d.verdict.upper() + (f": {d.cause_title}" if d.cause else "")
    head += f" (recipe {d.recipe})" if d.recipe else ""
    out += wrap.wrap(f"The original: {head}. {clean(d.summary, 600)}")
    if d.culprit_ranks:
        out.append(
            f"Culprit: original {_who(d.culprit_ranks)} = replay "
            f"{_who(new[r] for r in d.culprit_ranks if r in new)}."
        )
    if plan.source == "collectives":
        out.append("Replayed from: the probe's events (every call, with its call site).")
    elif plan.source == "merged":
        out += wrap.wrap(
            "Replayed from: the probe's events and the flight-recorder dumps together (the "
            "collectives torch issued from C++, such as DDP's buckets, are the recorder's)."
        )
    else:
        out += wrap.wrap(
            "Replayed from: the flight-recorder dumps (each rank's last recorded collectives"
            + ("; call sites from their stack frames)." if plan.sites else "; no call sites).")
        )
    out += [
        "",
        "Run it:",
        f"    torchrun --nproc-per-node {k} {filename}",
        f"    rankscope run --nproc-per-node {k} {filename}",
    ]
    out += wrap.wrap(
        "It freezes (or fails) where the original did; rankscope's stall watchdog captures the "
        f"evidence and stops it. REPLAY_TIMEOUT_S (default {DEFAULT_TIMEOUT_S} s) is the "
        "collective timeout that ends it under bare torchrun."
    )
    out += ["", f"Ranks (original -> replay): {_pairs(new)}."]
    dropped = [r for r in plan.world if r not in new and r not in plan.silent]
    out += wrap.wrap(
        f"Dropped: {_who(dropped)} ({len(dropped)} of {n})." if dropped else "Dropped: no rank."
    )
    if plan.silent:
        what = {
            "collectives": "probe events",
            "flight_recorder": "flight-recorder dump",
        }.get(plan.source, "probe events and no flight-recorder dump")
        out += wrap.wrap(
            f"Not replayed: {_who(plan.silent)}: no {what}, so what it did is unknown; the "
            "others wait for it only if they did in the original."
        )
    out += ["", "Process groups (original -> replay, members as replay ranks):"]
    shown = 0
    hidden = 0
    for g in plan.groups.values():
        if g.name != WORLD and g.replay_name is None:
            hidden += 1
            continue
        if shown >= 24:
            hidden += 1
            continue
        shown += 1
        desc = f" ({clean(g.desc, 40)})" if g.desc else ""
        if g.name == WORLD:
            target = f"the world group, {_who(range(k))}"
        else:
            target = f"group {g.replay_name}, {_who(g.kept)}"
        members = _who(g.members) if g.members else "members unknown"
        out += item.wrap(f"{clean(g.name, 40)}{desc}: {members} -> {target}")
    if hidden:
        out.append(
            f"    ({hidden} more group{'s' if hidden > 1 else ''} with no kept rank: not created)"
        )
    out += ["", "Calls kept per replay rank:"]
    for role in writer.roles:
        ranks = [new[r] for r in role.ranks]
        counts = sorted({len(plan.steps[r]) for r in role.ranks})
        count = "/".join(map(str, counts))
        out += item.wrap(
            f"{_who(ranks)} (original {compact_ranks(role.ranks)}): {count} calls each, "
            f"in {role.name}(); {writer.end_text(role)}"
            if len(ranks) > 1
            else f"rank {ranks[0]} (original {role.ranks[0]}): {count} calls, in "
            f"{role.name}(); {writer.end_text(role)}"
        )
    left = []
    for pg, first in sorted(plan.trimmed.items()):
        left.append(
            f"group {clean(pg, 40)}: some rank's dump starts at #{first}, so every rank replays "
            f"it from #{first} (replay #1)"
        )
    if plan.left_out:
        counts = ", ".join(
            f"{new[r]}: {c}" for r, c in sorted(plan.left_out.items(), key=lambda x: new[x[0]])
        )
        left.append(
            f"calls left out per replay rank (before the common start, or point-to-point with a "
            f"dropped peer): {counts}"
        )
    if left:
        out += ["", "Left out:"]
        for line in left:
            out += item.wrap(line)
    out.append("")
    if plan.scale_down is None:
        out.append("Tensors: as recorded.")
    elif not plan.scaled:
        out.append(f"Tensors: capped at {plan.scale_down} elements; none was larger.")
    else:
        pairs = [
            f"{list(a)}->{list(b)}" for a, b in sorted(plan.scaled.items(), key=lambda x: x[0])
        ]
        more = f", and {len(pairs) - 8} more" if len(pairs) > 8 else ""
        out += wrap.wrap(
            f"Tensors: capped at {plan.scale_down} elements ({len(pairs)} shapes scaled, shapes "
            f"that differed still differ): {', '.join(pairs[:8])}{more}."
        )
    if d.cause in ("shape_mismatch", "dtype_mismatch"):
        out += wrap.wrap(
            "On gloo, ranks that pass different byte counts to one collective can make gloo "
            "abort (SIGABRT in its size check) where NCCL hangs: the replay then fails at the "
            "same call, on the same ranks."
        )
    for old, replacement in sorted(plan.dtype_notes.items()):
        out += wrap.wrap(
            f"dtype {old}: gloo cannot communicate it; replayed as {replacement} (as many bytes "
            "per element)."
        )
    notes: dict[str, str] = {}
    for mine in plan.steps.values():
        for s in mine:
            if s.note:
                notes.setdefault(s.op, s.note)
    if notes:
        out += ["", "Calls replayed differently (see the comments at each call):"]
        for op, note in sorted(notes.items()):
            out += item.wrap(f"{clean(op, 60)}: {clean(note)}")
    return "\n".join(out)
