"""Aligning every rank's collective sequence per process group, and finding where they part.

The calls table (:data:`rankscope.schema.CALLS`, built by :mod:`rankscope.analyze.calls`) numbers
each rank's collectives on each group (``seq``, from 1), so the calls of different ranks with the
same ``(pg, seq)`` are meant to be the same collective. Everything here is vectorised: one pass
of factorising and grouping over the whole table, then work on the few rows around a divergence.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd

from rankscope.analyze.calls import parse_ranks
from rankscope.collect import first_rows


@dataclass(frozen=True)
class Complete:
    """Whose record of a group starts at its first call: a rank with no call there made none,
    rather than lost the record of them. ``probed``: ranks whose probe ran from the start; it
    sees the calls the user's code makes, not those torch makes from C++ (DDP's all-reduces),
    so it speaks only of groups the probe numbers. ``recorded``: ranks whose flight recorder
    dump holds its first entry (or holds none); ``by_recorder``: the groups the recorder
    numbers (:func:`rankscope.analyze.calls.merge_calls`), where a rank without a dump is not
    known to have made no call, whatever its probe saw."""

    probed: frozenset[int] = frozenset()
    recorded: frozenset[int] = frozenset()
    by_recorder: frozenset[str] = frozenset()

    @cached_property
    def _either(self) -> frozenset[int]:
        return self.probed | self.recorded

    def on(self, pg: str) -> frozenset[int]:
        """The ranks complete on group ``pg``."""
        return self.recorded if pg in self.by_recorder else self._either


def complete_on(complete: Collection[int] | Complete, pg: str) -> Collection[int]:
    """The ranks of ``complete`` (a :class:`Complete`, or the same ranks for every group)
    complete on group ``pg``."""
    return complete.on(pg) if isinstance(complete, Complete) else complete


def _min_max(groups: np.ndarray, values: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-group minimum and maximum of ``values`` (groups ``0..size-1``; empty groups get
    ``lo > hi``)."""
    lo = np.full(size, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(size, np.iinfo(np.int64).min, dtype=np.int64)
    lows = highs = values
    if len(groups) > 1:
        # Rows come in runs of one group (a rank's calls, one after another): each run is
        # reduced at once, and ufunc.at (slow, one row at a time) sees a value per run.
        starts = np.flatnonzero(groups[1:] != groups[:-1]) + 1
        if len(starts) * 4 < len(groups):
            starts = np.r_[0, starts]
            lows = np.minimum.reduceat(values, starts)
            highs = np.maximum.reduceat(values, starts)
            groups = groups[starts]
    np.minimum.at(lo, groups, lows)
    np.maximum.at(hi, groups, highs)
    return lo, hi


def _rows(values: np.ndarray, pos: np.ndarray | None) -> np.ndarray:
    """``values`` at ``pos``; all of them (the array itself) for None."""
    return values if pos is None else values[pos]


def _dense(codes: np.ndarray, span: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Group numbers in ``0..n``: the codes themselves when their range is small, else their
    rank among the distinct codes (then also returned, to decode)."""
    if span <= max(4 * len(codes), 1 << 20):
        return codes, None
    uniques, inverse = np.unique(codes, return_inverse=True)
    return inverse, uniques


def group_members(calls: pd.DataFrame, *, world: Sequence[int] = ()) -> dict[str, tuple[int, ...]]:
    """Members of every process group in ``calls``: from ``pg_ranks`` where the source recorded
    it, else the ranks seen on the group (the world group ``"0"`` gets ``world`` too)."""
    members: dict[str, tuple[int, ...]] = {}
    codes = calls["pg"].array.codes
    groups = calls["pg"].cat.categories
    first = first_rows(codes, len(groups))
    for code in np.flatnonzero(first < len(codes)):
        pg = str(groups[code])
        ranks = parse_ranks(calls["pg_ranks"].iloc[first[code]])
        if not ranks:
            seen = set(calls.loc[codes == code, "rank"].unique().tolist())
            ranks = tuple(sorted(seen | (set(world) if pg == "0" else set())))
        members[pg] = ranks
    return members


@dataclass(frozen=True, kw_only=True)
class Divergence:
    """The first collective of one process group where the ranks part ways."""

    pg: str
    seq: int
    members: tuple[int, ...]
    rows: pd.DataFrame
    """The calls at ``(pg, seq)``, one per rank that made it."""
    missing: tuple[int, ...]
    """Ranks of the group with evidence that never made this call."""

    @property
    def present(self) -> tuple[int, ...]:
        return tuple(sorted(self.rows["rank"].tolist()))

    @property
    def mismatched(self) -> bool:
        return self.rows["key"].nunique() > 1


def find_divergences(
    calls: pd.DataFrame,
    *,
    members: Mapping[str, Sequence[int]],
    ranks: Collection[int],
    complete: Collection[int] | Complete = (),
) -> list[Divergence]:
    """The first divergence of every process group that has one, in group order.

    A divergence is the first position where the ranks' calls differ (op, shapes or dtypes) or
    where some rank of the group has no call while another has. Only ranks in ``ranks`` (those
    with evidence from this source) are expected. A ring buffer forgets old calls, so a group is
    compared only from the latest first position over its ranks, and a rank with no call on a
    group counts as missing only if its history is ``complete`` (recorded from the start:
    :class:`Complete`).

    The work is a handful of vectorised passes (``numpy.minimum.at`` and friends over dense
    group numbers), whatever the number of ranks.
    """
    numbered = calls["seq"].notna().to_numpy()
    if not numbered.any():
        return []
    # The columns as they are where every call is numbered (no copy of 32 million rows).
    pos = None if numbered.all() else np.flatnonzero(numbered)
    groups = list(calls["pg"].cat.categories)
    pg = _rows(calls["pg"].array.codes, pos)
    seq = _rows(calls["seq"].array.to_numpy(dtype=np.int64, na_value=0), pos)
    rank = _rows(calls["rank"].to_numpy(dtype=np.int64), pos)
    key = _rows(calls["key"].to_numpy(dtype=np.int64), pos)
    # Calls at one (group, position): do their keys differ?
    base, _ = _min_max(pg, seq, len(groups))
    cell = base[pg]
    np.subtract(seq, cell, out=cell)  # the position from the group's first
    span = int(cell.max()) + 1
    cell += np.multiply(pg, span, dtype=np.int64)
    cell, cells = _dense(cell, len(groups) * span)
    size = len(cells) if cells is not None else len(groups) * span
    lo, hi = _min_max(cell, key, size)
    del cell
    split_cells = np.flatnonzero(lo < hi)
    split_codes = cells[split_cells] if cells is not None else split_cells
    split_pg, split_seq = split_codes // span, split_codes % span + base[split_codes // span]
    # Each rank's first and last position on each group.
    top = int(rank.max()) + 1
    slot = np.multiply(pg, top, dtype=np.int64)
    slot += rank
    slot, slots = _dense(slot, len(groups) * top)
    first, last = _min_max(slot, seq, len(slots) if slots is not None else len(groups) * top)
    del slot
    out = []
    for code, name in enumerate(groups):
        if slots is None:
            mine = np.arange(code * top, (code + 1) * top)
            seen = mine[first[mine] <= last[mine]]
            seen_ranks = seen - code * top
        else:
            seen = np.flatnonzero(slots // top == code)
            seen_ranks = slots[seen] - code * top
        if not len(seen):
            continue
        start, end = int(first[seen].max()), int(last[seen].max())
        ends = dict(zip(seen_ranks.tolist(), last[seen].tolist(), strict=True))
        expected = set(members.get(str(name), ())) & set(ranks)
        done = complete_on(complete, str(name))
        for r in expected:
            if r not in ends and r in done:
                ends[r] = 0
        behind = [max(v + 1, start) for r, v in ends.items() if v < end and r in expected]
        splits = split_seq[(split_pg == code) & (split_seq >= start)]
        at = min([*behind, *([int(splits.min())] if len(splits) else [])], default=None)
        if at is None:
            continue
        here = np.flatnonzero((pg == code) & (seq == at))
        rows = calls.iloc[here if pos is None else pos[here]]
        present = set(rows["rank"].tolist())
        out.append(
            Divergence(
                pg=str(name),
                seq=at,
                members=tuple(members.get(str(name), ())),
                rows=rows,
                missing=tuple(sorted(r for r in ends if r in expected and r not in present)),
            )
        )
    return out


def last_calls(calls: pd.DataFrame) -> pd.DataFrame:
    """Each rank's most recent call (collective or point-to-point), indexed by rank; or, where
    a call before it has not completed, the oldest such call: an async call (``async_op=True``,
    a collective torch issued from C++) that the backend never completed holds the rank
    however many calls it issued after it (it waits in ``work.wait()``, a synchronize, a
    backward)."""
    if calls.empty:
        return calls.set_index("rank")
    rank = calls["rank"].to_numpy(dtype=np.int64)
    order = calls["order"].to_numpy(dtype=np.int64)
    slot, slots = _dense(rank, int(rank.max()) + 1)
    n = len(slots) if slots is not None else int(rank.max()) + 1
    _, latest = _min_max(slot, order, n)
    open_ = ~calls["completed"].fillna(False).to_numpy(dtype=bool)
    open_ &= ~calls["ok"].eq(False).fillna(False).to_numpy(dtype=bool)
    open_ &= order < latest[slot]
    if open_.any():
        first, _ = _min_max(slot[open_], order[open_], n)
        held = np.zeros(n, dtype=bool)
        held[slot[open_]] = True
        latest = np.where(held, first, latest)
    last = calls[order == latest[slot]]
    return last.drop_duplicates("rank", keep="last").set_index("rank")


def arrival_spread(calls: pd.DataFrame, *, members: Mapping[str, Sequence[int]]) -> pd.DataFrame:
    """For every collective that all members completed: how late the last rank arrived.

    Returns one row per ``(pg, seq)`` with ``late_rank``, ``late_s`` (its arrival minus the
    first arrival) and ``row`` (its call's row in the source table), largest ``late_s`` first.
    """
    empty = pd.DataFrame(columns=["pg", "seq", "late_rank", "late_s", "row"])
    coll = calls[calls["seq"].notna() & calls["completed"].fillna(False).astype(bool)]
    coll = coll[coll["t_start_s"].notna()]
    if coll.empty:
        return empty
    size = coll.groupby(["pg", "seq"], observed=True)["rank"].transform("size")
    want = coll["pg"].astype(str).map({k: len(v) for k, v in members.items()})
    coll = coll[size.to_numpy() == want.to_numpy()]
    if coll.empty:
        return empty
    grouped = coll.groupby(["pg", "seq"], observed=True)["t_start_s"]
    first = grouped.transform("min")
    latest = coll.loc[grouped.idxmax().to_numpy()]
    late = (latest["t_start_s"] - first.loc[latest.index]).astype(float)
    return (
        pd.DataFrame(
            {
                "pg": latest["pg"].astype(str).to_numpy(),
                "seq": latest["seq"].to_numpy(dtype=np.int64),
                "late_rank": latest["rank"].to_numpy(),
                "late_s": late.to_numpy(),
                "row": latest["row"].to_numpy(),
            }
        )
        .sort_values("late_s", ascending=False, kind="stable")
        .reset_index(drop=True)
    )
