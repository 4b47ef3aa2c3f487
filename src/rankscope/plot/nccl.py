"""NCCL view: communicator set-up per rank, in the order each rank logged it, warnings marked."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from rankscope import schema
from rankscope.plot._common import (
    ALERT,
    PALETTE,
    add_segments,
    bar_width,
    empty_figure,
    floats,
    rank_axis,
    rows_height,
    scatter,
    text_or,
)

TITLE = "NCCL communicators"


def nccl_view(nccl_comms: pd.DataFrame, nccl: pd.DataFrame | None = None) -> go.Figure:
    """One row per rank: each communicator's ``Init START`` and ``Init COMPLETE`` joined by a
    bar, an init that never completed drawn in red to the end of the rank's log, and NCCL
    ``WARN`` lines marked with a red cross.

    NCCL stamps only its warnings with a time, so x is the position in the rank's NCCL log
    (its line number): the order of events per rank, which is what shows a rank stuck in
    ``ncclCommInitRank`` while the others went on.

    Args:
        nccl_comms: the run's ``nccl_comms`` table.
        nccl: the run's ``nccl`` table (every NCCL line), for warnings and log ends.

    Returns:
        The figure.
    """
    lines = nccl if nccl is not None else schema.empty("nccl")
    if nccl_comms.empty and lines.empty:
        return empty_figure(
            TITLE, "no NCCL logs in this run (backend nccl with the nccl_debug preset)"
        )
    comms = nccl_comms[nccl_comms["rank"].notna() & nccl_comms["state"].isin(["START", "COMPLETE"])]
    fig = go.Figure()
    points = 2 * len(comms)  # init bars and markers (the warnings are few)
    ends = (
        pd.concat([lines[["rank", "line_no"]], comms[["rank", "line_no"]]])
        .groupby("rank")["line_no"]
        .max()
    )
    ranks = sorted(int(r) for r in ends.index)
    height = rows_height(len(ranks))
    width = bar_width(height, len(ranks))
    init = comms.pivot_table(
        index=["rank", "comm_id"], columns="state", values="line_no", aggfunc="min", observed=True
    ).reindex(columns=["START", "COMPLETE"])
    if not init.empty:
        init = init.reset_index()
        rank = init["rank"].to_numpy(dtype=float)
        start = init["START"].to_numpy(dtype=float)
        done = init["COMPLETE"].to_numpy(dtype=float)
        stuck = np.isnan(done) & ~np.isnan(start)
        finished = ~np.isnan(done) & ~np.isnan(start)
        end_of_log = ends.reindex(init["rank"]).to_numpy(dtype=float)
        for pick, x1, name, colour in (
            (finished, done, "init", PALETTE[0]),
            (stuck, end_of_log, "init not completed", ALERT),
        ):
            if pick.any():
                add_segments(
                    fig,
                    start[pick],
                    x1[pick],
                    rank[pick],
                    name=name,
                    colour=colour,
                    width=width,
                    points=points,
                )
    hover = (
        "rank "
        + comms["rank"].astype(str)
        + "<br>comm "
        + text_or(comms["comm_id"])
        + " "
        + text_or(comms["comm"])
        + "<br>nccl rank "
        + text_or(comms["nccl_rank"])
        + " of "
        + text_or(comms["nranks"])
        + "<br>NCCL "
        + text_or(comms["nccl_version"])
    )
    for state, symbol in (("START", "circle-open"), ("COMPLETE", "circle")):
        part = (comms["state"] == state).to_numpy()
        fig.add_trace(
            scatter(points)(
                x=floats(comms["line_no"][part]),
                y=floats(comms["rank"][part]),
                mode="markers",
                marker={"symbol": symbol, "size": 9, "color": PALETTE[0]},
                name=f"Init {state}",
                hovertext=("Init " + state + "<br>" + hover[part]).to_numpy(),
                hoverinfo="text",
            )
        )
    warn = lines[
        (lines["level"].astype(str) == "WARN").to_numpy() & lines["rank"].notna().to_numpy()
    ]
    if not warn.empty:
        fig.add_trace(
            scatter(points)(
                x=floats(warn["line_no"]),
                y=floats(warn["rank"]),
                mode="markers",
                marker={"symbol": "x", "size": 11, "color": ALERT},
                name="WARN",
                hovertext=(
                    "rank " + warn["rank"].astype(str) + ": " + text_or(warn["message"])
                ).to_numpy(),
                hoverinfo="text",
            )
        )
    n_comms = comms["comm_id"].nunique()
    fig.update_layout(
        title={"text": f"{TITLE}: {n_comms} communicators, {len(warn)} warnings"},
        height=height,
        xaxis={"title": {"text": "line in the rank's NCCL log"}, "rangemode": "tozero"},
        yaxis=rank_axis(ranks, top_down=True),
        hovermode="closest",
        legend={"orientation": "h", "y": -0.2},
        margin={"l": 60, "r": 20, "t": 50, "b": 40},
    )
    return fig
