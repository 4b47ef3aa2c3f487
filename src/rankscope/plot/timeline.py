"""The rank timeline: one row per rank, every call as a bar over wall time."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from rankscope.plot._common import (
    ALERT,
    LABEL_EVERY_RANK,
    PALETTE,
    add_segments,
    as_calls,
    bar_width,
    empty_figure,
    floats,
    highlight_ranks,
    rank_axis,
    rows_height,
    text_or,
    time_origin,
    translucent,
)

TITLE = "Rank timeline"
#: Calls that get a hover text: past this many, only each rank's latest calls, the calls in
#: flight, the culprits' calls and the divergence do (every call is still drawn).
HOVER_BUDGET = 20_000
#: The shortest bar, as a share of the run's span.
MIN_WIDTH = 0.003
#: Calls per rank shown before the divergence when the figure opens.
CONTEXT_CALLS = 4
#: A stretch in which no call starts or ends, longer than this share of the run (and than
#: :data:`COLLAPSE_MEDIAN` times the usual, shorter, such stretch), is drawn narrow: a hang's long wait
#: does not squeeze the calls before it into a sliver.
COLLAPSE_SHARE = 0.2
COLLAPSE_MEDIAN = 5.0
#: The width a collapsed stretch is drawn with, as a share of the rest of the run.
COLLAPSED_WIDTH = 0.08
#: How much of its op's colour a call in flight keeps (it has a red core besides).
INFLIGHT_ALPHA = 0.4
#: Past this many ranks, rows are grouped: the outliers at the top, then the ranks whose last
#: call is the same, a band each; the figure opens on :data:`VIEW_ROWS` rows (double-click
#: shows them all).
GROUP_FROM = 64
VIEW_ROWS = 40
#: A group of ranks alike is a band past this share of the ranks; smaller ones are outliers.
BAND_SHARE = 0.05


def rank_timeline(
    calls: pd.DataFrame,
    *,
    culprit_ranks: Iterable[int] = (),
    divergence: Mapping[str, Any] | None = None,
    now: float | None = None,
    ranks: Iterable[int] = (),
    chain: Sequence[Mapping[str, Any]] = (),
) -> go.Figure:
    """One row per rank, one bar per collective or point-to-point call over wall time.

    Calls are coloured by op; a call still in flight is drawn up to ``now`` with a red core.
    Every bar is at least :data:`MIN_WIDTH` of the run wide. With a divergence, the figure opens
    on a few calls per rank before it up to ``now`` (double-click shows the whole run).
    Hovering a bar shows the op, the process group, the collective's number on the group, the
    shapes, the call site and the duration. Every bar of one op is one WebGL trace; past
    :data:`HOVER_BUDGET` calls only each rank's latest calls (and every call in flight or of a
    culprit) carry a hover text, so 1024 ranks of 200 calls each stay fast to build and to send.

    Args:
        calls: the run's ``collectives`` table (the probe), its ``flight_recorder`` table
            (foreign artifacts) or a calls table (:data:`rankscope.analyze.CALLS`).
        culprit_ranks: ranks to highlight (a diagnosis's ``culprit_ranks``).
        divergence: the collective where the ranks part (a diagnosis's ``collective``: keys
            ``pg`` and ``seq``); its calls are marked and a line drawn where the first began.
        now: wall-clock seconds since the epoch up to which calls in flight are drawn; by
            default the latest time in the table.
        ranks: every rank of the job, so that a rank without calls still gets its row.
        chain: the wait-for chain of a diagnosis (``Diagnosis.chain``): at ``now``, an arrow
            from each waiting rank to the ranks it waits for.

    Returns:
        The figure; x is seconds since the first call.
    """
    table = as_calls(calls)
    table = table[table["t_start_s"].notna()]
    culprits = sorted(set(culprit_ranks))
    all_ranks = sorted(set(table["rank"].tolist()) | set(ranks) | set(culprits))
    if table.empty:
        return empty_figure(TITLE, "no calls with a start time in this run")
    start = floats(table["t_start_s"])
    end = floats(table["t_end_s"])
    latest = float(np.nanmax(np.concatenate([start, end])))
    now = latest if now is None else max(float(now), latest)
    t0 = float(start.min())
    # Not completed by the backend is in flight, returned from or not (an async call, an nccl
    # call returned from at enqueue): drawn up to now.
    inflight = ~table["completed"].fillna(False).to_numpy(dtype=bool)
    end = np.where(inflight, now, np.where(np.isnan(end), start, end))
    rows = _Rows(table, all_ranks, culprits, inflight)
    rank = rows.y(table["rank"].to_numpy(dtype=np.int64))
    took = end - start
    axis = _TimeAxis(np.concatenate([start, end[~inflight]]) - t0, now - t0)
    x0, x1 = axis.shown(start - t0), axis.shown(end - t0)
    # A call of a few microseconds is still a visible mark: a 0.3 % sliver of the run at least.
    x1 = np.maximum(x1, x0 + MIN_WIDTH * max(axis.width, 1e-3))

    fig = go.Figure()
    height = rows_height(len(all_ranks))
    width = bar_width(height, min(len(all_ranks), VIEW_ROWS if rows.grouped else len(all_ranks)))
    op = text_or(table["op"])
    group, colours = _op_groups(op)
    for name, colour in colours.items():
        of_op = (group == name).to_numpy()
        for pick, label, shade in (
            (~inflight & of_op, name, colour),
            (inflight & of_op, f"{name}, in flight", translucent(colour, INFLIGHT_ALPHA)),
        ):
            if pick.any():
                add_segments(
                    fig, x0[pick], x1[pick], rank[pick], name=label, colour=shade, width=width
                )
    if inflight.any():  # in flight: the op's colour, paler, with a red core
        add_segments(
            fig,
            x0[inflight],
            x1[inflight],
            rank[inflight],
            name="in flight",
            colour=ALERT,
            width=max(width / 3, 1.0),
        )
    shown = _with_hover(table, culprits=culprits, inflight=inflight)
    fig.add_trace(
        go.Scattergl(
            x=((x0 + x1) / 2)[shown].astype(np.float32),
            y=rank[shown].astype(np.float32),
            mode="markers",
            # Invisible: the bars are drawn by the line traces, these only carry the hover.
            marker={"size": width, "color": "rgba(0, 0, 0, 0)", "symbol": "square"},
            hovertext=_hover(table[shown], op[shown], took[shown], inflight[shown]),
            hoverinfo="text",
            name="calls",
            showlegend=False,
        )
    )
    right = axis.width
    first = _mark_divergence(fig, table, divergence, x=x0, end=right, at=rows)
    _draw_chain(fig, chain, x=right, rows=rows)
    highlight_ranks(fig, rows.y(np.array(culprits, dtype=np.int64)).astype(int).tolist(), axis="y")
    rows.mark_bands(fig)
    axis.mark_breaks(fig)
    fig.add_vline(
        x=right,
        line={"color": "black", "dash": "dot", "width": 1},
        annotation_text="now",
        annotation_position="bottom right",
    )
    fig.update_layout(
        # the title at the top, the legend under it (it may wrap to two rows when narrow)
        title={
            "text": f"{TITLE}: {len(all_ranks)} ranks, {len(table)} calls",
            "yref": "container",
            "y": 0.99,
            "yanchor": "top",
        },
        height=height,
        xaxis={
            "title": {"text": time_origin(t0) + axis.note},
            **axis.ticks(),
            **_around(x0, first, right, all_ranks),
        },
        yaxis=rows.axis()
        if rows.grouped
        else rank_axis(all_ranks, culprits=culprits, top_down=True),
        # above the plot, clear of the x-axis title
        legend={"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 1, "xanchor": "right"},
        hovermode="closest",
        margin={"l": 60, "r": 20, "t": 100, "b": 40},
    )
    return fig


def _around(x0: np.ndarray, first: float | None, end: float, ranks: list[int]) -> dict[str, Any]:
    """The x-range the figure opens on: from a few calls per rank before the divergence to
    ``end`` (double-click shows the whole run); the whole run when there is no divergence."""
    if first is None:
        return {}
    before = np.sort(x0[x0 < first])
    left = (
        float(before[-min(len(before), CONTEXT_CALLS * max(len(ranks), 1))])
        if len(before)
        else first
    )
    pad = 0.03 * max(end - left, 1e-3)
    return {"range": [max(left - pad, -pad), end + pad]}


def _op_groups(op: pd.Series) -> tuple[pd.Series, dict[str, str]]:
    """Each call's colour group (its op, or ``other`` past the most frequent ops) and colours."""
    top = op.value_counts().index.tolist()
    named = top[: len(PALETTE) - 1] if len(top) > len(PALETTE) else top
    colours = dict(zip(named, PALETTE, strict=False))
    if len(top) > len(named):
        colours["other"] = PALETTE[-1]
    return op.where(op.isin(named), "other"), colours


def _with_hover(table: pd.DataFrame, *, culprits: list[int], inflight: np.ndarray) -> np.ndarray:
    """Which calls get a hover text: all within the budget, else the latest per rank and more."""
    if len(table) <= HOVER_BUDGET:
        return np.ones(len(table), dtype=bool)
    per_rank = max(HOVER_BUDGET // max(table["rank"].nunique(), 1), 1)
    latest = table.groupby("rank").cumcount(ascending=False).to_numpy() < per_rank
    return latest | inflight | table["rank"].isin(culprits).to_numpy()


def _hover(table: pd.DataFrame, op: pd.Series, dur: np.ndarray, inflight: np.ndarray) -> np.ndarray:
    number = text_or(table["seq"].fillna(table["p2p_seq"]))
    took = pd.Series(dur, index=table.index).map("{:.3f} s".format)
    # a calls table says whether the device started it (nccl with timing): issued or started
    started = table["state"].eq("started").to_numpy(dtype=bool) if "state" in table else False
    state = np.where(
        inflight, np.where(started, "started, in flight for ", "issued, in flight for "), "took "
    )
    text = (
        "rank "
        + table["rank"].astype(str)
        + "<br><b>"
        + op
        + "</b> on group "
        + text_or(table["pg"])
        + " #"
        + number
        + "<br>shapes "
        + text_or(table["shapes"], "")
        + "<br>at "
        + text_or(table["site"])
        + "<br>"
    )
    return text.to_numpy(dtype=object) + state + took.to_numpy(dtype=object)


def _mark_divergence(
    fig: go.Figure,
    table: pd.DataFrame,
    divergence: Mapping[str, Any] | None,
    *,
    x: np.ndarray,
    end: float,
    at: _Rows,
) -> float | None:
    """Mark the calls of the collective where the ranks part; return where the first began
    (``x``: where each call of ``table`` begins on the time axis; ``end``: where it ends)."""
    if not divergence or divergence.get("seq") is None:
        return None
    pg, seq = str(divergence.get("pg")), int(divergence["seq"])
    pick = (table["pg"].astype(str) == pg).to_numpy() & (table["seq"] == seq).fillna(False)
    pick = pick.to_numpy(dtype=bool)
    rows = table[pick]
    label = f"first divergence: group {pg} #{seq}"
    if rows.empty:
        fig.add_annotation(text=label, xref="paper", yref="paper", x=0, y=1.06, showarrow=False)
        return None
    x = x[pick]
    first = float(x.min())
    # Mark the odd calls (op, shapes or dtypes unlike most), or all when they agree and the
    # divergence is a rank that never made the call.
    odd = (rows["key"] != rows["key"].mode().iloc[0]).to_numpy()
    if odd.any():
        rows, x = rows[odd], x[odd]
    fig.add_trace(
        go.Scattergl(
            x=x,
            y=at.y(rows["rank"].to_numpy(dtype=np.int64)),
            mode="markers",
            marker={
                "symbol": "diamond",
                "size": 12 if len(rows) <= LABEL_EVERY_RANK else 6,
                "color": "white",
                "line": {"color": "black", "width": 2},
            },
            name="divergence",
            hovertext=("rank " + rows["rank"].astype(str) + ": " + text_or(rows["op"])).to_numpy(),
            hoverinfo="text",
        )
    )
    fig.add_vline(
        x=first,
        line={"color": ALERT, "width": 2, "dash": "dash"},
        annotation_text=label,
        annotation_font_color=ALERT,
        # on the side with room: the divergence is often near "now", at the right edge, but in
        # a short run it may be near the start, at the left one
        annotation_position="top left" if first > 0.5 * end else "top right",
    )
    return first


#: Arrows of a chain drawn at most (a 16k-rank chain is a handful of links, each many ranks).
CHAIN_ARROWS = 64


def _draw_chain(
    fig: go.Figure, chain: Sequence[Mapping[str, Any]], *, x: float, rows: _Rows
) -> None:
    """Where the calls in flight end (``now``), an arrow from each waiting rank to each rank it
    waits for: the chain that leads to the culprit."""
    drawn = 0
    for link in chain:
        for source in link.get("ranks", ())[:4]:
            for target in link.get("waits_for", ())[:4]:
                if drawn >= CHAIN_ARROWS or source == target:
                    continue
                where = link.get("waits_in") or {}
                fig.add_annotation(
                    x=x,
                    y=rows.at(target),
                    ax=x,
                    ay=rows.at(source),
                    xref="x",
                    yref="y",
                    axref="x",
                    ayref="y",
                    showarrow=True,
                    arrowhead=3,
                    arrowwidth=1.5,
                    arrowcolor=ALERT,
                    text="",
                    hovertext=f"rank {source} waits in {where.get('op')} #{where.get('seq')} "
                    f"for rank {target}",
                )
                drawn += 1


class _Rows:
    """Where each rank's row is. Up to :data:`GROUP_FROM` ranks, in rank order; past that,
    grouped by each rank's last call (op, group, number, in flight or not): the culprits and the
    ranks of small groups (outliers) at the top, one row each, then every larger group as a
    band of rows, the smaller bands first."""

    def __init__(
        self, table: pd.DataFrame, ranks: list[int], culprits: list[int], inflight: np.ndarray
    ) -> None:
        self.ranks = np.array(ranks, dtype=np.int64)
        self.grouped = len(ranks) > GROUP_FROM
        self.bands: list[tuple[int, int, str]] = []  # first row, last row, what they did
        self.outliers = 0
        if not self.grouped:
            self.order = self.ranks
        else:
            self.order = self._grouped(table, culprits, inflight)
        self.row_of = np.empty(len(self.ranks), dtype=np.float64)
        self.row_of[np.searchsorted(self.ranks, self.order)] = np.arange(len(self.order))
        self.culprits = set(culprits)

    def _grouped(
        self, table: pd.DataFrame, culprits: list[int], inflight: np.ndarray
    ) -> np.ndarray:
        last = table.assign(_inflight=inflight).sort_values("t_start_s", kind="stable")
        last = last.groupby("rank", sort=True).tail(1)
        state = (
            text_or(last["op"]).astype(str)
            + " (group "
            + last["pg"].astype(str)
            + " #"
            + last["seq"].astype("string").fillna("?")
            + ")"
            + np.where(last["_inflight"].to_numpy(dtype=bool), ", in flight", ", done")
        )
        of_rank = dict(zip(last["rank"].astype(int), state, strict=True))
        states = pd.Series([of_rank.get(int(r), "no call") for r in self.ranks])
        sizes = states.map(states.value_counts())
        band = (sizes > max(BAND_SHARE * len(self.ranks), 1)).to_numpy()
        bad = np.isin(self.ranks, culprits)
        outliers = self.ranks[bad | ~band]
        # culprits first, then the outliers by their state, then the bands, smaller first
        key = pd.DataFrame({"bad": ~bad[bad | ~band], "state": states[bad | ~band].to_numpy()})
        outliers = outliers[np.lexsort((outliers, key["state"].to_numpy(), key["bad"].to_numpy()))]
        order = [outliers]
        self.outliers = len(outliers)
        start = len(outliers)
        banded = states[band & ~bad]
        for name in banded.value_counts(ascending=True).index:
            members = self.ranks[(band & ~bad) & (states == name).to_numpy()]
            self.bands.append(
                (start, start + len(members) - 1, f"{len(members)} ranks: last {name}")
            )
            order.append(members)
            start += len(members)
        return np.concatenate(order)

    def y(self, ranks: np.ndarray) -> np.ndarray:
        """Each rank's row (rank order up to :data:`GROUP_FROM` ranks)."""
        if not self.grouped:
            return ranks.astype(float)
        return self.row_of[np.searchsorted(self.ranks, ranks)]

    def at(self, rank: int) -> float:
        return float(self.y(np.array([rank], dtype=np.int64))[0])

    def mark_bands(self, fig: go.Figure) -> None:
        """Shade every other band and say what its ranks did last."""
        for i, (first, last, what) in enumerate(self.bands):
            fig.add_hrect(
                first - 0.5,
                last + 0.5,
                fillcolor="rgba(0, 0, 0, 0.05)" if i % 2 == 0 else "rgba(0, 0, 0, 0)",
                line={"width": 0},
                layer="below",
            )
            fig.add_annotation(
                text=what,
                xref="paper",
                x=0.0,
                xanchor="left",
                y=first - 0.5,
                yanchor="top",
                yref="y",
                showarrow=False,
                font={"size": 11, "color": "#555"},
                bgcolor="rgba(255, 255, 255, 0.8)",
            )

    def axis(self) -> dict[str, Any]:
        """A rank axis for grouped rows: every outlier labelled, and each band's first and last
        rank; it opens on the first :data:`VIEW_ROWS` rows."""
        ticks = list(range(self.outliers))
        for first, last, _ in self.bands:
            ticks += [first, last] if last > first else [first]
        text = []
        for row in ticks:
            rank = int(self.order[row])
            bad = rank in self.culprits
            text.append(f"<b><span style='color:{ALERT}'>{rank} ✖</span></b>" if bad else str(rank))
        shown = min(len(self.order), max(VIEW_ROWS, self.outliers + 8))
        return {
            "title": {"text": f"rank (outliers first, then ranks alike; {len(self.order)} rows)"},
            "zeroline": False,
            "range": [shown - 0.5, -0.5],
            "tickvals": ticks,
            "ticktext": text,
        }


class _TimeAxis:
    """Seconds since the first call, drawn linearly except across long stretches in which no
    call starts or ends (:data:`COLLAPSE_SHARE`): each of those is drawn
    :data:`COLLAPSED_WIDTH` of the rest wide, shaded, and labelled with its length."""

    def __init__(self, events: np.ndarray, end: float) -> None:
        times = np.unique(np.concatenate([[0.0, end], events[np.isfinite(events)]]))
        times = times[(times >= 0) & (times <= end)]
        gaps = np.diff(times)
        short = gaps[gaps <= COLLAPSE_SHARE * end]
        usual = float(np.median(short)) if len(short) else np.inf
        long = (gaps > COLLAPSE_SHARE * end) & (gaps > COLLAPSE_MEDIAN * usual)
        rest = float(gaps[~long].sum())
        narrow = COLLAPSED_WIDTH * max(rest, 1e-3)
        self.real = times
        self.drawn = np.concatenate([[0.0], np.cumsum(np.where(long, narrow, gaps))])
        self.breaks = [(float(times[i]), float(times[i + 1])) for i in np.flatnonzero(long)]
        self.width = float(self.drawn[-1]) if len(self.drawn) else end
        self.note = " (shaded: a long wait, drawn narrow)" if self.breaks else ""

    def shown(self, seconds: np.ndarray) -> np.ndarray:
        """Where times (seconds since the first call) are on the axis."""
        if not self.breaks:
            return seconds
        return np.interp(seconds, self.real, self.drawn)

    def ticks(self) -> dict[str, Any]:
        """Tick positions labelled with real seconds (none to set on a linear axis)."""
        if not self.breaks:
            return {}
        edges = [0.0, *(t for gap in self.breaks for t in gap), float(self.real[-1])]
        spans = list(zip(edges[0::2], edges[1::2], strict=True))
        step = nice_seconds(sum(b - a for a, b in spans) / 6)
        real = [float(self.real[-1])]
        for a, b in spans:
            real += list(np.arange(np.ceil(a / step) * step, b + 1e-9, step))
            real.append(a)
        real = sorted(set(np.round(real, 6)))
        # no two labels on top of each other: drop a tick too close to the one before
        at = self.shown(np.asarray(real))
        keep = [0]
        for i in range(1, len(real)):
            if at[i] - at[keep[-1]] >= 0.06 * self.width:
                keep.append(i)
        digits = max(0, -int(np.floor(np.log10(step))))
        return {
            "tickvals": [float(at[i]) for i in keep],
            "ticktext": [f"{real[i]:.{digits}f}" for i in keep],
        }

    def mark_breaks(self, fig: go.Figure) -> None:
        """Shade each collapsed stretch and say how long it really is."""
        for a, b in self.breaks:
            x0, x1 = (float(v) for v in self.shown(np.asarray([a, b])))
            fig.add_vrect(
                x0=x0,
                x1=x1,
                fillcolor="rgba(120, 120, 120, 0.12)",
                line={"width": 0},
                layer="below",
                annotation_text=f"⋯ {b - a:.1f} s ⋯",
                annotation_position="bottom",
                annotation_font={"size": 11, "color": "#555"},
            )


def nice_seconds(rough: float) -> float:
    """The smallest of ..., 0.1, 0.2, 0.5, 1, 2, 5, 10, ... seconds at least ``rough``."""
    if rough <= 0:
        return 1.0
    power = 10.0 ** np.floor(np.log10(rough))
    return float(next(f * power for f in (1, 2, 5, 10) if f * power >= rough))
