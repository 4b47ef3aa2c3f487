"""What the rules of a diagnosis read: the facts of one run, derived once from its tables.

A :class:`Context` holds the merged calls (:mod:`rankscope.analyze.calls`), the groups' members,
where each group's ranks part (:mod:`rankscope.analyze.align`), the wait-for graph
(:mod:`rankscope.analyze.waits`) and what each rank's process did; each is computed on first use
and kept. The helpers below turn rows into what a diagnosis says (a collective's description, a
rank's whereabouts, the evidence references, the chain of waits). Nothing here decides a cause:
the rules do (:mod:`rankscope.analyze.rules`).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from rankscope.analyze import align
from rankscope.analyze.activity import Activity, rank_activity
from rankscope.analyze.calls import (
    calls_from_flight_recorder,
    calls_from_probe,
    fr_sites,
    merge_calls,
)
from rankscope.analyze.diagnosis import CollectiveInfo, EvidenceRef, compact_ranks, who_of
from rankscope.analyze.evidence import SIGNAL_TEXT, Evidence, RankFacts
from rankscope.analyze.parting import (
    Frame,
    Parting,
    find_parting,
    left_loop_by_sites,
    loop_parting,
    rank_path,
    without_machinery,
)
from rankscope.analyze.waits import WaitGraph, wait_graph
from rankscope.collect import SIGNATURES, VICTIM_ROLES

#: How many supporting rows of one kind a diagnosis lists (a 16k-rank job has 16k waiters).
MAX_REFS = 8
#: Ranks per distinct call whose flight-recorder frames are read to find its call site.
SITE_SAMPLE = 8
#: What each error signature means, to explain a rank that died of another's problem.
SIGNATURE_DOCS = {s.kind: s.doc for s in SIGNATURES}


@dataclass(frozen=True, kw_only=True)
class Where:
    """What a rank that never made a call was doing instead."""

    state: str
    """``exited``, ``in_call`` (waiting in another call), ``busy`` (its stacks show it outside
    any collective), ``alive`` (outside any collective; no stacks say where) or ``unknown``."""
    site: str | None
    note: str
    ref: EvidenceRef | None
    code: int | None = None
    """The exit code of an ``exited`` rank (0 for one caught leaving its finished script)."""


class Context:
    """The derived facts of one run's evidence, for the rules to read."""

    def __init__(self, ev: Evidence, *, straggler_s: float):
        self.ev = ev
        self.straggler_s = straggler_s
        self.facts = ev.ranks
        self.notes_of_sites: list[str] = []
        self._partings: dict[
            tuple[tuple[int, ...], tuple[int, ...]], tuple[Parting | None, str]
        ] = {}

    # --- the calls ------------------------------------------------------------------------
    @cached_property
    def fr(self) -> pd.DataFrame:
        return self.ev.table("flight_recorder")

    @cached_property
    def probe_calls(self) -> pd.DataFrame:
        probe = self.ev.table("collectives")
        return calls_from_probe(probe) if not probe.empty else calls_from_probe(probe.head(0))

    @cached_property
    def calls(self) -> pd.DataFrame:
        """Every rank's calls, the probe's and the flight recorder's as one sequence per rank.

        gloo's recorder retires a collective that failed as it retires one that completed, with
        no completion time for either. A rank that raised a victim's error (a peer gone, a
        timeout) outside its Python calls raised it from a collective torch issued (a
        backward's bucket all_reduce, a Work waited on): its last such entry did not complete,
        and it waited there."""
        calls = merge_calls(self.probe_calls, calls_from_flight_recorder(self.fr))
        probe = self.ev.table("collectives")
        raised_in_call = set(probe.loc[failed(probe), "rank"].dropna().astype(int).tolist())
        victims = [
            r
            for r in self.ev.waiters - raised_in_call
            if (f := self.facts.get(r)) is not None and f.exception is not None
        ]
        if not victims or calls.empty:
            return calls
        last = calls[calls["rank"].isin(victims)].groupby("rank")["order"].idxmax()
        rows = last[
            (calls.loc[last, "source"] == "flight_recorder").to_numpy()
            & calls.loc[last, "t_end_s"].isna().to_numpy()
        ]
        if len(rows):
            calls = calls.copy()
            calls.loc[rows.to_numpy(), "completed"] = False
        return calls

    @cached_property
    def source(self) -> str:
        """Where the calls mostly come from, for what the texts call them."""
        return "collectives" if not self.probe_calls.empty else "flight_recorder"

    @cached_property
    def members(self) -> dict[str, tuple[int, ...]]:
        return align.group_members(self.calls, world=self.ev.world)

    @cached_property
    def evidence_ranks(self) -> set[int]:
        """Ranks with a record of their calls: the probe started, or a dump of theirs."""
        ranks = set(self.calls["rank"].unique().tolist())
        ranks |= {r for r, f in self.facts.items() if f.started}
        ranks |= set(self.ev.table("pg_status")["rank"].dropna().astype(int).tolist())
        return ranks

    @cached_property
    def complete_ranks(self) -> set[int]:
        """Ranks whose record starts at their first call: the probe's, and a recorder's ring
        buffer that still holds its first entry (``record_id`` 0)."""
        probed = {r for r, f in self.facts.items() if f.started}
        fr = self.fr
        rank = fr["rank"].to_numpy(dtype=np.int64, na_value=-1)
        record = fr["record_id"].to_numpy(dtype=np.int64, na_value=-1)
        first = set(np.unique(rank[record == 0]).tolist())
        dumped = set(self.ev.table("pg_status")["rank"].dropna().astype(int).tolist())
        return probed | first | (dumped - set(np.unique(rank).tolist()))

    @cached_property
    def last(self) -> pd.DataFrame:
        """Each rank's most recent call, indexed by rank."""
        return align.last_calls(self.calls)

    @cached_property
    def divergences(self) -> list[align.Divergence]:
        return align.find_divergences(
            self.calls,
            members=self.members,
            ranks=self.evidence_ranks,
            complete=self.complete_ranks,
        )

    @cached_property
    def gone(self) -> set[int]:
        """Ranks that left on their own (an exit that no teardown or stop explains, or a script
        that had returned): they wait for nothing. Not a victim, which left because a call of
        its own failed or its own texts say it waited on others."""
        probe = self.ev.table("collectives")
        victims = set(probe.loc[failed(probe), "rank"].dropna().astype(int).tolist())
        victims |= self.ev.waiters
        out = set()
        for rank, f in self.facts.items():
            left = f.exiting or (f.exit_code is not None and not self.ev.terminated(f.exit_code))
            if left and rank not in victims:
                out.add(rank)
        return out

    @cached_property
    def graph(self) -> WaitGraph:
        g = wait_graph(self.calls, members=self.members, gone=self.gone)
        unsited = [w for w in g.waits.values() if w.site is None]
        if unsited:  # the recorder's own calls: their sites from its frames
            sites = self.sites(self.calls.iloc[[w.row for w in unsited]])
            for w, site in zip(unsited, sites, strict=True):
                if opt(site):
                    g.waits[w.rank] = replace(w, site=str(site))
        return g

    def parting(self, culprits: Iterable[int], others: Iterable[int]) -> tuple[Parting | None, str]:
        """The decision in the source that separates ``culprits`` from ``others`` (their
        stacks: each rank's thread that waits in a call, else its main thread), and why there
        is none when there is none (:func:`~rankscope.analyze.parting.find_parting`)."""
        key = (tuple(sorted(culprits)), tuple(sorted(others)))
        if key not in self._partings:
            paths: dict[int, list[Frame]] = {}
            for ranks in key:
                for r in ranks[:SITE_SAMPLE]:  # one path a side is read; a few tries for it
                    path = self._path(r)
                    if path:
                        paths[r] = path
                        break
            found = find_parting(
                list(key[0]),
                list(key[1]),
                paths,
                self.ev.table("values"),
                same_pass=self._same_call(*paths) if len(paths) == 2 else False,
            )
            if found[0] is None and key[0] and key[1]:
                # no stacks that part: the calls' own lines may show a loop left
                own, theirs = self.call_frame(key[0][0]), self.call_frame(key[1][0])
                loop = loop_parting(theirs, own, *key, self.ev.table("values"))
                found = (loop, "") if loop is not None else found
            self._partings[key] = found
        return self._partings[key]

    def loop_left(
        self, culprits: Iterable[int], others: Iterable[int], theirs: pd.Series, own: pd.Series
    ) -> bool | None:
        """Whether the culprits' call ``own`` is past the end of the loop that holds the others'
        call ``theirs`` (rows of the calls table), by the source; None when it cannot tell. A
        loop left becomes the parting line of these two sides, where their stacks gave none."""
        their_frame, own_frame = self.frame_of(theirs), self.frame_of(own)
        key = (tuple(sorted(culprits)), tuple(sorted(others)))
        if self.parting(*key)[0] is None:
            loop = loop_parting(their_frame, own_frame, *key, self.ev.table("values"))
            if loop is not None:
                self._partings[key] = (loop, "")
        return left_loop_by_sites(their_frame, own_frame)

    def _same_call(self, a: int, b: int) -> bool:
        """Whether ranks ``a`` and ``b`` wait at the same collective of one group (its number)."""
        wa, wb = self.graph.waits.get(a), self.graph.waits.get(b)
        return (
            wa is not None
            and wb is not None
            and wa.seq is not None
            and (wa.pg, wa.seq) == (wb.pg, wb.seq)
        )

    def _path(self, rank: int) -> list[Frame] | None:
        """``rank``'s frames in its latest stacks (its thread that waits in a call, else its
        main thread), or its traceback's when it raised and its stacks show no code of its."""
        w = self.graph.waits.get(rank)
        f = self.facts.get(rank)
        thread = w.thread if w is not None and w.thread else None
        thread = thread or (f.main_thread if f is not None else None)
        path = rank_path(self.ev.table("stacks"), rank, thread=thread)
        if not path and f is not None and f.exception:
            path = without_machinery(self.ev.traceback_path(rank, f.exception))
        return path

    def call_frame(self, rank: int) -> Frame:
        """(file, function, line) of ``rank``'s latest call as the probe recorded it; blanks
        where it did not."""
        if rank not in self.last.index:
            return ("", "", 0)
        return self.frame_of(self.last.loc[rank])

    def frame_of(self, call: pd.Series) -> Frame:
        """(file, function, line) of a call of the calls table, where the probe recorded it."""
        if call["source"] != "collectives":
            return ("", "", 0)
        row = self.ev.table("collectives").iloc[int(call["row"])]
        file, func, line = opt(row["file"]), opt(row["func"]), opt_int(row["line"])
        return (file or "", func or "", line or 0)

    def waited_s(self, ranks: Iterable[int]) -> float | None:
        """How long the longest of these ranks' calls in flight had waited at the last record
        of the run (None without one)."""
        calls = self.calls
        flying = calls[calls["rank"].isin(list(ranks)) & ~done(calls)]
        start = flying["t_start_s"].min()
        end = self.ev.table("events")["t_s"].max()
        if pd.isna(start) or pd.isna(end):
            return None
        return max(0.0, float(end) - float(start))

    def cpu_share(self, rank: int) -> float | None:
        """The share of a core ``rank``'s main thread used between its last heartbeats before
        the latest stall, as the watchdog saw it (run.json); None without one."""
        for stall in reversed(self.ev.stalls):
            for snap in stall.get("ranks") or []:
                if isinstance(snap, dict) and snap.get("rank") == rank:
                    share = snap.get("cpu_share")
                    return float(share) if isinstance(share, (int, float)) else None
        return None

    def activity(self, rank: int) -> Activity | None:
        f = self.facts.get(rank)
        return rank_activity(
            self.ev.table("stacks"), rank, main_thread=f.main_thread if f is not None else None
        )

    def cell(self, pg: str, seq: int) -> align.Divergence:
        """The calls at ``(pg, seq)`` as a :class:`~rankscope.analyze.align.Divergence`, its
        missing members those with a record that never made the call."""
        calls = self.calls
        rows = calls[(calls["pg"].astype(str) == pg) & (calls["seq"] == seq)]
        members = tuple(self.members.get(pg, ()))
        present = set(rows["rank"].tolist())
        missing = tuple(r for r in members if r not in present and r in self.evidence_ranks)
        return align.Divergence(pg=pg, seq=seq, members=members, rows=rows, missing=missing)

    def divergence_with(self, ranks: set[int]) -> align.Divergence | None:
        """The first divergence these ranks are missing from, else the first they were left
        inside of (a call of theirs that never returned)."""
        for d in self.divergences:
            if ranks & set(d.missing):
                return d
        for d in self.divergences:
            if ranks & set(d.rows["rank"][~done(d.rows)].tolist()):
                return d
        return None

    # --- what to say about calls ----------------------------------------------------------
    def sites(self, rows: pd.DataFrame) -> pd.Series:
        """Call sites of these calls. The probe records them; for the recorder's own entries
        they come from the frames of a sample of ranks per distinct call (``SITE_SAMPLE``
        each), and the other ranks making the identical call get the site their sample agrees
        on."""
        sites = rows["site"].astype("string")
        need = rows[sites.isna().to_numpy() & (rows["source"] == "flight_recorder").to_numpy()]
        if need.empty:
            return sites
        sample = need.groupby("key", sort=False).head(SITE_SAMPLE)
        ranks = set(sample["rank"].astype(int).tolist())
        found = fr_sites(self.ev.fr_frames(ranks), sample, self.fr)
        sites.loc[sample.index] = found
        if len(sample) < len(need):
            agreed = found.groupby(sample["key"]).agg(
                lambda s: s.iloc[0] if s.nunique() == 1 else pd.NA
            )
            rest = need.index.difference(sample.index)
            sites.loc[rest] = need.loc[rest, "key"].map(agreed).astype("string")
            note = (
                f"call sites read from the frames of {len(sample)} of {len(need)} ranks; the "
                "others making the identical call are shown at the site those agree on"
            )
            if note not in self.notes_of_sites:
                self.notes_of_sites.append(note)
        return sites

    def label(self, d: align.Divergence) -> str:
        desc = d.rows["pg_desc"].dropna()
        name = f"group {d.pg}" + (f" ({desc.iloc[0]})" if len(desc) else "")
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
        ok = done(rows).tolist()
        bad = failed(rows).tolist()
        for r, o, s, fine, broke in zip(rows["rank"], rows["op"], sites, ok, bad, strict=True):
            op[int(r)] = str(o)
            site[int(r)] = opt(s)
            state[int(r)] = "failed" if broke else ("completed" if fine else "waiting")
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
            if self.known_absent(r):
                state[r] = f"never called it: {absent[r].note}"
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

    def known_absent(self, rank: int) -> bool:
        """Whether a rank's record of calls is whole, so a call missing from it was not made:
        the probe's, when written durably at every call or flushed at its end; a dump's, up to
        the moment it was taken."""
        f = self.facts.get(rank)
        if f is not None and f.started:
            return f.record_complete
        return rank in self.evidence_ranks

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

    # --- what ranks did ---------------------------------------------------------------------
    def whereabouts(self, ranks: Iterable[int]) -> dict[int, Where]:
        """What each of these ranks, which never made a call, was doing instead."""
        ranks = list(ranks)
        last = self.last[self.last.index.isin(ranks)].reset_index()
        sites = dict(zip(last["rank"], self.sites(last), strict=True)) if len(last) else {}
        calls = {
            int(r): row for r, row in zip(last["rank"], last.itertuples(index=False), strict=True)
        }
        return {r: self.where(r, calls.get(r), opt(sites.get(r))) for r in ranks}

    def where(self, rank: int, call: Any, site: str | None) -> Where:
        f = self.facts.get(rank) or RankFacts(rank=rank)
        if f.exit_code is not None and not self.ev.terminated(f.exit_code):
            note = f.died or f"exited with code {f.exit_code}"
            where = self.ev.traceback_site(rank, f.exception) if f.exception else None
            ref = None
            if f.end_row is not None or f.row is not None:
                table = "events" if f.end_row is not None else "ranks"
                row = f.end_row if f.end_row is not None else f.row
                ref = EvidenceRef(table=table, row=int(row), rank=rank, note=note)
            return Where(state="exited", site=where, note=note, ref=ref, code=f.exit_code)
        if f.exiting:
            if f.exception:  # it raised, and was on its way out when the stacks were taken
                where = self.ev.traceback_site(rank, f.exception)
                note = f"raised {short(f.exception, 80)}; it was exiting at the capture"
                return Where(state="exited", site=where, note=note, ref=None, code=f.exit_code)
            note = "its script had returned; it was exiting when its stack was captured"
            return Where(state="exited", site=None, note=note, ref=None, code=0)
        at = f" at {site}" if site else ""
        if call is not None and (pd.isna(call.completed) or not call.completed):
            note = f"waiting in {call.op}{at}"
            ref = EvidenceRef(table=str(call.source), row=int(call.row), rank=rank, note=note)
            return Where(state="in_call", site=site, note=note, ref=ref)
        if f.stack_site is not None and f.stack_waiting_in is None:
            found = self.activity(rank)
            note = (
                found.doing
                if found is not None and found.kind
                else (f"outside any collective at {f.stack_site}")
            )
            ref = EvidenceRef(table="stack_summary", row=int(f.stack_row), rank=rank, note=note)
            return Where(state="busy", site=f.stack_site, note=note, ref=ref)
        if f.started:  # alive as far as anyone knows, and no stacks say where
            note = "outside any collective" + (f", after its call{at}" if site else "")
            return Where(state="alive", site=None, note=note, ref=None)
        if call is None:
            return Where(state="unknown", site=None, note="no record of any call", ref=None)
        note = f"its last recorded call, {call.op}{at}, had completed"
        ref = EvidenceRef(table=str(call.source), row=int(call.row), rank=rank, note=note)
        return Where(state="unknown", site=None, note=note, ref=ref)

    def blocked(self, *, exclude: set[int]) -> list[int]:
        """Ranks left waiting: a call in flight or failed at the end, or a victim's error."""
        last = self.last
        blocked = set()
        if not last.empty:
            stuck = ~done(last)
            blocked |= set(last.index[stuck.to_numpy()].tolist())
        blocked |= self.ev.waiters
        for stall in self.ev.stalls[-1:]:
            blocked |= {
                int(s["rank"]) for s in stall.get("ranks", []) if s.get("status") == "waiting"
            }
        return sorted(blocked - exclude)

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
        who = ("rank " if len(ranks) == 1 else "ranks ") + compact_ranks(ranks)
        verb = "waits" if len(ranks) == 1 else "wait"
        return {
            "rank": ranks[0],
            "ranks": sorted(ranks),
            "waits_in": w.as_dict(),
            "waits_for": waits_for,
            "text": f"{who} {verb} in {w.where()} for {who_of(waits_for)}",
        }

    # --- what is missing, and what else is known --------------------------------------------
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
        untimed = self._untimed_nccl()
        if untimed:
            notes.append(
                f"{who_of(untimed)}: the flight recorder kept no start times (nccl without "
                "TORCH_NCCL_ENABLE_TIMING=1), so whether an uncompleted collective started on "
                "the device is unknown; rankscope run and rankscope.probe.install() turn it on"
            )
        if notes:
            notes += [f"could not read {text}" for text in self.unreadable()]
        return notes + self.notes_of_sites

    def _untimed_nccl(self) -> list[int]:
        """Ranks with an uncompleted nccl entry and no start time on any of their entries."""
        fr = self.ev.table("flight_recorder")
        if fr.empty or "time_discovered_started_ns" not in fr:
            return []
        nccl = fr[fr["backend"].astype(str) == "nccl"]
        if nccl.empty:
            return []
        done = nccl["retired"].fillna(False).astype(bool) | (nccl["state"] == "completed")
        timed = nccl["time_discovered_started_ns"].notna().groupby(nccl["rank"]).any()
        open_ = (~done).groupby(nccl["rank"]).any()
        return sorted(int(r) for r in timed.index if open_[r] and not timed[r])

    def _early_stop(self, f: RankFacts) -> str | None:
        """Why a rank's evidence may stop before its end, if it may."""
        if f.signal == "SIGKILL":
            kept = (
                "its calls up to its death are in its ring file"
                if f.ring
                else "its last calls (up to half a second of them) may be missing: it has no "
                "ring file"
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
            if f.end_reason and f.signal and f.end_reason == f.signal:
                how = f"was ended by {f.signal} and left a capture (stacks, flight recorder)"
            else:
                how = f.died
            text = f"rank {rank} {how}"
            if len(mine):
                kind = str(mine["kind"].iloc[0])
                text += f" after it reported {kind} ({short(mine['message'].iloc[0], 100)})"
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


# --- small helpers the rules share ------------------------------------------------------------
def done(rows: pd.DataFrame) -> pd.Series:
    """Calls that returned normally."""
    return rows["completed"].fillna(False).astype(bool) & ~failed(rows)


def failed(rows: pd.DataFrame) -> pd.Series:
    """Calls that raised."""
    return rows["ok"].eq(False).fillna(False).astype(bool)


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


def opt(value: Any) -> str | None:
    return (
        None
        if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value))
        else str(value)
    )


def opt_int(value: Any) -> int | None:
    return None if pd.isna(value) else int(value)


def error_refs(errors: pd.DataFrame, note: str) -> list[EvidenceRef]:
    return [
        EvidenceRef(
            table="errors", row=int(pos), rank=None if pd.isna(r) else int(r), note=f"{k}: {note}"
        )
        for pos, r, k in zip(errors.index[:MAX_REFS], errors["rank"], errors["kind"], strict=False)
    ]
