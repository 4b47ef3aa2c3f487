"""The results area: the diagnosis card, the plots, and the tables for drill-down."""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
from itables.widget import ITable

from rankscope import plot
from rankscope.analyze import Diagnosis, diagnose
from rankscope.analyze.diagnosis import CELL_STYLE, compact_ranks
from rankscope.collect import Run, load_run
from rankscope.replay import REPRO_NAME
from rankscope.replay import build as build_replay
from rankscope.widgets._common import (
    cell,
    figure_output,
    guarded,
    html_output,
    set_figure,
    table_head,
)

#: Tabs of the results area, in order; NCCL only when the run has NCCL logs.
NO_DIAGNOSIS = "<i>no diagnosis yet: it comes when the job stalls or ends, or on Diagnose</i>"
PLOTS = ("call paths", "sequence ladder", "where is everyone", "merged stacks", "progress", "NCCL")
#: What the call-path tab says of a diagnosis whose ranks' calls never parted.
NO_PARTING = (
    "<p class='rankscope-no-parting' style='color:#777'>The ranks' calls followed one path: "
    "there is no first divergence to draw.</p>"
)
#: The grid's settings, given at every update (itables computes the others again): a click
#: anywhere on a header sorts; the search box first, for a table of any length (itables drops
#: its default layout's controls for a table that fits a page; the caption promises one).
GRID: dict[str, Any] = {
    "scrollX": True,
    "pageLength": 15,
    "lengthMenu": [15, 50, 200],
    "classes": "display nowrap cell-border",
    # every row sent (table_rows keeps to MAX_ROWS): itables would otherwise show a sample of
    # a table over 64 KB, and a group of 1024 ranks would lose most of its rows
    "maxBytes": 0,
    "text_in_header_can_be_selected": False,
    "layout": {
        "topStart": "search",
        "topEnd": "pageLength",
        "bottomStart": "info",
        "bottomEnd": "paging",
    },
}
#: The tables to choose from: the diagnosis's calls (probe and recorder merged), then the run's.
TABLES = ("calls", *Run.TABLES)
EVERY_GROUP = "every group"
#: Groups offered in the list at most (the outliers come first).
GROUP_CHOICES = 200
#: The ranks table's columns in a static snapshot (:meth:`ResultsPanel.static`).
STATIC_RANK_COLUMNS = ("rank", "host", "pid", "status", "end")
#: Its cells' style, inline: a notebook's own table style would otherwise win there.
STATIC_CELL = f"{CELL_STYLE};overflow:hidden;text-overflow:ellipsis"


def rank_list(text: str) -> list[int]:
    """``"0, 3-5"`` as ``[0, 3, 4, 5]``; empty text is no ranks (every row)."""
    ranks: list[int] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            raise ValueError(f"ranks: {part!r} is not a rank or a range like 3-5")
        ranks += range(int(first), int(last or first) + 1)
    return ranks


