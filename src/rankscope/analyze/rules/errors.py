"""8. ``errors_only``: no record of calls says anything, the error texts may (DETAIL
fingerprints, monitored_barrier, timeouts in foreign logs)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from rankscope.analyze.causes import Cause
from rankscope.analyze.context import Context
from rankscope.analyze.diagnosis import CollectiveInfo
from rankscope.analyze.rules.finding import Finding, log_site, rule
from rankscope.analyze.rules.mismatch import DIFFERENT_CALL
from rankscope.analyze.rules.waits import blocked_outside, lagging
from rankscope.analyze.wording import error_refs, short
from rankscope.state import shapes_text


@rule(80)
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
        facts = {
            "other_op": "monitored_barrier",
            "other_site": log_site(ctx, barrier),
            "collective": short(barrier["message"].iloc[0]),
        }
        decided = blocked_outside(ctx, late, say_when=False) or lagging(
            late, doing="monitored_barrier timed out waiting for it"
        )
        return Finding(
            cause=decided.cause,
            culprits=late,
            waiting=reporters,
            facts={**facts, **decided.facts},
            refs=error_refs(barrier, "monitored_barrier names the ranks that did not arrive"),
            notes=decided.notes,
        )
    timeouts = errors[(errors["role"] == "timeout") | (errors["kind"] == "monitored_barrier")]
    if timeouts.empty:
        return None
    fields = timeouts["fields"].iloc[0]
    fields = fields if isinstance(fields, dict) else {}
    return Finding(
        cause=Cause.collective_timeout,
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
        "culprit_shapes": shapes_text(odd[1]),
        "other_shapes": shapes_text(norm[1]),
        "culprit_dtypes": odd[2],
        "other_dtypes": norm[2],
        "culprit_site": log_site(ctx, detail[detail["rank"].isin(culprits)]),
        "other_site": log_site(ctx, detail[~detail["rank"].isin(culprits)]),
        "collective": "as TORCH_DISTRIBUTED_DEBUG=DETAIL reported it",
    }
    differ = "op" if odd[0] != norm[0] else "shapes" if odd[1] != norm[1] else "dtypes"
    cause = DIFFERENT_CALL[differ]
    ranks = sorted(seen)
    seq = next((fp[3] for fp in seen.values() if fp[3] is not None), None)
    info = CollectiveInfo(
        pg="unknown",
        pg_desc=None,
        pg_ranks=ranks,
        seq=seq,
        op_by_rank={r: seen[r][0] for r in ranks},
        site_by_rank={r: log_site(ctx, detail[detail["rank"] == r]) for r in ranks},
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
