"""The live panel of one job: every rank's state, its log tail, and stop / capture / diagnose."""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from typing import Any

import ipywidgets as widgets

from rankscope import plot
from rankscope.analyze.diagnosis import compact_ranks
from rankscope.collect import load_run
from rankscope.launch import Job
from rankscope.launch.job import state_text
from rankscope.launch.tracker import doing_now
from rankscope.rundir import FINAL_STATES
from rankscope.state import BAD_STATUSES, STATUSES, STEP_LABEL
from rankscope.widgets._common import cells as row_cells
from rankscope.widgets._common import table_head

#: Row colours by rank status (rankscope.state.STATUSES): its own failures red, an end by
#: another's teardown or a stop grey.
STATUS_COLOURS = {
    "waiting": "#fdd9a0",
    "exiting": "#fdeeb0",
    **dict.fromkeys(BAD_STATUSES, "#f4b6b6"),
    **dict.fromkeys(("exited", "ended", "stopped"), "#e6e6e6"),
}
COLUMNS = (
    "rank",
    "status",
    STEP_LABEL,
    "done",
    "now",
    "last completed",
    "heartbeat s",
    "end",
)
LOG_LINES = 40
NO_JOB = "<i>no job selected</i>"
#: Past this many ranks, the logs are one rank's at a time, chosen in a list, not a tab each.
TABS_UP_TO = 32
#: The order of statuses in the grouped table: what went wrong first.
STATUS_ORDER = STATUSES
_SECONDS = re.compile(r"(\d+(?:\.\d+)?) s\b")


def snapshot_groups(
    rows: list[dict[str, Any]], *, culprits: Iterable[int] = ()
) -> list[plot.RankGroup]:
    """The snapshots of :meth:`rankscope.launch.Job.ranks` grouped by state
    (:func:`rankscope.plot.rank_groups`): status, what they do now (durations aside), the last
    collective they completed and how they ended; a group of culprits alone first, then by
    status (dead and failed first), then the smaller groups."""
    return plot.rank_groups(rows, key=_state, culprits=culprits, first=_worst_first)


def _state(r: dict[str, Any]) -> tuple[Any, ...]:
    return (
        r["status"],
        _SECONDS.sub("… s", doing_now(r)),  # durations differ between ranks alike
        r.get("last_done"),
        r.get("end") or "",
    )


_STATUS_RANK = {s: i for i, s in enumerate(STATUS_ORDER)}


def _worst_first(key: tuple[Any, ...]) -> int:
    return _STATUS_RANK.get(key[0], len(_STATUS_RANK))


def ranks_html(
    rows: list[dict[str, Any]],
    *,
    culprits: Iterable[int] = (),
    group_from: int = plot.GROUP_FROM,
    expand: str | None = None,
) -> str:
    """One table row per rank snapshot of :meth:`rankscope.launch.Job.ranks`: what it does now
    (waiting in a collective since when, or the line its main thread is at) apart from the
    last collective it completed; a ``node`` column where the ranks run on SLURM nodes; the
    ``culprits`` of a diagnosis marked. Every column has a fixed width, so the table does not
    move between refreshes; a long value ends in an ellipsis and shows whole on hover.

    Past ``group_from`` ranks, one row per group of ranks alike (the outliers first; steps,
    counts and durations as ranges), and the rows of the group whose label is ``expand`` under
    it."""
    nodes = any(r.get("node") for r in rows)
    bad = set(culprits)
    columns = (COLUMNS[0], "node", *COLUMNS[1:]) if nodes else COLUMNS
    if len(rows) <= group_from:
        body = [_rank_row(r, bad, nodes) for r in rows]
    else:
        body = []
        for group in snapshot_groups(rows, culprits=bad):
            body.append(_group_row(group, bad, nodes, open_=group.label == expand))
            if group.label == expand and len(group.rows) > 1:
                body += [_rank_row(r, bad, nodes, inner=True) for r in group.rows]
    return (
        "<div style='max-height:360px;overflow:auto'>"
        f"{table_head(columns, css_class='rankscope-ranks')}{''.join(body)}</table></div>"
    )


def _rank_row(r: dict[str, Any], bad: set[int], nodes: bool, *, inner: bool = False) -> str:
    cells = (
        f"{r['rank']} ⚑ culprit" if r["rank"] in bad else r["rank"],
        *((_blank(r.get("node")),) if nodes else ()),
        r["status"],
        _blank(r.get("step")),
        r.get("done", 0),
        doing_now(r),
        _blank(r.get("last_done")),
        _seconds(r.get("heartbeat_age_s")),
        r.get("end") or "",
    )
    colour = STATUS_COLOURS.get(r["status"], "white")
    mark = f";outline:2px solid {plot.ALERT}" if r["rank"] in bad else ""
    indent = ";font-size:90%;opacity:0.85" if inner else ""
    columns = (COLUMNS[0], "node", *COLUMNS[1:]) if nodes else COLUMNS
    return f"<tr style='background:{colour}{mark}{indent}'>" + row_cells(columns, cells) + "</tr>"