class ResultsPanel(widgets.VBox):
    """What went wrong with one run: the diagnosis card, the rank timeline, the other plots in
    tabs, and any table of the run, filtered by rank, for drill-down.

    Attributes:
        card: the diagnosis (HTML).
        timeline: the rank timeline (an Output holding the figure).
        plots: a Tab of Outputs, one per other plot: the call-path tree first (where the
            ranks' paths first parted and where they are at the end; one muted line where they
            never parted), then the sequence ladder, the stacks, the progress, NCCL.
        table_name: which table to show; ``table_ranks``: which ranks ("0,3-5", empty for all);
            ``table_columns``: which columns (none: those with something to read). Each choice
            shows the rows in ``table`` at once: past :data:`rankscope.plot.GROUP_FROM` ranks,
            while ``table_grouped`` is ticked, a row per group of ranks alike, the outliers
            first; ``table_group`` shows one group's rows.
        replay: the button that writes ``repro.py`` (a small CPU job that freezes the same way)
            into the run directory; ``replay_info`` then shows its path and header.
        errors: beside the Replay button, what went wrong with it; ``table_errors``: above the
            grid, what is wrong with the table's choice.
        run: the :class:`rankscope.collect.Run` shown, and ``diagnosis`` its diagnosis.
    """

    def __init__(self) -> None:
        self.errors = widgets.Output()
        self.table_errors = widgets.Output()
        self.card = widgets.HTML(NO_DIAGNOSIS)
        self.timeline_figure: go.Figure | None = None
        self.timeline = widgets.Output()
        self._plot_outputs = {name: widgets.Output() for name in PLOTS}
        self.plots = widgets.Tab(layout={"display": "none"})  # no empty box before a result
        self.table_name = widgets.Dropdown(options=TABLES, value="calls", description="table")
        # the rows change when the ranks are entered (Enter, or leaving the box)
        self.table_ranks = widgets.Text(
            placeholder="all ranks, or 0,3-5", description="ranks", continuous_update=False
        )
        self.table_columns = widgets.SelectMultiple(
            options=[], rows=5, description="columns", layout={"width": "320px"}
        )
        self.table_grouped = widgets.Checkbox(
            value=True, description="a row per group of ranks alike", indent=False
        )
        self.table_group = widgets.Dropdown(
            options=[(EVERY_GROUP, None)], description="group", layout={"flex": "1 1 auto"}
        )
        self.table_info = widgets.HTML("")
        # A grid made for DataFrames: scrolls sideways, sorts and filters in the browser.
        self.table = ITable(**GRID)
        self.table.layout.display = "none"  # no empty outlined grid: shown when it has rows
        self.table_group.observe(
            lambda _: guarded(self.table_errors, self._show_group)(), names="value"
        )
        self._groups: list[plot.RankGroup] = []
        self._grouping = False  # the group list is being remade: its choice is no click
        self._offering = False  # the column list is being remade: likewise
        # choosing a table, ranks, columns or the grouping shows the rows at once
        for choice in (self.table_name, self.table_ranks, self.table_columns, self.table_grouped):
            choice.observe(lambda _: guarded(self.table_errors, self._table_chosen)(), "value")
        self.replay = widgets.Button(
            description="Replay",
            icon="play",
            disabled=True,
            tooltip=f"write {REPRO_NAME}: a small CPU job that freezes the same way",
        )
        self.replay_info = widgets.HTML("")
        self.replay.on_click(lambda _: guarded(self.errors, self.write_replay)())
        self.run: Run | None = None
        self.diagnosis: Diagnosis | None = None
        self._drill = widgets.VBox(
            [
                widgets.HBox(
                    [
                        widgets.VBox([self.table_name, self.table_ranks]),
                        self.table_columns,
                    ]
                ),
                # a group's label is long: the list has the width of the tab
                widgets.HBox([self.table_group, self.table_grouped]),
                self.table_errors,
                self.table_info,
                self.table,
            ]
        )
        super().__init__(
            [
                self.card,
                widgets.HBox([self.replay, self.errors]),
                self.replay_info,
                self.timeline,
                self.plots,
            ]
        )

    def clear(self) -> None:
        """Show nothing: the selected job has no diagnosis yet."""
        self.run = self.diagnosis = None
        self.card.value = NO_DIAGNOSIS
        self.replay.disabled, self.replay_info.value = True, ""
        self.timeline.outputs = ()
        self.plots.children = []
        self.plots.layout.display = "none"

    def load(self, path: str | os.PathLike[str], *, now: float | None = None) -> Diagnosis:
        """Load a run directory or a folder of foreign artifacts, diagnose it and show it."""
        run = load_run(path)
        d = diagnose(run)
        self.show(run, d, now=now)
        return d

    def show(self, run: Run, d: Diagnosis, *, now: float | None = None) -> None:
        """Show ``d`` and the plots of ``run``; ``now`` is where calls in flight end (by default
        the run's last sign of life: a rank waits until its last heartbeat)."""
        self.run, self.diagnosis = run, d
        if now is None and run.ranks["last_event_s"].notna().any():
            now = float(run.ranks["last_event_s"].max())
        self.card.value = d.to_html()
        # A replay needs a collective where the ranks part (a healthy run has none).
        self.replay.disabled = d.verdict == "ok" or d.collective is None
        self.replay_info.value = ""
        culprits = d.culprit_ranks
        divergence = d.collective.to_dict() if d.collective else None
        calls = d.calls  # what the diagnosis was built from: the probe's and the recorder's
        ranks = run.ranks["rank"].dropna().astype(int).tolist()
        # one time origin for the views that count seconds: the run's first event or call
        firsts = [run.events["t_s"].min(), calls["t_start_s"].min()]
        since = min((float(t) for t in firsts if pd.notna(t)), default=None)
        self.timeline_figure = plot.rank_timeline(
            calls,
            culprit_ranks=culprits,
            divergence=divergence,
            now=now,
            ranks=ranks,
            chain=d.chain,
            classes=plot.alike(d),
            since=since,
        )
        set_figure(self.timeline, self.timeline_figure)
        figures: dict[str, go.Figure] = {
            "sequence ladder": plot.sequence_ladder(
                calls, culprit_ranks=culprits, classes=plot.alike(d)
            ),
            "where is everyone": plot.where_is_everyone(
                run.stack_summary, culprit_ranks=culprits, ranks=ranks
            ),
            "merged stacks": plot.merged_stacks(
                run.stacks, run.stack_summary, culprit_ranks=culprits
            ),
            "progress": plot.progress(
                run.events,
                collectives=run.collectives,
                now=now,
                highlight=culprits,
                classes=plot.alike(d),
                since=since,
            ),
        }
        if len(run.nccl_comms) or len(run.nccl):
            figures["NCCL"] = plot.nccl_view(
                run.nccl_comms, run.nccl, culprit_ranks=culprits, classes=plot.alike(d)
            )
        for name, fig in figures.items():
            set_figure(self._plot_outputs[name], fig)
        paths = self._plot_outputs["call paths"]
        if d.first_divergence:
            set_figure(paths, plot.path_tree(d))
        else:
            paths.outputs = (html_output(NO_PARTING),)
        shown = ["call paths", *figures]
        self.plots.children = [*(self._plot_outputs[n] for n in shown), self._drill]
        self.plots.layout.display = "flex"
        self.plots.titles = [*shown, "tables"]
        self.show_rows()

    def static(self) -> list[dict[str, Any]]:
        """What the area shows, as plain notebook outputs that stay in a saved notebook with no
        widget behind them: the card, the timeline, every rank's row of the ranks table."""
        if self.run is None or self.diagnosis is None:
            return []
        # how each rank ended, read now: the run shown may have been read while it ran
        ranks = load_run(self.run.path).ranks
        keep = [c for c in STATIC_RANK_COLUMNS if c in ranks.columns]
        shown = ranks[keep]
        if len(shown) > plot.GROUP_FROM:  # a row per group of ranks that ended alike
            shown, _ = plot.grouped_rows(shown, culprits=self.diagnosis.culprit_ranks, columns=keep)
            keep = list(shown.columns)
        shown = shown.astype(object)
        rows = shown.where(shown.notna(), None).itertuples(index=False)
        body = "".join(
            "<tr>" + "".join(cell(v, style=STATIC_CELL) for v in row) + "</tr>" for row in rows
        )
        return [
            html_output(self.diagnosis.to_html()),
            figure_output(self.timeline_figure),
            html_output(
                "<div style='overflow-x:auto'>"
                f"{table_head(keep, css_class='rankscope-ranks', style=STATIC_CELL)}{body}"
                "</table></div>"
            ),
        ]

    def write_replay(self) -> Path:
        """Write the replay of the run shown into its directory; show its path and header."""
        if self.run is None or self.diagnosis is None:
            raise ValueError("nothing to replay yet: diagnose a job or open a run first")
        replay = build_replay(self.run, diagnosis=self.diagnosis)
        path = replay.write(Path(self.run.path) / REPRO_NAME)
        self.replay_info.value = (
            f"<div class='rankscope-replay'>wrote <code>{html.escape(str(path))}</code>; run it "
            f"with <code>{html.escape(replay.command(path))}</code>"
            f"<pre>{html.escape(replay.header)}</pre></div>"
        )
        return path

    def show_rows(self) -> None:
        """Show the chosen table's rows for the chosen ranks, in the chosen columns (all when
        none is chosen), in the grid. Past :data:`rankscope.plot.GROUP_FROM` ranks (and while
        ``table_grouped`` is ticked), a row per group of rows alike but for their ranks, the
        outliers first; choosing a group in ``table_group`` shows its rows."""
        if self.run is None or self.diagnosis is None:
            raise ValueError("nothing loaded yet: diagnose a job or open a run first")
        name = self.table_name.value
        self._columns_of()
        table, ranks = self._table(), rank_list(self.table_ranks.value)
        many = len(self.run.ranks) > plot.GROUP_FROM and "rank" in table.columns
        groups: list[plot.RankGroup] = []
        if many and self.table_grouped.value:
            rows, groups = plot.grouped_rows(
                table,
                culprits=self.diagnosis.culprit_ranks,
                ranks=ranks,
                columns=self.table_columns.value,
            )
            matched = sum(len(g.rows) for g in groups)
            more = f", the first {len(rows)} shown" if len(groups) > len(rows) else ""
            info = (
                f"<b>{html.escape(name)}</b>: {matched} rows in {len(groups)} "
                f"group{'' if len(groups) == 1 else 's'} of ranks "
                f"alike, the outliers first{more}; choose a group to see its rows"
            )
        else:
            rows, matched = plot.table_rows(table, ranks=ranks, columns=self.table_columns.value)
            more = f", the first {len(rows)} shown" if matched > len(rows) else ""
            # no promise of a search box or sorting: a saved page shows the first rows only
            info = f"<b>{html.escape(name)}</b>: {matched} rows{more}"
        self._grouping = True
        try:
            self._groups = groups
            self.table_group.options = [(EVERY_GROUP, None)] + [
                (f"{g.marked} — {g.what}", i) for i, g in enumerate(groups[:GROUP_CHOICES])
            ]
            self.table_group.index = 0  # "every group" (a value of None would show no choice)
        finally:
            self._grouping = False
        self.table_group.disabled = not groups
        self._put(rows, info, empty=f"<b>{html.escape(name)}</b>: {self._no_rows(ranks)}")

    def _show_group(self) -> None:
        """The rows of the group chosen in ``table_group``; every group's row again for none."""
        if self._grouping:
            return
        if self.table_group.value is None:
            self.show_rows()
            return
        group = self._groups[self.table_group.value]
        rows, matched = plot.table_rows(
            self._table(), at=group.rows, columns=self.table_columns.value
        )
        more = f", the first {len(rows)} shown" if matched > len(rows) else ""
        name = html.escape(self.table_name.value)
        self._put(
            rows,
            f"<b>{name}</b>: the {matched} rows of {html.escape(group.label)}{more}",
            empty=f"<b>{name}</b>: no rows in {html.escape(group.label)}",
        )

    def _table_chosen(self) -> None:
        """Another table, ranks, columns or grouping chosen: the rows at once, once a run is
        shown."""
        if self.run is not None and self.diagnosis is not None and not self._offering:
            self.show_rows()

    def _put(self, rows: pd.DataFrame, info: str, *, empty: str) -> None:
        """Rows into the grid and what they are above it; no rows hide the grid (an empty
        outlined box) and ``empty`` says why instead."""
        self.table_info.value = info if len(rows) else empty
        self.table.update(rows, caption=self.table_name.value, **GRID)
        self.table.layout.display = "" if len(rows) else "none"

    def _no_rows(self, ranks: list[int] | None) -> str:
        """Why the chosen table shows no rows: none for the ranks asked, or none at all."""
        if ranks and len(self._table()):
            return f"no rows for rank{'s' if len(ranks) > 1 else ''} {compact_ranks(ranks)}"
        return "no rows in this run (nothing of this kind was recorded)"

    def _table(self) -> pd.DataFrame:
        """The chosen table: the run's, or ``calls``, the diagnosis's (probe and recorder
        merged)."""
        assert self.run is not None and self.diagnosis is not None
        name = self.table_name.value
        return self.diagnosis.calls if name == "calls" else self.run.table(name)

    def _columns_of(self) -> None:
        """The column choice offers the chosen table's columns (kept if they are the same)."""
        if self.run is None or self.diagnosis is None:
            return
        columns = tuple(self._table().columns)
        if tuple(self.table_columns.options) != columns:
            self._offering = True  # the choice is emptied with the list: no click of the user's
            try:
                self.table_columns.options = columns
            finally:
                self._offering = False
