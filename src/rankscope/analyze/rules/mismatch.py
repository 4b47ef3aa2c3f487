"""4. ``mismatch``: ranks called different collectives (op, shapes, dtype, root) where their
sequences first part; an extra or skipped call (a branch only some ranks took) is a
rank-conditional collective, a loop some ranks left early is uneven inputs. Asked before any
death: a mismatch can kill a rank (gloo aborts one that receives more bytes than it expects),
which is then its victim."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from rankscope.analyze import align
from rankscope.analyze.calls import BARRIER_OPS, done, opt
from rankscope.analyze.causes import Cause
from rankscope.analyze.context import Context
from rankscope.analyze.diagnosis import who_of
from rankscope.analyze.rules.finding import Finding
from rankscope.analyze.rules.loops import fewer_calls, left_the_loop, thread_notes
from rankscope.analyze.wording import at, error_refs, short, site_of
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
        "culprit_shapes": o["shapes"],
        "other_shapes": n["shapes"],
        "culprit_dtypes": o["dtypes"],
        "other_dtypes": n["dtypes"],
        "collective": ctx.label(d),
    }
    notes = _tie_note(ctx, d, groups, tied, norm_key)
    differ = differs(_call(o), _call(n))
    if differ == "op":
        # Out of data: the odd ranks left a loop the others are still in, for the barrier that
        # follows it (a data collective elsewhere is a different call, not the loop's end).
        if _ran_out(ctx, culprits, norm, o, facts, notes):
            cause = Cause.uneven_inputs
        elif _extra_or_skipped(ctx, d, odd, norm) or _extra_call(ctx, culprits, norm_ranks):
            cause = Cause.rank_conditional_collective
        else:
            cause = Cause.op_mismatch
        notes += thread_notes(ctx, odd)
    elif _ran_out(ctx, culprits, norm, o, facts, notes, only_evidence=True):
        cause = Cause.uneven_inputs
    elif _extra_call(ctx, culprits, norm_ranks):
        # the same op with other tensors, but made from a branch the others passed by
        cause = Cause.rank_conditional_collective
    elif differ == "shapes":
        cause = Cause.shape_mismatch
    elif differ == "dtypes":
        cause = Cause.dtype_mismatch
    else:
        cause = Cause.root_mismatch
        facts["culprit_root"] = opt(o["root"]) or "unknown"
        facts["other_root"] = opt(n["root"]) or "unknown"
    if cause == Cause.rank_conditional_collective:
        facts["culprit_doing"] = f"called {o['op']}{at(facts['culprit_site'])}"
        facts["other_doing"] = f"called {n['op']}{at(facts['other_site'])}"
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


def _call(row: pd.Series) -> Call:
    root = row["root"]
    root = None if pd.isna(root) else int(root)
    return Call(op=str(row["op"]), shapes=row["shapes"], dtypes=row["dtypes"], root=root)


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


def _ran_out(
    ctx: Context,
    culprits: list[int],
    norm: pd.DataFrame,
    own: pd.Series,
    facts: dict[str, Any],
    notes: list[str],
    *,
    only_evidence: bool = False,
) -> bool:
    """Whether the culprits ran out of iterations of the loop the others are still in: they
    made its call fewer times, and left it (for a barrier after it, the counts may say so when
    nothing else can; for any other call, the stacks or the source must). Sets the facts."""
    peers = sorted(norm["rank"].tolist())
    fewer = fewer_calls(ctx, culprits, norm.index[0], peers, current=True)
    if fewer is None:
        return False
    left = left_the_loop(ctx, culprits, peers, norm.iloc[0], own)
    ended = set(str(own["op"]).split()) <= BARRIER_OPS
    if left is None:
        if only_evidence or not ended:
            return False
        notes.append(
            "whether the culprits left the loop is inferred from their counts of calls alone: "
            "no stacks or source show where they were"
        )
    elif not left:
        return False
    facts["culprit_done"] = fewer
    facts["culprit_went"] = f"went on to {own['op']}{at(facts['culprit_site'])}"
    return True


def _extra_call(ctx: Context, culprits: list[int], others: list[int]) -> bool:
    """Whether the culprits' call was made from a branch the others passed by (the parting
    line: a branch one side took, not two arms of one ``if``, nor a loop): an extra call."""
    p, _ = ctx.parting(culprits, others)
    return p is not None and not p.arms and not p.left_loop and set(culprits) <= set(p.ranks_in)


def _earliest(rows: pd.DataFrame) -> float:
    start = rows["t_start_s"].min()
    return np.inf if pd.isna(start) else float(start)
