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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
