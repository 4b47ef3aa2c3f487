"""3.5 ``earlier_divergence``: the ranks' paths parted before the place where they stopped (a
retry branch that added a call, one more micro-batch on one rank): the class that left the
shared path there is the culprit, whatever the final snapshot shows; and ``swallowed`` (asked
of a job whose every rank exited 0): the ranks' calls parted, or collectives raised errors the
code swallowed, so the job is not healthy although it ended well.

Both read :attr:`~rankscope.analyze.context.Context.first_divergence`
(:mod:`rankscope.analyze.paths`). A divergence where the ranks stopped, or one whose culprits
made no call there (they had left, or were held elsewhere), is left to the rules that read the
final snapshot (mismatch, deaths, waits): they know what the culprits were doing instead."""

from __future__ import annotations

from rankscope.analyze import align
from rankscope.analyze.calls import failed
from rankscope.analyze.causes import Cause
from rankscope.analyze.context import Context
from rankscope.analyze.diagnosis import who_of
from rankscope.analyze.parting import Catch, argument_origin, catcher
from rankscope.analyze.paths import FirstDivergence, PathClass
from rankscope.analyze.rules.finding import Decided, Finding, rule
from rankscope.analyze.rules.mismatch import call_of, different_call, ran_out, took_a_branch
from rankscope.analyze.wording import at, short
from rankscope.state import group_name, shapes_text
from rankscope.waitfor import differs


def hang_of(ctx: Context, fd: FirstDivergence) -> align.Divergence | None:
    """Where the calls of the first divergence's group part by what they are (op, shapes,
    dtypes) or by their counts: where the ranks of that group stopped."""
    return next((d for d in ctx.divergences if d.pg == fd.pg), None)


def where(fd: FirstDivergence) -> str:
    step = f", step {fd.step}" if fd.step is not None else ""
    call = "collective" if fd.kind == "collective" else "point-to-point call"
    return f"{group_name(fd.pg, fd.pg_desc)}, {call} #{fd.seq}{step}"


def _doing(c: PathClass, *, extra: int) -> str:
    if c.op is None:
        return "made no call there"
    what = f"an extra {c.op}" if extra > 0 else c.op
    return f"called {what} from " + " → ".join(x for x in (c.via, c.site) if x)


def decide(ctx: Context, fd: FirstDivergence) -> Decided | None:
    """The cause at a first divergence whose culprits made a call there: a call the others do
    not make (an extra call, D21), a call they make fewer times in a loop the others are still
    in (uneven inputs, D9), a skipped call (D21), or a different call (D19)."""
    own, other = fd.culprit_class(), fd.other_class()
    if own is None or own.op is None:
        return None
    doing, others_doing = _doing(own, extra=fd.extra), _doing(other, extra=0)
    if other.op is not None and fd.extra == 0:
        odd, norm = ctx.calls.loc[own.row], ctx.calls.loc[other.row]
        differ = differs(call_of(odd), call_of(norm))
        if differ is not None:
            return different_call(fd.culprits, differ, odd, norm)
    if fd.extra < 0:
        p, _ = ctx.parting(fd.culprits, fd.others)
        if p is not None and p.left_loop and set(fd.culprits) <= set(p.ranks_out):
            return ran_out(
                fd.culprits,
                done=f"{-fd.extra} call(s) fewer than {who_of(fd.others)} at {where(fd)}",
                went=f"went on to {own.op}{at(own.site)}",
            )
        doing = f"skipped a call at {where(fd)} and {doing}"
    return took_a_branch(fd.culprits, doing=doing, others_doing=others_doing)


@rule(35)
def earlier_divergence(ctx: Context) -> Finding | None:
    fd = ctx.first_divergence
    if fd is None or not fd.culprits or fd.kind != "collective":
        return None
    hang = hang_of(ctx, fd)
    own, other = fd.culprit_class(), fd.other_class()
    went_further = ctx.went_further(fd)
    if hang is not None and hang.seq <= fd.seq and not went_further:
        # they part where they stopped: the snapshot's rules read it, unless the culprits
        # made one more of a call they had made before where the others went on to a call
        # they too had made before (an inner loop's extra pass: the snapshot would take the
        # others for the ones that ran short; others that moved on to something new, such as
        # the barrier after the loop, did run short of the loop)
        return None
    decided = decide(ctx, fd)
    if decided is None:
        return None
    waiting = ctx.blocked(exclude=set(fd.culprits))
    later = (
        f"; the job hung {hang.seq - fd.seq} collectives later on that group, in "
        f"{hang.rows['op'].iloc[0]} ({ctx.label(hang)})"
        if hang is not None and hang.seq > fd.seq
        else ""
    )
    return Finding(
        cause=decided.cause,
        culprits=decided.culprits,
        waiting=waiting,
        facts={
            "culprit_op": own.op,
            "other_op": other.op or "no call",
            "culprit_site": own.site,
            "other_site": other.site,
            "culprit_shapes": shapes_text(ctx.calls.at[own.row, "shapes"]),
            "other_shapes": (
                shapes_text(ctx.calls.at[other.row, "shapes"]) if other.row is not None else ""
            ),
            "culprit_dtypes": ctx.calls.at[own.row, "dtypes"],
            "other_dtypes": ctx.calls.at[other.row, "dtypes"] if other.row is not None else "",
            "collective": where(fd),
            "others": who_of(fd.others),
            **decided.facts,
        },
        collective=ctx.collective(hang) if hang is not None else None,
        notes=[f"the paths first parted at {where(fd)}{later}", *decided.notes],
    )


