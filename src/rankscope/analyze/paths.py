"""Where the ranks' paths first parted: every call's call path, and the ranks grouped by it.

The final snapshot says where the ranks stopped; the cause often lies earlier (a retry branch
that adds one all_reduce, one more micro-batch on one rank, a rank that left by ``sys.exit``).
As LLNL's STAT does with its call-path prefix trees, the ranks are grouped into classes by the
path of their calls, and the class that left the path the others share is named:

1. Each call carries its path (the probe's ``paths`` table: the frames from the outermost to
   the one that called torch.distributed; for the flight recorder's own entries, the path of
   their ``frames``, the entries table's ``path``), coded so that equal paths get equal codes
   on every rank and from either source (:class:`CallPaths`; where a probe call has no
   recorded path, its call site stands for it).
2. On each process group, each rank's sequence of (call, path) from its first call; ranks whose
   whole sequences are the same form one class and are compared once.
3. Two sequences part where one makes a call the other does not make there, or a different
   call (op, shapes, dtypes, root): an edit of the sequence, not a swap of one call for the
   same call from another line (``if rank == 0: broadcast(x) else: broadcast(y)`` is one
   collective and parts nothing).
4. At the earliest such position of any group, the ranks are grouped by what they did there
   (the call and its path, or no call: they had ended or stopped before it). The culprits are
   the class that left the path the others share: the smaller one; between equal classes, the
   one whose call is new on this group where the other's was made before; else the one that
   made no call. Where nothing tells them apart, the divergence names no culprit and says so.
   (The analysis then names a larger class that took a branch the smaller passed by into a
   call new on the group: the path the group kept is the smaller's.)

Point-to-point calls are compared apart (their own numbering; a send and its recv differ by
design): see :func:`p2p_divergence`.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from rankscope.analyze.align import Complete, complete_on
from rankscope.analyze.calls import opt
from rankscope.analyze.diagnosis import who_of
from rankscope.analyze.waits import departed
from rankscope.collect import short_site
from rankscope.rundir import is_user_file
from rankscope.state import step_words

#: A frame: (file, function, line).
Frame = tuple[str, str, int]
#: Calls compared after a first difference, to tell a swap of lines from an edit.
_WINDOW = 4096


class CallPaths:
    """The path of every call of the probe's ``collectives`` table, as codes that are equal for
    equal paths on any rank (``codes``, one per row), and the frames of each code (``frames``,
    outermost first). A call without a recorded path stands for itself by its call site.

    ``fr_paths``: the flight recorder's ``path`` column (JSON text per distinct path); the code
    of each of its categories is ``fr_codes`` (one space with the probe's: the same frames, the
    same code), for :func:`~rankscope.analyze.calls.calls_from_flight_recorder`. A category
    that is not a list of [file, func, line] has no code (-1)."""

    def __init__(
        self,
        collectives: pd.DataFrame,
        paths: pd.DataFrame | None,
        fr_paths: pd.Series | None = None,
    ):
        self.frames: list[tuple[Frame, ...]] = []
        index: dict[tuple[Frame, ...], int] = {}

        def code(frames: tuple[Frame, ...]) -> int:
            if frames not in index:
                index[frames] = len(self.frames)
                self.frames.append(frames)
            return index[frames]

        by_id: dict[tuple[int, int], int] = {}
        if paths is not None and not paths.empty:
            ok = paths[["rank", "path", "depth", "line"]].notna().all(axis=1)
            rows = paths[ok].sort_values(["rank", "path", "depth"], kind="stable")
            for (rank, pid), g in rows.groupby(["rank", "path"], sort=False):
                frames = tuple(
                    (str(f), str(fn), int(ln))
                    for f, fn, ln in zip(g["file"], g["func"], g["line"], strict=True)
                )
                by_id[(int(rank), int(pid))] = code(frames)
        categories = [] if fr_paths is None else list(fr_paths.astype("category").cat.categories)
        self.fr_codes = np.array(
            [code(f) if (f := _frames_of_text(t)) else -1 for t in categories],
            dtype=np.int64,
        )
        n = len(collectives)
        self.codes = np.full(n, -1, dtype=np.int64)
        if not n:
            return
        rank = collectives["rank"].to_numpy(dtype=np.int64, na_value=-1)
        pid = (
            collectives["path"].to_numpy(dtype=np.int64, na_value=-1)
            if "path" in collectives
            else np.full(n, -1, dtype=np.int64)
        )
        file = collectives["file"].astype(object).to_numpy()
        func = collectives["func"].astype(object).to_numpy()
        line = collectives["line"].to_numpy(dtype=np.int64, na_value=-1)
        # one look-up per distinct (rank, path id, site), not per call
        keys = pd.MultiIndex.from_arrays([rank, pid, file, func, line])
        inverse, uniques = pd.factorize(keys)
        found = np.full(len(uniques), -1, dtype=np.int64)
        for i, (r, p, f, fn, ln) in enumerate(uniques):
            c = by_id.get((r, p), -1) if p >= 0 else -1
            if c < 0 and isinstance(f, str) and ln >= 0:
                c = code(((f, str(fn) if isinstance(fn, str) else "", int(ln)),))
            found[i] = c
        self.codes = found[inverse]

    def of(self, code: int) -> tuple[Frame, ...]:
        """The frames of a path code, outermost first; none for -1."""
        return self.frames[code] if 0 <= code < len(self.frames) else ()

    def user_sites(self, codes: np.ndarray, sites: pd.Series) -> pd.Series:
        """The call sites ``sites`` (``file.py:N``, one per code of ``codes``) with the user's
        frame first where the call was made inside a library: ``model.py:26 → distributed.py:247``
        (:func:`user_first`). One look-up per distinct (code, site)."""
        if not len(sites):
            return sites
        keys = pd.MultiIndex.from_arrays([codes, sites.astype(object).fillna("")])
        inverse, uniques = pd.factorize(keys)
        out = np.array([user_first(self.of(int(c)), s or None) for c, s in uniques], dtype=object)[
            inverse
        ]
        return pd.Series(out, index=sites.index, dtype="string")


def _frames_of_text(text: Any) -> tuple[Frame, ...] | None:
    """The frames of a recorder entry's ``path`` (JSON ``[[file, func, line], ...]``)."""
    try:
        frames = json.loads(text)
    except (TypeError, ValueError):
        return None
    if not isinstance(frames, list) or not all(
        isinstance(f, list)
        and len(f) == 3
        and isinstance(f[0], str)
        and isinstance(f[1], str)
        and type(f[2]) is int
        for f in frames
    ):
        return None
    return tuple((f[0], f[1], f[2]) for f in frames) or None


