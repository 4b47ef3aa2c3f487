"""Diagnosis: one calls sequence per rank, a wait-for graph across every process group, the
root of the waits, the cause from what the culprit was doing, and the recipe.

``diagnose(run)`` takes the tables of :func:`rankscope.collect.load_run` (or a path to load) and
returns a :class:`Diagnosis`; ``write_diagnosis`` stores it as ``diagnosis.json``. The layers,
each usable on plain tables:

* :mod:`~rankscope.analyze.calls`: the probe's and the flight recorder's calls merged into one
  table (:data:`rankscope.schema.CALLS`);
* :mod:`~rankscope.analyze.align`: where the ranks' sequences part on each group;
* :mod:`~rankscope.analyze.waits`: the wait-for graph, its roots and cycles;
* :mod:`~rankscope.analyze.activity`: what a rank outside the collectives was doing (stacks);
* :mod:`~rankscope.analyze.parting`: the line of the source that sent the culprits another way,
  and the values that decided it (stacks, source, the ``values`` table);
* :mod:`~rankscope.analyze.rules`: the rules, in order; :mod:`~rankscope.analyze.context`, the
  facts they read; :mod:`~rankscope.analyze.driver`, the driver.
"""

from rankscope.analyze.align import (
    Divergence,
    arrival_spread,
    find_divergences,
    group_members,
    last_calls,
)
from rankscope.analyze.calls import (
    calls_from_flight_recorder,
    calls_from_probe,
    fr_sites,
    merge_calls,
)
from rankscope.analyze.causes import CAUSES, VERDICTS, Cause
from rankscope.analyze.diagnosis import CollectiveInfo, Diagnosis, EvidenceRef, write_diagnosis
from rankscope.analyze.driver import diagnose
from rankscope.analyze.parting import Parting, find_parting
from rankscope.analyze.rules import RULES
from rankscope.analyze.waits import WaitGraph, wait_graph
from rankscope.schema import CALLS

__all__ = [
    "CALLS",
    "CAUSES",
    "RULES",
    "VERDICTS",
    "Cause",
    "CollectiveInfo",
    "Diagnosis",
    "Divergence",
    "EvidenceRef",
    "Parting",
    "WaitGraph",
    "arrival_spread",
    "calls_from_flight_recorder",
    "calls_from_probe",
    "diagnose",
    "find_divergences",
    "find_parting",
    "fr_sites",
    "group_members",
    "last_calls",
    "merge_calls",
    "wait_graph",
    "write_diagnosis",
]
