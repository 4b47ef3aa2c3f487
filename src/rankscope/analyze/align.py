"""Aligning every rank's collective sequence per process group, and finding where they part.

Both sources of calls are turned into one *calls* table (:data:`CALLS`): the probe's collectives
(exact call sites, complete history) and torch's flight-recorder entries (foreign artifacts, a
ring buffer of the last N entries). A call's position ``idx`` is its number among the rank's
collectives on that group, from 1, so the calls of different ranks with the same ``(pg, idx)``
are meant to be the same collective. The probe counts every recorded call per group (point-to-point
calls too); ``idx`` counts collectives only, so a send between two ranks does not shift the
alignment of the others. Flight-recorder entries use torch's ``collective_seq_id``, which counts
backend collectives: never mix the two sources in one alignment.

Everything here is vectorised: one pass of factorising and grouping over the whole table, then
work on the few rows around a divergence.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

#: Recorded calls that are not collectives: process-group set-up and teardown.
MANAGEMENT_OPS = frozenset(
    {
        "init_process_group",
        "destroy_process_group",
        "new_group",
        "new_subgroups",
        "new_subgroups_by_enumeration",
    }
)
#: Point-to-point calls: only two ranks take part, so they are not aligned by position.
P2P_OPS = frozenset(
    {"send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list", "recv_object_list"}
)
#: Collectives whose tensors differ between ranks by design (the root's list, uneven splits).
UNEVEN_OPS = frozenset(
    {
        "gather",
        "scatter",
        "gather_object",
        "scatter_object_list",
        "all_gather_object",
        "broadcast_object_list",
        "all_to_all",
        "all_to_all_single",
        "all_to_all_v_single",
        "all_gather_v",
        "reduce_scatter_v",
    }
)
#: Calls that only synchronise: the usual rank-conditional extra collective.
BARRIER_OPS = frozenset({"barrier", "monitored_barrier"})

#: Columns of the calls table (one row per recorded call of one rank).
CALLS: dict[str, str] = {
    "rank": "int64",
    "pg": "category",  # process-group name ("0" is the world group)
    "pg_desc": "category",
    "pg_ranks": "category",  # "0,1,2,3" when the source knows the members
    "idx": "Int64",  # n-th collective of the rank on the group, from 1; <NA> for p2p calls
    "seq": "Int64",  # the source's own number (probe seq, flight-recorder collective_seq_id)
    "op": "category",
    "shapes": "category",
    "dtypes": "category",
    "key": "int64",  # equal keys: same op, shapes and dtypes
    "peer": "Int64",  # global rank of the other side of a p2p call, when known
    "completed": "boolean",
    "ok": "boolean",  # the call returned normally (probe only)
    "error": "category",
    "t_start_s": "Float64",
    "t_end_s": "Float64",
    "site": "category",  # "train.py:12" of the user's call (probe; fr_sites for the recorder)
    "order": "int64",  # the rank's own call counter (probe coll_id, flight-recorder record_id)
    "row": "int64",  # row of the source table: the evidence reference
    "source": "category",  # collectives or flight_recorder
}


def _codes(col: pd.Series) -> tuple[np.ndarray, int]:
    """Dense integer codes of a column (nulls included as one more value) and their count."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        codes = col.cat.codes.to_numpy().astype(np.int64)
        n = len(col.cat.categories)
        codes[codes < 0] = n
        return codes, n + 1
    codes, uniques = pd.factorize(col, use_na_sentinel=False)
    return codes.astype(np.int64), len(uniques)


def _key(op: pd.Series, *columns: pd.Series) -> np.ndarray:
    """One integer per call such that calls get equal keys iff they are the same call: same op
    and, unless the op takes different tensors per rank by design, same shapes and dtypes."""
    free = op.isin(UNEVEN_OPS).to_numpy()
    key, count = _codes(op)
    for col in columns:
        codes, n = _codes(col)
        codes[free] = n
        if count * (n + 1) >= 1 << 62:
            key, uniques = pd.factorize(key)
            count = len(uniques)
        key, count = key * (n + 1) + codes, count * (n + 1)
    return key


