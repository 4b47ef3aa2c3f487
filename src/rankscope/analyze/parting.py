"""The line that made the ranks part: the control-flow decision in the source that sent one side
another way, and the values that decided it.

Two ranks' stacks (outermost frame first) share their outer frames down to one function, where
they stand at different lines. That function's syntax tree (read with :mod:`ast` from the
source the frames name) says what separates the two lines:

- **two arms of one statement**: one side in an ``if``'s body, the other in its ``else`` (or
  an ``elif``, an ``except``, a ``case``): the statement is the decision;
- **two statements of one block**: one side is at the earlier statement, one at the later.
  Either the earlier side is still inside something the later one went through (a loop it has
  not left: the later side *left the loop*; its ``break`` or ``return``, where the loop has
  one, is the decision), or the earlier side is already in the next pass of an enclosing loop
  and the later side took a branch the earlier one did not (the innermost ``if`` on the later
  side's path, through the functions it called, is the decision).

Library frames count like the user's (a helper of the user's or a library's that decides);
frames of the machinery (the interpreter's start-up, rankscope's bootstrap, the body of
``torch.distributed``'s collectives) are left out. The values that decided it are the simple
names the decision reads (its condition, the loop's iterable), as the probe captured them with
the stacks (``values`` table: numbers, strings, booleans and None only); a name assigned from an
environment variable (``is_main = int(os.environ["LOCAL_RANK"]) == 0``) is traced to it.

Everything here is a pure function of the stacks and values tables and the source files; where
the source cannot be read or the paths do not part, the answer is None with the reason why.
"""

from __future__ import annotations

import ast
import builtins
import functools
import linecache
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from rankscope.analyze.activity import thread_frames
from rankscope.analyze.diagnosis import compact_ranks, who_of
from rankscope.collect import is_user_file, short_site
from rankscope.rundir import library_of, without_machinery

#: A frame: (file, function, line).
Frame = tuple[str, str, int]

#: Environment variables whose value differs by rank, and the recipe a decision on them is.
RANK_ENV = {"LOCAL_RANK": "D3", "RANK": None, "GROUP_RANK": "D3", "NODE_RANK": "D3"}
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_TRIES = (ast.Try,) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())
_BRANCHES = (ast.If, ast.Match, *_TRIES)


@dataclass(frozen=True, kw_only=True)
class Parting:
    """Where one side of the ranks went another way than the other."""

    site: str
    """``train.py:9``: the decision's line."""
    source: str
    """Its text, as written: ``if is_main:``, ``for x in shard:``, ``if loss < tol: break``."""
    kind: str
    """``if``, ``elif``, ``else``, ``except``, ``case``, ``for``, ``while``, ``break`` or
    ``return``."""
    ranks_in: list[int]
    """The side that took it: entered the branch, or is still in the loop."""
    ranks_out: list[int]
    """The side that did not: skipped the branch, or left the loop."""
    into: str
    """Where the side that took it went: ``save_checkpoint → barrier (train.py:11)``."""
    left_loop: bool = False
    """``ranks_out`` left a loop that ``ranks_in`` are still in."""
    arms: bool = False
    """Both sides are in arms of the one statement (``if``/``else``, ``try``/``except``): they
    took alternatives, rather than one side a branch the other passed by."""
    assigned: bool = False
    """The branch set a value that a call on both sides' path reads (the peer or root it
    names: :func:`argument_origin`); the call itself is no branch's."""
    values: dict[str, dict[int, Any]] = field(default_factory=dict)
    """Each name the decision reads -> its value on each rank whose capture has it."""
    env: dict[str, str] = field(default_factory=dict)
    """Names whose value comes from an environment variable -> the variable."""

    @property
    def recipe(self) -> str | None:
        """The recipe a decision on a per-node environment variable belongs to (D3)."""
        return next((RANK_ENV[v] for v in self.env.values() if RANK_ENV.get(v)), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "site": self.site,
            "source": self.source,
            "kind": self.kind,
            "ranks_in": list(self.ranks_in),
            "ranks_out": list(self.ranks_out),
            "into": self.into,
            "left_loop": self.left_loop,
            "arms": self.arms,
            "values": {
                n: {str(r): v for r, v in sorted(by.items())} for n, by in self.values.items()
            },
            "env": dict(self.env),
            "text": self.text(),
        }

    def text(self) -> str:
        """The parting line in a sentence, then the values.

        ``ranks 0, 2 took the branch at train.py:9 "if is_main:" into save_checkpoint →
        barrier (train.py:11); ranks 1, 3 did not``."""
        inn, out = who_of(self.ranks_in), who_of(self.ranks_out)
        here = f'at {self.site} "{self.source}"'
        if self.kind in _LOOP_KINDS:
            text = f"{inn} stayed in the loop {here} ({self.into}); {out} left it"
        elif self.kind in ("break", "return"):
            text = f"{inn} left the loop {here}, then {self.into}; {out} stayed in it"
        elif self.kind in ("else", "except"):
            text = f"{inn} took the {self.kind} branch {here} into {self.into}; {out} did not"
        else:
            text = f"{inn} took the branch {here} into {self.into}; {out} did not"
        said = self.said_values()
        return text + (f" ({said})" if said else "")

    def said_values(self) -> str:
        """``is_main = True on ranks 0, 2 (from LOCAL_RANK), False on 1, 3``."""
        parts = []
        for name, by in self.values.items():
            origin = f" (from {self.env[name]})" if name in self.env else ""
            if len(by) > 1 and all(value == rank for rank, value in by.items()):
                parts.append(f"{name} = each rank's own number{origin}")
                continue
            alike: dict[str, list[int]] = {}
            for rank, value in sorted(by.items()):
                alike.setdefault(repr(value), []).append(rank)
            # the outliers first; a few values, then how many more (16k ranks, 16k values)
            ordered = sorted(alike.items(), key=lambda kv: len(kv[1]))
            sides = [
                f"{value} on {'rank' if len(r) == 1 else 'ranks'} {compact_ranks(r)}"
                for value, r in ordered[:MAX_SAID]
            ]
            more = len(ordered) - MAX_SAID
            sides += [f"{more} other values"] if more > 0 else []
            parts.append(f"{name} = " + ", ".join(sides) + origin)
        for name, var in self.env.items():
            if name not in self.values:
                parts.append(f"{name} comes from {var}")
        return "; ".join(parts)


