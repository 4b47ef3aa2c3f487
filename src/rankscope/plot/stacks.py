"""Where is everyone: ranks grouped by where their stacks are, so the odd one out shows."""

from __future__ import annotations

import html
from collections.abc import Iterable

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from rankscope.analyze.diagnosis import compact_ranks
from rankscope.plot._common import ALERT, PALETTE, empty_figure, text_or

#: The dump a stack summary row comes from.
DUMP_KEYS = ["rank", "capture_id", "capture", "tool", "thread"]
#: Distinct places beyond this many are folded into one bar.
MAX_PLACES = 30


def latest_stacks(stack_summary: pd.DataFrame) -> pd.DataFrame:
    """Each rank's most recent row of the ``stack_summary`` table (its latest capture)."""
    order = stack_summary.sort_values(
        ["rank", "capture_id", "t_s", "capture"], kind="stable", na_position="first"
    )
    return order.drop_duplicates("rank", keep="last").reset_index(drop=True)


def where_groups(stack_summary: pd.DataFrame) -> pd.DataFrame:
    """Ranks grouped by where their latest stack is: the torch.distributed call they wait in
    (if any) and the innermost user frame. Largest group first. Example::

                                        place  count  ranks
        0  all_reduce at train.py:14 in step      7    0-6
        1             train.py:31 in <module>      1      7
    """
    latest = latest_stacks(stack_summary)
    where = text_or(latest["site"], "")
    where = where.where(where != "", text_or(latest["file"]) + ":" + text_or(latest["line"]))
    waiting = text_or(latest["waiting_in"], "")
    place = waiting.where(waiting == "", waiting + " at ") + where
    place = place + " in " + text_or(latest["func"])
    grouped = latest.groupby(place.to_numpy(), sort=False)["rank"]
    out = pd.DataFrame({"count": grouped.size(), "rank_list": grouped.agg(list)})
    out = out.rename_axis("place").reset_index()
    out["ranks"] = out["rank_list"].map(compact_ranks)
    return out.sort_values(["count", "place"], ascending=[False, True], ignore_index=True)


def where_is_everyone(
    stack_summary: pd.DataFrame, *, culprit_ranks: Iterable[int] = ()
) -> go.Figure:
    """One bar per place where ranks are (innermost user frame and the collective they wait in),
    as long as the number of ranks there: "7 ranks here, 1 rank there" at a glance.

    Args:
        stack_summary: the run's ``stack_summary`` table; each rank's latest capture is used.
        culprit_ranks: ranks to highlight; a bar holding one is drawn in red.

    Returns:
        A horizontal bar chart, the largest group on top.
    """
    title = "Where is everyone"
    if stack_summary.empty:
        return empty_figure(title, "no stacks captured (capture evidence while the job runs)")
    groups = where_groups(stack_summary)
    if len(groups) > MAX_PLACES:
        rest = groups.iloc[MAX_PLACES - 1 :]
        ranks = [r for rs in rest["rank_list"] for r in rs]
        other = {"place": f"{len(rest)} other places", "count": len(ranks), "rank_list": ranks}
        other["ranks"] = compact_ranks(ranks)
        groups = pd.concat(
            [groups.iloc[: MAX_PLACES - 1], pd.DataFrame([other])], ignore_index=True
        )
    bad = set(culprit_ranks)
    colour = [ALERT if bad & set(rs) else PALETTE[0] for rs in groups["rank_list"]]
    noun = np.where(groups["count"] == 1, " rank: ", " ranks: ")
    fig = go.Figure(
        go.Bar(
            x=groups["count"],
            y=groups["place"].map(_bold_call),
            orientation="h",
            marker={"color": colour},
            text=groups["count"].astype(str) + noun + groups["ranks"],
            textposition="auto",
            hovertemplate="%{y}<br>%{text}<extra></extra>",
            name="ranks",
        )
    )
    n = int(groups["count"].sum())
    fig.update_layout(
        title={"text": f"{title}: {n} ranks in {len(groups)} places"},
        height=int(min(max(160 + 36 * len(groups), 240), 900)),
        xaxis={"title": {"text": "ranks"}, "rangemode": "tozero"},
        yaxis={"autorange": "reversed", "automargin": True},
        margin={"l": 20, "r": 20, "t": 50, "b": 40},
    )
    return fig


