"""What the panels share: errors shown in an Output, figures as outputs, the scenario catalogue."""

from __future__ import annotations

import functools
import html
import json
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

PLOTLY_MIME = "application/vnd.plotly.v1+json"
#: Exceptions whose message is the whole story (bad input); others show their traceback too.
USER_ERRORS = (ValueError, FileNotFoundError, RuntimeError, TimeoutError)


#: Width of each column kind of the rank tables (the live panel's, a closed workbench's), in
#: em: fixed, so that a refresh or a culprit's mark never moves a column. The columns of
#: :data:`FLEXIBLE` share what is left of the width (at least :data:`FLEXIBLE_EM` each).
COLUMN_WIDTHS = {
    "rank": 7,
    "ranks": 18,  # a group's: "1023 ranks: 0-516, 518-1023"
    "node": 7,
    "status": 5.5,
    "step marked": 8.5,  # rankscope.state.STEP_LABEL
    "done": 4.5,
    "last completed": 14,
    "heartbeat s": 8,
    "end": 14,
    "host": 9,
    "pid": 6,
    "exit_code": 7.5,
    "signal": 7.5,
}
FLEXIBLE = ("now", "end", "end_reason")
#: Columns whose whole text matters (what a rank waits in, at which line, for how long; how it
#: ended): they wrap onto a second line rather than end in "…".
WRAPPED = ("now", "end")
FLEXIBLE_EM = 10
#: The rank tables: fixed layout, padded cells, one line per row (the long ones end in "…").
TABLE_CSS = (
    "table.rankscope-ranks{border-collapse:collapse;table-layout:fixed;width:100%;"
    "margin:2px 0}"
    "table.rankscope-ranks th,table.rankscope-ranks td{padding:3px 8px;text-align:left;"
    "white-space:nowrap;overflow:hidden;text-overflow:ellipsis;border:none;"
    "border-bottom:1px solid #e4e4e4}"
    "table.rankscope-ranks th{font-weight:600;border-bottom:1px solid #999}"
    "table.rankscope-ranks td.wrap{white-space:normal;overflow:visible;"
    "overflow-wrap:anywhere}"
)


def table_head(columns: Iterable[str], *, css_class: str, style: str = "") -> str:
    """The opening of a table with :data:`TABLE_CSS`, a fixed width per column kind
    (:data:`COLUMN_WIDTHS`) and a header row (its cells' ``style`` inline); rows and
    ``</table>`` follow."""
    columns = list(columns)
    widths = [None if c in FLEXIBLE else COLUMN_WIDTHS.get(c, 8) for c in columns]
    least = sum(w or FLEXIBLE_EM for w in widths)
    cols = "".join("<col>" if w is None else f"<col style='width:{w}em'>" for w in widths)
    inline = f" style='{style};font-weight:600'" if style else ""
    head = "".join(f"<th{inline}>{html.escape(c)}</th>" for c in columns)
    return (
        f"<style>{TABLE_CSS}</style><table class='{css_class}' style='min-width:{least}em'>"
        f"<colgroup>{cols}</colgroup><tr>{head}</tr>"
    )


def cell(value: Any, *, style: str = "", wrap: bool = False) -> str:
    """A table cell; its whole text on hover, for one cut short by its column's width;
    ``style`` inline (for a notebook's output, whose own table style would win); ``wrap``:
    its text wraps instead (a column of :data:`WRAPPED`)."""
    text = html.escape("" if value is None else str(value))
    inline = f" style='{style}'" if style else ""
    if wrap:
        inline += " class='wrap'"
    return f"<td title='{text}'{inline}>{text}</td>"


def cells(columns: Iterable[str], values: Iterable[Any]) -> str:
    """A row's cells, those of :data:`WRAPPED` columns wrapping."""
    return "".join(cell(v, wrap=c in WRAPPED) for c, v in zip(columns, values, strict=True))


def report(errors: widgets.Output, exc: BaseException) -> None:
    """Show ``exc`` in ``errors``: its message, and the traceback for an unexpected one.

    ``append_stderr`` sets the Output's state directly, so this works from any thread.
    """
    # bad input: its message, which says what to change (no "ValueError:" before it)
    text = f"{exc}\n"
    if not isinstance(exc, USER_ERRORS):
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    errors.append_stderr(text)


def guarded(errors: widgets.Output, action: Callable[..., Any]) -> Callable[..., None]:
    """``action`` with any exception it raises shown in ``errors`` instead of lost. ``errors``
    sits beside the control that runs the action: what it said of the last try is cleared
    when the user tries again."""

    @functools.wraps(action)
    def run(*args: Any, **kwargs: Any) -> None:
        errors.outputs = ()
        try:
            action(*args, **kwargs)
        except Exception as exc:
            report(errors, exc)

    return run


def report_failure(errors: widgets.Output, future: Future[Any]) -> None:
    """Done-callback for background actions: show what went wrong, if anything did."""
    exc = future.exception()
    if exc is not None:
        report(errors, exc)


def figure_output(fig: go.Figure) -> dict[str, Any]:
    """A display_data output holding ``fig`` for JupyterLab's plotly renderer.

    Built here rather than by IPython's display machinery so that a background thread can set
    it, and so that it does not depend on plotly's renderer guess for the environment.
    """
    title = fig.layout.title.text or "figure"
    return {
        "output_type": "display_data",
        "data": {PLOTLY_MIME: json.loads(fig.to_json()), "text/plain": f"<plotly figure: {title}>"},
        "metadata": {},
    }


def html_output(text: str) -> dict[str, Any]:
    """A display_data output holding HTML (what stays in a saved notebook)."""
    return {"output_type": "display_data", "data": {"text/html": text}, "metadata": {}}


def set_figure(out: widgets.Output, fig: go.Figure) -> None:
    """Replace what ``out`` shows with ``fig``."""
    out.outputs = (figure_output(fig),)


def scenarios() -> list[Any]:
    """The scenario catalogue (:func:`rankscope.scenarios.catalogue`). Entries have ``id``,
    ``title``, ``path``, ``args``, ``nproc_per_node``, ``nnodes``, ``presets`` and
    ``stall_timeout_s``."""
    from rankscope.scenarios import catalogue

    return catalogue()