_LOOP_KINDS = ("for", "while")
#: Distinct values of one name said in words; the rest are counted.
MAX_SAID = 4


def rank_path(stacks: pd.DataFrame, rank: int, *, thread: str | None = None) -> list[Frame] | None:
    """The frames of ``rank``'s thread (``thread``, else its main thread) in its latest capture,
    outermost first, without the machinery; None without stacks."""
    frames = thread_frames(stacks, rank, thread)
    if frames is None:
        return None
    path = [
        (str(file), str(func), int(line))
        for file, func, line in zip(frames["file"], frames["func"], frames["line"], strict=True)
        if not pd.isna(file) and not pd.isna(line)
    ]
    return without_machinery(path[::-1])


def find_parting(
    culprits: list[int],
    others: list[int],
    paths: dict[int, list[Frame]],
    values: pd.DataFrame | None = None,
    *,
    same_pass: bool = False,
    diverged: bool = False,
) -> tuple[Parting | None, str]:
    """The decision that separates ``culprits`` from ``others``, read from the paths (rank ->
    frames, outermost first) of one rank of each side (the lowest that has one), and why there
    is none when there is none (``(None, reason)``). ``same_pass``: those two ranks wait at the
    same call of one group; ``diverged``: the paths are those of the first call where the
    sides part (see :func:`_decide`)."""
    c_rank = next((r for r in sorted(culprits) if paths.get(r)), None)
    o_rank = next((r for r in sorted(others) if paths.get(r)), None)
    if c_rank is None or o_rank is None:
        which = "culprits" if c_rank is None else "other ranks"
        return None, f"no stacks of the {which} were captured"
    found = _decide_user_first(paths[c_rank], paths[o_rank], same_pass=same_pass, diverged=diverged)
    if isinstance(found, str):
        return None, found
    decision, culprit_in, arms = found
    inn, out = (culprits, others) if culprit_in else (others, culprits)
    left = decision.kind in (*_LOOP_KINDS, "break", "return")
    return _parting(decision, inn, out, values, left_loop=left, arms=arms), ""


def _parting(
    d: _Decision, inn: list[int], out: list[int], values: pd.DataFrame | None, **more: Any
) -> Parting:
    """The :class:`Parting` of decision ``d`` taken by ``inn`` and not by ``out``, with the
    values its names had on those ranks and the environment variables they come from."""
    ranks = sorted({*inn, *out})
    return Parting(
        site=short_site(d.file, d.line),
        source=d.source,
        kind=d.kind,
        ranks_in=sorted(inn),
        ranks_out=sorted(out),
        into=d.into,
        values=_values_of(values, d, d.names, ranks) if values is not None else {},
        env={n: v for n in d.names if (v := env_origin(d.file, n)) is not None},
        **more,
    )


def _branch_kind(file: str, branch: ast.If, arm: str) -> str:
    """``if``, ``elif`` or ``else``: which part of ``branch`` its ``arm`` is."""
    return "else" if arm == "else" else ("elif" if _is_elif(file, branch) else "if")


@dataclass(frozen=True)
class _Decision:
    file: str
    func: str
    line: int
    source: str
    kind: str
    into: str
    names: list[str]


def _decide_user_first(
    c: list[Frame], o: list[Frame], *, same_pass: bool = False, diverged: bool = False
) -> tuple[_Decision, bool, bool] | str:
    """:func:`_decide` on the user's frames of the two paths first: between the user's hook and
    the collective lie a framework's frames (Lightning's loops, the Trainer's callbacks), and
    a decision inside the framework is the parting line only where the user's frames of both
    sides stand at the same lines. Where one side's user frames go further than the other's
    (rank 0 inside the user's hook, the others past it), the decision is the branch in the
    first of the further frames that led it there."""
    cu = [f for f in c if is_user_file(f[0])]
    ou = [f for f in o if is_user_file(f[0])]
    if cu == ou or not cu or not ou or (cu == c and ou == o):
        return _decide(c, o, same_pass=same_pass, diverged=diverged)
    n = min(len(cu), len(ou))
    if cu[:n] == ou[:n]:  # one side's user frames go further: the branch that led it on
        longer = cu if len(cu) > n else ou
        file, func, line = longer[n]
        tree = _tree(file)
        if tree is not None:
            branch = _innermost_branch(file, _chain(_body_of(tree, func, line), line), longer, n)
            if branch is not None:
                return branch, longer is cu, False
        shorter = ou if longer is cu else cu
        registered = _registered_in_branch(longer, n - 1, shorter)  # a framework's callback
        if registered is not None:
            return registered, longer is cu, False
        found: tuple[_Decision, bool, bool] | str = (
            f"no branch of the user's code leads into {short_site(file, line)}"
        )
    else:
        found = _decide(cu, ou, same_pass=same_pass, diverged=diverged)
    if not isinstance(found, str) or _in_framework(c, o):
        return found  # not a framework's decision where the user's frames stand apart
    return _decide(c, o, same_pass=same_pass, diverged=diverged)


def _in_framework(*paths: list[Frame]) -> bool:
    """Whether any frame of ``paths`` is an installed package's other than torch's (a
    framework's: Lightning, transformers, accelerate, DeepSpeed)."""
    return any(library_of(f[0]) not in (None, "torch") for path in paths for f in path)


