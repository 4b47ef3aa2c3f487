"""Where the ranks' paths first part (rankscope.analyze.paths), on tables built here: an extra
call from another branch long before the hang, swaps of one call for the same call from another
line (which part nothing), the class told by its size, by a call new on the group or by having
made none, a job that ended well although its calls parted, and point-to-point calls that do not
meet."""

from __future__ import annotations

from typing import Any

from rankscope.analyze import diagnose

from .test_analyze_rules import context
from .test_analyze_tables import T0, call, fr_entry, run_of


def at(rank: int, seq: int, line: int, **kw: Any) -> dict[str, Any]:
    """A call of ``rank`` as its ``seq``-th collective, made from ``train.py:line``."""
    return call(rank, seq, line=line, site=f"train.py:{line}", **kw)


def retry_run(*, world: int = 3, culprit: int = 1, steps: int = 10, retry_at: int = 4):
    """Every step all-reduces from line 20; at step ``retry_at`` the culprit retries its batch
    in two halves, each all-reducing from line 30; after the loop, a barrier at line 40. The
    culprit reaches the barrier one call early and waits there; the others wait in their last
    all_reduce."""
    rows = []
    for r in range(world):
        seq = 0
        for step in range(1, steps + 1):
            lines = [30, 30] if (r == culprit and step == retry_at) else [20]
            for line in lines:
                seq += 1
                done = r == culprit or seq < steps
                rows.append(at(r, seq, line, done=done, t=T0 + seq + r / 100))
            if r == culprit and seq >= steps:
                break
        if r == culprit:
            rows.append(at(r, seq + 1, 40, op="barrier", done=False, t=T0 + seq + 1))
    return run_of(rows, exits=dict.fromkeys(range(world)), world=world)


def test_an_extra_call_from_another_branch_long_before_the_hang_names_its_rank():
    ctx = context(retry_run())
    fd = ctx.first_divergence
    assert (fd.pg, fd.seq, fd.culprits, fd.decided_by, fd.extra) == ("0", 4, [1], "fewer", 1)
    own, other = fd.culprit_class(), fd.other_class()
    assert (own.ranks, own.site, other.ranks, other.site) == (
        (1,),
        "train.py:30",
        (0, 2),
        "train.py:20",
    )
    d = diagnose(retry_run())
    assert (d.verdict, d.cause, d.culprit_ranks) == ("hang", "rank_conditional_collective", [1])
    assert d.first_divergence["seq"] == 4 and d.first_divergence["culprits"] == [1]
    said = "\n".join(d.notes)
    assert "first parted at group 0 (default_pg), collective #4" in said
    assert "hung 7 collectives later" in said, said
    assert "first parted: rank 1 called all_reduce from train.py:30 at collective #4" in d.render()


def test_the_same_call_from_another_line_parts_nothing():
    """``if rank == 0: broadcast(x) else: broadcast(y)`` at every step: one collective."""
    rows = [at(r, s, 11 if r == 0 else 12, op="broadcast") for r in range(3) for s in range(1, 6)]
    assert context(run_of(rows)).first_divergence is None
    d = diagnose(run_of(rows))
    assert d.verdict == "ok" and d.first_divergence is None


def test_between_two_ranks_the_call_new_on_the_group_is_the_one_that_left():
    rows = [at(r, s, 20) for r in range(2) for s in range(1, 4)]
    rows += [at(0, 4, 50, op="barrier", done=False), at(1, 4, 20, done=False)]
    fd = context(run_of(rows, exits={0: None, 1: None}, world=2)).first_divergence
    assert (fd.seq, fd.culprits, fd.decided_by) == (4, [0], "new")


def test_a_rank_that_made_no_call_is_told_as_such():
    rows = [at(r, s, 20) for r in range(2) for s in range(1, 4)]
    rows += [at(1, 4, 20, done=False)]
    fd = context(run_of(rows, exits={0: 0, 1: None}, world=2)).first_divergence
    assert (fd.seq, fd.culprits, fd.decided_by) == (4, [0], "no_call")
    assert fd.culprit_class().op is None


def test_equal_classes_that_nothing_tells_apart_name_no_culprit():
    rows = [at(r, s, 20) for r in range(2) for s in range(1, 3)]
    rows += [at(0, 3, 31, op="barrier", done=False), at(1, 3, 32, op="barrier", done=False)]
    rows += [at(0, 4, 33, done=False)]
    fd = context(run_of(rows, exits={0: None, 1: None}, world=2)).first_divergence
    assert fd is None or (fd.culprits == [] and fd.decided_by == "tie")


def test_a_job_that_ended_well_after_its_calls_parted_is_not_ok():
    """A broad try/except: rank 1's step 3 failed before its all_reduce and was skipped; the
    others' step-3 all_reduce raised once rank 1 had gone on (gloo: connection closed), and they
    caught it too. Every rank exited 0."""
    rows = [at(r, s, 20) for r in range(3) for s in range(1, 3)]
    rows += [at(r, 3, 20, ok=False, error="Connection closed by peer") for r in (0, 2)]
    rows += [at(1, 3, 25, op="barrier")]
    d = diagnose(run_of(rows))
    assert (d.verdict, d.cause) == ("crash", "swallowed_errors"), d.render()
    assert "every rank exited 0" in d.summary and "Connection closed by peer" in d.summary


