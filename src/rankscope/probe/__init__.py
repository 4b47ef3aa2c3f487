"""In-rank probe: heartbeats, collective enter/exit, flight-recorder and stack dumps.

Imports only the standard library and torch; it runs inside the user's training process. The
package itself imports nothing: its names load :mod:`rankscope.probe._core` (and torch) on first
use, so that a rank's entry point (:mod:`rankscope.probe.bootstrap`) decides how torch is
imported.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = ["COLLECTIVES", "Probe", "capture", "current", "install", "step"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'rankscope.probe' has no attribute {name!r}")
    return getattr(import_module("rankscope.probe._core"), name)
