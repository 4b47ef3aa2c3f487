"""What the mismatch and waits rules share: how many times ranks made a loop's call, whether
they left the loop the others are still in, and which calls came from another thread."""

from __future__ import annotations

from typing import Any

import pandas as pd

from rankscope.analyze.calls import opt
from rankscope.analyze.context import Context
from rankscope.analyze.diagnosis import who_of
from rankscope.analyze.wording import at


def fewer_calls(
    ctx: Context, culprits: list[int], call: Any, peers: list[int], *, current: bool = False
) -> str | None:
    """``3 calls of all_reduce at train.py:16 where rank 0 is making its 4th``: the culprits
    made the call at ``calls.loc[call]`` (the same line, on the same group) fewer times than
    ``peers``, which kept repeating it: they ran out of iterations of a loop the peers are
    still in (``current``: the peers' count includes the call they are in now). None when the
    call is no loop's, or the culprits made it as often."""
    calls = ctx.calls
    ref = calls.loc[call]
    pg = str(ref["pg"])
    mine = calls[(calls["pg"].astype(str) == pg) & (calls["key"] == ref["key"])]
    mine = mine[mine["rank"].isin([*culprits, *peers])]
    sites = ctx.sites(mine)
    site = sites.loc[call] if call in sites.index else None
    if site is None or pd.isna(site):
        return None
    counts = mine[(sites == site).fillna(False).to_numpy()].groupby("rank").size()
    theirs = max(int(counts.get(r, 0)) for r in peers)
    ours = sorted({int(counts.get(r, 0)) for r in culprits})
    if theirs < 2 or not ours or min(ours) < 1 or max(ours) >= theirs:
        return None
    if _kept_pace(ctx, culprits, ref):
        return None
    who = who_of(peers)
    made = (
        f"is making its {_nth(theirs)}"
        if current and len(peers) == 1
        else (f"are making their {_nth(theirs)}" if current else f"made {theirs}")
    )
    return f"{'/'.join(map(str, ours))} calls of {ref['op']} at {site} where {who} {made}"


def _kept_pace(ctx: Context, culprits: list[int], ref: pd.Series) -> bool:
    """Whether the culprits made, on another group, as many calls from the function of the call
    ``ref`` as that group's other members did: they went through every pass of the loop and
    skipped a call of ``ref``'s group, they did not run out of iterations."""
    paths = ctx.call_paths
    own = paths.of(int(ref["path"]))
    if not own:
        return False
    where = own[-1][:2]  # the file and function of the call
    calls = ctx.calls[ctx.calls["seq"].notna() & (ctx.calls["pg"].astype(str) != str(ref["pg"]))]
    codes = calls["path"].to_numpy()
    same = pd.Series(
        [bool(paths.of(int(c))) and paths.of(int(c))[-1][:2] == where for c in codes],
        index=calls.index,
        dtype=bool,
    )
    calls = calls[same]
    for rank in culprits:
        mine = calls[calls["rank"] == rank]
        for pg, rows in mine.groupby(mine["pg"].astype(str)):
            others = set(ctx.members.get(pg, ())) - set(culprits)
            theirs = calls[(calls["pg"].astype(str) == pg) & calls["rank"].isin(others)]
            counts = theirs.groupby("rank").size()
            if len(rows) >= 2 and len(counts) and int(counts.max()) == len(rows):
                return True
    return False


def left_the_loop(
    ctx: Context, culprits: list[int], others: list[int], theirs: pd.Series, own: pd.Series
) -> bool | None:
    """Whether the culprits left the loop the others are still in, rather than called something
    else from inside it: their stacks past the loop (the parting line), else their call past
    the end of the loop that holds the others' call; None when neither can tell."""
    p, _ = ctx.parting(culprits, others)
    if p is not None and (p.left_loop or p.arms or set(culprits) <= set(p.ranks_in)):
        gone = p.ranks_out if p.kind in ("for", "while") else p.ranks_in
        return p.left_loop and set(culprits) <= set(gone)
    return ctx.loop_left(culprits, others, theirs, own)


def _nth(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def thread_notes(ctx: Context, rows: pd.DataFrame) -> list[str]:
    """Calls made from a thread other than their rank's main thread: name it."""
    notes = []
    for rank, thread, site in zip(rows["rank"], rows["thread"], ctx.sites(rows), strict=True):
        f = ctx.facts.get(int(rank))
        main = f.main_thread if f is not None else None
        if main and opt(thread) and str(thread) != main:
            notes.append(
                f"rank {rank} made this call from thread {thread}, not its main thread"
                + at(opt(site))
            )
    return notes