def test_a_send_to_a_rank_that_is_not_receiving_from_it_is_a_peer_mismatch():
    """A pipeline of 3 stages: rank 0 sends to 1, rank 1 receives from 0 and sends to 2, rank 2
    receives from 1. At the fourth step rank 1's destination flips: it sends to 0, which is
    sending to it; rank 2 waits for rank 1."""
    rows, n = [], {0: 0, 1: 0, 2: 0}

    def p2p(rank: int, op: str, peer: int, line: int, done: bool = True) -> None:
        n[rank] += 1
        rows.append(
            dict(
                at(rank, n[rank], line, op=op, peer=str(peer), done=done),
                t_start_s=T0 + len(rows) / 10,
            )
        )

    for step in range(1, 5):
        last = step == 4
        p2p(0, "send", 1, 10, done=not last)
        p2p(1, "recv", 0, 11, done=True)
        p2p(1, "send", 0 if last else 2, 12, done=not last)
        p2p(2, "recv", 1, 13, done=not last)
    d = diagnose(run_of(rows, exits=dict.fromkeys(range(3))))
    assert (d.cause, d.culprit_ranks) == ("p2p_peer_mismatch", [1]), d.render()
    assert "peer 0" in d.reason and "named peer 2 before" in d.reason, d.reason


def test_a_call_made_inside_a_library_is_named_by_the_user_s_line_first():
    from rankscope.analyze.paths import user_first

    user = ("/home/me/project/model.py", "on_validation_epoch_end", 29)
    lib = ("/env/lib/python3.11/site-packages/lightning/fabric/utilities/distributed.py", "g", 247)
    loop = ("/env/lib/python3.11/site-packages/lightning/pytorch/loops/loop.py", "run", 265)
    script = ("/home/me/project/train.py", "<module>", 47)
    assert user_first((script, loop, user, lib)) == "model.py:29 → distributed.py:247"
    assert user_first((script, loop)) == "train.py:47 → loop.py:265"
    assert user_first((script, user)) == "model.py:29"  # the user's own call: its site alone
    assert user_first((loop, lib)) == "distributed.py:247"  # no frame of the user's
    assert user_first((), "train.py:3") == "train.py:3"


