"""The call-path tree: where the ranks' paths first parted, and where the ranks are at the end.

As LLNL's STAT draws its call-path prefix trees, the ranks are grouped into classes by path
(outermost frame at the root), and each class is a leaf that says how many ranks it holds and
which. The class that left the shared path (the diagnosis's culprits) is drawn in red.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from rankscope.analyze import Diagnosis
from rankscope.analyze.diagnosis import compact_ranks
from rankscope.analyze.paths import had_left
from rankscope.collect import is_user_file, short_site
from rankscope.plot._common import ALERT, PALETTE, empty_figure, translucent
from rankscope.state import group_name, step_words

TITLE = "Call paths"
#: A leaf's label lists its ranks up to this many characters ("0-3, 5-7"); past it, the count.
RANKS_IN_LABEL = 18
#: A hover lists ranks up to this many characters ("…" past it).
RANKS_ON_HOVER = 240
#: A function name longer than this is cut in a node's label (whole on hover).
FUNC_IN_LABEL = 28
#: Frames every class shares are one node from this many on (the innermost stays its own).
FOLD_SHARED = 2
#: A branch's own frames between its first and last: at most this many nodes, else one.
OWN_KEPT = 6
SHARED_FILL = "#ececec"
OTHER_FILL = translucent(PALETTE[0], 0.25)
CLASS_FILL = translucent(PALETTE[0], 0.6)
#: Classes drawn at most in one tree (each leaf keeps a readable width); past that the
#: smallest are one leaf.
MAX_CLASSES = 8
#: Classes a folded leaf lists on hover at most.
FOLDED_ON_HOVER = 12
#: Height of one level of the tree, in pixels.
LEVEL_PX = 52

Frame = tuple[str, str, int]


@dataclass(frozen=True, kw_only=True)
class Class:
    """Ranks that did the same at one point, by the same path (outermost frame first)."""

    ranks: tuple[int, ...]
    path: tuple[Frame, ...]
    what: str
    """What they did there: ``all_reduce``, ``made no call (they had left)``, ``exited 1``."""
    culprit: bool = False
    folded: tuple[str, ...] = ()
    """What each class folded into this one did, for a leaf that stands for several."""


def path_tree(diagnosis: Diagnosis | Mapping[str, Any]) -> go.Figure:
    """The call-path tree of a diagnosis, two panels: "where the paths first parted" (the
    classes of its first divergence) above "where the ranks are at the end" (each rank's path at
    its call in flight, else where its stacks or its traceback leave it), each a prefix tree of
    frames, ``file.py:line func``, outermost at the top.

    A leaf is a class of ranks: what they did, how many and which (the count alone where the list
    is long; the hover has it). Widths grow with the log of a class's rank count, so one rank
    among a thousand stays legible. Frames every class shares are one node (listed on hover), as
    is each run of library frames within a branch: the user's own frames stay. The culprits' class and the frames only they passed
    through are red.

    Args:
        diagnosis: a :class:`~rankscope.analyze.Diagnosis`, or its JSON form (``diagnosis.json``);
            that form holds the first divergence only, so the second panel needs the Diagnosis.

    Returns:
        The figure; one that says so when the paths never parted.
    """
    fd = _get(diagnosis, "first_divergence")
    if not isinstance(fd, Mapping) or not fd:
        return empty_figure(TITLE, "the ranks' calls followed one path: they never parted")
    first = first_classes(fd)
    if not first:
        return empty_figure(TITLE, "the first divergence names no class of ranks")
    ends = end_classes(diagnosis) if isinstance(diagnosis, Diagnosis) else []
    n = len({r for c in first for r in c.ranks} | {r for c in ends for r in c.ranks})
    kind = "point-to-point call" if fd.get("kind") == "p2p" else "collective"
    desc = fd.get("pg_desc")
    group = group_name(fd.get("pg", "?"), desc)
    step = f", {step_words(fd['step'])}" if fd.get("step") is not None else ""
    at = html.escape(f"{kind} #{fd.get('seq', '?')} on {group}{step}")
    trees = [
        _tree(first, f"<b>Where the paths first parted</b>: {at}", "first"),
    ]
    if ends:
        trees.append(_tree(ends, "<b>Where the ranks are at the end</b>", "end"))
    heights = [max(3, t.depth + 1) * LEVEL_PX for t in trees]
    gap = 40 if len(trees) > 1 else 0
    total = sum(heights) + gap
    fig = go.Figure()
    top = 1.0
    for tree, h in zip(trees, heights, strict=True):
        bottom = max(0.0, top - h / total)
        fig.add_trace(tree.trace(domain={"x": [0, 1], "y": [bottom, top]}))
        top = bottom - gap / total
    said = f"{len(first)} classes where they first parted"
    said += (
        f", {len(ends)} at the end"
        if ends
        else " (for where they are at the end, diagnose the run)"
    )
    fig.update_layout(
        title={"text": f"{TITLE}: {n} ranks, {said}"},
        height=int(total + 70),
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
    )
    return fig


def first_classes(fd: Mapping[str, Any]) -> list[Class]:
    """The classes of a first divergence (its JSON form), as the tree draws them; entries that
    are not classes (a file edited by hand, cut short) are left out."""
    out = []
    classes = fd.get("classes")
    for c in classes if isinstance(classes, list) else []:
        if not isinstance(c, Mapping):
            continue
        ranks = c.get("ranks")
        ranks = tuple(int(r) for r in ranks if _is_int(r)) if isinstance(ranks, list) else ()
        if not ranks:
            continue
        op = c.get("op")
        path = c.get("path")
        out.append(
            Class(
                ranks=ranks,
                path=_frames(path if isinstance(path, list) else ()),
                what=str(op)
                if op
                else "made no call" + (f" {had_left(ranks)}" if c.get("left") is True else ""),
                culprit=c.get("culprit") is True,
            )
        )
    return out


def alike(d: Diagnosis | Mapping[str, Any]) -> list[tuple[int, ...]]:
    """The ranks of each class of a diagnosis's first divergence (none without one): the
    groups of ranks alike that the timeline, the ladder and the progress view draw together
    past many ranks (their ``classes``)."""
    fd = _get(d, "first_divergence")
    return [c.ranks for c in first_classes(fd)] if isinstance(fd, Mapping) else []


def end_classes(d: Diagnosis) -> list[Class]:
    """Every rank's path at the end, ranks alike as one class: a rank in a call, by its call's
    path (what it waits in: ``in all_reduce #12``); any other, by the frames of its latest
    stacks or its traceback (what it was doing: ``exited 1``, ``outside any collective``). The
    classes whose ranks are all culprits of the diagnosis are marked. None without the
    diagnosis's context."""
    ctx = d.context
    if ctx is None:
        return []
    last = ctx.last
    ranks = sorted(set(ctx.facts) | set(ctx.evidence_ranks) | set(last.index.tolist()))
    where = ctx.whereabouts(ranks)
    # one pass over the last calls (a row look-up per rank costs a thousand ranks a second)
    columns = last[["op", "seq", "p2p_seq", "source", "path"]]
    calls = dict(zip(last.index.tolist(), columns.itertuples(index=False), strict=True))
    culprits = set(d.culprit_ranks)
    by: dict[tuple[tuple[Frame, ...], str], list[int]] = {}
    for rank in ranks:
        w = where[rank]
        path: tuple[Frame, ...] = ()
        if w.state == "in_call":
            call = calls[rank]
            if call.source == "collectives" and not _null(call.path):
                path = ctx.call_paths.of(int(call.path))
            seq = call.seq if not _null(call.seq) else call.p2p_seq
            what = f"in {call.op}" + (f" #{int(seq)}" if not _null(seq) else "")
        elif w.state == "exited":
            what = "exited" if w.code is None else f"exited {w.code}"
        elif w.state in ("busy", "alive"):
            what = "outside any collective"
        else:
            what = "not known"
        if not path:
            path = tuple(ctx.rank_path(rank) or ())
        by.setdefault((path, what), []).append(rank)
    return sorted(
        (
            Class(
                ranks=tuple(rs),
                path=path,
                what=what,
                culprit=bool(culprits) and set(rs) <= culprits,
            )
            for (path, what), rs in by.items()
        ),
        key=lambda c: (not c.culprit, -len(c.ranks), c.ranks),
    )


# --- the tree ---------------------------------------------------------------------------------


@dataclass
class _Node:
    label: str
    hover: str
    parent: int | None
    frames: list[Frame] = field(default_factory=list)
    """The frames it stands for: one, several when folded, none for the header and leaves."""
    children: list[int] = field(default_factory=list)
    ranks: set[int] = field(default_factory=set)
    weight: float = 0.0
    leaf: Class | None = None


@dataclass
class _Tree:
    nodes: list[_Node]
    culprits: set[int]
    everyone: set[int]
    name: str
    depth: int

    def trace(self, *, domain: dict[str, list[float]]) -> go.Icicle:
        colours, texts = [], []
        for node in self.nodes:
            if node.leaf is not None:
                colours.append(ALERT if node.leaf.culprit else CLASS_FILL)
            elif node.parent is None or node.ranks == self.everyone:
                colours.append(SHARED_FILL)
            elif self.culprits and node.ranks <= self.culprits:
                colours.append(ALERT)
            else:
                colours.append(OTHER_FILL)
            texts.append(node.hover)
        return go.Icicle(
            ids=[f"{self.name}-{i}" for i in range(len(self.nodes))],
            labels=[n.label for n in self.nodes],
            parents=["" if n.parent is None else f"{self.name}-{n.parent}" for n in self.nodes],
            # a frame is as wide as its classes: plotly adds the leaves' widths up
            values=[round(n.weight, 3) if n.leaf is not None else 0 for n in self.nodes],
            branchvalues="remainder",
            customdata=texts,
            texttemplate="%{label}",
            hovertemplate="%{customdata}<extra></extra>",
            marker={"colors": colours, "line": {"color": "white", "width": 1}},
            leaf={"opacity": 1.0},
            tiling={"orientation": "v"},
            pathbar={"visible": False},
            sort=False,
            domain=domain,
            name=self.name,
        )


def _capped(classes: Sequence[Class]) -> list[Class]:
    """At most :data:`MAX_CLASSES` classes: the culprits' and the largest others, and the rest
    as one class at the frames all of them share (``17 other classes``)."""
    if len(classes) <= MAX_CLASSES:
        return list(classes)
    order = sorted(classes, key=lambda c: (not c.culprit, -len(c.ranks), c.ranks))
    kept, rest = order[: MAX_CLASSES - 1], order[MAX_CLASSES - 1 :]
    shared = rest[0].path
    for c in rest[1:]:
        n = 0
        while n < min(len(shared), len(c.path)) and shared[n] == c.path[n]:
            n += 1
        shared = shared[:n]
    ranks = tuple(sorted(r for c in rest for r in c.ranks))
    folded = tuple(f"{c.what} ({_count(len(c.ranks))})" for c in rest)
    other = Class(ranks=ranks, path=shared, what=f"{len(rest)} other classes", folded=folded)
    return [*kept, other]


def _tree(classes: Sequence[Class], header: str, name: str) -> _Tree:
    """The prefix tree of the classes' paths under a header node, chains folded."""
    classes = _capped(classes)
    everyone = {r for c in classes for r in c.ranks}
    nodes = [_Node(label=header, hover=_ranks_hover(everyone), parent=None)]
    nodes[0].ranks = set(everyone)
    at: dict[tuple[Frame, ...], int] = {(): 0}
    for c in classes:
        for depth in range(1, len(c.path) + 1):
            key = c.path[:depth]
            if key not in at:
                at[key] = len(nodes)
                parent = at[key[:-1]]
                nodes.append(_Node(label="", hover="", parent=parent, frames=[key[-1]]))
                nodes[parent].children.append(at[key])
        leaf = len(nodes)
        parent = at[c.path]
        nodes.append(_Node(label="", hover="", parent=parent, leaf=c))
        nodes[parent].children.append(leaf)
        # widths grow with the log of the count: one rank among a thousand stays legible
        weight = 1.0 + math.log10(len(c.ranks) or 1)
        nodes[leaf].weight = weight
        i: int | None = leaf
        while i is not None:
            nodes[i].ranks |= set(c.ranks)
            i = nodes[i].parent
    nodes = _fold(nodes, everyone)
    depth = 0
    for i, node in enumerate(nodes):
        d, j = 0, i
        while nodes[j].parent is not None:
            d, j = d + 1, nodes[j].parent
        depth = max(depth, d)
        if node.leaf is not None:
            node.label, node.hover = _leaf_text(node.leaf)
        elif node.parent is not None:
            node.label, node.hover = _frames_text(node, shared=node.ranks == everyone)
    culprits = {r for c in classes if c.culprit for r in c.ranks}
    return _Tree(nodes=nodes, culprits=culprits, everyone=everyone, name=name, depth=depth)


def _fold(nodes: list[_Node], everyone: set[int]) -> list[_Node]:
    """Chains of frames with one way on (each frame's only child a frame) as fewer nodes: the
    frames every class shares as one node, and the innermost of them; in a branch's own chain,
    between its first and last frame, each run of library frames (not the user's code) as one
    node, the user's own frames kept, unless more than :data:`OWN_KEPT` would stay: then the
    whole middle is one node. Returns the nodes renumbered."""
    keep = [True] * len(nodes)
    for start, node in enumerate(nodes):
        if not keep[start] or not node.frames or _only_frame_child(nodes, node.parent) is not None:
            continue  # folded already, or not the start of a chain
        chain = [start]
        while (nxt := _only_frame_child(nodes, chain[-1])) is not None:
            chain.append(nxt)
        if nodes[start].ranks == everyone:
            if len(chain) - 1 >= FOLD_SHARED:
                _merge(nodes, keep, chain[:-1])
            continue
        middle = chain[1:-1]
        runs: list[list[int]] = []
        for i in middle:
            user = is_user_file(nodes[i].frames[0][0])
            if runs and not user and not is_user_file(nodes[runs[-1][-1]].frames[0][0]):
                runs[-1].append(i)
            else:
                runs.append([i])
        folded = [r for r in runs if len(r) > 1]
        if len(runs) > OWN_KEPT:
            folded = [middle]
        for run in folded:
            _merge(nodes, keep, run)
    number = {old: new for new, old in enumerate(i for i, k in enumerate(keep) if k)}
    out = []
    for old, node in enumerate(nodes):
        if keep[old]:
            node.parent = None if node.parent is None else number[node.parent]
            node.children = [number[c] for c in node.children]
            out.append(node)
    return out


def _merge(nodes: list[_Node], keep: list[bool], run: list[int]) -> None:
    """Frames ``run`` (a chain, outermost first) as its first node."""
    into = run[0]
    for i in run[1:]:
        nodes[into].frames += nodes[i].frames
        keep[i] = False
    nodes[into].children = nodes[run[-1]].children
    for child in nodes[into].children:
        nodes[child].parent = into


def _only_frame_child(nodes: list[_Node], i: int | None) -> int | None:
    """The one child of frame node ``i`` when it has exactly one and that child is a frame."""
    if i is None or not nodes[i].frames or len(nodes[i].children) != 1:
        return None
    child = nodes[i].children[0]
    return child if nodes[child].frames else None


def _frames_text(node: _Node, *, shared: bool) -> tuple[str, str]:
    """A frame node's label and hover: ``train.py:20 step``, or ``12 shared frames``."""
    whole = "<br>".join(html.escape(_frame(f, cut=False)) for f in node.frames)
    # a branch says how many ranks took it; the frames every rank shares need not
    count = "" if shared else f"<br>{_count(len(node.ranks))}"
    if len(node.frames) == 1:
        # the file's name, not its folder: a figure saved in a notebook or on a page must not
        # carry the folders of the machine that ran the job
        label = html.escape(_frame(node.frames[0])) + count
        return label, f"{whole}<br>{_ranks_hover(node.ranks)}"
    kind = "shared " if shared else ""
    if not shared and not any(is_user_file(f[0]) for f in node.frames):
        kind = "library "
    label = f"⋯ {len(node.frames)} {kind}frames" + count
    return label, f"{whole}<br>{_ranks_hover(node.ranks)}"


def _leaf_text(c: Class) -> tuple[str, str]:
    """A class's label (what it did, how many ranks, which where that is short) and hover."""
    listed = compact_ranks(c.ranks)
    count = _count(len(c.ranks))
    which = f"{count}: {listed}" if len(listed) <= RANKS_IN_LABEL else count
    mark = " ✖ culprit" if c.culprit else ""
    label = f"<b>{html.escape(c.what)}</b>{mark}<br>{which}"
    site = f" at {short_site(c.path[-1][0], c.path[-1][2])}" if c.path else ""
    hover = f"{html.escape(c.what)}{site}{mark}<br>{_ranks_hover(c.ranks)}"
    if c.folded:
        listed = "<br>".join(html.escape(f) for f in c.folded[:FOLDED_ON_HOVER])
        more = len(c.folded) - FOLDED_ON_HOVER
        hover += f"<br>{listed}" + (f"<br>… {more} more" if more > 0 else "")
    return label, hover


def _ranks_hover(ranks: Iterable[int]) -> str:
    """``7 ranks: 5, 13, 21, …``: the count and the ranks, cut at :data:`RANKS_ON_HOVER`."""
    ranks = set(ranks)
    listed = compact_ranks(ranks)
    if len(listed) > RANKS_ON_HOVER:
        listed = listed[:RANKS_ON_HOVER].rsplit(",", 1)[0] + ", …"
    return f"{_count(len(ranks))}: {listed}"


def _count(n: int) -> str:
    return f"{n} rank{'s' if n != 1 else ''}"


def _frame(f: Frame, *, cut: bool = True) -> str:
    """``train.py:20 step``: the file without its folder, the line, the function."""
    func = f[1]
    if cut and len(func) > FUNC_IN_LABEL:
        func = func[: FUNC_IN_LABEL - 1] + "…"
    return f"{short_site(f[0], f[2])} {func}".rstrip()


def _frames(path: Iterable[Any]) -> tuple[Frame, ...]:
    """Frames of a JSON path (``[[file, func, line], ...]``) as tuples; malformed ones left out."""
    return tuple(
        (str(f[0]), str(f[1] or ""), int(f[2]))
        for f in path
        if isinstance(f, (list, tuple)) and len(f) == 3 and _is_int(f[2])
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _get(d: Diagnosis | Mapping[str, Any], key: str) -> Any:
    return d.get(key) if isinstance(d, Mapping) else getattr(d, key, None)


def _null(value: Any) -> bool:
    return value is None or bool(pd.isna(value))
