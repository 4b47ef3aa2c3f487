"""A process's first import of torch, without Python's cyclic collector walking it.

torch's import makes about 170,000 objects the collector tracks (modules, functions, registered
kernels and decompositions), most of them alive as long as the process. While it runs, each full
pass of the collector walks all of those made so far, and every full pass after it walks them
again: torch._dynamo's import, which torch does at a rank's first optimizer, pays for them once
more, and so does the interpreter's last collection at exit. :func:`import_settled` imports with
the collector paused, then moves everything alive to the collector's permanent generation
(``gc.freeze``), where no pass looks: on torch 2.13, 0.6 s less CPU time for a process that
imports torch and exits (2.5 s against 3.1), and 1 s less when it also imports torch._dynamo
(``bench/startup.py``). Objects are freed by their reference counts as before; what the collector
no longer sees is cyclic garbage made before the freeze.

Only for a process's start, before any code of the user's runs: frozen objects of the user's
would never be collected. Standard library only.
"""

from __future__ import annotations

import gc
from importlib import import_module
from types import ModuleType


def import_settled(name: str) -> ModuleType:
    """Import ``name`` with the collector paused, then freeze what is alive."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        module = import_module(name)
    finally:
        if was_enabled:
            gc.enable()
    gc.freeze()
    return module
