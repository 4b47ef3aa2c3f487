"""Drill-down: any table's rows ready for a grid, grouped by ranks alike past a few dozen ranks,
and the tail of one rank's log."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from rankscope.analyze.calls import parse_ranks
from rankscope.analyze.diagnosis import compact_ranks
from rankscope.state import dtypes_text, shapes_text

#: Rows shown at most; a table of a 1024-rank run has millions.
MAX_ROWS = 2000
#: Past this many ranks, a table of ranks shows one row per group of ranks alike (the live
#: panel's table, the results' grid, a saved notebook's ranks table).
GROUP_FROM = 32
#: A group's :attr:`RankGroup.what` at most, in characters.
WHAT_CHARS = 80
#: Columns of the analyzer's own use, shown only when chosen: the calls table's ``key`` (a hash
#: of op, shapes and dtypes) and ``path`` (a number for the call's frames).
INTERNAL = frozenset({"key", "path"})
#: Columns that tell ranks apart without saying what they did (who and where they are, which
#: file or row said it), left out of what makes rows alike; so is every time (``_s``, ``_ns``,
#: ``_ms``).
PER_RANK = frozenset(
    {
        "rank",
        "pid",
        "host",
        "node",
        "local_rank",
        "group_rank",
        "nccl_rank",
        "main_thread",
        "thread",
        "thread_id",
        "tid",
        "comm",
        "cuda_dev",
        "bus_id",
        "device",
        "source",
        "row",
        "line_no",
    }
)


@dataclass
class RankGroup:
    """Rows alike (one ``key``) and their ranks; ``culprit`` when they are culprits' alone."""

    key: Hashable
    rows: list[Any] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    """Each row's rank, in the rows' order."""
    culprit: bool = False
    what: str = ""
    """What its rows say alike, short (:func:`grouped_rows`: ``0 · 20 · all_reduce · started``)."""

    @property
    def label(self) -> str:
        """``rank 517`` or ``1023 ranks: 0-516, 518-1023``."""
        ranks = sorted(set(self.ranks))
        if len(ranks) == 1:
            return f"rank {ranks[0]}"
        return f"{len(ranks)} ranks: {compact_ranks(ranks)}"

    @property
    def marked(self) -> str:
        """Its :attr:`label`, with ``⚑ culprit`` after it for a group of culprits."""
        return self.label + (" ⚑ culprit" if self.culprit else "")


def rank_groups(
    rows: Iterable[Any],
    *,
    key: Callable[[Any], Hashable],
    rank: Callable[[Any], int] = operator.itemgetter("rank"),
    culprits: Iterable[int] = (),
    first: Callable[[Any], int] = lambda key: 0,
) -> list[RankGroup]:
    """``rows`` grouped by ``key``, the outliers first: the groups of culprits alone (what the
    culprits did that the others did not; a row they share says nothing of them), then by
    ``first(key)`` (what went wrong first: the live panel's dead ranks), then the groups of
    fewer ranks, then by their first rank; groups that tie keep the rows' order. ``rank``
    reads a row's rank (a dict's ``"rank"`` by default)."""
    groups: dict[Hashable, RankGroup] = {}
    for row in rows:
        k = key(row)
        group = groups.get(k)
        if group is None:
            group = groups[k] = RankGroup(k)
        group.rows.append(row)
        group.ranks.append(rank(row))
    bad = set(culprits)
    sizes = {}
    for group in groups.values():
        ranks = set(group.ranks)
        sizes[id(group)] = len(ranks)
        group.culprit = bool(bad) and ranks <= bad
    return sorted(
        groups.values(),
        key=lambda g: (not g.culprit, first(g.key), sizes[id(g)], g.ranks[0]),
    )


def grouped_rows(
    table: pd.DataFrame,
    *,
    culprits: Iterable[int] = (),
    ranks: Iterable[int] = (),
    columns: Iterable[str] = (),
    max_rows: int = MAX_ROWS,
) -> tuple[pd.DataFrame, list[RankGroup]]:
    """One row per group of ``table``'s rows (of ``ranks``; every rank's when empty) alike in
    the ``columns`` chosen (:func:`shown_columns`) but those that tell ranks apart
    (:data:`PER_RANK`, times), the outliers first (:func:`rank_groups`): a ``ranks`` column
    says whose (``rank 517 ⚑ culprit``, ``1023 ranks: 0-516, 518-1023``), the other columns
    are shown as :func:`table_rows` shows them. Rows without a rank are left out. Returns the
    first ``max_rows`` groups' rows and every group, each with its rows' positions in
    ``table`` (:func:`table_rows` ``at=`` shows them).

    ====================================  ==  ===  ==========  =========
    ranks                                 pg  seq  op          state
    ====================================  ==  ===  ==========  =========
    rank 517 ⚑ culprit                    0   20   barrier     started
    1023 ranks: 0-516, 518-1023           0   20   all_reduce  started
    ====================================  ==  ===  ==========  =========
    """
    if "rank" not in table.columns:
        raise ValueError(f"this table has no rank column; its columns: {list(table.columns)}")
    at = (_of_ranks(table, ranks) & table["rank"].notna().to_numpy(dtype=bool)).nonzero()[0]
    chosen = shown_columns(table.iloc[at], columns)
    alike = [c for c in chosen if c not in PER_RANK and not c.endswith(("_s", "_ns", "_ms"))]
    rank_of = table["rank"].to_numpy()[at].astype(int).tolist()
    if alike:
        # a value's text is what the grid shows: nested values (lists) are compared as text
        keys = table.iloc[at][alike].astype({c: str for c in alike if table[c].dtype == object})
        ids = keys.groupby(alike, dropna=False, sort=False, observed=True).ngroup().tolist()
    else:
        ids = [0] * len(at)
    groups = rank_groups(
        range(len(at)), key=ids.__getitem__, rank=rank_of.__getitem__, culprits=culprits
    )
    for group in groups:  # positions in ``table``, in rank order
        order = sorted(range(len(group.rows)), key=group.ranks.__getitem__)
        group.rows = at[[group.rows[i] for i in order]].tolist()
        group.ranks = [group.ranks[i] for i in order]
    shown, _ = table_rows(
        table.iloc[[g.rows[0] for g in groups[:max_rows]]], columns=alike or ["rank"]
    )
    if not alike:
        shown = shown.drop(columns="rank")
    for group, values in zip(groups, shown.itertuples(index=False), strict=False):
        said = [str(v) for v in values if v is not None and not pd.isna(v) and str(v) != ""]
        group.what = " · ".join(said)[:WHAT_CHARS]
    shown.insert(0, "ranks", [g.marked for g in groups[:max_rows]])
    return shown, groups


