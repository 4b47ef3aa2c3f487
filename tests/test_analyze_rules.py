"""The analyzer's pieces one at a time, on tables built here: the merged calls, the wait-for
graph (roots, cycles, the rank that departed), what a rank outside the collectives was doing, and
each rule on a context of its own."""

from __future__ import annotations

import ast
from pathlib import Path

import pandas as pd
import pytest

from rankscope import schema
from rankscope.analyze import diagnose, merge_calls, rules, wait_graph
from rankscope.analyze.activity import rank_activity
from rankscope.analyze.calls import calls_from_flight_recorder, calls_from_probe
from rankscope.analyze.causes import DRIVER_FACTS, ENTRIES, FAILURE_KINDS, LAUNCH_KINDS, Cause
from rankscope.analyze.context import Context
from rankscope.analyze.evidence import Evidence
from rankscope.analyze.waits import departed

from .test_analyze_tables import T0, call, fr_entry, run_of, steps


def probe(rows: list[dict]) -> pd.DataFrame:
    return calls_from_probe(schema.conform("collectives", pd.DataFrame(rows)))


def recorder(rows: list[dict]) -> pd.DataFrame:
    return calls_from_flight_recorder(schema.conform("flight_recorder", pd.DataFrame(rows)))


def context(run) -> Context:
    return Context(Evidence(run), straggler_s=1.0)


# --- the calls ----------------------------------------------------------------------------------
def test_the_recorders_own_collectives_join_the_probes_calls():
    """Rank 0's recorder holds its two Python all_reduces (made while the probe's calls ran, on
    the same thread) and one all_reduce the backend issued itself (DDP's bucket, from C++). The
    group then takes the recorder's numbers, with the probe's sites on its calls."""
    thread = 140_000_000_000_000
    p = [
        call(0, 1, t=T0 + 1, thread=f"0x{thread:016x}", site="train.py:11"),
        call(0, 2, t=T0 + 3, thread=f"0x{thread:016x}", site="train.py:12"),
    ]
    f = [
        fr_entry(0, 1, time_created_ns=int((T0 + 1.001) * 1e9), thread_id=str(thread)),
        fr_entry(0, 2, time_created_ns=int((T0 + 2) * 1e9), thread_id=str(thread)),  # C++
        fr_entry(0, 3, time_created_ns=int((T0 + 3.001) * 1e9), thread_id=str(thread)),
    ]
    merged = merge_calls(probe(p), recorder(f))
    assert merged["seq"].tolist() == [1, 2, 3]
    assert merged["source"].astype(str).tolist() == ["flight_recorder"] * 3
    sites = [None if pd.isna(x) else x for x in merged["site"]]
    assert sites == ["train.py:11", None, "train.py:12"]
    # Every recorder entry is a probe call's: the probe's calls are the sequence.
    only_python = merge_calls(probe(p), recorder([f[0], dict(f[2], collective_seq_id=2)]))
    assert only_python["source"].astype(str).tolist() == ["collectives"] * 2


# --- the wait-for graph -------------------------------------------------------------------------
def test_roots_are_ranks_waited_on_that_wait_for_nobody():
    calls = probe([*steps(range(3), 2), call(0, 3, done=False), call(1, 3, done=False)])
    g = wait_graph(calls, members={"0": (0, 1, 2)})
    assert g.roots == (2,) and g.cycles == () and g.waiting == [0, 1]
    assert g.waits[0].waits_for == {2} and g.waiting_on([2]) == [0, 1]


def tp_skip() -> pd.DataFrame:
    """4 ranks, tp groups "1" = [0, 1] and "2" = [2, 3]; at step 2 rank 2 skips its tp call."""
    rows = []
    for rank in range(4):
        tp, members = ("1", "0,1") if rank < 2 else ("2", "2,3")
        n = 0
        for step in (1, 2):
            if not (rank == 2 and step == 2):
                n += 1
                last = step == 2 and rank == 3
                rows.append(
                    call(
                        rank, step, pg=tp, pg_ranks=members, site="m.py:5", t=T0 + n, done=not last
                    )
                )
                n += 1
                if last:
                    continue
            rows.append(
                call(rank, step, pg_ranks="0,1,2,3", site="m.py:6", t=T0 + n + 1, done=step == 1)
            )
    return probe(rows)


