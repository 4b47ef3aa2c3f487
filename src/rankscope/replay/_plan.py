"""From a diagnosed run to a replay plan: which ranks, which groups, which calls, how each rank ends.

The calls, the groups' members, the wait-for graph and each rank's facts are the ones the analyzer
built its diagnosis from (``Diagnosis.context``), read and not derived again. The calls: the probe's
events (every call made from Python, exact call sites) and torch's flight recorder (the last
entries of each rank's ring buffer, collectives torch issues from C++ included), merged into one
sequence per rank. Each call's details (tensors, peers) are read from the row it came from.
Everything here is about the original job; :mod:`rankscope.replay._script` writes the plan out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd

from rankscope.analyze import align
from rankscope.analyze.calls import fr_sites
from rankscope.analyze.context import Context
from rankscope.analyze.diagnosis import Diagnosis, compact_ranks
from rankscope.analyze.evidence import Evidence
from rankscope.replay._ops import GLOO_DTYPES, OPS, OpSpec, dtype_name, op_spec

WORLD = "0"
"""Name of the world group (torch names the default group ``"0"``)."""


@dataclass(frozen=True)
class Tensor:
    """One tensor a replayed call builds: the recorded shape (maybe scaled down) and dtype."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Step:
    """One call of one rank, as recorded, reduced to what the replay needs."""

    spec: OpSpec
    op: str
    """The op as recorded (probe: torch.distributed function; recorder: the backend's name)."""
    pg: str
    seq: int | None
    """The collective's number on its group (``None`` for point-to-point calls)."""
    p2p_seq: int | None
    tensors: tuple[Tensor, ...] = ()
    peer: int | None = None
    """Original global rank: the root of a rooted collective, the other side of a p2p call."""
    batch: tuple[tuple[str, int, Tensor], ...] = ()
    """batch_isend_irecv: (``isend``/``irecv``, original peer, tensor)."""
    async_op: bool = False
    site: str | None = None
    completed: bool = True
    failed: bool = False
    error: str | None = None
    order: int = 0
    note: str | None = None
    """Why the replay differs from the record here (shown in a comment)."""


@dataclass(frozen=True)
class End:
    """What a rank does after its last recorded call, as the original did."""

    kind: str
    """``blocked`` (its last call never returned), ``failed`` (its last call raised), ``exit``
    (it exited 0), ``raise`` (it raised outside any collective), ``exit_code`` (it exited with
    a code and no traceback), ``signal`` (a signal ended it) or ``linger`` (it stayed alive
    outside any collective, or nothing says what it did)."""
    detail: str | None = None
    code: int | None = None


@dataclass(frozen=True)
class Group:
    """One process group of the original and what it becomes in the replay."""

    name: str
    desc: str | None
    members: tuple[int, ...]
    """Original global ranks."""
    kept: tuple[int, ...] = ()
    """Replay ranks of the members that are kept."""
    replay_name: str | None = None
    """What torch will call it in the replay (``None``: not created, no member kept)."""


@dataclass
class Plan:
    """Everything the script is written from."""

    name: str
    diagnosis: Diagnosis
    source: str
    """Where the calls come from: ``collectives`` (the probe), ``flight_recorder``, or
    ``merged`` (both: collectives torch issued from C++ are the recorder's)."""
    world: list[int]
    """Every rank the evidence knows of."""
    kept: list[int]
    new_rank: dict[int, int]
    groups: dict[str, Group]
    steps: dict[int, list[Step]]
    """Per kept original rank, the calls it replays, in its order."""
    ends: dict[int, End]
    silent: list[int] = field(default_factory=list)
    """Ranks without any record of their calls: not replayed."""
    trimmed: dict[str, int] = field(default_factory=dict)
    """Group -> first collective kept, where a ring buffer lost the earlier ones on some rank."""
    left_out: dict[int, int] = field(default_factory=dict)
    """Per kept original rank: calls left out (before the common start, or with a dropped peer)."""
    scaled: dict[tuple[int, ...], tuple[int, ...]] = field(default_factory=dict)
    scale_down: int | None = None
    dtype_notes: dict[str, str] = field(default_factory=dict)
    sites: bool = False
    """Whether call sites are known (probe events, or flight-recorder frames)."""


