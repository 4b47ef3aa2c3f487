"""Collectors: every per-rank artifact of a run as a pandas table with a documented schema.

``load_run(path)`` opens a rankscope run directory or any folder of artifacts copied from
elsewhere and returns a :class:`Run` whose tables (``run.events``, ``run.collectives``,
``run.logs``, ``run.nccl``, ``run.flight_recorder``, ``run.stacks``, ``run.errors``, ...) load on
first use. The readers below work on lists of files, for use without a run. Column names and
dtypes are declared in :mod:`rankscope.schema`; every table is checked against them.

Artifacts may come from someone else's machine: pickles are read with a restricted unpickler that
builds only plain containers and scalars, nothing is ``eval``'d, and a file that cannot be read
becomes a row of ``run.problems`` instead of an exception.

The names below load on first use, so that the flight-recorder worker processes, which import
``rankscope.collect._fr_parse``, start without pandas.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankscope.collect._common import Problems, Source, code_type, first_rows
    from rankscope.collect.errors import Known, find_errors, read_errors, recognise
    from rankscope.collect.events import read_collectives, read_events, read_paths
    from rankscope.collect.flight_recorder import (
        read_flight_recorder,
        read_fr_frames,
        read_pg_status,
    )
    from rankscope.collect.logs import read_logs
    from rankscope.collect.nccl import read_nccl, read_nccl_comms
    from rankscope.collect.run import Run, latest_dumps, load_run
    from rankscope.collect.signatures import SIGNATURES, VICTIM_ROLES, Signature, victims_words
    from rankscope.collect.stacks import (
        is_user_file,
        latest_captures,
        read_stacks,
        short_site,
        summarize_stacks,
    )
    from rankscope.collect.values import read_values

_LAZY = {
    "Problems": "rankscope.collect._common",
    "Source": "rankscope.collect._common",
    "code_type": "rankscope.collect._common",
    "first_rows": "rankscope.collect._common",
    "find_errors": "rankscope.collect.errors",
    "read_errors": "rankscope.collect.errors",
    "recognise": "rankscope.collect.errors",
    "Known": "rankscope.collect.errors",
    "read_collectives": "rankscope.collect.events",
    "read_paths": "rankscope.collect.events",
    "read_events": "rankscope.collect.events",
    "read_flight_recorder": "rankscope.collect.flight_recorder",
    "read_fr_frames": "rankscope.collect.flight_recorder",
    "read_pg_status": "rankscope.collect.flight_recorder",
    "read_logs": "rankscope.collect.logs",
    "read_nccl": "rankscope.collect.nccl",
    "read_nccl_comms": "rankscope.collect.nccl",
    "Run": "rankscope.collect.run",
    "latest_dumps": "rankscope.collect.run",
    "load_run": "rankscope.collect.run",
    "SIGNATURES": "rankscope.collect.signatures",
    "VICTIM_ROLES": "rankscope.collect.signatures",
    "Signature": "rankscope.collect.signatures",
    "victims_words": "rankscope.collect.signatures",
    "is_user_file": "rankscope.collect.stacks",
    "latest_captures": "rankscope.collect.stacks",
    "read_stacks": "rankscope.collect.stacks",
    "short_site": "rankscope.collect.stacks",
    "summarize_stacks": "rankscope.collect.stacks",
    "read_values": "rankscope.collect.values",
}

__all__ = [
    "SIGNATURES",
    "VICTIM_ROLES",
    "Known",
    "Problems",
    "Run",
    "Signature",
    "Source",
    "code_type",
    "find_errors",
    "first_rows",
    "is_user_file",
    "latest_captures",
    "latest_dumps",
    "load_run",
    "read_collectives",
    "read_errors",
    "read_events",
    "read_flight_recorder",
    "read_fr_frames",
    "read_logs",
    "read_nccl",
    "read_nccl_comms",
    "read_paths",
    "read_pg_status",
    "read_stacks",
    "read_values",
    "recognise",
    "short_site",
    "summarize_stacks",
    "victims_words",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rankscope.collect' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
