"""Memory per rank: what each rank holds, stacked, with its peak, one panel per run or setting."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rankscope.plot._common import MUTED, PALETTE, empty_figure, rank_axis

TITLE = "Memory per rank"
MIB = float(2**20)

#: The byte columns stacked by default, and their legend labels.
HELD: Mapping[str, str] = {
    "param_bytes": "parameters",
    "grad_bytes": "gradients",
    "optim_bytes": "optimizer state",
}


def memory_by_rank(
    table: pd.DataFrame,
    *,
    held: Mapping[str, str] = HELD,
    peak: tuple[str, str] | None = ("gathered_peak_bytes", "peak gathered parameters"),
    lines: Mapping[str, str] | None = None,
    by: str | None = None,
    title: str = TITLE,
) -> go.Figure:
    """Stacked bars of the bytes each rank holds, a marker at each rank's peak, and reference
    lines (a budget, the whole model), in MiB; with ``by``, one panel per value of that column,
    side by side on a shared axis, so two settings of the same job compare at a glance.

    Args:
        table: one row per rank (per rank and ``by`` value): a ``rank`` column and byte counts,
            such as the ``rankscope-memory`` lines the FSDP scenarios print, one per rank::

                   rank  param_bytes  grad_bytes  optim_bytes  gathered_peak_bytes   wrapping
                0     0      4204548     4204548      8409168              8407044  root only
                1     1      4202496     4202496      8405064              8407044  root only

        held: byte columns stacked in each bar, and their legend labels.
        peak: ``(column, label)`` of a per-rank peak drawn as a marker, or None.
        lines: byte columns drawn as a dashed line across each panel (at the panel's largest
            value of the column), and their labels: a budget, the size of the whole model.
        by: a column whose values split the rows into panels, in order of appearance.
        title: the figure's title.

    Returns:
        The figure.

    Raises:
        ValueError: a named column is missing.
    """
    lines = dict(lines or {})
    wanted = ["rank", *held, *([peak[0]] if peak else []), *lines, *([by] if by else [])]
    missing = [c for c in wanted if c not in table.columns]
    if missing:
        raise ValueError(f"columns {missing} missing; the table has {list(table.columns)}")
    if table.empty:
        return empty_figure(title, "no memory records")
    panels = list(pd.unique(table[by])) if by else [None]
    fig = make_subplots(
        rows=1,
        cols=len(panels),
        shared_yaxes=True,
        horizontal_spacing=0.04,
        subplot_titles=[str(p) for p in panels] if by else None,
    )
    for col, value in enumerate(panels, start=1):
        rows = table if by is None else table[table[by] == value]
        rows = rows.sort_values("rank", kind="stable")
        ranks = rows["rank"].to_numpy(dtype=np.int64)
        for i, (column, label) in enumerate(held.items()):
            fig.add_trace(
                go.Bar(
                    x=ranks,
                    y=_mib(rows[column]),
                    name=label,
                    legendgroup=label,
                    showlegend=col == 1,
                    marker={"color": PALETTE[i % len(PALETTE)]},
                    hovertemplate=f"rank %{{x}}: {label} %{{y:.2f}} MiB<extra></extra>",
                ),
                row=1,
                col=col,
            )
        if peak is not None:
            column, label = peak
            fig.add_trace(
                go.Scatter(
                    x=ranks,
                    y=_mib(rows[column]),
                    mode="markers",
                    name=label,
                    legendgroup=label,
                    showlegend=col == 1,
                    marker={"symbol": "diamond", "size": 11, "color": "black"},
                    hovertemplate=f"rank %{{x}}: {label} %{{y:.2f}} MiB<extra></extra>",
                ),
                row=1,
                col=col,
            )
        for column, label in lines.items():
            level = float(np.nanmax(_mib(rows[column])))
            fig.add_hline(
                y=level,
                line={"color": MUTED, "dash": "dash"},
                annotation_text=label,
                annotation_position="top left",
                row=1,
                col=col,
            )
        fig.update_xaxes(**rank_axis([int(r) for r in ranks]), row=1, col=col)
    fig.update_yaxes(title={"text": "MiB"}, row=1, col=1)
    fig.update_layout(
        title={"text": title},
        barmode="stack",
        height=420,
        margin={"l": 60, "r": 20, "t": 80, "b": 40},
        legend={"orientation": "h", "y": -0.15},
    )
    return fig


def _mib(s: pd.Series) -> np.ndarray:
    return s.astype("Float64").to_numpy(dtype=float, na_value=np.nan) / MIB