# --- the calls -------------------------------------------------------------------------------
def facts_of(run: Any, diagnosis: Diagnosis) -> Context:
    """What the diagnosis was derived from (its ``context``); derived here, the same way, only
    for a diagnosis that does not carry it (one made by hand)."""
    if diagnosis.context is not None:
        return diagnosis.context
    return Context(Evidence(run), straggler_s=1.0)


def source_of(calls: pd.DataFrame) -> str:
    sources = set(calls["source"].astype(str))
    return sources.pop() if len(sources) == 1 else "merged"


def _json_list(text: Any, cache: dict[Any, list[Any]]) -> list[Any]:
    if text is None or text is pd.NA or (isinstance(text, float) and math.isnan(text)):
        return []
    try:
        return cache[text]
    except KeyError:
        pass
    try:
        value = json.loads(str(text))
    except ValueError:
        value = []
    cache[text] = value if isinstance(value, list) else []
    return cache[text]


def _shape(value: Any) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)):
        return ()
    out = []
    for dim in value:
        try:
            out.append(max(0, int(dim)))
        except (TypeError, ValueError):
            out.append(1)
    return tuple(out)


def _chunk(shape: tuple[int, ...], parts: int) -> tuple[int, ...]:
    """The per-peer chunk of a tensor split along its first dimension."""
    if not shape:
        return (1,)
    return (max(1, math.ceil(shape[0] / max(parts, 1))), *shape[1:])


def _tensors(
    spec: OpSpec, op: str, shapes: list[Any], dtypes: list[Any], size: int
) -> tuple[tuple[Tensor, ...], str | None]:
    """Base tensors of a call recorded by the probe (tensors among its arguments, in order)."""
    ts = [Tensor(_shape(s), dtype_name(d)) for s, d in zip(shapes, dtypes, strict=False)]
    ts += [Tensor(_shape(s), "float32") for s in shapes[len(ts) :]]
    family, note = spec.family, spec.note
    if family in ("none", "object") or not ts:
        return ((), note) if family in ("none", "object") else ((Tensor((1,), "float32"),), note)
    if family == "one":
        return (ts[0],), note
    if family == "many":
        return tuple(ts), note
    if family == "gather_in":
        if op == "all_gather" and len(ts) == size + 1:
            return (ts[-1],), note  # (tensor_list, tensor)
        if op == "all_gather_into_tensor" and len(ts) >= 2:
            return (ts[1],), note  # (output, input)
        return (ts[0],), note
    if family == "scatter_out":
        return (ts[0],), note  # (output, inputs): reduce_scatter*, scatter
    if family == "a2a":
        if op == "all_to_all":
            chunks = ts[size : 2 * size] if len(ts) >= 2 * size else ts[:1]
        else:  # all_to_all_single(output, input, ...)
            chunks = [Tensor(_chunk(ts[min(1, len(ts) - 1)].shape, size), ts[0].dtype)]
        return _even(chunks)
    return (ts[0],), note


def _fr_tensors(
    spec: OpSpec,
    inputs: list[Any],
    outputs: list[Any],
    in_dtypes: list[Any],
    out_dtypes: list[Any],
    size: int,
) -> tuple[OpSpec, tuple[Tensor, ...], str | None]:
    """Base tensors of a flight-recorder entry (``input_sizes``, ``output_sizes``)."""
    ins = [Tensor(_shape(s), dtype_name(d)) for s, d in zip(inputs, in_dtypes, strict=False)]
    outs = [Tensor(_shape(s), dtype_name(d)) for s, d in zip(outputs, out_dtypes, strict=False)]
    family, note = spec.family, spec.note
    if family in ("none", "object"):
        return spec, (), note
    if family == "one" and len(ins) > 1 and spec.call == "all_reduce":
        coalesced = OPS["all_reduce_coalesced"]
        note = f"recorded as one all_reduce of {len(ins)} tensors (coalesced)"
        return coalesced, tuple(ins), note
    if family == "many":
        return spec, tuple(ins) or (Tensor((1,), "float32"),), note
    if family == "scatter_out":
        if outs:
            return spec, (outs[0],), note
        if ins:
            return spec, (Tensor(_chunk(ins[0].shape, size), ins[0].dtype),), note
    if family == "a2a":
        chunks = ins if len(ins) > 1 else [Tensor(_chunk(t.shape, size), t.dtype) for t in ins]
        chunks = chunks or [Tensor((1,), "float32")]
        tensors, extra = _even(chunks)
        return spec, tensors, extra or note
    first = ins[0] if ins else (outs[0] if outs else Tensor((1,), "float32"))
    return spec, (first,), note