def table_rows(
    table: pd.DataFrame,
    *,
    ranks: Iterable[int] = (),
    columns: Iterable[str] = (),
    at: Sequence[int] | None = None,
    max_rows: int = MAX_ROWS,
) -> tuple[pd.DataFrame, int]:
    """The rows of ``table`` to show in a grid: those at the positions ``at`` (a group's of
    :func:`grouped_rows`; every row when None), of ``ranks`` (every rank's when empty), in
    the ``columns`` chosen (:func:`shown_columns`: when none is, those with something to
    read), the first ``max_rows``, with times
    readable (a ``*_s`` column of seconds since the epoch as the time of day, to the
    millisecond), a group's members in runs (``pg_ranks`` ``0-1023``, not a thousand numbers)
    and nested values as text. Returns them and how many rows matched.
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be at least 1, got {max_rows}")
    table = table if at is None else table.iloc[list(at)]
    table = table[_of_ranks(table, ranks)]
    chosen = shown_columns(table, columns)
    shown = table[chosen].head(max_rows).copy()
    for c in shown.columns:
        col = shown[c]
        if c.endswith("_s") and pd.api.types.is_numeric_dtype(col) and (col.dropna() > 1e9).all():
            stamp = pd.to_datetime(col.astype("Float64").astype(float), unit="s", utc=True)
            shown[c] = stamp.dt.strftime("%H:%M:%S.%f").str[:-3].fillna("")
        elif c == "pg_ranks":
            shown[c] = col.astype(object).map(_members, na_action="ignore").fillna("")
        elif c in ("shapes", "dtypes"):  # 16 and float32, not the probe's [[16]], ["float32"]
            words = shapes_text if c == "shapes" else dtypes_text
            shown[c] = col.astype(object).map(words, na_action="ignore").fillna("")
        elif not pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col):
            # text as text, nested values as their text, and nothing where nothing is known
            text = col.astype(object).map(lambda v: v if isinstance(v, str) else str(v))
            shown[c] = text.where(col.notna(), "")
    return shown.reset_index(drop=True), len(table)


def shown_columns(table: pd.DataFrame, columns: Iterable[str] = ()) -> list[str]:
    """The ``columns`` chosen that ``table`` has; when none is chosen, its columns but the
    analyzer's own (:data:`INTERNAL`) and those with no value in any of its rows (a gloo run's
    ``peer`` and ``root``): a grid of what there is to read."""
    chosen = [c for c in columns if c in table.columns]
    if chosen:
        return chosen
    told = [c for c in table.columns if c not in INTERNAL and _has_value(table[c])]
    return told or list(table.columns)


def _has_value(col: pd.Series) -> bool:
    """Whether a column holds a value in some row (an empty text is none)."""
    known = col.dropna()
    if pd.api.types.is_numeric_dtype(known) or pd.api.types.is_bool_dtype(known):
        return len(known) > 0
    return any(not isinstance(v, str) or v != "" for v in known)


def _of_ranks(table: pd.DataFrame, ranks: Iterable[int]) -> np.ndarray:
    """Which rows are of ``ranks`` (every row when there are none), as a mask."""
    wanted = sorted(set(ranks))
    if not wanted:
        return np.ones(len(table), dtype=bool)
    if "rank" not in table.columns:
        raise ValueError(f"this table has no rank column; its columns: {list(table.columns)}")
    return table["rank"].isin(wanted).fillna(False).to_numpy(dtype=bool)


@functools.lru_cache(maxsize=256)
def _members(text: Any) -> str:
    """``"0,1,2,3,5"`` as ``0-3, 5``; text that is not a list of ranks as it is."""
    ranks = parse_ranks(text)
    return compact_ranks(ranks) if ranks else str(text)


def log_tail(logs: pd.DataFrame, *, rank: int, lines: int = 40) -> str:
    """The last ``lines`` lines one rank wrote (stdout, stderr, error file), as text.

    Args:
        logs: the run's ``logs`` table.
        rank: whose lines.
        lines: how many of the last lines.
    """
    mine = logs[(logs["rank"] == rank).fillna(False).to_numpy(dtype=bool)]
    mine = mine[mine["stream"].astype(str) != "launcher"].tail(lines)
    return "\n".join(mine["text"].fillna("").astype(str))
