"""The stall prover on synthetic states (what each rank called, waits in, sent; how it ended),
and the states the tracker builds from probe events: a proof where nothing can move again,
never one where a rank may still come."""

from __future__ import annotations

from rankscope.launch.tracker import _backend_state, _state
from rankscope.rundir import RankRecord
from rankscope.waitfor import RankState, prove

WORLD = {"0": [0, 1, 2, 3]}


def fact_of(ranks: dict[int, RankState]) -> str | None:
    """The prover's fact, as its sentence."""
    proof = prove(ranks)
    return None if proof is None else proof.text()


AR = ("all_reduce", [[4]], ["float32"], None)


def rank(r: int, *, history: dict | None = None, members=WORLD, **kw) -> RankState:
    """A rank whose collectives on group 0 were ``history`` (seq -> facts; default: 3
    all_reduces); ``pending``/``blocked`` name seqs on group 0."""
    history = {s: AR for s in range(1, 4)} if history is None else history
    calls = {("0", s): f for s, f in history.items()}
    called = {"0": max(history)} if history else {}
    pending = tuple(("0", s) for s in kw.pop("pending", ()))
    blocked = kw.pop("blocked", None)
    if blocked is not None:
        blocked = ("0", blocked)
        pending = (*pending, blocked)
    return RankState(
        rank=r, members=members, called=called, calls=calls, pending=pending, blocked=blocked, **kw
    )


def waiting_in(r: int, cell: tuple[str, int], *, members: dict, called: dict) -> RankState:
    """A rank blocked in an all_reduce at ``cell`` (group, seq)."""
    return RankState(
        rank=r, members=members, called=called, calls={cell: AR}, pending=(cell,), blocked=cell
    )


def test_all_ranks_waiting_in_the_same_call_prove_nothing():
    ranks = {r: rank(r, blocked=3) for r in range(4)}
    assert fact_of(ranks) is None


def test_different_calls_at_one_place_prove_a_hang():
    odd = ("all_gather", [[4], [4], [4], [4], [4]], ["float32"] * 5, None)
    ranks = {r: rank(r, blocked=3) for r in range(3)}
    ranks[3] = rank(3, history={1: AR, 2: AR, 3: odd}, blocked=3)
    fact = fact_of(ranks)
    assert fact == (
        "rank 0 waits in all_reduce and rank 3 called all_gather as collective #3 of group 0: "
        "not the same call"
    )


def test_shapes_dtypes_and_roots_that_differ_prove_a_hang():
    for facts, word in [
        (("all_reduce", [[5]], ["float32"], None), "called all_reduce of shapes [[5]]"),
        (("all_reduce", [[4]], ["float64"], None), "called all_reduce of dtypes ['float64']"),
    ]:
        ranks = {r: rank(r, blocked=3) for r in range(3)}
        ranks[3] = rank(3, history={1: AR, 2: AR, 3: facts}, blocked=3)
        assert word in fact_of(ranks)
    bcast = {1: AR, 2: AR, 3: ("broadcast", [[4]], ["float32"], 0)}
    ranks = {r: rank(r, history=bcast, blocked=3) for r in range(3)}
    ranks[3] = rank(3, history={**bcast, 3: ("broadcast", [[4]], ["float32"], 1)}, blocked=3)
    assert "broadcast with root 0 and rank 3 called broadcast with root 1" in fact_of(ranks)


def test_uneven_ops_take_different_tensors_legally():
    a2a = {1: ("all_to_all_single", [[4]], ["float32"], None)}
    ranks = {r: rank(r, history=a2a, blocked=1) for r in range(3)}
    ranks[3] = rank(3, history={1: ("all_to_all_single", [[9]], ["float32"], None)}, blocked=1)
    assert fact_of(ranks) is None


def test_a_rank_one_call_behind_proves_nothing():
    # rank 3 is at #2 (computing, about to make #3), or still inside #2 as far as its events go
    ranks = {r: rank(r, blocked=3) for r in range(3)}
    two = {1: AR, 2: AR}
    assert fact_of({**ranks, 3: rank(3, history=two)}) is None
    assert fact_of({**ranks, 3: rank(3, history=two, blocked=2)}) is None


def test_a_rank_that_went_past_with_another_call_proves_a_hang():
    # rank 3 made a barrier as #3 (it completed: gloo paired it with something) and is now in #4
    went = {1: AR, 2: AR, 3: ("barrier", [], [], None), 4: AR}
    ranks = {r: rank(r, blocked=3) for r in range(3)}
    fact = fact_of({**ranks, 3: rank(3, history=went, blocked=4)})
    assert fact is not None and "barrier" in fact
    # the same call made and gone past: the waiting ranks' call completes any moment
    same = {1: AR, 2: AR, 3: AR, 4: AR}
    assert fact_of({**ranks, 3: rank(3, history=same, blocked=4)}) is None


