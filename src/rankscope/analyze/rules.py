"""The rules of a diagnosis: each a function of a :class:`~rankscope.analyze.context.Context`
that answers with a :class:`Finding` or passes (``None``).

:data:`RULES` runs them in this order, and the first that answers decides:

1. ``launch_error``: the ranks never formed a group (environment, port, rendezvous, hostfile).
2. ``model_mismatch``: DDP's constructor found models that differ across ranks; its texts name
   each rank's parameters, and the odd ones out are the culprits (every rank raised).
3. ``reported_failure``: a rank reported a failure of its own (an exception outside any
   collective, an OOM, a NaN, DDP's reduction error) and left the others waiting.
4. ``mismatch``: ranks called different collectives (op, shapes, dtype) where their sequences
   first part. This comes before any death: a mismatch can kill a rank (gloo aborts one that
   receives more bytes than it expects), which is then its victim.
5. ``signal_death``: a rank died of a signal (SIGKILL, SIGSEGV, SIGABRT, ...) that no text of
   its own blames on a peer.
6. ``stream_stuck``: a collective that some ranks' devices started and others' never did
   (nccl with timing, from the recorder's entry states): those ranks' streams are held by
   earlier work.
7. ``waits``: the wait-for graph across every group leads to the culprit: a rank waited on that
   waits for nobody (what was it doing instead: exited, crashed, out of data, blocked on a lock
   or a sleep, busy elsewhere, silent), or, where every rank waits, the rank of a cycle that left
   the program order the others share (a skipped call, a point-to-point cycle), or every rank
   stuck in one collective.
8. ``errors_only``: no record of calls says anything, the error texts may (DETAIL fingerprints,
   monitored_barrier, timeouts in foreign logs).
9. ``bare_exit``: a rank exited non-zero and nothing else says why.
10. ``straggler``: every collective completed, but one rank arrived far behind (``ok``).

A rule is a plain function: test it on a context built from tables (see the tests).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from rankscope.analyze import align
from rankscope.analyze.activity import WAITS, passed, user_path
from rankscope.analyze.calls import BARRIER_OPS, MANAGEMENT_OPS
from rankscope.analyze.catalogue import FAILURE_KINDS, LAUNCH_KINDS
from rankscope.analyze.context import (
    MAX_REFS,
    Context,
    Where,
    at,
    done,
    error_refs,
    failed,
    opt,
    opt_int,
    short,
    site_of,
    who_of,
)
from rankscope.analyze.diagnosis import CollectiveInfo, EvidenceRef
from rankscope.analyze.evidence import SIGNAL_TEXT, RankFacts, crash_cause
from rankscope.analyze.waits import Wait, departed
from rankscope.collect import VICTIM_ROLES, short_site
from rankscope.waitfor import Call, differs


@dataclass(kw_only=True)
class Finding:
    """A cause with its facts, before it becomes a :class:`~rankscope.analyze.Diagnosis`."""

    cause: str
    culprits: list[int]
    waiting: list[int]
    facts: dict[str, Any] = field(default_factory=dict)
    collective: CollectiveInfo | None = None
    refs: list[EvidenceRef] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class Failure:
    """A rank's own failure."""

    t_s: float
    rank: int
    cause: str
    message: str
    ref: EvidenceRef | None
    site: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)


Rule = Callable[[Context], "Finding | None"]


# --- 1. launch --------------------------------------------------------------------------------
def launch_error(ctx: Context) -> Finding | None:
    calls = ctx.calls
    if (calls["seq"].notna() & calls["completed"].fillna(False).astype(bool)).any():
        return None
    errors = ctx.ev.table("errors")
    launch = errors[errors["kind"].isin(list(LAUNCH_KINDS))]
    if not launch.empty:
        launch = launch.sort_values("t_s", kind="stable", na_position="last")
        kind = str(launch["kind"].iloc[0])
        same = launch[launch["kind"] == kind]
        culprits = sorted(set(same["rank"].dropna().astype(int).tolist()))
        return Finding(
            cause=LAUNCH_KINDS[kind],
            culprits=culprits,
            waiting=[],
            facts={
                "error": short(same["message"].iloc[0]),
                "culprits": who_of(culprits, "the process"),
            },
            refs=error_refs(same, "the launch failed"),
        )
    probe = ctx.ev.table("collectives")
    setup = probe[probe["op"].isin(list(MANAGEMENT_OPS)) & failed(probe)]
    if not setup.empty:
        culprits = sorted(set(setup["rank"].astype(int).tolist()))
        refs = [
            EvidenceRef(table="collectives", row=int(pos), rank=int(r), note=f"{op} failed")
            for pos, r, op in zip(setup.index, setup["rank"], setup["op"], strict=True)
        ]
        return Finding(
            cause="launch_failed",
            culprits=culprits,
            waiting=[],
            facts={"error": short(setup["error"].iloc[0])},
            refs=refs,
        )
    if ctx.ev.info.get("state") == "failed_to_start":
        error = ctx.ev.info.get("error") or "torchrun failed before any rank started"
        return Finding(cause="launch_failed", culprits=[], waiting=[], facts={"error": error})
    return None