def swallowed(ctx: Context) -> Finding | None:
    """Asked only where every rank exited 0 (:data:`~rankscope.analyze.rules.ON_CLEAN_EXIT`):
    collectives that raised, or calls that parted, make the job not healthy."""
    probe = ctx.ev.table("collectives")
    raised = probe[failed(probe)]
    fd = ctx.first_divergence
    if raised.empty and (fd is None or not fd.culprits):
        return None
    culprits = fd.culprits if fd is not None and fd.culprits else []
    errors = sorted(set(raised["rank"].dropna().astype(int).tolist()))
    said = []
    if fd is not None:
        own = fd.culprit_class()
        said.append(
            f"the ranks' calls parted at {where(fd)}: "
            + (
                f"{who_of(own.ranks)} {_doing(own, extra=fd.extra)} where "
                f"{who_of(fd.other_class().ranks)} {_doing(fd.other_class(), extra=0)}"
                if own is not None
                else "nothing tells which side left the common path"
            )
        )
    if errors:
        first = raised.sort_values("t_start_s").iloc[0]
        code = ctx.call_paths.codes[probe.index.get_loc(first.name)]
        said.append(
            f"{who_of(errors)} had collectives raise errors that the code caught "
            f"(first: {first['op']} on rank {int(first['rank'])}: {short(first['error'], 120)})"
            + _caught(catcher(ctx.call_paths.of(int(code))))
        )
    return Finding(
        cause=Cause.swallowed_errors,
        culprits=culprits or errors,
        waiting=[],
        facts={"swallowed": "; ".join(said)},
    )


def _caught(catch: Catch | None) -> str:
    """Where the first error was caught, in words; empty where no source read shows it.

    ``, caught in the library quietmetrics by `except RuntimeError:` at __init__.py:18``."""
    if catch is None:
        return ""
    by = f"`{catch.source}` at {catch.site}"
    if catch.library is None:
        return f", caught by {by}"
    return f", caught in the library {catch.library} by {by}"


@rule(45)
def peer_mismatch(ctx: Context) -> Finding | None:
    """Point-to-point calls that do not meet (a rank sent to a peer more, or fewer, times than
    that peer received from it): the culprit is the rank whose call left its own pattern, a
    peer its line had not named before (:func:`~rankscope.analyze.paths.p2p_divergence`)."""
    unmatched = ctx.p2p_unmatched
    fd = ctx.p2p_divergence
    if not unmatched or fd is None or not fd.culprits or not ctx.graph.waits:
        return None
    own = fd.culprit_class()
    row = ctx.calls.loc[own.row]
    rank = own.ranks[0]
    earlier = ctx.calls[
        (ctx.calls["rank"] == rank)
        & (ctx.calls["op"].astype(str) == own.op)
        & (ctx.calls["order"] < row["order"])
    ]
    before = earlier["peer"].dropna()
    usual = str(int(before.mode().iloc[0])) if len(before) else "unknown"
    said = [
        f"rank {a} sent to rank {b} {abs(v)} time(s) {'more' if v > 0 else 'fewer'} than "
        f"rank {b} received from it"
        for (a, b), v in sorted(unmatched.items())
    ]
    waiting = ctx.blocked(exclude={rank})
    in_pairs = {r for pair in unmatched for r in pair} - {rank}
    others = [r for r in waiting if r in in_pairs] or waiting
    waits = "; ".join(ctx.graph.waits[r].where() for r in others if r in ctx.graph.waits)
    file, func, line = ctx.frame_of(row)
    here = earlier.loc[(earlier["site"] == row["site"]).fillna(False).to_numpy(), "peer"]
    origin = None
    if file and len(here.dropna()) and (here.dropna() != row["peer"]).all():
        # the very line named other peers before: the branch that set the one it names now
        origin = argument_origin(
            file, func, line, own.op, [rank], others, ctx.ev.table("values"), ctx.callers_of(row)
        )
    return Finding(
        cause=Cause.p2p_peer_mismatch,
        culprits=[rank],
        waiting=waiting,
        facts={
            "culprit_op": own.op,
            "culprit_peer": int(row["peer"]),
            "usual_peer": usual,
            "culprit_site": own.site,
            "other_doing": f"wait ({waits})" if waits else "wait",
            "mismatch": "; ".join(said),
            "others": who_of(others),
        },
        notes=[f"the paths first parted at {where(fd)}"],
        parting=origin,
    )
