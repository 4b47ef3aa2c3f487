"""The rank timeline: one row per rank, every call as a bar over wall time."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from rankscope.plot._common import (
    ALERT,
    ALIKE_FROM,
    PALETTE,
    RankRows,
    add_segments,
    as_calls,
    bar_width,
    empty_figure,
    floats,
    highlight_ranks,
    rank_rows,
    rows_height,
    scatter,
    text_or,
    time_origin,
    translucent,
)
from rankscope.state import shapes_text

TITLE = "Rank timeline"
#: Calls that get a hover text: past this many, only each rank's latest calls, the calls in
#: flight, the culprits' calls and the divergence do (every call is still drawn).
HOVER_BUDGET = 20_000
#: The shortest bar, as a share of the run's span.
MIN_WIDTH = 0.003
#: A stretch in which no call starts or ends, longer than this share of the run (and than
#: :data:`COLLAPSE_MEDIAN` times the usual, shorter, such stretch), is drawn narrow: a hang's long wait
#: does not squeeze the calls before it into a sliver.
COLLAPSE_SHARE = 0.2
COLLAPSE_MEDIAN = 5.0
#: The width a collapsed stretch is drawn with, as a share of the rest of the run.
COLLAPSED_WIDTH = 0.08
#: How much of its op's colour a call in flight keeps (it has a red core besides).
INFLIGHT_ALPHA = 0.4


def rank_timeline(
    calls: pd.DataFrame,
    *,
    culprit_ranks: Iterable[int] = (),
    divergence: Mapping[str, Any] | None = None,
    now: float | None = None,
    ranks: Iterable[int] = (),
    chain: Sequence[Mapping[str, Any]] = (),
    classes: Iterable[Iterable[int]] = (),
    since: float | None = None,
) -> go.Figure:
    """One row per rank, one bar per collective or point-to-point call over wall time.

    Calls are coloured by op; a call still in flight is drawn up to ``now`` with a red core.
    Every bar is at least :data:`MIN_WIDTH` of the run wide. The figure opens on the whole
    job, from the first call to ``now``; a long wait is drawn narrow and labelled.
    Past :data:`~rankscope.plot._common.ALIKE_FROM` ranks, ranks alike share a row
    (:func:`~rankscope.plot._common.rank_rows`: the ``classes`` given, else the ranks whose
    last call is the same) and the culprits and outliers have a row each, named.
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
        classes: groups of ranks alike (the ranks of each class of a diagnosis's first
            divergence, :func:`~rankscope.plot.alike`).
        since: wall-clock seconds since the epoch from which the axis counts (the first call,
            where it is later or not given): the same for several views puts a moment at the
            same x in each (:func:`~rankscope.plot.progress` takes it too).

    Returns:
        The figure; x is seconds since ``since``.
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
    t0 = float(start.min()) if since is None else min(float(since), float(start.min()))
    # A call's state is every view's (rankscope.state.call_state, the calls table's column):
    # issued or started is in flight, returned from or not (an async call, an nccl call
    # returned from at enqueue), drawn up to now.
    state = table["state"].astype(str).to_numpy()
    inflight = (state == "issued") | (state == "started")
    end = np.where(inflight, now, np.where(np.isnan(end), start, end))
    rows = rank_rows(
        all_ranks,
        culprits=culprits,
        classes=classes,
        state=_last_calls(table) if len(all_ranks) > ALIKE_FROM else None,
    )
    # a row per rank, or per group of ranks alike (drawn by its lowest rank)
    rank = rows.y(table["rank"].to_numpy(dtype=np.int64))
    drawn = ~np.isnan(rank)
    n_calls = len(table)
    table, start, end, inflight, state, rank = (
        table[drawn],
        start[drawn],
        end[drawn],
        inflight[drawn],
        state[drawn],
        rank[drawn],
    )
    took = end - start
    axis = _TimeAxis(np.concatenate([start, end[~inflight]]) - t0, now - t0)
    x0, x1 = axis.shown(start - t0), axis.shown(end - t0)
    # A call of a few microseconds is still a visible mark: a 0.3 % sliver of the run at least.
    x1 = np.maximum(x1, x0 + MIN_WIDTH * max(axis.width, 1e-3))

    fig = go.Figure()
    points = 2 * len(table)  # a bar and its hover point per call
    height = rows_height(len(rows.shown))
    width = bar_width(height, len(rows.shown))
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
                    fig,
                    x0[pick],
                    x1[pick],
                    rank[pick],
                    name=label,
                    colour=shade,
                    width=width,
                    points=points,
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
            points=points,
        )
    failed = state == "failed"
    if failed.any():  # a call that raised: a red cross where it ended
        fig.add_trace(
            scatter(points)(
                x=x1[failed],
                y=rank[failed],
                mode="markers",
                marker={"symbol": "x", "size": max(min(width, 12), 6), "color": ALERT},
                name="failed",
                hoverinfo="skip",
            )
        )
    shown = _with_hover(table, culprits=culprits, inflight=inflight | failed)
    fig.add_trace(
        scatter(points)(
            x=((x0 + x1) / 2)[shown].astype(np.float32),
            y=rank[shown].astype(np.float32),
            mode="markers",
            # Invisible: the bars are drawn by the line traces, these only carry the hover.
            marker={"size": width, "color": "rgba(0, 0, 0, 0)", "symbol": "square"},
            hovertext=_hover(
                table[shown], op[shown], took[shown], rows.who(table["rank"].to_numpy()[shown])
            ),
            hoverinfo="text",
            name="calls",
            showlegend=False,
        )
    )
    right = axis.width
    parted = _mark_divergence(fig, table, divergence, x=x0, at=rows, points=points)
    _draw_chain(fig, chain, x=right, rows=rows)
    highlight_ranks(fig, rows.y(np.array(culprits, dtype=np.int64)).astype(int).tolist(), axis="y")
    axis.mark_breaks(fig)
    # "now" at the bottom, a long wait's length at the top: the two never meet
    fig.add_vline(
        x=right,
        line={"color": "black", "dash": "dot", "width": 1},
        annotation_text="now",
        annotation_position="bottom left",
    )
    fig.update_layout(
        # the title at the top, the legend under it (it may wrap to two rows when narrow)
        title={
            "text": f"{TITLE}: {len(all_ranks)} ranks, {n_calls} calls"
            + (f"<br><span style='font-size:13px;color:{ALERT}'>{parted}</span>" if parted else ""),
            "yref": "container",
            "y": 1.0,
            "yanchor": "top",
            "pad": {"t": 24 if parted else 8},  # plotly anchors a title of two lines low
        },
        height=height,
        xaxis={
            "title": {"text": time_origin(t0) + axis.note},
            **axis.ticks(),
            # the whole job: its start, the divergence and the hang
            "range": [-0.02 * right, 1.02 * right],
        },
        yaxis=rows.axis(),
        # above the plot, clear of the x-axis title
        legend={"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 1, "xanchor": "right"},
        hovermode="closest",
        margin={"l": 60, "r": 30, "t": 100, "b": 40},
    )
    return fig


def _op_groups(op: pd.Series) -> tuple[pd.Series, dict[str, str]]:
    """Each call's colour group (its op, or ``other`` past the most frequent ops) and colours."""
    top = op.value_counts().index.tolist()
    named = top[: len(PALETTE) - 1] if len(top) > len(PALETTE) else top
    colours = dict(zip(named, PALETTE, strict=False))
    if len(top) > len(named):
        colours["other"] = PALETTE[-1]
    return op.where(op.isin(named), "other"), colours


def _shapes(shapes: pd.Series) -> pd.Series:
    """Each call's shapes as a person reads them (:func:`rankscope.state.shapes_text`: ``16``,
    ``4096x1024``, ``scalar``), worked out once per distinct value."""
    values = shapes.astype("category")
    words = {c: shapes_text(c) for c in values.cat.categories}
    return values.map(words).astype(object).fillna("").astype(str)


#: How a hover says each state (:data:`rankscope.state.CALL_STATES`), before the duration.
STATE_WORDS = {
    "issued": "issued, in flight for ",
    "started": "started, in flight for ",
    "completed": "completed, took ",
    "failed": "failed after ",
}


def _with_hover(table: pd.DataFrame, *, culprits: list[int], inflight: np.ndarray) -> np.ndarray:
    """Which calls get a hover text: all within the budget, else the latest per rank and more."""
    if len(table) <= HOVER_BUDGET:
        return np.ones(len(table), dtype=bool)
    per_rank = max(HOVER_BUDGET // max(table["rank"].nunique(), 1), 1)
    latest = table.groupby("rank").cumcount(ascending=False).to_numpy() < per_rank
    return latest | inflight | table["rank"].isin(culprits).to_numpy()


def _hover(table: pd.DataFrame, op: pd.Series, dur: np.ndarray, who: np.ndarray) -> np.ndarray:
    number = text_or(table["seq"].fillna(table["p2p_seq"]))
    took = pd.Series(dur, index=table.index).map("{:.3f} s".format)
    # the call's state, in the words every view uses (rankscope.state.CALL_STATES)
    state = table["state"].astype(str).map(STATE_WORDS).fillna("took ").to_numpy(dtype=object)
    text = (
        pd.Series(who, index=table.index)  # a grouped row's hover says the group
        + "<br><b>"
        + op
        + "</b> on group "
        + text_or(table["pg"])
        + " #"
        + number
        + "<br>shapes "
        + _shapes(table["shapes"])
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
    at: RankRows,
    points: int,
) -> str | None:
    """Mark the calls of the collective where the ranks part, and a line where the first began
    (``x``: where each call of ``table`` begins on the time axis); return the words for it,
    which the title carries (over the plot, a label would cover bars or another label)."""
    if not divergence or divergence.get("seq") is None:
        return None
    pg, seq = str(divergence.get("pg")), int(divergence["seq"])
    pick = (table["pg"].astype(str) == pg).to_numpy() & (table["seq"] == seq).fillna(False)
    pick = pick.to_numpy(dtype=bool)
    rows = table[pick]
    label = f"first divergence: group {pg} #{seq}"
    if rows.empty:
        return label + " (no call of it in these tables)"
    x = x[pick]
    first = float(x.min())
    # Mark the odd calls (op, shapes or dtypes unlike most), or all when they agree and the
    # divergence is a rank that never made the call.
    odd = (rows["key"] != rows["key"].mode().iloc[0]).to_numpy()
    if odd.any():
        rows, x = rows[odd], x[odd]
    fig.add_trace(
        scatter(points)(
            x=x,
            y=at.y(rows["rank"].to_numpy(dtype=np.int64)),
            mode="markers",
            marker={
                "symbol": "diamond",
                "size": 12 if len(rows) <= ALIKE_FROM else 8,
                "color": "white",
                "line": {"color": "black", "width": 2},
            },
            name="divergence",
            hovertext=("rank " + rows["rank"].astype(str) + ": " + text_or(rows["op"])).to_numpy(),
            hoverinfo="text",
        )
    )
    fig.add_vline(x=first, line={"color": ALERT, "width": 2, "dash": "dash"})
    return label + " (the red dashed line)"


#: Arrows of a chain drawn at most (a 16k-rank chain is a handful of links, each many ranks).
CHAIN_ARROWS = 64


def _draw_chain(
    fig: go.Figure, chain: Sequence[Mapping[str, Any]], *, x: float, rows: RankRows
) -> None:
    """Where the calls in flight end (``now``), an arrow from each waiting rank to each rank it
    waits for: the chain that leads to the culprit."""
    drawn = 0
    for link in chain:
        for source in link.get("ranks", ())[:4]:
            for target in link.get("waits_for", ())[:4]:
                y, ay = (float(v) for v in rows.y(np.array([target, source])))
                if drawn >= CHAIN_ARROWS or np.isnan(y) or np.isnan(ay) or y == ay:
                    continue
                where = link.get("waits_in") or {}
                fig.add_annotation(
                    x=x,
                    y=y,
                    ax=x,
                    ay=ay,
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


def _last_calls(table: pd.DataFrame) -> dict[int, str]:
    """Each rank's last call (op, group, number, its state): ranks whose last call is the same
    are alike where no classes are given."""
    last = table.sort_values("t_start_s", kind="stable").groupby("rank", sort=True).tail(1)
    state = (
        text_or(last["op"]).astype(str)
        + " "
        + last["pg"].astype(str)
        + " #"
        + last["seq"].astype("string").fillna("?")
        + " "
        + last["state"].astype(str)
    )
    return dict(zip(last["rank"].astype(int), state, strict=True))


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
        """Shade each collapsed stretch and say how long it really is; a label that would
        come near the one before it goes a line lower (:func:`label_lines`): none touch."""
        spans = [tuple(float(v) for v in self.shown(np.asarray([a, b]))) for a, b in self.breaks]
        texts = [f"⋯ {duration(b - a)} ⋯" for a, b in self.breaks]
        lines = label_lines(
            [(x0 + x1) / 2 for x0, x1 in spans], [len(t) for t in texts], self.width
        )
        for (x0, x1), text, line in zip(spans, texts, lines, strict=True):
            fig.add_vrect(
                x0=x0,
                x1=x1,
                fillcolor="rgba(120, 120, 120, 0.12)",
                line={"width": 0},
                layer="below",
                annotation_text=text,
                annotation_position="top",
                annotation_font={"size": LABEL_FONT, "color": "#555"},
                annotation_yshift=-LABEL_LINE_PX * line,
            )


#: The gap labels' font size, the height of a line of them, and the narrowest plot area
#: (px) their spacing is worked out for: a wider figure only spreads them further apart.
LABEL_FONT = 11
LABEL_LINE_PX = 15
NARROWEST_PX = 560
#: A label's width per character at :data:`LABEL_FONT` (px, on the wide side), and the room
#: kept free between two labels on one line.
CHAR_PX = 7.0
LABEL_GAP_PX = 8.0


def label_lines(centres: Sequence[float], chars: Sequence[int], width: float) -> list[int]:
    """The line (0 the top one) of each label centred at ``centres`` (axis units of an axis
    ``width`` wide) of ``chars`` characters: the top line where it keeps
    :data:`LABEL_GAP_PX` from the label before it on that line, in a plot area as narrow as
    :data:`NARROWEST_PX`, else the next line down."""
    px = NARROWEST_PX / max(width, 1e-12)
    right: list[float] = []  # where each line's last label ends (px)
    out = []
    for centre, n in sorted(zip(centres, chars, strict=True), key=lambda c: c[0]):
        half = n * CHAR_PX / 2
        left = centre * px - half
        line = next((i for i, end in enumerate(right) if end + LABEL_GAP_PX <= left), len(right))
        if line == len(right):
            right.append(0.0)
        right[line] = centre * px + half
        out.append(line)
    order = sorted(range(len(centres)), key=lambda i: centres[i])
    lines = [0] * len(centres)
    for i, line in zip(order, out, strict=True):
        lines[i] = line
    return lines


def nice_seconds(rough: float) -> float:
    """The smallest of ..., 0.1, 0.2, 0.5, 1, 2, 5, 10, ... seconds at least ``rough``."""
    if rough <= 0:
        return 1.0
    power = 10.0 ** np.floor(np.log10(rough))
    return float(next(f * power for f in (1, 2, 5, 10) if f * power >= rough))


def duration(seconds: float) -> str:
    """A length of time as a person reads it, never ``0.0 s``: ``48 s``, ``2.5 s``, ``12 ms``."""
    if seconds >= 10:
        return f"{seconds:.0f} s"
    if seconds >= 1:
        return f"{seconds:.1f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.0f} ms"
    return f"{max(seconds * 1e6, 1):.0f} µs"