def test_a_cycle_across_groups_and_the_rank_that_departed():
    calls = tp_skip()
    members = {"0": (0, 1, 2, 3), "1": (0, 1), "2": (2, 3)}
    g = wait_graph(calls, members=members)
    assert g.roots == () and g.cycles == ((2, 3),)
    assert g.waits[3].pg == "2" and g.waits[3].waits_for == {2}
    assert g.waits[2].pg == "0" and g.waits[2].waits_for == {3}
    # rank 2's last two calls (m.py:6 after m.py:6) follow each other nowhere else
    assert departed(calls, [2, 3]) == [2]


def test_a_send_facing_its_receive_is_no_wait():
    rows = [
        call(0, 1, op="send", peer="1", done=False, pg_ranks="0,1"),
        call(1, 1, op="recv", peer="0", done=False, pg_ranks="0,1"),
    ]
    g = wait_graph(probe(rows), members={"0": (0, 1)})
    assert all(not w.waits_for for w in g.waits.values()) and g.cycles == ()


# --- what a rank was doing ---------------------------------------------------------------------
def frames(rank: int, thread: str, *rows: tuple[str, str, int, str | None]) -> list[dict]:
    """Frames of one thread, innermost first: (func, file, line, code)."""
    return [
        {
            "rank": rank,
            "capture_id": 1,
            "capture": 0,
            "source": f"ranks/{rank}/stacks.txt",
            "reason": "stall",
            "thread": thread,
            "depth": depth,
            "func": func,
            "file": file,
            "line": line,
            "is_user": not file.startswith("/usr/lib/"),
            "code": code,
        }
        for depth, (func, file, line, code) in enumerate(rows)
    ]


def test_what_the_main_thread_waits_on_and_what_the_others_do():
    stacks = schema.conform(
        "stacks",
        pd.DataFrame(
            frames(1, "0xa", ("<module>", "/u/train.py", 14, "with log_lock:"))
            + frames(
                1,
                "0xb",
                ("flush", "/u/train.py", 8, "time.sleep(60)"),
                ("run", "/usr/lib/python3.11/threading.py", 982, None),
            )
            + frames(
                2,
                "0xc",
                ("wait", "/usr/lib/python3.11/threading.py", 331, None),
                ("get", "/usr/lib/python3.11/queue.py", 171, None),
                ("<module>", "/u/train.py", 20, "batch = q.get()"),
            )
        ),
    )
    lock = rank_activity(stacks, 1, main_thread="0xa")
    assert (lock.kind, lock.site, lock.code) == ("lock", "train.py:14", "with log_lock:")
    assert lock.others == ["thread 0xb at train.py:8 (sleeping: time.sleep(60))"]
    assert lock.doing == "waiting to acquire a lock at train.py:14 (`with log_lock:`)"
    queue = rank_activity(stacks, 2)
    assert (queue.kind, queue.site) == ("queue", "train.py:20")


# --- rules on their own -------------------------------------------------------------------------
def test_the_waits_rule_names_a_rank_blocked_outside_and_its_fix():
    rows = [*steps(range(3), 2), call(0, 3, done=False), call(1, 3, done=False)]
    stacks = [
        {
            "rank": 2,
            "capture_id": 1,
            "site": "train.py:14",
            "func": "<module>",
            "source": "ranks/2/stacks.txt",
        }
    ]
    run = run_of(rows, exits=dict.fromkeys(range(3)), stacks=stacks)
    run.stacks = schema.conform(
        "stacks", pd.DataFrame(frames(2, "0xa", ("<module>", "/u/train.py", 14, "time.sleep(300)")))
    )
    found = rules.waits(context(run))
    assert (found.cause, found.culprits, found.waiting) == ("stuck_outside", [2], [0, 1])
    assert found.facts["culprit_doing"].startswith("sleeping at train.py:14")
    assert "back-off" in found.facts["wait_fix"]
    d = diagnose(run)
    assert d.fix == found.facts["wait_fix"] and "Call collectives" not in d.fix


