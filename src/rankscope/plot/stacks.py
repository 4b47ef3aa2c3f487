"""Where is everyone: ranks grouped by where their stacks are, so the odd one out shows."""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from rankscope.analyze.diagnosis import compact_ranks
from rankscope.plot._common import ALERT, PALETTE, empty_figure, nice_step, text_or
from rankscope.rundir import OWN_FRAMES, user_span

#: The dump a stack summary row comes from.
DUMP_KEYS = ["rank", "capture_id", "capture", "tool", "thread"]
#: Distinct places beyond this many are folded into one bar.
MAX_PLACES = 30


def latest_stacks(stack_summary: pd.DataFrame) -> pd.DataFrame:
    """Each rank's most recent row of the ``stack_summary`` table (its latest capture); a
    capture whose rank is unknown (a file outside the run's layout) places no rank."""
    order = stack_summary[stack_summary["rank"].notna()].sort_values(
        ["rank", "capture_id", "t_s", "capture"], kind="stable", na_position="first"
    )
    return order.drop_duplicates("rank", keep="last").reset_index(drop=True)


def where_groups(stack_summary: pd.DataFrame, *, ranks: Iterable[int] = ()) -> pd.DataFrame:
    """Ranks grouped by where their latest stack is: the torch.distributed call they wait in
    (if any) and the innermost user frame, in words where that is unknown (a stack with no
    frame of the user's code, a rank with no stack at all). Largest group first. Example::

                                        place  count  ranks        call
        0  all_reduce at train.py:14 in step      7    0-6  all_reduce
        1                  no stack captured      1      7

    Args:
        stack_summary: the run's ``stack_summary`` table; each rank's latest capture is used.
        ranks: the job's ranks; those with no stack are a group of their own.
    """
    latest = latest_stacks(stack_summary)
    waiting = text_or(latest["waiting_in"], "")
    place = pd.Series(
        [_place(row, call) for row, call in zip(latest.itertuples(), waiting, strict=True)],
        dtype=object,
    )
    seen = set(latest["rank"].astype(int))
    missing = sorted({int(r) for r in ranks} - seen)
    ranks_of = pd.concat([latest["rank"].astype(int), pd.Series(missing, dtype=int)])
    place = pd.concat([place, pd.Series([NO_STACK] * len(missing), dtype=object)])
    call = pd.concat([waiting, pd.Series([""] * len(missing), dtype=object)])
    frame = pd.DataFrame({"place": place.to_numpy(), "rank": ranks_of.to_numpy()})
    frame["call"] = call.to_numpy()
    grouped = frame.groupby("place", sort=False)
    out = pd.DataFrame(
        {
            "count": grouped.size(),
            "rank_list": grouped["rank"].agg(list),
            "call": grouped["call"].first(),
        }
    ).reset_index()
    out["ranks"] = out["rank_list"].map(compact_ranks)
    out = out[["place", "count", "rank_list", "ranks", "call"]]
    return out.sort_values(["count", "place"], ascending=[False, True], ignore_index=True)


#: The place of a rank the job has but no capture reached.
NO_STACK = "no stack captured"
#: The place of a stack taken as the rank ended, after its code had left every user frame
#: (the probe's capture reasons).
_OUTSIDE = {
    "exit": "exiting: your code had returned (stack taken at exit)",
    "exception": "exiting on an exception that left your code (stack taken at exit)",
}


def _place(row: Any, call: str) -> str:
    """Where one rank's latest stack is, in words: ``all_reduce at train.py:14 in step``; a
    stack with none of the user's frames says so (and whether it was taken as the rank exited)."""
    file, line, site, func = row.file, row.line, row.site, row.func
    if pd.isna(file) and pd.isna(site):
        if call:
            return f"{call}, called from outside your code"
        return _OUTSIDE.get(str(row.reason), "no frame of your code on the stack")
    if pd.isna(site):
        site = str(file).rsplit("/", 1)[-1] + ("" if pd.isna(line) else f":{line}")
    where = f"{call} at {site}" if call else str(site)
    return where if pd.isna(func) else f"{where} in {func}"