def test_async_calls_in_flight_are_judged_like_blocking_ones():
    odd = {1: AR, 2: AR, 3: ("all_reduce", [[4]], ["float16"], None)}
    ranks = {r: rank(r, pending=[3]) for r in range(3)}  # async, Work not completed
    assert "dtypes ['float16']" in fact_of({**ranks, 3: rank(3, history=odd, pending=[3])})
    # an async call completed by the backend is no longer pending: nothing waits
    ranks = {r: rank(r) for r in range(3)}
    assert fact_of({**ranks, 3: rank(3, history=odd)}) is None


def test_a_peer_that_ended_cleanly_before_the_call_proves_a_hang():
    ranks = {r: rank(r, blocked=3) for r in range(3)}
    gone = rank(3, history={1: AR, 2: AR}, exited=0)
    fact = fact_of({**ranks, 3: gone})
    assert fact is not None and "rank 3 ended (exit code 0) after 2 call(s) on group 0" in fact
    # it made the call before it ended: the others' call can complete
    assert fact_of({**ranks, 3: rank(3, exited=0)}) is None
    # a rank that failed is not a hang: torchrun ends the job (exited None)
    assert fact_of({**ranks, 3: rank(3, history={1: AR, 2: AR})}) is None


def test_a_receive_from_a_peer_that_ended_without_sending_proves_a_hang():
    two = {"0": [0, 1]}
    ranks = {
        0: rank(0, members=two, receiving=(1, 2), sent={}),
        1: rank(1, members=two, sent={0: 1}, exited=0),
    }
    assert "receive number 2" in fact_of(ranks)
    ranks[1] = rank(1, members=two, sent={0: 2}, exited=0)  # the message is on its way
    assert fact_of(ranks) is None
    ranks[1] = rank(1, members=two, sent=None, exited=0)  # batched sends: not counted
    assert fact_of(ranks) is None


def test_a_point_to_point_cycle_proves_a_hang():
    two = {"0": [0, 1]}
    ranks = {r: rank(r, members=two, receiving=(1 - r, 1), sent={}) for r in (0, 1)}
    fact = fact_of(ranks)
    assert fact is not None and fact.startswith("ranks 0, 1 each wait")
    # rank 1 sent before it began to receive: rank 0's receive completes, then it sends
    ranks[1] = rank(1, members=two, receiving=(0, 1), sent={0: 1})
    assert fact_of(ranks) is None


def test_uneven_but_legal_point_to_point_proves_nothing():
    # rank 0 receives 3 messages while rank 1 computes between its sends
    two = {"0": [0, 1]}
    ranks = {0: rank(0, members=two, receiving=(1, 3), sent={}), 1: rank(1, sent={0: 2})}
    assert fact_of(ranks) is None


def test_a_cross_group_cycle_proves_a_hang():
    # rank 0 skipped an all_reduce on group 1 ({0, 1}) and waits on the world group; rank 1
    # waits in that group-1 call
    members = {"0": [0, 1], "1": [0, 1]}
    r0 = waiting_in(0, ("0", 4), members=members, called={"0": 4, "1": 2})
    r1 = waiting_in(1, ("1", 3), members=members, called={"0": 3, "1": 3})
    fact = fact_of({0: r0, 1: r1})
    assert fact is not None and "not called by rank 1" in fact and "(group 1 #3)" in fact
    # rank 1 may make further calls (a second thread makes them): no proof
    r1_free = RankState(
        rank=1, members=members, called=r1.called, calls=r1.calls, pending=r1.pending
    )
    assert fact_of({0: r0, 1: r1_free}) is None


def test_a_rank_outside_the_collectives_proves_nothing():
    # slow, sleeping, compiling or blocked on a lock: it may still come
    ranks = {r: rank(r, blocked=4, history={**{s: AR for s in range(1, 5)}}) for r in range(3)}
    assert fact_of({**ranks, 3: rank(3)}) is None


def test_collectives_on_a_side_group_the_others_are_not_in_prove_nothing():
    side = {"0": [0, 1, 2, 3], "5": [0, 1]}
    r0 = waiting_in(0, ("5", 9), members=side, called={"0": 3, "5": 9})
    r1 = RankState(rank=1, members=side, called={"0": 3, "5": 8}, calls={})
    others = {r: rank(r, members=side) for r in (2, 3)}
    assert fact_of({0: r0, 1: r1, **others}) is None


