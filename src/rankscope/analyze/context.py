"""What the rules of a diagnosis read: the facts of one run, derived once from its tables.

A :class:`Context` holds the merged calls (:mod:`rankscope.analyze.calls`), the groups' members,
where each group's ranks part (:mod:`rankscope.analyze.align`), the wait-for graph
(:mod:`rankscope.analyze.waits`), the call sites, the parting lines and what each rank's process
did (its whereabouts); each is computed on first use and kept. What the diagnosis says of them
(a collective's description, the evidence references, the chain of waits, what is missing) is
:class:`~rankscope.analyze.wording.Phrasing`, which a ``Context`` inherits. Nothing here decides a
cause: the rules do (:mod:`rankscope.analyze.rules`).
"""

from __future__ import annotations

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
    done,
    failed,
    fr_completed,
    fr_sites,
    merge_calls,
    opt,
    opt_int,
)
from rankscope.analyze.diagnosis import EvidenceRef
from rankscope.analyze.evidence import Evidence, RankFacts
from rankscope.analyze.parting import (
    Frame,
    Parting,
    argument_origin,
    find_parting,
    left_loop_by_sites,
    loop_around,
    loop_parting,
    rank_path,
    without_machinery,
)
from rankscope.analyze.paths import (
    CallPaths,
    FirstDivergence,
    earliest,
    first_divergences,
    p2p_divergence,
    step_at,
    unmatched_p2p,
)
from rankscope.analyze.waits import WaitGraph, wait_graph
from rankscope.analyze.wording import Phrasing, short

#: Ranks per distinct call whose flight-recorder frames are read to find its call site.
SITE_SAMPLE = 8


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