def _group_row(group: plot.RankGroup, bad: set[int], nodes: bool, *, open_: bool) -> str:
    if len(group.rows) == 1:
        return _rank_row(group.rows[0], bad, nodes)
    rows = group.rows
    status, now, last_done, exit_ = group.key
    columns = (COLUMNS[0], "node", *COLUMNS[1:]) if nodes else COLUMNS
    ages = [r["heartbeat_age_s"] for r in rows if r.get("heartbeat_age_s") is not None]
    culprits = sorted(set(group.ranks) & bad)
    label = f"{'▾' if open_ else '▸'} {len(rows)} ranks"
    if culprits:
        label += f" ⚑ culprit {compact_ranks(culprits)}"
    cells = (
        *((_span([r.get("node") for r in rows], count=True),) if nodes else ()),
        status,
        _span([r.get("step") for r in rows]),
        _span([r.get("done", 0) for r in rows]),
        _now_span(rows, now),
        _blank(last_done),
        f"up to {max(ages):.1f}" if ages else "",
        exit_,
    )
    colour = STATUS_COLOURS.get(status, "white")
    mark = f";outline:2px solid {plot.ALERT}" if culprits else ""
    # the count in the cell, which ranks on hover (and in the list that opens the group)
    which = html.escape(group.label)
    return (
        f"<tr style='background:{colour}{mark};font-weight:600'>"
        f"<td title='{which}'>{html.escape(label)}</td>"
        + row_cells((c for c in columns if c != "rank"), cells)
        + "</tr>"
    )


def _span(values: list[Any], *, count: bool = False) -> str:
    """``12`` or ``11-12`` (numbers), or how many distinct values (``count``: nodes)."""
    known = sorted({v for v in values if v is not None})
    if not known:
        return ""
    if count:
        return str(known[0]) if len(known) == 1 else f"{len(known)} nodes"
    return str(known[0]) if known[0] == known[-1] else f"{known[0]}-{known[-1]}"


def _now_span(rows: list[dict[str, Any]], now: str) -> str:
    """What the group does now, its first duration as the range over its ranks."""
    seconds = [float(m[0]) for r in rows if (m := _SECONDS.findall(doing_now(r)))]
    if "… s" not in now or not seconds:
        return now
    low, high = min(seconds), max(seconds)
    span = f"{low:.1f} s" if high - low < 0.05 else f"{low:.1f}-{high:.1f} s"
    return now.replace("… s", span, 1)


def _blank(value: Any) -> Any:
    return "" if value is None else value


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


