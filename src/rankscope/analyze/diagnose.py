"""``diagnose()``: from the collected tables of one job to one :class:`Diagnosis`.

The questions are asked in this order, and the first that finds something answers:

1. Did the ranks never form a group because of the environment or the launch? (``launch_error``)
2. Did a rank report a failure of its own (an exception outside any collective, an OOM, a NaN,
   DDP's reduction error) and leave the others waiting? (``crash``)
3. Did ranks call different collectives (op, shape, dtype) where their sequences first part?
   (``hang``) A mismatch comes before any death: it can kill a rank (gloo aborts a rank that
   receives more bytes than it expects), and that rank is its victim.
4. Did a rank die of a signal (SIGKILL, SIGSEGV, SIGABRT, ...) that no text of its own blames on
   a peer? (``crash``, ``rank_killed`` for SIGKILL)
5. Where else do the sequences part: a rank that never made the call? What was it doing
   instead (exited early, crashed, stuck in a point-to-point cycle, busy elsewhere)? (``hang``)
6. Are ranks still waiting with no divergence (a cycle, a rank that left no evidence, plain
   timeouts in the logs)? (``hang``)
7. Did a rank exit non-zero with nothing else to say why? (``crash``)
8. Did every collective complete, but with one rank arriving far behind? (``ok``, straggler)

With no answer, the job is ``ok`` only if the evidence shows it healthy; a rank that ended in a
way nothing explains, or no record at all, is ``unknown``. Ranks that are victims (their own
error texts name a peer's exit, a mismatch or a timeout, or a call of theirs failed) and ranks
ended by a teardown or a stop are never culprits for that.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from rankscope.analyze import align
from rankscope.analyze.catalogue import CAUSES, FAILURE_KINDS, LAUNCH_KINDS, Verdict, explain
from rankscope.analyze.diagnosis import CollectiveInfo, Diagnosis, EvidenceRef, compact_ranks
from rankscope.analyze.evidence import SIGNAL_TEXT, Evidence, RankFacts, crash_cause
from rankscope.collect.signatures import SIGNATURES, VICTIM_ROLES
from rankscope.rundir import RunDir

#: What each error signature means, to explain a rank that died of another's problem.
SIGNATURE_DOCS = {s.kind: s.doc for s in SIGNATURES}
#: How many supporting rows of one kind a diagnosis lists (a 16k-rank job has 16k waiters).
MAX_REFS = 8
#: Ranks per distinct call whose flight-recorder frames are read to find its call site.
SITE_SAMPLE = 8


def diagnose(run: Any, *, straggler_s: float = 1.0) -> Diagnosis:
    """Explain a failed, frozen or healthy job.

    Args:
        run: a :class:`rankscope.collect.Run` (or anything with its table attributes), or the
            path of a run directory or of a folder of foreign artifacts, loaded with
            :func:`rankscope.collect.load_run`.
        straggler_s: a rank that reaches a completed collective this many seconds after the
            first rank is reported as a straggler.

    Returns:
        The :class:`Diagnosis`; nothing is written (see :func:`write_diagnosis`).
    """
    if straggler_s <= 0:
        raise ValueError(f"straggler_s must be positive, got {straggler_s}")
    if isinstance(run, (str, os.PathLike, RunDir)):
        from rankscope.collect import load_run

        run = load_run(run)
    return _Analysis(Evidence(run), straggler_s=straggler_s).diagnose()


@dataclass(frozen=True, kw_only=True)
class _Where:
    """What a rank that never made a call was doing instead."""

    state: str
    """``exited``, ``in_call`` (waiting in another call), ``busy`` (alive, outside any
    collective) or ``unknown``."""
    site: str | None
    note: str
    ref: EvidenceRef | None
    code: int | None = None
    """The exit code of an ``exited`` rank (0 for one caught leaving its finished script)."""


@dataclass(frozen=True, kw_only=True)
class _Failure:
    """A rank's own failure."""

    t_s: float
    rank: int
    cause: str
    message: str
    ref: EvidenceRef | None
    site: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True)