ENGINE = "/usr/lib/python3/dist-packages/ipyparallel/engine/"


def _cell_hang(cells: dict[int, tuple[int, int, str, float]], errors: dict[int, str] | None = None):
    """Rank 0 waits in an all_reduce at ``<cell 5>:3``; ranks 1-2 sit in their IPython
    Parallel engine's loop, between cells. ``cells``: each rank's latest cell as the ranks
    table holds it, ``rank -> (cell, run, state, time)``; ``errors``: what it raised there."""
    rows = [*steps(range(3), 2)]
    rows.append(call(0, 3, done=False, file="<cell 5>", line=3, site="<cell 5>:3", t=T0 + 10))
    run = run_of(rows, exits=dict.fromkeys(range(3)))
    idle = [
        frames(
            r, "0xa", ("dispatch", ENGINE + "kernel.py", 400, None), ("<module>", ENGINE, 4, None)
        )
        for r in (1, 2)
    ]
    run.stacks = schema.conform("stacks", pd.DataFrame([f for one in idle for f in one]))
    ranks = run.ranks.assign(
        cell=[cells.get(r, (None,) * 4)[0] for r in range(3)],
        cell_run=[cells.get(r, (None,) * 4)[1] for r in range(3)],
        cell_state=[cells.get(r, (None,) * 4)[2] for r in range(3)],
        cell_s=[cells.get(r, (None,) * 4)[3] for r in range(3)],
        cell_error=[(errors or {}).get(r) for r in range(3)],
    )
    run.ranks = schema.conform("ranks", ranks)
    return run


def test_ranks_that_finished_the_cell_the_others_wait_in_took_a_branch():
    """In a cell session, ranks 1-2 finished the very run of cell [5] in which rank 0 waits
    (their cell events: its end, no thread of it left running): for that cell they are like
    ranks that ended their script, the culprits of a rank-conditional collective (D21)."""
    run = _cell_hang(
        {
            0: (5, 3, "running", T0 + 9),
            1: (5, 3, "finished", T0 + 9.5),
            2: (5, 3, "finished", T0 + 9.5),
        }
    )
    d = diagnose(run)
    assert (d.cause, d.culprit_ranks, d.waiting_ranks) == (
        "rank_conditional_collective",
        [1, 2],
        [0],
    )
    assert (
        "ranks 1-2 finished cell [5] without calling all_reduce while rank 0 waits in " in d.reason
    )
    assert "Call collectives on every rank" in d.fix, d.fix
    # the card's row of each: where it stands, between cells, not "outside any collective"
    for r in (1, 2):
        state = d.collective.state_by_rank[r]
        assert state == "never called it: done with cell [5], waiting for the next", state


@pytest.mark.parametrize(
    "why",
    ["an earlier run", "left threads", "call before the cell", "waiter not in the cell"],
)
def test_ranks_idle_between_cells_but_not_proven_are_stuck_outside_in_the_plural(why):
    """What the proof does not show is not read as a finished cell (rankscope.waitfor's
    limits): ranks 1-2 idle after an earlier run of the cell, or whose cell left a thread
    running, or a call that rank 0 made before its cell started, or a rank 0 that ended its
    cell. They are stuck outside the collectives, and the sentence says so of both ranks."""
    waiter = (5, 3, "running", T0 + 9)
    idle = (5, 3, "finished", T0 + 9.5)
    if why == "an earlier run":
        idle = (5, 2, "finished", T0 + 5)
    elif why == "left threads":
        idle = (5, 3, "threads", T0 + 9.5)
    elif why == "call before the cell":
        waiter = (5, 3, "running", T0 + 11)
    else:
        waiter = (5, 3, "threads", T0 + 12)
    d = diagnose(_cell_hang({0: waiter, 1: idle, 2: idle}))
    assert (d.cause, d.culprit_ranks, d.waiting_ranks) == ("stuck_outside", [1, 2], [0])
    assert "rank 0 waits in all_reduce" in d.reason, d.reason
    assert "for ranks 1-2, which are done with their cell (idle" in d.reason, d.reason


