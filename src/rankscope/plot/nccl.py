"""NCCL view: communicator set-up per rank, in the order each rank logged it, warnings marked."""

from __future__ import annotations

from collections.abc import Iterable

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
    highlight_ranks,
    rank_rows,
    rows_height,
    scatter,
    text_or,
)

TITLE = "NCCL communicators"


def nccl_view(
    nccl_comms: pd.DataFrame,
    nccl: pd.DataFrame | None = None,
    *,
    culprit_ranks: Iterable[int] = (),
    classes: Iterable[Iterable[int]] = (),
) -> go.Figure:
    """One row per rank: each communicator's ``Init START`` and ``Init COMPLETE`` joined by a
    bar, an init that never completed drawn in red to the end of the rank's log, and NCCL
    ``WARN`` lines marked with a red cross. Past :data:`~rankscope.plot._common.ALIKE_FROM`
    ranks, ranks alike share a row (:func:`~rankscope.plot._common.rank_rows`: the ``classes``
    given, else the ranks whose inits started, completed and warned alike), drawn by their
    lowest rank, its hover naming the group; culprits and outliers have a row each, named.

    NCCL stamps only its warnings with a time, so x is the position in the rank's NCCL log
    (its line number): the order of events per rank, which is what shows a rank stuck in
    ``ncclCommInitRank`` while the others went on.

    Args:
        nccl_comms: the run's ``nccl_comms`` table.
        nccl: the run's ``nccl`` table (every NCCL line), for warnings and log ends.
        culprit_ranks: ranks to highlight (a diagnosis's ``culprit_ranks``).
        classes: groups of ranks alike (the classes of a diagnosis's first divergence).

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
    culprits = sorted({int(r) for r in culprit_ranks})
    ranks = sorted({int(r) for r in ends.index} | set(culprits))
    warn = lines[
        (lines["level"].astype(str) == "WARN").to_numpy() & lines["rank"].notna().to_numpy()
    ]
    n_warn = len(warn)
    rows = rank_rows(ranks, culprits=culprits, classes=classes, state=_alike(comms, warn, ranks))
    # the rows drawn: a rank of its own, or the lowest rank of a group alike
    comms = comms[~np.isnan(rows.y(comms["rank"].to_numpy(dtype=np.int64)))]
    warn = warn[~np.isnan(rows.y(warn["rank"].to_numpy(dtype=np.int64)))]
    height = rows_height(len(rows.shown))
    width = bar_width(height, len(rows.shown))
    init = comms.pivot_table(
        index=["rank", "comm_id"], columns="state", values="line_no", aggfunc="min", observed=True
    ).reindex(columns=["START", "COMPLETE"])
    if not init.empty:
        init = init.reset_index()
        rank = rows.y(init["rank"].to_numpy(dtype=np.int64))
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
        pd.Series(rows.who(comms["rank"].to_numpy(dtype=np.int64)), index=comms.index)
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
                y=rows.y(comms["rank"][part].to_numpy(dtype=np.int64)),
                mode="markers",
                marker={"symbol": symbol, "size": 9, "color": PALETTE[0]},
                name=f"Init {state}",
                hovertext=("Init " + state + "<br>" + hover[part]).to_numpy(),
                hoverinfo="text",
            )
        )
    if not warn.empty:
        fig.add_trace(
            scatter(points)(
                x=floats(warn["line_no"]),
                y=rows.y(warn["rank"].to_numpy(dtype=np.int64)),
                mode="markers",
                marker={"symbol": "x", "size": 11, "color": ALERT},
                name="WARN",
                hovertext=(
                    pd.Series(rows.who(warn["rank"].to_numpy(dtype=np.int64)), index=warn.index)
                    + ": "
                    + text_or(warn["message"])
                ).to_numpy(),
                hoverinfo="text",
            )
        )
    highlight_ranks(fig, rows.y(np.array(culprits, dtype=np.int64)).astype(int).tolist(), axis="y")
    n_comms = nccl_comms["comm_id"].nunique()
    fig.update_layout(
        title={
            "text": f"{TITLE}: {n_comms} communicator{'s' * (n_comms != 1)}, "
            f"{n_warn} warning{'s' * (n_warn != 1)}"
        },
        height=height,
        xaxis={"title": {"text": "line in the rank's NCCL log"}, "rangemode": "tozero"},
        yaxis=rows.axis(),
        hovermode="closest",
        legend={"orientation": "h", "y": -0.2},
        margin={"l": 60, "r": 20, "t": 50, "b": 40},
    )
    return fig


def _alike(comms: pd.DataFrame, warn: pd.DataFrame, ranks: list[int]) -> dict[int, str]:
    """Each rank's set-up in a few numbers (communicators whose init started, completed;
    warnings): ranks with the same are alike."""
    started = comms[comms["state"] == "START"].groupby("rank")["comm_id"].nunique()
    done = comms[comms["state"] == "COMPLETE"].groupby("rank")["comm_id"].nunique()
    warned = warn.groupby("rank").size()
    table = pd.DataFrame({"s": started, "d": done, "w": warned}).reindex(ranks).fillna(0)
    text = (
        table["s"].astype(int).astype(str)
        + " started, "
        + table["d"].astype(int).astype(str)
        + " completed, "
        + table["w"].astype(int).astype(str)
        + " warnings"
    )
    return text.to_dict()