def events(*evs: dict) -> RankRecord:
    record = RankRecord(rank=0)
    for t, ev in enumerate(evs):
        record.apply({"t": float(t), **ev})
    return record


def enter(cid: int, op: str, seq: int, **kw) -> dict:
    return {"ev": "enter", "id": cid, "op": op, "pg": "0", "seq": seq, "tid": 7, **kw}


def test_the_tracker_reads_calls_in_flight_from_the_events():
    record = events(
        enter(1, "all_reduce", 1, shapes=[[4]], dtypes=["float32"], pg_ranks=[0, 1]),
        {"ev": "exit", "id": 1},
        enter(2, "all_reduce", 2, shapes=[[8]], dtypes=["float32"], async_op=True),
        {"ev": "exit", "id": 2},  # returned its Work, not completed
        enter(3, "broadcast", 3, shapes=[[4]], dtypes=["float32"], peer=1),
    )
    st = _state(record)
    assert st.pending == (("0", 2), ("0", 3)) and st.blocked == ("0", 3)
    assert st.calls[("0", 3)] == ("broadcast", [[4]], ["float32"], 1)
    assert st.called == {"0": 3} and st.members == {"0": [0, 1]}
    assert st.exited is None


def test_the_tracker_counts_point_to_point_calls_per_peer():
    record = events(
        enter(1, "send", 1, peer=1),
        {"ev": "exit", "id": 1},
        enter(2, "recv", 2, peer=1),
    )
    st = _state(record)
    assert st.sent == {1: 1} and st.receiving == (1, 1) and st.blocked is None
    record.apply(enter(3, "batch_isend_irecv", 3, peer="isend:1,irecv:1"))
    assert _state(record).sent is None


def test_a_receive_behind_an_irecv_in_flight_waits_for_no_one_known():
    # with tags, the message there is may be for the blocking receive, not the irecv
    record = events(
        enter(1, "irecv", 1, peer=1, async_op=True),
        {"ev": "exit", "id": 1},  # its Work not completed
        enter(2, "recv", 2, peer=1),
    )
    assert _state(record).receiving is None


def test_a_second_calling_thread_makes_a_blocked_rank_free():
    record = events(enter(1, "all_reduce", 1), {"ev": "exit", "id": 1})
    record.apply({**enter(2, "all_reduce", 2), "tid": 8, "t": 2.0})
    assert _state(record).blocked is None and _state(record).pending == (("0", 2),)


def test_only_a_clean_exit_is_an_end_the_prover_counts():
    assert _state(events({"ev": "end", "code": 0})).exited == 0
    assert _state(events({"ev": "end", "code": 1})).exited is None


def test_collectives_are_numbered_without_the_group_management_calls():
    # a group made with use_local_synchronization: only its members call new_group, which
    # takes a number in the probe's sequence of the world group on them alone
    member = events(
        enter(1, "all_reduce", 1),
        {"ev": "exit", "id": 1},
        enter(2, "new_group", 2),
        {"ev": "exit", "id": 2},
        enter(3, "all_reduce", 3, shapes=[[4]]),
    )
    other = events(enter(1, "all_reduce", 1), {"ev": "exit", "id": 1})
    other.apply({**enter(2, "all_reduce", 2, shapes=[[4]]), "t": 9.0})
    st = _state(member)
    assert st.blocked == ("0", 2) and st.called == {"0": 2}
    assert st.calls[("0", 2)] == ("all_reduce", [[4]], None, None)
    assert _state(other).blocked == ("0", 2)
    # both wait in the same call: nothing proven
    assert fact_of({0: st, 1: _state(other)}) is None
    # a rank in destroy_process_group waits for no one
    member.apply({"ev": "exit", "id": 3, "t": 10.0})
    member.apply({**enter(4, "destroy_process_group", 4), "t": 11.0})
    assert _state(member).blocked is None and _state(member).pending == ()


def beat(active: list, fr: dict | None = None) -> dict:
    """A heartbeat whose recorder read found ``active`` entries ``[group, seq, op]``."""
    return {"ev": "heartbeat", "fr": fr or {"0": [12, 11]}, "fr_active": active}


