"""Every rank's calls as one table (:data:`rankscope.schema.CALLS`), whatever recorded them.

The probe records the calls made from Python, with exact call sites and threads; torch's flight
recorder records what the backend ran, collectives torch issues from C++ included (DDP's gradient
buckets, its broadcast of the parameters at start-up). :func:`merge_calls` makes one sequence
per rank of both: a recorder entry made while a probe call of the same thread on the same group
was running is that call's (its site and thread come from the probe); any other is the backend's
own. On a group where some rank has such entries, the recorder's sequence is the group's (its
``collective_seq_id`` counts every collective the backend ran, so the ranks' numbers agree);
elsewhere the probe's is. Point-to-point calls come from the probe where it saw them (gloo's
recorder does not record them).

``seq`` is one thing wherever it appears: the n-th collective of the rank on its group, from 1,
so calls of different ranks with the same ``(pg, seq)`` are meant to be the same collective; a
point-to-point call has ``p2p_seq`` instead. The probe's events already count that way; older
event files counted point-to-point calls too, so the number is recomputed here.

Everything is vectorised: a 16k-rank table of recorder entries costs no Python object per row.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from rankscope.collect import code_type, first_rows, is_user_file
from rankscope.rundir import (  # P2P: only two ranks take part, not aligned by position
    MANAGEMENT_OPS,
    P2P_OPS,
)
from rankscope.schema import CALLS
from rankscope.state import CALL_STATES, call_states
from rankscope.waitfor import UNEVEN_OPS  # the same-call rule: waitfor.differs, vectorised

#: Collectives with a root (src or dst), which every rank must name alike.
ROOTED_OPS = frozenset(
    {
        "broadcast",
        "broadcast_object_list",
        "reduce",
        "gather",
        "gather_object",
        "scatter",
        "scatter_object_list",
    }
)
#: Calls that only synchronise: the usual rank-conditional extra collective.
BARRIER_OPS = frozenset({"barrier", "monitored_barrier"})

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
    "time_discovered_started_ns",
    "time_discovered_completed_ns",
    "retired",
    "thread_id",
]
_P2P_NAME = re.compile(
    r"(?:send (?P<s_me>\d+)->(?P<s_peer>\d+)|recv (?P<r_me>\d+)<-(?P<r_peer>\d+))"
)


def _codes(col: pd.Series) -> tuple[np.ndarray, int]:
    """Integer codes of a column and their count ``n``, nulls being the last of the ``n``
    values. A categorical gives its own codes, not a copy (not to be changed), where a null is
    -1: as an index into ``n`` slots, that is the last."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        return col.array.codes, len(col.cat.categories) + 1
    codes, uniques = pd.factorize(col, use_na_sentinel=False)
    return codes.astype(np.int64), len(uniques)


def _key(op: pd.Series, *columns: pd.Series, root: pd.Series | None = None) -> np.ndarray:
    """One integer per call such that calls get equal keys iff they are the same call: same op,
    same root where it is known, and, unless the op takes different tensors per rank by design,
    same shapes and dtypes. Built in place in one array (a 32-million-row table makes no other
    of its size)."""
    free = np.flatnonzero(op.isin(UNEVEN_OPS).to_numpy())
    codes, count = _codes(op)
    key = codes.astype(np.int64)
    key[codes < 0] = count - 1
    for i, col in enumerate((*columns, *([] if root is None else [root]))):
        codes, n = _codes(col)
        if count * (n + 1) >= 1 << 62:
            key, uniques = pd.factorize(key)
            count = len(uniques)
        key *= n + 1
        key += codes
        key[codes < 0] += n  # a null: code n - 1
        if i < len(columns) and len(free):  # the rows whose tensors may differ: code n
            added = codes[free].astype(np.int64)
            added[added < 0] = n - 1
            key[free] += n - added
        count *= n + 1
    return key


def _finish(columns: dict[str, Any], n: int) -> pd.DataFrame:
    """The calls table from ``n`` rows of columns: arrays, or a scalar for the whole column.

    Columns left out are null. Constant and null category columns are built from codes, so a
    32-million-row table costs no Python object per row. Nothing is copied that need not be: a
    column of the source table is shared with it (copy-on-write: a change to either copies it
    then), an array made for the table is the table's."""
    out = {}
    for col, dtype in CALLS.items():
        value = columns.get(col)
        if dtype == "category" and (value is None or isinstance(value, str)):
            cats = [] if value is None else [value]
            codes = np.full(n, -1 if value is None else 0, dtype=np.int8)
            series = pd.Series(pd.Categorical.from_codes(codes, categories=cats), copy=False)
        elif value is None:
            series = pd.Series(_nulls(n, dtype), copy=False)
        elif isinstance(value, pd.Series):
            series = value.reset_index(drop=True)
        else:
            series = pd.Series(value, copy=False)
        out[col] = series if str(series.dtype) == dtype else series.astype(dtype)
    return pd.DataFrame(out, copy=False)


