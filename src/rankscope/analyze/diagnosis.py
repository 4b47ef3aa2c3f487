"""The :class:`Diagnosis` of one job: what it is, its JSON form, its terminal form, its file.

The JSON keys ``verdict``, ``cause``, ``culprit_ranks``, ``waiting_ranks``, ``recipe``,
``summary``, ``collective`` (``pg``, ``pg_ranks``, ``seq``, ``op_by_rank``, ``site_by_rank``),
``chain``, ``parting`` (``site``, ``source``, ``kind``, ``ranks_in``, ``ranks_out``,
``values``, ``text``) and ``first_divergence`` (``pg``, ``seq``, ``culprits``, ``classes``,
``text``) are read by other tools: keep them stable. JSON objects have string keys,
so the per-rank maps are keyed ``"0"``, ``"1"``, ...
"""

from __future__ import annotations

import html
import os
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from rankscope.analyze.causes import CAUSES, Verdict

if TYPE_CHECKING:
    from rankscope.analyze.context import Context
from rankscope.rundir import RunDir, atomic_write_json
from rankscope.state import compact_ranks, group_name, shapes_text

#: Version of the JSON layout written to diagnosis.json.
FORMAT = 1
#: The card's colour for each verdict.
VERDICT_COLOURS = {
    "ok": "#2ca02c",
    "hang": "#d62728",
    "crash": "#d62728",
    "launch_error": "#ff7f0e",
    "unknown": "#7f7f7f",
}
#: How the card and its table look, wherever they are shown (a notebook, a widget, the site):
#: nothing wider than its box, cells padded, short values on one line.
CARD_CSS = (
    ".rankscope-card{box-sizing:border-box;max-width:100%;overflow-x:auto;"
    "overflow-wrap:anywhere;line-height:1.45}"
    ".rankscope-card p{margin:0.35em 0}"
    ".rankscope-card code{font-size:0.92em;background:rgba(0,0,0,0.05);padding:0 3px;"
    "border-radius:3px;overflow-wrap:anywhere}"
    "table.rankscope-collective{border-collapse:collapse;margin:4px 0;width:auto;"
    "max-width:100%}"
    "table.rankscope-collective th,table.rankscope-collective td{padding:3px 8px;"
    "text-align:left;white-space:nowrap;border:none;border-bottom:1px solid #e4e4e4;"
    "vertical-align:top}"
)
#: The same for one cell, inline: a notebook's own table style (right-aligned, unpadded in
#: some front ends) and a sanitiser that drops ``<style>`` cannot undo it.
COLLECTIVE_COLUMNS = ("rank", "called", "at", "shapes", "state")
CELL_STYLE = "padding:3px 8px;text-align:left;white-space:nowrap;border-bottom:1px solid #e4e4e4"
_BACKTICKS = re.compile(r"`([^`]+)`")


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
    """The call's state in every view's words (:func:`rankscope.state.state_words`:
    ``completed``, ``failed``, ``issued, waiting``, ``issued, never completed: ...``), or for
    a rank that never made the call ``never called it: ...`` and what it did instead."""
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
    parting: dict[str, Any] | None = None
    """The line of the user's code that sent the culprits another way
    (:class:`rankscope.analyze.parting.Parting` as a dict: ``site``, ``source``, ``kind``,
    ``ranks_in``, ``ranks_out``, ``into``, ``left_loop``, ``values``, ``env``, ``text``); None
    where the evidence cannot tell (a note says why)."""
    first_divergence: dict[str, Any] | None = None
    """Where the ranks' paths first parted (:class:`rankscope.analyze.paths.FirstDivergence`
    as a dict: ``pg``, ``pg_desc``, ``seq``, ``kind``, ``step``, ``culprits``, ``decided_by``,
    ``extra``, ``classes`` (each ``ranks``, ``op``, ``site``, ``path``, ``culprit``), ``text``);
    None where every rank's calls followed one path."""
    evidence: list[EvidenceRef] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    """Evidence that was not there (ranks without dumps, unreadable files, ...)."""
    notes: list[str] = field(default_factory=list)
    """Other facts worth knowing (what torchrun named as root cause, ...)."""
    run: str | None = None
    diagnosed_at: float = field(default_factory=time.time, compare=False)
    """When it was made (seconds since the epoch): a live job's evidence changes."""
    calls: pd.DataFrame | None = field(default=None, repr=False, compare=False)
    """The calls table the diagnosis was built from (:data:`rankscope.schema.CALLS`: the
    probe's and the flight recorder's calls merged); not part of the JSON."""
    context: Context | None = field(default=None, repr=False, compare=False)
    """The facts it was derived from (:class:`~rankscope.analyze.context.Context`: the calls,
    each group's members, the wait-for graph, each rank's facts), for the views and the replay
    to read rather than derive again; not part of the JSON."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (see the module docstring for the stable keys)."""
        return {
            "format": FORMAT,
            "verdict": None if self.verdict is None else str(self.verdict),
            "cause": None if self.cause is None else str(self.cause),
            "culprit_ranks": list(self.culprit_ranks),
            "waiting_ranks": list(self.waiting_ranks),
            "recipe": self.recipe,
            "summary": self.summary,
            "reason": self.reason,
            "fix": self.fix,
            "collective": self.collective.to_dict() if self.collective else None,
            "chain": [dict(link) for link in self.chain],
            "parting": dict(self.parting) if self.parting else None,
            "first_divergence": self.first_divergence,
            "evidence": [asdict(ref) for ref in self.evidence],
            "missing": list(self.missing),
            "notes": list(self.notes),
            "run": self.run,
            "diagnosed_at": self.diagnosed_at,
        }

    def to_html(self) -> str:
        """The diagnosis as an HTML card: verdict, cause and recipe, culprits, the collective
        where the ranks part (what each rank called, from where), why, and the fix."""
        colour = VERDICT_COLOURS.get(self.verdict, "#7f7f7f")
        head = f"<b>{self.verdict.upper()}</b>"
        if self.cause:
            head += f": {html.escape(self.cause_title or '')}"
        if self.recipe:
            head += f" <span style='color:#555'>(recipe {html.escape(self.recipe)})</span>"
        parts = [f"<div style='font-size:1.25em;color:{colour}'>{head}</div>"]
        if self.culprit_ranks:
            noun = "Culprit rank" if len(self.culprit_ranks) == 1 else "Culprit ranks"
            waiting = compact_ranks(self.waiting_ranks)
            parts.append(
                f"<div class='rankscope-culprits' style='font-size:1.15em'>{noun} "
                f"<b style='color:#d62728'>{compact_ranks(self.culprit_ranks)}</b>"
                + (f" · waiting: {waiting}" if waiting else "")
                + "</div>"
            )
        if self.parting:
            parts.append(
                "<div class='rankscope-parting' style='font-size:1.1em;margin:6px 0'>"
                f"<b>Where they parted:</b> {_inline(self.parting['text'])}</div>"
            )
        if self.first_divergence:
            parts.append(
                "<div class='rankscope-first' style='margin:4px 0'>"
                f"<b>Where their paths first parted:</b> "
                f"{_inline(self.first_divergence['text'])}</div>"
            )
        parts.append(f"<p>{_inline(self.summary)}</p>")
        if self.collective is not None:
            parts.append(self._collective_html())
        for label, text in (("Why", self.reason), ("Fix", self.fix)):
            if text and text not in self.summary:
                parts.append(f"<p><b>{label}:</b> {_inline(text)}</p>")
        parts += [f"<p style='color:#555'>note: {_inline(n)}</p>" for n in self.notes]
        parts += [f"<p style='color:#555'>missing: {_inline(m)}</p>" for m in self.missing]
        parts.append(
            f"<p class='rankscope-provenance' style='color:#777;font-size:0.85em'>"
            f"{html.escape(self.provenance())}</p>"
        )
        return (
            f"<style>{CARD_CSS}</style><div class='rankscope-card' style='border-left:6px solid "
            f"{colour};padding:4px 12px;margin:4px 0'>{''.join(parts)}</div>"
        )

    def _repr_html_(self) -> str:
        return self.to_html()

    def provenance(self) -> str:
        """When it was made and from which evidence.

        ``diagnosed 19:42:07 from calls (ranks 0-3), stacks (ranks 1, 3) of runs/20261126-...``.
        """
        when = time.strftime("%H:%M:%S", time.localtime(self.diagnosed_at))
        by_table: dict[str, set[int]] = {}
        for ref in self.evidence:
            ranks = by_table.setdefault(ref.table, set())
            if ref.rank is not None:
                ranks.add(int(ref.rank))
        cited = ", ".join(
            f"{table} (ranks {compact_ranks(ranks)})" if ranks else table
            for table, ranks in by_table.items()
        )
        text = f"diagnosed {when} from " + (cited or "no cited evidence row")
        return text + (f" of {os.path.basename(self.run)}" if self.run else "")

    def _collective_html(self) -> str:
        c = self.collective
        assert c is not None

        # Ranks that did the same share a row (a 16k-rank job is a few rows), culprits first.
        alike: dict[tuple[bool, str, str, str, str], list[int]] = {}
        for rank in sorted(set(c.op_by_rank) | set(c.site_by_rank)):
            key = (
                rank in self.culprit_ranks,
                c.op_by_rank.get(rank) or "(none recorded)",
                c.site_by_rank.get(rank) or "unknown",
                shapes_text(c.shapes_by_rank.get(rank)) if c.shapes_by_rank.get(rank) else "",
                c.state_by_rank.get(rank, ""),
            )
            alike.setdefault(key, []).append(rank)
        rows = []
        for (culprit, *cells), ranks in sorted(alike.items(), key=lambda kv: not kv[0][0]):
            style = " style='color:#d62728;font-weight:bold'" if culprit else ""
            rows.append(
                f"<tr{style}>"
                + "".join(
                    f"<td style='{CELL_STYLE}'>{_inline(str(x))}</td>"
                    for x in [compact_ranks(ranks), *cells]
                )
                + "</tr>"
            )
        number = f"#{c.seq} " if c.seq is not None else ""
        return (
            f"<div>Collective {number}on {html.escape(group_name(c.pg, c.pg_desc, c.pg_ranks))}, ranks "
            f"{compact_ranks(c.pg_ranks)}</div><table class='rankscope-collective'>"
            + "<tr>"
            + "".join(f"<th style='{CELL_STYLE}'>{h}</th>" for h in COLLECTIVE_COLUMNS)
            + "</tr>"
            + "".join(rows)
            + "</table>"
        )

    @property
    def cause_title(self) -> str | None:
        """The cause as a person reads it (its title: ``rank-conditional collective``), never
        its key (``rank_conditional_collective``, the ``cause`` of the JSON): what every text
        a person reads (the card, :meth:`render`, the workbench's status lines) names."""
        if not self.cause:
            return None
        known = CAUSES.get(str(self.cause))
        return known.title if known is not None else str(self.cause).replace("_", " ")

    def render(self) -> str:
        """A few lines for a terminal."""
        head = self.verdict.upper()
        if self.cause:
            head += f": {self.cause_title}"
        if self.recipe:
            head += f" (recipe {self.recipe})"
        lines = [head]
        if self.parting:
            lines.append(f"parted: {self.parting['text']}")
        if self.first_divergence:
            lines.append(f"first parted: {self.first_divergence['text']}")
        lines.append(self.summary)
        if self.culprit_ranks or self.waiting_ranks:
            lines.append(
                f"culprit ranks: {_ranks(self.culprit_ranks)}; "
                f"waiting ranks: {_ranks(self.waiting_ranks)}"
            )
        c = self.collective
        if c is not None:
            number = f", #{c.seq}" if c.seq is not None else ""
            name = group_name(c.pg, c.pg_desc, c.pg_ranks)
            lines.append(f"collective: {name}{number}, ranks {_ranks(c.pg_ranks)}")
            one_op = len({op for op in c.op_by_rank.values() if op}) == 1
            shapes = one_op and len(set(c.shapes_by_rank.values())) > 1
            dtypes = one_op and len(set(c.dtypes_by_rank.values())) > 1
            alike: dict[tuple[str, str], list[int]] = {}
            for rank in sorted(c.op_by_rank):
                op, site = c.op_by_rank[rank], c.site_by_rank.get(rank)
                what = ((op or "") + (f" at {site}" if site else "")).strip()
                if op and shapes:
                    what += f" shapes {shapes_text(c.shapes_by_rank.get(rank))}"
                if op and dtypes:
                    what += f" dtypes {c.dtypes_by_rank.get(rank)}"
                alike.setdefault((what, c.state_by_rank.get(rank, "")), []).append(rank)
            # the culprits' lines first: the outliers, then the many who did the same
            culprits = set(self.culprit_ranks)
            for (what, state), ranks in sorted(
                alike.items(), key=lambda kv: not culprits.intersection(kv[1])
            ):
                who = ("rank " if len(ranks) == 1 else "ranks ") + _ranks(ranks)
                lines.append("  " + ": ".join(p for p in (who, what, state) if p))
        if self.chain:
            lines.append("chain: " + "; ".join(link["text"] for link in self.chain))
        if self.fix:
            lines.append(f"fix: {self.fix}")
        lines += [f"note: {n}" for n in self.notes]
        lines += [f"missing: {m}" for m in self.missing]
        return "\n".join(lines)


def _inline(text: str) -> str:
    """Text for the card: escaped, what is in backticks shown as code."""
    return _BACKTICKS.sub(r"<code>\1</code>", html.escape(text))


def _ranks(ranks: list[int]) -> str:
    return compact_ranks(ranks) or "none"


def who_of(ranks: Iterable[int], empty: str = "no rank") -> str:
    """``rank 3``, ``ranks 0-2, 5``, or ``empty`` for none."""
    ranks = sorted(ranks)
    if not ranks:
        return empty
    return ("rank " if len(ranks) == 1 else "ranks ") + compact_ranks(ranks)


def write_diagnosis(run_dir: str | os.PathLike[str] | RunDir, diagnosis: Diagnosis) -> Path:
    """Write ``diagnosis.json`` into the run directory atomically; return its path."""
    path = (run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)).diagnosis_json
    atomic_write_json(path, diagnosis.to_dict())
    return path