def test_ranks_whose_cell_raised_before_the_call_crashed_for_that_cell():
    """Ranks 1-2's run of the cell rank 0 waits in raised (they failed it: no branch took them
    past the call): their crash, for that cell, with the cell's fix; a rank interrupted by the
    user (KeyboardInterrupt) is not one."""
    waiter, raised = (5, 3, "running", T0 + 9), (5, 3, "raised", T0 + 9.5)
    d = diagnose(_cell_hang({0: waiter, 1: raised, 2: raised}))
    assert (d.cause, d.culprit_ranks, d.waiting_ranks) == ("rank_crashed", [1, 2], [0])
    assert d.reason.startswith("ranks 1-2 failed with an error"), d.reason
    assert "%ranks restart" in d.fix and "ranks 1-2's cell [5] raised before all_reduce" in (
        " ".join(d.notes)
    ), d.notes
    told = diagnose(_cell_hang({0: waiter, 1: raised, 2: raised}, {1: "ValueError: bad batch"}))
    assert told.reason.startswith("ranks 1-2 failed with ValueError: bad batch"), told.reason
    stopped = {1: "KeyboardInterrupt", 2: "KeyboardInterrupt"}
    d = diagnose(_cell_hang({0: waiter, 1: raised, 2: raised}, stopped))
    assert (d.cause, d.culprit_ranks) == ("stuck_outside", [1, 2]), d.render()


def test_fewer_calls_then_a_barrier_with_no_stacks_or_source_is_not_guessed():
    """Rank 1 made 3 all_reduces at the loop's line, then a barrier, while rank 0 makes its
    4th; no stacks and no source show where the barrier is: out of data (D9) and a branch inside
    the loop (D21) both remain, and the diagnosis says so instead of picking one. The stall's
    capture that would have shown it did not get rank 1's answer in time: said too."""
    rows = [call(0, s, site="train.py:9", pg_ranks="0,1") for s in range(1, 4)]
    rows += [call(0, 4, site="train.py:9", done=False, pg_ranks="0,1")]
    rows += [call(1, s, site="train.py:9", pg_ranks="0,1") for s in range(1, 4)]
    rows += [call(1, 4, op="barrier", site="train.py:12", done=False, pg_ranks="0,1")]
    stall = {"kind": "no_progress", "capture_id": 1, "missing": [1], "capture_deadline_s": 8.0}
    run = run_of(rows, exits={0: None, 1: None}, world=2, info={"stalls": [stall]})
    found = rules.mismatch(context(run))
    assert (found.cause, found.culprits, found.recipe) == ("undetermined", [1], "the cause's")
    unknown = found.facts["unknown"]
    assert "3 calls of all_reduce at train.py:9 where rank 0 is making its 4th" in unknown
    assert "rank 1 did not answer the stall's capture 1 within its deadline (8.0 s)" in unknown
    d = diagnose(run)
    assert (d.verdict, d.cause, d.recipe, d.culprit_ranks) == ("hang", "undetermined", None, [1])
    assert "uneven inputs" not in d.summary and "recipe D9" in d.fix and "recipe D21" in d.fix
    assert "uneven_inputs" not in d.fix  # causes by their titles, not their keys
    assert any("did not answer the stall's capture 1" in m for m in d.missing), d.missing
    # Where rank 0 makes its first call at a new line, the barrier is an extra call (D21).
    rows[3] = dict(rows[3], site="train.py:10")
    other = rules.mismatch(context(run_of(rows, exits={0: None, 1: None}, world=2)))
    assert other.cause == "rank_conditional_collective"