def _decide(
    c: list[Frame], o: list[Frame], *, same_pass: bool = False, diverged: bool = False
) -> tuple[_Decision, bool, bool] | str:
    """(the decision, whether the culprits' side took it, whether both sides are in arms of
    it), or why none is found. ``same_pass``: the two sides wait at the same call of their
    group (the same collective's number), so neither is a pass of a loop ahead.
    ``diverged``: the two paths are those of the first call where the sides part
    (:mod:`rankscope.analyze.paths`), not where they stopped: the decision is the first
    statement beyond what both share that one side entered (:func:`_first_apart`)."""
    i = 0
    while i < min(len(c), len(o)) and c[i] == o[i]:
        i += 1
    if i == len(c) or i == len(o):
        return "the two sides' stacks stand at the same line"
    if c[i][:2] != o[i][:2]:
        return "the two sides are in different functions called from the same line"
    file, func = c[i][:2]
    tree = _tree(file)
    if tree is None:
        return f"the source of {os.path.basename(file)} could not be read"
    body = _body_of(tree, func, c[i][2])
    cc, oc = _chain(body, c[i][2]), _chain(body, o[i][2])
    k = 0
    while k < min(len(cc), len(oc)) and cc[k] == oc[k]:
        k += 1
    if k < len(cc) and k < len(oc) and cc[k][0] is oc[k][0]:
        if isinstance(cc[k][0], _LOOPS) and "head" in (cc[k][1], oc[k][1]):
            # at the loop's own line, getting its next item (or testing its condition), while
            # the other side is in its body: the same pass, not a decision
            return "one side stands at a loop's own line (its next item) and the other in its body"
        # two arms of one statement
        node, arm = cc[k]
        return _arm_decision(file, node, arm, c, i), True, True
    if diverged:
        found = _first_apart(file, cc, c, k, i, other=oc, outer=o)
        if found is not None:
            return found
    for side, path, rest in ((True, c, o), (False, o, c)):  # a callback one side registered
        registered = _registered_in_branch(path, i, rest)
        if registered is not None:
            return registered, side, False
    c_first = k < len(cc) and (k >= len(oc) or cc[k][0].lineno < oc[k][0].lineno)
    early, late = (c, o) if c_first else (o, c)
    early_chain, late_chain = (cc, oc) if c_first else (oc, cc)
    # The earlier side still inside a loop the later one went through: the later side left it.
    loop = _outermost_loop(file, early_chain[k:], early, i)
    if loop is not None:  # a loop's side is the one still in it; a break's, the one that left
        return loop, c_first == (loop.kind in _LOOP_KINDS), False
    # Within a loop, the earlier side may be a pass ahead, past a branch the later one took;
    # outside any, or where both wait at the same call of their group (the same pass), it has
    # not reached the later statement yet: the later side went past the earlier one's
    # statement, without the branch the earlier side took there.
    if same_pass or not _looping(cc[:k], c[:i]):
        branch = _innermost_branch(file, early_chain[k:], early, i)
        if branch is not None:
            return branch, c_first, False
    branch = _innermost_branch(file, late_chain[k:], late, i)
    if branch is not None:
        return branch, not c_first, False
    loop = _outermost_loop(file, late_chain[k:], late, i)
    if loop is not None:
        return loop, (not c_first) == (loop.kind in _LOOP_KINDS), False
    branch = _innermost_branch(file, early_chain[k:], early, i)
    if branch is not None:
        return branch, c_first, False
    return "no branch or loop in the source separates the two sides' lines"


def _registered_in_branch(path: list[Frame], i: int, other: list[Frame]) -> _Decision | None:
    """Where ``path`` below frame ``i`` enters a function of the user's that its caller's line
    does not call by name (a hook run by ``backward``, a callback the framework runs; ``path``
    may hold the user's frames alone), the branch in the user's
    source that registered it: the ``if`` around the line that names the function without
    calling it (``model.weight.register_hook(clip_and_sync)``, ``hooks.append(clip_and_sync)``),
    or for a method, that makes its class (``callbacks.append(GradNormLogger())``).
    Only the side that took that branch makes the callback's calls. None where the function
    is called directly, no branch holds a line that names it, or the ``other`` side's path
    runs it too (or, for a method, any method of its class): both registered it."""
    for depth in range(i + 1, len(path)):
        file, func, _line = path[depth]
        if not is_user_file(file) or _calls_by_name(path[depth - 1], func):
            continue  # a library's frame, or a function its caller's line calls itself
        if func.startswith("<"):
            return None
        owner = _class_of(file, func, _line)
        theirs = {f[1] for f in other if f[0] == file}
        if func in theirs or (owner and theirs & _methods(file, owner)):
            return None
        for where in dict.fromkeys([file, path[i][0]]):
            tree = _tree(where)
            found = None
            if tree is not None:  # the function handed over, else its class made (a Callback)
                found = _naming_branch(tree, func) or (
                    _naming_branch(tree, owner, made=True) if owner else None
                )
            if found is not None:
                branch, arm, named = found
                return _Decision(
                    where,
                    _func_name(where, branch.lineno),
                    branch.lineno,
                    _header(where, branch.lineno),
                    _branch_kind(where, branch, arm),
                    f"{_header(where, named)} ({short_site(where, named)})",
                    _names(branch.test),
                )
        return None
    return None


def _methods(file: str, cls: str) -> set[str]:
    """The names of the functions defined in class ``cls`` of ``file``."""
    tree = _tree(file)
    return {
        d.name
        for node in (ast.walk(tree) if tree is not None else ())
        if isinstance(node, ast.ClassDef) and node.name == cls
        for d in node.body
        if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


def _calls_by_name(caller: Frame, func: str) -> bool:
    """Whether the line of ``caller`` calls a function named ``func`` (``func(...)``,
    ``obj.func(...)``); a library that ran it as a callback does not."""
    text = linecache.getline(caller[0], caller[2]).strip()
    try:
        tree = ast.parse(text.rstrip(":"), mode="exec")
    except SyntaxError:
        return func in text  # a line of a longer statement: say it does, and look no further
    return any(isinstance(n, ast.Call) and _callee(n.func) == func for n in ast.walk(tree))


def _class_of(file: str, func: str, line: int) -> str | None:
    """The class whose method ``func`` (at ``line`` of ``file``) is; None for a function."""
    tree = _tree(file)
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.ClassDef) and any(
            isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))
            and d.name == func
            and d.lineno <= line <= (d.end_lineno or 0)
            for d in node.body
        ):
            return node.name
    return None


