"""The words of a diagnosis: what the card and the render say of the facts a
:class:`~rankscope.analyze.context.Context` derived (a collective's description and its ranks'
states, the evidence references, the chain of waits, what evidence is missing, how the other
ranks ended, what the launcher said). :class:`Phrasing` is the part of a ``Context`` that phrases;
the module's functions phrase single values. Nothing here derives a fact or decides a cause.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from rankscope._values import as_float
from rankscope.analyze import align
from rankscope.analyze.calls import done, opt
from rankscope.analyze.diagnosis import CollectiveInfo, EvidenceRef, who_of
from rankscope.analyze.evidence import SIGNAL_TEXT, Evidence, RankFacts
from rankscope.analyze.waits import WaitGraph
from rankscope.collect import SIGNATURES, VICTIM_ROLES
from rankscope.state import NEVER, agree, group_name, state_words

if TYPE_CHECKING:
    from rankscope.analyze.context import Where

#: How many supporting rows of one kind a diagnosis lists (a 16k-rank job has 16k waiters).
MAX_REFS = 8


#: What each error signature means, to explain a rank that died of another's problem.
SIGNATURE_DOCS = {s.kind: s.doc for s in SIGNATURES}


def site_of(sites: pd.Series, rows: pd.DataFrame) -> str | None:
    values = sites.loc[rows.index].dropna().unique().tolist()
    return "/".join(map(str, values)) or None


def at(site: str | None) -> str:
    """`` at train.py:12``, or nothing when the site is unknown."""
    return f" at {site}" if site else ""


def clock(t_s: float | None) -> str | None:
    """``12:43:05.812`` (local time), or None."""
    if t_s is None or not np.isfinite(t_s):
        return None
    return dt.datetime.fromtimestamp(t_s).strftime("%H:%M:%S.%f")[:-3]


#: What a native error text puts before its message: ``what():``, ``[enforce fail at x.cc:1]``,
#: ``[/path/to/pair.cc:537]``.
_NATIVE_PREFIX = re.compile(
    r"^(?:what\(\):\s*)?(?:(?P<type>[\w.:]+: )?\[(?:enforce fail at )?[^\]\s]*:\d+\]\s*)?"
)


def short(text: Any, limit: int = 200) -> str:
    text = "" if text is None or (isinstance(text, float) and np.isnan(text)) else str(text)
    text = _NATIVE_PREFIX.sub(lambda m: m["type"] or "", text.strip().split("\n", 1)[0])
    return text if len(text) <= limit else text[: limit - 3] + "..."


def error_refs(errors: pd.DataFrame, note: str) -> list[EvidenceRef]:
    return [
        EvidenceRef(
            table="errors", row=int(pos), rank=None if pd.isna(r) else int(r), note=f"{k}: {note}"
        )
        for pos, r, k in zip(errors.index[:MAX_REFS], errors["rank"], errors["kind"], strict=False)
    ]


class Phrasing:
    """The sentences of a :class:`~rankscope.analyze.context.Context`, from its facts (which
    that class derives: the attributes below, and ``sites``, ``whereabouts``, ``known_absent``)."""

    ev: Evidence
    complete_ranks: align.Complete
    facts: dict[int, RankFacts]
    calls: pd.DataFrame
    source: str
    members: dict[str, tuple[int, ...]]
    evidence_ranks: set[int]
    graph: WaitGraph
    notes_of_sites: list[str]

    def label(self, d: align.Divergence) -> str:
        desc = d.rows["pg_desc"].dropna()
        name = group_name(d.pg, str(desc.iloc[0]) if len(desc) else None, d.members)
        return f"{name}, collective #{d.seq}"

    def collective(
        self,
        d: align.Divergence,
        *,
        sites: pd.Series | None = None,
        absent: dict[int, Where] | None = None,
    ) -> CollectiveInfo:
        rows = d.rows
        sites = self.sites(rows) if sites is None else sites
        ranks = sorted(set(d.members) | set(rows["rank"].tolist()))
        op = dict.fromkeys(ranks)
        site: dict[int, str | None] = dict.fromkeys(ranks)
        state: dict[int, str] = {}
        states = rows["state"].astype(str).tolist()  # every view's (rankscope.state)
        for r, o, s, st in zip(rows["rank"], rows["op"], sites, states, strict=True):
            op[int(r)] = str(o)
            site[int(r)] = opt(s)
            died = (self.facts.get(int(r)) or RankFacts(rank=int(r))).died
            state[int(r)] = state_words(st, ended=died or None)
        absent = dict(absent or {})
        unknown = [r for r in ranks if r not in state and r not in absent]
        absent.update(self.whereabouts(r for r in unknown if r in self.evidence_ranks))
        for r in ranks:
            if r in state:
                continue
            f = self.facts.get(r) or RankFacts(rank=r)
            if r not in self.evidence_ranks:
                state[r] = "no record of this rank's calls" + (f" ({f.died})" if f.died else "")
                continue
            site[r] = absent[r].site
            if f.cell is not None and f.cell_state == "finished" and absent[r].state != "exited":
                # a cell session's rank between cells: idle in its engine, not in the user's code
                state[r] = f"{NEVER} called it: done with cell [{f.cell}], waiting for the next"
            elif self.known_absent(r, d.pg):
                state[r] = f"{NEVER} called it: {absent[r].note}"
            elif d.pg in self.complete_ranks.by_recorder:
                state[r] = (
                    f"no record of it (only the flight recorder numbers this group's calls, "
                    f"and this rank's was not dumped): {absent[r].note}"
                )
            else:
                state[r] = (
                    f"no record of it (its record may stop early: no ring file, no end "
                    f"event): {absent[r].note}"
                )
        desc = rows["pg_desc"].dropna()
        sources = set(rows["source"].astype(str))
        return CollectiveInfo(
            pg=d.pg,
            pg_desc=str(desc.iloc[0]) if len(desc) else None,
            pg_ranks=list(d.members),
            seq=d.seq,
            op_by_rank=op,
            site_by_rank=site,
            shapes_by_rank={
                int(r): opt(s) for r, s in zip(rows["rank"], rows["shapes"], strict=True)
            },
            dtypes_by_rank={
                int(r): opt(s) for r, s in zip(rows["rank"], rows["dtypes"], strict=True)
            },
            state_by_rank=state,
            source=sources.pop() if len(sources) == 1 else self.source,
        )

    def call_refs(self, d: align.Divergence) -> list[EvidenceRef]:
        rows = d.rows
        keys = rows["key"]
        common = keys.mode().iloc[0] if len(keys) else None
        odd = rows[keys != common]
        usual = rows[keys == common].head(MAX_REFS)
        out = []
        for part in (odd, usual):
            for r, row, op, source, fine in zip(
                part["rank"], part["row"], part["op"], part["source"], done(part), strict=True
            ):
                note = f"{op} #{d.seq} on group {d.pg}" + ("" if fine else ", not completed")
                out.append(EvidenceRef(table=str(source), row=int(row), rank=int(r), note=note))
        return out

    def call_ref(self, position: int, note: str) -> EvidenceRef:
        """The evidence reference of the call at ``calls.iloc[position]``."""
        row = self.calls.iloc[position]
        return EvidenceRef(
            table=str(row["source"]), row=int(row["row"]), rank=int(row["rank"]), note=note
        )

    def chain(self, culprits: list[int]) -> list[dict[str, Any]]:
        """The waits that lead to the culprits, nearest first: the ranks that wait for them
        directly, the culprits' own wait (or what they were doing), then the ranks that wait
        for those waiters, and so on. Ranks that wait the same way for the same ranks share a
        link. Each link: ``rank`` (the first), ``ranks``, ``waits_in`` (group, seq, op, site,
        thread, peer; None for a rank that waits in nothing), ``waits_for``, ``text``."""
        g = self.graph
        if not g.waits:
            return []
        targets = set(culprits)
        seen = set(targets)
        levels: list[list[dict[str, Any]]] = []
        frontier = targets
        while frontier:
            waiters = [r for r in g.waiting if r not in seen and g.waits[r].waits_for & frontier]
            if not waiters:
                break
            links: dict[tuple[Any, ...], list[int]] = {}
            for r in waiters:
                w = g.waits[r]
                links.setdefault((w.where(), tuple(sorted(w.waits_for & frontier))), []).append(r)
            levels.append(
                [
                    self._link(ranks, g.waits[ranks[0]], list(waits_for))
                    for (_, waits_for), ranks in links.items()
                ]
            )
            seen |= set(waiters)
            frontier = set(waiters)
        own = []
        waiting = {c: g.waits[c] for c in sorted(targets) if c in g.waits}
        alike: dict[tuple[str, tuple[int, ...]], list[int]] = {}
        for c, w in waiting.items():
            alike.setdefault((w.where(), tuple(sorted(w.waits_for))), []).append(c)
        for (_, waits_for), ranks in alike.items():
            own.append(self._link(ranks, waiting[ranks[0]], list(waits_for)))
        doing: dict[str, list[int]] = {}
        for c, where in self.whereabouts(sorted(targets - set(waiting))).items():
            doing.setdefault(where.note, []).append(c)
        for note, ranks in doing.items():
            own.append(
                {
                    "rank": ranks[0],
                    "ranks": ranks,
                    "waits_in": None,
                    "waits_for": [],
                    "text": f"{who_of(ranks)}: {note}",
                }
            )
        first = levels[0] if levels else []
        return first + own + [link for level in levels[1:] for link in level]

    @staticmethod
    def _link(ranks: list[int], w: Any, waits_for: list[int]) -> dict[str, Any]:
        who = who_of(ranks)
        verb = agree(who, "waits", "wait")
        return {
            "rank": ranks[0],
            "ranks": sorted(ranks),
            "waits_in": w.as_dict(),
            "waits_for": waits_for,
            "text": f"{who} {verb} in {w.where()} for {who_of(waits_for)}",
        }

    def capture_gaps(self) -> list[str]:
        """What the stall captures asked for and did not get in time: ranks that did not
        answer by the capture's deadline, and ranks that answered only after its unstretched
        timeout (the load it measured stretched it)."""
        notes = []
        for stall in self.ev.stalls:
            if not isinstance(stall, dict):
                continue
            cid = stall.get("capture_id")
            deadline = as_float(stall.get("capture_deadline_s"))
            within = f" within its deadline ({deadline:.1f} s)" if deadline is not None else ""
            missing = _ranks_of(stall.get("missing"))
            late = [r for r in _ranks_of(stall.get("late")) if r not in missing]
            if missing:
                notes.append(
                    f"{who_of(missing)} did not answer the stall's capture {cid}{within}: "
                    "what it shows of them is older, or from the job's end"
                )
            if late:
                notes.append(
                    f"{who_of(late)} answered the stall's capture {cid} late (the machine was "
                    f"loaded): {agree(who_of(late), 'its', 'their')} evidence is there"
                )
        return notes

    def late_evidence(self, ranks: list[int]) -> str:
        """``; rank 1 did not answer the stall's capture 1 within its deadline (4.0 s)``
        where the last stall's capture missed any of ``ranks``; else nothing."""
        stall = self.ev.stalls[-1] if self.ev.stalls else None
        if not isinstance(stall, dict):
            return ""
        gone = [r for r in _ranks_of(stall.get("missing")) if r in ranks]
        if not gone:
            return ""
        deadline = as_float(stall.get("capture_deadline_s"))
        within = f" within its deadline ({deadline:.1f} s)" if deadline is not None else ""
        return (
            f"; {who_of(gone)} did not answer the stall's capture {stall.get('capture_id')}{within}"
        )

    def unreadable(self) -> list[str]:
        problems = self.ev.table("problems")
        return [
            f"{source}: {reason}"
            for source, reason in zip(problems["source"], problems["reason"], strict=True)
        ]

    def missing(self) -> list[str]:
        """What evidence is not there: ranks without records, ranks whose record stops early
        (and why it may), and (then) the files that could not be read, which may be why.
        Listing unreadable files loads every table, so it is done only when something is
        missing."""
        notes: list[str] = []
        world = sorted(set(self.ev.world).union(*self.members.values()))
        lacking = [r for r in world if r not in self.evidence_ranks]
        if lacking:
            notes.append(f"no record of the calls of {who_of(lacking)} (no probe events, no dump)")
        if not world:
            notes.append("no rank left any evidence")
        if self.calls.empty:
            notes.append(
                "no record of collective calls (neither probe events nor flight-recorder entries)"
            )
        early: dict[str, list[int]] = {}
        for rank in world:
            if rank in lacking:
                continue
            note = self._early_stop(self.facts.get(rank) or RankFacts(rank=rank))
            if note:
                early.setdefault(note, []).append(rank)
        notes += [f"{who_of(ranks)}: {note}" for note, ranks in early.items()]
        events = self.ev.table("events")
        dropped = events[events["ev"] == "dropped"]
        rows = zip(dropped["rank"], dropped["t_s"], dropped["message"], strict=True)
        for rank, t_s, message in rows:
            back = clock(None if pd.isna(t_s) else float(t_s))
            notes.append(
                f"rank {rank}: its probe could not write part of its record ({message}; "
                f"writing again from {back or 'an unknown time'}): its calls and events of "
                "that time are unknown"
            )
        notes += self.capture_gaps()
        if self.untimed_nccl:
            notes.append(
                f"{who_of(self.untimed_nccl)}: the flight recorder kept no start times (nccl "
                "without TORCH_NCCL_ENABLE_TIMING=1), so whether an uncompleted collective "
                "started on the device is unknown; rankscope run and rankscope.probe.install() "
                "turn it on"
            )
        if notes:
            notes += [f"could not read {text}" for text in self.unreadable()]
        return notes + self.notes_of_sites

    def _early_stop(self, f: RankFacts) -> str | None:
        """Why a rank's evidence may stop before its end, if it may."""
        if f.signal == "SIGKILL":
            kept = (
                "its calls up to its death are in its ring file"
                if f.ring
                else "its last calls (up to half a second of them) may be missing: it has no "
                "ring file"
            )
            if f.stack_reason == "SIGTERM":
                # a SIGTERM handler of the script's or its framework's (Lightning's) took the
                # stop's signal and the process lived on until the SIGKILL
                return (
                    "it outlived its SIGTERM (a handler of its own or of its framework took the "
                    "signal) and was killed by SIGKILL: its stacks and flight-recorder dump are "
                    f"from the SIGTERM; {kept}"
                )
            return (
                "no stacks or flight-recorder dump from its last moment: a process killed by "
                f"SIGKILL cannot write them; {kept}"
            )
        if f.started and f.exit_code is not None and not f.record_complete:
            at = clock(f.last_seen_s)
            return (
                f"its record of calls stops{' at ' + at if at else ''} with no end event and "
                "no ring file: calls after that are unknown"
            )
        if f.signal in SIGNAL_TEXT and f.stack_reason != f.signal:
            return f"no stacks from its {f.signal}: faulthandler was not on (not probed?)"
        return None

    def endings(self, ranks: dict[int, RankFacts]) -> str:
        """``rank 2 died of SIGKILL (exit code -9), then ranks 0-1, 3 died of SIGTERM ...``:
        how ranks ended, grouped by how, the first to go first (by their last records)."""
        by_how: dict[str, list[int]] = {}
        for r, f in sorted(ranks.items(), key=lambda kv: (kv[1].last_seen_s or np.inf, kv[0])):
            by_how.setdefault(f.died or "ended", []).append(r)
        return ", then ".join(f"{who_of(rs)} {how}" for how, rs in by_how.items())

    def aftermath(self, culprits: list[int], *, only: list[int] | None = None) -> list[str]:
        """How the other ranks that did not exit cleanly ended, and what their own error texts
        say of it (a victim's text names a peer's mismatch, exit or timeout)."""
        errors = self.ev.table("errors")
        notes = []
        for rank, f in sorted(self.facts.items()):
            if rank in culprits or not f.died or (only is not None and rank not in only):
                continue
            if only is None and self.ev.stopped and f.signal:
                continue  # ended by the stop, as every rank was
            mine = errors[(errors["rank"] == rank) & errors["role"].isin(list(VICTIM_ROLES))]
            how = f.died
            if f.end_reason and f.signal and f.end_reason == f.signal:
                how += " and left a capture (stacks, flight recorder)"
            text = f"rank {rank} {how}"
            if len(mine):
                kind = str(mine["kind"].iloc[0])
                # the error's own words, not the key of the text it matched
                text += f' after it reported "{short(mine["message"].iloc[0], 100)}"'
                text += f", which says {SIGNATURE_DOCS[kind]}" if kind in SIGNATURE_DOCS else ""
            notes.append(text)
        return notes

    def launcher_notes(self, culprits: list[int]) -> list[str]:
        """What the launcher or the scheduler said of how the job ended, where it adds to the
        finding: torchrun's root cause when it names another rank, SLURM ending the job."""
        notes = []
        info = self.ev.info
        slurm_job = (info.get("slurm") or {}).get("job_id")
        if slurm_job and info.get("state") != "failed_to_start" and info.get("error"):
            notes.append(f"{info['error']} (run.json)")
        errors = self.ev.table("errors")
        child = errors[errors["kind"] == "torchrun_child_failed"]
        for fields in child["fields"]:
            named = fields.get("root_rank") if isinstance(fields, dict) else None
            if named is None or int(named) in culprits or not culprits:
                continue
            notes.append(
                f"torchrun's summary names rank {named} as the root cause (its first observed "
                f"failure); that failure followed from {who_of(culprits)}'s, above"
            )
            break
        return notes


def _ranks_of(value: Any) -> list[int]:
    """The ranks of a list read from run.json (a file): ints only."""
    return sorted(r for r in value if type(r) is int) if isinstance(value, list) else []