def test_the_rows_order_by_group_rank_and_seq_is_lexsort_s_with_runs_or_without():
    """Runs of rows per (group, rank) in seq order (dumps read in file-name order) are sorted
    as runs; anything else (a rank's rows in two runs, a seq going back) by lexsort: the same
    order either way."""
    import numpy as np

    from rankscope.analyze.paths import _order

    rng = np.random.default_rng(48)
    for case in range(40):
        runs = []
        for pg in range(rng.integers(1, 4)):
            for r in rng.permutation(rng.integers(1, 30)):
                n = int(rng.integers(0, 6))
                runs.append((np.full(n, pg), np.full(n, r), np.sort(rng.integers(0, 9, n))))
        order = rng.permutation(len(runs))
        pg, rank, seq = (np.concatenate([runs[i][k] for i in order] + [[]]) for k in range(3))
        pg, rank, seq = (a.astype(np.int64) for a in (pg, rank, seq))
        if case % 4 == 3 and len(seq) > 3:  # not runs: a seq going back, a rank split in two
            seq[len(seq) // 2] = -1
            rank[-1] = rank[0]
        assert np.array_equal(_order(pg, rank, seq), np.lexsort((seq, rank, pg))), case


def test_a_class_that_made_no_call_had_left_only_where_its_ranks_had() -> None:
    """gloo_rank_raises: rank 1 raised and exited before its second all_reduce: it had left.
    monitored_barrier: rank 1 sleeps outside the collectives, alive: it made no call there, and
    the card does not say it had left."""
    from pathlib import Path

    from rankscope.collect import load_run

    data = Path(__file__).parent / "data"
    raised = diagnose(load_run(data / "gloo_rank_raises" / "run")).first_divergence
    assert raised["text"].startswith("rank 1 made no call there (it had left) at collective #2")
    assert [c["left"] for c in raised["classes"] if c["op"] is None] == [True]
    asleep = diagnose(load_run(data / "monitored_barrier" / "run")).first_divergence
    assert asleep["text"].startswith("rank 1 made no call there at collective #1")
    assert [c["left"] for c in asleep["classes"] if c["op"] is None] == [False]


def dp_tp_skip_run(*, barrier_at: float) -> Any:
    """DP x TP on 4 ranks: tp groups [0, 1], [2, 3]; dp groups [0, 2], [1, 3]. Each of three
    steps all-reduces on the rank's tp group (line 20), then on its dp group (line 30); at step
    2 rank 1 skips its dp call. A barrier on the world group ends the script (line 40). Ranks
    0-2 wait in the barrier, started at ``barrier_at``; rank 3 in its dp all_reduce #3, which
    rank 1 never makes. Two divergences exclude each other: rank 1 made the barrier and not dp
    #3, rank 3 the reverse."""
    groups = {"tp": ([0, 1], [2, 3]), "dp": ([0, 2], [1, 3]), "world": ([0, 1, 2, 3],)}
    rows = []
    for r in range(4):
        plan = [("tp", 20), ("dp", 30), ("tp", 20), ("tp", 20), ("dp", 30)]
        if r != 1:
            plan.insert(3, ("dp", 30))
        if r != 3:
            plan.append(("world", 40))
        made: dict[str, int] = {}
        for n, (kind, line) in enumerate(plan, start=1):
            members = next(m for m in groups[kind] if r in m)
            pg = "0" if kind == "world" else f"{kind}{groups[kind].index(members)}"
            made[pg] = made.get(pg, 0) + 1
            last = n == len(plan)
            rows.append(
                at(
                    r,
                    made[pg],
                    line,
                    pg=pg,
                    pg_desc=pg,
                    pg_ranks=",".join(map(str, members)),
                    coll_id=n,
                    op="barrier" if kind == "world" else "all_reduce",
                    done=not last,
                    t=barrier_at if kind == "world" else T0 + n,
                )
            )
    return run_of(rows, exits=dict.fromkeys(range(4)), world=4)


def test_two_divergences_that_exclude_each_other_are_told_by_the_paths_not_the_clock():
    """Rank 3 waits in dp1 #3 on the path ranks 0 and 2 took to the barrier: it had not got
    there yet. Rank 1's path left theirs at step 2. Whichever started first, the paths first
    parted at dp1 #3, where rank 1 made no call."""
    for barrier_at in (T0 + 4.5, T0 + 9):
        fd = context(dp_tp_skip_run(barrier_at=barrier_at)).first_divergence
        assert (fd.pg, fd.seq, fd.culprits) == ("dp1", 3, [1]), barrier_at
        d = diagnose(dp_tp_skip_run(barrier_at=barrier_at))
        assert (d.cause, d.culprit_ranks) == ("rank_conditional_collective", [1]), d.render()


def subgroup_skip_run(*, g_at: float, default_at: float) -> Any:
    """3 ranks, g = [0, 1]. Each of five steps all-reduces on g (line 14, ranks 0 and 1), then
    on the default group (line 15); at the last step rank 1 skips its g call. Rank 0 waits in
    g #5 (started at ``g_at``), ranks 1 and 2 in default #5 (``default_at``). The two
    divergences exclude each other (rank 0 made g #5 and not default #5, rank 1 the reverse),
    and neither rank's calls are the start of the other's."""
    rows = []
    for r in range(3):
        n = 0
        for step in range(1, 6):
            last = step == 5
            for pg, line in (("g", 14), ("0", 15)):
                if pg == "g" and (r == 2 or (r == 1 and last)):
                    continue
                n += 1
                waits = last and (pg == "g" or r != 0)
                if last and pg == "0" and r == 0:
                    break
                t = (g_at if pg == "g" else default_at) if waits else T0 + n
                ranks = "0,1" if pg == "g" else "0,1,2"
                rows.append(
                    at(
                        r,
                        step,
                        line,
                        pg=pg,
                        pg_desc=pg,
                        pg_ranks=ranks,
                        coll_id=n,
                        done=not waits,
                        t=t,
                    )
                )
    return run_of(rows, exits=dict.fromkeys(range(3)), world=3)


def test_two_divergences_neither_path_explains_are_told_by_the_rank_that_broke_its_order():
    """Rank 1 broke the g-then-default order every rank in g kept at every step; rank 0 kept
    it. Whichever call started first, the paths parted at g #5, where rank 1 made no call."""
    for g_at, default_at in ((T0 + 20, T0 + 30), (T0 + 30, T0 + 20)):
        fd = context(subgroup_skip_run(g_at=g_at, default_at=default_at)).first_divergence
        assert (fd.pg, fd.seq, fd.culprits) == ("g", 5, [1]), (g_at, default_at, fd)


def test_a_rank_whose_recorder_was_not_dumped_made_no_call_nobody_knows() -> None:
    """DDP's all-reduces are torch's own calls: the probe does not see them, the flight recorder
    numbers them. Rank 0 was killed before its recorder was dumped, so its record of the group
    is not complete however complete its probe's is: it is not the class that made no call (at
    #1, the others' first), and the card says its record is missing, not that it never called."""
    fr = [fr_entry(r, s) for r in (1, 2) for s in range(1, 4)]
    fr += [fr_entry(2, 4, done=False)]
    run = run_of([], exits={0: None, 1: 1, 2: None}, fr=fr)
    fd = context(run).first_divergence
    assert (fd.seq, fd.culprits, fd.decided_by) == (4, [1], "no_call"), fd
    d = diagnose(run)
    assert d.culprit_ranks == [1], d.render()
    words = d.collective.state_by_rank[0] if d.collective else ""
    assert "never called it" not in words and "no record" in words, d.render()