def _naming_branch(
    tree: ast.Module, func: str, *, made: bool = False
) -> tuple[ast.If, str, int] | None:
    """The innermost ``if`` (its arm) around the first line of ``tree`` that names ``func`` as
    a value, not as the function of a call (``made``: a call too, a class instantiated), with
    that line."""
    called = set() if made else {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    named = sorted(
        n.lineno
        for n in ast.walk(tree)
        if id(n) not in called
        and (
            (isinstance(n, ast.Name) and n.id == func and isinstance(n.ctx, ast.Load))
            or (isinstance(n, ast.Attribute) and n.attr == func and isinstance(n.ctx, ast.Load))
        )
    )
    for line in named:
        holder = _def_at(tree, line)
        for node, arm in reversed(_chain(holder.body if holder else tree.body, line)):
            if isinstance(node, ast.If) and arm in ("body", "else"):
                return node, arm, line
    return None


Chain = list[tuple[ast.AST, str]]


def _first_apart(
    file: str,
    chain: Chain,
    path: list[Frame],
    k: int,
    i: int,
    *,
    other: Chain,
    outer: list[Frame],
) -> tuple[_Decision, bool, bool] | None:
    """At the first divergence, the statement beyond the shared ones that sent the culprits'
    line another way: the outermost arm it is in (``if``, ``except``, ``case``), else a branch
    it took in the functions it called from there (a guard that exited), else the branch that
    registered a callback it runs (:func:`_registered_in_branch`), else a loop it is still
    in (one more iteration than the other side); None where the culprits' line lies past the
    others' with nothing of its own (the others are still inside what the culprits left:
    :func:`_decide`'s reading of the two lines' order), or where the others are still in a
    loop above the culprits' line and nothing around both loops (``other``'s statements
    before the parting level, the frames that called it: ``outer``, the others' path) runs
    again: the culprits left that loop before they reached whatever they are in now."""
    if (
        k < len(chain)
        and k < len(other)
        and other[k][0].lineno < chain[k][0].lineno
        and any(isinstance(node, _LOOPS) for node, _arm in other[k:])
        and not _looping(other[:k], outer[:i])
    ):
        return None
    for n, (node, arm) in enumerate(chain[k:], k):
        elif_ = n + 1 < len(chain) and _is_elif_arm(node, arm, chain[n + 1][0])
        if _is_arm(node, arm) and not elif_:
            return _arm_decision(file, node, arm, path, i), True, False
    branch = _innermost_branch(file, chain[k:], path, i)
    if branch is not None:
        return branch, True, False
    registered = _registered_in_branch(path, i, outer)  # a callback, run from a loop
    if registered is not None:
        return registered, True, False
    for n, (node, _arm) in enumerate(chain[k:]):
        if isinstance(node, _LOOPS):
            loop = _outermost_loop(file, chain[k + n :], path, i)
            if loop is not None:
                return loop, loop.kind in _LOOP_KINDS, False
    return None  # the culprits' line is past the others': the order of the lines decides


def _looping(chain: Chain, outer: list[Frame]) -> bool:
    """Whether the statements of ``chain`` run in a loop: one of them is a loop, or one of the
    frames that called this function is inside one."""
    if any(isinstance(node, _LOOPS) for node, _arm in chain):
        return True
    for file, func, line in outer:
        tree = _tree(file)
        if tree is not None and any(
            isinstance(node, _LOOPS) for node, _arm in _chain(_body_of(tree, func, line), line)
        ):
            return True
    return False


def _chain(body: list[ast.stmt], line: int) -> Chain:
    """The compound statements that hold ``line``, outermost first, each with the arm it is in
    (``body``, ``else``, ``except:0``, ``head`` for the statement's own first line), and last
    the simple statement at ``line``."""
    out: Chain = []
    stmts = body
    while True:
        s = next((s for s in stmts if _first(s) <= line <= (s.end_lineno or s.lineno)), None)
        if s is None:
            return out
        arms = _arms(s)
        if not arms:
            out.append((s, "stmt"))
            return out
        arm = next((a for a in arms if a[1] and _span(a[1], line)), None)
        if arm is None:
            out.append((s, "head"))
            return out
        out.append((s, arm[0]))
        stmts = arm[1]


def _first(s: ast.stmt) -> int:
    decorators = getattr(s, "decorator_list", None) or []
    return min([s.lineno] + [d.lineno for d in decorators])


def _span(stmts: list[ast.stmt], line: int) -> bool:
    return _first(stmts[0]) <= line <= (stmts[-1].end_lineno or stmts[-1].lineno)


def _arms(s: ast.stmt) -> list[tuple[str, list[ast.stmt]]]:
    if isinstance(s, (ast.If, *_LOOPS)):
        return [("body", s.body), ("else", s.orelse)]
    if isinstance(s, _TRIES):
        arms = [("body", s.body)]
        arms += [(f"except:{n}", h.body) for n, h in enumerate(s.handlers)]
        return [*arms, ("else", s.orelse), ("finally", s.finalbody)]
    if isinstance(s, ast.Match):
        return [(f"case:{n}", c.body) for n, c in enumerate(s.cases)]
    if isinstance(s, (ast.With, ast.AsyncWith)):
        return [("body", s.body)]
    return []


def _arm_decision(file: str, node: ast.AST, arm: str, path: list[Frame], i: int) -> _Decision:
    """The culprits' side is in ``arm`` of ``node``, the others in another arm."""
    line, kind, names = node.lineno, "if", _names(getattr(node, "test", None))
    if isinstance(node, ast.If):
        if arm == "else":
            kind = "else"
        elif _is_elif(file, node):
            kind = "elif"
    elif isinstance(node, _LOOPS):
        kind = "for" if isinstance(node, (ast.For, ast.AsyncFor)) else "while"
        names = _names(getattr(node, "iter", None) or getattr(node, "test", None))
    elif isinstance(node, ast.Match):
        kind, names = "case", _names(node.subject)
    elif arm.startswith("except"):
        handler = node.handlers[int(arm.split(":")[1])]  # type: ignore[attr-defined]
        kind, line, names = "except", handler.lineno, []
    else:
        kind = "try"
    return _Decision(file, path[i][1], line, _header(file, line), kind, _into(path, i), names)


def _outermost_loop(file: str, chain: Chain, path: list[Frame], i: int) -> _Decision | None:
    """The first loop on ``path`` from frame ``i``'s ``chain`` down, in the user's frames: the
    side on ``path`` is still in it, and the other side, past it, left it (through its
    ``break`` or ``return``, where the loop has one). A loop over ``range`` of constants runs
    as often on every rank: the first loop whose count can differ is named before it."""
    loops = [
        (depth, node)
        for depth, frame_chain in _frame_chains(file, chain, path, i, user_only=True)
        for node, _arm in frame_chain
        if isinstance(node, _LOOPS)
    ]
    if not loops:
        return None
    depth, node = next(((d, n) for d, n in loops if not _fixed_count(n)), loops[0])
    f = path[depth]
    exit_ = _exit_of(f[0], node)
    if exit_ is not None:
        return exit_
    kind = "while" if isinstance(node, ast.While) else "for"
    names = _names(node.test if isinstance(node, ast.While) else node.iter)  # type: ignore[attr-defined]
    head = _header(f[0], node.lineno)
    return _Decision(f[0], f[1], node.lineno, head, kind, _into(path, depth), names)


#: Where a call names its peer (its root, its destination): the argument's position and its
#: keywords, by op.
PEER_ARGS: dict[str, tuple[int, tuple[str, ...]]] = {
    **dict.fromkeys(("send", "isend", "reduce"), (1, ("dst", "group_dst"))),
    **dict.fromkeys(
        ("recv", "irecv", "broadcast", "broadcast_object_list"), (1, ("src", "group_src"))
    ),
    **dict.fromkeys(("scatter", "scatter_object_list"), (2, ("src", "group_src"))),
    **dict.fromkeys(("gather", "gather_object"), (2, ("dst", "group_dst"))),
}


def argument_origin(
    file: str,
    func: str,
    line: int,
    op: str,
    culprits: list[int],
    others: list[int],
    values: pd.DataFrame | None = None,
    callers: Sequence[Frame] = (),
) -> Parting | None:
    """Where the culprits' call at ``line`` got the peer it names (``op``'s argument of
    :data:`PEER_ARGS`) when the call itself is the one every rank makes, from a line that named
    another peer before: the ``if`` before it, in its function, whose branch assigned a name
    that argument reads (``if step == 2 and rank == 1: nxt = (rank + 2) % world``). The culprits
    took that branch, the others did not. Where the names are parameters of the function that
    none of its branches sets (a helper, ``hand_off(block, dst, src)``), ``callers`` (the frames
    that called it, innermost first) are read the same way, each for the arguments it passed
    them. None where the source shows no such assignment, or the name is set again,
    unconditionally, between that branch and the call."""
    tree = _tree(file)
    spec = PEER_ARGS.get(op)
    if tree is None or spec is None:
        return None
    call = _call_named(tree, line, op)
    if call is None:
        return None
    pos, keywords = spec
    arg = next((k.value for k in call.keywords if k.arg in keywords), None)
    if arg is None and len(call.args) > pos:
        arg = call.args[pos]
    names = set(_names(arg))
    frames = [(file, func, line), *callers]
    for at, (file, func, line) in enumerate(frames):
        tree = _tree(file)
        if tree is None or not names:
            return None
        found = _assigned_before(_body_of(tree, func, line), line, names)
        if found is not None:
            break
        if at + 1 < len(frames):
            names = _passed_for(tree, func, line, names, frames[at + 1])
    else:
        return None
    branch, arm, assign = found
    decision = _Decision(
        file,
        func,
        branch.lineno,
        _header(file, branch.lineno),
        _branch_kind(file, branch, arm),
        f"{ast.unparse(assign).splitlines()[0]} ({short_site(file, assign.lineno)})",
        _names(branch.test),
    )
    return _parting(decision, culprits, others, values, assigned=True)


def _call_named(tree: ast.Module, line: int, name: str) -> ast.Call | None:
    """The call of ``name`` (``name(...)``, ``x.name(...)``) that spans ``line``."""
    return next(
        (
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.Call)
            and n.lineno <= line <= (n.end_lineno or n.lineno)
            and _callee(n.func) == name
        ),
        None,
    )


