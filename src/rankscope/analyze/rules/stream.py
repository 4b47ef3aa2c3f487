"""6. ``stream_stuck``: a collective that some ranks' devices started and others' never did
(nccl with timing, from the recorder's entry states): those ranks' streams are held by earlier
work."""

from __future__ import annotations

import numpy as np

from rankscope.analyze.causes import Cause
from rankscope.analyze.context import Context
from rankscope.analyze.diagnosis import EvidenceRef, who_of
from rankscope.analyze.rules.finding import Finding, rule
from rankscope.state import agree


@rule(60)
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
    # Masks over the whole table first: its rows are only copied where some entry waits.
    is_coll = (
        fr["collective_seq_id"].notna().to_numpy(dtype=bool)
        & ~fr["is_p2p"].fillna(False).to_numpy(dtype=bool)
        & fr["backend"].eq("nccl").to_numpy(dtype=bool)
    )
    has_start = fr["time_discovered_started_ns"].notna().to_numpy(dtype=bool)
    rank = fr["rank"].array.to_numpy(dtype=np.int64, na_value=-1)
    timed = np.zeros(int(rank.max(initial=0)) + 2, dtype=bool)  # [-1]: a dump of no known rank
    timed[rank[is_coll & has_start]] = True
    scheduled = fr["state"].eq("scheduled").to_numpy(dtype=bool)
    # A start time says it began, whatever the state.
    waits = is_coll & scheduled & ~has_start & timed[rank]
    waits[rank < 0] = False  # a rank unknown is never in the timed ranks
    if not waits.any():
        return None
    coll = fr[is_coll]
    state = coll["state"].astype(str)
    began = state.isin(["started", "completed"]) | coll["time_discovered_started_ns"].notna()
    waiting = fr[waits]
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
            cause=Cause.stream_stuck,
            culprits=culprits,
            waiting=others,
            facts={
                "culprit_op": op,
                "collective": f"group {pg}, collective #{int(seq)}",
                "others_started": f"{who_of(others)} started it and {agree(who_of(others), 'waits', 'wait')}"
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
