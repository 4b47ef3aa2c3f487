"""What the panels share: errors shown in an Output, figures as outputs, the scenario catalogue."""

from __future__ import annotations

import functools
import json
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

PLOTLY_MIME = "application/vnd.plotly.v1+json"
#: Exceptions whose message is the whole story (bad input); others show their traceback too.
USER_ERRORS = (ValueError, FileNotFoundError, RuntimeError, TimeoutError)


def report(errors: widgets.Output, exc: BaseException) -> None:
    """Show ``exc`` in ``errors``: its message, and the traceback for an unexpected one.

    ``append_stderr`` sets the Output's state directly, so this works from any thread.
    """
    text = "".join(traceback.format_exception_only(type(exc), exc))
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
    """The scenario catalogue (:func:`rankscope.scenarios.catalogue`), empty where it is
    missing. Entries have ``id``, ``title``, ``path``, ``args``, ``nproc_per_node``, ``nnodes``,
    ``presets`` and ``stall_timeout_s``."""
    try:
        from rankscope.scenarios import catalogue
    except ImportError:
        return []
    return catalogue()