# --- 2. texts that name the odd rank -----------------------------------------------------------
def model_mismatch(ctx: Context) -> Finding | None:
    """DDP's constructor compared the ranks' models and every rank raised: its texts name each
    rank's count of parameters (or the shapes that differ from rank 0's); the ranks whose model
    differs from most are the culprits, the others failed because of them."""
    errors = ctx.ev.table("errors")
    counts = errors[errors["kind"] == "ddp_model_mismatch"]
    shapes = errors[errors["kind"] == "ddp_param_shape_mismatch"]
    seen: dict[int, int] = {}
    for fields in counts["fields"]:
        if isinstance(fields, dict):
            for side in "ab":
                rank, count = fields.get(f"rank_{side}"), fields.get(f"count_{side}")
                if isinstance(rank, int) and isinstance(count, int):
                    seen[rank] = count
    rows = counts
    if len(set(seen.values())) > 1:
        by_count: dict[int, list[int]] = {}
        for rank, count in sorted(seen.items()):
            by_count.setdefault(count, []).append(rank)
        usual = max(by_count, key=lambda c: len(by_count[c]))
        if sum(len(r) == len(by_count[usual]) for r in by_count.values()) > 1:
            return None  # as many ranks on each side: the texts do not say which is odd
        culprits = sorted(r for c, ranks in by_count.items() if c != usual for r in ranks)
        mine = {seen[r] for r in culprits}
        facts = {
            "culprit_model": "/".join(map(str, sorted(mine))) + " parameters",
            "other_model": f"{usual} parameters",
        }
    elif not shapes.empty:
        reporters = sorted(set(shapes["rank"].dropna().astype(int).tolist()))
        first = shapes["fields"].iloc[0] if isinstance(shapes["fields"].iloc[0], dict) else {}
        ref = first.get("rank_b", 0)
        others = sorted(set(ctx.facts) - set(reporters) - {ref})
        # every rank but the reference found its shapes unlike the reference's: the reference
        culprits = [ref] if len(reporters) > 1 and not others else reporters
        rows = shapes
        facts = {
            "culprit_model": f"parameter {first.get('param')} of shape {first.get('sizes')}",
            "other_model": f"rank {ref}'s",
        }
    else:
        return None
    if not culprits:
        return None
    others = sorted(set(ctx.facts) - set(culprits))
    return Finding(
        cause="ddp_model_mismatch",
        culprits=culprits,
        waiting=[],
        facts={
            **facts,
            "error": short(rows["message"].iloc[0]),
            "culprit_site": _log_site(ctx, rows),
            "others": who_of(others),
        },
        refs=error_refs(rows, "DDP compared the models across ranks"),
    )


# --- 3. a failure a rank reported -------------------------------------------------------------
def failures(ctx: Context) -> list[Failure]:
    """Every rank's own failure that it reported (not a collective that failed because of a
    peer), earliest first: an exception raised outside any collective, or an error of its own
    in its logs."""
    probe = ctx.ev.table("collectives")
    broke = probe[failed(probe)]
    raised_in_call = {(int(r), str(e)) for r, e in zip(broke["rank"], broke["error"], strict=True)}
    errors = ctx.ev.table("errors")
    own = errors[errors["kind"].isin(list(FAILURE_KINDS)) & errors["rank"].notna()]
    kinds = {int(r): FAILURE_KINDS[str(k)] for r, k in zip(own["rank"], own["kind"], strict=True)}
    out = []
    for rank, f in ctx.facts.items():
        if f.exception is None or any(r == rank and f.exception in e for r, e in raised_in_call):
            continue
        if _victims_text(errors, rank, f.exception):
            continue  # raised outside the Python calls (a backward's bucket all_reduce, a
            # wait on a Work) by a text that makes it a victim: the waits say for whom
        note = "exception outside any collective"
        out.append(
            Failure(
                t_s=f.exception_s or np.inf,
                rank=rank,
                cause=kinds.get(rank) or crash_cause(f.exception),
                message=f.exception,
                ref=EvidenceRef(table="events", row=f.exception_row, rank=rank, note=note),
            )
        )
    for pos, row in zip(own.index, own.itertuples(index=False), strict=True):
        if any(o.rank == int(row.rank) for o in out):
            continue
        out.append(
            Failure(
                t_s=np.inf if pd.isna(row.t_s) else float(row.t_s),
                rank=int(row.rank),
                cause=FAILURE_KINDS[str(row.kind)],
                message=str(row.message),
                ref=EvidenceRef(
                    table="errors", row=int(pos), rank=int(row.rank), note=str(row.kind)
                ),
            )
        )
    return sorted(out, key=lambda o: (o.t_s, o.rank))


def reported_failure(ctx: Context) -> Finding | None:
    return crash(ctx, failures(ctx))


def _victims_text(errors: pd.DataFrame, rank: int, exception: str) -> bool:
    """The rank's exception is an error text whose role makes it a victim (a peer's exit or
    timeout, NCCL's remote error), as its logs show it."""
    mine = errors[(errors["rank"] == rank) & errors["role"].isin(list(VICTIM_ROLES))]
    head = exception.split("\n", 1)[0]
    return any(head[:80] in str(m) or str(m)[:80] in exception for m in mine["message"])


