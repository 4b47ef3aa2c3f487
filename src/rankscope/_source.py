"""The user's source read for the live view; standard library only (below ``launch``)."""

from __future__ import annotations

import ast
import functools
import linecache
import os
import stat

#: A file larger than this is not read for the live view (generated code, not a script).
MAX_SOURCE_BYTES = 4 << 20


def loop_at(file: str, line: int) -> tuple[int, str] | None:
    """(line, header) of the innermost ``for`` or ``while`` loop of ``file`` whose body holds
    ``line`` (``(10, "while err > tol:")``), or of the loop whose header it is; None where the
    source cannot be read or parsed, or no loop holds the line."""
    loops = _loops(file)
    if not loops:
        return None
    inside = [span for span in loops if span[0] <= line <= span[1]]
    if not inside:
        return None
    first = min(inside, key=lambda s: s[1] - s[0])[0]
    return first, linecache.getline(file, first).strip()


@functools.lru_cache(maxsize=64)
def _loops(file: str) -> list[tuple[int, int]] | None:
    # The name comes from a rank's events (a file): only a plain file of a script's size.
    try:
        st = os.stat(file)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_SOURCE_BYTES:
        return None
    lines = linecache.getlines(file)
    if not lines:
        return None
    try:
        tree = ast.parse("".join(lines))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    kinds = (ast.For, ast.AsyncFor, ast.While)
    return [(n.lineno, n.end_lineno or n.lineno) for n in ast.walk(tree) if isinstance(n, kinds)]