def _even(chunks: Sequence[Tensor]) -> tuple[tuple[Tensor, ...], str | None]:
    """One chunk shape for all peers: gloo's all_to_all needs equal chunks."""
    if len({c.shape for c in chunks}) <= 1:
        return (chunks[0],), None
    big = max(chunks, key=lambda c: (c.numel, c.shape))
    note = "gloo's all_to_all needs equal chunks: every chunk has the largest recorded shape"
    return (big,), note


# --- what each rank did ----------------------------------------------------------------------
def _values(col: pd.Series) -> list[Any]:
    """A column as Python values, with None for every kind of null."""
    return col.astype(object).where(col.notna(), None).tolist()


def steps_of(
    run: Any,
    calls: pd.DataFrame,
    ranks: Iterable[int],
    members: Mapping[str, Sequence[int]],
    *,
    site_ranks: Iterable[int] | None = None,
) -> dict[int, list[Step]]:
    """The recorded calls of ``ranks``, in each rank's order, as steps. Flight-recorder call
    sites (read from the dumps' frames) are looked up for ``site_ranks`` only (default: all).

    A job repeats a handful of distinct calls: each distinct (op, group, tensors) is worked out
    once, so a 512-rank job with 2000 recorded calls each costs one cheap pass per call."""
    want = set(ranks)
    mine = calls[calls["rank"].isin(list(want))].sort_values(["rank", "order"], kind="stable")
    out: dict[int, list[Step]] = {r: [] for r in sorted(want)}
    if mine.empty:
        return out
    n = len(mine)
    probed = (mine["source"].astype(str) == "collectives").to_numpy()
    raw_peer: list[Any] = [None] * n
    raw_async = [False] * n
    sites = _values(mine["site"].astype("string"))
    described: list[list[Any]] = [[None] * n for _ in range(4)]
    if probed.any():
        raw = run.collectives.loc[mine["row"].to_numpy()[probed], ["peer", "async_op"]]
        for i, peer, flag in zip(
            probed.nonzero()[0], _values(raw["peer"]), raw["async_op"].fillna(False), strict=True
        ):
            raw_peer[i], raw_async[i] = peer, bool(flag)
        for i, shapes, dtypes in zip(
            probed.nonzero()[0],
            _values(mine["shapes"][probed]),
            _values(mine["dtypes"][probed]),
            strict=True,
        ):
            described[0][i], described[1][i] = shapes, dtypes
    if (~probed).any():
        fr_rows = mine[~probed]
        raw = run.flight_recorder.loc[
            fr_rows["row"].to_numpy(),
            ["input_sizes", "output_sizes", "input_dtypes", "output_dtypes"],
        ]
        cols = [_values(raw[c]) for c in raw.columns]
        for k, i in enumerate((~probed).nonzero()[0]):
            for j in range(4):
                described[j][i] = cols[j][k]
        unknown = [i for i in (~probed).nonzero()[0] if sites[i] is None]
        if unknown:
            frames = _frames(run, set(site_ranks) if site_ranks is not None else want)
            if frames is not None:
                found = fr_sites(frames, mine.iloc[unknown], run.flight_recorder)
                for i, site in zip(unknown, _values(found), strict=True):
                    sites[i] = site
    ranks_col = mine["rank"].astype("int64").tolist()
    ops, pgs = _values(mine["op"]), _values(mine["pg"])
    seqs, p2p_seqs, peers = _values(mine["seq"]), _values(mine["p2p_seq"]), _values(mine["peer"])
    done = mine["completed"].fillna(False).astype(bool).tolist()
    failed = mine["ok"].eq(False).fillna(False).astype(bool).tolist()
    errors, orders = _values(mine["error"]), mine["order"].astype("int64").tolist()
    cache: dict[Any, list[Any]] = {}
    made: dict[tuple[Any, ...], tuple[OpSpec, tuple[Tensor, ...], str | None]] = {}
    no_root = "the flight recorder does not record the root: the replay uses the group's first rank"
    for i in range(n):
        op, pg = str(ops[i]), str(pgs[i])
        size = len(members.get(pg, ())) or 1
        what = (bool(probed[i]), op, size, *(d[i] for d in described))
        if what not in made:
            spec = op_spec(op)
            if probed[i]:
                shapes, dtypes = (_json_list(d[i], cache) for d in described[:2])
                tensors, note = _tensors(spec, op, shapes, dtypes, size)
            else:
                inputs, outputs, in_dt, out_dt = (_json_list(d[i], cache) for d in described)
                spec, tensors, note = _fr_tensors(spec, inputs, outputs, in_dt, out_dt, size)
                if spec.root is not None and not spec.p2p:
                    note = _join(note, no_root)
            made[what] = (spec, tensors, note)
        spec, tensors, note = made[what]
        peer = None if peers[i] is None else int(peers[i])
        batch: tuple[tuple[str, int, Tensor], ...] = ()
        if probed[i]:
            if spec.family == "batch":
                shapes, dtypes = (_json_list(d[i], cache) for d in described[:2])
                batch, tensors = _batch(raw_peer[i], tensors, shapes, dtypes), ()
            elif spec.root is not None and peer is None:
                peer = _int(raw_peer[i])
        out[ranks_col[i]].append(
            Step(
                spec=spec,
                op=op,
                pg=pg,
                seq=None if seqs[i] is None else int(seqs[i]),
                p2p_seq=None if p2p_seqs[i] is None else int(p2p_seqs[i]),
                tensors=tensors,
                peer=peer,
                batch=batch,
                async_op=raw_async[i] or spec.call in ("isend", "irecv"),
                site=None if sites[i] is None else str(sites[i]),
                completed=done[i],
                failed=failed[i],
                error=None if errors[i] is None else str(errors[i]),
                order=orders[i],
                note=note,
            )
        )
    return out