def deaths(ctx: Context, *, bare: bool = False) -> list[Failure]:
    """Ranks that died without a word, earliest first: killed or crashed by a signal
    (``bare=False``), or only a non-zero exit code (``bare=True``: weaker than any other
    evidence, so asked last). Not a rank ended by a teardown or a stop, one whose call failed,
    nor one whose own texts say it waited on others."""
    probe = ctx.ev.table("collectives")
    victims = set(probe.loc[failed(probe), "rank"].dropna().astype(int).tolist())
    victims |= ctx.ev.waiters
    reported = {f.rank for f in failures(ctx)}
    out = []
    for rank, f in ctx.facts.items():
        if f.died is None or rank in victims or rank in reported or f.exception:
            continue
        if ctx.ev.terminated(f.exit_code) or bool(f.signal) == bare:
            continue
        out.append(_death(ctx, f))
    return sorted(out, key=lambda o: (o.t_s, o.rank))


def _death(ctx: Context, f: RankFacts) -> Failure:
    """A rank that died without an error of its own: killed, crashed in native code, or an exit
    code with no exception. The time is its last record (it died after that)."""
    note = f.died or "died"
    ref = None if f.row is None else EvidenceRef(table="ranks", row=f.row, rank=f.rank, note=note)
    # Stacks from the fatal signal itself (faulthandler) show where it crashed; older captures
    # show where it was then, not where it died.
    site = f.stack_site if f.signal and f.stack_reason == f.signal else None
    last = ctx.last.loc[f.rank] if f.rank in ctx.last.index else None
    after = ""
    if last is not None:
        state = "which returned" if done(last.to_frame().T).iloc[0] else "still in flight"
        after = f" after its last recorded call ({last['op']}{at(opt(last['site']))}, {state})"
    elif f.last_seen_s is not None:
        after = " after its last recorded event"
    if f.signal == "SIGKILL":
        return Failure(
            t_s=f.last_seen_s or np.inf,
            rank=f.rank,
            cause="rank_killed",
            message=f"{f.signal} ({SIGNAL_TEXT[f.signal]})",
            ref=ref,
            site=site,
            facts={"death": f"was killed by SIGKILL (exit code {f.exit_code}){after}"},
        )
    if f.signal:
        text = SIGNAL_TEXT.get(f.signal)
        message = f"{f.signal}" + (f" ({text})" if text else "")
    else:
        message = f"exit code {f.exit_code} and no exception"
    return Failure(
        t_s=f.last_seen_s or np.inf,
        rank=f.rank,
        cause="rank_crashed",
        message=message + after,
        ref=ref,
        site=site,
    )


def signal_death(ctx: Context) -> Finding | None:
    return crash(ctx, deaths(ctx))


def bare_exit(ctx: Context) -> Finding | None:
    return crash(ctx, deaths(ctx, bare=True))


def crash(ctx: Context, found: list[Failure]) -> Finding | None:
    """The earliest of these failures is the cause; the ranks that failed the same way with it
    are the culprits."""
    if not found:
        return None
    first = found[0]
    same = [f for f in found if f.cause == first.cause]
    culprits = sorted({f.rank for f in same})
    if first.ref is not None and first.ref.table in ("events", "errors"):
        site = ctx.ev.traceback_site(first.rank, first.message) or ctx.facts[first.rank].stack_site
    else:
        site = first.site
    div = ctx.divergence_with(set(culprits))
    waiting = ctx.blocked(exclude=set(culprits))
    facts = {"error": short(first.message), "culprit_site": site, **first.facts}
    if first.cause == "rank_killed":
        facts["left"] = "waiting"
        ended = sorted(r for r, f in ctx.facts.items() if r not in culprits and f.died)
        if not waiting and ended:
            how = sorted({ctx.facts[r].signal or f"exit {ctx.facts[r].exit_code}" for r in ended})
            facts["others"] = who_of(ended)
            facts["left"] = f"to be ended by {'/'.join(how)} (torchrun's teardown)"
    return Finding(
        cause=first.cause,
        culprits=culprits,
        waiting=waiting,
        facts=facts,
        collective=ctx.collective(div) if div else None,
        refs=[f.ref for f in same if f.ref is not None][:MAX_REFS]
        + (ctx.call_refs(div) if div else []),
        notes=[f"rank {f.rank} also failed: {short(f.message)}" for f in found if f not in same],
    )


# --- 4. different calls where the sequences part ----------------------------------------------
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
    for other in divs:
        held = sorted(set(other.rows["rank"][~done(other.rows)].tolist()) - set(found.culprits))
        if other is d or not held:
            continue
        found.waiting = sorted(set(found.waiting) | set(held))
        found.notes.append(
            f"{who_of(held)} also waited, in {other.rows['op'].iloc[0]} ({ctx.label(other)})"
            + (f", for {who_of(other.missing)}" if other.missing else "")
        )
    return found


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
    differ = differs(_call_of(o), _call_of(n))
    if differ == "op":
        # Out of data: the odd ranks left a loop the others are still in, for the barrier that
        # follows it (a data collective elsewhere is a different call, not the loop's end).
        if _ran_out(ctx, culprits, norm, o, facts, notes):
            cause = "uneven_inputs"
        elif _extra_or_skipped(ctx, d, odd, norm) or _extra_call(ctx, culprits, norm_ranks):
            cause = "rank_conditional_collective"
        else:
            cause = "op_mismatch"
        notes += _thread_notes(ctx, odd)
    elif _ran_out(ctx, culprits, norm, o, facts, notes, only_evidence=True):
        cause = "uneven_inputs"
    elif _extra_call(ctx, culprits, norm_ranks):
        # the same op with other tensors, but made from a branch the others passed by
        cause = "rank_conditional_collective"
    elif differ == "shapes":
        cause = "shape_mismatch"
    elif differ == "dtypes":
        cause = "dtype_mismatch"
    else:
        cause = "root_mismatch"
        facts["culprit_root"] = opt(o["root"]) or "unknown"
        facts["other_root"] = opt(n["root"]) or "unknown"
    if cause == "rank_conditional_collective":
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


