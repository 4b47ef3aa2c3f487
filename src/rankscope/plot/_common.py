"""What every plot shares: the calls table, colours, the rank axis and time origin."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from rankscope.analyze import calls_from_flight_recorder, calls_from_probe
from rankscope.analyze.diagnosis import compact_ranks

#: Red is kept for what needs attention (culprits, calls in flight, warnings).
ALERT = "#d62728"
HIGHLIGHT_FILL = "rgba(214, 39, 40, 0.12)"
MUTED = "rgba(110, 110, 110, 0.45)"
#: Categorical colours without red (plotly's D3 set minus its red).
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")
#: Up to this many ranks every rank gets its own tick label.
LABEL_EVERY_RANK = 64


def as_calls(table: pd.DataFrame) -> pd.DataFrame:
    """The analyzer's calls table (:data:`rankscope.analyze.CALLS`) from any source of calls.

    Args:
        table: the run's ``collectives`` table (the probe), its ``flight_recorder`` table
            (foreign artifacts), or a calls table already.

    Raises:
        ValueError: the table is none of these.
    """
    if "p2p_seq" in table.columns and "key" in table.columns:
        return table
    if "coll_id" in table.columns:
        return calls_from_probe(table)
    if "collective_seq_id" in table.columns:
        return calls_from_flight_recorder(table)
    raise ValueError(
        "expected the 'collectives' or 'flight_recorder' table (or a calls table), got columns "
        f"{list(table.columns)}"
    )


def rank_runs(ranks: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted ranks as ``(first, last)`` runs of consecutive ranks: one shape per run."""
    ordered = sorted(set(ranks))
    runs: list[tuple[int, int]] = []
    for r in ordered:
        if runs and r == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], r)
        else:
            runs.append((r, r))
    return runs


def rank_axis(
    ranks: Sequence[int], *, culprits: Iterable[int] = (), top_down: bool = False
) -> dict[str, object]:
    """Axis settings for a rank axis, culprits labelled in red and bold (rank 0 at the top of a
    vertical axis with ``top_down``).

    Up to :data:`LABEL_EVERY_RANK` ranks every rank is labelled; beyond, evenly spaced ranks
    and every culprit are, so a culprit among 1024 ranks still has its label.
    """
    axis: dict[str, object] = {"title": {"text": "rank"}, "zeroline": False}
    if not ranks:
        return axis
    low, high = min(ranks), max(ranks)
    axis["range"] = [high + 0.5, low - 0.5] if top_down else [low - 0.5, high + 0.5]
    bad = set(culprits)
    if len(ranks) <= LABEL_EVERY_RANK:
        ticks = list(ranks)
    else:
        step = nice_step((high - low) / 8)
        ticks = sorted(set(range(low - low % step, high + 1, step)) | bad)
    axis["tickvals"] = ticks
    axis["ticktext"] = [
        f"<b><span style='color:{ALERT}'>{r} ✖</span></b>" if r in bad else str(r) for r in ticks
    ]
    return axis


def nice_step(rough: float) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... at least ``rough``."""
    step, factors = 1, itertools.cycle((2, 2.5, 2))
    while step < rough:
        step = int(step * next(factors))
    return step


def bar_width(height: int, rows: int) -> float:
    """Line width in pixels for bars drawn as WebGL lines, one row per rank."""
    return float(np.clip(0.6 * (height - 140) / max(rows, 1), 1.0, 14.0))


def highlight_ranks(fig: go.Figure, culprits: Iterable[int], *, axis: str, **where: object) -> None:
    """Shade the culprit ranks behind the data: one rectangle per run of consecutive ranks."""
    add = fig.add_hrect if axis == "y" else fig.add_vrect
    for first, last in rank_runs(culprits):
        # The outline keeps one culprit among a thousand ranks visible.
        add(
            first - 0.5,
            last + 0.5,
            fillcolor=HIGHLIGHT_FILL,
            line={"color": ALERT, "width": 1},
            layer="below",
            **where,
        )


def segments(x0: np.ndarray, x1: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Interleave ``x0, x1, NaN`` and ``y, y, NaN``: many line segments in one WebGL trace.

    float32 halves what the browser receives; plot coordinates need no more precision.
    """
    n = len(x0)
    xs = np.full(3 * n, np.nan, dtype=np.float32)
    ys = np.full(3 * n, np.nan, dtype=np.float32)
    xs[0::3], xs[1::3] = x0, x1
    ys[0::3], ys[1::3] = y, y
    return xs, ys