def _join(a: str | None, b: str) -> str:
    return b if not a else f"{a}; {b}"


def _int(value: Any) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def _batch(
    peer: Any, tensors: tuple[Tensor, ...], shapes: list[Any], dtypes: list[Any]
) -> tuple[tuple[str, int, Tensor], ...]:
    """``"isend:1,irecv:0"`` (the probe's peer of batch_isend_irecv) with the ops' tensors."""
    out = []
    parts = [] if peer is None or peer is pd.NA else str(peer).strip("[]").split(",")
    for i, part in enumerate(parts):
        kind, _, who = part.strip().strip("'\"").partition(":")
        rank = _int(who)
        if rank is None or kind not in ("isend", "irecv"):
            continue
        shape = _shape(shapes[i]) if i < len(shapes) else (1,)
        dtype = dtype_name(dtypes[i] if i < len(dtypes) else None)
        out.append((kind, rank, Tensor(shape, dtype)))
    return tuple(out)


def _frames(run: Any, ranks: set[int]) -> pd.DataFrame | None:
    """Flight-recorder frames of a few ranks (for call sites), read from their dumps only."""
    try:
        some = getattr(run, "fr_frames_for", None)
        if some is not None:
            return some(ranks)
        frames = run.fr_frames
        return frames[frames["rank"].isin(list(ranks))]
    except Exception:  # sites are comments: a replay without them still runs
        return None