def _passed_for(tree: ast.Module, func: str, line: int, names: set[str], caller: Frame) -> set[str]:
    """The names the caller's arguments read for ``names``, parameters of ``func`` (the function
    at ``line`` of ``tree``), as its call at the caller's line passes them; nothing where one of
    them is not a parameter, the function assigns it before ``line``, or the call does not pass
    it (its default)."""
    node = _def_at(tree, line) if func != "<module>" else None
    caller_tree = _tree(caller[0])
    call = _call_named(caller_tree, caller[2], func) if caller_tree is not None else None
    if node is None or node.name != func or call is None:
        return set()
    if any(
        isinstance(s, ast.stmt) and s.lineno < line and _assigns(s, names) for s in ast.walk(node)
    ):
        return set()
    positional = [a.arg for a in (*node.args.posonlyargs, *node.args.args)]
    # a method called on its object: its first parameter is that object
    shift = int(isinstance(call.func, ast.Attribute) and positional[:1] in (["self"], ["cls"]))
    starred = any(isinstance(a, ast.Starred) for a in call.args)
    out: set[str] = set()
    for name in names:
        given = next((k.value for k in call.keywords if k.arg == name), None)
        at = positional.index(name) - shift if name in positional else -1
        if given is None and not starred and 0 <= at < len(call.args):
            given = call.args[at]
        if given is None:
            return set()
        out.update(_names(given))
    return out