@pytest.mark.parametrize("how", ["returned", "sys_exit"])
def test_a_rank_whose_own_end_came_before_the_launchers_sigterm_left_early(how):
    """Rank 2 ended its script (or called sys.exit(0)) after 2 all_reduces; its peers' 3rd
    failed as its connections closed, rank 1 raised, and torchrun's SIGTERM reached rank 2
    while its interpreter was still exiting: its parent saw -15, its end event says it had
    left on its own. It exited early (D9), not a rank outside the collectives."""
    rows = [*steps(range(3), 2)]
    rows += [call(r, 3, done=False, t=T0 + 3) for r in (0, 1)]
    end = {"rank": 2, "ev": "end", "t_s": T0 + 3, "code": 0, "message": "exit"}
    run = run_of(rows, exits={0: -15, 1: 1, 2: -15}, events=[end])
    ended = {"end_how": [None, "exception", how], "end_reason": [None, "exception", "exit"]}
    run.ranks = schema.conform("ranks", run.ranks.assign(**ended))
    d = diagnose(run)
    assert (d.verdict, d.cause, d.culprit_ranks) == ("hang", "early_exit", [2]), d.render()
    assert "then ended by the launcher as it exited: SIGTERM (-15)" in d.render()
    f = context(run).facts[2]
    assert (
        f.exiting
        and f.end_code == 0
        and f.end.status == ("exited" if how == "returned" else "ended")
    )
    # the stop's SIGTERM too: in a stopped job every signal is the stop's
    stopped = run_of(
        rows, exits={0: -15, 1: -15, 2: -15}, events=[end], info={"stop_reason": "user"}
    )
    stopped.ranks = schema.conform("ranks", stopped.ranks.assign(end_how=[None, None, how]))
    assert context(stopped).facts[2].exiting
    # a rank the SIGTERM ended before its own end is not one that left
    killed = run_of(rows, exits={0: -15, 1: 1, 2: -15})
    assert not context(killed).facts[2].exiting


def test_a_rank_that_destroyed_the_group_left_it_whatever_it_does_now():
    """Rank 2 made 2 all_reduces at the loop's line where ranks 0-1 make a 3rd, then
    destroyed the process group; it is alive, busy elsewhere. It ran out of iterations and
    left the group (D9): it will never make the call, whatever its stacks show it doing."""
    rows = [call(r, s, site="train.py:9") for r in range(3) for s in (1, 2)]
    rows += [call(r, 3, site="train.py:9", done=False) for r in (0, 1)]
    rows += [call(2, 3, op="destroy_process_group", site="train.py:11")]
    run = run_of(rows, exits=dict.fromkeys(range(3)))
    ctx = context(run)
    assert ctx.left_group(2, "0")["site"] == "train.py:11"
    assert ctx.left_group(0, "0") is None and ctx.left_group(2, "7") is not None  # all groups
    d = diagnose(run)
    assert (d.cause, d.culprit_ranks) == ("early_exit", [2]), d.render()
    assert "destroyed its process group at train.py:11" in d.reason, d.reason
    # joined again after it: not gone
    again = [*rows, call(2, 4, op="init_process_group", pg=None, site="train.py:12")]
    assert context(run_of(again, exits=dict.fromkeys(range(3)))).left_group(2, "0") is None


def test_ranks_that_disagree_on_the_root():
    rows = [*steps(range(3), 1)]
    rows += [call(r, 2, op="broadcast", peer="0", done=False) for r in (0, 1)]
    rows += [call(2, 2, op="broadcast", peer="2", done=False)]
    found = rules.mismatch(context(run_of(rows, exits=dict.fromkeys(range(3)))))
    assert (found.cause, found.culprits) == ("root_mismatch", [2])
    assert (found.facts["culprit_root"], found.facts["other_root"]) == ("2", "0")