class _Finding:
    """A cause with its facts, before it becomes a :class:`Diagnosis`."""

    cause: str
    culprits: list[int]
    waiting: list[int]
    facts: dict[str, Any] = field(default_factory=dict)
    collective: CollectiveInfo | None = None
    refs: list[EvidenceRef] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class _Analysis:
    def __init__(self, ev: Evidence, *, straggler_s: float):
        self.ev = ev
        self.straggler_s = straggler_s
        self.facts = ev.ranks
        self.source, self.calls = self._calls()
        self.members = align.group_members(self.calls, world=ev.world)
        self.missing_notes: list[str] = []

    # --- the calls table ------------------------------------------------------------------
    def _calls(self) -> tuple[str, pd.DataFrame]:
        """The probe's calls (exact call sites, point-to-point on gloo), unless the flight
        recorder shows a rank inside a collective the probe never saw: collectives torch issues
        from C++ (DDP's gradient buckets, FSDP) are in the recorder only, and aligning without
        them would misplace the ranks blocked in them. A rank that exited 0 is blocked in
        nothing: its dump, taken on the way out, can race the retirement of its last work."""
        fr_calls = align.calls_from_flight_recorder(self.ev.table("flight_recorder"))
        probe = self.ev.table("collectives")
        calls = align.calls_from_probe(probe) if not probe.empty else probe
        if calls.empty:
            return "flight_recorder", fr_calls
        finished = {r for r, f in self.facts.items() if f.exit_code == 0}
        if fr_calls.empty or not _in_flight_unseen(calls, fr_calls, ignore=finished):
            return "collectives", calls
        return "flight_recorder", fr_calls

    @cached_property
    def evidence_ranks(self) -> set[int]:
        """Ranks with a record of their calls in the chosen source."""
        ranks = set(self.calls["rank"].unique().tolist())
        if self.source == "collectives":
            ranks |= {r for r, f in self.facts.items() if f.started}
        else:
            ranks |= set(self.ev.table("pg_status")["rank"].dropna().astype(int).tolist())
        return ranks

    @cached_property
    def complete_ranks(self) -> set[int]:
        """Ranks whose record starts at their first call (the probe; an unwrapped ring buffer)."""
        if self.source == "collectives":
            return self.evidence_ranks
        # A buffer that still holds its first record (record_id 0) has not wrapped.
        first = self.calls.loc[self.calls["order"].to_numpy() <= 0, "rank"].unique().tolist()
        return set(first) | (self.evidence_ranks - set(self.calls["rank"].unique().tolist()))

    # --- the answer -----------------------------------------------------------------------
    def diagnose(self) -> Diagnosis:
        unreadable = self._require_evidence()
        if unreadable is not None:
            return unreadable
        self._note_missing()
        if self._all_exited_zero():
            # Whatever the flight recorder still lists as in flight (DDP's last bucket is
            # often never retired), a job whose every rank exited 0 did not hang.
            finding = self._straggler()
            return self._diagnosis(finding) if finding else self._healthy()
        finding = (
            self._launch_error()
            or self._crash(self._failures())
            or self._mismatch_first()
            or self._crash(self._deaths())
            or self._divergence()
            or self._still_waiting()
            or self._errors_only()
            or self._crash(self._deaths(bare=True))
            or self._straggler()
        )
        if finding is None:
            return self._healthy()
        return self._diagnosis(finding)

    def _all_exited_zero(self) -> bool:
        codes = [f.exit_code for f in self.facts.values()]  # one per rank of the world
        return bool(codes) and all(c == 0 for c in codes)

    def _diagnosis(self, f: _Finding) -> Diagnosis:
        cause = CAUSES[f.cause]
        facts = {
            "culprits": _who(f.culprits),
            "others": _who(f.waiting, "no other rank"),
            **f.facts,
        }
        facts["culprit_at"] = _at(facts.get("culprit_site"))
        facts["other_at"] = _at(facts.get("other_site"))
        reason = explain(f.cause, facts)
        notes = f.notes + self._aftermath(f.culprits) + self._torchrun_notes(f.culprits)
        summary = f"{cause.title[0].upper()}{cause.title[1:]}: {reason}."
        return Diagnosis(
            verdict=cause.verdict,
            cause=f.cause,
            culprit_ranks=sorted(f.culprits),
            waiting_ranks=sorted(f.waiting),
            recipe=cause.recipe,
            summary=summary,
            reason=reason,
            fix=cause.fix,
            collective=f.collective,
            evidence=f.refs,
            missing=self.missing_notes,
            notes=notes,
            run=self.ev.path,
        )

    def _healthy(self) -> Diagnosis:
        """No rule found a problem: ``ok`` only if the evidence shows the job was healthy;
        ``unknown`` when ranks ended in a way nothing explains, or nothing was recorded."""
        codes = {r: f.exit_code for r, f in self.facts.items()}
        done = int(self.calls["idx"].notna().sum())
        recorded = f" {done} collective calls recorded ({self.source})." if done else ""
        ended = {
            r: f for r, f in self.facts.items() if f.died and not (self.ev.stopped and f.signal)
        }
        if ended:
            return self._unknown(
                f"No rank diverged, waited or failed on its own in the evidence, yet "
                f"{self._endings(ended)}; the evidence does not show why.{recorded}",
                ranks=sorted(ended),
            )
        if codes and all(c == 0 for c in codes.values()):
            summary = f"All {len(codes)} ranks exited 0; no collective was left in flight."
        elif self.ev.stopped:
            summary = (
                f"The job was stopped ({self.ev.info.get('stop_reason')}) with no rank stuck "
                "and no failure in the evidence."
            )
        elif not done and not self.ev.table("events")["ev"].isin(["heartbeat", "step"]).any():
            return self._unknown(
                "There is no record of any collective call or of any rank's progress, and no "
                "exit code: the evidence cannot tell whether the job was healthy."
            )
        else:
            summary = "No failure, divergence or waiting rank in the evidence so far."
        return self._causeless("ok", summary + recorded, notes=self._torchrun_notes([]))

    def _unknown(self, summary: str, *, ranks: list[int] | None = None) -> Diagnosis:
        notes = self._torchrun_notes([]) + self._aftermath([], only=ranks)
        return self._causeless("unknown", summary, notes=notes)

    def _causeless(self, verdict: Verdict, summary: str, *, notes: list[str]) -> Diagnosis:
        return Diagnosis(
            verdict=verdict,
            cause=None,
            culprit_ranks=[],
            waiting_ranks=[],
            recipe=None,
            summary=summary,
            missing=self.missing_notes,
            notes=notes,
            run=self.ev.path,
        )

    def _endings(self, ranks: dict[int, RankFacts]) -> str:
        """``rank 2 died of SIGKILL (exit code -9), then ranks 0-1, 3 died of SIGTERM ...``:
        how ranks ended, grouped by how, the first to go first (by their last records)."""
        by_how: dict[str, list[int]] = {}
        for r, f in sorted(ranks.items(), key=lambda kv: (kv[1].last_seen_s or np.inf, kv[0])):
            by_how.setdefault(f.died or "ended", []).append(r)
        parts = [f"{_who(rs)} {how}" for how, rs in by_how.items()]
        return ", then ".join(parts)

    def _aftermath(self, culprits: list[int], *, only: list[int] | None = None) -> list[str]:
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
                text += f" after it reported {kind} ({_short(mine['message'].iloc[0], 100)})"
                text += f", which says {SIGNATURE_DOCS[kind]}" if kind in SIGNATURE_DOCS else ""
            notes.append(text)
        return notes

    # --- 1. launch ------------------------------------------------------------------------
    def _launch_error(self) -> _Finding | None:
        completed = self.calls["idx"].notna() & self.calls["completed"].fillna(False).astype(bool)
        if completed.any():
            return None
        errors = self.ev.table("errors")
        launch = errors[errors["kind"].isin(list(LAUNCH_KINDS))]
        if not launch.empty:
            launch = launch.sort_values("t_s", kind="stable", na_position="last")
            kind = str(launch["kind"].iloc[0])
            same = launch[launch["kind"] == kind]
            culprits = sorted(set(same["rank"].dropna().astype(int).tolist()))
            return _Finding(
                cause=LAUNCH_KINDS[kind],
                culprits=culprits,
                waiting=[],
                facts={
                    "error": _short(same["message"].iloc[0]),
                    "culprits": _who(culprits, "the process"),
                },
                refs=_error_refs(same, "the launch failed"),
            )
        probe = self.ev.table("collectives")
        setup = probe[probe["op"].isin(list(align.MANAGEMENT_OPS)) & _failed(probe)]
        if not setup.empty:
            culprits = sorted(set(setup["rank"].astype(int).tolist()))
            refs = [
                EvidenceRef(table="collectives", row=int(pos), rank=int(r), note=f"{op} failed")
                for pos, r, op in zip(setup.index, setup["rank"], setup["op"], strict=True)
            ]
            error = _short(setup["error"].iloc[0])
            return _Finding(
                cause="launch_failed",
                culprits=culprits,
                waiting=[],
                facts={"error": error},
                refs=refs,
            )
        if self.ev.info.get("state") == "failed_to_start":
            error = self.ev.info.get("error") or "torchrun failed before any rank started"
            return _Finding(cause="launch_failed", culprits=[], waiting=[], facts={"error": error})
        return None

    # --- 2. a rank that failed on its own -------------------------------------------------
    def _failures(self) -> list[_Failure]:
        """Every rank's own failure that it reported (not a collective that failed because of a
        peer), earliest first: an exception raised outside any collective, or an error of its
        own in its logs."""
        probe = self.ev.table("collectives")
        failed = probe[_failed(probe)]
        raised_in_call = {
            (int(r), str(e)) for r, e in zip(failed["rank"], failed["error"], strict=True)
        }
        errors = self.ev.table("errors")
        own = errors[errors["kind"].isin(list(FAILURE_KINDS)) & errors["rank"].notna()]
        kinds = {
            int(r): FAILURE_KINDS[str(k)] for r, k in zip(own["rank"], own["kind"], strict=True)
        }
        out = []
        for rank, f in self.facts.items():
            if f.exception is None or any(
                r == rank and f.exception in e for r, e in raised_in_call
            ):
                continue
            note = "exception outside any collective"
            out.append(
                _Failure(
                    t_s=f.exception_s or np.inf,
                    rank=rank,
                    cause=kinds.get(rank) or crash_cause(f.exception),
                    message=f.exception,
                    ref=EvidenceRef(table="events", row=f.exception_row, rank=rank, note=note),
                )
            )
        for pos, row in zip(own.index, own.itertuples(index=False), strict=True):
            if any(o.rank == int(row.rank) for o in out):
                continue
            out.append(
                _Failure(
                    t_s=np.inf if pd.isna(row.t_s) else float(row.t_s),
                    rank=int(row.rank),
                    cause=FAILURE_KINDS[str(row.kind)],
                    message=str(row.message),
                    ref=EvidenceRef(
                        table="errors", row=int(pos), rank=int(row.rank), note=str(row.kind)
                    ),
                )
            )
        return sorted(out, key=lambda o: (o.t_s, o.rank))

    def _deaths(self, *, bare: bool = False) -> list[_Failure]:
        """Ranks that died without a word, earliest first: killed or crashed by a signal
        (``bare=False``), or only a non-zero exit code (``bare=True``: weaker than any other
        evidence, so asked last). Not a rank ended by a teardown or a stop, one whose call
        failed, nor one whose own texts say it waited on others."""
        probe = self.ev.table("collectives")
        victims = set(probe.loc[_failed(probe), "rank"].dropna().astype(int).tolist())
        victims |= self.ev.waiters
        reported = {f.rank for f in self._failures()}
        out = []
        for rank, f in self.facts.items():
            if f.died is None or rank in victims or rank in reported or f.exception:
                continue
            if self.ev.terminated(f.exit_code) or bool(f.signal) == bare:
                continue
            out.append(self._death(f))
        return sorted(out, key=lambda o: (o.t_s, o.rank))

    def _death(self, f: RankFacts) -> _Failure:
        """A rank that died without an error of its own: killed, crashed in native code, or an
        exit code with no exception. The time is its last record (it died after that)."""
        note = f.died or "died"
        ref = (
            None if f.row is None else EvidenceRef(table="ranks", row=f.row, rank=f.rank, note=note)
        )
        # Stacks from the fatal signal itself (faulthandler) show where it crashed; older
        # captures show where it was then, not where it died.
        site = f.stack_site if f.signal and f.stack_reason == f.signal else None
        last = self.last.loc[f.rank] if f.rank in self.last.index else None
        after = ""
        if last is not None:
            state = "which returned" if _done(last.to_frame().T).iloc[0] else "still in flight"
            after = (
                f" after its last recorded call ({last['op']}{_at(_opt(last['site']))}, {state})"
            )
        elif f.last_seen_s is not None:
            after = " after its last recorded event"
        if f.signal == "SIGKILL":
            return _Failure(
                t_s=f.last_seen_s or np.inf,
                rank=f.rank,
                cause="rank_killed",
                message=f"{f.signal} ({SIGNAL_TEXT[f.signal]})",
                ref=ref,
                site=site,
                facts={"death": f"was killed by SIGKILL (exit code {f.exit_code}){after}"},
            )
        if f.signal:
            text = SIGNAL_TEXT.get(f.signal)
            message = f"{f.signal}" + (f" ({text})" if text else "")
        else:
            message = f"exit code {f.exit_code} and no exception"
        return _Failure(
            t_s=f.last_seen_s or np.inf,
            rank=f.rank,
            cause="rank_crashed",
            message=message + after,
            ref=ref,
            site=site,
        )

    def _crash(self, failures: list[_Failure]) -> _Finding | None:
        """The earliest of these failures is the cause; the ranks that failed the same way
        with it are the culprits."""
        if not failures:
            return None
        first = failures[0]
        same = [f for f in failures if f.cause == first.cause]
        culprits = sorted({f.rank for f in same})
        if first.ref is not None and first.ref.table in ("events", "errors"):
            site = (
                self.ev.traceback_site(first.rank, first.message)
                or self.facts[first.rank].stack_site
            )
        else:
            site = first.site
        div = self._divergence_with_missing(set(culprits))
        waiting = self._blocked(exclude=set(culprits))
        facts = {"error": _short(first.message), "culprit_site": site, **first.facts}
        if first.cause == "rank_killed":
            facts["left"] = "waiting"
            ended = sorted(r for r, f in self.facts.items() if r not in culprits and f.died)
            if not waiting and ended:
                how = sorted(
                    {self.facts[r].signal or f"exit {self.facts[r].exit_code}" for r in ended}
                )
                facts["others"] = _who(ended)
                facts["left"] = f"to be ended by {'/'.join(how)} (torchrun's teardown)"
        return _Finding(
            cause=first.cause,
            culprits=culprits,
            waiting=waiting,
            facts=facts,
            collective=self._collective(div) if div else None,
            refs=[f.ref for f in same if f.ref is not None][:MAX_REFS]
            + (self._call_refs(div) if div else []),
            notes=[
                f"rank {f.rank} also failed: {_short(f.message)}" for f in failures if f not in same
            ],
        )

    def _blocked(self, *, exclude: set[int]) -> list[int]:
        """Ranks left waiting: a call in flight or failed at the end, or a victim's error."""
        last = self.last
        blocked = set()
        if not last.empty:
            stuck = ~_done(last)
            blocked |= set(last.index[stuck.to_numpy()].tolist())
        blocked |= self.ev.waiters
        for stall in self.ev.stalls[-1:]:
            blocked |= {
                int(s["rank"]) for s in stall.get("ranks", []) if s.get("status") == "waiting"
            }
        return sorted(blocked - exclude)

    # --- 3. where the sequences part ------------------------------------------------------
    @cached_property
    def divergences(self) -> list[align.Divergence]:
        return align.find_divergences(
            self.calls,
            members=self.members,
            ranks=self.evidence_ranks,
            complete=self.complete_ranks,
        )

    def _divergence_with_missing(self, ranks: set[int]) -> align.Divergence | None:
        """The first divergence these ranks are missing from, else the first they were left
        inside of (a call of theirs that never returned)."""
        for d in self.divergences:
            if ranks & set(d.missing):
                return d
        for d in self.divergences:
            if ranks & set(d.rows["rank"][~_done(d.rows)].tolist()):
                return d
        return None

    def _root(self, divs: list[align.Divergence]) -> align.Divergence:
        """The divergence that explains the others. A group whose missing ranks are all busy in
        another divergent collective only waits for that one; of the rest, the earliest."""
        in_flight = {}
        for d in divs:
            for r in d.rows["rank"][~_done(d.rows)].tolist():
                in_flight[r] = d
        unexplained = [
            d
            for d in divs
            if not d.missing or any(in_flight.get(r) in (None, d) for r in d.missing)
        ]
        return min(unexplained or divs, key=lambda d: _earliest(d.rows))

    def _mismatch_first(self) -> _Finding | None:
        """Ranks that called different collectives (op, shapes, dtypes) at the root divergence:
        that comes before any death, because a mismatch can kill a rank (gloo aborts one that
        receives more bytes than it expects)."""
        divs = self.divergences
        return self._divergence() if divs and self._root(divs).mismatched else None

    def _divergence(self) -> _Finding | None:
        divs = self.divergences
        if not divs:
            return None
        d = self._root(divs)
        found = self._mismatch(d) if d.mismatched else self._absent(d)
        for other in divs:
            held = sorted(
                set(other.rows["rank"][~_done(other.rows)].tolist()) - set(found.culprits)
            )
            if other is d or not held:
                continue
            found.waiting = sorted(set(found.waiting) | set(held))
            found.notes.append(
                f"{_who(held)} also waited, in {other.rows['op'].iloc[0]} ({self._label(other)})"
                + (f", for {_who(other.missing)}" if other.missing else "")
            )
        return found

    def _mismatch(self, d: align.Divergence) -> _Finding:
        rows = d.rows
        groups = {k: sorted(g["rank"].tolist()) for k, g in rows.groupby("key")}
        most = max(len(g) for g in groups.values())
        tied = [k for k, g in groups.items() if len(g) == most]
        # The usual call is the reference; between equal camps, the one the ranks made before.
        norm_key = max(tied, key=lambda k: (self._familiarity(d, k), -groups[k][0]))
        norm = rows[rows["key"] == norm_key]
        odd = rows[rows["key"] != norm_key]
        culprits = sorted(odd["rank"].tolist())
        waiting = sorted(norm["rank"][~_done(norm)].tolist())
        o, n = odd.iloc[0], norm.iloc[0]
        sites = self._sites(rows)
        facts = {
            "culprit_op": o["op"],
            "other_op": n["op"],
            "culprit_site": _site_of(sites, odd),
            "other_site": _site_of(sites, norm),
            "culprit_shapes": o["shapes"],
            "other_shapes": n["shapes"],
            "culprit_dtypes": o["dtypes"],
            "other_dtypes": n["dtypes"],
            "collective": self._label(d),
        }
        if o["op"] != n["op"]:
            if self._extra_or_skipped(d, odd, norm):
                cause = "rank_conditional_collective"
                facts["culprit_doing"] = f"called {o['op']}{_at(facts['culprit_site'])}"
                facts["other_doing"] = f"called {n['op']}{_at(facts['other_site'])}"
            else:
                cause = "op_mismatch"
        elif o["shapes"] != n["shapes"]:
            cause = "shape_mismatch"
        else:
            cause = "dtype_mismatch"
        facts["others"] = _who(sorted(norm["rank"].tolist()))
        notes = [f"{_who(d.missing)} never made this call"] if d.missing else []
        errors = self.ev.table("errors")
        detail = errors[errors["kind"] == "collective_mismatch"]
        if not detail.empty:
            notes.append(
                f"TORCH_DISTRIBUTED_DEBUG=DETAIL reported: {_short(detail['message'].iloc[0])}"
            )
        return _Finding(
            cause=cause,
            culprits=culprits,
            waiting=waiting,
            facts=facts,
            collective=self._collective(d, sites=sites),
            refs=self._call_refs(d) + _error_refs(detail, "DETAIL mismatch"),
            notes=notes,
        )

    def _familiarity(self, d: align.Divergence, key: int) -> int:
        """How often the ranks made this very call on the group before."""
        calls = self.calls
        earlier = calls[(calls["pg"] == d.pg) & (calls["idx"] < d.idx)]
        return int((earlier["key"] == key).sum())

    def _extra_or_skipped(self, d: align.Divergence, odd: pd.DataFrame, norm: pd.DataFrame) -> bool:
        """An extra or skipped collective rather than a different one: a barrier on one side
        only, or the two sequences line up again when shifted by one."""
        ops_odd, ops_norm = set(odd["op"].astype(str)), set(norm["op"].astype(str))
        if bool(ops_odd & align.BARRIER_OPS) != bool(ops_norm & align.BARRIER_OPS):
            return True
        nxt = self.calls[(self.calls["pg"] == d.pg) & (self.calls["idx"] == d.idx + 1)]
        odd_next = set(nxt[nxt["rank"].isin(odd["rank"])]["op"].astype(str))
        norm_next = set(nxt[nxt["rank"].isin(norm["rank"])]["op"].astype(str))
        return bool(odd_next & ops_norm) or bool(norm_next & ops_odd)

    def _absent(self, d: align.Divergence) -> _Finding:
        """Every rank that made the call agrees; some never made it. Why not?"""
        rows = d.rows
        waiting = sorted(rows["rank"][~_done(rows)].tolist())
        sites = self._sites(rows)
        where = self._whereabouts(d.missing)
        facts = {
            "others": _who(waiting or d.present),
            "other_op": rows["op"].iloc[0],
            "other_site": _site_of(sites, rows),
            "collective": self._label(d),
            "group": f"group {d.pg}",
        }
        refs = self._call_refs(d) + [w.ref for w in where.values() if w.ref is not None]
        found = _Finding(
            cause="lagging_rank",
            culprits=list(d.missing),
            waiting=waiting,
            facts=facts,
            collective=self._collective(d, sites=sites, absent=where),
            refs=refs,
        )
        exited = [r for r, w in where.items() if w.state == "exited"]
        if exited:
            found.culprits = exited
            first = min(exited, key=lambda r: self.facts[r].ended_s or np.inf)
            if all(where[r].code == 0 for r in exited):
                found.cause = "early_exit"
                caught = any(self.facts[r].exit_code != 0 for r in exited)
                facts["culprit_left"] = "finished its script" if caught else "exited with code 0"
                calls = self.calls
                mine = (calls["pg"] == d.pg) & calls["idx"].notna() & calls["rank"].isin(exited)
                done = calls.loc[mine, "rank"].value_counts().reindex(exited, fill_value=0)
                facts["culprit_done"] = "/".join(map(str, sorted(set(done.tolist()))))
            else:
                fact = self.facts[first]
                found.cause = crash_cause(fact.exception)
                facts["error"] = _short(fact.exception or f"exit code {fact.exit_code}")
                facts["culprit_site"] = where[first].site
            return found
        if set(d.missing) & {r for c in self.cycles for r in c}:
            return self._cycle_finding(self.cycles, extra_waiting=waiting)
        if any(w.state == "busy" for w in where.values()):
            found.cause = "rank_conditional_collective"
            facts["culprit_doing"] = f"never called it ({_some(where)})"
            facts["other_doing"] = f"waited in {facts['other_op']}{_at(facts['other_site'])}"
        else:
            facts["culprit_doing"] = _some(where)
        return found

    @cached_property
    def last(self) -> pd.DataFrame:
        """Each rank's most recent call, indexed by rank."""
        return align.last_calls(self.calls)

    def _whereabouts(self, ranks: Iterable[int]) -> dict[int, _Where]:
        """What each of these ranks, which never made a call, was doing instead."""
        ranks = list(ranks)
        last = self.last[self.last.index.isin(ranks)].reset_index()
        sites = dict(zip(last["rank"], self._sites(last), strict=True)) if len(last) else {}
        calls = {
            int(r): row for r, row in zip(last["rank"], last.itertuples(index=False), strict=True)
        }
        return {r: self._where(r, calls.get(r), _opt(sites.get(r))) for r in ranks}

    def _where(self, rank: int, call: Any, site: str | None) -> _Where:
        f = self.facts.get(rank) or RankFacts(rank=rank)
        if f.exit_code is not None and not self.ev.terminated(f.exit_code):
            note = f.died or f"exited with code {f.exit_code}"
            where = self.ev.traceback_site(rank, f.exception) if f.exception else None
            ref = None
            if f.end_row is not None or f.row is not None:
                table = "events" if f.end_row is not None else "ranks"
                row = f.end_row if f.end_row is not None else f.row
                ref = EvidenceRef(table=table, row=int(row), rank=rank, note=note)
            return _Where(state="exited", site=where, note=note, ref=ref, code=f.exit_code)
        if f.exiting:
            if f.exception:  # it raised, and was on its way out when the stacks were taken
                where = self.ev.traceback_site(rank, f.exception)
                note = f"raised {_short(f.exception, 80)}; it was exiting at the capture"
                return _Where(state="exited", site=where, note=note, ref=None, code=f.exit_code)
            note = "its script had returned; it was exiting when its stack was captured"
            return _Where(state="exited", site=None, note=note, ref=None, code=0)
        at = f" at {site}" if site else ""
        if call is not None and (pd.isna(call.completed) or not call.completed):
            note = f"waiting in {call.op}{at}"
            ref = EvidenceRef(table=self.source, row=int(call.row), rank=rank, note=note)
            return _Where(state="in_call", site=site, note=note, ref=ref)
        if f.stack_site is not None and f.stack_waiting_in is None:
            note = f"outside any collective at {f.stack_site}"
            ref = EvidenceRef(table="stack_summary", row=int(f.stack_row), rank=rank, note=note)
            return _Where(state="busy", site=f.stack_site, note=note, ref=ref)
        if self.source == "collectives" and f.started:
            note = "outside any collective" + (f", after its call{at}" if site else "")
            return _Where(state="busy", site=None, note=note, ref=None)
        if call is None:
            return _Where(state="unknown", site=None, note="no record of any call", ref=None)
        note = f"its last recorded call, {call.op}{at}, had completed"
        ref = EvidenceRef(table=self.source, row=int(call.row), rank=rank, note=note)
        return _Where(state="unknown", site=None, note=note, ref=ref)

    # --- 4. still waiting, nothing diverged ------------------------------------------------
    @cached_property
    def cycles(self) -> list[list[int]]:
        """Cycles of ranks blocked in point-to-point calls on each other."""
        last = self.last
        blocked = last[~last["completed"].fillna(False).astype(bool) & last["peer"].notna()]
        waits = {int(r): int(p) for r, p in zip(blocked.index, blocked["peer"], strict=True)}
        ops = {int(r): str(o) for r, o in zip(blocked.index, blocked["op"], strict=True)}
        edges = {}
        for r, p in waits.items():
            match = waits.get(p) == r and _pairs(ops[r], ops.get(p, ""))
            if not match:  # a send facing a recv from the same peer would complete
                edges[r] = p
        return _cycles(edges)

    def _cycle_finding(
        self, cycles: list[list[int]], *, extra_waiting: Iterable[int] = ()
    ) -> _Finding:
        cycle = cycles[0]
        last = self.last
        rows = last.loc[cycle].reset_index()
        sites = self._sites(rows)
        members = sorted({r for c in cycles for r in c})
        waiting = sorted(
            (set(self._blocked(exclude=set(members))) | set(extra_waiting)) - set(members)
        )
        text = " -> ".join(
            f"rank {r} ({_p2p_text(rows['op'].iloc[i], rows['peer'].iloc[i])} at {sites.iloc[i]})"
            for i, r in enumerate(cycle)
        )
        info = CollectiveInfo(
            pg=str(rows["pg"].iloc[0]),
            pg_desc=_opt(rows["pg_desc"].iloc[0]),
            pg_ranks=list(self.members.get(str(rows["pg"].iloc[0]), ())),
            seq=_opt_int(rows["seq"].iloc[0]),
            op_by_rank={int(r): str(o) for r, o in zip(rows["rank"], rows["op"], strict=True)},
            site_by_rank={int(r): _opt(s) for r, s in zip(rows["rank"], sites, strict=True)},
            shapes_by_rank={
                int(r): _opt(s) for r, s in zip(rows["rank"], rows["shapes"], strict=True)
            },
            state_by_rank={
                int(r): f"waiting for rank {p}"
                for r, p in zip(rows["rank"], rows["peer"], strict=True)
            },
            source=self.source,
        )
        refs = [
            EvidenceRef(table=self.source, row=int(row), rank=int(r), note=f"{op} in flight")
            for r, row, op in zip(rows["rank"], rows["row"], rows["op"], strict=True)
        ]
        return _Finding(
            cause="p2p_cycle",
            culprits=members,
            waiting=waiting,
            facts={"cycle": text + f" -> rank {cycle[0]}"},
            collective=info,
            refs=refs,
        )

    def _still_waiting(self) -> _Finding | None:
        if self.cycles:
            return self._cycle_finding(self.cycles)
        calls = self.calls
        flying = calls[calls["idx"].notna() & ~calls["completed"].fillna(False).astype(bool)]
        if flying.empty:
            return None
        pg, idx = flying.groupby(["pg", "idx"], observed=True).size().idxmax()
        rows = calls[(calls["pg"] == pg) & (calls["idx"] == idx)]
        members = self.members.get(str(pg), ())
        silent = sorted(set(members) - self.evidence_ranks)
        d = align.Divergence(
            pg=str(pg), idx=int(idx), members=tuple(members), rows=rows, missing=tuple(silent)
        )
        sites = self._sites(rows)
        waiting = sorted(rows["rank"][~_done(rows)].tolist())
        facts = {
            "other_op": rows["op"].iloc[0],
            "other_site": _site_of(sites, rows),
            "collective": self._label(d),
        }
        return _Finding(
            cause="silent_rank" if silent else "stuck_collective",
            culprits=silent,
            waiting=waiting,
            facts=facts,
            collective=self._collective(d, sites=sites),
            refs=self._call_refs(d),
        )

    def _errors_only(self) -> _Finding | None:
        """No record of calls says anything; the error messages may (foreign logs)."""
        errors = self.ev.table("errors")
        mismatch = errors[errors["kind"] == "collective_mismatch"]
        if not mismatch.empty:
            return self._fingerprints(mismatch)
        barrier = errors[errors["kind"] == "monitored_barrier"]
        failed = sorted(
            {r for f in barrier["fields"] if isinstance(f, dict) for r in f.get("failed_ranks", [])}
        )
        if failed:
            reporters = sorted(set(barrier["rank"].dropna().astype(int).tolist()) - set(failed))
            return _Finding(
                cause="lagging_rank",
                culprits=failed,
                waiting=reporters,
                facts={
                    "other_op": "monitored_barrier",
                    "other_site": self._log_site(barrier),
                    "collective": _short(barrier["message"].iloc[0]),
                    "culprit_doing": "monitored_barrier timed out waiting for it",
                },
                refs=_error_refs(barrier, "monitored_barrier names the ranks that did not arrive"),
            )
        timeouts = errors[(errors["role"] == "timeout") | (errors["kind"] == "monitored_barrier")]
        if timeouts.empty:
            return None
        fields = timeouts["fields"].iloc[0]
        fields = fields if isinstance(fields, dict) else {}
        return _Finding(
            cause="collective_timeout",
            culprits=[],
            waiting=sorted(set(timeouts["rank"].dropna().astype(int).tolist())),
            facts={
                "other_op": fields.get("op_type") or "a collective",
                "collective": _short(timeouts["message"].iloc[0]),
            },
            refs=_error_refs(timeouts, "timed out"),
        )

    def _fingerprints(self, mismatch: pd.DataFrame) -> _Finding:
        """TORCH_DISTRIBUTED_DEBUG=DETAIL compared the ranks' next collective and printed both
        sides; the rank whose fingerprint differs from most is the odd one."""
        seen: dict[int, tuple[str, str, str, int | None]] = {}
        for fields in mismatch["fields"]:
            if not isinstance(fields, dict):
                continue
            for side in "ab":
                rank = fields.get(f"rank_{side}")
                if rank is not None:
                    seen[int(rank)] = tuple(  # type: ignore[assignment]
                        fields.get(f"{key}_{side}") for key in ("op_type", "shape", "dtypes", "seq")
                    )
        groups: dict[tuple[str, str, str], list[int]] = {}
        for rank, fp in sorted(seen.items()):
            groups.setdefault(fp[:3], []).append(rank)
        norm = max(groups, key=lambda k: (len(groups[k]), -groups[k][0]))
        culprits = sorted(r for k, ranks in groups.items() if k != norm for r in ranks)
        odd = next(k for k in groups if k != norm) if culprits else norm
        facts = {
            "culprit_op": odd[0],
            "other_op": norm[0],
            "culprit_shapes": odd[1],
            "other_shapes": norm[1],
            "culprit_dtypes": odd[2],
            "other_dtypes": norm[2],
            "culprit_site": self._log_site(mismatch[mismatch["rank"].isin(culprits)]),
            "other_site": self._log_site(mismatch[~mismatch["rank"].isin(culprits)]),
            "collective": "as TORCH_DISTRIBUTED_DEBUG=DETAIL reported it",
        }
        cause = (
            "op_mismatch"
            if odd[0] != norm[0]
            else "shape_mismatch"
            if odd[1] != norm[1]
            else "dtype_mismatch"
        )
        ranks = sorted(seen)
        seq = next((fp[3] for fp in seen.values() if fp[3] is not None), None)
        info = CollectiveInfo(
            pg="unknown",
            pg_desc=None,
            pg_ranks=ranks,
            seq=seq,
            op_by_rank={r: seen[r][0] for r in ranks},
            site_by_rank={r: self._log_site(mismatch[mismatch["rank"] == r]) for r in ranks},
            shapes_by_rank={r: seen[r][1] for r in ranks},
            dtypes_by_rank={r: seen[r][2] for r in ranks},
            state_by_rank=dict.fromkeys(ranks, "failed"),
            source="errors",
        )
        return _Finding(
            cause=cause,
            culprits=culprits,
            waiting=sorted(set(ranks) - set(culprits)),
            facts=facts,
            collective=info,
            refs=_error_refs(mismatch, "DETAIL fingerprints"),
        )

    def _log_site(self, errors: pd.DataFrame) -> str | None:
        """The user's line in the traceback above the first of these error lines."""
        for rank, message in zip(errors["rank"], errors["message"], strict=True):
            if pd.notna(rank):
                site = self.ev.traceback_site(int(rank), str(message))
                if site:
                    return site
        return None

    # --- 5. slow but not stuck ------------------------------------------------------------
    def _straggler(self) -> _Finding | None:
        spread = align.arrival_spread(self.calls, members=self.members)
        if spread.empty or spread["late_s"].iloc[0] < self.straggler_s:
            return None
        top = spread.iloc[0]
        late = int(top["late_rank"])
        d = align.Divergence(
            pg=str(top["pg"]),
            idx=int(top["idx"]),
            members=tuple(self.members.get(str(top["pg"]), ())),
            rows=self.calls[(self.calls["pg"] == top["pg"]) & (self.calls["idx"] == top["idx"])],
            missing=(),
        )
        sites = self._sites(d.rows)
        odd = d.rows[d.rows["rank"] == late]
        notes = []
        if self.ev.stalls:
            notes.append(
                f"the stall watchdog saw no progress for {self.ev.stalls[0].get('idle_s', 0):.1f} s, "
                "then the ranks went on"
            )
        return _Finding(
            cause="straggler",
            culprits=[late],
            waiting=sorted(set(d.rows["rank"].tolist()) - {late}),
            facts={
                "culprit_op": odd["op"].iloc[0],
                "culprit_site": _site_of(sites, odd),
                "late": f"{top['late_s']:.1f} s",
                "collective": self._label(d),
            },
            collective=self._collective(d, sites=sites),
            refs=self._call_refs(d),
            notes=notes,
        )

    # --- pieces ---------------------------------------------------------------------------
    def _sites(self, rows: pd.DataFrame) -> pd.Series:
        """Call sites of these calls. The probe records them; for flight-recorder entries they
        come from the frames of a sample of ranks per distinct call (``SITE_SAMPLE`` each), and
        the other ranks making the identical call get the site their sample agrees on."""
        if self.source == "collectives":
            return rows["site"]
        sample = rows.groupby("key", sort=False).head(SITE_SAMPLE)
        ranks = set(sample["rank"].astype(int).tolist())
        found = align.fr_sites(self.ev.fr_frames(ranks), sample)
        if len(sample) == len(rows):
            return found
        agreed = found.groupby(sample["key"]).agg(
            lambda s: s.iloc[0] if s.nunique() == 1 else pd.NA
        )
        sites = rows["key"].map(agreed).astype("string")
        sites.loc[sample.index] = found
        if not any("call sites" in note for note in self.missing_notes):
            self.missing_notes.append(
                f"call sites read from the frames of {len(sample)} of {len(rows)} ranks; the "
                "others making the identical call are shown at the site those agree on"
            )
        return sites

    def _label(self, d: align.Divergence) -> str:
        desc = d.rows["pg_desc"].dropna()
        name = f"group {d.pg}" + (f" ({desc.iloc[0]})" if len(desc) else "")
        return f"{name}, collective #{d.idx}"

    def _collective(
        self,
        d: align.Divergence,
        *,
        sites: pd.Series | None = None,
        absent: dict[int, _Where] | None = None,
    ) -> CollectiveInfo:
        rows = d.rows
        sites = self._sites(rows) if sites is None else sites
        ranks = sorted(set(d.members) | set(rows["rank"].tolist()))
        op = dict.fromkeys(ranks)
        site: dict[int, str | None] = dict.fromkeys(ranks)
        state: dict[int, str] = {}
        done = _done(rows).tolist()
        failed = _failed(rows).tolist()
        for r, o, s, ok, bad in zip(rows["rank"], rows["op"], sites, done, failed, strict=True):
            op[int(r)] = str(o)
            site[int(r)] = _opt(s)
            state[int(r)] = "failed" if bad else ("completed" if ok else "waiting")
        absent = dict(absent or {})
        unknown = [r for r in ranks if r not in state and r not in absent]
        absent.update(self._whereabouts(r for r in unknown if r in self.evidence_ranks))
        for r in ranks:
            if r in state:
                continue
            f = self.facts.get(r) or RankFacts(rank=r)
            if r not in self.evidence_ranks:
                state[r] = "no record of this rank's calls" + (f" ({f.died})" if f.died else "")
                continue
            site[r] = absent[r].site
            if self._known_absent(r):
                state[r] = f"never called it: {absent[r].note}"
            else:
                state[r] = (
                    f"no record of it (its record may stop early: no ring file, no end "
                    f"event): {absent[r].note}"
                )
        desc = rows["pg_desc"].dropna()
        return CollectiveInfo(
            pg=d.pg,
            pg_desc=str(desc.iloc[0]) if len(desc) else None,
            pg_ranks=list(d.members),
            seq=d.idx,
            op_by_rank=op,
            site_by_rank=site,
            shapes_by_rank={
                int(r): _opt(s) for r, s in zip(rows["rank"], rows["shapes"], strict=True)
            },
            dtypes_by_rank={
                int(r): _opt(s) for r, s in zip(rows["rank"], rows["dtypes"], strict=True)
            },
            state_by_rank=state,
            source=self.source,
        )

    def _known_absent(self, rank: int) -> bool:
        """Whether a rank's record of calls is whole, so a call missing from it was not made:
        the probe's, when written durably at every call or flushed at its end; a dump's, up to
        the moment it was taken."""
        if self.source == "collectives":
            f = self.facts.get(rank)
            return f is not None and f.record_complete
        return rank in self.evidence_ranks

    def _call_refs(self, d: align.Divergence) -> list[EvidenceRef]:
        rows = d.rows
        keys = rows["key"]
        common = keys.mode().iloc[0] if len(keys) else None
        odd = rows[keys != common]
        usual = rows[keys == common].head(MAX_REFS)
        out = []
        for part in (odd, usual):
            for r, row, op, done in zip(
                part["rank"], part["row"], part["op"], _done(part), strict=True
            ):
                note = f"{op} #{d.idx} on group {d.pg}" + ("" if done else ", not completed")
                out.append(EvidenceRef(table=self.source, row=int(row), rank=int(r), note=note))
        return out

    def _require_evidence(self) -> Diagnosis | None:
        """Raise when there is nothing at all; an ``unknown`` diagnosis when there were files
        but none could be read."""
        ev = self.ev
        if (
            self.calls.empty
            and ev.table("errors").empty
            and ev.table("logs").empty
            and ev.table("events").empty
            and ev.table("stacks").empty
            and all(f.exit_code is None for f in self.facts.values())
            and not ev.info
        ):
            where = f" in {ev.path}" if ev.path else ""
            unread = self._unreadable()
            if unread:
                self.missing_notes += [f"could not read {text}" for text in unread]
                return self._unknown(
                    f"Nothing{where} could be read: {len(unread)} file(s) were found but none "
                    "holds readable evidence (see missing). The evidence cannot tell what "
                    "happened."
                )
            raise ValueError(
                f"nothing to diagnose{where}: no probe events, flight-recorder entries, logs or "
                "exit codes were found; pass a run directory or a folder with dumps or logs"
            )
        return None

    def _unreadable(self) -> list[str]:
        problems = self.ev.table("problems")
        return [
            f"{source}: {reason}"
            for source, reason in zip(problems["source"], problems["reason"], strict=True)
        ]

    def _note_missing(self) -> None:
        """Say what evidence is not there: ranks without records, ranks whose record stops
        early (and why it may), and (then) the files that could not be read, which may be why.
        Listing unreadable files loads every table, so it is done only when something is
        missing."""
        notes = self.missing_notes
        world = sorted(set(self.ev.world).union(*self.members.values()))
        lacking = [r for r in world if r not in self.evidence_ranks]
        what = "probe events" if self.source == "collectives" else "flight-recorder dump"
        if lacking:
            notes.append(f"no {what} from {_who(lacking)}")
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
        notes += [f"{_who(ranks)}: {note}" for note, ranks in early.items()]
        if notes:
            notes += [f"could not read {text}" for text in self._unreadable()]

    def _early_stop(self, f: RankFacts) -> str | None:
        """Why a rank's evidence may stop before its end, if it may."""
        if f.signal == "SIGKILL":
            kept = (
                "its calls up to its death are in its ring file"
                if f.ring
                else (
                    "its last calls (up to half a second of them) may be missing: it has no ring file"
                )
            )
            return (
                "no stacks or flight-recorder dump from its last moment: a process killed by "
                f"SIGKILL cannot write them; {kept}"
            )
        complete = f.record_complete or self.source != "collectives"
        if f.started and f.exit_code is not None and not complete:
            at = _clock(f.last_seen_s)
            return (
                f"its record of calls stops{' at ' + at if at else ''} with no end event and "
                "no ring file: calls after that are unknown"
            )
        if f.signal in SIGNAL_TEXT and f.stack_reason != f.signal:
            return f"no stacks from its {f.signal}: faulthandler was not on (not probed?)"
        return None

    def _torchrun_notes(self, culprits: list[int]) -> list[str]:
        errors = self.ev.table("errors")
        child = errors[errors["kind"] == "torchrun_child_failed"]
        notes = []
        for fields in child["fields"]:
            named = fields.get("root_rank") if isinstance(fields, dict) else None
            if named is None or int(named) in culprits or not culprits:
                continue
            notes.append(
                f"torchrun's summary names rank {named} as the root cause (its first observed "
                f"failure); that failure followed from {_who(culprits)}'s, above"
            )
            break
        return notes


