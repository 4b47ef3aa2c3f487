"""The :class:`Diagnosis` of one job: what it is, its JSON form, its terminal form, its file.

The JSON keys ``verdict``, ``cause``, ``culprit_ranks``, ``waiting_ranks``, ``recipe``,
``summary``, ``collective`` (``pg``, ``pg_ranks``, ``seq``, ``op_by_rank``, ``site_by_rank``)
and ``chain`` are read by other tools: keep them stable. JSON objects have string keys, so the
per-rank maps are keyed ``"0"``, ``"1"``, ...
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from rankscope.analyze.catalogue import Verdict
from rankscope.rundir import RunDir, atomic_write_json

#: Version of the JSON layout written to diagnosis.json.
FORMAT = 1


@dataclass(kw_only=True)
class CollectiveInfo:
    """The collective where the ranks diverged (or the call a cycle or straggler is about)."""

    pg: str
    """Process-group name as torch names it (``"0"`` is the world group)."""
    pg_desc: str | None
    pg_ranks: list[int]
    seq: int | None
    """The collective's number on its group: the n-th collective (probe: recorded calls,
    point-to-point left out; flight recorder: ``collective_seq_id``), or a p2p call's number."""
    op_by_rank: dict[int, str | None]
    """What each rank called there; ``None`` for a rank that never made the call."""
    site_by_rank: dict[int, str | None]
    """Where: the call's ``file:line``, or, for a rank that never made it, where it was."""
    shapes_by_rank: dict[int, str | None] = field(default_factory=dict)
    dtypes_by_rank: dict[int, str | None] = field(default_factory=dict)
    state_by_rank: dict[int, str] = field(default_factory=dict)
    """``completed``, ``waiting``, ``failed``, or what a rank that never made the call did."""
    source: str = "collectives"
    """Which table the calls come from: ``collectives`` (the probe) or ``flight_recorder``."""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key, value in data.items():
            if isinstance(value, dict):
                data[key] = {str(r): v for r, v in sorted(value.items())}
        return data


@dataclass(frozen=True, kw_only=True)
class EvidenceRef:
    """One row of a collected table that supports the diagnosis."""

    table: str
    row: int
    """Position of the row in the table as :func:`rankscope.collect.load_run` returns it."""
    rank: int | None
    note: str


@dataclass(kw_only=True)
class Diagnosis:
    """What went wrong with a job, who caused it, who waited, and what to do about it."""

    verdict: Verdict
    cause: str | None
    """A key of :data:`rankscope.analyze.CAUSES`, or ``None`` for a healthy job."""
    culprit_ranks: list[int]
    waiting_ranks: list[int]
    recipe: str | None
    """The recipe of the guide (``"D21"``) that covers the cause, if one does."""
    summary: str
    reason: str = ""
    fix: str = ""
    collective: CollectiveInfo | None = None
    chain: list[dict[str, Any]] = field(default_factory=list)
    """The waits that lead to the culprits, nearest first: each ``{rank, ranks, waits_in,
    waits_for, text}``, ``waits_in`` the call (``pg``, ``pg_desc``, ``seq``, ``op``, ``site``,
    ``thread``, ``peer``) or None for a culprit that waits in nothing."""
    evidence: list[EvidenceRef] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    """Evidence that was not there (ranks without dumps, unreadable files, ...)."""
    notes: list[str] = field(default_factory=list)
    """Other facts worth knowing (what torchrun named as root cause, ...)."""
    run: str | None = None
    calls: pd.DataFrame | None = field(default=None, repr=False, compare=False)
    """The calls table the diagnosis was built from (:data:`rankscope.schema.CALLS`: the
    probe's and the flight recorder's calls merged); not part of the JSON."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (see the module docstring for the stable keys)."""
        return {
            "format": FORMAT,
            "verdict": self.verdict,
            "cause": self.cause,
            "culprit_ranks": list(self.culprit_ranks),
            "waiting_ranks": list(self.waiting_ranks),
            "recipe": self.recipe,
            "summary": self.summary,
            "reason": self.reason,
            "fix": self.fix,
            "collective": self.collective.to_dict() if self.collective else None,
            "chain": [dict(link) for link in self.chain],
            "evidence": [asdict(ref) for ref in self.evidence],
            "missing": list(self.missing),
            "notes": list(self.notes),
            "run": self.run,
        }

    def render(self) -> str:
        """A few lines for a terminal."""
        head = self.verdict.upper()
        if self.cause:
            head += f": {self.cause}"
        if self.recipe:
            head += f" (recipe {self.recipe})"
        lines = [head, self.summary]
        if self.culprit_ranks or self.waiting_ranks:
            lines.append(
                f"culprit ranks: {_ranks(self.culprit_ranks)}; "
                f"waiting ranks: {_ranks(self.waiting_ranks)}"
            )
        c = self.collective
        if c is not None:
            desc = f" ({c.pg_desc})" if c.pg_desc else ""
            number = f", #{c.seq}" if c.seq is not None else ""
            lines.append(f"collective: group {c.pg}{desc}{number}, ranks {_ranks(c.pg_ranks)}")
            one_op = len({op for op in c.op_by_rank.values() if op}) == 1
            shapes = one_op and len(set(c.shapes_by_rank.values())) > 1
            dtypes = one_op and len(set(c.dtypes_by_rank.values())) > 1
            alike: dict[tuple[str, str], list[int]] = {}
            for rank in sorted(c.op_by_rank):
                op, site = c.op_by_rank[rank], c.site_by_rank.get(rank)
                what = ((op or "") + (f" at {site}" if site else "")).strip()
                if op and shapes:
                    what += f" shapes {c.shapes_by_rank.get(rank)}"
                if op and dtypes:
                    what += f" dtypes {c.dtypes_by_rank.get(rank)}"
                alike.setdefault((what, c.state_by_rank.get(rank, "")), []).append(rank)
            for (what, state), ranks in alike.items():
                who = ("rank " if len(ranks) == 1 else "ranks ") + _ranks(ranks)
                lines.append("  " + ": ".join(p for p in (who, what, state) if p))
        if self.chain:
            lines.append("chain: " + "; ".join(link["text"] for link in self.chain))
        if self.fix:
            lines.append(f"fix: {self.fix}")
        lines += [f"note: {n}" for n in self.notes]
        lines += [f"missing: {m}" for m in self.missing]
        return "\n".join(lines)


def _ranks(ranks: list[int]) -> str:
    return compact_ranks(ranks) or "none"


def compact_ranks(ranks: Iterable[int]) -> str:
    """``0-3, 5, 7-9``: sorted ranks with runs collapsed."""
    ranks = sorted(set(ranks))
    parts = []
    start = 0
    for i in range(1, len(ranks) + 1):
        if i == len(ranks) or ranks[i] != ranks[i - 1] + 1:
            first, last = ranks[start], ranks[i - 1]
            parts.append(str(first) if first == last else f"{first}-{last}")
            start = i
    return ", ".join(parts)


def write_diagnosis(run_dir: str | os.PathLike[str] | RunDir, diagnosis: Diagnosis) -> Path:
    """Write ``diagnosis.json`` into the run directory atomically; return its path."""
    path = (run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)).diagnosis_json
    atomic_write_json(path, diagnosis.to_dict())
    return path
