"""Plots: tables in, ``plotly.graph_objects.Figure`` out; nothing is shown, nothing is kept.

Every function takes the tables of :func:`rankscope.collect.load_run` (schemas in
:mod:`rankscope.schema`) and returns a figure; :func:`path_tree` takes a
:class:`~rankscope.analyze.Diagnosis` (or its JSON form) and draws its classes of ranks by call
path. Figures of 1024 ranks build in well under two seconds (``bench/plot_build.py``): calls and
lines are drawn as one WebGL trace per colour, never one trace per rank. This package imports
pandas, numpy and plotly, never ipywidgets.
"""

from rankscope.plot._common import ALERT, as_calls
from rankscope.plot.ladder import LADDER, ladder_table, sequence_ladder
from rankscope.plot.memory import memory_by_rank
from rankscope.plot.nccl import nccl_view
from rankscope.plot.paths import alike, end_classes, first_classes, path_tree
from rankscope.plot.progress import progress
from rankscope.plot.stacks import latest_stacks, merged_stacks, where_groups, where_is_everyone
from rankscope.plot.table import (
    GROUP_FROM,
    RankGroup,
    grouped_rows,
    log_tail,
    rank_groups,
    table_rows,
)
from rankscope.plot.timeline import rank_timeline

__all__ = [
    "ALERT",
    "GROUP_FROM",
    "LADDER",
    "RankGroup",
    "alike",
    "as_calls",
    "end_classes",
    "first_classes",
    "grouped_rows",
    "ladder_table",
    "latest_stacks",
    "log_tail",
    "memory_by_rank",
    "merged_stacks",
    "nccl_view",
    "path_tree",
    "progress",
    "rank_groups",
    "rank_timeline",
    "sequence_ladder",
    "table_rows",
    "where_groups",
    "where_is_everyone",
]