def _call_of(row: pd.Series) -> Call:
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


def _fewer(
    ctx: Context, culprits: list[int], call: Any, peers: list[int], *, current: bool = False
) -> str | None:
    """``3 calls of all_reduce at train.py:16 where rank 0 is making its 4th``: the culprits
    made the call at ``calls.loc[call]`` (the same line, on the same group) fewer times than
    ``peers``, which kept repeating it: they ran out of iterations of a loop the peers are
    still in (``current``: the peers' count includes the call they are in now). None when the
    call is no loop's, or the culprits made it as often."""
    calls = ctx.calls
    ref = calls.loc[call]
    pg = str(ref["pg"])
    mine = calls[(calls["pg"].astype(str) == pg) & (calls["key"] == ref["key"])]
    mine = mine[mine["rank"].isin([*culprits, *peers])]
    sites = ctx.sites(mine)
    site = sites.loc[call] if call in sites.index else None
    if site is None or pd.isna(site):
        return None
    counts = mine[(sites == site).fillna(False).to_numpy()].groupby("rank").size()
    theirs = max(int(counts.get(r, 0)) for r in peers)
    ours = sorted({int(counts.get(r, 0)) for r in culprits})
    if theirs < 2 or not ours or min(ours) < 1 or max(ours) >= theirs:
        return None
    who = who_of(peers)
    made = (
        f"is making its {_nth(theirs)}"
        if current and len(peers) == 1
        else (f"are making their {_nth(theirs)}" if current else f"made {theirs}")
    )
    return f"{'/'.join(map(str, ours))} calls of {ref['op']} at {site} where {who} {made}"


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
    fewer = _fewer(ctx, culprits, norm.index[0], peers, current=True)
    if fewer is None:
        return False
    left = _left_loop(ctx, culprits, peers, norm.iloc[0], own)
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


def _left_loop(
    ctx: Context, culprits: list[int], others: list[int], theirs: pd.Series, own: pd.Series
) -> bool | None:
    """Whether the culprits left the loop the others are still in, rather than called something
    else from inside it: their stacks past the loop (the parting line), else their call past
    the end of the loop that holds the others' call; None when neither can tell."""
    p, _ = ctx.parting(culprits, others)
    if p is not None and (p.left_loop or p.arms or set(culprits) <= set(p.ranks_in)):
        gone = p.ranks_out if p.kind in ("for", "while") else p.ranks_in
        return p.left_loop and set(culprits) <= set(gone)
    return ctx.loop_left(culprits, others, theirs, own)