def test_the_recorder_numbers_what_torch_issues_from_cpp():
    # DDP with uneven data (D9): ranks 0 and 1 wait in DDP's gradient all_reduce, issued from
    # C++ (no enter event), while rank 2, out of data, waits in the barrier after the loop.
    # The probe's numbering has nothing to compare; the recorder's numbers both #12.
    ddp = [events(beat([["0", 12, "all_reduce", None, 1.0, None]])) for _ in range(2)]
    out = events(enter(1, "barrier", 1, pg_ranks=[0, 1, 2]))
    out.apply(beat([["0", 12, "barrier", None, 1.0, None]]))
    states = {0: _state(ddp[0]), 1: _state(ddp[1]), 2: _state(out)}
    assert fact_of(states) is None
    backend = {r: _backend_state(rec) for r, rec in enumerate([*ddp, out])}
    assert backend[2].pending == (("0", 12),) and backend[2].members == {"0": [0, 1, 2]}
    assert fact_of(backend) == (
        "rank 0 waits in all_reduce and rank 2 called barrier as collective #12 of group 0: "
        "not the same call"
    )


def test_by_the_recorder_a_slow_step_proves_nothing():
    # the same, but rank 2 is slow in its step: not yet at #12, nothing in flight
    ddp = [events(beat([["0", 12, "all_reduce", None, 1.0, None]])) for _ in range(2)]
    slow = events(enter(1, "all_reduce", 1, pg_ranks=[0, 1, 2]), {"ev": "exit", "id": 1})
    slow.apply(beat([], fr={"0": [11, 11]}))
    backend = {r: _backend_state(rec) for r, rec in enumerate([*ddp, slow])}
    assert fact_of(backend) is None


def test_by_the_recorder_only_an_end_that_says_its_count_is_an_end():
    # the DDP ranks made a call of their own on the group: they know its members
    ddp = [
        events(
            enter(1, "all_reduce", 1, pg_ranks=[0, 1, 2]),
            {"ev": "exit", "id": 1},
            beat([["0", 12, "all_reduce", None, 1.0, None]]),
        )
        for _ in range(2)
    ]
    gone = events(enter(1, "all_reduce", 1, pg_ranks=[0, 1, 2]), {"ev": "exit", "id": 1})
    gone.apply(beat([], fr={"0": [11, 11]}))
    gone.apply({"ev": "end", "code": 0})  # its last heartbeat's count may be stale: no proof
    backend = {r: _backend_state(rec) for r, rec in enumerate([*ddp, gone])}
    assert backend[2].exited is None and fact_of(backend) is None
    gone.fr_final = False
    gone.apply({"ev": "end", "code": 0, "fr": {"0": [11, 11]}})
    backend[2] = _backend_state(gone)
    assert fact_of(backend) == (
        "rank 2 ended (exit code 0) after 11 call(s) on group 0; rank 0 waits in all_reduce, "
        "call #12 of group 0"
    )


def _cell_rank(r: int, *evs: dict) -> RankState:
    """A rank of a cell session (``cell`` events: cell 7, run 3) over a 3-rank group."""
    return _state(events({"ev": "cell", "cell": 7, "run": 3, "phase": "start"}, *evs))


def test_a_rank_that_finished_the_cell_without_the_call_proves_a_hang():
    waits = [_cell_rank(r, enter(1, "all_reduce", 1, pg_ranks=[0, 1, 2])) for r in (0, 1)]
    end = {"ev": "cell", "cell": 7, "run": 3, "phase": "end", "threads": 0}
    ranks = {0: waits[0], 1: waits[1], 2: _cell_rank(2, end)}
    assert ranks[2].cell == (7, 3) and ranks[2].cell_finished
    assert fact_of(ranks) == (
        "rank 2 finished cell [7] without calling all_reduce #1 of group 0 that ranks 0, 1 wait in"
    )
    # Per cell, soundly: a rank still in the cell, in a later cell (whose calls could still
    # match), one whose cell left a thread running, or an end that did not say: no proof.
    still = _cell_rank(2)
    later = _state(events(end, {"ev": "cell", "cell": 8, "run": 4, "phase": "start"}))
    threads = _cell_rank(2, {**end, "threads": 1})
    unsaid = _cell_rank(2, {k: v for k, v in end.items() if k != "threads"})
    for other in (still, later, threads, unsaid):
        assert fact_of({**ranks, 2: other}) is None, other
    # Another run of cell 7 (a replay's number, a later run) is not the run the others wait in.
    again = _state(events({**end, "run": 9}))
    assert fact_of({**ranks, 2: again}) is None
    # A rank that made the call in the cell and finished it proves nothing.
    made = _cell_rank(
        2, enter(1, "all_reduce", 1, pg_ranks=[0, 1, 2]), {"ev": "exit", "id": 1}, end
    )
    assert fact_of({**ranks, 2: made}) is None
    # Hostile values in the event are read as unknown, not trusted.
    bad = _state(events({"ev": "cell", "cell": "x", "run": [1], "phase": "end", "threads": 0}))
    assert fact_of({**ranks, 2: bad}) is None
