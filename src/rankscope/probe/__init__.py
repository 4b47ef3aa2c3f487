"""In-rank probe: heartbeats, collective enter/exit, flight-recorder and stack dumps.

Imports only the standard library and torch; it runs inside the user's training process.
"""

from rankscope.probe._core import COLLECTIVES, Probe, capture, current, install, step

__all__ = ["COLLECTIVES", "Probe", "capture", "current", "install", "step"]
