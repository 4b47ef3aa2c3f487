"""The values that decide a rank's path, captured with its stacks.

At each capture, and where a collective raised an error (while the frames that called it are
still on the stack: ``Probe._call_failed``), the probe writes one line to
``ranks/<rank>/values.jsonl``: for every thread but its own, the frames of the user's code and
of the libraries it calls (not torch's, the standard library's or rankscope's own), each with
the values of the simple names that the frame's function reads in its conditions (the tests of
``if``, ``while``, ``assert``, conditional expressions and comprehensions, ``match`` subjects,
the iterables of ``for``), so that the analyzer can say which value sent a rank another way
(``is_main = True on ranks 0, 2``).

Only values of the types in :data:`SIMPLE` are read and written (a ``str`` cut to
:data:`MAX_TEXT` characters); a name bound to anything else (a tensor, a list, an object) is
left out, and its value is never converted or looked into. Which names a function's conditions
read comes from its source (``ast``), once per code object.
"""

from __future__ import annotations

import ast
import functools
import json
import linecache
import sys
import sysconfig
import threading
import time
from types import CodeType, FrameType
from typing import Any

#: The only types whose values are read.
SIMPLE = (bool, int, float, str, type(None))
MAX_TEXT = 80
#: Bounds per capture: frames per thread and names per frame.
MAX_FRAMES = 48
MAX_NAMES = 24
_STDLIB = tuple(
    p for p in {sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib")} if p
)
_SKIP = ("/torch/", "/rankscope/probe/", "/rankscope/launch/", "/rankscope/collect/")


def capture_line(
    capture_id: int | None,
    reason: str,
    own: set[int],
    where: dict[int, FrameType] | None = None,
) -> str:
    """The JSON line of one capture.

    ``{"id", "t", "reason", "threads": [{"thread", "frames": [[file, func, line, {name:
    value}], ...]}]}``, frames outermost first; threads in ``own``
    (the probe's) are left out. ``where``: a thread's frame to read instead of its current one
    (a rank's end: the frame that called ``sys.exit``, still alive in its traceback)."""
    threads = []
    for tid, frame in {**sys._current_frames(), **(where or {})}.items():
        if tid in own:
            continue
        frames = _frames(frame)
        if frames:
            threads.append({"thread": f"0x{tid:016x}", "frames": frames})
    record = {"id": capture_id, "t": round(time.time(), 6), "reason": reason, "threads": threads}
    return json.dumps(record, separators=(",", ":")) + "\n"


def own_threads() -> set[int]:
    """The idents of the probe's threads (named ``rankscope-...``)."""
    return {
        t.ident
        for t in threading.enumerate()
        if t.ident is not None and t.name.startswith("rankscope")
    }


def _frames(frame: FrameType | None) -> list[list[Any]]:
    out = []
    depth = 0
    while frame is not None and depth < MAX_FRAMES:
        code = frame.f_code
        if _wanted(code.co_filename):
            names = _condition_names(code)
            if names:
                values = _values(frame, names)
                if values:
                    out.append([code.co_filename, code.co_name, frame.f_lineno, values])
        frame = frame.f_back
        depth += 1
    return out[::-1]


def _wanted(file: str) -> bool:
    if file.startswith("<"):
        return False
    norm = file.replace("\\", "/")
    if "/rankscope/scenarios/scripts/" in norm:
        return True
    if any(s in norm for s in _SKIP):
        return False
    return not (file.startswith(_STDLIB) and "-packages" not in norm)


def _values(frame: FrameType, names: tuple[str, ...]) -> dict[str, Any]:
    local = frame.f_locals
    glob = frame.f_globals
    out: dict[str, Any] = {}
    for name in names:
        if name in local:
            value = local[name]
        elif name in glob:
            value = glob[name]
        else:
            continue
        kind = type(value)
        if kind not in SIMPLE:
            continue
        if kind is float and value != value:  # NaN: JSON has no literal for it
            value = "nan"
        elif kind is float and value in (float("inf"), float("-inf")):
            value = str(value)
        elif kind is str:
            value = value[:MAX_TEXT]
        elif kind is int and abs(value) > 2**63:
            value = str(value)[:MAX_TEXT]
        out[name] = value
    return out


@functools.lru_cache(maxsize=1024)
def _condition_names(code: CodeType) -> tuple[str, ...]:
    node = _node_of(code.co_filename, code.co_firstlineno, code.co_name)
    if node is None:
        return ()
    seen: dict[str, None] = {}
    for expr in _conditions(node):
        for n in ast.walk(expr):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                seen.setdefault(n.id)
                if len(seen) >= MAX_NAMES:
                    return tuple(seen)
    return tuple(seen)


def _conditions(node: ast.AST) -> list[ast.AST]:
    """The condition expressions of a function (or module) body, nested functions left out."""
    out: list[ast.AST] = []
    todo = list(ast.iter_child_nodes(node))
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(n, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            out.append(n.test)
        elif isinstance(n, (ast.For, ast.AsyncFor)):
            out.append(n.iter)
        elif isinstance(n, ast.comprehension):
            out += n.ifs
        elif isinstance(n, ast.Match):
            out.append(n.subject)
        todo.extend(ast.iter_child_nodes(n))
    return out


def _node_of(file: str, first: int, name: str) -> ast.AST | None:
    tree = _parse(file)
    if tree is None:
        return None
    if name == "<module>":
        return tree
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name:
            lines = [n.lineno] + [d.lineno for d in n.decorator_list]
            if first in lines:
                return n
    return None


@functools.lru_cache(maxsize=64)
def _parse(file: str) -> ast.Module | None:
    try:
        return ast.parse("".join(linecache.getlines(file)))
    except (SyntaxError, ValueError, RecursionError):
        return None