def _nulls(n: int, dtype: str) -> Any:
    """A column of ``n`` nulls of a nullable dtype, without a Python object per row."""
    mask = np.ones(n, dtype=bool)
    if dtype == "Int64":
        return pd.arrays.IntegerArray(np.zeros(n, dtype=np.int64), mask)
    if dtype == "Float64":
        return pd.arrays.FloatingArray(np.zeros(n, dtype=np.float64), mask)
    if dtype == "boolean":
        return pd.arrays.BooleanArray(np.zeros(n, dtype=bool), mask)
    return pd.array(np.full(n, None), dtype=dtype)


def _positions(rank: np.ndarray, pg: pd.Series, mask: np.ndarray) -> pd.Series:
    """For the rows in ``mask`` (in the rows' order), their number among the rank's ``mask``
    rows on the same group, from 1; <NA> elsewhere."""
    out = pd.Series(pd.NA, index=pg.index, dtype="Int64")
    if mask.any():
        frame = pd.DataFrame({"rank": rank[mask], "pg": pg[mask].to_numpy()})
        counts = frame.groupby(["rank", "pg"], observed=True, dropna=False).cumcount() + 1
        out[mask] = counts.to_numpy()
    return out


def calls_from_probe(collectives: pd.DataFrame, paths: np.ndarray | None = None) -> pd.DataFrame:
    """The calls table from the probe's ``collectives`` table (schema ``COLLECTIVES``), with
    ``paths`` the path code of each of its rows (:class:`rankscope.analyze.paths.CallPaths`;
    none: -1, unknown).

    Process-group management (``init_process_group``, ``destroy_process_group``, ...) is left out.
    """
    keep = (collectives["pg"].notna() & ~collectives["op"].isin(MANAGEMENT_OPS)).to_numpy()
    df = collectives[keep]
    path = np.full(len(collectives), -1, dtype=np.int64) if paths is None else paths
    path = pd.Series(path[keep], index=df.index)
    df = df.sort_values(["rank", "coll_id"], kind="stable")
    op = df["op"].astype(str)
    p2p = op.isin(P2P_OPS).to_numpy()
    rank = df["rank"].to_numpy(dtype=np.int64)
    peer = pd.to_numeric(df["peer"].where(p2p), errors="coerce").astype("Int64")
    root = pd.to_numeric(df["peer"].where(op.isin(ROOTED_OPS)), errors="coerce").astype("Int64")
    order = df.groupby("rank").cumcount().to_numpy(dtype=np.int64)
    return _finish(
        {
            "rank": rank,
            "pg": df["pg"],
            "pg_desc": df["pg_desc"],
            "pg_ranks": _ranks_per_group(df["pg"], df["pg_ranks"]),
            "seq": _positions(rank, df["pg"], ~p2p),
            "p2p_seq": _positions(rank, df["pg"], p2p),
            "op": op,
            "shapes": df["shapes"],
            "dtypes": df["dtypes"],
            "key": _key(op, df["shapes"], df["dtypes"], root=root),
            "peer": peer,
            "root": root,
            "completed": df["completed"],
            "state": _states(df["completed"], ok=df["ok"]),
            "ok": df["ok"],
            "error": df["error"],
            "t_start_s": df["t_start_s"],
            "t_end_s": df["t_end_s"],
            "site": df["site"],
            "path": path.loc[df.index].to_numpy(dtype=np.int64),
            "thread": df["thread"],
            "order": order,
            "row": df.index.to_numpy(dtype=np.int64),
            "source": "collectives",
        },
        len(df),
    )


def fr_completed(entries: pd.DataFrame) -> pd.Series:
    """Flight-recorder entries the backend completed: retired (the watchdog saw it end) or in
    state ``completed`` (an nccl dump written right after a collective can hold it completed and
    not yet retired: seen on an H200)."""
    return entries["retired"].fillna(False).astype(bool) | (entries["state"] == "completed")


#: The calls table's ``state``: issued (not completed), started on the device, completed,
#: failed (it raised): :func:`rankscope.state.call_state`, every view's rule.
STATES = CALL_STATES


