"""Diagnosis: align every rank's collectives per process group, find where they part, say why.

``diagnose(run)`` takes the tables of :func:`rankscope.collect.load_run` (or a path to load) and
returns a :class:`Diagnosis`; ``write_diagnosis`` stores it as ``diagnosis.json``. The alignment
helpers work on plain tables, for notebooks that want to look themselves.
"""

from rankscope.analyze.align import (
    CALLS,
    Divergence,
    arrival_spread,
    calls_from_flight_recorder,
    calls_from_probe,
    find_divergences,
    fr_sites,
    group_members,
    last_calls,
)
from rankscope.analyze.catalogue import CAUSES, VERDICTS, Cause
from rankscope.analyze.diagnose import diagnose
from rankscope.analyze.diagnosis import CollectiveInfo, Diagnosis, EvidenceRef, write_diagnosis

__all__ = [
    "CALLS",
    "CAUSES",
    "VERDICTS",
    "Cause",
    "CollectiveInfo",
    "Diagnosis",
    "Divergence",
    "EvidenceRef",
    "arrival_spread",
    "calls_from_flight_recorder",
    "calls_from_probe",
    "diagnose",
    "find_divergences",
    "fr_sites",
    "group_members",
    "last_calls",
    "write_diagnosis",
]