def ends_of(ev: Evidence, steps: Mapping[int, list[Step]]) -> dict[int, End]:
    """How each rank's record ends, from its last call and what the evidence says of its
    process (exit code, exception, last stack)."""
    facts = ev.ranks
    out = {}
    for rank, mine in steps.items():
        f = facts.get(rank)
        last = mine[-1] if mine else None
        code = f.exit_code if f is not None else None
        raised = f.exception if f is not None else None
        if last is not None and last.failed and (not raised or _same(raised, last.error)):
            # It raised inside its last call (a timeout, a peer that went away): a symptom.
            out[rank] = End("failed", last.error or raised)
        elif f is not None and code is not None and not ev.terminated(code):
            if f.exception:
                out[rank] = End("raise", f.exception)
            elif code == 0:
                out[rank] = End("exit", code=0)
            elif code > 0:
                out[rank] = End("exit_code", code=code)
            else:
                out[rank] = End("signal", code=-code)
        elif f is not None and f.exiting:  # past its script: what its end meant to exit with
            meant = f.end_code or 0
            if f.exception:
                out[rank] = End("raise", f.exception)
            else:
                out[rank] = End("exit", code=0) if meant == 0 else End("exit_code", code=meant)
        elif last is not None and not last.completed:
            out[rank] = End("blocked")
        elif f is not None and f.exception:
            out[rank] = End("raise", f.exception)
        elif last is None:
            out[rank] = End("linger", "no record of any call")
        else:
            out[rank] = End("linger", "its last recorded call had completed")
    return out


def _same(a: str, b: str | None) -> bool:
    """Two error texts of the same exception (either may be cut short)."""
    a, b = a.strip()[:80], (b or "").strip()[:80]
    return bool(b) and (a.startswith(b) or b.startswith(a))


# --- which ranks -----------------------------------------------------------------------------
def choose_ranks(
    world: Sequence[int],
    diagnosis: Diagnosis,
    waits: Mapping[int, set[int]],
    signature: Mapping[int, Any],
    limit: int | None,
) -> list[int]:
    """The ranks to keep: all of them, or at most ``limit``: the culprits, enough of the ranks
    that made the divergent call to outvote them, whoever keeps a kept rank waiting (the rank a
    p2p call waits for, a member that never joined its collective), then more ranks, one of each
    kind first (by what they were doing at the end)."""
    world = sorted(world)
    if limit is None or limit >= len(world):
        return world
    culprits = [r for r in diagnosis.culprit_ranks if r in world]
    c = diagnosis.collective
    made = []
    if c is not None:
        made = [r for r, op in sorted(c.op_by_rank.items()) if op and r not in culprits]
    waiting = [r for r in diagnosis.waiting_ranks if r in world and r not in culprits]
    prefer = set(culprits)

    def closure(seed: Iterable[int], chosen: set[int]) -> set[int]:
        added = set(seed) - chosen
        todo = list(added)
        while todo:
            r = todo.pop()
            wait = {w for w in waits.get(r, ()) if w in world}
            if not wait or wait & (added | chosen):
                continue
            pick = min(wait, key=lambda q: (q not in prefer, q))
            added.add(pick)
            todo.append(pick)
        return added

    # Ranks that made the divergent call: one shows that the culprits never made it; against
    # culprits that made another call, the usual call needs the majority.
    mismatch = c is not None and any(c.op_by_rank.get(r) for r in culprits)
    support = 0 if not made else (len(culprits) + 1 if mismatch else 1)
    chosen = closure(culprits, set())
    for r in round_robin(made, signature):
        if sum(1 for q in chosen if q in made) >= support:
            break
        chosen |= closure([r], chosen)
    if len(chosen) > limit:
        need = compact_ranks(chosen)
        raise ValueError(
            f"--ranks {limit} is too few: reproducing the divergence needs at least "
            f"{len(chosen)} ranks (original ranks {need}: the culprits, ranks that made the "
            f"divergent call, and the ranks they wait for); pass --ranks {len(chosen)} or more"
        )
    rest = [r for r in world if r not in made and r not in waiting and r not in culprits]
    for r in [
        *round_robin(made, signature),
        *round_robin(waiting, signature),
        *round_robin(rest, signature),
    ]:
        if len(chosen) >= limit:
            break
        if r in chosen:
            continue
        unit = closure([r], chosen)
        if len(chosen) + len(unit) <= limit:
            chosen |= unit
    return sorted(chosen)