def _states(completed: Any, started: Any = None, ok: Any = None) -> pd.Categorical:
    return pd.Categorical.from_codes(call_states(completed, ok, started), categories=STATES)


def _ranks_per_group(pg: pd.Series, pg_ranks: pd.Series) -> pd.Categorical:
    """``pg_ranks`` as a category per group: the members are a property of the group, so only
    the first recorded value of each group is read (a world of 16k ranks makes long texts)."""
    codes, count = _codes(pg)
    first = first_rows(codes, count, where=pg_ranks.notna().to_numpy())
    groups = np.flatnonzero(first < len(codes))
    text = dict(zip(groups.tolist(), pg_ranks.iloc[first[groups]].astype(str), strict=True))
    present = sorted(set(text.values()))
    place = {c: i for i, c in enumerate(present)}
    lookup = np.full(count, -1, dtype=code_type(len(present)))
    for group, ranks in text.items():
        lookup[group] = place[ranks]
    return pd.Categorical.from_codes(lookup[codes], categories=present)


def _thread_text(thread_id: pd.Series) -> pd.Categorical:
    """The recorder's ``thread_id`` (the thread's ident, as a decimal) as faulthandler and the
    probe print it: ``0x00007f...``; worked out once per distinct value."""
    values = thread_id.astype("category")
    names = []
    for value in values.cat.categories:
        try:
            number = int(str(value))
        except ValueError:
            number = -1
        names.append(f"0x{number:016x}" if number >= 0 else None)
    return pd.Categorical.from_codes(
        values.cat.codes.to_numpy(),
        categories=pd.Index([n or f"?{i}" for i, n in enumerate(names)], dtype=object),
    ).remove_categories([f"?{i}" for i, n in enumerate(names) if n is None])


def calls_from_flight_recorder(
    flight_recorder: pd.DataFrame, path_codes: np.ndarray | None = None
) -> pd.DataFrame:
    """The calls table from torch's flight-recorder entries (schema ``FLIGHT_RECORDER``), with
    ``path_codes`` the path code of each category of its ``path`` column
    (:attr:`rankscope.analyze.paths.CallPaths.fr_codes`; none: every path -1, unknown).

    ``seq`` is torch's ``collective_seq_id``; point-to-point entries (``is_p2p``) get their peer
    from the profiling name (``nccl:send 0->1`` names group ranks, mapped to global ranks through
    the group's members). Sites are not filled here: :func:`fr_sites` finds them for the few rows
    that need one. The entries are those of each rank's latest dumps
    (:func:`rankscope.collect.latest_dumps` chooses them as a run is read).
    """
    has_path = path_codes is not None and "path" in flight_recorder
    df = flight_recorder[[*_FR_COLUMNS, "path"] if has_path else _FR_COLUMNS]
    # An unnamed group is torch's own helper (TORCH_DISTRIBUTED_DEBUG=DETAIL wraps every group
    # and checks each collective on it): not a group of the job's, and not aligned.
    names = df["pg_name"].astype("category")
    named = names.notna() & (
        names.cat.codes != (names.cat.categories.get_loc("") if "" in names.cat.categories else -2)
    )
    usable = (df["op"].notna() & named & (df["op"] != "coalesced")).to_numpy()
    if not usable.all():
        df = df[usable]
    p2p = df["is_p2p"].fillna(False).to_numpy(dtype=bool) | df["op"].isin(P2P_OPS).to_numpy()
    any_p2p = bool(p2p.any())
    seq = df["collective_seq_id"]
    pg_ranks = _ranks_per_group(df["pg_name"], df["pg_ranks"])
    peer = None  # null without point-to-point calls
    if any_p2p:
        peer = pd.Series(pd.NA, index=df.index, dtype="Int64")
        peer[p2p] = _fr_peers(df[p2p], pg_ranks[p2p])
    completed = fr_completed(df).astype("boolean")
    rank = df["rank"].to_numpy(dtype=np.int64)
    # Dumps list a rank's entries oldest first; a rank's merged order is its record order.
    order = (
        df["record_id"].array.to_numpy(dtype=np.int64, copy=True)
        if len(df) and (df["record_id"].notna()).all()
        else df.groupby("rank").cumcount().to_numpy(dtype=np.int64)
    )
    thread = df["thread_id"]
    out = _finish(
        {
            "rank": rank,
            "pg": df["pg_name"],
            "pg_desc": df["pg_desc"],
            "pg_ranks": pg_ranks,
            "seq": seq.where(~p2p) if any_p2p else seq,
            "p2p_seq": df["p2p_seq_id"].where(p2p) if any_p2p else None,
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
            "state": _states(
                completed.to_numpy(dtype=bool),
                (df["state"] == "started").to_numpy(dtype=bool)
                | df["time_discovered_started_ns"].notna().to_numpy(dtype=bool),
            ),
            "t_start_s": _seconds(df["time_created_ns"]),
            "t_end_s": _seconds(df["time_discovered_completed_ns"]),
            "thread": None if thread.isna().all() else _thread_text(thread),
            "path": (
                np.append(path_codes, -1)[df["path"].array.codes]
                if has_path
                else np.full(len(df), -1, dtype=np.int64)
            ),
            "order": order,
            "row": df.index.to_numpy(dtype=np.int64),
            "source": "flight_recorder",
        },
        len(df),
    )
    # A coalesced group's entries follow each other and repeat one collective_seq_id; the first
    # stands for the group.
    idx = out["seq"].array.to_numpy(dtype=np.int64, na_value=-1)
    dup = np.zeros(len(out), dtype=bool)
    follows = dup[1:]  # a view: each row against the one before
    np.greater_equal(idx[1:], 0, out=follows)
    for a in (idx, out["pg"].array.codes, out["rank"].to_numpy()):
        follows &= a[1:] == a[:-1]
    return out[~dup].reset_index(drop=True) if dup.any() else out


