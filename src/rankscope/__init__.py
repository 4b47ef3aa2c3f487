"""rankscope: a Jupyter workbench for distributed PyTorch hangs.

The package root stays light (the probe imports it inside every rank); the public names below are
loaded on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_LAZY = {
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


__all__ = ["__version__", *_LAZY]