@dataclass(frozen=True, kw_only=True)
class PathClass:
    """Ranks that did the same at the first divergence: the same call from the same path, or
    no call (``op`` None: they had ended, or stopped elsewhere, before it)."""

    ranks: tuple[int, ...]
    op: str | None
    site: str | None
    path: tuple[Frame, ...]
    row: int | None
    """A row of the calls table of this call (its lowest rank's), None for no call."""
    culprit: bool = False
    via: str | None = None
    """``file.py:N``: this class's frame where the classes' paths first differ (the line that
    led into the call), where that is not the call's own site."""

    def __post_init__(self) -> None:
        if self.site is None and self.op is not None and self.path:
            # a recorder entry whose site was not read: its path's, the user's frame first
            object.__setattr__(self, "site", user_first(self.path))

    def to_dict(self) -> dict[str, Any]:
        return {
            "ranks": list(self.ranks),
            "op": self.op,
            "site": self.site,
            "via": self.via,
            "path": [list(f) for f in self.path],
            "culprit": self.culprit,
        }


@dataclass(frozen=True, kw_only=True)
class FirstDivergence:
    """The first position where the ranks' paths part on one group, with the ranks grouped by
    what they did there (:class:`PathClass`), the culprits among them and how they were told."""

    pg: str
    pg_desc: str | None
    seq: int
    """The collective's number on the group (from 1), or the point-to-point call's."""
    kind: str
    """``collective`` or ``p2p``."""
    classes: tuple[PathClass, ...]
    decided_by: str
    """How the culprit class was told: ``fewer`` (the smaller class), ``new`` (its call had not
    been made on the group before, the others' had), ``branch`` (the larger class took a branch
    the smaller passed by into a call new on the group:
    :meth:`~rankscope.analyze.context.Context.first_divergence`), ``no_call`` (it made no call
    there), ``peer`` (a point-to-point call whose peer is not calling it), or ``tie`` (nothing
    tells: no culprit)."""
    extra: int
    """Calls the culprits made more (positive) or fewer (negative) than the others on the group
    from here on, as far as their records go; 0 where the calls differ one for one."""
    step: int | None = None

    @property
    def culprits(self) -> list[int]:
        return sorted(r for c in self.classes if c.culprit for r in c.ranks)

    @property
    def others(self) -> list[int]:
        return sorted(r for c in self.classes if not c.culprit for r in c.ranks)

    def culprit_class(self) -> PathClass | None:
        return next((c for c in self.classes if c.culprit), None)

    def other_class(self) -> PathClass:
        """The largest class that is not the culprits'."""
        rest = [c for c in self.classes if not c.culprit]
        return max(rest, key=lambda c: (len(c.ranks), c.op is not None))

    def to_dict(self) -> dict[str, Any]:
        return {
            "pg": self.pg,
            "pg_desc": self.pg_desc,
            "seq": self.seq,
            "kind": self.kind,
            "step": self.step,
            "culprits": self.culprits,
            "decided_by": self.decided_by,
            "extra": self.extra,
            "classes": [c.to_dict() for c in self.classes],
        }


