"""The sequence ladder: per rank and process group, the last collective entered and completed."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from rankscope.plot._common import (
    ALERT,
    PALETTE,
    add_segments,
    as_calls,
    empty_figure,
    group_order,
    highlight_ranks,
    nice_step,
    rank_rows,
    scatter,
    text_or,
)

TITLE = "Sequence ladder"
#: Groups beyond this many (the smallest) share one colour as "other groups".
MAX_GROUPS = len(PALETTE) - 1
#: Columns of :func:`ladder_table`.
LADDER = {
    "pg": "string",
    "rank": "int64",
    "entered": "int64",
    "completed": "int64",
    "front": "int64",
    "op": "string",
    "site": "string",
    "state": "string",
}


def ladder_table(calls: pd.DataFrame) -> pd.DataFrame:
    """Per (process group, rank): the last collective entered and the last one completed.

    ``entered`` and ``completed`` count the rank's collectives on the group (the analyzer's
    ``seq``; point-to-point calls are left out; a call that failed is not completed: the
    state is :func:`rankscope.state.call_state`'s, every view's); ``front`` is the furthest any
    rank of the group entered; ``op``, ``site`` and ``state`` are those of the last call
    entered. Example::

          pg  rank  entered  completed  front          op         site      state
        0  0     0        4          3      4     barrier  train.py:16     issued
        1  0     1        3          3      4  all_reduce  train.py:14  completed
    """
    table = as_calls(calls)
    coll = table[table["seq"].notna()]
    if coll.empty:
        return pd.DataFrame({c: pd.Series([], dtype=t) for c, t in LADDER.items()})
    last = coll.loc[coll.groupby(["pg", "rank"], observed=True)["seq"].idxmax().to_numpy()]
    done = coll[coll["state"].eq("completed").to_numpy(dtype=bool)]
    completed = done.groupby(["pg", "rank"], observed=True)["seq"].max()
    keys = pd.MultiIndex.from_arrays([last["pg"], last["rank"]])
    out = pd.DataFrame(
        {
            "pg": last["pg"].astype(str).to_numpy(),
            "rank": last["rank"].to_numpy(dtype=np.int64),
            "entered": last["seq"].to_numpy(dtype=np.int64),
            "completed": completed.reindex(keys).fillna(0).to_numpy(dtype=np.int64),
            "front": last.groupby("pg", observed=True)["seq"].transform("max").to_numpy(np.int64),
            "op": text_or(last["op"]).to_numpy(),
            "site": text_or(last["site"]).to_numpy(),
            "state": last["state"].astype(str).to_numpy(),
        }
    )
    out = out.astype(LADDER)
    # groups in numeric order (0, 1, 2, 10), named ones after
    number = pd.to_numeric(out["pg"], errors="coerce").astype(float)
    out = out.assign(_named=number.isna(), _n=number).sort_values(
        ["_named", "_n", "pg", "rank"], kind="stable"
    )
    return out.drop(columns=["_named", "_n"]).reset_index(drop=True)


def sequence_ladder(
    calls: pd.DataFrame,
    *,
    culprit_ranks: Iterable[int] = (),
    classes: Iterable[Iterable[int]] = (),
) -> go.Figure:
    """Per rank and process group, the last collective entered (open triangle) and completed
    (dot), joined by a red rung while the call is in flight, counted from the furthest rank of
    the group: ranks in step sit on one line, and the rank behind or ahead stands out.
    Groups are in numeric order. Past :data:`~rankscope.plot._common.ALIKE_FROM` ranks, ranks
    alike share a column (:func:`~rankscope.plot._common.rank_rows`: the ``classes`` given,
    else the ranks equally far from every front), drawn by their lowest rank; culprits and
    outliers have a column each, named.

    Args:
        calls: the run's ``collectives`` table, its ``flight_recorder`` table or a calls table.
        culprit_ranks: ranks to highlight (a diagnosis's ``culprit_ranks``).
        classes: groups of ranks alike (the classes of a diagnosis's first divergence).

    Returns:
        The figure: x is the rank, y the collective's number relative to its group's front (0
        is the furthest any rank of the group got); hovering shows the numbers themselves.
    """
    lad = ladder_table(calls)
    if lad.empty:
        return empty_figure(TITLE, "no collectives in this run")
    culprits = sorted(set(culprit_ranks))
    offsets = (
        (lad["entered"] - lad["front"]).astype(str)
        + "/"
        + (lad["completed"] - lad["front"]).astype(str)
    )
    state = offsets.groupby(lad["rank"]).agg(" ".join).to_dict()
    rows = rank_rows(
        lad["rank"].tolist() + culprits, culprits=culprits, classes=classes, state=state
    )
    at = rows.y(lad["rank"].to_numpy(dtype=np.int64))
    lad = lad[~np.isnan(at)].reset_index(drop=True)
    rank = at[~np.isnan(at)]
    sizes = lad["pg"].value_counts(sort=False).sort_values(ascending=False, kind="stable")
    big = sizes.index[: MAX_GROUPS if len(sizes) > MAX_GROUPS + 1 else len(sizes)].tolist()
    big = sorted(big, key=group_order)
    group = lad["pg"].where(lad["pg"].isin(big), "other").astype(str).to_numpy()
    entered = (lad["entered"] - lad["front"]).to_numpy(float)
    completed = (lad["completed"] - lad["front"]).to_numpy(float)
    size = float(np.clip(600 / len(rows.shown), 3, 10))
    fig = go.Figure()
    failed = (lad["state"] == "failed").to_numpy(dtype=bool)
    waiting = (entered > completed) & ~failed
    if failed.any():  # the last call entered raised: a red cross on it, no rung
        fig.add_trace(
            scatter(3 * len(lad))(
                x=rank[failed],
                y=entered[failed],
                mode="markers",
                marker={"symbol": "x", "size": size + 2, "color": ALERT},
                name="failed",
                hoverinfo="skip",
            )
        )
    if waiting.any():
        add_segments(
            fig,
            completed[waiting],
            entered[waiting],
            rank[waiting],
            name="in flight",
            colour=ALERT,
            width=max(size / 3, 1),
            vertical=True,
            points=3 * len(lad),
        )
    alike = pd.Series([len(m) - 1 for m in rows.members], index=rows.shown)
    others = lad["rank"].map(alike).fillna(0).astype(int)
    hover = (
        "rank "
        + lad["rank"].astype(str)
        + np.where(others > 0, " (and " + others.astype(str) + " ranks alike)", "")
        + " · group "
        + lad["pg"]
        + "<br>entered #"
        + lad["entered"].astype(str)
        + " ("
        + lad["op"]
        + " at "
        + lad["site"]
        + ") "
        + lad["state"]
        + "<br>completed #"
        + lad["completed"].astype(str)
        + "<br>the group's front: #"
        + lad["front"].astype(str)
    ).to_numpy(dtype=object)
    for i, name in enumerate([*big, "other"]):
        pick = group == name
        if not pick.any():
            continue
        label = f"group {name}" if name != "other" else "other groups"
        for y, kind, symbol in (
            (entered, "entered", "triangle-up-open"),
            (completed, "completed", "circle"),
        ):
            fig.add_trace(
                scatter(3 * len(lad))(
                    x=rank[pick],
                    y=y[pick],
                    mode="markers",
                    marker={"symbol": symbol, "size": size, "color": PALETTE[i % len(PALETTE)]},
                    name=f"{label}: {kind}",
                    legendgroup=label,
                    hovertext=hover[pick],
                    hoverinfo="text",
                )
            )
    highlight_ranks(fig, rows.y(np.array(culprits, dtype=np.int64)).astype(int).tolist(), axis="x")
    low = float(min(completed.min(), entered.min()))
    fig.update_layout(
        title={"text": f"{TITLE}: last collective entered and completed, per group"},
        height=380,
        xaxis=rows.axis(across=True),
        yaxis={
            "title": {"text": "collectives behind the group's front"},
            "range": [low - 0.5, 0.5],
            "dtick": nice_step(-low / 6),
        },
        legend={"orientation": "h", "y": -0.2},
        hovermode="closest",
        margin={"l": 60, "r": 20, "t": 50, "b": 40},
    )
    return fig