def _seconds(ns: pd.Series) -> pd.arrays.FloatingArray:
    """Nanoseconds (nullable integers) as seconds, made in one array."""
    seconds = ns.to_numpy(dtype=np.float64, na_value=np.nan)
    seconds /= 1e9
    return pd.arrays.FloatingArray(seconds, np.isnan(seconds))


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


def merge_calls(
    probe: pd.DataFrame, fr: pd.DataFrame, *, backend_completes: np.ndarray | None = None
) -> pd.DataFrame:
    """One calls table from the probe's calls and the recorder's (each from the functions above).

    A recorder entry is a probe call's when it was made on the same rank, group and thread
    while that call ran (between its start and its end, or after its start if it never ended).
    Groups where some rank's recorder holds entries of no probe call (the backend's own
    collectives) take the recorder's sequence, with the probe's site, thread, outcome and
    function name on the entries that are its calls; other groups take the probe's. Ranks with
    only one source keep it.

    ``backend_completes`` marks the recorder rows whose completion is the backend's word (nccl:
    a call returns once enqueued): a probe call that returned is not completed while its entry
    is not.
    """
    if fr.empty:
        return probe
    if probe.empty:
        return fr
    owner = _owning_probe_call(probe, fr)
    if backend_completes is not None:
        undone = (owner >= 0) & backend_completes & ~fr["completed"].fillna(False).to_numpy(bool)
        if undone.any():
            probe = probe.copy()
            rows = probe.index[owner[undone]]
            probe.loc[rows, "completed"] = False
            probe.loc[rows, "state"] = fr["state"].to_numpy()[undone]
    own_entries = fr[owner < 0]
    backend = set(own_entries.loc[own_entries["seq"].notna(), "pg"].astype(str))
    probe_ranks = set(probe["rank"].unique().tolist())
    fr_pg = fr["pg"].astype(str)
    # The recorder's rows: on the backend's groups, and for ranks the probe never saw.
    fr_keep = fr_pg.isin(backend).to_numpy() | ~fr["rank"].isin(probe_ranks).to_numpy()
    fr_keep &= fr["seq"].notna().to_numpy() | ~fr["rank"].isin(probe_ranks).to_numpy()
    annotated = _annotate(fr[fr_keep], probe, owner[fr_keep])
    # The probe's rows: everywhere else, and its point-to-point calls everywhere (gloo's
    # recorder has none); a rank whose recorder missed a backend group (no dump) is left out of
    # that group: its probe numbers would not be the group's.
    probe_pg = probe["pg"].astype(str)
    on_backend = probe_pg.isin(backend).to_numpy()
    probe_keep = ~on_backend | probe["seq"].isna().to_numpy()
    table = pd.concat([probe[probe_keep], annotated], ignore_index=True, sort=False).astype(
        {c: t for c, t in CALLS.items() if t != "category"}
    )
    for col, dtype in CALLS.items():
        if dtype == "category":
            table[col] = table[col].astype("category")
    # One order per rank over both sources: by start time (the probe's start precedes the
    # entries its call makes), the sources' own order breaking ties.
    table = table.sort_values(["rank", "t_start_s", "source", "order"], kind="stable")
    table["order"] = table.groupby("rank").cumcount().to_numpy(dtype=np.int64)
    return table.reset_index(drop=True)


