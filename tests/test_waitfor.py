"""The wait-for core on plain data: the same-call rule, facing point-to-point calls, roots and
cycles."""

from __future__ import annotations

import json

from rankscope.waitfor import Call, CallNumber, Proof, RankState, differs, paired, prove, walk


def test_differs_names_the_first_fact_that_differs():
    a = Call(op="all_reduce", shapes=[[4]], dtypes=["float32"])
    assert differs(a, Call(op="all_reduce", shapes=[[4]], dtypes=["float32"])) is None
    assert differs(a, Call(op="broadcast", shapes=[[4]], dtypes=["float32"])) == "op"
    assert differs(a, Call(op="all_reduce", shapes=[[8]], dtypes=["float32"])) == "shapes"
    assert differs(a, Call(op="all_reduce", shapes=[[4]], dtypes=["float64"])) == "dtypes"
    b = Call(op="broadcast", shapes=[[4]], dtypes=["float32"], root=0)
    assert differs(b, Call(op="broadcast", shapes=[[4]], dtypes=["float32"], root=1)) == "root"
    # a root not recorded on one side is not a difference
    assert differs(b, Call(op="broadcast", shapes=[[4]], dtypes=["float32"])) is None


def test_uneven_ops_take_different_tensors_by_design():
    a = Call(op="all_to_all_single", shapes=[[4]], dtypes=["float32"])
    assert differs(a, Call(op="all_to_all_single", shapes=[[6]], dtypes=["float32"])) is None
    g = Call(op="gather", shapes=[[4]], root=0)
    assert differs(g, Call(op="gather", shapes=[[4], [4]], root=0)) is None
    assert differs(g, Call(op="gather", shapes=[[4]], root=1)) == "root"


def test_paired_point_to_point_calls_would_complete():
    assert paired({0: ("send", 1), 1: ("recv", 0)}) == {0, 1}
    assert paired({0: ("isend", 1), 1: ("irecv", 0)}) == {0, 1}
    assert paired({0: ("recv", 1), 1: ("recv", 0)}) == set()  # both receive: a cycle
    assert paired({0: ("send", 1), 1: ("recv", 2), 2: ("send", 1)}) == {1, 2}


def test_walk_finds_roots_and_cycles():
    gone = frozenset({3})
    roots, cycles = walk({0: gone, 1: gone, 2: frozenset({0})})
    assert roots == (3,) and cycles == ()
    roots, cycles = walk({0: frozenset({1}), 1: frozenset({0})})
    assert roots == () and cycles == ((0, 1),)
    # a cycle with a way out (rank 2 waits on one that runs) is no terminal cycle
    roots, cycles = walk({0: frozenset({1}), 1: frozenset({0, 2}), 2: frozenset({5})})
    assert roots == (5,) and cycles == ()
    assert walk({}) == ((), ())


def test_every_form_of_the_proof_carries_its_call_numbers():
    """The diagnosis restates the prover's sentence in its own numbering of each group's calls
    (the recorder's, with torch's own collectives): every call number in each form the prover
    writes is a part of its own, written again by the numbering given; a proof on the flight
    recorder's numbering keeps its numbers; a run.json keeps the parts, and a malformed one
    gives no proof rather than a wrong one."""
    call = ("all_reduce", "[[4]]", '["float32"]', None)
    pair = {"0": [0, 1], "1": [0, 1]}

    def blocked(rank: int, pg: str, seq: int, what: tuple = call) -> RankState:
        """A rank blocked in its call ``seq`` on group ``pg``."""
        return RankState(
            rank=rank,
            members=pair,
            called={pg: seq},
            calls={(pg, seq): what},
            pending=((pg, seq),),
            blocked=(pg, seq),
        )

    def later(c: CallNumber) -> int:
        return c.n + (100 if c.kind == "nth" else 1000)

    ended = prove(
        {
            0: blocked(0, "0", 3),
            1: RankState(rank=1, members=pair, called={"0": 2}, calls={}, exited=0),
        }
    )
    assert ended is not None
    assert ended.text() == (
        "rank 1 ended (exit code 0) after 2 call(s) on group 0; rank 0 waits in all_reduce, "
        "call #3 of group 0"
    )
    assert ended.text(later) == (
        "rank 1 ended (exit code 0) after 1002 call(s) on group 0; rank 0 waits in "
        "all_reduce, call #103 of group 0"
    )
    differ = prove({0: blocked(0, "0", 1), 1: blocked(1, "0", 1, ("barrier", "[]", "[]", None))})
    assert differ is not None and "as collective #101 of group 0:" in differ.text(later)
    cycle = prove({0: blocked(0, "0", 1), 1: blocked(1, "1", 1)})
    assert cycle is not None
    assert "(group 0 #101)" in cycle.text(later) and "(group 1 #101)" in cycle.text(later)
    assert str(cycle) == cycle.text() and "#1)" in str(cycle)

    recorded = cycle.by_recorder()
    assert recorded.text(later) == f"{cycle.text()} (by the flight recorder's numbering)"
    for proof in (ended, differ, cycle, recorded):
        again = Proof.from_json(json.loads(json.dumps(proof.to_json())))
        assert again == proof
    for bad in (
        None,
        "rank 1 ended",
        {"numbering": "probe"},
        {"numbering": "mine", "parts": ["x"]},
        {"numbering": "probe", "parts": [["1", "0", 2, "nth"]]},
        {"numbering": "probe", "parts": [[1, "0", 2, "all"]]},
        {"numbering": "probe", "parts": [[1, "0", True, "nth"]]},
        {"numbering": "probe", "parts": [{"rank": 1}]},
    ):
        assert Proof.from_json(bad) is None, bad