def _bold_call(place: str) -> str:
    """The collective a group waits in, in bold, on the chart's axis (plotly's markup; the
    table of :func:`where_groups` stays plain text)."""
    call, sep, rest = place.partition(" at ")
    return f"<b>{html.escape(call)}</b> at {html.escape(rest)}" if sep else html.escape(place)


def merged_stacks(
    stacks: pd.DataFrame, stack_summary: pd.DataFrame, *, culprit_ranks: Iterable[int] = ()
) -> go.Figure:
    """Every rank's latest stack merged into one tree (outermost frame on top): a frame is as
    wide as the number of ranks that passed through it, so ranks that went elsewhere branch off.
    A stack starts at the first frame of the user's code; the frames before it (runpy, the
    probe's bootstrap) are one box on top, which lists them on hover.

    Args:
        stacks: the run's ``stacks`` table (every frame).
        stack_summary: the run's ``stack_summary`` table: which dump and thread matter per rank.
        culprit_ranks: ranks to highlight; frames only culprits reached are drawn in red.

    Returns:
        An icicle chart.
    """
    title = "Merged stacks"
    if stacks.empty or stack_summary.empty:
        return empty_figure(title, "no stacks captured (capture evidence while the job runs)")
    chosen = latest_stacks(stack_summary)[DUMP_KEYS]
    frames = stacks.merge(chosen, on=DUMP_KEYS).sort_values(
        ["rank", "depth"], ascending=[True, False], kind="stable"
    )
    base = text_or(frames["file"], "?").str.rsplit("/", n=1).str[-1]
    frames = frames.assign(
        label=text_or(frames["func"]) + " · " + base + ":" + text_or(frames["line"])
    )
    # A stack starts at the first frame of the user's code: the launcher's frames before it
    # (runpy, rankscope's bootstrap) fold into one box, whose hover lists them.
    user = frames["is_user"].fillna(False).astype(bool)
    by_rank = user.groupby(frames["rank"])
    before = ((by_rank.cumsum() == 0) & by_rank.transform("any")).to_numpy(dtype=bool)
    hidden = frames[before].groupby("rank", sort=True)["label"].agg(list)
    frames = frames[~before]
    folded: dict[str, list[str]] = {}
    by_path: dict[tuple[str, ...], list[int]] = {}
    for rank, path in frames.groupby("rank", sort=True)["label"].agg(tuple).items():
        skipped = hidden.get(rank, [])
        if skipped:
            name = f"⋯ {len(skipped)} frames before your code"
            folded[name] = skipped
            path = (name, *path)
        by_path.setdefault(path, []).append(int(rank))
    ids: dict[tuple[str, ...], int] = {}
    labels: list[str] = []
    parents: list[str] = []
    members: list[list[int]] = []
    for path, ranks in by_path.items():
        parent = ""
        for depth in range(len(path)):
            key = path[: depth + 1]
            if key not in ids:
                ids[key] = len(labels)
                labels.append(path[depth])
                parents.append(parent)
                members.append([])
            members[ids[key]].extend(ranks)
            parent = str(ids[key])
    bad = set(culprit_ranks)
    fig = go.Figure(
        go.Icicle(
            ids=[str(i) for i in range(len(labels))],
            labels=labels,
            parents=parents,
            values=[len(m) for m in members],
            branchvalues="total",
            text=[f"{len(m)} rank{'s' if len(m) > 1 else ''}: {compact_ranks(m)}" for m in members],
            customdata=[
                "<br>".join(html.escape(f) for f in folded.get(label, ())) for label in labels
            ],
            textinfo="label+text",
            hovertemplate="%{label}<br>%{text}<br>%{customdata}<extra></extra>",
            marker={"colors": [ALERT if bad and set(m) <= bad else PALETTE[0] for m in members]},
            tiling={"orientation": "v"},
            sort=False,
        )
    )
    fig.update_layout(
        title={
            "text": f"{title}: {len(by_path)} distinct stacks over {len(frames['rank'].unique())} ranks"
        },
        height=520,
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
    )
    return fig