def round_robin(ranks: Sequence[int], signature: Mapping[int, Any]) -> list[int]:
    """``ranks`` reordered to take one of each signature first, then a second of each, ..."""
    kinds: dict[Any, list[int]] = {}
    for r in ranks:
        kinds.setdefault(signature.get(r), []).append(r)
    out = []
    queues = list(kinds.values())
    depth = 0
    while len(out) < len(ranks):
        for q in queues:
            if depth < len(q):
                out.append(q[depth])
        depth += 1
    return out


def signatures(calls: pd.DataFrame) -> dict[int, Any]:
    """What each rank was doing at the end: its last call's group, position, op and key, and
    whether it had completed."""
    last = align.last_calls(calls)
    return {
        int(r): (str(row["pg"]), row["seq"], str(row["op"]), int(row["key"]), row["completed"])
        for r, row in last.iterrows()
    }


# --- shrinking and scaling -------------------------------------------------------------------
def trim(
    steps: dict[int, list[Step]], kept: Sequence[int], new_rank: Mapping[int, int]
) -> tuple[dict[int, list[Step]], dict[str, int], dict[int, int]]:
    """Calls every kept rank can replay: on each group from the latest first collective over
    the ranks (a ring buffer forgets old calls), and p2p calls whose peer is kept."""
    first: dict[str, int] = {}
    for rank in kept:
        seen: dict[str, int] = {}
        for s in steps[rank]:
            if s.seq is not None and s.pg not in seen:
                seen[s.pg] = s.seq
        for pg, idx in seen.items():
            first[pg] = max(first.get(pg, idx), idx)
    trimmed = {pg: idx for pg, idx in first.items() if idx > 1}
    out: dict[int, list[Step]] = {}
    left: dict[int, int] = {}
    for rank in kept:
        mine = []
        started = not trimmed
        for s in steps[rank]:
            if s.seq is not None:
                if s.seq < first.get(s.pg, 1):
                    left[rank] = left.get(rank, 0) + 1
                    continue
                started = True
            elif not started:  # a p2p call from before the common start
                left[rank] = left.get(rank, 0) + 1
                continue
            kept_step = _keep_peers(s, new_rank)
            if kept_step is None:
                left[rank] = left.get(rank, 0) + 1
                continue
            mine.append(kept_step)
        out[rank] = mine
    return out, trimmed, left


def _keep_peers(s: Step, new_rank: Mapping[int, int]) -> Step | None:
    if s.spec.family == "batch":
        ops = tuple(b for b in s.batch if b[1] in new_rank)
        if not ops:
            return None
        if len(ops) < len(s.batch):
            return replace(s, batch=ops, note=_join(s.note, "ops with dropped peers left out"))
        return s
    if s.spec.p2p and s.peer is not None and s.peer not in new_rank:
        return None
    return s


def scale(
    steps: dict[int, list[Step]], cap: int
) -> tuple[dict[int, list[Step]], dict[tuple[int, ...], tuple[int, ...]]]:
    """Every tensor capped at ``cap`` elements; shapes that differed still differ (a shape
    mismatch survives), so each original shape maps to its own scaled shape."""
    shapes = {t.shape for mine in steps.values() for s in mine for t in _tensors_of(s)}
    big = sorted((s for s in shapes if math.prod(s) > cap), key=lambda s: (-math.prod(s), s))
    used = {s for s in shapes if math.prod(s) <= cap}
    mapping: dict[tuple[int, ...], tuple[int, ...]] = {}
    # One factor for all: the largest tensor comes down to the cap, the others in proportion.
    factor = math.ceil(math.prod(big[0]) / cap) if big else 1
    for shape in big:
        dims = list(shape)
        i = max(range(len(dims)), key=lambda k: dims[k])
        dims[i] = max(1, math.ceil(dims[i] / factor))
        new: tuple[int, ...] | None = _shrunk(tuple(dims), cap)
        while new in used:
            new = _smaller(new)  # type: ignore[arg-type]
            if new is None:  # nothing smaller is free: share a shape (reported in the header)
                new = _shrunk(tuple(dims), cap)
                break
        used.add(new)
        mapping[shape] = new

    def fix(t: Tensor) -> Tensor:
        return Tensor(mapping.get(t.shape, t.shape), t.dtype)

    if not mapping:
        return steps, mapping
    return _retensor(steps, fix, lambda s: any(t.shape in mapping for t in _tensors_of(s))), mapping