def first_divergences(
    calls: pd.DataFrame,
    paths: CallPaths,
    *,
    members: Mapping[str, Sequence[int]],
    ranks: Collection[int],
    complete: Collection[int] | Complete = (),
) -> list[FirstDivergence]:
    """The first divergence of the paths on every group that has one (collectives only), each
    group's at its earliest position. ``ranks``: those with evidence; a rank with no call on a
    group is counted only if its record of the group is ``complete`` (from its first call:
    :class:`~rankscope.analyze.align.Complete`).

    Vectorised over the calls (a 16k-rank job has 32 million): the table is read as arrays, each
    rank's sequence is a run of rows, and ranks with the same whole sequence (one hash per rank,
    checked row by row) form one class compared once."""
    seq_all = calls["seq"].array
    pg_all, pg_names = _pg_codes(calls["pg"])
    numbered = ~np.asarray(seq_all.isna(), dtype=bool) & (pg_all >= 0)
    if not numbered.any():
        return []
    # every row numbered (the usual table): the columns as they are, not copies of them
    everything = bool(numbered.all())
    where = np.arange(len(numbered)) if everything else np.flatnonzero(numbered)

    def take(a: np.ndarray) -> np.ndarray:
        return a if everything else a[where]

    seq = take(seq_all.to_numpy(dtype=np.int64, na_value=0))
    rank = take(calls["rank"].to_numpy(dtype=np.int64))
    pg_codes = take(pg_all).astype(np.int64)
    token = _tokens(take(calls["key"].to_numpy(dtype=np.int64)), take(calls["path"].to_numpy()))
    # one order: by group, rank and seq (kept where it already is: a sort of 32 million rows
    # costs seconds)
    if not _sorted(pg_codes, rank, seq):
        order = _order(pg_codes, rank, seq)
        where, seq, rank, pg_codes, token = (a[order] for a in (where, seq, rank, pg_codes, token))
    stuck = _stuck(calls, pg_all)
    out = []
    bounds = np.flatnonzero(np.diff(pg_codes)) + 1
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(pg_codes)], strict=True):
        pg = str(pg_names[pg_codes[lo]])
        found = _group_divergence(
            pg,
            calls,
            _Group(where[lo:hi], seq[lo:hi], rank[lo:hi], token[lo:hi]),
            paths,
            members,
            ranks,
            complete,
            stuck,
            int(pg_codes[lo]),
        )
        if found is not None:
            out.append(found)
    return out


@dataclass(frozen=True)
class _Group:
    """One group's numbered calls, ordered by rank and seq: their rows in the calls table (by
    position), seq, rank and token."""

    where: np.ndarray
    seq: np.ndarray
    rank: np.ndarray
    token: np.ndarray


def _stuck(calls: pd.DataFrame, pg_codes: np.ndarray) -> dict[int, set[int]]:
    """Of each rank with an unfinished call, the groups (codes) it waits in."""
    open_ = np.flatnonzero((calls["state"] != "completed").to_numpy(dtype=bool) & (pg_codes >= 0))
    out: dict[int, set[int]] = {}
    for r, p in zip(
        calls["rank"].to_numpy()[open_].tolist(), pg_codes[open_].tolist(), strict=True
    ):
        out.setdefault(int(r), set()).add(int(p))
    return out


def _pg_codes(pg: pd.Series) -> tuple[np.ndarray, list[Any]]:
    """The groups' codes (-1: none) and names."""
    cat = pg if isinstance(pg.dtype, pd.CategoricalDtype) else pg.astype("category")
    return np.asarray(cat.array.codes), list(cat.cat.categories)


