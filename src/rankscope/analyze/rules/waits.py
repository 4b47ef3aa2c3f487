"""7. ``waits``: the wait-for graph across every group leads to the culprit: a rank waited on
that waits for nobody (what was it doing instead: exited, destroyed the group, crashed, out of
data, blocked on a lock or a sleep, busy elsewhere, silent: :func:`_decide_root_cause`), or,
where every rank waits, the rank of a cycle that left the program order the others share (a
skipped call, a point-to-point cycle), or every rank stuck in one collective."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from rankscope.analyze.activity import WAITS, Activity, passed, user_path
from rankscope.analyze.calls import done, opt, opt_int
from rankscope.analyze.causes import ASKED_EXIT_FIX, CELL_RAISED_FIX, UNEVEN_FIX, Cause
from rankscope.analyze.context import Context, Where
from rankscope.analyze.diagnosis import CollectiveInfo, who_of
from rankscope.analyze.parting import runs_alike
from rankscope.analyze.rules.failures import crash_story, failure_cause
from rankscope.analyze.rules.finding import Decided, Finding, rule
from rankscope.analyze.rules.loops import fewer_calls, left_the_loop, thread_notes
from rankscope.analyze.rules.mismatch import ran_out, took_a_branch
from rankscope.analyze.waits import Wait, departed
from rankscope.analyze.wording import MAX_REFS, at, short, site_of
from rankscope.collect import short_site
from rankscope.state import agree


@rule(70)
def waits(ctx: Context) -> Finding | None:
    """Follow the wait-for graph to its roots (or its cycle) and say what the culprit was
    doing."""
    g = ctx.graph
    if not g.waits:
        return None
    if g.roots:
        # Ranks known to have stayed away come first; ranks that left no record are said to be
        # missing, not blamed, unless nothing else is there to blame.
        known = [r for r in g.roots if r in ctx.evidence_ranks]
        # A root that failed because of a peer (its call raised gloo's "Connection closed by
        # peer" when a rank that had returned went away) only waited: the rank it waited on is
        # the culprit, and it is one of the ranks left waiting.
        own = [r for r in known if r not in ctx.victims]
        found = _roots(ctx, own or known or list(g.roots), also_waiting=set(known) - set(own))
    elif g.cycles:
        found = _cycle(ctx, list(g.cycles[0]))
    else:
        return _all_stuck(ctx)
    return found


def _roots(ctx: Context, roots: list[int], *, also_waiting: set[int] = frozenset()) -> Finding:
    """Ranks the waiting ranks wait for, which wait for nothing themselves (``also_waiting``:
    ranks whose wait ended in an error a peer caused, left waiting with the others)."""
    g = ctx.graph
    waiting = g.waiting_on(roots)
    direct = [r for r in waiting if g.waits[r].waits_for & set(roots)]
    w = g.waits[direct[0]] if direct else g.waits[waiting[0]]
    waiting = sorted(set(waiting) | (set(also_waiting) - set(roots)))
    d = ctx.divergence_with(set(roots)) or (ctx.cell(w.pg, w.seq) if w.seq is not None else None)
    where = ctx.whereabouts(roots)
    rows = d.rows if d is not None else ctx.calls.iloc[[w.row]]
    rows_waiting = rows[~done(rows)] if len(rows) else rows
    sites = ctx.sites(rows) if len(rows) else pd.Series(dtype="string")
    facts = {
        "others": who_of(waiting),
        "other_op": w.op,
        "other_site": (site_of(sites, rows_waiting) if len(rows_waiting) else None) or w.site,
        "collective": ctx.label(d) if d is not None else w.where(),
        "group": f"group {w.pg}",
    }
    refs = (ctx.call_refs(d) if d is not None else []) + [
        x.ref for x in where.values() if x.ref is not None
    ]
    decided = _decide_root_cause(ctx, sorted(roots), waiting, where, w, facts)
    return Finding(
        cause=decided.cause,
        culprits=decided.culprits,
        waiting=waiting,
        recipe=decided.recipe,
        facts={**facts, **decided.facts},
        collective=ctx.collective(d, sites=sites, absent=where) if d is not None else None,
        refs=refs,
        notes=decided.notes,
    )


def _decide_root_cause(
    ctx: Context,
    roots: list[int],
    waiting: list[int],
    where: dict[int, Where],
    w: Wait,
    facts: dict[str, Any],
) -> Decided:
    """The cause from what the roots were doing: exited (out of data, or crashed), silent,
    blocked on something outside the collectives, busy elsewhere; else they lag, doing what
    their whereabouts say. (A rank known to have left the others' loop early is in another
    collective or gone: the mismatch and cycle rules.)"""
    exited = [r for r, x in where.items() if x.state == "exited"]
    if exited:
        first = min(exited, key=lambda r: ctx.facts[r].ended_s or np.inf)
        asked = [r for r in exited if ctx.facts[r].end_how in ("sys_exit", "os._exit")]
        if all(where[r].code == 0 for r in exited) or asked:
            caught = any(ctx.facts[r].exit_code != 0 for r in exited)
            ending = ctx.facts[exited[0]].ending if len(exited) == 1 else None
            facts = {
                "culprit_left": ending
                or ("finished its script" if caught else "exited with code 0"),
                "culprit_done": _done_on(ctx, exited, w.pg),
                "exit_fix": UNEVEN_FIX,
            }
            if asked:  # the user's code asked for it: its site and last words, not D9's story
                f = ctx.facts[asked[0]]
                facts["culprit_left"] = f.ending or facts["culprit_left"]
                facts["culprit_site"] = f.end_site
                facts["exit_fix"] = ASKED_EXIT_FIX.format(exit_at=at(f.end_site))
                return Decided(Cause.early_exit, asked, facts, recipe=None)
            short_of = _returned_short(ctx, exited, waiting)
            if short_of is not None:
                return ran_out(exited, done=short_of, went="returned from its script (exit 0)")
            return Decided(Cause.early_exit, exited, facts)
        fact = ctx.facts[first]
        cause = failure_cause(text=fact.exception)
        story = crash_story(cause, fact.exception, errors=ctx.ev.table("errors"), rank=first)
        return Decided(
            cause,
            exited,
            {
                "error": short(fact.exception or f"exit code {fact.exit_code}"),
                "culprit_site": where[first].site,
                **story.facts,
            },
            notes=story.notes,
            recipe=story.recipe,
        )
    left = {r: row for r in roots if (row := ctx.left_group(r, w.pg)) is not None}
    if left:
        # It destroyed the group: whatever it does now, it will never make the call. Like a
        # return from its script, where it made the others' call fewer times: it ran out.
        gone = sorted(left)
        a = ctx.activity(gone[0])
        went = f"destroyed its process group{at(opt(left[gone[0]]['site']))}" + (
            f", and is now {a.doing}" if a is not None and a.kind else ""
        )
        short_of = _returned_short(ctx, gone, waiting, ended=False)
        if short_of is not None:
            return ran_out(gone, done=short_of, went=went)
        told = {"culprit_left": went, "culprit_done": _done_on(ctx, gone, w.pg)}
        return Decided(Cause.early_exit, gone, {**facts, **told, "exit_fix": UNEVEN_FIX})
    unrecorded = [r for r in roots if r not in ctx.evidence_ranks]
    if unrecorded and len(unrecorded) == len(roots):
        return silent(roots)
    raised = [
        r
        for r in finished_cell(ctx, roots, w, state="raised")
        if not (ctx.facts[r].cell_error or "").startswith("KeyboardInterrupt")
    ]  # an interrupt is the user's stop, not the cell's error
    if raised:
        # Its cell failed on it before the call: the others wait for a call it will not make.
        f = ctx.facts[raised[0]]
        cause = failure_cause(text=f.cell_error)
        story = crash_story(cause, f.cell_error)
        told = {
            "error": short(f.cell_error or "an error"),
            "culprit_site": f.cell_error_site,
            **story.facts,
        }
        if cause == Cause.rank_crashed and not told["known"]:
            told["crash_fix"] = CELL_RAISED_FIX
        return Decided(
            cause,
            raised,
            told,
            notes=[
                f"{who_of(raised)}'s cell [{f.cell}] raised before {w.op}, which "
                f"{facts['others']} {agree(facts['others'], 'waits', 'wait')} in"
                f"{at(facts['other_site'])}",
                *story.notes,
            ],
            recipe=story.recipe,
        )
    finished = finished_cell(ctx, roots, w)
    if finished:
        # Like a rank that ended its script, for that cell: it will never make the call.
        cell = ctx.facts[finished[0]].cell
        return took_a_branch(
            finished,
            doing=f"finished cell [{cell}] without calling {w.op}",
            others_doing=f"{agree(facts['others'], 'waits', 'wait')} in "
            f"{facts['other_op']}{at(facts['other_site'])}",
        )
    went_past = [r for r in roots if _went_past(ctx, w, r)]
    if went_past:
        # Its stacks show it beyond the line where the others wait, in the same function,
        # without ever having called there: it took another branch (whatever it waits on now).
        a = ctx.activity(went_past[0])
        now = f", and is now {a.doing}" if a is not None else ""
        return took_a_branch(
            went_past,
            doing=f"went past {w.site} without calling {w.op}{now}",
            others_doing=f"waited in {facts['other_op']}{at(facts['other_site'])}",
            notes=_stacks_taken(went_past[0], a),
        )
    blocked = blocked_outside(ctx, roots, say_when=True)
    if blocked is not None:
        return blocked
    busy = [r for r, x in where.items() if x.state == "busy"]
    if busy:
        # Outside every collective, waiting on nothing its stacks show: it computes.
        p, _ = ctx.parting(busy, waiting)
        loop = f" in the loop at {p.site} (`{p.source}`)" if p is not None and p.left_loop else ""
        x = where[busy[0]]
        since = ctx.waited_s(waiting)
        how_long = f" while they have waited {since:.1f} s" if since is not None else ""
        share = ctx.cpu_share(busy[0])
        cpu = f", using {share:.0%} of a core" if share is not None else ""
        return Decided(
            Cause.busy_outside,
            busy,
            {
                "culprit_doing": (
                    f"running code outside any collective{loop}{at(x.site)}{cpu}{how_long}"
                ),
                "culprit_site": x.site,
            },
        )
    return lagging(roots, doing=_some(where))


def finished_cell(ctx: Context, roots: list[int], w: Wait, *, state: str = "finished") -> list[int]:
    """In a cell session, the roots that finished the very run of the notebook cell in which
    ``w``'s rank waits (its cell's end event for that run, nothing after it, no thread of the
    cell left running) without making the call: for that cell they are like ranks that ended
    their script. The proof's own limits (:func:`rankscope.waitfor.prove`): the waiting rank
    still runs that cell and made the call in it, from its main thread; a root still inside
    the cell, in a later cell, or whose cell left a thread running, is not one of them. With
    ``state`` ``raised``, the roots whose cell raised instead (it failed the cell: no branch
    sent it past the call; it crashed, for that cell)."""
    waiter = ctx.facts.get(w.rank)
    if (
        waiter is None
        or waiter.cell_state != "running"
        or waiter.cell_run is None
        or w.seq is None
        or (waiter.main_thread and w.thread and w.thread != waiter.main_thread)
    ):
        return []
    started = ctx.calls["t_start_s"].iloc[w.row]
    if waiter.cell_s is None or pd.isna(started) or float(started) < waiter.cell_s:
        return []  # not known to be a call of this run of the cell
    calls = ctx.calls
    made = calls[((calls["pg"].astype(str) == w.pg) & (calls["seq"] >= w.seq)).fillna(False)]
    made = set(made["rank"].astype(int).tolist())
    return [
        r
        for r in roots
        if (f := ctx.facts.get(r)) is not None
        and f.cell_state == state
        and (f.cell, f.cell_run) == (waiter.cell, waiter.cell_run)
        and r not in made
    ]


def _done_on(ctx: Context, ranks: list[int], pg: str) -> str:
    """``3`` (``3/4`` where they differ): the collectives these ranks made on group ``pg``."""
    calls = ctx.calls
    mine = (calls["pg"] == pg) & calls["seq"].notna() & calls["rank"].isin(ranks)
    count = calls.loc[mine, "rank"].value_counts().reindex(ranks, fill_value=0)
    return "/".join(map(str, sorted(set(count.tolist()))))


def _returned_short(
    ctx: Context, exited: list[int], waiting: list[int], *, ended: bool = True
) -> str | None:
    """Whether ranks whose script returned (no exit asked for; ``ended=False``: ranks that
    left the group some other way) made the call of the loop the others are still in fewer
    times (``3 calls of broadcast at train.py:41 → loop.py:265 where ranks 0-1 made 4``): they
    ran out of work (uneven data, fewer epochs or steps), which is why they left. None where a
    rank's end is not known to be a return, the parting line is not a loop the culprits left,
    or the counts do not say."""
    if not waiting or (ended and any(ctx.facts[r].end_how != "returned" for r in exited)):
        return None
    p, _ = ctx.parting(exited, waiting)
    if p is None or not p.left_loop or runs_alike(p) or not set(exited) <= set(p.ranks_out):
        return None  # not known to have left a loop the others are in
    d = ctx.divergence_with(set(exited))
    if d is None:
        return None
    theirs = d.rows[d.rows["rank"].isin(waiting)]
    if theirs.empty:
        return None
    peers = sorted(set(theirs["rank"].astype(int).tolist()))
    return fewer_calls(ctx, exited, theirs.index[0], peers)


def lagging(ranks: list[int], *, doing: str) -> Decided:
    """``lagging_rank`` (named here alone): ranks that never joined the call the others wait
    in, last seen ``doing``."""
    return Decided(Cause.lagging_rank, ranks, {"culprit_doing": doing})


def silent(ranks: list[int]) -> Decided:
    """``silent_rank`` (named here alone): the ranks the others wait for left no record of their
    calls."""
    return Decided(Cause.silent_rank, ranks, {})


def blocked_outside(ctx: Context, ranks: list[int], *, say_when: bool) -> Decided | None:
    """Decides ``stuck_outside``: of these ranks, those whose stacks show them blocked outside
    the collectives (a lock, a sleep, a queue, ...), what the first is doing and its fix; None
    when none is. ``say_when``: a note of when the stacks that show it were taken."""
    activities = {r: ctx.activity(r) for r in ranks}
    blocked = {r: a for r, a in activities.items() if a is not None and a.kind}
    if not blocked:
        return None
    r, a = next(iter(blocked.items()))
    notes = [f"rank {r}'s other threads: {t}" for t in a.others]
    return Decided(
        Cause.stuck_outside,
        sorted(blocked),
        {
            "culprit_doing": a.doing_of(len(blocked)),
            "culprit_site": a.site,
            "wait_fix": WAITS[a.kind][1],
        },
        notes + (_stacks_taken(r, a) if say_when else []),
    )


def _stacks_taken(rank: int, a: Activity | None) -> list[str]:
    """When the stacks that show what the rank does were taken, where that is not now."""
    return (
        [f"rank {rank}'s stacks that show it were taken {a.when}"]
        if a is not None and a.reason
        else []
    )


def _went_past(ctx: Context, w: Wait, rank: int) -> bool:
    """Whether ``rank``'s stacks show it past the call ``w`` waits in, never having made it:
    a call it skipped (another branch), not one it has yet to reach."""
    if w.site is None:
        return False
    stacks = ctx.ev.table("stacks")
    mine = user_path(stacks, w.rank, thread=w.thread)
    fact = ctx.facts.get(rank)
    theirs = user_path(stacks, rank, thread=fact.main_thread if fact is not None else None)
    if not mine or not theirs or short_site(mine[-1][0], mine[-1][2]) != w.site:
        return False
    calls = ctx.calls
    own = calls[calls["rank"] == rank]
    if own.empty:
        return passed(mine, theirs, None)
    last = own["site"].iloc[own["order"].argmax()]
    return not pd.isna(last) and passed(mine, theirs, str(last))


def _cycle(ctx: Context, cycle: list[int]) -> Finding:
    """Every rank waits, and some wait only for each other: the rank that left the program order
    the others share is the culprit (a skipped call, a call the others do not make there); two
    point-to-point calls facing each other are a cycle with no single culprit."""
    g = ctx.graph
    cyc = [g.waits[r] for r in cycle]
    culprits = departed(ctx.calls, cycle)
    if all(w.seq is None for w in cyc):
        return _p2p_cycle(ctx, cycle, culprits)
    c = culprits[0]
    # What the culprit skipped: the call a rank of the cycle waits for it in.
    skipped = next((w for w in cyc if c in w.waits_for and w.rank not in culprits), cyc[0])
    d = ctx.cell(skipped.pg, skipped.seq) if skipped.seq is not None else None
    own = g.waits[c]
    waiting = sorted(set(g.waiting) - set(culprits))
    facts = {
        "collective": ctx.label(d) if d is not None else skipped.where(),
        "culprit_site": own.site,
    }
    decided = took_a_branch(
        culprits,
        doing=f"skipped {skipped.where()} and waits in {own.where()}",
        others_doing=f"{agree(who_of(waiting), 'waits', 'wait')} for "
        f"{agree(who_of(culprits), 'it', 'them')}",
    )
    fewer = _ran_short(ctx, c, own)
    if fewer is not None and left_the_loop(
        ctx, culprits, [skipped.rank], ctx.calls.iloc[skipped.row], ctx.calls.iloc[own.row]
    ) in (True, None):
        decided = ran_out(culprits, done=fewer, went=f"went on to {own.where()}")
        facts.update(other_op=skipped.op, other_site=skipped.site, others=who_of([skipped.rank]))
    notes = thread_notes(ctx, ctx.calls.iloc[[own.row]])
    return Finding(
        cause=decided.cause,
        culprits=culprits,
        waiting=waiting,
        facts={**facts, **decided.facts},
        collective=ctx.collective(d) if d is not None else None,
        refs=[ctx.call_ref(g.waits[r].row, f"waits in {g.waits[r].where()}") for r in cycle][
            :MAX_REFS
        ],
        notes=notes,
    )


def _ran_short(ctx: Context, rank: int, own: Wait) -> str | None:
    """The call the rank made just before the one it waits in, if it made it fewer times than
    the other ranks that make it: it left a loop early (a microbatch short)."""
    calls = ctx.calls
    mine = calls[calls["rank"] == rank].sort_values("order")
    at_own = (
        mine.index.get_loc(calls.index[own.row]) if calls.index[own.row] in mine.index else None
    )
    if not at_own:
        return None
    before = mine.index[at_own - 1]
    ref = calls.loc[before]
    same = calls[(calls["pg"].astype(str) == str(ref["pg"])) & (calls["key"] == ref["key"])]
    peers = sorted(set(same["rank"].tolist()) - {rank})
    return fewer_calls(ctx, [rank], before, peers) if peers else None


def _p2p_cycle(ctx: Context, cycle: list[int], culprits: list[int]) -> Finding:
    g = ctx.graph
    text = " -> ".join(f"rank {r} ({g.waits[r].where()})" for r in cycle)
    members = set(cycle)
    waiting = sorted(set(g.waiting) - members)
    first = g.waits[cycle[0]]
    rows = ctx.calls.iloc[[g.waits[r].row for r in cycle]]
    sites = ctx.sites(rows)
    info = CollectiveInfo(
        pg=first.pg,
        pg_desc=first.pg_desc,
        pg_ranks=list(ctx.members.get(first.pg, ())),
        seq=opt_int(rows["p2p_seq"].iloc[0]),
        op_by_rank={r: g.waits[r].op for r in cycle},
        site_by_rank={r: opt(s) for r, s in zip(cycle, sites, strict=True)},
        shapes_by_rank={r: opt(s) for r, s in zip(cycle, rows["shapes"], strict=True)},
        state_by_rank={r: f"waiting for rank {g.waits[r].peer}" for r in cycle},
        source=ctx.source,
    )
    return Finding(
        cause=Cause.p2p_cycle,
        culprits=sorted(members),
        waiting=waiting,
        facts={"cycle": text + f" -> rank {cycle[0]}"},
        collective=info,
        refs=[ctx.call_ref(g.waits[r].row, f"{g.waits[r].op} in flight") for r in cycle],
    )


def _all_stuck(ctx: Context) -> Finding | None:
    """Every waiting rank waits in a call that all its members made alike: nothing in the
    evidence to wait for (below Python: the transport, a device)."""
    calls = ctx.calls
    flying = calls[calls["seq"].notna() & ~calls["completed"].fillna(False).astype(bool)]
    if flying.empty:
        return None
    pg, seq = flying.groupby(["pg", "seq"], observed=True).size().idxmax()
    d = ctx.cell(str(pg), int(seq))
    rows = d.rows
    sites = ctx.sites(rows)
    absent = sorted(set(d.members) - ctx.evidence_ranks)
    decided = silent(absent) if absent else Decided(Cause.stuck_collective, [], {})
    return Finding(
        cause=decided.cause,
        culprits=decided.culprits,
        waiting=sorted(rows["rank"][~done(rows)].tolist()),
        facts={
            "other_op": rows["op"].iloc[0],
            "other_site": site_of(sites, rows),
            "collective": ctx.label(d),
        },
        collective=ctx.collective(d, sites=sites),
        refs=ctx.call_refs(d),
    )


def _some(where: dict[int, Where], limit: int = 4) -> str:
    """``rank 1: note; rank 2: note`` for the first few ranks, then how many more."""
    text = "; ".join(f"rank {r}: {w.note}" for r, w in list(where.items())[:limit])
    more = len(where) - limit
    return text + (f"; and {more} more" if more > 0 else "")