def _shrunk(shape: tuple[int, ...], cap: int) -> tuple[int, ...]:
    """``shape`` with its largest dimensions cut until it holds at most ``cap`` elements."""
    dims = list(shape)
    while math.prod(dims) > cap:
        i = max(range(len(dims)), key=lambda k: dims[k])
        rest = math.prod(dims) // dims[i]
        dims[i] = max(1, cap // rest) if rest <= cap else 1
    return tuple(dims)


def _smaller(shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The next smaller shape: the last dimension above 1 less one."""
    dims = list(shape)
    for i in reversed(range(len(dims))):
        if dims[i] > 1:
            dims[i] -= 1
            return tuple(dims)
    return None


def _retensor(steps: dict[int, list[Step]], fix: Any, touched: Any) -> dict[int, list[Step]]:
    """``steps`` with ``fix`` applied to the tensors of the steps ``touched`` says it changes."""
    out = {}
    for r, mine in steps.items():
        new = []
        for s in mine:
            if touched(s):
                s = replace(
                    s,
                    tensors=tuple(fix(t) for t in s.tensors),
                    batch=tuple((k, p, fix(t)) for k, p, t in s.batch),
                )
            new.append(s)
        out[r] = new
    return out


def _tensors_of(s: Step) -> Iterable[Tensor]:
    yield from s.tensors
    for _, _, t in s.batch:
        yield t


def gloo_dtypes(steps: dict[int, list[Step]]) -> tuple[dict[int, list[Step]], dict[str, str]]:
    """dtypes gloo cannot communicate replaced by one of as many bytes per element."""
    seen = {t.dtype for mine in steps.values() for s in mine for t in _tensors_of(s)}
    notes = {d: GLOO_DTYPES[d] for d in seen if d in GLOO_DTYPES}
    if not notes:
        return steps, {}

    def fix(t: Tensor) -> Tensor:
        return Tensor(t.shape, notes.get(t.dtype, t.dtype))

    return _retensor(steps, fix, lambda s: any(t.dtype in notes for t in _tensors_of(s))), notes


def groups_of(
    calls: pd.DataFrame, members: Mapping[str, Sequence[int]], new_rank: Mapping[int, int]
) -> dict[str, Group]:
    """Every group the calls use, in the order torch created them, with its kept members; the
    replay creates those with a kept member, in the same order, and torch names them 1, 2, ..."""
    pg = calls["pg"].astype(str)
    desc = calls["pg_desc"].astype(object).where(calls["pg_desc"].notna(), None)
    known = pd.DataFrame({"pg": pg, "desc": desc})
    first_desc = known.dropna(subset=["desc"]).drop_duplicates("pg").set_index("pg")["desc"]
    descs: dict[str, str | None] = {name: None for name in pg.unique().tolist()}
    descs.update({str(k): str(v) for k, v in first_desc.items()})
    starts = calls["t_start_s"].astype("float64").groupby(pg.to_numpy()).min()
    firsts = {str(k): float(v) for k, v in starts.items() if not pd.isna(v)}

    def order(pg: str) -> tuple[int, float, str]:
        if pg.isdigit():
            return (0, float(int(pg)), pg)
        return (1, firsts.get(pg, math.inf), pg)

    out = {}
    count = 0
    for pg in sorted(descs, key=order):
        ranks = tuple(sorted(members.get(pg, ())))
        kept = tuple(sorted(new_rank[r] for r in ranks if r in new_rank))
        if pg == WORLD:
            name = WORLD
        elif kept:
            count += 1
            name = str(count)
        else:
            name = None
        out[pg] = Group(name=pg, desc=descs[pg], members=ranks, kept=kept, replay_name=name)
    return out
