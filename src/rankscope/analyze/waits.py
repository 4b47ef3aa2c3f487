"""The wait-for graph: what each rank waits in, for which ranks, across every process group.

A rank waits in its last call when that call never returned: in a collective on group ``g`` at
``seq``, for every member of ``g`` that has not made that same call (it is behind on ``g``, made
a different call there, or left no record); in a point-to-point call, for its peer. Following
those edges from the waiting ranks leads to the *roots*: ranks waited on that wait for nobody
(they exited, died, or are busy or blocked outside any collective), or, where every rank waits,
*cycles* of ranks that wait only for each other (a rank that skipped a call on one group and
waits on another, two ranks receiving from each other). In a cycle the culprit is the rank that
departed from the program order the others share: its last two calls follow each other nowhere
else in the job (:func:`departed`).

Ranks that wait the same way share one set of ranks they wait for, so a 16k-rank job with half
its ranks gone is a handful of sets, and the graph is walked set by set, not rank by rank. The
walk and the pairing of point-to-point calls are :mod:`rankscope.waitfor`'s, which the live stall
prover reads too; this module builds the graph from the calls table.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from rankscope.analyze.align import last_calls
from rankscope.waitfor import paired, walk


@dataclass(frozen=True, kw_only=True)
class Wait:
    """A rank blocked in a call, and the ranks it waits for."""

    rank: int
    pg: str
    pg_desc: str | None
    seq: int | None
    """The collective's number on the group (None for a point-to-point call)."""
    op: str
    site: str | None
    thread: str | None
    peer: int | None
    waits_for: frozenset[int]
    row: int
    """Position of the call in the calls table (``calls.iloc[row]``)."""

    def where(self) -> str:
        """``all_reduce on group 1 (tp1) #8 at train.py:12``; ``recv from rank 1 ...``."""
        group = f"group {self.pg}" + (f" ({self.pg_desc})" if self.pg_desc else "")
        if self.seq is None:
            side = "from" if "recv" in self.op else "to"
            text = f"{self.op} {side} rank {self.peer} on {group}"
        else:
            text = f"{self.op} on {group} #{self.seq}"
        return text + (f" at {self.site}" if self.site else "")

    def as_dict(self) -> dict[str, Any]:
        return {
            "pg": self.pg,
            "pg_desc": self.pg_desc,
            "seq": self.seq,
            "op": self.op,
            "site": self.site,
            "thread": self.thread,
            "peer": self.peer,
        }


@dataclass(frozen=True, kw_only=True)
class WaitGraph:
    """Who waits for whom, and where the waits lead."""

    waits: dict[int, Wait]
    roots: tuple[int, ...]
    """Ranks some waiting rank waits for that are not waiting themselves."""
    cycles: tuple[tuple[int, ...], ...]
    """Groups of waiting ranks that wait only on each other, with nothing outside to wait on."""

    @property
    def waiting(self) -> list[int]:
        return sorted(self.waits)

    def waiting_on(self, ranks: Collection[int]) -> list[int]:
        """Waiting ranks that wait, directly or through others, for any of ``ranks``."""
        targets = set(ranks)
        found: set[int] = set()
        frontier = set(targets)
        by_set = self._by_set()
        while frontier:
            new = set()
            for waits_for, waiters in by_set:
                if waits_for & frontier:
                    new |= set(waiters) - found
            found |= new
            frontier = new - targets
        return sorted(found - targets) + sorted(found & targets)

    def _by_set(self) -> list[tuple[frozenset[int], list[int]]]:
        groups: dict[int, tuple[frozenset[int], list[int]]] = {}
        for rank, w in self.waits.items():
            groups.setdefault(id(w.waits_for), (w.waits_for, []))[1].append(rank)
        return list(groups.values())