def _owning_probe_call(probe: pd.DataFrame, fr: pd.DataFrame) -> np.ndarray:
    """For each recorder row, the position in ``probe`` of the probe call that made it, or -1.

    Both tables' rows are grouped by (rank, group, thread); within a group a recorder entry
    belongs to the last probe call that started before it, if that call had not ended by then.
    Without threads on both sides (a recorder before 2.10, probe events before threads were
    recorded) it matches on (rank, group) alone."""
    owner = np.full(len(fr), -1, dtype=np.int64)
    if fr.empty or probe.empty:
        return owner
    use_thread = fr["thread"].notna().any() and probe["thread"].notna().any()
    keys = ["rank", "pg", "thread"] if use_thread else ["rank", "pg"]
    p = probe[[*keys, "t_start_s", "t_end_s", "completed"]].copy()
    f = fr[[*keys, "t_start_s"]].copy()
    for table, n in ((p, len(probe)), (f, len(fr))):
        table["pos"] = np.arange(n)
        for key in keys[1:]:  # text, so that the two tables' categories compare
            table[key] = table[key].astype(str)
    p = p.dropna(subset=["t_start_s"]).sort_values("t_start_s", kind="stable")
    f = f.dropna(subset=["t_start_s"]).sort_values("t_start_s", kind="stable")
    found = pd.merge_asof(
        f, p, on="t_start_s", by=keys, direction="backward", suffixes=("", "_probe")
    )
    ended = found["t_end_s"].astype("Float64")
    open_ = ~found["completed"].fillna(False).astype(bool) & ended.isna()
    inside = found["pos_probe"].notna() & (open_ | (ended >= found["t_start_s"]).fillna(False))
    owner[found.loc[inside, "pos"].to_numpy(dtype=np.int64)] = found.loc[
        inside, "pos_probe"
    ].to_numpy(dtype=np.int64)
    return owner


def _annotate(fr: pd.DataFrame, probe: pd.DataFrame, owner: np.ndarray) -> pd.DataFrame:
    """Recorder rows with what the probe knows of the calls that made them: the call site and
    path, the thread, whether the call raised, and the function the user called."""
    out = fr.copy()
    mine = owner >= 0
    if not mine.any():
        return out
    calls = probe.iloc[owner[mine]]
    for col in ("site", "thread", "error"):
        values = out[col].astype(object)
        values[mine] = calls[col].astype(object).to_numpy()
        out[col] = values
    ok = out["ok"].astype(object)
    ok[mine] = calls["ok"].astype(object).to_numpy()
    out["ok"] = ok
    out["state"] = _states(out["completed"], out["state"].eq("started"), ok=out["ok"])
    path = out["path"].to_numpy(dtype=np.int64, copy=True)
    path[mine] = calls["path"].to_numpy(dtype=np.int64)
    out["path"] = path
    return out


def fr_sites(fr_frames: pd.DataFrame, calls: pd.DataFrame, fr: pd.DataFrame) -> pd.Series:
    """``file:line`` of the innermost user frame of each flight-recorder call in ``calls``.

    ``calls`` are rows of a calls table from the recorder table ``fr`` (their ``row``); the
    result is indexed like them.
    """
    if calls.empty or fr_frames.empty:
        return pd.Series(pd.NA, index=calls.index, dtype="string")
    record = fr.loc[calls["row"].to_numpy(), "record_id"].to_numpy()
    want = pd.MultiIndex.from_arrays([calls["rank"].to_numpy(), record])
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
        [lookup.get((r, o), pd.NA) for r, o in zip(calls["rank"], record, strict=True)],
        index=calls.index,
        dtype="string",
    )


# --- reading rows of a calls table (or of the probe's collectives) ---------------------------
def done(rows: pd.DataFrame) -> pd.Series:
    """Calls completed (:func:`rankscope.state.call_state`: by the backend, and not raised)."""
    return pd.Series(call_states(rows["completed"], rows["ok"]) == 2, index=rows.index)


def failed(rows: pd.DataFrame) -> pd.Series:
    """Calls that raised (:func:`rankscope.state.call_state`)."""
    return pd.Series(call_states(rows["completed"], rows["ok"]) == 3, index=rows.index)


def opt(value: Any) -> str | None:
    """A cell as text, None where it is null."""
    return (
        None
        if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value))
        else str(value)
    )


def opt_int(value: Any) -> int | None:
    """A cell as an int, None where it is null."""
    return None if pd.isna(value) else int(value)