#: Up to this many points a figure is drawn in SVG: WebGL's start-up alone takes seconds in a
#: browser without a GPU, and SVG draws a few thousand points faster; past it, WebGL.
SVG_POINTS = 12_000


def scatter(points: int) -> type[go.Scatter] | type[go.Scattergl]:
    """The trace type for a figure of ``points`` points (:data:`SVG_POINTS`); every trace of
    one figure takes the same, so a figure of few points starts no WebGL."""
    return go.Scatter if points <= SVG_POINTS else go.Scattergl


def add_segments(
    fig: go.Figure,
    a0: np.ndarray,
    a1: np.ndarray,
    at: np.ndarray,
    *,
    name: str,
    colour: str,
    width: float,
    vertical: bool = False,
    points: int = SVG_POINTS + 1,
) -> None:
    """Add one trace of line segments from ``a0`` to ``a1`` at ``at``, without hover: bars along
    x at height ``at``, or along y at position ``at`` when ``vertical``; drawn as
    :func:`scatter` draws a figure of ``points`` points."""
    along, across = segments(a0, a1, at)
    x, y = (across, along) if vertical else (along, across)
    fig.add_trace(
        scatter(points)(
            x=x,
            y=y,
            mode="lines",
            line={"color": colour, "width": width},
            name=name,
            hoverinfo="skip",
        )
    )


def translucent(colour: str, alpha: float) -> str:
    """``#rrggbb`` as ``rgba(r, g, b, alpha)``: the same hue, paler."""
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r}, {g}, {b}, {alpha})"


def floats(s: pd.Series) -> np.ndarray:
    """A nullable numeric column as float64 with NaN for nulls."""
    return s.astype("Float64").to_numpy(dtype=float, na_value=np.nan)


def time_origin(t0: float) -> str:
    """Axis title for seconds counted from ``t0`` (wall-clock seconds since the epoch)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t0))
    return f"seconds since {stamp}"


def text_or(s: pd.Series, default: str = "?") -> pd.Series:
    """A column as plain strings for hover text, nulls as ``default``."""
    return s.astype("string").fillna(default).astype(str)


def rows_height(n: int, *, per_row: int = 22, low: int = 320, high: int = 900) -> int:
    """A figure height that gives few ranks room and keeps many ranks on one screen."""
    return int(min(max(120 + per_row * n, low), high))


def empty_figure(title: str, why: str) -> go.Figure:
    """A figure that says there is nothing to draw, and why."""
    fig = go.Figure()
    fig.update_layout(
        title={"text": title},
        height=240,
        xaxis={"visible": False},
        yaxis={"visible": False},
        annotations=[{"text": why, "showarrow": False, "xref": "paper", "yref": "paper"}],
    )
    return fig


#: Past this many ranks a view draws groups of ranks alike (:func:`rank_rows`).
ALIKE_FROM = 64
#: A group of ranks alike is drawn as one row past this share of the ranks; smaller ones are
#: outliers, a row each, named.
BAND_SHARE = 0.05
#: Outliers named one row each at most; the rest share a row.
MAX_NAMED = 24
#: A row's label of the ranks it stands for is cut past this many characters (its hover says all).
LABEL_CHARS = 26


@dataclass(frozen=True)
class RankRows:
    """Which rank is drawn on which row of a view of many ranks: every culprit and outlier on
    a row of its own, named; each group of ranks alike on one row, drawn by its lowest rank
    and labelled with how many ranks it stands for."""

    shown: np.ndarray
    """The rank drawn on each row, top row first."""
    members: list[list[int]]
    """The ranks each row stands for."""
    culprits: frozenset[int]

    @property
    def grouped(self) -> bool:
        """Whether some row stands for more than one rank."""
        return any(len(m) > 1 for m in self.members)

    def y(self, ranks: np.ndarray) -> np.ndarray:
        """Each rank's row, NaN for a rank not drawn (a group is drawn by one rank)."""
        row = pd.Series(np.arange(len(self.shown), dtype=float), index=self.shown)
        return row.reindex(np.asarray(ranks)).to_numpy(dtype=float)

    def who(self, ranks: np.ndarray) -> np.ndarray:
        """How a hover names the row each of ``ranks`` (drawn ranks) stands for: ``rank 5``,
        or for a group drawn by its lowest rank ``ranks 3-1023 (1021 ranks), like rank 3``."""
        names = {}
        for members in self.members:
            if len(members) > 1:
                text = compact_ranks(members)
                if len(text) > LABEL_CHARS:
                    text = text[: LABEL_CHARS - 1].rsplit(",", 1)[0] + ", …"
                names[members[0]] = f"ranks {text} ({len(members)} ranks), like rank {members[0]}"
        ranks = pd.Series(np.asarray(ranks, dtype=np.int64))
        plain = ("rank " + ranks.astype(str)).to_numpy(dtype=object)
        group = ranks.map(names).to_numpy(dtype=object)
        return np.where(pd.isna(group), plain, group).astype(object)

    def labels(self) -> list[str]:
        """Each row's tick label: a rank (a culprit in red, with ✖), or ``N ranks: 0-36, …``."""
        out = []
        for members in self.members:
            if len(members) == 1:
                r = members[0]
                bad = r in self.culprits
                out.append(f"<b><span style='color:{ALERT}'>{r} ✖</span></b>" if bad else str(r))
                continue
            text = compact_ranks(members)
            if len(text) > LABEL_CHARS:
                text = text[: LABEL_CHARS - 1].rsplit(",", 1)[0] + ", …"
            out.append(f"{len(members)} ranks: {text}")
        return out

    def axis(self, title: str = "rank", *, across: bool = False) -> dict[str, Any]:
        """An axis of these rows, every row labelled: vertical, the top row first, or
        horizontal (``across``), the first row on the left."""
        n = len(self.shown)
        alike = "share a row" if not across else "share a column"
        return {
            "title": {"text": f"{title} (ranks alike {alike})" if self.grouped else title},
            "zeroline": False,
            "range": [-0.5, n - 0.5] if across else [n - 0.5, -0.5],
            "tickvals": list(range(n)),
            "ticktext": self.labels(),
            "automargin": True,
        }