def _min_max(groups: np.ndarray, values: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-group minimum and maximum of ``values`` (groups ``0..size-1``; empty groups get
    ``lo > hi``)."""
    lo = np.full(size, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(size, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(lo, groups, values)
    np.maximum.at(hi, groups, values)
    return lo, hi


def _dense(codes: np.ndarray, span: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Group numbers in ``0..n``: the codes themselves when their range is small, else their
    rank among the distinct codes (then also returned, to decode)."""
    if span <= max(4 * len(codes), 1 << 20):
        return codes, None
    uniques, inverse = np.unique(codes, return_inverse=True)
    return inverse, uniques


def _finish(columns: dict[str, Any], n: int) -> pd.DataFrame:
    """The calls table from ``n`` rows of columns: arrays, or a scalar for the whole column.

    Columns left out are null. Constant and null category columns are built from codes, so a
    32-million-row table costs no Python object per row."""
    out = {}
    for col, dtype in CALLS.items():
        value = columns.get(col)
        if dtype == "category" and (value is None or isinstance(value, str)):
            cats = [] if value is None else [value]
            codes = np.full(n, -1 if value is None else 0, dtype=np.int8)
            out[col] = pd.Categorical.from_codes(codes, categories=cats)
        elif value is None:
            out[col] = pd.array([pd.NA] * n if n < 1024 else np.full(n, None), dtype=dtype)
        else:
            series = pd.Series(value)
            out[col] = series.array if str(series.dtype) == dtype else series.astype(dtype).array
    return pd.DataFrame(out, copy=False)


def calls_from_probe(collectives: pd.DataFrame) -> pd.DataFrame:
    """The calls table from the probe's ``collectives`` table (schema ``COLLECTIVES``).

    Process-group management (``init_process_group``, ``destroy_process_group``, ...) is left out.
    """
    df = collectives[collectives["pg"].notna() & ~collectives["op"].isin(MANAGEMENT_OPS)]
    df = df.sort_values(["rank", "coll_id"], kind="stable")
    op = df["op"].astype(str)
    p2p = op.isin(P2P_OPS).to_numpy()
    idx = pd.Series(pd.NA, index=df.index, dtype="Int64")
    coll = df[~p2p]
    idx[~p2p] = coll.groupby(["rank", "pg"], observed=True).cumcount().to_numpy() + 1
    peer = pd.to_numeric(df["peer"].where(p2p), errors="coerce").astype("Int64")
    return _finish(
        {
            "rank": df["rank"].astype("int64"),
            "pg": df["pg"],
            "pg_desc": df["pg_desc"],
            "pg_ranks": _ranks_per_group(df["pg"], df["pg_ranks"]),
            "idx": idx,
            "seq": df["seq"],
            "op": op,
            "shapes": df["shapes"],
            "dtypes": df["dtypes"],
            "key": _key(op, df["shapes"], df["dtypes"]),
            "peer": peer,
            "completed": df["completed"],
            "ok": df["ok"],
            "error": df["error"],
            "t_start_s": df["t_start_s"],
            "t_end_s": df["t_end_s"],
            "site": df["site"],
            "order": df["coll_id"].fillna(-1).astype("int64"),
            "row": df.index.to_numpy(dtype=np.int64),
            "source": "collectives",
        },
        len(df),
    )


def latest_dumps(flight_recorder: pd.DataFrame) -> pd.DataFrame:
    """One dump per rank: a run directory holds the rank's latest dump and copies taken at each
    capture; the one that recorded the most (highest ``record_id``) is the newest."""
    # Each dump is one rank's: as many dumps as ranks means one dump per rank.
    if flight_recorder["source"].nunique() <= flight_recorder["rank"].nunique():
        return flight_recorder
    top = flight_recorder.groupby(["rank", "source"], observed=True)["record_id"].max()
    best = top.reset_index().sort_values(["rank", "record_id"]).drop_duplicates("rank", keep="last")
    keep = pd.MultiIndex.from_frame(best[["rank", "source"]])
    mask = pd.MultiIndex.from_frame(flight_recorder[["rank", "source"]]).isin(keep)
    return flight_recorder[mask]


#: Flight-recorder columns the calls table is built from.
_FR_COLUMNS = [
    "rank",
    "source",
    "pg_name",
    "pg_desc",
    "pg_ranks",
    "record_id",
    "collective_seq_id",
    "p2p_seq_id",
    "profiling_name",
    "op",
    "is_p2p",
    "input_sizes",
    "input_dtypes",
    "output_sizes",
    "output_dtypes",
    "state",
    "time_created_ns",
    "time_discovered_completed_ns",
    "retired",
]
_P2P_NAME = re.compile(
    r"(?:send (?P<s_me>\d+)->(?P<s_peer>\d+)|recv (?P<r_me>\d+)<-(?P<r_peer>\d+))"
)


def _ranks_per_group(pg: pd.Series, pg_ranks: pd.Series) -> pd.Categorical:
    """``pg_ranks`` as a category per group: the members are a property of the group, so only
    the first recorded value of each group is read (a world of 16k ranks makes long texts)."""
    codes, groups = pd.factorize(pg)
    known = np.flatnonzero(pg_ranks.notna().to_numpy())
    rows = known[~pd.Index(codes[known]).duplicated()]
    text = dict(zip(codes[rows], pg_ranks.iloc[rows].astype(str), strict=True))
    categories = [text.get(i) for i in range(len(groups))]
    present = sorted({c for c in categories if c is not None})
    lookup = np.array([present.index(c) if c is not None else -1 for c in categories] or [-1])
    return pd.Categorical.from_codes(lookup[codes] if len(codes) else codes, categories=present)


def calls_from_flight_recorder(flight_recorder: pd.DataFrame) -> pd.DataFrame:
    """The calls table from torch's flight-recorder entries (schema ``FLIGHT_RECORDER``).

    ``idx`` is torch's ``collective_seq_id``; point-to-point entries (``is_p2p``) get their peer
    from the profiling name (``nccl:send 0->1`` names group ranks, mapped to global ranks through
    the group's members). Sites are not filled here: :func:`fr_sites` finds them for the few rows
    that need one.
    """
    df = latest_dumps(flight_recorder[_FR_COLUMNS])
    usable = (df["op"].notna() & df["pg_name"].notna() & (df["op"] != "coalesced")).to_numpy()
    if not usable.all():
        df = df[usable]
    p2p = df["is_p2p"].fillna(False).to_numpy(dtype=bool) | df["op"].isin(P2P_OPS).to_numpy()
    seq = df["collective_seq_id"]
    pg_ranks = _ranks_per_group(df["pg_name"], df["pg_ranks"])
    peer = pd.Series(pd.NA, index=df.index, dtype="Int64")
    if p2p.any():
        peer[p2p] = _fr_peers(df[p2p], pg_ranks[p2p])
    retired = df["retired"]
    completed = retired.fillna(df["state"] == "completed").astype("boolean")
    out = _finish(
        {
            "rank": df["rank"].astype("int64"),
            "pg": df["pg_name"],
            "pg_desc": df["pg_desc"],
            "pg_ranks": pg_ranks,
            "idx": seq.where(~p2p).astype("Int64"),
            "seq": seq.where(~p2p, df["p2p_seq_id"]),
            "op": df["op"],
            "shapes": df["input_sizes"],
            "dtypes": df["input_dtypes"],
            "key": _key(
                df["op"],
                df["input_sizes"],
                df["output_sizes"],
                df["input_dtypes"],
                df["output_dtypes"],
            ),
            "peer": peer,
            "completed": completed,
            "t_start_s": df["time_created_ns"].astype("Float64") / 1e9,
            "t_end_s": df["time_discovered_completed_ns"].astype("Float64") / 1e9,
            "order": df["record_id"].fillna(-1).astype("int64"),
            "row": df.index.to_numpy(dtype=np.int64),
            "source": "flight_recorder",
        },
        len(df),
    )
    # A coalesced group's entries follow each other and repeat one collective_seq_id; the first
    # stands for the group.
    idx = out["idx"].to_numpy(dtype=np.int64, na_value=-1)
    same = [out["rank"].to_numpy(), out["pg"].cat.codes.to_numpy(), idx]
    dup = np.zeros(len(out), dtype=bool)
    dup[1:] = np.logical_and.reduce([a[1:] == a[:-1] for a in same]) & (idx[1:] >= 0)
    return out[~dup].reset_index(drop=True) if dup.any() else out


def _fr_peers(df: pd.DataFrame, pg_ranks: pd.Categorical) -> pd.Series:
    m = df["profiling_name"].astype(str).str.extract(_P2P_NAME)
    local = pd.to_numeric(m["s_peer"].fillna(m["r_peer"]), errors="coerce")
    peers = []
    for members, peer in zip(pg_ranks, local, strict=True):
        ranks = parse_ranks(members)
        if pd.isna(peer):
            peers.append(pd.NA)
        elif ranks and int(peer) < len(ranks):
            peers.append(sorted(ranks)[int(peer)])
        else:
            peers.append(int(peer))
    return pd.Series(peers, index=df.index, dtype="Int64")


def parse_ranks(text: object) -> tuple[int, ...]:
    """``"0,1,2"`` (or ``"[0, 1, 2]"``) as a tuple of ints; anything else is empty."""
    if not isinstance(text, str):
        return ()
    parts = text.strip("[] ").replace(" ", "").split(",")
    return tuple(int(p) for p in parts if p.lstrip("-").isdigit())


_NOT_USER = re.compile(
    r"(^<|[/\\](site|dist)-packages[/\\]|[/\\]torch[/\\]|[/\\]rankscope[/\\](probe|launch)[/\\]"
    r"|[/\\]lib[/\\]python\d[\d.]*[/\\])"
)


def is_user_file(filename: str) -> bool:
    """Whether a frame's file is the user's code (not torch, the standard library or the probe)."""
    return not _NOT_USER.search(filename)


def fr_sites(fr_frames: pd.DataFrame, calls: pd.DataFrame) -> pd.Series:
    """``file:line`` of the innermost user frame of each flight-recorder call in ``calls``.

    ``calls`` are rows of a calls table built from the recorder; the result is indexed like it.
    """
    if calls.empty or fr_frames.empty:
        return pd.Series(pd.NA, index=calls.index, dtype="string")
    want = pd.MultiIndex.from_arrays([calls["rank"], calls["order"]])
    frames = fr_frames[
        pd.MultiIndex.from_arrays([fr_frames["rank"], fr_frames["record_id"]]).isin(want)
    ]
    frames = frames[
        frames["filename"].map(is_user_file, na_action="ignore").fillna(False).astype(bool)
    ]
    frames = frames.sort_values("depth").drop_duplicates(["rank", "record_id"])
    base = frames["filename"].str.rsplit("/", n=1).str[-1]
    site = base + ":" + frames["line"].astype("string")
    lookup = dict(zip(zip(frames["rank"], frames["record_id"], strict=True), site, strict=True))
    return pd.Series(
        [lookup.get((r, o), pd.NA) for r, o in zip(calls["rank"], calls["order"], strict=True)],
        index=calls.index,
        dtype="string",
    )


def group_members(calls: pd.DataFrame, *, world: Sequence[int] = ()) -> dict[str, tuple[int, ...]]:
    """Members of every process group in ``calls``: from ``pg_ranks`` where the source recorded
    it, else the ranks seen on the group (the world group ``"0"`` gets ``world`` too)."""
    members: dict[str, tuple[int, ...]] = {}
    codes = calls["pg"].cat.codes.to_numpy().astype(np.int64)
    groups = calls["pg"].cat.categories
    first, _ = _min_max(codes, np.arange(len(codes), dtype=np.int64), len(groups))
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
    idx: int
    members: tuple[int, ...]
    rows: pd.DataFrame
    """The calls at ``(pg, idx)``, one per rank that made it."""
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
    complete: Collection[int] = (),
) -> list[Divergence]:
    """The first divergence of every process group that has one, in group order.

    A divergence is the first position where the ranks' calls differ (op, shapes or dtypes) or
    where some rank of the group has no call while another has. Only ranks in ``ranks`` (those
    with evidence from this source) are expected. A ring buffer forgets old calls, so a group is
    compared only from the latest first position over its ranks, and a rank with no call on a
    group counts as missing only if its history is ``complete`` (recorded from the start).

    The work is a handful of vectorised passes (``numpy.minimum.at`` and friends over dense
    group numbers), whatever the number of ranks.
    """
    pos = np.flatnonzero(calls["idx"].notna().to_numpy())
    if not len(pos):
        return []
    groups = list(calls["pg"].cat.categories)
    pg = calls["pg"].cat.codes.to_numpy()[pos].astype(np.int64)
    idx = calls["idx"].to_numpy(dtype=np.int64, na_value=0)[pos]
    rank = calls["rank"].to_numpy(dtype=np.int64)[pos]
    key = calls["key"].to_numpy(dtype=np.int64)[pos]
    # Calls at one (group, position): do their keys differ?
    base, _ = _min_max(pg, idx, len(groups))
    rel = idx - base[pg]
    span = int(rel.max()) + 1
    cell, cells = _dense(pg * span + rel, len(groups) * span)
    size = len(cells) if cells is not None else len(groups) * span
    lo, hi = _min_max(cell, key, size)
    split_cells = np.flatnonzero(lo < hi)
    split_codes = cells[split_cells] if cells is not None else split_cells
    split_pg, split_idx = split_codes // span, split_codes % span + base[split_codes // span]
    # Each rank's first and last position on each group.
    top = int(rank.max()) + 1
    slot, slots = _dense(pg * top + rank, len(groups) * top)
    first, last = _min_max(slot, idx, len(slots) if slots is not None else len(groups) * top)
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
        for r in expected:
            if r not in ends and r in complete:
                ends[r] = 0
        behind = [max(v + 1, start) for r, v in ends.items() if v < end and r in expected]
        splits = split_idx[(split_pg == code) & (split_idx >= start)]
        at = min([*behind, *([int(splits.min())] if len(splits) else [])], default=None)
        if at is None:
            continue
        rows = calls.iloc[pos[(pg == code) & (idx == at)]]
        present = set(rows["rank"].tolist())
        out.append(
            Divergence(
                pg=str(name),
                idx=at,
                members=tuple(members.get(str(name), ())),
                rows=rows,
                missing=tuple(sorted(r for r in ends if r in expected and r not in present)),
            )
        )
    return out


