"""The per-rank memory figure: stacked bars, peak markers, reference lines, one panel per setting."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import pytest

from rankscope.plot import memory_by_rank

MIB = 2**20


def records() -> pd.DataFrame:
    """Two settings of a 2-rank job, as the FSDP scenarios print them (rank 1 holds fewer rows)."""
    rows = []
    for wrapping, peak in (("root only", 8 * MIB), ("per block", 1 * MIB)):
        for rank, shard in ((0, 4 * MIB), (1, 3 * MIB)):
            rows.append(
                {
                    "rank": rank,
                    "wrapping": wrapping,
                    "param_bytes": shard,
                    "grad_bytes": shard,
                    "optim_bytes": 2 * shard,
                    "gathered_peak_bytes": peak,
                    "model_bytes": 8 * MIB,
                }
            )
    return pd.DataFrame(rows)


def test_one_panel_per_setting_with_stacked_bars_and_peaks_in_mib() -> None:
    fig = memory_by_rank(records(), by="wrapping", lines={"model_bytes": "whole model"})
    assert isinstance(fig, go.Figure)
    assert fig.layout.barmode == "stack"
    assert [a.text for a in fig.layout.annotations][:2] == ["root only", "per block"]
    bars = [t for t in fig.data if t.type == "bar"]
    peaks = [t for t in fig.data if t.type == "scatter"]
    assert len(bars) == 2 * 3 and len(peaks) == 2  # three stacked parts and a peak per panel
    assert [t.name for t in bars[:3]] == ["parameters", "gradients", "optimizer state"]
    assert list(bars[2].x) == [0, 1] and list(bars[2].y) == [8.0, 6.0]  # optimizer state, MiB
    assert list(peaks[0].y) == [8.0, 8.0] and list(peaks[1].y) == [1.0, 1.0]
    assert peaks[1].xaxis == "x2" and bars[3].xaxis == "x2"  # the second setting's panel
    assert sum(t.showlegend is not False for t in fig.data) == 4  # each label once in the legend
    lines = [s for s in fig.layout.shapes if s.type == "line"]
    assert len(lines) == 2 and {s.y0 for s in lines} == {8.0}
    assert list(fig.layout.xaxis.tickvals) == [0, 1]


def test_rows_are_drawn_in_rank_order_and_a_single_run_needs_no_by() -> None:
    table = records()
    one = table[table["wrapping"] == "per block"].iloc[::-1]
    fig = memory_by_rank(one, peak=None, held={"param_bytes": "parameters"})
    assert [t.type for t in fig.data] == ["bar"]
    assert list(fig.data[0].x) == [0, 1] and list(fig.data[0].y) == [4.0, 3.0]
    assert not fig.layout.annotations  # no panel titles without by


def test_missing_columns_are_named_and_an_empty_table_says_so() -> None:
    with pytest.raises(ValueError, match="grad_bytes"):
        memory_by_rank(records().drop(columns=["grad_bytes"]))
    empty = memory_by_rank(records().iloc[:0])
    assert not empty.data
    assert "no memory records" in empty.layout.annotations[0].text