def rank_rows(
    ranks: Iterable[int],
    *,
    culprits: Iterable[int] = (),
    classes: Iterable[Iterable[int]] = (),
    state: Mapping[int, str] | None = None,
) -> RankRows:
    """The rows of a view of ``ranks``: up to :data:`ALIKE_FROM` ranks one row each in rank
    order; past that, ranks alike share a row. Ranks are alike when they are in one of
    ``classes`` (a diagnosis's classes of the first divergence) or, outside every class, have
    the same ``state`` (e.g. their last call). Culprits and groups of at most
    :data:`BAND_SHARE` of the ranks are outliers, one row each (culprits first, at most
    :data:`MAX_NAMED`); groups follow in the order of their lowest rank."""
    ranks = sorted({int(r) for r in ranks})
    bad = frozenset(int(r) for r in culprits)
    if len(ranks) <= ALIKE_FROM:
        return RankRows(np.array(ranks, dtype=np.int64), [[r] for r in ranks], bad)
    key: dict[int, str] = {r: f"state {(state or {}).get(r, '')}" for r in ranks}
    for i, members in enumerate(classes):
        for r in members:
            if int(r) in key:
                key[int(r)] = f"class {i}"
    groups: dict[str, list[int]] = {}
    for r in ranks:
        if r not in bad:
            groups.setdefault(key[r], []).append(r)
    big = max(BAND_SHARE * len(ranks), 1)
    bands = [m for m in groups.values() if len(m) > big]
    outliers = sorted(bad & set(ranks)) + sorted(
        r for m in groups.values() if len(m) <= big for r in m
    )
    if len(outliers) > MAX_NAMED:  # the rest of the outliers share a row
        bands.append(sorted(outliers[MAX_NAMED - 1 :]))
        outliers = outliers[: MAX_NAMED - 1]
    rows = [[r] for r in outliers] + sorted(bands, key=min)
    return RankRows(np.array([m[0] for m in rows], dtype=np.int64), rows, bad)


def group_order(name: object) -> tuple[int, int | str]:
    """Sort key of a process group's name: numbers in numeric order (0, 1, 2, 10, not 0, 1,
    10, 2), then names."""
    text = str(name)
    return (0, int(text)) if text.isdigit() else (1, text)
