"""4. ``mismatch``: ranks called different collectives (op, shapes, dtype, root) where their
sequences first part; an extra or skipped call (a branch only some ranks took) is a
rank-conditional collective, a loop some ranks left early is uneven inputs. Asked before any
death: a mismatch can kill a rank (gloo aborts one that receives more bytes than it expects),
which is then its victim."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from rankscope.analyze import align
from rankscope.analyze.calls import BARRIER_OPS, done, opt
from rankscope.analyze.causes import CAUSES, Cause
from rankscope.analyze.context import Context
from rankscope.analyze.diagnosis import who_of
from rankscope.analyze.rules.finding import Decided, Finding, rule
from rankscope.analyze.rules.loops import fewer_calls, left_the_loop, thread_notes
from rankscope.analyze.wording import at, error_refs, short, site_of
from rankscope.state import agree, shapes_text
from rankscope.waitfor import Call, differs


def root_divergence(ctx: Context, divs: list[align.Divergence]) -> align.Divergence:
    """The divergence that explains the others. A group whose missing ranks are all busy in
    another divergent collective only waits for that one; of the rest, the earliest."""
    in_flight = {}
    for d in divs:
        for r in d.rows["rank"][~done(d.rows)].tolist():
            in_flight[r] = d
    unexplained = [
        d for d in divs if not d.missing or any(in_flight.get(r) in (None, d) for r in d.missing)
    ]
    return min(unexplained or divs, key=lambda d: _earliest(d.rows))


@rule(40)
def mismatch(ctx: Context) -> Finding | None:
    divs = ctx.divergences
    if not divs:
        return None
    d = root_divergence(ctx, divs)
    if not d.mismatched:
        return None
    found = _mismatch(ctx, d)
    waiting, notes = set(found.waiting), list(found.notes)
    for other in divs:
        held = sorted(set(other.rows["rank"][~done(other.rows)].tolist()) - set(found.culprits))
        if other is d or not held:
            continue
        waiting |= set(held)
        notes.append(
            f"{who_of(held)} also waited, in {other.rows['op'].iloc[0]} ({ctx.label(other)})"
            + (f", for {who_of(other.missing)}" if other.missing else "")
        )
    return replace(found, waiting=sorted(waiting), notes=notes)


def _mismatch(ctx: Context, d: align.Divergence) -> Finding:
    rows = d.rows
    groups = {k: sorted(g["rank"].tolist()) for k, g in rows.groupby("key")}
    most = max(len(g) for g in groups.values())
    tied = [k for k, g in groups.items() if len(g) == most]
    # The usual call is the reference; between equal camps, the one the ranks made before;
    # and whatever the counts, not the side that the parting line sends another way.
    norm_key = max(tied, key=lambda k: (_familiarity(ctx, d, k), -groups[k][0]))
    parted = _parted_side(ctx, groups)
    if parted is not None:
        norm_key, tied = next(k for k in groups if k != parted), []
    norm = rows[rows["key"] == norm_key]
    odd = rows[rows["key"] != norm_key]
    told = _told_by_paths(ctx, d)
    if told is not None:  # the classes of the paths, where they tell the side that left
        odd, norm = rows[rows["rank"].isin(told)], rows[~rows["rank"].isin(told)]
        norm_key, tied = int(norm["key"].mode().iloc[0]), []
    culprits = sorted(odd["rank"].tolist())
    waiting = sorted(norm["rank"][~done(norm)].tolist())
    o, n = odd.iloc[0], norm.iloc[0]
    norm_ranks = sorted(norm["rank"].tolist())
    sites = ctx.sites(rows)
    facts = {
        "culprit_op": o["op"],
        "other_op": n["op"],
        "culprit_site": site_of(sites, odd),
        "other_site": site_of(sites, norm),
        "culprit_shapes": shapes_text(o["shapes"]),
        "other_shapes": shapes_text(n["shapes"]),
        "culprit_dtypes": o["dtypes"],
        "other_dtypes": n["dtypes"],
        "collective": ctx.label(d),
    }
    notes = _tie_note(ctx, d, groups, tied, norm_key)
    differ = differs(call_of(o), call_of(n))
    branch = took_a_branch(
        culprits,
        doing=f"called {o['op']}{at(facts['culprit_site'])}",
        others_doing=f"called {n['op']}{at(facts['other_site'])}",
    )
    # Out of data: the odd ranks left a loop the others are still in (for another op, the
    # barrier that follows the loop: a data collective elsewhere is a different call, not the
    # loop's end); else a branch only they took: an extra call, or (another op) one skipped.
    decided = _decide_ran_out(
        ctx, culprits, norm, o, facts["culprit_site"], only_evidence=differ != "op"
    )
    if decided is None and (
        (differ == "op" and _extra_or_skipped(ctx, d, odd, norm))
        or _extra_call(ctx, culprits, norm_ranks)
    ):
        decided = branch
    if decided is None and _extra_iteration(ctx, culprits, norm_ranks):
        decided = took_a_branch(
            culprits,
            doing=f"made one more pass of the loop at {ctx.parting(culprits, norm_ranks)[0].site}"
            f" and called {o['op']}{at(facts['culprit_site'])}",
            others_doing=f"had left it and called {n['op']}{at(facts['other_site'])}",
        )
    decided = decided or different_call(culprits, differ, o, n)
    notes += decided.notes + (thread_notes(ctx, odd) if differ == "op" else [])
    cause = decided.cause
    facts.update(decided.facts)
    facts["others"] = who_of(sorted(norm["rank"].tolist()))
    if d.missing:
        notes.append(f"{who_of(d.missing)} never made this call")
    errors = ctx.ev.table("errors")
    detail = errors[errors["kind"] == "collective_mismatch"]
    if not detail.empty:
        notes.append(f"TORCH_DISTRIBUTED_DEBUG=DETAIL reported: {short(detail['message'].iloc[0])}")
    return Finding(
        cause=cause,
        culprits=culprits,
        waiting=waiting,
        facts=facts,
        collective=ctx.collective(d, sites=sites),
        refs=ctx.call_refs(d) + error_refs(detail, "DETAIL mismatch"),
        notes=notes,
    )


def call_of(row: pd.Series) -> Call:
    """The call of a row of the calls table, as the same-call rule compares it."""
    root = row["root"]
    root = None if pd.isna(root) else int(root)
    return Call(op=str(row["op"]), shapes=row["shapes"], dtypes=row["dtypes"], root=root)


def _told_by_paths(ctx: Context, d: align.Divergence) -> list[int] | None:
    """The culprits of the first divergence of the paths where it is this one (the same group
    and call) and its classes tell them by their size or by a call new on the group; None
    where they do not, or every rank at this call would be a culprit."""
    fd = ctx.first_divergence
    if (
        fd is None
        or (fd.pg, fd.seq) != (d.pg, d.seq)
        or fd.decided_by not in ("fewer", "new", "branch")
    ):
        return None
    own, other = fd.culprit_class(), fd.other_class()
    if (
        own is not None
        and own.row is not None
        and other.row is not None
        and ctx.made_before(own.row)
        and not ctx.made_before(other.row)
    ):  # the culprits repeat a call while the others moved on: the others ran short of it
        return None
    present = set(d.rows["rank"].tolist())
    told = sorted(set(fd.culprits) & present)
    return told if told and set(told) != present else None


def _tie_note(
    ctx: Context,
    d: align.Divergence,
    groups: dict[int, list[int]],
    tied: list[int],
    norm_key: int,
) -> list[str]:
    """Why one side is named when the sides are as many (two ranks, one each): the other
    side's call is the one the ranks made before on this group, or, where neither was, that
    the evidence cannot tell and the choice went by rank order."""
    if len(tied) < 2:
        return []
    norm_rows = d.rows[d.rows["key"] == norm_key]
    usual = _familiarity(ctx, d, norm_key)
    others = [_familiarity(ctx, d, k) for k in tied if k != norm_key]
    named = who_of(sorted(r for k, g in groups.items() if k != norm_key for r in g))
    if usual > max(others):
        return [
            f"the sides are as many; {named} is named because the others' call "
            f"({norm_rows['op'].iloc[0]}) is the one the ranks made {usual} time(s) before on "
            "this group, and its own is not"
        ]
    return [
        f"the sides are as many and neither call was made before on this group: the evidence "
        f"does not tell which side left the common path; {named} is named by rank order only"
    ]


def _familiarity(ctx: Context, d: align.Divergence, key: int) -> int:
    """How often the ranks made this very call on the group before."""
    calls = ctx.calls
    earlier = calls[(calls["pg"] == d.pg) & (calls["seq"] < d.seq)]
    return int((earlier["key"] == key).sum())


def _extra_or_skipped(
    ctx: Context, d: align.Divergence, odd: pd.DataFrame, norm: pd.DataFrame
) -> bool:
    """An extra or skipped collective rather than a different one: a barrier on one side only,
    or the two sequences line up again when shifted by one."""
    ops_odd, ops_norm = set(odd["op"].astype(str)), set(norm["op"].astype(str))
    if bool(ops_odd & BARRIER_OPS) != bool(ops_norm & BARRIER_OPS):
        return True
    nxt = ctx.calls[(ctx.calls["pg"] == d.pg) & (ctx.calls["seq"] == d.seq + 1)]
    odd_next = set(nxt[nxt["rank"].isin(odd["rank"])]["op"].astype(str))
    norm_next = set(nxt[nxt["rank"].isin(norm["rank"])]["op"].astype(str))
    return bool(odd_next & ops_norm) or bool(norm_next & ops_odd)


def _parted_side(ctx: Context, groups: dict[int, list[int]]) -> int | None:
    """Of two camps, the key of the one the parting line sends another way (the ranks that
    left a loop the others are in, or took a branch the others passed by), or None."""
    if len(groups) != 2:
        return None
    first, second = groups
    p, _ = ctx.parting(groups[first], groups[second])
    if p is None or p.arms:
        return None
    gone = set(p.ranks_out if p.kind in ("for", "while") else p.ranks_in)
    return first if gone == set(groups[first]) else second if gone == set(groups[second]) else None


def _decide_ran_out(
    ctx: Context,
    culprits: list[int],
    norm: pd.DataFrame,
    own: pd.Series,
    culprit_site: str | None,
    *,
    only_evidence: bool = False,
) -> Decided | None:
    """Whether the culprits ran out of iterations of the loop the others are still in
    (:func:`ran_out`): they made its call fewer times, and left it (for a barrier after it, the
    counts may say so when nothing else can; for any other call, the stacks or the source
    must); None when they did not, or the evidence cannot tell."""
    peers = sorted(norm["rank"].tolist())
    fewer = fewer_calls(ctx, culprits, norm.index[0], peers, current=True)
    if fewer is None:
        return None
    if _off_the_main_thread(ctx, culprits, own):
        return None  # their main thread made no call here: it left no loop
    left = left_the_loop(ctx, culprits, peers, norm.iloc[0], own)
    ended = set(str(own["op"]).split()) <= BARRIER_OPS
    if left is None:
        if only_evidence or not ended:
            return None
        # Fewer calls, then a barrier: out of data, or a branch that added a barrier inside
        # the loop. Only where they were tells, and that did not arrive: no guess.
        return undetermined(
            culprits,
            unknown=f"whether {who_of(culprits)} left the loop the others are in or took a "
            f"branch inside it is not known: {fewer}, and no stacks or source show where "
            f"{agree(who_of(culprits), 'it was', 'they were')}" + ctx.late_evidence(culprits),
            possible=("uneven_inputs", "rank_conditional_collective"),
        )
    if not left:
        return None
    return ran_out(culprits, done=fewer, went=f"went on to {own['op']}{at(culprit_site)}")


def _off_the_main_thread(ctx: Context, culprits: list[int], own: pd.Series) -> bool:
    """The culprits' call was made from a thread other than their main thread (as the probe
    recorded it): the main thread that runs the loop did not leave it for this call."""
    f = ctx.facts.get(culprits[0])
    main = f.main_thread if f is not None else None
    thread = opt(own["thread"]) if "thread" in own.index else None
    return bool(main and thread and str(thread) != main)


def undetermined(culprits: list[int], *, unknown: str, possible: Sequence[str]) -> Decided:
    """``undetermined`` (named here alone): the evidence that tells the ``possible`` causes
    (their names) apart did not arrive; ``unknown`` says what is not known and why."""
    causes = [CAUSES[name] for name in possible]
    return Decided(
        Cause.undetermined,
        culprits,
        {
            "unknown": unknown,
            "possible": "; ".join(
                f"{c.title}{f', recipe {c.recipe}' if c.recipe else ''}" for c in causes
            ),
        },
    )


def ran_out(culprits: list[int], *, done: str, went: str, notes: Sequence[str] = ()) -> Decided:
    """``uneven_inputs`` (named here alone): the culprits ran out of iterations of a loop the
    others are still in: they made its call fewer times (``done``: ``3 calls of all_reduce at
    train.py:9 where rank 0 is making its 4th``), then went on elsewhere (``went``)."""
    return Decided(
        Cause.uneven_inputs, culprits, {"culprit_done": done, "culprit_went": went}, list(notes)
    )


def took_a_branch(
    culprits: list[int], *, doing: str, others_doing: str, notes: Sequence[str] = ()
) -> Decided:
    """``rank_conditional_collective`` (named here alone): the culprits made a call the others
    do not make there, or skipped one they make (``doing``), while the others
    ``others_doing``: a branch only some ranks took."""
    return Decided(
        Cause.rank_conditional_collective,
        culprits,
        {"culprit_doing": doing, "other_doing": others_doing},
        list(notes),
    )


#: The cause of two calls that differ, by what differs first (:func:`rankscope.waitfor.differs`).
DIFFERENT_CALL: Mapping[str | None, Cause] = {
    "op": Cause.op_mismatch,
    "shapes": Cause.shape_mismatch,
    "dtypes": Cause.dtype_mismatch,
    "root": Cause.root_mismatch,
}


def different_call(culprits: list[int], differ: str | None, odd: Any, norm: Any) -> Decided:
    """The culprits' call differs from the others' in ``differ`` (``op``, ``shapes``, ``dtypes``
    or ``root``; :data:`DIFFERENT_CALL`); a root mismatch names both roots. ``odd`` and
    ``norm``: a row (or fingerprint) of each side, for their roots."""
    cause = DIFFERENT_CALL[differ or "root"]  # keys that differ in nothing it compares: a root
    facts = {}
    if cause == Cause.root_mismatch:
        facts = {
            "culprit_root": opt(odd["root"]) or "unknown",
            "other_root": opt(norm["root"]) or "unknown",
        }
    return Decided(cause, culprits, facts)


def _extra_call(ctx: Context, culprits: list[int], others: list[int]) -> bool:
    """Whether the culprits' call was made from a branch the others passed by (the parting
    line: a branch one side took, not two arms of one ``if``, nor a loop, nor a branch that
    only set what the call names): an extra call."""
    p, _ = ctx.parting(culprits, others)
    return (
        p is not None
        and not (p.arms or p.left_loop or p.assigned)
        and set(culprits) <= set(p.ranks_in)
    )


def _extra_iteration(ctx: Context, culprits: list[int], others: list[int]) -> bool:
    """Whether the culprits' call is one more pass of a loop the others had left, where their
    paths first parted (the parting line of their paths there: a loop the culprits are in)."""
    fd = ctx.first_divergence
    if fd is None or set(fd.culprits) != set(culprits):
        return False
    p, _ = ctx.parting(culprits, others)
    return p is not None and p.kind in ("for", "while") and set(culprits) <= set(p.ranks_in)


def _earliest(rows: pd.DataFrame) -> float:
    start = rows["t_start_s"].min()
    return np.inf if pd.isna(start) else float(start)