def _in_flight_unseen(probe: pd.DataFrame, fr: pd.DataFrame, *, ignore: set[int]) -> bool:
    """Some rank (not in ``ignore``) has a collective in flight in the recorder but none in the
    probe's record, and not one the probe saw return either: a dump taken as a rank fails can
    race gloo's retirement of the rank's last work, which the probe saw complete."""
    open_ = fr.loc[~fr["completed"].fillna(False).astype(bool) & ~fr["rank"].isin(ignore)]
    probe_open = set(probe.loc[~probe["completed"].fillna(False).astype(bool), "rank"].tolist())
    returned = set(
        zip(probe["rank"].tolist(), probe["pg"].astype(str), probe["seq"].tolist(), strict=True)
    )
    return any(
        rank not in probe_open and (rank, pg, seq) not in returned
        for rank, pg, seq in zip(
            open_["rank"].tolist(), open_["pg"].astype(str), open_["seq"].tolist(), strict=True
        )
    )


def _earliest(rows: pd.DataFrame) -> float:
    start = rows["t_start_s"].min()
    return np.inf if pd.isna(start) else float(start)


def _done(rows: pd.DataFrame) -> pd.Series:
    """Calls that returned normally."""
    return rows["completed"].fillna(False).astype(bool) & ~_failed(rows)