@pytest.mark.parametrize("moment", ["first_call", "hung_on_rank_3"])
def test_a_node_slurm_lost_names_its_ranks_whatever_moment_it_caught(moment):
    """SLURM ended the job NODE_FAIL and named node2 lost: its ranks (2 and 3) are the cause,
    the others wait, whether the node went down while every rank was in the first call (a
    loaded machine) or while rank 3 was away from the second one that the others waited in."""
    ranks = range(4)
    four = "0,1,2,3"
    if moment == "first_call":
        rows = [call(r, 1, done=False, pg_ranks=four) for r in ranks]
    else:
        rows = [call(r, 1, pg_ranks=four) for r in ranks]
        rows += [call(r, 2, done=False, pg_ranks=four) for r in (0, 1, 2)]
    nodes = {0: "node1", 1: "node1", 2: "node2", 3: "node2"}
    slurm = {"state": "NODE_FAIL", "reason": "NodeDown", "lost_nodes": {"node2": "power"}}
    exits = dict.fromkeys(ranks, -15)
    run = run_of(rows, exits=exits, world=4, nodes=nodes, info={"slurm": slurm})
    found = rules.node_lost(context(run))
    assert found is not None and found.cause == "node_lost"
    assert (found.culprits, found.waiting) == ([2, 3], [0, 1])
    d = diagnose(run)
    assert (d.verdict, d.cause, d.culprit_ranks) == ("crash", "node_lost", [2, 3])
    assert "node2" in d.reason and "power" in d.reason and "NodeDown" in d.reason, d.reason
    # without the lost node named (an older run.json), the rule passes
    blind = run_of(
        rows, exits=exits, world=4, nodes=nodes, info={"slurm": {**slurm, "lost_nodes": {}}}
    )
    assert rules.node_lost(context(blind)) is None


def test_the_rules_run_in_their_documented_order_and_can_be_replaced():
    names = [r.__name__ for r in rules.RULES]
    assert names == [
        "launch_error",
        "node_lost",
        "model_mismatch",
        "reported_failure",
        "earlier_divergence",
        "mismatch",
        "peer_mismatch",
        "signal_death",
        "stream_stuck",
        "waits",
        "stuck_at_exit",
        "errors_only",
        "bare_exit",
        "straggler",
    ]
    rows = [*steps(range(3), 2), call(0, 3, done=False), call(1, 3, done=False)]
    run = run_of(rows, exits=dict.fromkeys(range(3)))
    assert diagnose(run).cause == "lagging_rank"  # rank 2 is alive; no stacks say where
    assert diagnose(run, rules=[rules.straggler]).verdict != "hang"


def _homes_and_facts() -> tuple[dict[Cause, list[str]], dict[str, tuple[str, set[str]]]]:
    """Where each cause is named in the rules package (``Cause.x`` outside a comparison, or a
    lookup in a map of causes by error kind), by ``module.function`` (or ``module.NAME`` of a map); and
    for each module, its source and the fact keys it writes (``{"key": ...}``,
    ``facts["key"] = ...``, ``update(key=...)``, ``Decided``'s facts)."""
    maps = {"LAUNCH_KINDS": LAUNCH_KINDS, "FAILURE_KINDS": FAILURE_KINDS}
    homes: dict[Cause, list[str]] = {c: [] for c in Cause}
    modules = {}
    for path in sorted(Path(rules.__file__).parent.glob("*.py")):
        source = path.read_text()
        tree = ast.parse(source)
        keys: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                keys |= {k.value for k in node.keys if isinstance(k, ast.Constant)}
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant):
                        keys.add(t.slice.value)
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "update":
                keys |= {k.arg for k in node.keywords if k.arg}
        modules[path.stem] = (source, keys)
        for top in tree.body:
            name = getattr(top, "name", None) or getattr(
                getattr(top, "target", None)
                or (top.targets[0] if hasattr(top, "targets") else None),
                "id",
                None,
            )
            compared = {
                id(n) for c in ast.walk(top) if isinstance(c, ast.Compare) for n in ast.walk(c)
            }
            named = set()
            for node in ast.walk(top):
                if id(node) in compared:
                    continue
                if isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "Cause":
                    named.add(Cause[node.attr])
                elif isinstance(node, ast.Subscript) and getattr(node.value, "id", "") in maps:
                    named |= set(maps[node.value.id].values())  # a cause looked up by kind
            for cause in named:
                homes[cause].append(f"{path.stem}.{name}")
    return homes, modules


