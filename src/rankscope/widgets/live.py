"""The live panel of one job: every rank's state, its log tail, and stop / capture / diagnose."""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Any

import ipywidgets as widgets

from rankscope import plot
from rankscope.collect import load_run
from rankscope.launch import Job
from rankscope.launch.job import state_text
from rankscope.launch.tracker import doing_now, exit_text
from rankscope.rundir import FINAL_STATES
from rankscope.widgets._common import cell, table_head

#: Row colours by rank status (rankscope.launch.tracker.rank_status).
STATUS_COLOURS = {"waiting": "#fdd9a0", "dead": "#f4b6b6", "failed": "#f4b6b6", "exited": "#e6e6e6"}
COLUMNS = (
    "rank",
    "status",
    "step",
    "done",
    "now",
    "last completed",
    "heartbeat s",
    "exit",
)
LOG_LINES = 40
NO_JOB = "<i>no job selected</i>"


def ranks_html(rows: list[dict[str, Any]], *, culprits: Iterable[int] = ()) -> str:
    """One table row per rank snapshot of :meth:`rankscope.launch.Job.ranks`: what it does now
    (waiting in a collective since when, or the line its main thread is at) apart from the
    last collective it completed; a ``node`` column where the ranks run on SLURM nodes; the
    ``culprits`` of a diagnosis marked. Every column has a fixed width, so the table does not
    move between refreshes; a long value ends in an ellipsis and shows whole on hover."""
    nodes = any(r.get("node") for r in rows)
    bad = set(culprits)
    body = []
    for r in rows:
        cells = (
            f"{r['rank']} ⚑ culprit" if r["rank"] in bad else r["rank"],
            *((_blank(r.get("node")),) if nodes else ()),
            r["status"],
            _blank(r.get("step")),
            r.get("done", 0),
            doing_now(r),
            _blank(r.get("last_done")),
            _seconds(r.get("heartbeat_age_s")),
            exit_text(r.get("exit_code")),
        )
        colour = STATUS_COLOURS.get(r["status"], "white")
        mark = f";outline:2px solid {plot.ALERT}" if r["rank"] in bad else ""
        body.append(f"<tr style='background:{colour}{mark}'>" + "".join(map(cell, cells)) + "</tr>")
    columns = (COLUMNS[0], "node", *COLUMNS[1:]) if nodes else COLUMNS
    return (
        "<div style='max-height:360px;overflow:auto'>"
        f"{table_head(columns, css_class='rankscope-ranks')}{''.join(body)}</table></div>"
    )


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
        logs: one tab per rank with the tail of its stdout and stderr.
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
        self.logs = widgets.Tab()
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
                self.ranks,
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
        self.stop.disabled = self.capture.disabled = True

    def update(self, job: Job) -> None:
        """Show what ``job`` is doing now (called from the workbench's refresh thread)."""
        # The rows first, then the state: a header read after the rows is never older than them.
        self.rows = job.ranks()
        job.status()  # reconciles a job whose supervisor vanished
        info = job.info()  # run.json, read once for the whole refresh
        state = state_text(info)
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
        self.ranks.value = ranks_html(self.rows, culprits=self.culprits)
        # Stop and Capture act on live processes only; Diagnose reads the run at any time.
        ended = info["state"] in FINAL_STATES
        self.stop.disabled = self.capture.disabled = ended
        self._update_logs(job)

    def _update_logs(self, job: Job) -> None:
        logs = load_run(job.run.path).logs
        ranks = [r["rank"] for r in self.rows]
        if len(self.logs.children) != len(ranks):
            self.logs.children = [widgets.HTML() for _ in ranks]
            self.logs.titles = [f"rank {r}" for r in ranks]
        for rank, view in zip(ranks, self.logs.children, strict=True):
            text = plot.log_tail(logs, rank=rank, lines=LOG_LINES)
            view.value = f"<pre style='max-height:240px;overflow:auto'>{html.escape(text)}</pre>"