def _callee(func: ast.expr) -> str | None:
    """``send`` of ``dist.send`` and of ``send``."""
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def _assigned_before(
    body: list[ast.stmt], line: int, names: set[str]
) -> tuple[ast.If, str, ast.stmt] | None:
    """The last ``if`` before ``line``, in the blocks that hold it (the innermost first), with
    an arm that assigns one of ``names``: (the ``if``, its arm, the assignment). None where a
    plain assignment of the name comes later than any such branch, or there is none."""
    chain = _chain(body, line)[:-1]
    blocks = [body] + [arm for node, taken in chain for label, arm in _arms(node) if label == taken]
    for block in reversed(blocks):
        for s in reversed([s for s in block if (s.end_lineno or s.lineno) < line]):
            if _assigns(s, names):
                return None  # set again, whatever any branch did
            found = _branch_assigning(s, names) if isinstance(s, ast.If) else None
            if found is not None:
                return found
    return None


def _branch_assigning(branch: ast.If, names: set[str]) -> tuple[ast.If, str, ast.stmt] | None:
    """The arm of ``branch`` (or of an ``if`` inside it: an ``elif``) that assigns one of
    ``names`` last: (that ``if``, its arm, the assignment)."""
    for label, stmts in (("body", branch.body), ("else", branch.orelse)):
        for s in reversed(stmts):
            if _assigns(s, names):
                return branch, label, s
            inner = _branch_assigning(s, names) if isinstance(s, ast.If) else None
            if inner is not None:
                return inner
    return None