def _order(pg: np.ndarray, rank: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """The rows' order by group, rank and seq, as ``np.lexsort((seq, rank, pg))`` gives it
    (stable). Where each (group, rank) is one run of rows already in seq order (a table read
    dump after dump, the dumps in another order than their ranks'; the reader's own is by rank),
    only the runs are sorted, not the rows (32 million at 16k ranks)."""
    n = len(pg)
    if n < 2:
        return np.arange(n)
    change = (np.diff(pg) != 0) | (np.diff(rank) != 0)
    starts = np.r_[0, np.flatnonzero(change) + 1]
    in_run = ~change
    runs = np.lexsort((rank[starts], pg[starts]))
    run_pg, run_rank = pg[starts][runs], rank[starts][runs]
    one_run_each = not ((np.diff(run_pg) == 0) & (np.diff(run_rank) == 0)).any()
    if not one_run_each or (np.diff(seq)[in_run] < 0).any():
        return np.lexsort((seq, rank, pg))
    lengths = np.diff(np.r_[starts, n])[runs]
    new_starts = np.r_[0, np.cumsum(lengths)[:-1]]
    return np.repeat(starts[runs] - new_starts, lengths) + np.arange(n)


def _sorted(*keys: np.ndarray) -> bool:
    """Whether the rows are in lexicographic order of ``keys`` (the first the major one)."""
    if len(keys[0]) < 2:
        return True
    ok = np.ones(len(keys[0]) - 1, dtype=bool)
    tie = np.ones(len(keys[0]) - 1, dtype=bool)
    for k in keys:
        d = np.diff(k)
        ok &= ~tie | (d >= 0)
        tie &= d == 0
    return bool(ok.all())


def _tokens(key: np.ndarray, path: np.ndarray) -> np.ndarray:
    """One integer per call: equal for the same call (its key) from the same path."""
    path = path.astype(np.int64) + 1  # -1 (no path): 0
    span = int(path.max(initial=0)) + 1
    if len(key) and int(key.max()) < (1 << 62) // span and int(key.min()) >= 0:
        return key * span + path
    codes, _ = pd.factorize(pd.MultiIndex.from_arrays([key, path]))
    return codes.astype(np.int64)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, on unsigned 64-bit integers (wrapping), in place of ``x``: an
    array of the calls (32 million at 16k ranks) and one temporary, not five."""
    t = x >> np.uint64(30)
    x ^= t
    x *= np.uint64(0xBF58476D1CE4E5B9)
    np.right_shift(x, np.uint64(27), out=t)
    x ^= t
    x *= np.uint64(0x94D049BB133111EB)
    np.right_shift(x, np.uint64(31), out=t)
    x ^= t
    return x


def _classes(g: _Group, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray | None:
    """The class of each rank's sequence (ranks with the same whole sequence share one), from
    one hash per rank checked row by row against the class's first rank; None where two
    different sequences share a hash (then the caller compares them as bytes)."""
    pos = np.arange(len(g.token), dtype=np.int64)
    pos -= np.repeat(starts, lengths)
    with np.errstate(over="ignore"):
        h = _mix(pos.view(np.uint64) + np.uint64(1))
        h ^= g.token.astype(np.uint64, copy=False)
        _mix(h)
        summed = np.add.reduceat(h, starts) if len(h) else np.zeros(0, np.uint64)
    summed = np.where(lengths > 0, summed, 0)
    cls, _ = pd.factorize(pd.MultiIndex.from_arrays([summed.view(np.int64), lengths]))
    first = np.full(cls.max(initial=-1) + 1, -1, dtype=np.int64)
    first[cls[::-1]] = np.arange(len(cls))[::-1]  # each class's first rank
    rep_start = starts[first[cls]]
    rows_cls = np.repeat(rep_start, lengths) + pos
    if len(rows_cls) and not np.array_equal(g.token[rows_cls], g.token):
        return None
    return cls


def _group_divergence(
    pg: str,
    calls: pd.DataFrame,
    g: _Group,
    paths: CallPaths,
    members: Mapping[str, Sequence[int]],
    ranks: Collection[int],
    complete: Collection[int] | Complete,
    stuck: Mapping[int, set[int]],
    code: int,
) -> FirstDivergence | None:
    """``stuck``: of each rank with an unfinished call, the groups (codes) it waits in;
    ``code``: this group's."""
    bounds = np.flatnonzero(np.diff(g.rank)) + 1
    starts = np.r_[0, bounds].astype(np.int64)
    start = int(g.seq[starts].max())
    keep = g.seq >= start
    if not keep.all():
        g = _Group(g.where[keep], g.seq[keep], g.rank[keep], g.token[keep])
        bounds = np.flatnonzero(np.diff(g.rank)) + 1
        starts = np.r_[0, bounds].astype(np.int64)
    own = g.rank[starts].tolist() if len(g.rank) else []
    lengths = np.diff(np.r_[starts, len(g.rank)]).astype(np.int64)
    expected = set(members.get(pg, ())) & set(ranks)
    done = complete_on(complete, pg)
    empty = sorted(r for r in expected - set(own) if r in done and start <= 1)
    if len(own) + len(empty) < 2:
        return None
    cls = _classes(g, starts, lengths)
    if cls is None:  # a hash shared by two sequences: their bytes tell them apart
        keys = [g.token[a : a + n].tobytes() for a, n in zip(starts, lengths, strict=True)]
        cls, _ = pd.factorize(pd.Series(keys, dtype=object))
    # ranks with the same whole sequence: one class, compared once
    classes: dict[int, list[int]] = {}
    for i, c in enumerate(cls.tolist()):
        classes.setdefault(c, []).append(i)
    if empty:
        classes[-1] = []  # the ranks that made no call: one class of their own
    if len(classes) < 2:
        return None
    keys = calls["key"].to_numpy(dtype=np.int64)

    def sequence(c: int) -> tuple[np.ndarray, np.ndarray]:
        if c == -1:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        i = classes[c][0]
        rows = slice(starts[i], starts[i] + lengths[i])
        return g.token[rows], keys[g.where[rows]]

    size = {c: len(v) if c != -1 else len(empty) for c, v in classes.items()}
    reps = sorted(classes, key=lambda c: (-size[c], _first_rank(c, classes, own, empty)))
    ref = sequence(reps[0])
    pos, extra = None, 0
    for c in reps[1:]:
        p, e = _parts_at(ref, sequence(c))
        if p is not None and (pos is None or p < pos):
            pos, extra = p, e
    if pos is None:
        return None
    # what each rank did at that position: its call's row (position in calls), or no call
    has = lengths > pos
    row_at = np.where(has, g.where[np.minimum(starts + pos, len(g.where) - 1)], -1)
    tok_at = np.where(has, g.token[np.minimum(starts + pos, len(g.token) - 1)], -1)
    at: dict[Any, list[int]] = {}
    first_row: dict[Any, tuple[int, int]] = {}
    for r, t, row in zip(own, tok_at.tolist(), row_at.tolist(), strict=True):
        k = t if row >= 0 else None
        at.setdefault(k, []).append(r)
        if k is not None and (k not in first_row or r < first_row[k][0]):
            first_row[k] = (r, row)
    for r in empty:
        at.setdefault(None, []).append(r)
    if len(at) < 2:
        return None
    index = calls.index
    made = []
    for t, rs in at.items():
        row = None if t is None else index[first_row[t][1]]
        made.append(
            PathClass(
                ranks=tuple(sorted(rs)),
                op=None if row is None else str(calls.at[row, "op"]),
                site=None if row is None else opt(calls.at[row, "site"]),
                path=() if row is None else paths.of(int(calls.at[row, "path"])),
                row=None if row is None else int(row),
            )
        )
    prefix = ref[0][:pos]
    culprit, decided_by = _culprit(made, at, prefix)
    if culprit is not None and len(culprit) > 1:
        # ranks that made no call here because they wait in another group's call did not
        # leave this path: the call they wait in says what they did (a class that made a
        # call here is named in their place)
        away = {
            c.ranks
            for c in made
            if c.op is None and all(stuck.get(r, set()) - {code} for r in c.ranks)
        }
        if away and culprit - away:
            culprit -= away
    made = [
        replace(c, culprit=culprit is not None and c.ranks in culprit, via=_via(c, made))
        for c in made
    ]
    made.sort(key=lambda c: (not c.culprit, -len(c.ranks), c.ranks))
    ref_ranks = [own[i] for i in classes[reps[0]]] if reps[0] != -1 else empty
    return FirstDivergence(
        pg=pg,
        pg_desc=opt(calls["pg_desc"].iloc[int(g.where[0])]) if len(g.where) else None,
        seq=start + pos,
        kind="collective",
        classes=tuple(made),
        decided_by=decided_by,
        extra=extra if culprit is not None and _ref_is_other(made, ref_ranks) else -extra,
    )


def _via(c: PathClass, made: Sequence[PathClass]) -> str | None:
    """``c``'s frame at the first depth where the paths of the classes that made a call differ,
    where it is not the call's own site."""
    paths = [m.path for m in made if m.path]
    if not c.path or len(paths) < 2:
        return None
    depth = 0
    while all(len(p) > depth for p in paths) and len({p[depth] for p in paths}) == 1:
        depth += 1
    if depth >= len(c.path) - 1:
        return None
    file, _func, line = c.path[depth]
    if not is_user_file(file) and any(is_user_file(f[0]) for f in c.path):
        return None  # a library's line between: the user's frame leads the site (user_first)
    via = short_site(file, line)
    return None if c.site and c.site.split(" → ")[0] == via else via


def _first_rank(c: int, classes: dict[int, list[int]], own: list[int], empty: list[int]) -> int:
    return empty[0] if c == -1 else own[classes[c][0]]


def _ref_is_other(made: list[PathClass], ref_ranks: list[int]) -> bool:
    """Whether the reference sequence (the largest class's) is among the others."""
    return any(not c.culprit and ref_ranks[0] in c.ranks for c in made)


def _parts_at(
    a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]
) -> tuple[int | None, int]:
    """Where sequence ``b`` first parts from ``a`` (an edit: a call made or skipped, or a
    different call), and how many calls more ``b`` makes there than ``a``; (None, 0) where they
    differ only by swaps of the same call from other lines."""
    ta, ka = a
    tb, kb = b
    n = min(len(ta), len(tb))
    diff = np.flatnonzero(ta[:n] != tb[:n])
    if not len(diff):
        return (n, len(tb) - len(ta)) if len(ta) != len(tb) else (None, 0)
    first = int(diff[0])
    wa, wb = ta[first : first + _WINDOW], tb[first : first + _WINDOW]
    matcher = difflib.SequenceMatcher(None, wa.tolist(), wb.tolist(), autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        if tag == "replace" and i2 - i1 == j2 - j1:
            # one call for one: the same calls from other lines part nothing; the first that
            # is another call is where they part
            other = np.flatnonzero(ka[first + i1 : first + i2] != kb[first + j1 : first + j2])
            if not len(other):
                continue
            return first + i1 + int(other[0]), 0
        # a call made or skipped (swaps of one for one before it keep both sides in step); how
        # many: as far as the records go, what one side made more than the other
        return first + min(i1, j1), (len(tb) - len(ta)) or (j2 - j1) - (i2 - i1)
    # the window ended on swaps: what lies past it
    if len(ta) != len(tb) and n <= first + _WINDOW:
        return n, len(tb) - len(ta)
    return None, 0


def _culprit(
    made: list[PathClass], at: Mapping[Any, list[int]], prefix: np.ndarray
) -> tuple[set[tuple[int, ...]] | None, str]:
    """The classes that left the shared path, and how they were told (see the module)."""
    sizes = sorted((len(c.ranks) for c in made), reverse=True)
    if sizes[0] > sizes[1]:  # one class is the largest: the others left it
        big = max(made, key=lambda c: len(c.ranks))
        return {c.ranks for c in made if c is not big}, "fewer"
    tokens = {tuple(sorted(rs)): t for t, rs in at.items()}
    largest = [c for c in made if len(c.ranks) == sizes[0]]
    seen = {
        c.ranks: t is not None and bool((prefix == t).any())
        for c in largest
        for t in [tokens[c.ranks]]
    }
    new = [c for c in largest if not seen[c.ranks]]
    if 0 < len(new) < len(largest) and all(c.op is not None for c in new):
        return {c.ranks for c in new} | {c.ranks for c in made if c not in largest}, "new"
    ended = [c for c in largest if c.op is None]
    if len(ended) == 1:
        return {ended[0].ranks} | {c.ranks for c in made if c not in largest}, "no_call"
    return None, "tie"


#: Point-to-point calls by direction: what a rank sends, and what it receives.
SENDS = frozenset({"send", "isend", "send_object_list"})
RECVS = frozenset({"recv", "irecv", "recv_object_list"})


def unmatched_p2p(calls: pd.DataFrame) -> dict[tuple[int, int], int]:
    """Pairs (sender, receiver) whose point-to-point calls do not meet: how many more times the
    sender sent to the receiver than the receiver received from it (negative: fewer)."""
    p2p = calls[calls["p2p_seq"].notna() & calls["peer"].notna()]
    sent: dict[tuple[int, int], int] = {}
    op = p2p["op"].astype(str).to_numpy()
    me = p2p["rank"].to_numpy(dtype=np.int64)
    peer = p2p["peer"].to_numpy(dtype=np.int64)
    for o, a, b in zip(op, me, peer, strict=True):
        if o in SENDS:
            sent[(int(a), int(b))] = sent.get((int(a), int(b)), 0) + 1
        elif o in RECVS:
            sent[(int(b), int(a))] = sent.get((int(b), int(a)), 0) - 1
    return {k: v for k, v in sent.items() if v}


def p2p_divergence(
    calls: pd.DataFrame, paths: CallPaths, unmatched: Mapping[tuple[int, int], int]
) -> FirstDivergence | None:
    """Where point-to-point calls that do not meet began: of the ranks in an unmatched pair,
    the one whose call (op, path, peer) is new in its own history, after that history had
    repeated (a loop's pattern left); else the rank common to every unmatched pair. Ranks of
    a pipeline make different calls by design, so ranks are compared with themselves, not
    with each other; and only where calls do not meet, so a healthy job has no such
    divergence."""
    involved = sorted({r for pair in unmatched for r in pair})
    if not involved:
        return None
    p2p = calls[calls["p2p_seq"].notna() & calls["rank"].isin(involved)]
    found: dict[int, Any] = {}
    for rank, mine in p2p.groupby("rank", sort=True):
        mine = mine.sort_values("order")
        seen: set[tuple[Any, ...]] = set()
        repeated = False
        for idx, o, path, peer in zip(
            mine.index, mine["op"].astype(str), mine["path"], mine["peer"], strict=True
        ):
            token = (o, int(path), None if pd.isna(peer) else int(peer))
            if token in seen:
                repeated = True
            elif repeated:
                found[int(rank)] = idx
                break
            seen.add(token)
    decided_by = "new"
    if len(found) != 1:
        ranks = [r for pair in unmatched for r in pair]
        common = [r for r in involved if ranks.count(r) == len(unmatched) and len(unmatched) > 1]
        if len(common) != 1:
            return None
        rank = common[0]
        if rank not in found:
            mine = p2p[p2p["rank"] == rank].sort_values("order")
            if mine.empty:
                return None
            found = {rank: mine.index[-1]}
        found, decided_by = {rank: found[rank]}, "peer"
    ((rank, idx),) = found.items()
    row = calls.loc[idx]
    seq = int(row["p2p_seq"])
    own = PathClass(
        ranks=(rank,),
        op=str(row["op"]),
        site=opt(row["site"]),
        path=paths.of(int(row["path"])),
        row=int(idx),
        culprit=True,
    )
    others = tuple(r for r in involved if r != rank)
    at_seq = calls[
        calls["rank"].isin(others) & (calls["p2p_seq"] == seq) & (calls["pg"] == row["pg"])
    ]
    first = at_seq.iloc[0] if len(at_seq) else None
    other = PathClass(
        ranks=others,
        op=None if first is None else str(first["op"]),
        site=None if first is None else opt(first["site"]),
        path=() if first is None else paths.of(int(first["path"])),
        row=None if first is None else int(at_seq.index[0]),
    )
    classes = (own, replace(other, via=_via(other, [own, other])))
    classes = (replace(own, via=_via(own, [own, other])), classes[1])
    return FirstDivergence(
        pg=str(row["pg"]),
        pg_desc=opt(row["pg_desc"]),
        seq=seq,
        kind="p2p",
        classes=classes,
        decided_by=decided_by,
        extra=0,
    )


def earliest(divs: Iterable[FirstDivergence], calls: pd.DataFrame) -> FirstDivergence | None:
    """Of the groups' first divergences, the one whose culprits did something there (made a
    call: where one rank called on another group than its own, that call says what it did,
    its absence on its own group does not), then the first the ranks reached (one where a rank
    made its call before one where that rank made none), then one not made only by ranks that
    had not got there yet (:func:`_behind`), then one whose culprits include a rank that broke
    the order of calls the job kept (:func:`rankscope.analyze.waits.departed`), then the first
    in time (the start of its earliest call; one without a call at all, last). The rules before
    time keep the choice independent of the timing of two groups that part at once."""

    def when(d: FirstDivergence) -> tuple[bool, float]:
        own = d.culprit_class()
        rows = [c.row for c in d.classes if c.row is not None]
        t = calls.loc[rows, "t_start_s"].min() if rows else np.nan
        return (own is None or own.op is None, np.inf if pd.isna(t) else float(t))

    divs = list(divs)
    if not divs:
        return None
    # Where no culprit made a call, the order the ranks themselves saw decides: a divergence
    # where some rank made its call comes before one where that same rank made none (it never
    # got there).
    pool = [d for d in divs if not when(d)[0]] or divs
    reached = [{r for c in d.classes if c.op is not None for r in c.ranks} for d in pool]
    missing = [{r for c in d.classes if c.op is None for r in c.ranks} for d in pool]
    first = [
        d
        for j, d in enumerate(pool)
        if not any(i != j and reached[i] & missing[j] for i in range(len(pool)))
    ] or pool
    # Two that exclude each other (rank 1 reached one and skipped the other, rank 3 the
    # reverse) are told by the paths, not by the clock.
    if len(first) > 1:
        first = [d for d in first if not _behind(d, calls)] or first
    # Where neither rank is behind the other (their paths part at once, each on its own
    # group), the history tells: one of them left the order of calls it kept at every step.
    if len(first) > 1:
        blamed = [set(d.culprits) for d in first]
        odd = set(departed(calls, set().union(*blamed)))
        first = [d for d, b in zip(first, blamed, strict=True) if b & odd] or first
    return min(first, key=when)


def _behind(d: FirstDivergence, calls: pd.DataFrame) -> bool:
    """Whether every rank that made no call at ``d`` waits in a call on the path of a rank
    that made it: its whole sequence of calls (on every group, in its own order; the same
    call from the same path) is the start of that rank's. Such a rank had not got there yet;
    ``d`` follows from where it waits, and did not part the paths."""
    missing = sorted({r for c in d.classes if c.op is None for r in c.ranks})
    reached = sorted({r for c in d.classes if c.op is not None for r in c.ranks})
    if not missing or not reached:
        return False
    rank = calls["rank"].to_numpy(dtype=np.int64)
    here = np.flatnonzero(np.isin(rank, [*missing, *reached]))
    if not len(here):
        return False
    rank = rank[here]
    order = calls["order"].to_numpy(dtype=np.int64)[here]
    token = _tokens(calls["key"].to_numpy(dtype=np.int64)[here], calls["path"].to_numpy()[here])
    waits = (calls["state"] != "completed").to_numpy(dtype=bool)[here]
    if not _sorted(rank, order):
        by = np.lexsort((order, rank))
        rank, token, waits = rank[by], token[by], waits[by]
    starts = np.r_[0, np.flatnonzero(np.diff(rank)) + 1]
    lengths = np.diff(np.r_[starts, len(rank)])
    position = np.arange(len(rank)) - np.repeat(starts, lengths)
    of = {int(r): (int(lo), int(n)) for r, lo, n in zip(rank[starts], starts, lengths, strict=True)}
    ahead = np.isin(rank, reached)
    for m in missing:
        if m not in of:
            return False
        lo, n = of[m]
        if not waits[lo : lo + n].any():
            return False  # it had ended, or left: a path of its own
        mine = ahead & (position < n)
        same = np.zeros(len(rank), dtype=bool)
        same[mine] = token[mine] == token[lo + position[mine]]
        agree = np.bincount(rank[same], minlength=int(rank.max()) + 1)
        longer = [r for r in reached if r in of and of[r][1] > n]
        if not any(agree[r] == n for r in longer):
            return False
    return True


def step_at(events: pd.DataFrame, rank: int, t_s: float | None) -> int | None:
    """The step ``rank`` had marked (``rankscope.step``) when its call started, if it marks
    steps."""
    if t_s is None or events.empty:
        return None
    mine = events[(events["ev"] == "step") & (events["rank"] == rank) & (events["t_s"] <= t_s)]
    steps = mine["step"].dropna()
    return int(steps.iloc[-1]) if len(steps) else None


def describe(d: FirstDivergence, gone: Collection[int] = ()) -> str:
    """The divergence in one sentence: who did what where, and who did what instead. ``gone``:
    the ranks that had left on their own (a class of them that made no call had left)."""
    own = d.culprit_class()
    other = d.other_class()
    where = f"collective #{d.seq}" if d.kind == "collective" else f"point-to-point call #{d.seq}"
    step = f" ({step_words(d.step)})" if d.step is not None else ""

    def doing(c: PathClass) -> str:
        if c.op is None:
            return "made no call there" + (" " + had_left(c.ranks) if left(c, gone) else "")
        return f"called {c.op} from " + " → ".join(x for x in (c.via, c.site) if x)

    if own is None:
        classes = "; ".join(f"{who_of(c.ranks)} {doing(c)}" for c in d.classes)
        return f"the paths part at {where}{step} on group {d.pg}: {classes}"
    return (
        f"{who_of(own.ranks)} {doing(own)} at {where}{step} on group {d.pg}, where "
        f"{who_of(other.ranks)} {doing(other)}"
    )


def left(c: PathClass, gone: Collection[int]) -> bool:
    """Whether the class made no call because its ranks had left on their own (``gone``), not
    because they were held elsewhere (blocked outside, or in another group's call)."""
    return c.op is None and bool(c.ranks) and set(c.ranks) <= set(gone)


def had_left(ranks: Collection[int]) -> str:
    return "(" + ("it" if len(ranks) == 1 else "they") + " had left)"


def user_first(path: Sequence[Frame], site: str | None = None) -> str | None:
    """A call's site as the card names it: where its innermost frame (``site``, by default the
    path's) is a library's (Lightning, transformers, accelerate, torch) and the path holds a
    frame of the user's, the innermost of those leading into it, ``model.py:26 →
    distributed.py:247``; else the site itself. A call the framework makes by itself keeps its
    own site after the user's line that entered the framework (``train.py:40 →
    training_epoch_loop.py:265``)."""
    site = site or path_site(path)
    if not path or is_user_file(path[-1][0]):
        return site
    user = next((f for f in reversed(path) if is_user_file(f[0])), None)
    if user is None:
        return site
    return f"{short_site(user[0], user[2])} → {site}" if site else short_site(user[0], user[2])


def path_site(path: Sequence[Frame]) -> str | None:
    """``file.py:N`` of a path's innermost frame."""
    return short_site(path[-1][0], path[-1][2]) if path else None
