"""The one model of how a rank ended, of a call's state, and the words every view uses
(rankscope.state)."""

from __future__ import annotations

import pandas as pd
import pytest

from rankscope.rundir import RankRecord
from rankscope.state import (
    CALL_STATES,
    RankEnd,
    call_state,
    call_states,
    call_text,
    ends_text,
    group_name,
    job_state_words,
    proof_text,
    rank_end,
    shapes_text,
    state_words,
)


@pytest.mark.parametrize(
    ("witnesses", "status", "words"),
    [
        ({"probe_code": 0, "how": "returned"}, "exited", "exited 0"),
        ({"probe_code": 1, "how": "exception"}, "failed", "failed: exit code 1 (an exception)"),
        ({"probe_code": 3, "how": "sys_exit"}, "failed", "failed: exit code 3 (sys.exit)"),
        ({"parent_code": -6}, "aborted", "aborted itself: SIGABRT (-6)"),
        ({"parent_code": -11}, "crashed", "crashed: SIGSEGV (-11)"),
        ({"parent_code": -9}, "killed", "killed: SIGKILL (-9), by no one rankscope knows"),
        ({"parent_code": -9, "stopped": True}, "stopped", "stopped: SIGKILL (-9)"),
        ({"how": "SIGTERM"}, "ended", "ended by the launcher: SIGTERM (-15)"),
        ({"how": "SIGTERM", "stopped": True}, "stopped", "stopped: SIGTERM (-15)"),
        # the parent saw the teardown's SIGTERM end a rank that had raised: it failed first
        (
            {"parent_code": -15, "probe_code": 1, "how": "exception"},
            "failed",
            "failed (an exception), then ended by the launcher: SIGTERM (-15)",
        ),
        # its script had returned (or it called sys.exit) when the teardown came: it left first
        (
            {"parent_code": -15, "probe_code": 0, "how": "returned"},
            "exited",
            "ran its script to the end, then ended by the launcher as it exited: SIGTERM (-15)",
        ),
        (
            {"parent_code": -15, "probe_code": 2, "how": "sys_exit"},
            "ended",
            "called sys.exit, then ended by the launcher as it exited: SIGTERM (-15)",
        ),
        (
            {"parent_code": -15, "how": "returned", "stopped": True},
            "stopped",
            "ran its script to the end, then stopped as it exited: SIGTERM (-15)",
        ),
    ],
)
def test_a_rank_s_end_from_its_two_witnesses(witnesses, status, words):
    end = rank_end(**witnesses)
    assert end is not None and (end.status, end.words) == (status, words)


def test_the_parent_s_code_beats_the_probe_s_and_nothing_is_no_end():
    assert rank_end(parent_code=-15, probe_code=1).code == -15  # type: ignore[union-attr]
    assert rank_end() is None
    assert RankEnd(code=None).status == "dead" and RankEnd(code=None, stopped=True).status == (
        "stopped"
    )
    assert RankEnd(code=-200).signal == "signal 200"  # no such signal: still named


def test_done_counts_completed_collectives_only():
    r = RankRecord(rank=0)
    facts = {"ev": "facts", "facts": 1, "op": "init_process_group", "pg": None}
    r.apply(facts)
    r.apply({"ev": "call", "t": 1.0, "id": 1, "seq": 1, "facts": 1, "dur_s": 0.1, "ok": True})
    assert r.done == 0 and r.last_done is None  # process-group management is not a collective
    r.apply({**facts, "facts": 2, "op": "all_reduce", "pg": "0"})
    for seq, ok in ((1, True), (2, True), (3, False)):
        line = {"ev": "call", "t": 2.0 + seq, "id": 1 + seq, "seq": seq, "facts": 2}
        r.apply({**line, "dur_s": 0.1, "ok": ok})
    # the third raised: two completed, the last #2
    assert r.done == 2 and r.last_done == "all_reduce (group 0 #2)"


def test_words_not_reprs():
    assert [shapes_text(s) for s in ("[[16]]", [[16]], "[[]]", "[[4, 8], [2]]", "[]")] == [
        "16",
        "16",
        "scalar",
        "4x8, 2",
        "no tensor",
    ]
    assert shapes_text("not json [") == "not json [" and shapes_text(None) == ""
    assert group_name("3", "undefined", [2, 0]) == "group 3 (ranks 0, 2)"
    assert group_name("0", "default_pg", [0, 1]) == "group 0 (default_pg)"
    assert group_name("5") == "group 5"
    proof = proof_text("rank 0 waits in barrier and rank 1 called all_reduce")
    assert not proof.startswith("proven") and proof.endswith("all_reduce.")
    assert ends_text({0: "stopped: SIGTERM (-15)", 2: "stopped: SIGTERM (-15)", 1: ""}) == (
        "ranks 0, 2 stopped: SIGTERM (-15); rank 1 not ended"
    )


def test_the_job_s_state_never_contradicts_its_rows():
    assert job_state_words("running", ["failed", "ended", "aborted"]) == "ending (every rank ended)"
    assert job_state_words("stalled", ["waiting", "waiting"], stopping=True) == "stopping"
    assert job_state_words("running", ["waiting", "ended"]) == "running"
    assert job_state_words("stopped", ["stopped"]) == "stopped"


def test_a_calls_state_is_one_rule_for_one_call_and_for_a_table():
    combos = [
        (completed, ok, started)
        for completed in (True, False, None)
        for ok in (True, False, None)
        for started in (True, False)
    ]
    one = [call_state(completed=c, ok=o, started=s) for c, o, s in combos]
    table = call_states(
        pd.array([c for c, _, _ in combos], dtype="boolean"),
        pd.Series([o for _, o, _ in combos], dtype="boolean"),
        [s for _, _, s in combos],
    )
    assert [CALL_STATES[i] for i in table] == one
    assert one[:6] == ["completed", "completed", "failed", "failed", "completed", "completed"]
    assert call_state(completed=False, started=True) == "started"
    assert call_state(completed=None) == "issued"
    assert state_words("issued") == "issued, waiting"
    assert state_words("failed", ended="x") == "failed"
    assert state_words("issued", ended="aborted itself: SIGABRT (-6)") == (
        "issued, never completed: its rank ended in it (aborted itself: SIGABRT (-6))"
    )
    assert call_text("barrier", "0", 5, "issued", ended="") == (
        "barrier (group 0 #5) issued, never completed"
    )


def test_a_state_said_of_several_ranks_agrees_with_them() -> None:
    from rankscope.state import state_words, states_words

    one = state_words("issued", ended="stopped: SIGTERM (-15)")
    assert one == "issued, never completed: its rank ended in it (stopped: SIGTERM (-15))"
    assert states_words(one) == (
        "issued, never completed: their ranks ended in it (stopped: SIGTERM (-15))"
    )
    assert states_words("failed") == "failed"
