"""Who waits for whom, and when two ranks' calls at one place are not the same call: the pure
core that the diagnosis (:mod:`rankscope.analyze`, over tables) and the live stall prover
(:mod:`rankscope.launch`, over the ranks' live records) both read, on plain data.

* :func:`differs`: the first fact in which two calls made at the same ``(group, seq)`` differ
  (op, shapes, dtypes, root), or None when they are the same collective. ``analyze.calls``
  builds its vectorised call key from the same rule (:data:`UNEVEN_OPS`).
* :func:`paired`: point-to-point calls that face each other (a send and a receive between the
  same two ranks) and so would complete: neither waits for the other.
* :func:`walk`: given the ranks each blocked rank waits for, the *roots* (ranks waited on that
  wait for nobody) and the *cycles* (terminal groups of blocked ranks that wait only for each
  other). Ranks that wait the same way share one set object, so the graph is walked set by
  set, not rank by rank (a 16k-rank job with half its ranks gone is a handful of sets).
* :func:`prove`: whether the live state of the ranks (:class:`RankState`, built by the
  watchdog's tracker from each rank's events) proves that no rank can progress, and by which
  fact (a :class:`Proof`): the stall watchdog calls such a stall at once, whatever its timeout.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

#: Collectives whose tensors differ between ranks by design (the root's list, uneven splits):
#: their shapes and dtypes are no part of what makes two calls the same call.
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

SENDS, RECVS = frozenset({"send", "isend"}), frozenset({"recv", "irecv"})


@dataclass(frozen=True, kw_only=True, slots=True)
class Call:
    """What makes a collective the call it is: its op, its tensors, its root (src or dst; None
    for an op without one, or where the source did not record it)."""

    op: str
    shapes: Any = None
    dtypes: Any = None
    root: int | None = None


def differs(a: Call, b: Call) -> str | None:
    """``op``, ``shapes``, ``dtypes`` or ``root``: the first fact in which two calls at the same
    place of a group's sequence differ, or None when they are the same call. Shapes and dtypes
    count only for ops that take the same tensors on every rank (not :data:`UNEVEN_OPS`); a
    root counts where both calls recorded one."""
    if a.op != b.op:
        return "op"
    if a.op not in UNEVEN_OPS:
        if a.shapes != b.shapes:
            return "shapes"
        if a.dtypes != b.dtypes:
            return "dtypes"
    if a.root is not None and b.root is not None and a.root != b.root:
        return "root"
    return None


def paired(p2p: Mapping[int, tuple[str, int]]) -> set[int]:
    """Of the ranks blocked in a point-to-point call (``rank -> (op, peer)``), those whose peer
    is blocked in the matching call towards them (a send facing a receive): the pair would
    complete, so neither waits for the other (something below Python holds them)."""
    out = set()
    for rank, (op, peer) in p2p.items():
        other = p2p.get(peer)
        if other is None or other[1] != rank:
            continue
        if (op in SENDS and other[0] in RECVS) or (op in RECVS and other[0] in SENDS):
            out.add(rank)
    return out


def walk(
    waits_for: Mapping[int, frozenset[int]],
) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """``(roots, cycles)`` of the wait-for graph ``rank -> ranks it waits for`` (blocked ranks
    only): roots are ranks waited on that wait for nobody (not blocked); cycles are terminal
    groups of blocked ranks that wait only for each other, with nothing outside to wait on.
    Computed over the distinct set objects, not rank by rank."""
    waiting = set(waits_for)
    groups: dict[int, tuple[frozenset[int], set[int]]] = {}
    for rank, targets in waits_for.items():
        groups.setdefault(id(targets), (targets, set()))[1].add(rank)
    classes = list(groups.values())
    roots = sorted(set().union(*(s - waiting for s, _ in classes)) if classes else set())
    # Class graph: C -> D when a rank of D is one that C waits for.
    n = len(classes)
    edges = [[j for j in range(n) if classes[i][0] & classes[j][1]] for i in range(n)]
    has_sink = [bool(s - waiting) for s, _ in classes]
    cycles = []
    for component in terminal_components(edges):
        if any(has_sink[i] for i in component):
            continue
        waited = set().union(*(classes[i][0] for i in component))
        inside = set().union(*(classes[i][1] for i in component))
        ranks = tuple(sorted(waited & inside))
        if ranks:
            cycles.append(ranks)
    return tuple(roots), tuple(cycles)


def terminal_components(edges: list[list[int]]) -> list[list[int]]:
    """Strongly connected components with no edge leaving them (Tarjan's, iterative)."""
    n = len(edges)
    index = [-1] * n
    low = [0] * n
    on_stack = [False] * n
    stack: list[int] = []
    comp_of = [-1] * n
    comps: list[list[int]] = []
    counter = 0
    for start in range(n):
        if index[start] != -1:
            continue
        work = [(start, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack[v] = True
            recurse = False
            for k in range(i, len(edges[v])):
                w = edges[v][k]
                if index[w] == -1:
                    work.append((v, k + 1))
                    work.append((w, 0))
                    recurse = True
                    break
                if on_stack[w]:
                    low[v] = min(low[v], index[w])
            if recurse:
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    comp_of[w] = len(comps)
                    comp.append(w)
                    if w == v:
                        break
                comps.append(comp)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return [c for i, c in enumerate(comps) if all(comp_of[w] == i for v in c for w in edges[v])]


# --- the prover: what the live state proves --------------------------------------------------
@dataclass(frozen=True, slots=True)
class CallNumber:
    """A number in a proof that counts a rank's collectives on a group as the prover counts
    them: ``nth``, the rank's n-th call there; ``made``, how many it made there."""

    rank: int
    pg: str
    n: int
    kind: Literal["nth", "made"] = "nth"


@dataclass(frozen=True, slots=True)
class Proof:
    """A fact that proves a hang, as the parts of its sentence: words, and the numbers of calls
    (:class:`CallNumber`) in the prover's numbering, the probe's (the Python calls it saw;
    ``numbering="recorder"``: the flight recorder's, every collective of the group). A reader
    that numbers a group's calls otherwise (the diagnosis counts those torch makes from C++,
    DDP's gradient all-reduce) writes the same fact in its own numbers (:meth:`text`)."""

    parts: tuple[str | CallNumber, ...]
    numbering: Literal["probe", "recorder"] = "probe"

    def text(self, number: Callable[[CallNumber], int | None] | None = None) -> str:
        """The sentence; ``number`` gives a probe-numbered call its number in another
        numbering (None: the prover's own is kept)."""
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
                continue
            n = number(part) if number is not None and self.numbering == "probe" else None
            out.append(str(part.n if n is None else n))
        return "".join(out)

    def __str__(self) -> str:
        return self.text()

    def by_recorder(self) -> Proof:
        """The same fact, proved on the backend's state: numbered as its flight recorder
        numbers the group's calls, and saying so."""
        return Proof((*self.parts, " (by the flight recorder's numbering)"), "recorder")

    def to_json(self) -> dict[str, Any]:
        return {
            "numbering": self.numbering,
            "parts": [p if isinstance(p, str) else [p.rank, p.pg, p.n, p.kind] for p in self.parts],
        }

    @classmethod
    def from_json(cls, data: Any) -> Proof | None:
        """The proof a run.json holds, or None where it holds none or one not in this form
        (an older run, a file edited by hand)."""
        if not isinstance(data, dict) or data.get("numbering") not in ("probe", "recorder"):
            return None
        parts: list[str | CallNumber] = []
        for p in data.get("parts") or ():
            if isinstance(p, str):
                parts.append(p)
            elif (
                isinstance(p, list)
                and len(p) == 4
                and all(type(x) is int for x in (p[0], p[2]))
                and isinstance(p[1], str)
                and p[3] in ("nth", "made")
            ):
                parts.append(CallNumber(p[0], p[1], p[2], p[3]))
            else:
                return None
        return cls(tuple(parts), data["numbering"]) if parts else None


@dataclass(frozen=True, kw_only=True, slots=True)
class RankState:
    """One rank as the prover reads it, from a prefix of its events (the ranks' prefixes end at
    different moments: every rule below holds whichever moment each one ends at).

    ``calls`` holds its latest collectives, ``(group, seq) -> (op, shapes, dtypes, root)``;
    ``called`` the number of the last collective it called on each group."""

    rank: int
    members: Mapping[str, Sequence[int]]
    """Per group, its ranks (as this rank's calls recorded them)."""
    called: Mapping[str, int]
    calls: Mapping[tuple[str, int], tuple[Any, ...]]
    pending: tuple[tuple[str, int], ...] = ()
    """``(group, seq)`` of its collectives the backend has not completed (a blocking call
    inside, an async call's Work not completed)."""
    blocked: tuple[str, int] | None = None
    """The collective its one calling thread is inside: it makes no call until that returns."""
    receiving: tuple[int, int] | None = None
    """``(peer, n)``: its one calling thread is inside its n-th receive from ``peer``."""
    sent: Mapping[int, int] | None = None
    """Sends it called per peer; None where that count is not known (a batched or any-source
    point-to-point call)."""
    exited: int | None = None
    """Its exit code 0 when it ended cleanly (it calls nothing again); None while it runs or
    when it failed (torchrun ends a job whose rank failed: that is its answer, not a hang)."""
    cell: tuple[int | None, int | None] | None = None
    """In a cell session (:mod:`rankscope.cells`): ``(cell, run)`` of the cell it runs now, or
    of the one it finished last where ``cell_finished``."""
    cell_finished: bool = False
    """It finished ``cell`` and runs no cell now, and the cell left no thread of its own running
    (which could still make calls)."""


def prove(ranks: Mapping[int, RankState]) -> Proof | None:
    """The fact that proves that no rank waiting in a call can progress, or None.

    Facts that cannot change: two calls at the same place of a group's sequence that are not
    the same call (:func:`differs`; the other may be in flight or done); a rank waiting in a
    collective that a member ended before calling, or in a receive whose peer ended before
    sending it; a cycle of ranks each inside a blocking call that waits for the next
    (:func:`walk`), where "waits for" means the next has not made the call (a collective it has
    not called, a message it has not sent). A rank one call behind, ranks catching up, a rank
    outside the collectives (working or not) prove nothing: the rank waited for may still come.
    """
    cells: dict[tuple[str, int], list[int]] = {}
    for rank, st in ranks.items():
        for cell in st.pending:
            cells.setdefault(cell, []).append(rank)
    behind: dict[tuple[str, int], frozenset[int]] = {}
    for cell, waiting in sorted(cells.items()):
        fact = (
            _differ(ranks, cell, waiting)
            or _ended(ranks, cell, waiting)
            or _finished_cell(ranks, cell, waiting)
        )
        if fact:
            return fact
    for rank, st in sorted(ranks.items()):
        if st.receiving is not None:
            peer, n = st.receiving
            other = ranks.get(peer)
            if (
                other is not None
                and other.exited is not None
                and other.sent is not None
                and other.sent.get(rank, 0) < n
            ):
                return Proof(
                    (
                        f"rank {peer} ended (exit code {other.exited}) having sent rank {rank} "
                        f"{other.sent.get(rank, 0)} message(s); rank {rank} waits in its "
                        f"receive number {n} from it",
                    )
                )
    waits: dict[int, frozenset[int]] = {}
    for rank, st in ranks.items():
        if st.blocked is not None:
            pg, seq = st.blocked
            members = st.members.get(pg)
            if not members:
                continue
            key = st.blocked
            if key not in behind:
                behind[key] = frozenset(
                    m for m in members if m not in ranks or ranks[m].called.get(pg, 0) < seq
                )
            waits[rank] = behind[key]  # not itself: it called seq; one set shared by all
        elif st.receiving is not None:
            peer, n = st.receiving
            other = ranks.get(peer)
            if other is None or other.sent is None:
                continue
            waits[rank] = frozenset([peer]) if other.sent.get(rank, 0) < n else frozenset()
    _, cycles = walk(waits)
    if not cycles:
        return None
    cycle = cycles[0]
    parts: list[str | CallNumber] = [
        f"ranks {', '.join(map(str, cycle))} each wait inside a call for another: "
    ]
    for i, r in enumerate(cycle):
        parts += ["; " if i else "", f"rank {r} ", *_waiting_parts(ranks[r], waits[r] & set(cycle))]
    return Proof(tuple(p for p in parts if p != ""))


def _members(ranks: Mapping[int, RankState], waiting: list[int], pg: str) -> Sequence[int]:
    for rank in waiting:
        members = ranks[rank].members.get(pg)
        if members:
            return members
    return ()


def _differ(
    ranks: Mapping[int, RankState], cell: tuple[str, int], waiting: list[int]
) -> Proof | None:
    """Two members' calls at ``(pg, seq)`` that are not the same call, one of them waiting:
    every member's call is compared with one waiting rank's (any pair that differs has one
    side that differs from it), so the work grows with the members, not their square."""
    pg, seq = cell
    rank, mine = next(
        ((r, facts) for r in sorted(waiting) if (facts := ranks[r].calls.get(cell)) is not None),
        (None, None),
    )
    if mine is None:
        return None
    for other in _members(ranks, waiting, pg):
        st = ranks.get(other)
        theirs = st.calls.get(cell) if st is not None else None
        if theirs is None or theirs == mine:
            continue
        a, b = _as_call(mine), _as_call(theirs)
        what = differs(a, b)
        if what is not None:
            return Proof(
                (
                    f"rank {rank} waits in {_fact(a, what)} and rank {other} called "
                    f"{_fact(b, what)} as collective #",
                    CallNumber(rank, pg, seq),
                    f" of group {pg}: not the same call",
                )
            )
    return None


def _as_call(facts: tuple[Any, ...]) -> Call:
    return Call(op=facts[0], shapes=facts[1], dtypes=facts[2], root=facts[3])


def _fact(call: Call, what: str) -> str:
    """``all_reduce``, ``all_reduce of shapes [[4]]``, ``broadcast from root 1``."""
    if what == "op":
        return call.op
    if what == "root":
        return f"{call.op} with root {call.root}"
    return f"{call.op} of {what} {getattr(call, what)}"


def _ended(
    ranks: Mapping[int, RankState], cell: tuple[str, int], waiting: list[int]
) -> Proof | None:
    """A member that ended before calling ``cell`` (group, seq), which a rank waits in."""
    pg, seq = cell
    for m in _members(ranks, waiting, pg):
        st = ranks.get(m)
        if st is None or st.exited is None or st.called.get(pg, 0) >= seq:
            continue
        rank = min(waiting)
        facts = ranks[rank].calls.get((pg, seq))
        op = facts[0] if facts else "a collective"
        return Proof(
            (
                f"rank {m} ended (exit code {st.exited}) after ",
                CallNumber(m, pg, st.called.get(pg, 0), "made"),
                f" call(s) on group {pg}; rank {rank} waits in {op}, call #",
                CallNumber(rank, pg, seq),
                f" of group {pg}",
            )
        )
    return None


def _finished_cell(
    ranks: Mapping[int, RankState], cell: tuple[str, int], waiting: list[int]
) -> Proof | None:
    """In a cell session, a member that finished the notebook cell in which ranks wait in the
    call ``cell`` (group, seq), without calling it.

    The proof is per cell: a rank blocked in a call while it runs cell N made that call in
    cell N, and a member that finished that same run of cell N, runs no cell since and left no
    thread of the cell running, made every call cell N makes on it; the call is not among
    them, so cell N cannot end on the ranks that wait. A member still running the cell, one
    that has started a later cell (which could still make the call), or whose cell left a
    thread running proves nothing."""
    pg, seq = cell
    inside = sorted(
        r
        for r in waiting
        if ranks[r].blocked == cell and ranks[r].cell is not None and None not in ranks[r].cell
    )
    if not inside:
        return None
    at = ranks[inside[0]].cell
    held = [r for r in inside if ranks[r].cell == at]
    for m in _members(ranks, held, pg):
        st = ranks.get(m)
        if st is None or not st.cell_finished or st.cell != at or st.called.get(pg, 0) >= seq:
            continue
        facts = ranks[held[0]].calls.get(cell)
        op = facts[0] if facts else "a collective"
        who = ("rank " if len(held) == 1 else "ranks ") + ", ".join(map(str, held))
        return Proof(
            (
                f"rank {m} finished cell [{at[0]}] without calling {op} #",  # type: ignore[index]
                CallNumber(held[0], pg, seq),
                f" of group {pg} that {who} wait{'s' if len(held) == 1 else ''} in",
            )
        )
    return None


def _waiting_parts(st: RankState, next_ranks: set[int]) -> tuple[str | CallNumber, ...]:
    late = ", ".join(map(str, sorted(next_ranks)))
    if st.blocked is not None:
        pg, seq = st.blocked
        facts = st.calls.get((pg, seq))
        op = facts[0] if facts else "a collective"
        return (
            f"in {op} (group {pg} #",
            CallNumber(st.rank, pg, seq),
            f"), not called by rank {late}",
        )
    assert st.receiving is not None
    return (f"in a receive from rank {st.receiving[0]}, not sent by it",)