def _nth(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _thread_notes(ctx: Context, rows: pd.DataFrame) -> list[str]:
    """Calls made from a thread other than their rank's main thread: name it."""
    notes = []
    for rank, thread, site in zip(rows["rank"], rows["thread"], ctx.sites(rows), strict=True):
        f = ctx.facts.get(int(rank))
        main = f.main_thread if f is not None else None
        if main and opt(thread) and str(thread) != main:
            notes.append(
                f"rank {rank} made this call from thread {thread}, not its main thread"
                + at(opt(site))
            )
    return notes


# --- 7. the waits -----------------------------------------------------------------------------
def waits(ctx: Context) -> Finding | None:
    """Follow the wait-for graph to its roots (or its cycle) and say what the culprit was
    doing."""
    g = ctx.graph
    if not g.waits:
        return None
    if g.roots:
        # Ranks known to have stayed away come first; ranks that left no record are said to be
        # missing, not blamed, unless nothing else is there to blame.
        known = [r for r in g.roots if r in ctx.evidence_ranks]
        found = _roots(ctx, known or list(g.roots))
    elif g.cycles:
        found = _cycle(ctx, list(g.cycles[0]))
    else:
        return _all_stuck(ctx)
    return found


def _roots(ctx: Context, roots: list[int]) -> Finding:
    """Ranks the waiting ranks wait for, which wait for nothing themselves."""
    g = ctx.graph
    waiting = g.waiting_on(roots)
    direct = [r for r in waiting if g.waits[r].waits_for & set(roots)]
    w = g.waits[direct[0]] if direct else g.waits[waiting[0]]
    d = ctx.divergence_with(set(roots)) or (ctx.cell(w.pg, w.seq) if w.seq is not None else None)
    where = ctx.whereabouts(roots)
    rows = d.rows if d is not None else ctx.calls.iloc[[w.row]]
    rows_waiting = rows[~done(rows)] if len(rows) else rows
    sites = ctx.sites(rows) if len(rows) else pd.Series(dtype="string")
    facts = {
        "others": who_of(waiting),
        "other_op": w.op,
        "other_site": (site_of(sites, rows_waiting) if len(rows_waiting) else None) or w.site,
        "collective": ctx.label(d) if d is not None else w.where(),
        "group": f"group {w.pg}",
    }
    refs = (ctx.call_refs(d) if d is not None else []) + [
        x.ref for x in where.values() if x.ref is not None
    ]
    found = Finding(
        cause="lagging_rank",
        culprits=sorted(roots),
        waiting=waiting,
        facts=facts,
        collective=ctx.collective(d, sites=sites, absent=where) if d is not None else None,
        refs=refs,
    )
    _explain_roots(ctx, found, where, w)
    return found


def _explain_roots(ctx: Context, found: Finding, where: dict[int, Where], w: Wait) -> None:
    """The cause from what the roots were doing: exited (out of data, or crashed), silent,
    blocked on something outside the collectives, busy elsewhere. (A rank known to have left
    the others' loop early is in another collective or gone: the mismatch and cycle rules.)"""
    facts = found.facts
    exited = [r for r, x in where.items() if x.state == "exited"]
    if exited:
        found.culprits = exited
        first = min(exited, key=lambda r: ctx.facts[r].ended_s or np.inf)
        if all(where[r].code == 0 for r in exited):
            found.cause = "early_exit"
            caught = any(ctx.facts[r].exit_code != 0 for r in exited)
            facts["culprit_left"] = "finished its script" if caught else "exited with code 0"
            calls = ctx.calls
            mine = (calls["pg"] == w.pg) & calls["seq"].notna() & calls["rank"].isin(exited)
            count = calls.loc[mine, "rank"].value_counts().reindex(exited, fill_value=0)
            facts["culprit_done"] = "/".join(map(str, sorted(set(count.tolist()))))
        else:
            fact = ctx.facts[first]
            found.cause = crash_cause(fact.exception)
            facts["error"] = short(fact.exception or f"exit code {fact.exit_code}")
            facts["culprit_site"] = where[first].site
        return
    silent = [r for r in found.culprits if r not in ctx.evidence_ranks]
    if silent and len(silent) == len(found.culprits):
        found.cause = "silent_rank"
        return
    went_past = [r for r in found.culprits if _went_past(ctx, w, r)]
    if went_past:
        # Its stacks show it beyond the line where the others wait, in the same function,
        # without ever having called there: it took another branch (whatever it waits on now).
        r = went_past[0]
        a = ctx.activity(r)
        found.culprits = went_past
        found.cause = "rank_conditional_collective"
        now = f", and is now {a.doing}" if a is not None else ""
        facts["culprit_doing"] = f"went past {w.site} without calling {w.op}{now}"
        facts["other_doing"] = f"waited in {facts['other_op']}{at(facts['other_site'])}"
        if a is not None and a.reason:
            found.notes.append(f"rank {r}'s stacks that show it were taken {a.when}")
        return
    activities = {r: ctx.activity(r) for r in found.culprits}
    blocked = {r: a for r, a in activities.items() if a is not None and a.kind}
    if blocked:
        r, a = next(iter(blocked.items()))
        found.culprits = sorted(blocked)
        found.cause = "stuck_outside"
        facts["culprit_doing"] = a.doing
        facts["culprit_site"] = a.site
        facts["wait_fix"] = WAITS[a.kind][1]
        found.notes += [f"rank {r}'s other threads: {t}" for t in a.others]
        if a.reason:
            found.notes.append(f"rank {r}'s stacks that show it were taken {a.when}")
        return
    busy = [r for r, x in where.items() if x.state == "busy"]
    if busy:
        # Outside every collective, waiting on nothing its stacks show: it computes.
        found.culprits = busy
        found.cause = "busy_outside"
        p, _ = ctx.parting(busy, found.waiting)
        loop = f" in the loop at {p.site} (`{p.source}`)" if p is not None and p.left_loop else ""
        x = where[busy[0]]
        since = ctx.waited_s(found.waiting)
        how_long = f" while they have waited {since:.1f} s" if since is not None else ""
        share = ctx.cpu_share(busy[0])
        cpu = f", using {share:.0%} of a core" if share is not None else ""
        facts["culprit_doing"] = (
            f"running code outside any collective{loop}{at(x.site)}{cpu}{how_long}"
        )
        facts["culprit_site"] = x.site
    else:
        facts["culprit_doing"] = _some(where)


def _went_past(ctx: Context, w: Wait, rank: int) -> bool:
    """Whether ``rank``'s stacks show it past the call ``w`` waits in, never having made it:
    a call it skipped (another branch), not one it has yet to reach."""
    if w.site is None:
        return False
    stacks = ctx.ev.table("stacks")
    mine = user_path(stacks, w.rank, thread=w.thread)
    fact = ctx.facts.get(rank)
    theirs = user_path(stacks, rank, thread=fact.main_thread if fact is not None else None)
    if not mine or not theirs or short_site(mine[-1][0], mine[-1][2]) != w.site:
        return False
    calls = ctx.calls
    own = calls[calls["rank"] == rank]
    if own.empty:
        return passed(mine, theirs, None)
    last = own["site"].iloc[own["order"].argmax()]
    return not pd.isna(last) and passed(mine, theirs, str(last))


def _cycle(ctx: Context, cycle: list[int]) -> Finding:
    """Every rank waits, and some wait only for each other: the rank that left the program order
    the others share is the culprit (a skipped call, a call the others do not make there); two
    point-to-point calls facing each other are a cycle with no single culprit."""
    g = ctx.graph
    cyc = [g.waits[r] for r in cycle]
    culprits = departed(ctx.calls, cycle)
    if all(w.seq is None for w in cyc):
        return _p2p_cycle(ctx, cycle, culprits)
    c = culprits[0]
    # What the culprit skipped: the call a rank of the cycle waits for it in.
    skipped = next((w for w in cyc if c in w.waits_for and w.rank not in culprits), cyc[0])
    d = ctx.cell(skipped.pg, skipped.seq) if skipped.seq is not None else None
    own = g.waits[c]
    waiting = sorted(set(g.waiting) - set(culprits))
    facts = {
        "culprit_doing": f"skipped {skipped.where()} and waits in {own.where()}",
        "other_doing": f"wait{'s' if len(waiting) == 1 else ''} for {'it' if len(culprits) == 1 else 'them'}",
        "collective": ctx.label(d) if d is not None else skipped.where(),
        "culprit_site": own.site,
    }
    cause = "rank_conditional_collective"
    fewer = _ran_short(ctx, c, own)
    if fewer is not None and _left_loop(
        ctx, culprits, [skipped.rank], ctx.calls.iloc[skipped.row], ctx.calls.iloc[own.row]
    ) in (True, None):
        cause = "uneven_inputs"
        facts.update(
            culprit_done=fewer,
            culprit_went=f"went on to {own.where()}",
            other_op=skipped.op,
            other_site=skipped.site,
        )
        facts["others"] = who_of([skipped.rank])
    notes = _thread_notes(ctx, ctx.calls.iloc[[own.row]])
    return Finding(
        cause=cause,
        culprits=culprits,
        waiting=waiting,
        facts=facts,
        collective=ctx.collective(d) if d is not None else None,
        refs=[ctx.call_ref(g.waits[r].row, f"waits in {g.waits[r].where()}") for r in cycle][
            :MAX_REFS
        ],
        notes=notes,
    )


def _ran_short(ctx: Context, rank: int, own: Wait) -> str | None:
    """The call the rank made just before the one it waits in, if it made it fewer times than
    the other ranks that make it: it left a loop early (a microbatch short)."""
    calls = ctx.calls
    mine = calls[calls["rank"] == rank].sort_values("order")
    at_own = (
        mine.index.get_loc(calls.index[own.row]) if calls.index[own.row] in mine.index else None
    )
    if not at_own:
        return None
    before = mine.index[at_own - 1]
    ref = calls.loc[before]
    same = calls[(calls["pg"].astype(str) == str(ref["pg"])) & (calls["key"] == ref["key"])]
    peers = sorted(set(same["rank"].tolist()) - {rank})
    return _fewer(ctx, [rank], before, peers) if peers else None


def _p2p_cycle(ctx: Context, cycle: list[int], culprits: list[int]) -> Finding:
    g = ctx.graph
    text = " -> ".join(f"rank {r} ({g.waits[r].where()})" for r in cycle)
    members = set(cycle)
    waiting = sorted(set(g.waiting) - members)
    first = g.waits[cycle[0]]
    rows = ctx.calls.iloc[[g.waits[r].row for r in cycle]]
    sites = ctx.sites(rows)
    info = CollectiveInfo(
        pg=first.pg,
        pg_desc=first.pg_desc,
        pg_ranks=list(ctx.members.get(first.pg, ())),
        seq=opt_int(rows["p2p_seq"].iloc[0]),
        op_by_rank={r: g.waits[r].op for r in cycle},
        site_by_rank={r: opt(s) for r, s in zip(cycle, sites, strict=True)},
        shapes_by_rank={r: opt(s) for r, s in zip(cycle, rows["shapes"], strict=True)},
        state_by_rank={r: f"waiting for rank {g.waits[r].peer}" for r in cycle},
        source=ctx.source,
    )
    return Finding(
        cause="p2p_cycle",
        culprits=sorted(members),
        waiting=waiting,
        facts={"cycle": text + f" -> rank {cycle[0]}"},
        collective=info,
        refs=[ctx.call_ref(g.waits[r].row, f"{g.waits[r].op} in flight") for r in cycle],
    )


def _all_stuck(ctx: Context) -> Finding | None:
    """Every waiting rank waits in a call that all its members made alike: nothing in the
    evidence to wait for (below Python: the transport, a device)."""
    calls = ctx.calls
    flying = calls[calls["seq"].notna() & ~calls["completed"].fillna(False).astype(bool)]
    if flying.empty:
        return None
    pg, seq = flying.groupby(["pg", "seq"], observed=True).size().idxmax()
    d = ctx.cell(str(pg), int(seq))
    rows = d.rows
    sites = ctx.sites(rows)
    silent = sorted(set(d.members) - ctx.evidence_ranks)
    return Finding(
        cause="silent_rank" if silent else "stuck_collective",
        culprits=silent,
        waiting=sorted(rows["rank"][~done(rows)].tolist()),
        facts={
            "other_op": rows["op"].iloc[0],
            "other_site": site_of(sites, rows),
            "collective": ctx.label(d),
        },
        collective=ctx.collective(d, sites=sites),
        refs=ctx.call_refs(d),
    )


# --- 6. a stream that never reached the collective ------------------------------------------
def stream_stuck(ctx: Context) -> Finding | None:
    """The first collective (by group and number) that the device of some ranks started while
    on others it stayed ``scheduled``: enqueued on the stream, never started. That rank's
    stream is busy with earlier work (a kernel that never ends, a wait on an event never
    recorded). Only where the recorder says when entries start (nccl with
    ``TORCH_NCCL_ENABLE_TIMING``): without it every entry reads ``scheduled`` until it
    completes, and its start time is None, started or not."""
    fr = ctx.ev.table("flight_recorder")
    if fr.empty:
        return None
    coll = fr[fr["collective_seq_id"].notna() & ~fr["is_p2p"].fillna(False).astype(bool)]
    coll = coll[coll["backend"].astype(str) == "nccl"]
    timed = set(coll.loc[coll["time_discovered_started_ns"].notna(), "rank"].astype(int))
    state = coll["state"].astype(str)
    began = state.isin(["started", "completed"]) | coll["time_discovered_started_ns"].notna()
    waiting = coll[(state == "scheduled") & coll["rank"].isin(list(timed)) & ~began]
    for (pg, seq), rows in waiting.groupby(["pg_name", "collective_seq_id"], observed=True):
        same = coll[(coll["pg_name"] == pg) & (coll["collective_seq_id"] == seq)]
        started = same[began.loc[same.index] & (same["state"].astype(str) != "completed")]
        if started.empty and coll["rank"].nunique() > 1:
            continue  # on one rank alone, a collective never started is its stream's too
        culprits = sorted(set(rows["rank"].astype(int)))
        others = sorted(set(started["rank"].astype(int)) - set(culprits))
        culprit = culprits[0]
        mine = coll[(coll["rank"] == culprit) & (state == "completed")]
        earlier = mine[mine["record_id"] < rows["record_id"].min()]
        ran = (
            f"{earlier['op'].iloc[-1]} #{int(earlier['collective_seq_id'].iloc[-1])} on group "
            f"{earlier['pg_name'].iloc[-1]}"
            if len(earlier)
            else None
        )
        op = str(rows["op"].iloc[0])
        where = ctx.whereabouts(culprits).get(culprit)
        return Finding(
            cause="stream_stuck",
            culprits=culprits,
            waiting=others,
            facts={
                "culprit_op": op,
                "collective": f"group {pg}, collective #{int(seq)}",
                "others_started": f"{who_of(others)} started it and wait"
                if others
                else "no other rank takes part",
                "stream_last": ran or "nothing the recorder kept",
                "culprit_doing": (where.note if where is not None else None) or "unknown",
            },
            refs=[
                EvidenceRef(
                    table="flight_recorder",
                    row=int(pos),
                    rank=int(r),
                    note="issued, never started on its stream",
                )
                for pos, r in zip(rows.index, rows["rank"], strict=True)
            ],
        )
    return None


# --- 8. the error texts alone -----------------------------------------------------------------
def errors_only(ctx: Context) -> Finding | None:
    """No record of calls says anything; the error messages may (foreign logs)."""
    errors = ctx.ev.table("errors")
    detail = errors[errors["kind"] == "collective_mismatch"]
    if not detail.empty:
        return _fingerprints(ctx, detail)
    barrier = errors[errors["kind"] == "monitored_barrier"]
    late = sorted(
        {r for f in barrier["fields"] if isinstance(f, dict) for r in f.get("failed_ranks", [])}
    )
    if late:
        reporters = sorted(set(barrier["rank"].dropna().astype(int).tolist()) - set(late))
        found = Finding(
            cause="lagging_rank",
            culprits=late,
            waiting=reporters,
            facts={
                "other_op": "monitored_barrier",
                "other_site": _log_site(ctx, barrier),
                "collective": short(barrier["message"].iloc[0]),
                "culprit_doing": "monitored_barrier timed out waiting for it",
            },
            refs=error_refs(barrier, "monitored_barrier names the ranks that did not arrive"),
        )
        activities = {r: ctx.activity(r) for r in late}
        blocked = {r: a for r, a in activities.items() if a is not None and a.kind}
        if blocked:
            r, a = next(iter(blocked.items()))
            found.cause = "stuck_outside"
            found.facts.update(
                culprit_doing=a.doing, culprit_site=a.site, wait_fix=WAITS[a.kind][1]
            )
            found.notes += [f"rank {r}'s other threads: {t}" for t in a.others]
        return found
    timeouts = errors[(errors["role"] == "timeout") | (errors["kind"] == "monitored_barrier")]
    if timeouts.empty:
        return None
    fields = timeouts["fields"].iloc[0]
    fields = fields if isinstance(fields, dict) else {}
    return Finding(
        cause="collective_timeout",
        culprits=[],
        waiting=sorted(set(timeouts["rank"].dropna().astype(int).tolist())),
        facts={
            "other_op": fields.get("op_type") or "a collective",
            "collective": short(timeouts["message"].iloc[0]),
        },
        refs=error_refs(timeouts, "timed out"),
    )


def _fingerprints(ctx: Context, detail: pd.DataFrame) -> Finding:
    """TORCH_DISTRIBUTED_DEBUG=DETAIL compared the ranks' next collective and printed both
    sides; the rank whose fingerprint differs from most is the odd one."""
    seen: dict[int, tuple[Any, ...]] = {}
    for fields in detail["fields"]:
        if not isinstance(fields, dict):
            continue
        for side in "ab":
            rank = fields.get(f"rank_{side}")
            if rank is not None:
                seen[int(rank)] = tuple(
                    fields.get(f"{key}_{side}") for key in ("op_type", "shape", "dtypes", "seq")
                )
    groups: dict[tuple[Any, ...], list[int]] = {}
    for rank, fp in sorted(seen.items()):
        groups.setdefault(fp[:3], []).append(rank)
    norm = max(groups, key=lambda k: (len(groups[k]), -groups[k][0]))
    culprits = sorted(r for k, ranks in groups.items() if k != norm for r in ranks)
    odd = next(k for k in groups if k != norm) if culprits else norm
    facts = {
        "culprit_op": odd[0],
        "other_op": norm[0],
        "culprit_shapes": odd[1],
        "other_shapes": norm[1],
        "culprit_dtypes": odd[2],
        "other_dtypes": norm[2],
        "culprit_site": _log_site(ctx, detail[detail["rank"].isin(culprits)]),
        "other_site": _log_site(ctx, detail[~detail["rank"].isin(culprits)]),
        "collective": "as TORCH_DISTRIBUTED_DEBUG=DETAIL reported it",
    }
    cause = (
        "op_mismatch"
        if odd[0] != norm[0]
        else "shape_mismatch"
        if odd[1] != norm[1]
        else "dtype_mismatch"
    )
    ranks = sorted(seen)
    seq = next((fp[3] for fp in seen.values() if fp[3] is not None), None)
    info = CollectiveInfo(
        pg="unknown",
        pg_desc=None,
        pg_ranks=ranks,
        seq=seq,
        op_by_rank={r: seen[r][0] for r in ranks},
        site_by_rank={r: _log_site(ctx, detail[detail["rank"] == r]) for r in ranks},
        shapes_by_rank={r: seen[r][1] for r in ranks},
        dtypes_by_rank={r: seen[r][2] for r in ranks},
        state_by_rank=dict.fromkeys(ranks, "failed"),
        source="errors",
    )
    return Finding(
        cause=cause,
        culprits=culprits,
        waiting=sorted(set(ranks) - set(culprits)),
        facts=facts,
        collective=info,
        refs=error_refs(detail, "DETAIL fingerprints"),
    )


def _log_site(ctx: Context, errors: pd.DataFrame) -> str | None:
    """The user's line in the traceback above the first of these error lines."""
    for rank, message in zip(errors["rank"], errors["message"], strict=True):
        if pd.notna(rank):
            site = ctx.ev.traceback_site(int(rank), str(message))
            if site:
                return site
    return None


# --- 10. slow but not stuck --------------------------------------------------------------------
def straggler(ctx: Context) -> Finding | None:
    spread = align.arrival_spread(ctx.calls, members=ctx.members)
    if spread.empty or spread["late_s"].iloc[0] < ctx.straggler_s:
        return None
    top = spread.iloc[0]
    late = int(top["late_rank"])
    d = ctx.cell(str(top["pg"]), int(top["seq"]))
    sites = ctx.sites(d.rows)
    odd = d.rows[d.rows["rank"] == late]
    notes = []
    if ctx.ev.stalls:
        idle = ctx.ev.stalls[0].get("idle_s", 0)
        notes.append(f"the stall watchdog saw no progress for {idle:.1f} s, then the ranks went on")
    return Finding(
        cause="straggler",
        culprits=[late],
        waiting=sorted(set(d.rows["rank"].tolist()) - {late}),
        facts={
            "culprit_op": odd["op"].iloc[0],
            "culprit_site": site_of(sites, odd),
            "late": f"{top['late_s']:.1f} s",
            "collective": ctx.label(d),
        },
        collective=ctx.collective(d, sites=sites),
        refs=ctx.call_refs(d),
        notes=notes,
    )


#: The rules, in the order they are asked (see the module docstring).
RULES: tuple[Rule, ...] = (
    launch_error,
    model_mismatch,
    reported_failure,
    mismatch,
    signal_death,
    stream_stuck,
    waits,
    errors_only,
    bare_exit,
    straggler,
)


def _earliest(rows: pd.DataFrame) -> float:
    start = rows["t_start_s"].min()
    return np.inf if pd.isna(start) else float(start)


def _some(where: dict[int, Where], limit: int = 4) -> str:
    """``rank 1: note; rank 2: note`` for the first few ranks, then how many more."""
    text = "; ".join(f"rank {r}: {w.note}" for r, w in list(where.items())[:limit])
    more = len(where) - limit
    return text + (f"; and {more} more" if more > 0 else "")