class LivePanel(widgets.VBox):
    """Every rank of the selected job, refreshed by the workbench's background thread.

    Attributes:
        header: the job's name, state and run directory.
        ranks: the per-rank table (state, step, collectives done, what it does now, the last
            collective it completed, heartbeat age, exit code or signal).
        culprits: ranks to mark in the table (the workbench sets them from a diagnosis).
        stop: stop the job; ``capture``: capture evidence from every rank now; ``diagnose``:
            diagnose the job now (the workbench connects them).
        status: beside the buttons, what the last of them did (a capture's id and what it
            gathered, when the diagnosis was made); ``errors``: what went wrong with it.
        expand: past :data:`rankscope.plot.GROUP_FROM` ranks, whose ranks to list under their
            group's row.
        logs: one tab per rank with the tail of its stdout and stderr; past
            :data:`TABS_UP_TO` ranks, one tab for the rank chosen in ``log_rank`` (the outliers
            first).
        rows: the latest per-rank snapshot shown.
    """

    def __init__(self) -> None:
        self.header = widgets.HTML(NO_JOB)
        self.ranks = widgets.HTML()
        # Buttons keep their width when the status line beside them grows.
        fixed = {"flex": "0 0 auto", "width": "auto"}
        self.stop = widgets.Button(
            description="Stop", button_style="danger", icon="stop", layout=fixed
        )
        self.capture = widgets.Button(description="Capture evidence", icon="camera", layout=fixed)
        self.diagnose = widgets.Button(
            description="Diagnose", button_style="info", icon="search", layout=fixed
        )
        self.expand = widgets.Dropdown(
            description="ranks of", options=[("no group", None)], layout={"display": "none"}
        )
        self.expand.observe(lambda _: self._show_ranks(), "value")
        self.log_rank = widgets.Dropdown(description="log of", layout={"display": "none"})
        self.log_rank.observe(lambda _: self._show_log(), "value")
        self.logs = widgets.Tab()
        self._logs: Any = None
        self.status = widgets.HTML("")
        self.status.add_class("rankscope-status")
        self.errors = widgets.Output()
        self.rows: list[dict[str, Any]] = []
        self.culprits: set[int] = set()
        super().__init__(
            [
                self.header,
                widgets.HBox([self.stop, self.capture, self.diagnose, self.status]),
                self.errors,
                self.expand,
                self.ranks,
                self.log_rank,
                self.logs,
            ]
        )

    def clear(self, text: str) -> None:
        """Show no job, only ``text`` (a job being launched): nothing of the last one lingers."""
        self.header.value = text
        self.ranks.value = self.status.value = ""
        self.errors.outputs = ()
        self.rows = []
        self.logs.children = []
        self._logs = None
        self.expand.layout.display = self.log_rank.layout.display = "none"
        self.stop.disabled = self.capture.disabled = True

    def update(self, job: Job) -> None:
        """Show what ``job`` is doing now (called from the workbench's refresh thread)."""
        # The rows first, then the state: a header read after the rows is never older than them.
        self.rows = job.ranks()
        job.status()  # reconciles a job whose supervisor vanished
        info = job.info()  # run.json, read once for the whole refresh
        state = state_text(info, self.rows)
        waiting = sum(r["status"] == "waiting" for r in self.rows)
        countdown = ""
        idle = job.idle_s()
        if waiting and idle is not None and info["state"] == "running":
            countdown = (
                f" · <b>no progress for {idle:.1f} s</b> (a stall at "
                f"{job.spec.stall_timeout_s:g} s)"
            )
        self.header.value = (
            f"<b>{html.escape(job.run.path.name)}</b> · <b>{html.escape(state)}</b> · "
            f"{len(self.rows)} ranks, {waiting} waiting in a collective{countdown} · "
            f"<code>{html.escape(str(job.run.path))}</code>"
        )
        self._show_ranks()
        # Stop and Capture act on live processes only; Diagnose reads the run at any time.
        ended = info["state"] in FINAL_STATES
        self.stop.disabled = self.capture.disabled = ended
        self._update_logs(job)

    def _show_ranks(self) -> None:
        """The ranks table; past :data:`rankscope.plot.GROUP_FROM` ranks grouped, with the
        ``expand`` list's choices kept to the groups of more than one rank."""
        grouped = len(self.rows) > plot.GROUP_FROM
        groups = snapshot_groups(self.rows, culprits=self.culprits) if grouped else []
        options = [("no group", None)] + [(g.label, g.label) for g in groups if len(g.rows) > 1]
        if list(self.expand.options) != options:
            keep = self.expand.value if self.expand.value in dict(options).values() else None
            self.expand.options, self.expand.value = options, keep
        self.expand.layout.display = "" if grouped else "none"
        self.ranks.value = ranks_html(self.rows, culprits=self.culprits, expand=self.expand.value)

    def _update_logs(self, job: Job) -> None:
        self._logs = load_run(job.run.path).logs
        ranks = [r["rank"] for r in self.rows]
        if len(ranks) > TABS_UP_TO:  # one rank's log at a time, the outliers first in the list
            order = [
                rank for g in snapshot_groups(self.rows, culprits=self.culprits) for rank in g.ranks
            ]
            options = [(f"rank {rank}", rank) for rank in order]
            if list(self.log_rank.options) != options:
                keep = self.log_rank.value if self.log_rank.value in order else order[0]
                self.log_rank.options, self.log_rank.value = options, keep
            self.log_rank.layout.display = ""
            self._show_log()
            return
        self.log_rank.layout.display = "none"
        if len(self.logs.children) != len(ranks):
            self.logs.children = [widgets.HTML() for _ in ranks]
            self.logs.titles = [f"rank {r}" for r in ranks]
        for rank, view in zip(ranks, self.logs.children, strict=True):
            view.value = self._log_html(rank)

    def _show_log(self) -> None:
        rank = self.log_rank.value
        if rank is None or self._logs is None:
            return
        if len(self.logs.children) != 1:
            self.logs.children = [widgets.HTML()]
        self.logs.titles = [f"rank {rank}"]
        self.logs.children[0].value = self._log_html(rank)

    def _log_html(self, rank: int) -> str:
        text = plot.log_tail(self._logs, rank=rank, lines=LOG_LINES)
        return f"<pre style='max-height:240px;overflow:auto'>{html.escape(text)}</pre>"
