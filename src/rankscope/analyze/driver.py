"""``diagnose()``: from the collected tables of one job to one :class:`Diagnosis`.

A short driver: it derives the run's facts once (:class:`~rankscope.analyze.context.Context`),
asks the rules in their order (:func:`~rankscope.analyze.rules.rules_for`: the package's
docstring says which comes first and why), and the first that answers decides. With no answer,
the job is ``ok`` only if the evidence shows it healthy; a rank that ended in a way nothing
explains, or no record at all, is ``unknown``. Ranks that are victims (their own error texts name a peer's exit,
a mismatch or a timeout, or a call of theirs failed) and ranks ended by a teardown or a stop are
never culprits for that.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import pandas as pd

from rankscope.analyze.calls import calls_from_probe
from rankscope.analyze.causes import CAUSES, Verdict, explain, fix_for
from rankscope.analyze.context import Context
from rankscope.analyze.diagnosis import Diagnosis, who_of
from rankscope.analyze.evidence import Evidence
from rankscope.analyze.parting import RANK_ENV, Parting
from rankscope.analyze.paths import FirstDivergence, describe, left
from rankscope.analyze.rules import RULES, Finding, Rule, rules_for
from rankscope.analyze.rules.finding import CAUSE_RECIPE
from rankscope.analyze.rules.paths import hang_of
from rankscope.analyze.wording import at
from rankscope.collect import load_run
from rankscope.rundir import RunDir
from rankscope.state import agree, proof_text
from rankscope.waitfor import CallNumber, Proof


def diagnose(run: Any, *, straggler_s: float = 1.0, rules: Sequence[Rule] = RULES) -> Diagnosis:
    """Explain a failed, frozen or healthy job.

    Args:
        run: a :class:`rankscope.collect.Run` (or anything with its table attributes), or the
            path of a run directory or of a folder of foreign artifacts, loaded with
            :func:`rankscope.collect.load_run`.
        straggler_s: a rank that reaches a completed collective this many seconds after the
            first rank is reported as a straggler.
        rules: the rules to ask, in order (:data:`rankscope.analyze.rules.RULES`); of a job whose
            every rank exited 0, only :data:`~rankscope.analyze.rules.ON_CLEAN_EXIT`.

    Returns:
        The :class:`Diagnosis`, with the calls table it was built from (``calls``) and the
        facts derived from it (``context``); nothing is written (see :func:`write_diagnosis`).
    """
    if straggler_s <= 0:
        raise ValueError(f"straggler_s must be positive, got {straggler_s}")
    if isinstance(run, (str, os.PathLike, RunDir)):
        run = load_run(run)
    ctx = Context(Evidence(run), straggler_s=straggler_s)
    unreadable = _require_evidence(ctx)
    if unreadable is not None:
        return unreadable
    for rule in rules_for(ctx, rules):
        finding = rule(ctx)
        if finding is not None:
            return _diagnosis(ctx, finding)
    return _healthy(ctx)


def _diagnosis(ctx: Context, f: Finding) -> Diagnosis:
    cause = CAUSES[f.cause]
    facts = {
        "culprits": who_of(f.culprits),
        "others": who_of(f.waiting, "no other rank"),
        **f.facts,
    }
    facts["culprit_at"] = at(facts.get("culprit_site"))
    facts["other_at"] = at(facts.get("other_site"))
    facts["culprits_are"] = agree(facts["culprits"], "is", "are")
    facts["culprits_its"] = agree(facts["culprits"], "its", "their")
    facts["others_wait"] = agree(facts["others"], "waits", "wait")
    reason = explain(f.cause, facts)
    summary = f"{cause.title[0].upper()}{cause.title[1:]}: {reason.rstrip('.')}."
    # The watchdog's proof that the job could not move again (rankscope.waitfor.prove).
    notes = [proof_text(_proof_text(ctx, s)) for s in ctx.ev.stalls[-1:] if s.get("proven")]
    parting, notes = None, notes + list(f.notes)
    fd = ctx.first_divergence
    others = f.waiting or (
        sorted(set(f.collective.pg_ranks) - set(f.culprits))
        if f.collective
        else (fd.others if fd is not None and set(fd.culprits) == set(f.culprits) else [])
    )
    earlier = fd is not None and set(fd.culprits) == set(f.culprits) and _before_hang(ctx, fd)
    if earlier or (cause.verdict in ("hang", "crash") and f.culprits and others):
        found, why = (
            (f.parting, "")
            if f.parting is not None
            else ctx.parting(f.culprits, fd.others if earlier and fd else others)
        )
        if found is not None:
            parting = found.to_dict()
            notes += _parting_notes(found)
            if earlier and found.values:
                notes.append(
                    f"the values at {found.site} were captured when the job stopped, after "
                    "the paths parted: they may have changed since"
                )
        else:
            notes.append(f"the line where the ranks parted is not known: {why}")
    return Diagnosis(
        verdict=cause.verdict,
        cause=f.cause,
        culprit_ranks=sorted(f.culprits),
        waiting_ranks=sorted(f.waiting),
        recipe=cause.recipe if f.recipe == CAUSE_RECIPE else f.recipe,
        summary=summary,
        reason=reason,
        fix=fix_for(f.cause, facts),
        collective=f.collective,
        chain=ctx.chain(sorted(f.culprits)) if f.culprits else [],
        parting=parting,
        first_divergence=_first_dict(fd, ctx.gone) if fd is not None else None,
        evidence=f.refs,
        missing=ctx.missing(),
        notes=notes + ctx.aftermath(f.culprits) + ctx.launcher_notes(f.culprits),
        run=ctx.ev.path,
        calls=ctx.calls,
        context=ctx,
    )


def _proof_text(ctx: Context, stall: dict[str, Any]) -> str:
    """The live prover's sentence (:class:`~rankscope.waitfor.Proof`) in the diagnosis's
    numbering of each group's collectives. The prover counts the calls Python made (the
    probe's); the diagnosis numbers every collective of the group, those torch issued from C++
    too (DDP's gradient all_reduce, as the flight recorder lists them), so "call #13" of one is
    "#21" of the other. A call the calls table does not hold keeps the prover's number, and so
    does a proof read from the flight recorder (numbered as the diagnosis numbers) or one a
    run.json holds only as words (an older run)."""
    proof = Proof.from_json(stall.get("proof"))
    if proof is None:
        return str(stall["proven"])
    probe = calls_from_probe(ctx.ev.table("collectives"))
    calls = ctx.calls[ctx.calls["seq"].notna()]

    def number(call: CallNumber) -> int | None:
        """The group's number of the rank's n-th Python call there (the first call of the
        calls table, on that rank and group, that started when it did or after); for ``made``,
        the number of the last call the rank made there."""
        if call.kind == "made" and call.n == 0:
            return None
        mine = probe[(probe["rank"] == call.rank) & (probe["pg"].astype(str) == call.pg)]
        mine = mine[mine["seq"] == call.n]
        if mine.empty or pd.isna(mine["t_start_s"].iloc[0]):
            return None
        own = calls[(calls["rank"] == call.rank) & (calls["pg"].astype(str) == call.pg)]
        if call.kind == "made":
            return int(own["seq"].max()) if len(own) else None
        t0 = float(mine["t_start_s"].iloc[0])
        later = own[(own["t_start_s"] >= t0).fillna(False)].sort_values("t_start_s")
        return None if later.empty else int(later["seq"].iloc[0])

    return proof.text(number)


def _before_hang(ctx: Context, fd: FirstDivergence) -> bool:
    """Whether the paths parted before the place where the ranks of that group stopped (or on
    a group where they never stopped)."""
    if fd.kind != "collective":  # point-to-point calls: the stacks where they wait tell it
        return False
    hang = hang_of(ctx, fd)
    return hang is None or hang.seq > fd.seq


def _first_dict(fd: FirstDivergence, gone: set[int]) -> dict[str, Any]:
    """The first divergence's JSON, with its sentence; a class that made no call says whether
    its ranks had left (``left``)."""
    out = {**fd.to_dict(), "text": describe(fd, gone)}
    out["classes"] = [{**c.to_dict(), "left": left(c, gone)} for c in fd.classes]
    return out


def _parting_notes(p: Parting) -> list[str]:
    """What a decision on a per-node or per-rank environment variable means, and what a
    handler that only some ranks entered does."""
    notes = []
    if p.kind == "except":
        notes.append(
            f"{who_of(p.ranks_in)} entered the handler at {p.site} alone: a retry or fallback "
            "that one rank takes issues collectives the others never make. Decide it on every "
            "rank together (all_reduce a failure flag, then all retry or all skip), or keep "
            "collectives out of the handler"
        )
    for name, var in p.env.items():
        if RANK_ENV.get(var) == "D3":
            notes.append(
                f"{name} comes from {var}, which counts ranks within a node: it is true or false "
                f"on one rank of every node, not of the job (recipe D3: rank vs local rank); "
                "decide once for the job on the global rank, or make the call on every rank"
            )
        elif var in RANK_ENV:
            notes.append(f"{name} comes from {var}: it differs by rank by design")
    return notes


def _healthy(ctx: Context) -> Diagnosis:
    """No rule found a problem: ``ok`` only if the evidence shows the job was healthy;
    ``unknown`` when ranks ended in a way nothing explains, or nothing was recorded."""
    ev = ctx.ev
    codes = {r: f.exit_code for r, f in ctx.facts.items()}
    done = int(ctx.calls["seq"].notna().sum())
    recorded = f" {done} collective calls recorded." if done else ""
    ended = {r: f for r, f in ctx.facts.items() if f.died and not (ev.stopped and f.signal)}
    if ended:
        return _unknown(
            ctx,
            f"No rank diverged, waited or failed on its own in the evidence, yet "
            f"{ctx.endings(ended)}; the evidence does not show why.{recorded}",
            ranks=sorted(ended),
        )
    if codes and all(c == 0 for c in codes.values()):
        summary = f"All {len(codes)} ranks exited 0; no collective was left in flight."
    elif ev.stopped:
        summary = (
            f"The job was stopped ({ev.info.get('stop_reason')}) with no rank stuck and no "
            "failure in the evidence."
        )
    elif not done and not ev.table("events")["ev"].isin(["heartbeat", "step"]).any():
        return _unknown(
            ctx,
            "There is no record of any collective call or of any rank's progress, and no exit "
            "code: the evidence cannot tell whether the job was healthy.",
        )
    else:
        summary = "No failure, divergence or waiting rank in the evidence so far."
    return _causeless(ctx, "ok", summary + recorded, notes=ctx.launcher_notes([]))


def _unknown(
    ctx: Context,
    summary: str,
    *,
    ranks: list[int] | None = None,
    missing: list[str] | None = None,
) -> Diagnosis:
    notes = ctx.launcher_notes([]) + ctx.aftermath([], only=ranks)
    return _causeless(ctx, "unknown", summary, notes=notes, missing=missing)


def _causeless(
    ctx: Context,
    verdict: Verdict,
    summary: str,
    *,
    notes: list[str],
    missing: list[str] | None = None,
) -> Diagnosis:
    return Diagnosis(
        verdict=verdict,
        cause=None,
        culprit_ranks=[],
        waiting_ranks=[],
        recipe=None,
        summary=summary,
        missing=ctx.missing() if missing is None else missing,
        notes=notes,
        run=ctx.ev.path,
        calls=ctx.calls,
        context=ctx,
    )


def _require_evidence(ctx: Context) -> Diagnosis | None:
    """Raise when there is nothing at all; an ``unknown`` diagnosis when there were files but
    none could be read."""
    ev = ctx.ev
    if (
        ctx.calls.empty
        and ev.table("errors").empty
        and ev.table("logs").empty
        and ev.table("events").empty
        and ev.table("stacks").empty
        and all(f.exit_code is None for f in ctx.facts.values())
        and not ev.info
    ):
        where = f" in {ev.path}" if ev.path else ""
        unread = ctx.unreadable()
        if unread:
            return _unknown(
                ctx,
                f"Nothing{where} could be read: {len(unread)} file(s) were found but none holds "
                "readable evidence (see missing). The evidence cannot tell what happened.",
                missing=[f"could not read {text}" for text in unread],
            )
        raise ValueError(
            f"nothing to diagnose{where}: no probe events, flight-recorder entries, logs or exit "
            "codes were found; pass a run directory or a folder with dumps or logs"
        )
    return None
