"""10. ``straggler``: every collective completed, but one rank arrived far behind (``ok``).
It is also the one rule asked of a job whose every rank exited 0 (see the package's order)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from rankscope._values import as_float
from rankscope.analyze import align
from rankscope.analyze.causes import Cause
from rankscope.analyze.context import Context
from rankscope.analyze.rules.finding import Finding, rule
from rankscope.analyze.wording import site_of


@rule(100)
def straggler(ctx: Context) -> Finding | None:
    spread = align.arrival_spread(ctx.calls, members=ctx.members)
    if not ctx.ev.stalls:  # one the watchdog called is a straggler wherever it was
        spread = _after_start(ctx.calls, spread)
    if spread.empty or spread["late_s"].iloc[0] < ctx.straggler_s:
        return None
    top = spread.iloc[0]
    late = int(top["late_rank"])
    d = ctx.cell(str(top["pg"]), int(top["seq"]))
    sites = ctx.sites(d.rows)
    odd = d.rows[d.rows["rank"] == late]
    notes = []
    if ctx.ev.stalls:
        notes.append(_stall_note(ctx.ev.stalls[0]))
    return Finding(
        cause=Cause.straggler,
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


def _after_start(calls: pd.DataFrame, spread: pd.DataFrame) -> pd.DataFrame:
    """``spread`` without the collectives that were a rank's first call: how late a rank
    arrives there is how much longer it took to start (imports, building the model, the load
    of the machine), not a rank that kept the others waiting in the job's loop (D23: eval or
    a save on one rank)."""
    if spread.empty or calls.empty:
        return spread
    ordered = calls[calls["seq"].notna()].sort_values(["rank", "order"], kind="stable")
    first = ordered.drop_duplicates("rank")
    starts = set(zip(first["pg"].astype(str), first["seq"].astype(int), strict=True))
    keep = [
        (pg, int(seq)) not in starts
        for pg, seq in zip(spread["pg"].astype(str), spread["seq"], strict=True)
    ]
    return spread[keep].reset_index(drop=True)


def _stall_note(stall: dict[str, Any]) -> str:
    """What the watchdog called before the ranks went on: a busy stall says who kept the others
    waiting, where, and how long after the call it came."""
    idle = as_float(stall.get("idle_s")) or 0.0
    after = as_float(stall.get("cleared_after_s"))
    came = f" {after:.1f} s after that" if after is not None else ""
    summary = stall.get("summary")
    if stall.get("kind") == "busy" and isinstance(summary, str):
        return (
            f"the stall watchdog called a busy stall after {idle:.1f} s ({summary}); the rank "
            f"came{came}, and the ranks went on"
        )
    return f"the stall watchdog saw no progress for {idle:.1f} s, then the ranks went on{came}"