def _failed(rows: pd.DataFrame) -> pd.Series:
    """Calls that raised."""
    return rows["ok"].eq(False).fillna(False).astype(bool)


def _p2p_text(op: str, peer: Any) -> str:
    return f"{op} {'from' if 'recv' in str(op) else 'to'} rank {peer}"


def _pairs(a: str, b: str) -> bool:
    sends, recvs = {"send", "isend"}, {"recv", "irecv"}
    return (a in sends and b in recvs) or (a in recvs and b in sends)


def _cycles(edges: dict[int, int]) -> list[list[int]]:
    """Cycles of a graph where every node has at most one outgoing edge."""
    seen: set[int] = set()
    out = []
    for start in sorted(edges):
        path: list[int] = []
        node: int | None = start
        pos: dict[int, int] = {}
        while node is not None and node not in seen and node not in pos:
            pos[node] = len(path)
            path.append(node)
            node = edges.get(node)
        if node is not None and node in pos:
            out.append(path[pos[node] :])
        seen |= set(path)
    return out


def _who(ranks: Iterable[int], empty: str = "no rank") -> str:
    ranks = sorted(ranks)
    if not ranks:
        return empty
    return ("rank " if len(ranks) == 1 else "ranks ") + compact_ranks(ranks)


def _some(where: dict[int, _Where], limit: int = 4) -> str:
    """``rank 1: note; rank 2: note`` for the first few ranks, then how many more."""
    text = "; ".join(f"rank {r}: {w.note}" for r, w in list(where.items())[:limit])
    more = len(where) - limit
    return text + (f"; and {more} more" if more > 0 else "")