class Context(Phrasing):
    """The derived facts of one run's evidence, for the rules to read (and, inherited, their
    phrasing)."""

    def __init__(self, ev: Evidence, *, straggler_s: float):
        self.ev = ev
        self.straggler_s = straggler_s
        self.facts = ev.ranks
        self.notes_of_sites: list[str] = []
        self._partings: dict[
            tuple[tuple[int, ...], tuple[int, ...]], tuple[Parting | None, str]
        ] = {}
        self._paths: dict[int, list[Frame] | None] = {}

    # --- the calls ------------------------------------------------------------------------
    @cached_property
    def fr(self) -> pd.DataFrame:
        return self.ev.table("flight_recorder")

    @cached_property
    def call_paths(self) -> CallPaths:
        """The path of each of the probe's calls and of the recorder's entries, coded alike
        across ranks and sources."""
        paths = self.ev.table("paths")
        fr = self.fr.get("path")
        return CallPaths(self.ev.table("collectives"), paths, fr)

    @cached_property
    def probe_calls(self) -> pd.DataFrame:
        calls = calls_from_probe(self.ev.table("collectives"), self.call_paths.codes)
        if not calls.empty:  # the user's line first where a library made the call
            calls["site"] = self.call_paths.user_sites(calls["path"].to_numpy(), calls["site"])
        return calls

    @cached_property
    def calls(self) -> pd.DataFrame:
        """Every rank's calls, the probe's and the flight recorder's as one sequence per rank.

        gloo's recorder retires a collective that failed as it retires one that completed, with
        no completion time for either. A rank that raised a victim's error (a peer gone, a
        timeout) outside its Python calls raised it from a collective torch issued (a
        backward's bucket all_reduce, a Work waited on): its last such entry did not complete,
        and it waited there."""
        fr = calls_from_flight_recorder(self.fr, self.call_paths.fr_codes)
        nccl = self.fr["backend"].eq("nccl").to_numpy(dtype=bool)[fr["row"].to_numpy()]
        calls = merge_calls(self.probe_calls, fr, backend_completes=nccl)
        victims = [
            r
            for r in self.ev.waiters - self.raised_in_call
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
            calls.loc[rows.to_numpy(), "state"] = "issued"
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
    def untimed_nccl(self) -> list[int]:
        """Ranks with an uncompleted nccl entry and no start time on any of their entries
        (timing off: started or not, the recorder cannot say)."""
        fr = self.fr
        if fr.empty or "time_discovered_started_ns" not in fr:
            return []
        rank = fr["rank"].array.to_numpy(dtype=np.int64, na_value=-1)
        nccl = fr["backend"].eq("nccl").to_numpy(dtype=bool) & (rank >= 0)
        open_ = np.unique(rank[nccl & ~fr_completed(fr).to_numpy(dtype=bool)])
        if not len(open_):
            return []
        timed = np.zeros(int(rank.max()) + 1, dtype=bool)
        timed[rank[nccl & fr["time_discovered_started_ns"].notna().to_numpy(dtype=bool)]] = True
        return [int(r) for r in open_ if not timed[r]]

    @cached_property
    def ranks_with_entries(self) -> set[int]:
        """Ranks with flight-recorder entries."""
        rank = self.fr["rank"].array.to_numpy(dtype=np.int64, na_value=-1)
        counts = np.bincount(rank[rank >= 0], minlength=1)  # a count per rank, not a sort
        return set(np.flatnonzero(counts).tolist())

    @cached_property
    def dumped_ranks(self) -> set[int]:
        """Ranks whose flight recorder was dumped (with entries or without)."""
        status = self.ev.table("pg_status")["rank"].dropna().astype(int).tolist()
        return set(status) | self.ranks_with_entries

    @cached_property
    def complete_ranks(self) -> align.Complete:
        """Ranks whose record starts at their first call: the probe's (on the groups it
        numbers), and a recorder's ring buffer that still holds its first entry (``record_id``
        0), or a dump that holds none."""
        probed = {r for r, f in self.facts.items() if f.started}
        fr = self.fr
        rank = fr["rank"].array.to_numpy(dtype=np.int64, na_value=-1)
        record = fr["record_id"].array.to_numpy(dtype=np.int64, na_value=-1)
        first = set(np.unique(rank[record == 0]).tolist())
        without = self.dumped_ranks - self.ranks_with_entries
        # the groups whose numbered calls all come from the recorder (counted by group code:
        # a job of thousands of ranks has tens of millions of calls)
        calls = self.calls
        pg = calls["pg"].astype("category")
        codes = np.asarray(pg.array.codes, dtype=np.int64)
        numbered = calls["seq"].notna().to_numpy(dtype=bool) & (codes >= 0)
        from_probe = calls["source"].ne("flight_recorder").to_numpy(dtype=bool)
        size = len(pg.cat.categories)
        seen = np.bincount(codes[numbered], minlength=size) > 0
        by_probe = np.bincount(codes[numbered & from_probe], minlength=size) > 0
        names = pg.cat.categories
        return align.Complete(
            probed=frozenset(probed),
            recorded=frozenset(first | without),
            by_recorder=frozenset(str(names[c]) for c in np.flatnonzero(seen & ~by_probe)),
        )

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
    def p2p_unmatched(self) -> dict[tuple[int, int], int]:
        """Point-to-point pairs (sender, receiver) whose calls do not meet, and by how many."""
        return unmatched_p2p(self.calls)

    @cached_property
    def p2p_divergence(self) -> FirstDivergence | None:
        """Where point-to-point calls that do not meet began (:func:`p2p_divergence`)."""
        return p2p_divergence(self.calls, self.call_paths, self.p2p_unmatched)

    @cached_property
    def first_divergence(self) -> FirstDivergence | None:
        """Where the ranks' paths first part (:mod:`rankscope.analyze.paths`), of every group
        the earliest in time, with the step the culprits had marked there."""
        divs = first_divergences(
            self.calls,
            self.call_paths,
            members=self.members,
            ranks=self.evidence_ranks,
            complete=self.complete_ranks,
        )
        d = earliest([*divs, *([self.p2p_divergence] if self.p2p_divergence else [])], self.calls)
        if d is None:
            return None
        d = self._branch_taken(d)
        own = d.culprit_class() or d.classes[0]
        if own.row is not None:
            t = self.calls.at[own.row, "t_start_s"]
            step = step_at(self.ev.table("events"), own.ranks[0], None if pd.isna(t) else t)
            d = replace(d, step=step)
        return d

    def _branch_taken(self, d: FirstDivergence) -> FirstDivergence:
        """``d`` with the larger class named where the size alone told the culprits, and the
        larger class took a branch the smaller passed by (an ``if`` without its ``else``, by the
        two classes' paths) into a call new on the group, while the smaller made a call it had
        made before: the group's path so far is the smaller's, and the larger left it (a
        checkpoint on a timer that fired on most ranks). ``decided_by`` is ``branch``."""
        small, big = d.culprit_class(), d.other_class()
        if (
            d.decided_by != "fewer"
            or len(d.classes) != 2
            or small is None
            or small.row is None
            or big.row is None
            or not self.made_before(small.row)
            or self.made_before(big.row)
        ):
            return d
        paths = {small.ranks[0]: list(small.path), big.ranks[0]: list(big.path)}
        p, _ = find_parting(list(small.ranks), list(big.ranks), paths, diverged=True)
        if p is None or p.arms or p.kind not in ("if", "elif") or set(p.ranks_in) != set(big.ranks):
            return d
        classes = sorted(
            (replace(c, culprit=c is big) for c in d.classes),
            key=lambda c: (not c.culprit, -len(c.ranks), c.ranks),
        )
        return replace(d, classes=tuple(classes), decided_by="branch", extra=-d.extra)

    def made_before(self, row: int) -> bool:
        """Whether the call at ``calls.loc[row]`` is one its rank made before on its group,
        from the same path."""
        calls, call = self.calls, self.calls.loc[row]
        before = calls[
            (calls["rank"] == call["rank"])
            & (calls["pg"] == call["pg"])
            & (calls["order"] < call["order"])
            & (calls["key"] == call["key"])
            & (calls["path"] == call["path"])
        ]
        return not before.empty

    def went_further(self, fd: FirstDivergence) -> bool:
        """Whether the culprits of ``fd`` made one more of a call they had made before where
        the others went on to a call they too had made before: an inner loop's extra pass (the
        final snapshot would take the others for the ones that ran short). Others that moved
        on to something new (the barrier after the loop) did run short of the loop."""
        own, other = fd.culprit_class(), fd.other_class()
        return (
            fd.extra > 0
            and own is not None
            and own.row is not None
            and other.row is not None
            and self.made_before(own.row)
            and self.made_before(other.row)
        )

    @cached_property
    def raised_in_call(self) -> set[int]:
        """Ranks whose own recorded call raised (the probe's: a collective that failed)."""
        probe = self.ev.table("collectives")
        return set(probe.loc[failed(probe), "rank"].dropna().astype(int).tolist())

    @cached_property
    def victims(self) -> set[int]:
        """Ranks that failed because of others: a call of theirs raised, or their own texts say
        they waited on others."""
        return self.raised_in_call | self.ev.waiters

    @cached_property
    def gone(self) -> set[int]:
        """Ranks that left on their own (an exit that no teardown or stop explains, or a script
        that had returned): they wait for nothing. Not a victim, which left because a call of
        its own failed or its own texts say it waited on others."""
        out = set()
        for rank, f in self.facts.items():
            left = f.exiting or (f.exit_code is not None and not self.ev.terminated(f.exit_code))
            if left and rank not in self.victims:
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
        fd = self.first_divergence
        if (
            key not in self._partings
            and fd is not None
            and fd.kind == "collective"
            and set(key[0]) == set(fd.culprits)
            and set(key[1]) <= set(fd.others)
        ):
            found = self.first_parting
            if found[0] is not None:
                self._partings[key] = found
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
                if found[0] is None and own[0] and own == theirs:
                    # one line, another root or peer: the branch that set it before the call
                    last = self.last.loc[key[0][0]]
                    origin = argument_origin(
                        *own,
                        str(last["op"]),
                        *map(list, key),
                        self.ev.table("values"),
                        self.callers_of(last),
                    )
                    found = (origin, "") if origin is not None else found
            self._partings[key] = found
        return self._partings[key]

    @cached_property
    def first_parting(self) -> tuple[Parting | None, str]:
        """The decision that separates the classes of the first divergence, read from the
        paths of their calls there (a class that made no call: its rank's last stacks), with the
        values the stacks captured (at the stop: where that is later, the diagnosis says so)."""
        fd = self.first_divergence
        own = fd.culprit_class() if fd is not None else None
        if fd is None or own is None:
            return None, "nothing tells which side left the common path"
        other = fd.other_class()
        paths = {}
        last_call = False
        for c in (own, other):
            path = list(c.path) if c.op is not None else self.rank_path(c.ranks[0])
            if not path and c.op is None:  # it left with no stacks: its last recorded call
                path = list(self.last_call_path(c.ranks[0]))
                last_call = bool(path)
            if path:
                paths[c.ranks[0]] = path
        values = self.ev.table("values")
        found = find_parting(list(own.ranks), list(other.ranks), paths, values, diverged=True)
        if found[0] is None and last_call and len(set(map(tuple, paths.values()))) == 1:
            # it made the others' call there before, fewer times, and left: the loop holding it
            loop = loop_around(paths[own.ranks[0]], list(own.ranks), list(other.ranks), values)
            found = (loop, "") if loop is not None else found
        return found

    def last_call_path(self, rank: int) -> tuple[Frame, ...]:
        """The path of ``rank``'s last call the probe recorded (process-group management, such
        as ``destroy_process_group``, included); none without one."""
        probe = self.ev.table("collectives")
        mine = np.flatnonzero(probe["rank"].to_numpy(dtype=np.int64, na_value=-1) == rank)
        return self.call_paths.of(int(self.call_paths.codes[mine[-1]])) if len(mine) else ()

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

    def rank_path(self, rank: int) -> list[Frame] | None:
        """``rank``'s frames where it is now, or where it left (its last stacks, its
        traceback), outermost first; None without any."""
        return self._path(rank)

    def _path(self, rank: int) -> list[Frame] | None:
        """``rank``'s frames in its latest stacks (its thread that waits in a call, else its
        main thread), or its traceback's when it raised and its stacks show no code of its."""
        if rank in self._paths:
            return self._paths[rank]
        w = self.graph.waits.get(rank)
        f = self.facts.get(rank)
        thread = w.thread if w is not None and w.thread else None
        thread = thread or (f.main_thread if f is not None else None)
        path = rank_path(self.ev.table("stacks"), rank, thread=thread)
        if not path and f is not None and f.exception:
            path = without_machinery(self.ev.traceback_path(rank, f.exception))
        self._paths[rank] = path
        return path

    def call_frame(self, rank: int) -> Frame:
        """(file, function, line) of ``rank``'s latest call as the probe recorded it; blanks
        where it did not."""
        if rank not in self.last.index:
            return ("", "", 0)
        return self.frame_of(self.last.loc[rank])

    def callers_of(self, call: pd.Series) -> list[Frame]:
        """The frames that called a call's own frame (:meth:`frame_of`), innermost first, from
        its recorded path; none without one."""
        code = call.get("path")
        path = list(self.call_paths.of(int(code))) if pd.notna(code) else []
        own = self.frame_of(call)
        if not path or (path[-1][0], path[-1][2]) != (own[0], own[2]):
            return []
        return path[-2::-1]

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

    def left_group(self, rank: int, pg: str) -> Any:
        """The probe's row of ``rank``'s completed ``destroy_process_group`` of group ``pg``
        (or of the default group, which ends every group) with no ``init_process_group``
        after it: the rank left the group and will make no call on it again, whatever it does
        now. None where it did not."""
        probe = self.ev.table("collectives")
        mine = probe[(probe["rank"] == rank).fillna(False).to_numpy()]
        if mine.empty:
            return None
        ops = mine["op"].astype("string")
        ours = (mine["pg"].astype("string") == pg) | (mine["pg_desc"] == "default_pg")
        gone = (ops == "destroy_process_group") & ours.fillna(False) & done(mine)
        if not gone.any():
            return None
        row = int(np.flatnonzero(gone.to_numpy())[-1])
        if (ops.iloc[row + 1 :] == "init_process_group").any():
            return None  # it joined again
        return mine.iloc[row]

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

    # --- where calls were made ------------------------------------------------------------
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
                f"call sites read from the recorder's frames of {len(sample)} of the "
                f"{len(need)} calls without one (up to {SITE_SAMPLE} of each identical call); "
                "the others are shown at the site their sample agrees on"
            )
            if note not in self.notes_of_sites:
                self.notes_of_sites.append(note)
        return sites

    def known_absent(self, rank: int, pg: str | None = None) -> bool:
        """Whether a rank's record of calls (on group ``pg``) is whole, so a call missing from
        it was not made: the probe's, when written durably at every call or flushed at its end;
        a dump's, up to the moment it was taken. On a group the recorder numbers (torch's own
        calls, which the probe does not see) only a dump tells."""
        if pg is not None and pg in self.complete_ranks.by_recorder:
            return rank in self.dumped_ranks
        f = self.facts.get(rank)
        if f is not None and f.started:
            return f.record_complete
        return rank in self.evidence_ranks

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
            if f.end_row is None:
                note = "its script had returned; it was exiting when its stack was captured"
                return Where(state="exited", site=None, note=note, ref=None, code=0)
            note = f.died or "its script had ended; it was exiting"
            ref = EvidenceRef(table="events", row=int(f.end_row), rank=rank, note=note)
            code = f.end_code if f.end_code is not None else 0
            return Where(state="exited", site=f.end_site, note=note, ref=ref, code=code)
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