def where_is_everyone(
    stack_summary: pd.DataFrame, *, culprit_ranks: Iterable[int] = (), ranks: Iterable[int] = ()
) -> go.Figure:
    """One bar per place where ranks are (innermost user frame and the collective they wait in),
    as long as the number of ranks there: "7 ranks here, 1 rank there" at a glance.

    Args:
        stack_summary: the run's ``stack_summary`` table; each rank's latest capture is used.
        culprit_ranks: ranks to highlight; a bar holding one is drawn in red.
        ranks: the job's ranks; those no capture reached are one bar, "no stack captured".

    Returns:
        A horizontal bar chart, the largest group on top.
    """
    title = "Where is everyone"
    if stack_summary.empty:
        return empty_figure(title, "no stacks captured (capture evidence while the job runs)")
    groups = where_groups(stack_summary, ranks=ranks)
    if len(groups) > MAX_PLACES:
        rest = groups.iloc[MAX_PLACES - 1 :]
        folded = [r for rs in rest["rank_list"] for r in rs]
        other = {"place": f"{len(rest)} other places", "count": len(folded), "call": ""}
        other |= {"rank_list": folded, "ranks": compact_ranks(folded)}
        groups = pd.concat(
            [groups.iloc[: MAX_PLACES - 1], pd.DataFrame([other])], ignore_index=True
        )
    bad = set(culprit_ranks)
    colour = [ALERT if bad & set(rs) else PALETTE[0] for rs in groups["rank_list"]]
    noun = np.where(groups["count"] == 1, " rank: ", " ranks: ")
    fig = go.Figure(
        go.Bar(
            x=groups["count"],
            y=[_bold_call(p, c) for p, c in zip(groups["place"], groups["call"], strict=True)],
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
        # whole ranks only: no tick at 0.5 when every bar holds one or two ranks
        xaxis={
            "title": {"text": "ranks"},
            "rangemode": "tozero",
            "tick0": 0,
            "dtick": nice_step(int(groups["count"].max()) / 6),
        },
        yaxis={"autorange": "reversed", "automargin": True},
        margin={"l": 20, "r": 20, "t": 50, "b": 40},
    )
    return fig


def _bold_call(place: str, call: str) -> str:
    """The collective a group waits in, in bold, on the chart's axis (plotly's markup; the
    table of :func:`where_groups` stays plain text)."""
    if not call or not place.startswith(call):
        return html.escape(place)
    return f"<b>{html.escape(call)}</b>{html.escape(place[len(call) :])}"


#: Each distinct stack is at least as wide as this share of all ranks, however few it holds:
#: one rank of 1024 that went elsewhere is a branch with a readable label.
MIN_SHARE = 0.15
#: Text on the boxes: white on the blue and the red, black on the grey of folded frames
#: (each pair at least 4.5:1, WCAG AA).
FOLDED = "#e6e6e6"


def merged_stacks(
    stacks: pd.DataFrame, stack_summary: pd.DataFrame, *, culprit_ranks: Iterable[int] = ()
) -> go.Figure:
    """Every rank's latest stack merged into one tree (outermost frame on top): a frame is as
    wide as the number of ranks that passed through it (each distinct stack at least as wide
    as :data:`MIN_SHARE` of all ranks), so ranks that went elsewhere branch off, however few.

    A stack starts and ends in the user's world (:func:`rankscope.rundir.user_span`): the
    frames before the user's code (runpy, rankscope's bootstrap) are one grey box on top, the
    frames after it (torch's call, rankscope's wrapper or capture) one grey box at the bottom
    named after the call, and a run of frames every rank shares is one grey box too; each
    lists its frames on hover.

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
        label=text_or(frames["func"]) + " · " + base + ":" + text_or(frames["line"]),
        path=text_or(frames["file"], "?"),
    )
    by_stack: dict[tuple[str, ...], list[int]] = {}
    folded: dict[str, list[str]] = {}
    per_rank = frames.groupby("rank", sort=True)[["label", "path", "func"]].agg(list)
    for rank, (labels, files, funcs) in per_rank.iterrows():
        by_stack.setdefault(_in_user_world(labels, files, funcs, folded), []).append(int(rank))
    by_path = _fold_shared(by_stack, folded)
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
    total = sum(len(r) for r in by_path.values())
    values = [0.0] * len(labels)
    for path, ranks in by_path.items():  # leaves first, then every box as wide as its leaves
        for depth in range(len(path)):
            values[ids[path[: depth + 1]]] += max(len(ranks), MIN_SHARE * total)
    bad = set(culprit_ranks)
    colours = [
        FOLDED if label in folded else ALERT if bad and set(m) <= bad else PALETTE[0]
        for label, m in zip(labels, members, strict=True)
    ]
    ink = ["black" if c == FOLDED else "white" for c in colours]
    fig = go.Figure(
        go.Icicle(
            ids=[str(i) for i in range(len(labels))],
            labels=labels,
            parents=parents,
            values=values,
            branchvalues="total",
            text=[f"{len(m)} rank{'s' if len(m) > 1 else ''}: {compact_ranks(m)}" for m in members],
            customdata=[
                "<br>".join(html.escape(f) for f in folded.get(label, ())) for label in labels
            ],
            textinfo="label+text",
            hovertemplate="%{label}<br>%{text}<br>%{customdata}<extra></extra>",
            marker={"colors": colours, "line": {"color": "white", "width": 1}},
            # the root box is drawn with the outside font
            insidetextfont={"size": 13, "color": ink},
            outsidetextfont={"size": 13, "color": ink},
            tiling={"orientation": "v"},
            pathbar={"visible": False},
            sort=False,
        )
    )
    depth = max(len(p) for p in by_path)
    fig.update_layout(
        title={"text": f"{title}: {len(by_path)} distinct stacks over {total} ranks"},
        height=int(min(max(120 + 48 * depth, 320), 900)),
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
    )
    return fig


def _in_user_world(
    labels: list[str], files: list[str], funcs: list[str], folded: dict[str, list[str]]
) -> tuple[str, ...]:
    """One stack (outermost first) as it is drawn: the machinery before and after the user's
    frames folded into one box each (their frames recorded in ``folded``)."""
    start, stop = user_span(files)
    path = list(labels[start:stop])
    if start:
        name = (
            f"⋯ {start} frames before your code"
            if stop > start
            else f"⋯ {start} frames of the interpreter and rankscope, none of your code"
        )
        folded[name] = labels[:start]
        path.insert(0, name)
    if stop < len(labels):
        after = labels[stop:]
        # named after the call it is in (torch's innermost frame), not rankscope's capture
        call = next((f for f, p in zip(funcs[::-1], files[::-1], strict=True) if not _own(p)), "")
        n = f"{len(after)} frame{'s' if len(after) > 1 else ''}"
        name = f"in {call} ⋯ {n}" if call else f"⋯ {n} of rankscope"
        folded[name] = after
        path.append(name)
    return tuple(path)


def _own(file: str) -> bool:
    return any(m in file for m in OWN_FRAMES)


def _fold_shared(
    by_stack: dict[tuple[str, ...], list[int]], folded: dict[str, list[str]]
) -> dict[tuple[str, ...], list[int]]:
    """The stacks with the frames every stack shares, past the first and before the last of
    them, folded into one box: the tree opens on the first shared frame of the user's code and
    the last one before the ranks part."""
    paths = list(by_stack)
    shared = 0
    while all(len(p) > shared + 1 for p in paths) and len({p[shared] for p in paths}) == 1:
        shared += 1
    first = 1 if paths[0][0] in folded else 0  # after the box of frames before your code
    inner = paths[0][first + 1 : shared - 1]
    if len(inner) < 2:
        return by_stack
    name = f"⋯ {len(inner)} frames every rank shares"
    folded[name] = list(inner)
    cut = slice(first + 1, shared - 1)
    return {(*p[: cut.start], name, *p[cut.stop :]): r for p, r in by_stack.items()}