def _assigns(s: ast.stmt, names: set[str]) -> bool:
    """Whether ``s`` is an assignment to one of ``names``."""
    if not isinstance(s, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        return False
    targets = s.targets if isinstance(s, ast.Assign) else [s.target]
    return any(isinstance(n, ast.Name) and n.id in names for t in targets for n in ast.walk(t))


def runs_alike(p: Parting) -> bool:
    """Whether the parting line is a loop whose count is written as constants.

    Such a loop (``for step in range(3):``) runs as often on every rank, so a rank that made its
    call fewer times skipped one by a branch; it did not run out of iterations."""
    if p.kind not in _LOOP_KINDS:
        return False
    try:
        tree = ast.parse(p.source.rstrip().rstrip(":") + ": pass")
    except SyntaxError:
        return False
    return bool(tree.body) and _fixed_count(tree.body[0])


def _fixed_count(loop: ast.AST) -> bool:
    """``for _ in range(2):``: a loop whose count is written as constants."""
    it = getattr(loop, "iter", None)
    return (
        isinstance(it, ast.Call)
        and getattr(it.func, "id", None) == "range"
        and all(isinstance(a, ast.Constant) for a in it.args)
    )


def _innermost_branch(file: str, chain: Chain, path: list[Frame], i: int) -> _Decision | None:
    """The innermost ``if`` (or ``try``/``match`` arm) on ``path`` from frame ``i`` down: the
    side on ``path`` took it. The user's own code first, then the libraries it calls, torch
    last: a library's inner branches are taken alike by every rank that calls it."""
    found: dict[int, tuple[int, ast.AST, str]] = {}
    for depth, frame_chain in _frame_chains(file, chain, path, i, user_only=False):
        for node, arm in frame_chain:
            if _is_arm(node, arm):
                found[_owner(path[depth][0])] = (depth, node, arm)
    if not found:
        return None
    depth, node, arm = found[min(found)]
    return _arm_decision(path[depth][0], node, arm, path, depth)


def _is_arm(node: ast.AST, arm: str) -> bool:
    """Whether ``arm`` of ``node`` is a branch taken: an ``if``'s body or ``else``, a ``case``,
    an ``except`` handler."""
    return (
        (isinstance(node, ast.If) and arm in ("body", "else"))
        or (isinstance(node, ast.Match) and arm.startswith("case"))
        or (isinstance(node, _BRANCHES) and arm.startswith("except"))
    )


def _is_elif_arm(node: ast.AST, arm: str, inner: ast.AST) -> bool:
    """Whether ``arm`` is an ``if``'s ``else`` that is the ``elif`` statement ``inner``: the
    decision is the ``elif``'s."""
    return isinstance(node, ast.If) and arm == "else" and node.orelse == [inner]


def _owner(file: str) -> int:
    """0 for the user's code, 1 for a library's, 2 for torch's."""
    if is_user_file(file):
        return 0
    return 2 if "/torch/" in file.replace("\\", "/") else 1


def _frame_chains(
    file: str, chain: Chain, path: list[Frame], i: int, *, user_only: bool
) -> list[tuple[int, Chain]]:
    """``chain`` (frame ``i``'s, from the parting level) and the chains of the frames below."""
    out = [(i, chain)]
    for depth in range(i + 1, len(path)):
        f_file, f_func, f_line = path[depth]
        if user_only and not is_user_file(f_file):
            continue
        tree = _tree(f_file)
        if tree is None:
            continue
        out.append((depth, _chain(_body_of(tree, f_func, f_line), f_line)))
    return out


def _exit_of(file: str, loop: ast.AST) -> _Decision | None:
    """The loop's own ``break`` (or a ``return`` from inside it), with the ``if`` that guards
    it, when the loop has exactly one."""
    exits: list[tuple[ast.AST, ast.If | None]] = []

    def walk(stmts: list[ast.stmt], guard: ast.If | None, nested: bool) -> None:
        for s in stmts:
            if (isinstance(s, ast.Break) and not nested) or isinstance(s, ast.Return):
                exits.append((s, guard))
            elif isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            for _label, arm in _arms(s):
                walk(arm, s if isinstance(s, ast.If) else guard, nested or isinstance(s, _LOOPS))

    walk(loop.body, None, False)  # type: ignore[attr-defined]
    if len(exits) != 1:
        return None
    stmt, guard = exits[0]
    kind = "break" if isinstance(stmt, ast.Break) else "return"
    if guard is None:
        return None
    head = _header(file, guard.lineno)
    source = head if guard.body[0].lineno == guard.lineno else f"{head} {kind}"
    func = _func_name(file, guard.lineno)
    into = f"{kind} at {short_site(file, stmt.lineno)}"
    return _Decision(file, func, guard.lineno, source, kind, into, _names(guard.test))


def _into(path: list[Frame], depth: int) -> str:
    """``save_checkpoint → barrier (train.py:11)``: the user's functions below the decision's
    frame, down to the innermost user frame's line and the call it makes there."""
    user = [f for f in path[depth + 1 :] if is_user_file(f[0])]
    last = user[-1] if user else path[depth]
    names = [f[1] for f in user if f[1] != "<module>"]
    code = _code_call(last[0], last[2])
    steps = names + ([code] if code else [])
    where = f"({short_site(last[0], last[2])})"
    return " → ".join(steps) + f" {where}" if steps else where


def _code_call(file: str, line: int) -> str | None:
    """``barrier`` for a line that calls ``dist.barrier()``: the outermost call's name."""
    text = linecache.getline(file, line).strip()
    try:
        node = ast.parse(text.rstrip(":"), mode="exec")
    except SyntaxError:
        return None
    return next((_callee(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)), None)


def _names(expr: ast.AST | None) -> list[str]:
    """The simple names an expression reads, in order, once each."""
    if expr is None:
        return []
    seen: dict[str, None] = {}
    for n in ast.walk(expr):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in _BUILTINS:
            seen.setdefault(n.id)
    return list(seen)


_BUILTINS = frozenset(dir(builtins))


def _values_of(
    values: pd.DataFrame, d: _Decision, names: list[str], ranks: list[int]
) -> dict[str, dict[int, Any]]:
    """Each name's value on each rank, from the frame of the decision's function in the rank's
    latest capture of values."""
    if values.empty or not names:
        return {}
    rows = values[
        values["rank"].isin(ranks)
        & (values["file"] == d.file)
        & (values["func"] == d.func)
        & values["name"].isin(names)
    ]
    out: dict[str, dict[int, Any]] = {}
    if rows.empty:
        return out
    latest = rows.groupby("rank")["capture"].transform("max")
    rows = rows[rows["capture"] == latest]
    for name in names:
        mine = rows[rows["name"] == name].drop_duplicates("rank", keep="first")
        if not mine.empty:
            out[name] = {int(r): v for r, v in zip(mine["rank"], mine["value"], strict=True)}
    return out


def env_origin(file: str, name: str, depth: int = 3) -> str | None:
    """The environment variable ``name`` is computed from in ``file`` (an assignment that reads
    ``os.environ[...]``, ``os.environ.get(...)`` or ``os.getenv(...)``, directly or through
    other names), or None."""
    tree = _tree(file)
    if tree is None or depth == 0:
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if not any(isinstance(t, ast.Name) and t.id == name for t in targets):
                continue
            var = _env_read(node.value) or _env_of_calls(tree, node.value)
            if var is not None:
                return var
            for other in _names(node.value):
                if other != name and (var := env_origin(file, other, depth - 1)) is not None:
                    return var
    return None


def _env_of_calls(tree: ast.Module, expr: ast.AST) -> str | None:
    """The environment variable a function of the same file returns, for a call to it in
    ``expr`` (``leader = is_leader()`` with ``return os.environ.get("LOCAL_RANK") == "0"``)."""
    called = {
        n.func.id
        for n in ast.walk(expr)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in called:
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return) and ret.value is not None:
                    var = _env_read(ret.value)
                    if var is not None:
                        return var
    return None


def _env_read(expr: ast.AST) -> str | None:
    for n in ast.walk(expr):
        key = None
        if isinstance(n, ast.Subscript) and _is_environ(n.value):
            key = n.slice
        elif isinstance(n, ast.Call) and n.args:
            f = n.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if (name == "get" and _is_environ(getattr(f, "value", None))) or name == "getenv":
                key = n.args[0]
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return key.value
    return None


def _is_environ(expr: ast.AST | None) -> bool:
    return (isinstance(expr, ast.Attribute) and expr.attr == "environ") or (
        isinstance(expr, ast.Name) and expr.id == "environ"
    )


def _is_elif(file: str, node: ast.If) -> bool:
    return linecache.getline(file, node.lineno).lstrip().startswith("elif")


def _header(file: str, line: int) -> str:
    """A statement's first line as written, without its comment."""
    text = linecache.getline(file, line).strip()
    return text.split("  #", 1)[0].split(" # ", 1)[0].rstrip()


def _func_name(file: str, line: int) -> str:
    tree = _tree(file)
    node = _def_at(tree, line) if tree is not None else None
    return node.name if node is not None else "<module>"


def _body_of(tree: ast.Module, func: str, line: int) -> list[ast.stmt]:
    """The body of the function ``func`` whose span holds ``line`` (the module's, for
    ``<module>`` or when none does)."""
    node = _def_at(tree, line) if func != "<module>" else None
    return node.body if node is not None else tree.body


def _def_at(tree: ast.Module, line: int) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    inside = [
        n
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        and n.lineno <= line <= (n.end_lineno or n.lineno)
    ]
    return min(inside, key=lambda n: (n.end_lineno or n.lineno) - n.lineno, default=None)


#: What a collective raises (torch's DistError and its kinds are RuntimeErrors): a handler of
#: one of these names, or a bare ``except:``, catches a collective's error.
_CATCHES = frozenset(
    {
        "BaseException",
        "Exception",
        "RuntimeError",
        "DistError",
        "DistBackendError",
        "DistNetworkError",
        "DistStoreError",
    }
)


@dataclass(frozen=True)
class Catch:
    """Where a collective's error was caught: the frame of a call's path whose line lies in
    the body of a ``try`` with a handler that catches it."""

    frame: Frame
    site: str
    """``metrics.py:18``: the handler's line."""
    source: str
    """Its text: ``except RuntimeError as err:``."""
    library: str | None
    """The installed package it belongs to (:func:`~rankscope.rundir.library_of`); None for
    the user's code."""


def catcher(path: list[Frame] | tuple[Frame, ...]) -> Catch | None:
    """Of a call's path (frames outermost first), the innermost frame whose line lies in the
    body of a ``try`` whose handler catches a collective's error (:data:`_CATCHES`, a bare
    ``except``), as Python picks it; None where no source read shows one."""
    for frame in reversed(path):
        tree = _tree(frame[0])
        if tree is None:
            continue
        tries = [
            n
            for n in ast.walk(tree)
            if isinstance(n, _TRIES)
            and n.body
            and n.body[0].lineno <= frame[2] <= (n.body[-1].end_lineno or n.body[-1].lineno)
        ]
        for node in sorted(tries, key=lambda n: n.lineno, reverse=True):  # the innermost first
            handler = next((h for h in node.handlers if _catches(h.type)), None)  # type: ignore[attr-defined]
            if handler is not None:
                return Catch(
                    frame=frame,
                    site=short_site(frame[0], handler.lineno),
                    source=linecache.getline(frame[0], handler.lineno).strip(),
                    library=library_of(frame[0]),
                )
    return None


def _catches(kind: ast.expr | None) -> bool:
    """Whether an ``except`` of ``kind`` (None: bare) catches what a collective raises."""
    if kind is None:
        return True
    kinds = kind.elts if isinstance(kind, ast.Tuple) else [kind]
    return any(
        (k.id if isinstance(k, ast.Name) else k.attr if isinstance(k, ast.Attribute) else None)
        in _CATCHES
        for k in kinds
    )


def _tree(file: str) -> ast.Module | None:
    try:
        stamp = os.stat(file).st_mtime_ns
    except OSError:
        return None
    return _parse(file, stamp)


@functools.lru_cache(maxsize=128)
def _parse(file: str, stamp: int) -> ast.Module | None:
    linecache.checkcache(file)
    try:
        return ast.parse("".join(linecache.getlines(file)))
    except (SyntaxError, ValueError):
        return None


def loop_parting(
    their: Frame,
    own: Frame,
    culprits: list[int],
    others: list[int],
    values: pd.DataFrame | None = None,
) -> Parting | None:
    """The parting line from two calls alone (no stacks that part): the culprits' call at
    ``own`` is past the end of the innermost loop holding the others' call at ``their``, so
    they left the loop the others are still in."""
    if not left_loop_by_sites(their, own):
        return None
    tree = _tree(their[0])
    assert tree is not None  # left_loop_by_sites read it
    chain = _chain(_body_of(tree, their[1], their[2]), their[2])
    loop = [node for node, _arm in chain if isinstance(node, _LOOPS)][-1]
    kind = "while" if isinstance(loop, ast.While) else "for"
    names = _names(loop.test if isinstance(loop, ast.While) else loop.iter)  # type: ignore[attr-defined]
    head = _header(their[0], loop.lineno)
    into = f"{_code_call(their[0], their[2]) or 'its call'} ({short_site(their[0], their[2])})"
    d = _Decision(their[0], their[1], loop.lineno, head, kind, into, names)
    return _parting(d, others, culprits, values, left_loop=True)


def loop_around(
    path: list[Frame],
    culprits: list[int],
    others: list[int],
    values: pd.DataFrame | None = None,
) -> Parting | None:
    """The parting line of ranks that made the call at the end of ``path`` (outermost first)
    as the others did, fewer times, and then left: the innermost loop that holds the call, in
    the user's frames where one holds it, else in the library's (the user's frames of both
    sides stand at the same line: Lightning's batch loop under ``trainer.fit``). The others are
    still in it; the culprits left it (they ran out of iterations). None where no loop holds it,
    or where that loop's count is written as constants (the culprits skipped the call by a
    branch the paths do not show)."""
    found = None
    for depth in sorted(range(len(path)), key=lambda d: (not is_user_file(path[d][0]), -d)):
        file, func, line = path[depth]
        tree = _tree(file)
        if tree is None:
            continue
        loops = [n for n, _arm in _chain(_body_of(tree, func, line), line) if isinstance(n, _LOOPS)]
        if loops:
            found = (depth, loops[-1])
            break
    if found is None or _fixed_count(found[1]):
        return None  # a loop over range(3) runs as often everywhere: a branch skipped the call
    depth, loop = found
    file = path[depth][0]
    kind = "while" if isinstance(loop, ast.While) else "for"
    names = _names(loop.test if isinstance(loop, ast.While) else loop.iter)  # type: ignore[attr-defined]
    into = _into(path, depth) + _under_user(path, depth)
    d = _Decision(file, path[depth][1], loop.lineno, _header(file, loop.lineno), kind, into, names)
    return _parting(d, others, culprits, values, left_loop=True)


def _under_user(path: list[Frame], depth: int) -> str:
    """``, under train.py:41 (trainer.fit)``: the user's innermost frame above a library's
    decision at ``depth``, the line of the user's that leads into it; empty for the user's own."""
    if is_user_file(path[depth][0]):
        return ""
    user = [f for f in path[:depth] if is_user_file(f[0])]
    if not user:
        return ""
    file, _func, line = user[-1]
    code = _code_call(file, line)
    return f", under {short_site(file, line)}" + (f" ({code})" if code else "")


def left_loop_by_sites(their: Frame, own: Frame) -> bool | None:
    """Whether the call at ``own`` is past the end of the innermost loop that holds the call at
    ``their`` (both ``(file, func, line)``): True past its end, False inside it or before it,
    None when the two are not in one function or its source cannot be read."""
    if their[:2] != own[:2]:
        return None
    tree = _tree(their[0])
    if tree is None:
        return None
    chain = _chain(_body_of(tree, their[1], their[2]), their[2])
    loops = [node for node, _arm in chain if isinstance(node, _LOOPS)]
    if not loops:
        return None
    loop = loops[-1]
    return own[2] > (loop.end_lineno or loop.lineno)
