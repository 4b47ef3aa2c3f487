"""Drill-down: any table as a scrollable plotly table, and the tail of one rank's log."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd
import plotly.graph_objects as go

#: Rows shown at most; a table of a 1024-rank run has millions.
MAX_ROWS = 2000


def table_view(
    table: pd.DataFrame,
    *,
    ranks: Iterable[int] = (),
    title: str = "",
    max_rows: int = MAX_ROWS,
) -> go.Figure:
    """The rows of ``table`` as a ``go.Table``: all of them, or those of ``ranks``.

    Args:
        table: any of the run's tables (a ``rank`` column is needed to pick ranks).
        ranks: only these ranks' rows; empty for every row.
        title: shown above the table, with the number of rows.
        max_rows: the first this many rows are shown; the title says how many there were.

    Returns:
        The figure.
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be at least 1, got {max_rows}")
    wanted = sorted(set(ranks))
    if wanted:
        if "rank" not in table.columns:
            raise ValueError(f"this table has no rank column; its columns: {list(table.columns)}")
        table = table[table["rank"].isin(wanted).fillna(False).to_numpy(dtype=bool)]
    shown = table.head(max_rows)
    cells = [shown[c].astype("string").fillna("").to_numpy(dtype=object) for c in shown.columns]
    fig = go.Figure(
        go.Table(
            header={"values": [f"<b>{c}</b>" for c in shown.columns], "align": "left"},
            cells={"values": cells, "align": "left"},
        )
    )
    more = f" (first {len(shown)})" if len(table) > len(shown) else ""
    fig.update_layout(
        title={"text": f"{title} {len(table)} rows{more}".strip()},
        height=520,
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
    )
    return fig


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