def wait_graph(
    calls: pd.DataFrame,
    *,
    members: Mapping[str, Sequence[int]],
    gone: Collection[int] = (),
) -> WaitGraph:
    """The graph of the ranks blocked in their last call, or whose last call failed (those in
    ``gone``, which left on their own, wait for nothing)."""
    last = last_calls(calls.assign(position=np.arange(len(calls))))
    if last.empty:
        return WaitGraph(waits={}, roots=(), cycles=())
    # In flight, or failed: a call that raised because a peer went away or timed out waited
    # until then.
    returned = last["completed"].fillna(False).astype(bool) & ~last["ok"].eq(False).fillna(False)
    stuck = last[~returned.to_numpy() & ~last.index.isin(list(gone))]
    sets = _collective_waits(calls, stuck[stuck["seq"].notna()], members)
    peers: dict[int | None, frozenset[int]] = {}
    waits: dict[int, Wait] = {}
    # Only the columns read: a row of every column would make each rank's copy of its groups'
    # member lists (16k texts of 90 kB at 16k ranks).
    read = stuck[["pg", "pg_desc", "seq", "op", "site", "thread", "peer", "key", "position"]]
    for rank, row in zip(stuck.index.tolist(), read.itertuples(index=False), strict=True):
        peer = None if pd.isna(row.peer) else int(row.peer)
        if pd.isna(row.seq):
            waits_for = peers.setdefault(peer, frozenset([] if peer is None else [peer]))
        else:
            waits_for = sets[(str(row.pg), int(row.seq), int(row.key))]
        waits[int(rank)] = Wait(
            rank=int(rank),
            pg=str(row.pg),
            pg_desc=_opt(row.pg_desc),
            seq=None if pd.isna(row.seq) else int(row.seq),
            op=str(row.op),
            site=_opt(row.site),
            thread=_opt(row.thread),
            peer=peer,
            waits_for=waits_for,
            row=int(row.position),
        )
    waits = _pair_up(waits)
    roots, cycles = walk({r: w.waits_for for r, w in waits.items()})
    return WaitGraph(waits=waits, roots=roots, cycles=cycles)


def _pair_up(waits: dict[int, Wait]) -> dict[int, Wait]:
    """A send facing a receive from the same peer would complete: neither waits for the other."""
    facing = paired(
        {r: (w.op, w.peer) for r, w in waits.items() if w.seq is None and w.peer is not None}
    )
    return {r: replace(w, waits_for=frozenset()) if r in facing else w for r, w in waits.items()}


def _collective_waits(
    calls: pd.DataFrame, stuck: pd.DataFrame, members: Mapping[str, Sequence[int]]
) -> dict[tuple[str, int, int], frozenset[int]]:
    """For each (group, seq, key) some rank is stuck in: the members that have not made that
    call (one set, shared by every rank stuck there)."""
    if stuck.empty:
        return {}
    cells = set(
        zip(
            stuck["pg"].astype(str),
            stuck["seq"].astype("int64").tolist(),
            stuck["key"].astype("int64").tolist(),
            strict=True,
        )
    )
    pg_codes = calls["pg"].cat.codes.to_numpy()
    names = {str(name): code for code, name in enumerate(calls["pg"].cat.categories)}
    seq = calls["seq"].to_numpy(dtype=np.int64, na_value=-1)
    key = calls["key"].to_numpy(dtype=np.int64)
    rank = calls["rank"].to_numpy(dtype=np.int64)
    out = {}
    for pg, s, k in cells:  # a handful: the distinct calls ranks are stuck in
        here = (pg_codes == names.get(pg, -2)) & (seq == s) & (key == k)
        arrived = set(np.unique(rank[here]).tolist())
        out[(pg, s, k)] = frozenset(set(members.get(pg, ())) - arrived)
    return out


def departed(calls: pd.DataFrame, ranks: Iterable[int]) -> list[int]:
    """Of ``ranks`` (a cycle), those whose last two calls follow each other least often in the
    whole job: the ranks that left the program order the others share (a call skipped, or one
    made that the others do not make at that point). All of them when none stands out."""
    ranks = sorted(ranks)
    token = calls["site"].astype(object).where(calls["site"].notna(), None)
    fallback = (
        calls["op"].astype(str)
        + "@"
        + calls["pg_desc"].astype(object).fillna(calls["pg"].astype(str)).astype(str)
    )
    token = token.fillna(fallback)
    ordered = pd.DataFrame(
        {"rank": calls["rank"].to_numpy(), "order": calls["order"].to_numpy(), "token": token}
    ).sort_values(["rank", "order"], kind="stable")
    prev = ordered.groupby("rank")["token"].shift(1)
    pairs = list(zip(prev.tolist(), ordered["token"].tolist(), strict=True))
    counts: dict[tuple[Any, Any], int] = {}
    for pair in pairs:
        counts[pair] = counts.get(pair, 0) + 1
    last_pair = {}
    for rank, pair in zip(ordered["rank"].tolist(), pairs, strict=True):
        last_pair[int(rank)] = pair
    seen = {r: counts.get(last_pair[r], 0) for r in ranks if r in last_pair}
    if not seen:
        return ranks
    rarest = min(seen.values())
    odd = [r for r, c in seen.items() if c == rarest]
    return odd if len(odd) < len(seen) else ranks


def _opt(value: Any) -> str | None:
    return (
        None
        if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value))
        else str(value)
    )
