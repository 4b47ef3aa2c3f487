"""Progress: collectives completed and steps per rank over time, and each rank's heartbeat age."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rankscope.plot._common import (
    ALERT,
    ALIKE_FROM,
    MUTED,
    PALETTE,
    empty_figure,
    floats,
    rank_rows,
    scatter,
    time_origin,
)
from rankscope.rundir import MANAGEMENT_OPS
from rankscope.state import CALL_STATES, STEP_LABEL, call_states

TITLE = "Progress"
#: Up to this many ranks, each rank's line has a colour of its own.
OWN_COLOURS = 8


def progress(
    events: pd.DataFrame,
    *,
    collectives: pd.DataFrame | None = None,
    now: float | None = None,
    highlight: Iterable[int] = (),
    classes: Iterable[Iterable[int]] = (),
    since: float | None = None,
) -> go.Figure:
    """Panels stacked over one another: collectives completed per rank over time, the user's
    step marker per rank over time (only when some rank marked steps), and each rank's
    heartbeat age (seconds since its last event) at ``now``.

    Up to :data:`OWN_COLOURS` ranks, each rank's line has a colour of its own (the legend names
    them); past that every rank is grey in one WebGL trace. The highlighted ranks are drawn
    again in red, so a rank that stopped while the others went on (or the reverse) shows as a
    flat line. Past :data:`~rankscope.plot._common.ALIKE_FROM` ranks, ranks alike
    (:func:`~rankscope.plot._common.rank_rows`: the ``classes`` given, else the same count of
    calls completed and last step) are drawn by their lowest rank and share a bar of the
    heartbeat ages, as high as the oldest of them; highlighted ranks and outliers have a bar
    each, named.

    Args:
        events: the run's ``events`` table (the probe's events).
        collectives: the run's ``collectives`` table: a call counts when the backend completed
            it (an async call's Work, after it returned), as every view counts; without it, when
            it returned (the events' exits).
        now: wall-clock seconds since the epoch; by default the latest event.
        highlight: ranks to draw in red (a diagnosis's culprits).
        classes: groups of ranks alike (the classes of a diagnosis's first divergence).
        since: wall-clock seconds since the epoch from which the axis counts (the first event,
            where it is later or not given), as :func:`~rankscope.plot.rank_timeline` takes it.

    Returns:
        The figure; x of the line panels is seconds since ``since``.
    """
    ev = events[events["t_s"].notna()]
    if ev.empty:
        return empty_figure(TITLE, "no probe events in this run")
    t = floats(ev["t_s"])
    t0 = float(t.min()) if since is None else min(float(since), float(t.min()))
    now = float(t.max()) if now is None else max(float(now), float(t.max()))
    marked = sorted(set(highlight))
    kind = ev["ev"].astype(str).to_numpy()
    exits = _completed(ev, kind, collectives)
    steps = ev[(kind == "step") & ev["step"].notna().to_numpy()]
    panels = [
        "collectives completed",
        *([STEP_LABEL] if len(steps) else []),
        "heartbeat age at now",
    ]
    fig = make_subplots(
        rows=len(panels),
        cols=1,
        vertical_spacing=0.16 if len(panels) == 3 else 0.2,
        row_heights=[0.4, 0.3, 0.3] if len(panels) == 3 else [0.6, 0.4],
        subplot_titles=panels,
    )
    ranks = sorted(ev["rank"].dropna().astype(int).unique().tolist())
    state = None
    if len(ranks) > ALIKE_FROM:  # alike: as many calls completed, the same last step
        count = exits.groupby("rank").size().reindex(ranks, fill_value=0)
        step = steps.sort_values("t_s", kind="stable").groupby("rank")["step"].last()
        state = (count.astype(str) + " " + step.reindex(count.index).astype(str)).to_dict()
    alike = rank_rows(ranks, culprits=marked, classes=classes, state=state)
    drawn = set(alike.shown.tolist()) | set(marked)
    exits = exits[exits["rank"].isin(drawn).to_numpy(dtype=bool)]
    steps = steps[steps["rank"].isin(drawn).to_numpy(dtype=bool)]
    own = len(alike.shown) <= OWN_COLOURS
    # a line's name, as the other views label its row: "rank 37", "1023 ranks: 0-36, 38-1023"
    names = {
        int(m[0]): f"rank {m[0]}" if len(m) == 1 else label
        for m, label in zip(alike.members, alike.labels(), strict=True)
    }
    done = pd.Series(
        exits.sort_values(["rank", "t_s"], kind="stable").groupby("rank").cumcount() + 1
    ).reindex(exits.index)
    lines = [(exits, done)] + ([(steps, steps["step"].astype(float))] if len(steps) else [])
    for row, (rows, value) in enumerate(lines, start=1):
        _rank_lines(fig, rows, value, row=row, t0=t0, now=now, marked=marked, own=own, names=names)
        # the whole job, from its first event to now: a rank that completed nothing for a
        # while shows as the flat start it is, not cut off
        fig.update_xaxes(title={"text": time_origin(t0)}, range=[0, now - t0], row=row, col=1)
    last = ev.groupby("rank")["t_s"].max()
    # a bar per row: the oldest heartbeat of the ranks it stands for
    age = [float(now - last.reindex(m).min()) for m in alike.members]
    colour = [ALERT if set(m) & set(marked) else PALETTE[0] for m in alike.members]
    bars = len(panels)
    fig.add_trace(
        go.Bar(
            x=np.arange(len(alike.shown)) if alike.grouped else alike.shown,
            y=age,
            marker={"color": colour},
            name="heartbeat age",
            customdata=[label.replace("<b>", "").replace("</b>", "") for label in alike.labels()],
            hovertemplate="%{customdata}: last event %{y:.1f} s before now<extra></extra>",
            showlegend=False,
        ),
        row=bars,
        col=1,
    )
    if alike.grouped:  # a bar per group of ranks alike, each labelled
        axis = alike.axis(across=True)
        fig.update_xaxes(
            title=axis["title"],
            tickmode="array",
            tickvals=axis["tickvals"],
            ticktext=axis["ticktext"],
            row=bars,
            col=1,
        )
    else:  # ranks are whole numbers: a tick per rank
        fig.update_xaxes(
            title={"text": "rank"}, row=bars, col=1, tickmode="array", tickvals=alike.shown.tolist()
        )
    fig.update_yaxes(title={"text": "seconds"}, row=bars, col=1)
    fig.update_layout(
        title={
            "text": f"{TITLE}: {len(last)} ranks"
            + (f", {len(alike.shown)} drawn for ranks alike" if alike.grouped else ""),
            # at the very top, clear of the legend under it
            "yref": "container",
            "y": 1.0,
            "yanchor": "top",
            "pad": {"t": 10},
        },
        height=760 if len(panels) == 3 else 560,
        hovermode="closest",
        margin={"l": 60, "r": 20, "t": 120, "b": 40},
        legend={"orientation": "h", "y": 1.04, "yanchor": "bottom"},
    )
    return fig


def _completed(
    ev: pd.DataFrame, kind: np.ndarray, collectives: pd.DataFrame | None
) -> pd.DataFrame:
    """(rank, t_s) of each collective completed, as every view counts them (RankRecord.done):
    without an error (rankscope.state.call_state), when the backend completed it, the
    process-group management calls left out; from the events' exits (when each returned)
    where there is no collectives table."""
    if collectives is None or collectives.empty:
        done = kind == "exit"
        done &= ~ev["op"].isin(list(MANAGEMENT_OPS)).to_numpy(dtype=bool)
        done &= call_states(np.ones(len(ev), dtype=bool), ev["ok"]) == CALL_STATES.index(
            "completed"
        )
        return ev.loc[done, ["rank", "t_s"]]
    c = collectives
    # a copy: without nulls, the column's own data would come back and be written over
    done = c["completed"].fillna(False).to_numpy(dtype=bool, copy=True)
    done &= c["ok"].fillna(False).to_numpy(dtype=bool)
    done &= ~c["op"].isin(list(MANAGEMENT_OPS)).to_numpy(dtype=bool)
    c = c[done]
    return pd.DataFrame({"rank": c["rank"], "t_s": c["t_done_s"].fillna(c["t_end_s"])})


def _rank_lines(
    fig: go.Figure,
    rows: pd.DataFrame,
    value: pd.Series,
    *,
    row: int,
    t0: float,
    now: float,
    marked: list[int],
    own: bool,
    names: dict[int, str],
) -> None:
    """One polyline per rank (broken by NaN), held flat up to ``now``: a trace per rank in a
    colour of its own (``own``), or all ranks in one grey trace; the marked ranks again in
    red."""
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
    if own:
        parts = [
            ([r], names.get(int(r), f"rank {r}"), PALETTE[i % len(PALETTE)], 1.5)
            for i, r in enumerate(sorted(frame["rank"].unique()))
        ]
    else:
        parts = [(None, "all ranks", MUTED, 1.0)]
    parts.append((marked, "highlighted", ALERT, 3.0))
    for ranks, name, colour, width in parts:
        part = frame if ranks is None else frame[frame["rank"].isin(ranks)]
        if part.empty:
            continue
        r = part["rank"].to_numpy()
        breaks = np.flatnonzero(np.diff(r)) + 1
        fig.add_trace(
            scatter(2 * len(frame))(
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