def _site_of(sites: pd.Series, rows: pd.DataFrame) -> str | None:
    values = sites.loc[rows.index].dropna().unique().tolist()
    return "/".join(map(str, values)) or None


def _clock(t_s: float | None) -> str | None:
    """``12:43:05.812`` (local time), or None."""
    if t_s is None or not np.isfinite(t_s):
        return None
    return dt.datetime.fromtimestamp(t_s).strftime("%H:%M:%S.%f")[:-3]


def _at(site: str | None) -> str:
    """`` at train.py:12``, or nothing when the site is unknown."""
    return f" at {site}" if site else ""


#: What a native error text puts before its message: ``what():``, ``[enforce fail at x.cc:1]``,
#: ``[/path/to/pair.cc:537]``.
_NATIVE_PREFIX = re.compile(
    r"^(?:what\(\):\s*)?(?:(?P<type>[\w.:]+: )?\[(?:enforce fail at )?[^\]\s]*:\d+\]\s*)?"
)


def _short(text: Any, limit: int = 200) -> str:
    text = "" if text is None or (isinstance(text, float) and np.isnan(text)) else str(text)
    text = _NATIVE_PREFIX.sub(lambda m: m["type"] or "", text.strip().split("\n", 1)[0])
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _opt(value: Any) -> str | None:
    return (
        None
        if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value))
        else str(value)
    )


def _opt_int(value: Any) -> int | None:
    return None if pd.isna(value) else int(value)


def _error_refs(errors: pd.DataFrame, note: str) -> list[EvidenceRef]:
    return [
        EvidenceRef(
            table="errors", row=int(pos), rank=None if pd.isna(r) else int(r), note=f"{k}: {note}"
        )
        for pos, r, k in zip(errors.index[:MAX_REFS], errors["rank"], errors["kind"], strict=False)
    ]
