"""Drill-down: any table's rows ready for a grid, and the tail of one rank's log."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

#: Rows shown at most; a table of a 1024-rank run has millions.
MAX_ROWS = 2000


def table_rows(
    table: pd.DataFrame,
    *,
    ranks: Iterable[int] = (),
    columns: Iterable[str] = (),
    max_rows: int = MAX_ROWS,
) -> tuple[pd.DataFrame, int]:
    """The rows of ``table`` to show in a grid: those of ``ranks`` (every rank's when empty),
    the ``columns`` chosen (every column when empty), the first ``max_rows``, with times
    readable (a ``*_s`` column of seconds since the epoch as the time of day, to the
    millisecond) and nested values as text. Returns them and how many rows matched.
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be at least 1, got {max_rows}")
    wanted = sorted(set(ranks))
    if wanted:
        if "rank" not in table.columns:
            raise ValueError(f"this table has no rank column; its columns: {list(table.columns)}")
        table = table[table["rank"].isin(wanted).fillna(False).to_numpy(dtype=bool)]
    chosen = [c for c in columns if c in table.columns] or list(table.columns)
    shown = table[chosen].head(max_rows).copy()
    for c in shown.columns:
        col = shown[c]
        if c.endswith("_s") and pd.api.types.is_numeric_dtype(col) and (col.dropna() > 1e9).all():
            stamp = pd.to_datetime(col.astype("Float64").astype(float), unit="s", utc=True)
            shown[c] = stamp.dt.strftime("%H:%M:%S.%f").str[:-3].fillna("")
        elif not pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col):
            # text as text, nested values as their text, and nothing where nothing is known
            text = col.astype(object).map(lambda v: v if isinstance(v, str) else str(v))
            shown[c] = text.where(col.notna(), "")
    return shown.reset_index(drop=True), len(table)


def log_tail(logs: pd.DataFrame, *, rank: int, lines: int = 40) -> str:
    """The last ``lines`` lines one rank wrote (stdout, stderr, error file), as text.

    Args:
        logs: the run's ``logs`` table.
        rank: whose lines.
        lines: how many of the last lines.
    """
    mine = logs[(logs["rank"] == rank).fillna(False).to_numpy(dtype=bool)]
    mine = mine[mine["stream"].astype(str) != "launcher"].tail(lines)
    return "\n".join(mine["text"].fillna("").astype(str))
