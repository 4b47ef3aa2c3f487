"""``values.jsonl``: the simple values the probe captured with each rank's stacks.

One line per capture (:mod:`rankscope.probe._values` writes it): every thread's frames, each
with the numbers, strings, booleans and Nones its conditions read. The file may come from
someone else's cluster: a line that is not such an object, a value of any other type, or a
field of the wrong kind is skipped and counted, never evaluated.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pandas as pd

from rankscope.collect._common import (
    Problems,
    SourceLike,
    as_sources,
    columns,
    decode_text,
    finish,
    problem_list,
    read_bytes,
    split_lines,
)

_SIMPLE = (bool, int, float, str, type(None))
_COLUMNS = ("rank", "capture_id", "capture", "t_s", "reason", "thread", "depth", "file", "func")
_COLUMNS += ("line", "name", "value", "source")


def read_values(sources: Iterable[SourceLike], *, problems: Problems | None = None) -> pd.DataFrame:
    """One row per (capture, thread, frame, name) of every ``values.jsonl``; ``depth`` 0 is the
    outermost frame, ``capture`` the line's index in its file, ``value`` the value itself.

    Args:
        sources: ``values.jsonl`` files (paths, or :class:`~rankscope.collect.Source` with a rank).
        problems: where unreadable files and lines are reported; ``None`` raises ``ValueError``.
    """
    problems = problem_list(problems)
    rows: list[tuple[Any, ...]] = []
    for source in as_sources(sources):
        data = read_bytes(source, problems, "values")
        if data is None:
            continue
        bad = 0
        for index, text in enumerate(split_lines(decode_text(data, source, problems, "values"))):
            try:
                record = json.loads(text)
                rows += _rows(record, source, index)
            except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
                bad += 1
        if bad:
            problems.add(source, "values", f"{bad} line(s) are not a capture of values; skipped")
    table = columns(_COLUMNS, rows)
    table["value"] = pd.Series(table["value"], dtype=object)  # as written: no float for None
    return finish("values", table)


def _rows(record: dict[str, Any], source: Any, index: int) -> list[tuple[Any, ...]]:
    if not isinstance(record, dict) or not isinstance(record["threads"], list):
        raise TypeError("not a capture")
    capture_id, t = record.get("id"), record.get("t")
    reason = record.get("reason")
    out = []
    for thread in record["threads"]:
        tid = str(thread["thread"])
        for depth, (file, func, line, values) in enumerate(thread["frames"]):
            if not isinstance(values, dict):
                raise TypeError("values are not a mapping")
            for name, value in values.items():
                if type(value) not in _SIMPLE:
                    raise TypeError("a value of another type")
                out.append(
                    (
                        source.rank,
                        capture_id if isinstance(capture_id, int) else None,
                        index,
                        t if isinstance(t, (int, float)) else None,
                        str(reason) if reason is not None else None,
                        tid,
                        depth,
                        str(file),
                        str(func),
                        int(line),
                        str(name),
                        value,
                        source.name,
                    )
                )
    return out
