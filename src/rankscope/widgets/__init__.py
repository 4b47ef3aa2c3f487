"""The Jupyter workbench (ipywidgets): launch jobs, watch every rank live, see what went wrong.

``rankscope.Workbench()`` is the whole UI; ``rankscope.show(path)`` opens the results area for a
finished run or a folder of foreign artifacts. Every panel is one class whose controls are
attributes (tests set ``.value`` and call ``.click()``); callbacks only call the public API of
:mod:`rankscope.launch`, :mod:`rankscope.collect`, :mod:`rankscope.analyze` and
:mod:`rankscope.plot`, and every error lands in an ``Output`` of the panel. This is the only
package that imports ipywidgets, and nothing imports it.

Figures are ``plotly.graph_objects.Figure`` shown in ``Output`` widgets as plotly's JSON mime type
(rendered by the ``jupyterlab-plotly`` extension that ships with plotly): ``FigureWidget`` would
need ``anywidget`` as well.
"""

from __future__ import annotations

import os

from rankscope.widgets.form import LaunchForm
from rankscope.widgets.live import LivePanel
from rankscope.widgets.results import ResultsPanel
from rankscope.widgets.workbench import Workbench


def show(path: str | os.PathLike[str]) -> ResultsPanel:
    """The results area for a run directory or a folder of foreign artifacts: the diagnosis
    card, the plots and the tables, loaded now.

    Raises:
        ValueError: ``path`` is not a folder.
    """
    panel = ResultsPanel()
    panel.load(path)
    return panel


__all__ = ["LaunchForm", "LivePanel", "ResultsPanel", "Workbench", "show"]
