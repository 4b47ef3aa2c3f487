"""10. ``straggler``: every collective completed, but one rank arrived far behind (``ok``).
It is also the one rule asked of a job whose every rank exited 0 (see the package's order)."""

from __future__ import annotations

from typing import Any

from rankscope._values import as_float
from rankscope.analyze import align
from rankscope.analyze.causes import Cause
from rankscope.analyze.context import Context
from rankscope.analyze.rules.finding import Finding, rule
from rankscope.analyze.wording import site_of


@rule(100)
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
