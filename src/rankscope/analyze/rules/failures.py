"""A rank's own failure: 1b. ``node_lost`` (SLURM lost the node it ran on), 2.
``model_mismatch`` (DDP's texts name the odd model), 3. ``reported_failure`` (an exception or an
error of its own), 5. ``signal_death`` (a signal no text
blames on a peer) and 9. ``bare_exit`` (a non-zero exit, nothing else). The last three share
:func:`crash`: the earliest failure is the cause, and the ranks that failed alike its culprits."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from rankscope.analyze.calls import done, failed, opt
from rankscope.analyze.causes import CRASH_FIX, FAILURE_KINDS, Cause
from rankscope.analyze.context import Context
from rankscope.analyze.diagnosis import EvidenceRef, who_of
from rankscope.analyze.evidence import SIGNAL_TEXT, RankFacts
from rankscope.analyze.rules.finding import Decided, Failure, Finding, log_site, rule
from rankscope.analyze.wording import MAX_REFS, at, error_refs, short
from rankscope.collect import VICTIM_ROLES, recognise, victims_words
from rankscope.collect.signatures import KNOWN

_OOM = re.compile(r"out of memory|OutOfMemoryError|can't allocate memory", re.IGNORECASE)
_NAN = re.compile(r"\bnan\b|non-finite|not finite", re.IGNORECASE)


def failure_cause(
    *, kind: str | None = None, text: str | None = None, signal: str | None = None
) -> Cause:
    """Decides the cause of a rank's own failure (named here alone, with
    :data:`~rankscope.analyze.causes.FAILURE_KINDS`): the cause of an error kind of its own
    (``cuda_oom``, ...); else ``rank_killed`` for a SIGKILL; else, from its exception's text,
    ``oom``, ``nan`` or ``rank_crashed``."""
    if kind is not None:
        return FAILURE_KINDS[kind]
    if signal == "SIGKILL":
        return Cause.rank_killed
    if _OOM.search(text or ""):
        return Cause.oom
    if _NAN.search(text or ""):
        return Cause.nan
    return Cause.rank_crashed


@rule(15)
def node_lost(ctx: Context) -> Finding | None:
    """SLURM ended the job ``NODE_FAIL`` and said which nodes it lost (``run.json``'s
    ``slurm.lost_nodes``): the ranks that ran there are the culprits, whatever they were doing
    when it went (the others' calls could only wait for theirs), the others are left waiting.
    Asked before any rank's own failure: the teardown that follows a lost node kills every rank
    at a moment that depends on the machine, and what they did then is not the cause."""
    slurm = ctx.ev.info.get("slurm")
    if not isinstance(slurm, dict) or slurm.get("state") != "NODE_FAIL":
        return None
    lost = slurm.get("lost_nodes")
    if not isinstance(lost, dict) or not lost:
        return None
    ranks = ctx.ev.table("ranks")
    on = ranks[ranks["node"].isin([str(n) for n in lost])]
    culprits = sorted(on["rank"].dropna().astype(int).tolist())
    if not culprits:
        return None
    nodes = sorted(str(n) for n in on["node"].dropna().unique())
    waiting = ctx.blocked(exclude=set(culprits))
    return Finding(
        cause=Cause.node_lost,
        culprits=culprits,
        waiting=waiting,
        facts={
            "nodes": ",".join(nodes),
            "lost": "; ".join(f"{n}: {short(str(lost[n]), 80)}" for n in nodes),
            "state": f"NODE_FAIL ({slurm.get('reason') or 'no reason given'})",
            "left": "waiting for them" if waiting else "to be ended with them",
        },
    )


def crash_story(
    cause: Cause, text: str | None, *, errors: pd.DataFrame | None = None, rank: int | None = None
) -> Decided:
    """What a crash's text says beyond "a rank crashed": for ``rank_crashed`` with a known error
    (:func:`rankscope.collect.recognise`) in ``text``, or in that ``rank``'s own lines of the
    ``errors`` table, its recipe, its title and values (fact ``known``) and its fix (fact
    ``crash_fix``); else the cause's own recipe and the general advice. Every finding of
    ``rank_crashed`` takes its facts from here."""
    if cause != Cause.rank_crashed:
        return Decided(cause, [], {})
    found = recognise(text)
    if found is None and errors is not None and rank is not None:
        mine = errors[(errors["rank"] == rank) & errors["kind"].isin([k.kind for k in KNOWN])]
        found = next(filter(None, map(recognise, mine["message"].astype(str))), None)
    if found is None:
        return Decided(cause, [], {"known": "", "crash_fix": CRASH_FIX})
    sig = found.signature
    what = f"{found.title} ({found.values})" if found.values else found.title
    return Decided(
        cause,
        [],
        {"known": f": {what}", "crash_fix": found.fix},
        notes=[f"the error is a known text of recipe {sig.recipe} ({sig.kind}): {sig.doc}"],
        recipe=sig.recipe,
    )


@rule(20)
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
        cause=Cause.ddp_model_mismatch,
        culprits=culprits,
        waiting=[],
        facts={
            **facts,
            "error": short(rows["message"].iloc[0]),
            "culprit_site": log_site(ctx, rows),
            "others": who_of(others),
        },
        refs=error_refs(rows, "DDP compared the models across ranks"),
    )


def failures(ctx: Context) -> list[Failure]:
    """Every rank's own failure that it reported (not a collective that failed because of a
    peer), earliest first: an exception raised outside any collective, or an error of its own
    in its logs."""
    probe = ctx.ev.table("collectives")
    broke = probe[failed(probe)]
    raised_in_call = {(int(r), str(e)) for r, e in zip(broke["rank"], broke["error"], strict=True)}
    errors = ctx.ev.table("errors")
    own = errors[errors["kind"].isin(list(FAILURE_KINDS)) & errors["rank"].notna()]
    kinds = {int(r): str(k) for r, k in zip(own["rank"], own["kind"], strict=True)}
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
                cause=failure_cause(kind=kinds.get(rank), text=f.exception),
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
                cause=failure_cause(kind=str(row.kind)),
                message=str(row.message),
                ref=EvidenceRef(
                    table="errors", row=int(pos), rank=int(row.rank), note=str(row.kind)
                ),
            )
        )
    return sorted(out, key=lambda o: (o.t_s, o.rank))


@rule(30)
def reported_failure(ctx: Context) -> Finding | None:
    return crash(ctx, failures(ctx))


def _victims_text(errors: pd.DataFrame, rank: int, exception: str) -> bool:
    """The rank's exception is an error text whose role makes it a victim (a peer's exit or
    timeout, NCCL's remote error): by its own words, or as its logs show it. Its own words
    count where the logs lack it: a teardown signal that lands while the traceback is printed
    leaves none of it there."""
    if victims_words(exception):
        return True
    mine = errors[(errors["rank"] == rank) & errors["role"].isin(list(VICTIM_ROLES))]
    head = exception.split("\n", 1)[0]
    return any(head[:80] in str(m) or str(m)[:80] in exception for m in mine["message"])


def deaths(ctx: Context, *, bare: bool = False) -> list[Failure]:
    """Ranks that died without a word, earliest first: killed or crashed by a signal
    (``bare=False``), or only a non-zero exit code (``bare=True``: weaker than any other
    evidence, so asked last). Not a rank ended by a teardown or a stop, one whose call failed,
    nor one whose own texts say it waited on others."""
    reported = {f.rank for f in failures(ctx)}
    out = []
    for rank, f in ctx.facts.items():
        if f.died is None or rank in ctx.victims or rank in reported or f.exception:
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
            cause=failure_cause(signal=f.signal),
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
        cause=failure_cause(signal=f.signal),
        message=message + after,
        ref=ref,
        site=site,
    )


@rule(50)
def signal_death(ctx: Context) -> Finding | None:
    return crash(ctx, deaths(ctx))


@rule(90)
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
    story = crash_story(first.cause, first.message, errors=ctx.ev.table("errors"), rank=first.rank)
    facts = {"error": short(first.message), "culprit_site": site, **first.facts, **story.facts}
    if first.cause == Cause.rank_killed:
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
        notes=story.notes
        + [f"rank {f.rank} also failed: {short(f.message)}" for f in found if f not in same],
        recipe=story.recipe,
    )
