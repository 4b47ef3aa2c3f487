"""Progress: collectives completed and steps per rank over time, and each rank's heartbeat age."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rankscope.plot._common import ALERT, MUTED, PALETTE, empty_figure, floats, time_origin

TITLE = "Progress"


def progress(
    events: pd.DataFrame, *, now: float | None = None, highlight: Iterable[int] = ()
) -> go.Figure:
    """Three panels: collectives completed per rank over time, the user's step marker per rank
    over time, and each rank's heartbeat age (seconds since its last event) at ``now``.

    Every rank's line is drawn in grey in one WebGL trace and the highlighted ranks again in
    red, so a rank that stopped while the others went on (or the reverse) shows as a flat line.

    Args:
        events: the run's ``events`` table (the probe's events).
        now: wall-clock seconds since the epoch; by default the latest event.
        highlight: ranks to draw in red (a diagnosis's culprits).

    Returns:
        The figure; x of the first two panels is seconds since the first event.
    """
    ev = events[events["t_s"].notna()]
    if ev.empty:
        return empty_figure(TITLE, "no probe events in this run")
    t = floats(ev["t_s"])
    t0 = float(t.min())
    now = float(t.max()) if now is None else max(float(now), float(t.max()))
    marked = sorted(set(highlight))
    fig = make_subplots(
        rows=3,
        cols=1,
        vertical_spacing=0.1,
        row_heights=[0.4, 0.3, 0.3],
        subplot_titles=("collectives completed", "step", "heartbeat age at now"),
    )
    kind = ev["ev"].astype(str).to_numpy()
    exits = ev[kind == "exit"]
    done = pd.Series(
        exits.sort_values(["rank", "t_s"], kind="stable").groupby("rank").cumcount() + 1
    ).reindex(exits.index)
    _rank_lines(fig, exits, done, row=1, t0=t0, now=now, marked=marked)
    steps = ev[(kind == "step") & ev["step"].notna().to_numpy()]
    _rank_lines(fig, steps, steps["step"].astype(float), row=2, t0=t0, now=now, marked=marked)
    last = ev.groupby("rank")["t_s"].max()
    age = now - floats(last)
    colour = [ALERT if r in marked else PALETTE[0] for r in last.index]
    fig.add_trace(
        go.Bar(
            x=last.index.to_numpy(),
            y=age,
            marker={"color": colour},
            name="heartbeat age",
            hovertemplate="rank %{x}: last event %{y:.1f} s before now<extra></extra>",
            showlegend=False,
        ),
        row=3,
        col=1,
    )
    fig.update_xaxes(title={"text": time_origin(t0)}, row=2, col=1)
    fig.update_xaxes(title={"text": "rank"}, row=3, col=1)
    fig.update_yaxes(title={"text": "seconds"}, row=3, col=1)
    fig.update_layout(
        title={"text": f"{TITLE}: {len(last)} ranks"},
        height=720,
        hovermode="closest",
        margin={"l": 60, "r": 20, "t": 70, "b": 40},
        legend={"orientation": "h", "y": 1.06},
    )
    return fig


def _rank_lines(
    fig: go.Figure,
    rows: pd.DataFrame,
    value: pd.Series,
    *,
    row: int,
    t0: float,
    now: float,
    marked: list[int],
) -> None:
    """One polyline per rank (broken by NaN) in one trace, held flat up to ``now``."""
    if rows.empty:
        axis = "" if row == 1 else str(row)
        fig.add_annotation(
            text="none recorded",
            showarrow=False,
            xref=f"x{axis} domain",
            yref=f"y{axis} domain",
            x=0.5,
            y=0.5,
        )
        return
    frame = pd.DataFrame(
        {
            "rank": rows["rank"].to_numpy(dtype=np.int64),
            "t": floats(rows["t_s"]),
            "v": value.to_numpy(float),
        }
    ).sort_values(["rank", "t"], kind="stable")
    tail = frame.groupby("rank", as_index=False).last().assign(t=now)
    frame = pd.concat([frame, tail]).sort_values(["rank", "t"], kind="stable", ignore_index=True)
    for ranks, name, colour, width in (
        (None, "all ranks", MUTED, 1),
        (marked, "highlighted", ALERT, 2.5),
    ):
        part = frame if ranks is None else frame[frame["rank"].isin(ranks)]
        if part.empty:
            continue
        r = part["rank"].to_numpy()
        breaks = np.flatnonzero(np.diff(r)) + 1
        fig.add_trace(
            go.Scattergl(
                x=np.insert(part["t"].to_numpy() - t0, breaks, np.nan).astype(np.float32),
                y=np.insert(part["v"].to_numpy(), breaks, np.nan).astype(np.float32),
                customdata=np.insert(r.astype(np.float32), breaks, np.nan),
                mode="lines",
                line={"color": colour, "width": width, "shape": "hv"},
                name=name,
                legendgroup=name,
                showlegend=row == 1,
                hovertemplate="rank %{customdata}: %{y} at %{x:.2f} s<extra></extra>",
            ),
            row=row,
            col=1,
        )
