"""rankscope: a Jupyter workbench for distributed PyTorch hangs.

The everyday path::

    import rankscope
    job = rankscope.Job(rankscope.JobSpec(script="train.py", nproc_per_node=4)).start()
    run = rankscope.load_run(job.run.path)   # or any folder of dumps and logs
    rankscope.diagnose(run)                  # which rank, which collective, why, what to do
    rankscope.show(run)                      # the views; rankscope.Workbench() for the whole UI

The package root stays light (the probe imports it inside every rank); the public names below are
loaded on first use.
"""

from __future__ import annotations

import logging
from importlib import import_module
from typing import Any

__version__ = "0.1.0"

# Quiet unless the application configures logging: the watchdog's and the supervisor's decisions
# go to the "rankscope.*" loggers (a job's supervisor writes its own to supervisor.log).
logging.getLogger(__name__).addHandler(logging.NullHandler())

_LAZY = {
    "Diagnosis": "rankscope.analyze",
    "diagnose": "rankscope.analyze",
    "load_run": "rankscope.collect",
    "Run": "rankscope.collect",
    "Job": "rankscope.launch",
    "JobSpec": "rankscope.launch",
    "PRESETS": "rankscope.launch",
    "RunDir": "rankscope.rundir",
    "Workbench": "rankscope.widgets",
    "show": "rankscope.widgets",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rankscope' has no attribute {name!r}")
    return getattr(import_module(module), name)


def load_ipython_extension(shell: Any) -> None:
    """``%load_ext rankscope``: the ``%ranks`` and ``%%ranks`` magics (:mod:`rankscope.cells`)."""
    from rankscope.cells import load_ipython_extension as load

    load(shell)


__all__ = ["__version__", *_LAZY]