def test_every_cause_is_decided_in_one_function_that_sets_the_facts_its_templates_name():
    """Each cause is named by one function of the rules (or one map of them by error kind),
    and its reason and fix name only facts that function's module, and the modules that call
    it, write (or the driver adds): a misspelt key in a template or in a rule fails here, not
    as "unknown" in a card."""
    assert set(ENTRIES) == set(Cause)
    homes, modules = _homes_and_facts()
    for cause, where in homes.items():
        assert len(where) == 1, f"{cause} is decided in {where or 'no rule'}"
        module, name = where[0].split(".")
        users = [m for m, (source, _) in modules.items() if m == module or name in source]
        written = set().union(*(modules[m][1] for m in users))
        assert cause.facts - DRIVER_FACTS <= written, (cause, users)
    # and at run time: a finding without a fact its templates name is refused when made
    with pytest.raises(ValueError, match=r"straggler lacks the facts \['culprit_op'\]"):
        rules.Finding(
            cause=Cause.straggler,
            culprits=[1],
            waiting=[0],
            facts={"culprit_opp": "all_reduce", "late": "2.0 s", "collective": "group 0"},
        )
    with pytest.raises(TypeError, match="a finding's cause is a Cause"):
        rules.Finding(cause="straggler", culprits=[1], waiting=[0])


def test_a_barrier_inside_the_loop_is_a_rank_conditional_call_not_running_out(tmp_path):
    """The counts alone would say rank 1 ran out of iterations (3 all_reduces where rank 0 is
    making its 4th, then a barrier); the source says the barrier is inside the loop, under a
    condition: a branch, not the loop's end. Past the loop's end, it is uneven inputs."""
    src = tmp_path / "train.py"
    src.write_text(
        "import torch.distributed as dist\n"
        "for step in range(6):\n"
        "    dist.all_reduce(w)\n"
        "    if step == 2 and rank == 1:\n"
        "        dist.barrier()\n"
        "dist.barrier()\n"
    )

    def rows(barrier_line: int) -> list[dict]:
        out = [
            call(0, s, file=str(src), line=3, site="train.py:3", pg_ranks="0,1")
            for s in range(1, 4)
        ]
        out += [call(0, 4, file=str(src), line=3, site="train.py:3", done=False, pg_ranks="0,1")]
        out += [
            call(1, s, file=str(src), line=3, site="train.py:3", pg_ranks="0,1")
            for s in range(1, 4)
        ]
        out += [
            call(
                1,
                4,
                op="barrier",
                file=str(src),
                line=barrier_line,
                site=f"train.py:{barrier_line}",
                done=False,
                pg_ranks="0,1",
            )
        ]
        return out

    inside = rules.mismatch(context(run_of(rows(5), exits={0: None, 1: None}, world=2)))
    assert (inside.cause, inside.culprits) == ("rank_conditional_collective", [1])
    past = rules.mismatch(context(run_of(rows(6), exits={0: None, 1: None}, world=2)))
    assert (past.cause, past.culprits) == ("uneven_inputs", [1])
    d = diagnose(run_of(rows(6), exits={0: None, 1: None}, world=2))
    assert d.parting["source"] == "for step in range(6):" and d.parting["ranks_out"] == [1]


def test_every_rule_of_the_package_is_found_at_its_place():
    """A function decorated ``@rule(place)`` in any file of the rules package is asked, in the
    order of the places; a place is one rule's."""
    package = Path(rules.__file__).parent
    decorated = {}
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                for dec in node.decorator_list:
                    if isinstance(dec, ast.Call) and getattr(dec.func, "id", None) == "rule":
                        decorated[dec.args[0].value] = node.name
    assert [r.__name__ for r in rules.RULES] == [decorated[p] for p in sorted(decorated)]
    assert rules.RULES[0].__name__ == "launch_error" and rules.RULES[-1].__name__ == "straggler"
    with pytest.raises(ValueError, match="taken by mismatch"):
        rules.rule(40)(lambda ctx: None)