def last_calls(calls: pd.DataFrame) -> pd.DataFrame:
    """Each rank's most recent call (collective or point-to-point), indexed by rank."""
    if calls.empty:
        return calls.set_index("rank")
    rank = calls["rank"].to_numpy(dtype=np.int64)
    order = calls["order"].to_numpy(dtype=np.int64)
    slot, slots = _dense(rank, int(rank.max()) + 1)
    _, latest = _min_max(slot, order, len(slots) if slots is not None else int(rank.max()) + 1)
    last = calls[order == latest[slot]]
    return last.drop_duplicates("rank", keep="last").set_index("rank")


def arrival_spread(calls: pd.DataFrame, *, members: Mapping[str, Sequence[int]]) -> pd.DataFrame:
    """For every collective that all members completed: how late the last rank arrived.

    Returns one row per ``(pg, idx)`` with ``late_rank``, ``late_s`` (its arrival minus the
    first arrival) and ``row`` (its call's row in the source table), largest ``late_s`` first.
    """
    empty = pd.DataFrame(columns=["pg", "idx", "late_rank", "late_s", "row"])
    coll = calls[calls["idx"].notna() & calls["completed"].fillna(False).astype(bool)]
    coll = coll[coll["t_start_s"].notna()]
    if coll.empty:
        return empty
    size = coll.groupby(["pg", "idx"], observed=True)["rank"].transform("size")
    want = coll["pg"].astype(str).map({k: len(v) for k, v in members.items()})
    coll = coll[size.to_numpy() == want.to_numpy()]
    if coll.empty:
        return empty
    grouped = coll.groupby(["pg", "idx"], observed=True)["t_start_s"]
    first = grouped.transform("min")
    latest = coll.loc[grouped.idxmax().to_numpy()]
    late = (latest["t_start_s"] - first.loc[latest.index]).astype(float)
    return (
        pd.DataFrame(
            {
                "pg": latest["pg"].astype(str).to_numpy(),
                "idx": latest["idx"].to_numpy(dtype=np.int64),
                "late_rank": latest["rank"].to_numpy(),
                "late_s": late.to_numpy(),
                "row": latest["row"].to_numpy(),
            }
        )
        .sort_values("late_s", ascending=False, kind="stable")
        .reset_index(drop=True)
    )
