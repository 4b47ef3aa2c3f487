"""1. ``launch_error``: the ranks never formed a group (environment, port, rendezvous, hostfile),
from the launch error texts, a failed setup call, or a job that never started."""

from __future__ import annotations

from rankscope.analyze.calls import failed
from rankscope.analyze.causes import LAUNCH_KINDS, Cause
from rankscope.analyze.context import Context
from rankscope.analyze.diagnosis import EvidenceRef, who_of
from rankscope.analyze.rules.finding import Finding, rule
from rankscope.analyze.wording import error_refs, short
from rankscope.rundir import MANAGEMENT_OPS


@rule(10)
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
            cause=Cause.launch_failed,
            culprits=culprits,
            waiting=[],
            facts={"error": short(setup["error"].iloc[0])},
            refs=refs,
        )
    if ctx.ev.info.get("state") == "failed_to_start":
        error = ctx.ev.info.get("error") or "torchrun failed before any rank started"
        return Finding(cause=Cause.launch_failed, culprits=[], waiting=[], facts={"error": error})
    return None
