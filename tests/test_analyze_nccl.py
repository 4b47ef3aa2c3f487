"""The flight-recorder path: NCCL-layout dumps (``tests/data/nccl_fr/``) loaded as a folder of
foreign artifacts, diagnosed without probe events; checked against torch's own analyzer."""

from __future__ import annotations

import importlib.util
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.analyze import diagnose
from rankscope.collect import load_run

DATA = Path(__file__).parent / "data" / "nccl_fr"


def _make_dumps():
    spec = importlib.util.spec_from_file_location("make_dumps", DATA / "make_dumps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_dumps = _make_dumps()

#: fixture -> (verdict, cause, recipe, culprits, waiting, pg, seq, {rank: site})
EXPECTED = {
    "missing": ("hang", "lagging_rank", "D19", [2], [0, 1, 3], "0", 7, {0: "train.py:41", 2: None}),
    "op": (
        "hang",
        "op_mismatch",
        "D19",
        [3],
        [0, 1, 2],
        "0",
        7,
        {3: "train.py:70", 0: "train.py:41"},
    ),
    "shape": ("hang", "shape_mismatch", "D19", [1], [0, 2, 3], "0", 7, {1: "train.py:41"}),
    "dtype": ("hang", "dtype_mismatch", "D19", [0], [1, 2, 3], "0", 7, {0: "train.py:41"}),
    "p2p_cycle": (
        "hang",
        "p2p_cycle",
        "D19",
        [0, 1],
        [2, 3],
        "0",
        1,
        {0: "train.py:60", 1: "train.py:60"},
    ),
    # The shape mismatch is in rank 6's half (group 2); ranks 0-3 wait for that half in the world
    # group, so they are left waiting too.
    "subgroups": (
        "hang",
        "shape_mismatch",
        "D19",
        [6],
        [0, 1, 2, 3, 4, 5, 7],
        "2",
        3,
        {6: "train.py:52"},
    ),
    "partial": ("hang", "lagging_rank", "D19", [2], [0, 1], "0", 7, {1: "train.py:41"}),
    # Across groups: rank 3 waits in tp1 for rank 2, which skipped that call and waits in the
    # world group, where ranks 0 and 1 wait for rank 3. The culprit is rank 2, not rank 3.
    "tp_skip": (
        "hang",
        "rank_conditional_collective",
        "D21",
        [2],
        [0, 1, 3],
        "2",
        5,
        {3: "train.py:30", 2: "train.py:32"},
    ),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_nccl_dumps_are_diagnosed(name):
    verdict, cause, recipe, culprits, waiting, pg, seq, sites = EXPECTED[name]
    d = diagnose(load_run(DATA / name))
    assert (d.verdict, d.cause, d.recipe) == (verdict, cause, recipe), d.render()
    assert (d.culprit_ranks, d.waiting_ranks) == (culprits, waiting), d.render()
    c = d.collective
    assert (c.pg, c.seq, c.source) == (pg, seq, "flight_recorder"), d.render()
    for rank, where in sites.items():
        assert c.site_by_rank[rank] == where, d.render()
    assert all(ref.table == "flight_recorder" for ref in d.evidence if ref.rank in culprits)


def test_partial_evidence_says_what_is_missing():
    d = diagnose(load_run(DATA / "partial"))
    assert any("rank 3" in note for note in d.missing), d.missing
    assert d.collective.state_by_rank[3] == "no record of this rank's calls"


def test_clean_dumps_are_ok():
    d = diagnose(load_run(DATA / "clean"))
    assert (d.verdict, d.cause, d.culprit_ranks, d.collective) == ("ok", None, [], None)


def torch_analyzer(name: str, *flags: str) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(DATA / name)]
    out = subprocess.run(
        [*cmd, "--prefix", make_dumps.PREFIX, *flags], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stderr + out.stdout


@pytest.mark.slow
def test_same_culprit_as_torch_s_analyzer():
    # For a rank that never joined, torch's answer does not depend on which dump it reads first
    # (for a mismatch it blames every other rank when the odd rank's file comes first).
    assert make_dumps.torch_culprits(torch_analyzer("missing")) == EXPECTED["missing"][3] == [2]


@pytest.mark.slow
def test_a_culprit_where_torch_s_analyzer_cannot_decide():
    text = torch_analyzer("partial", "--allow-incomplete-ranks")
    assert "cannot decide" in text and make_dumps.torch_culprits(text) == []
    assert diagnose(load_run(DATA / "partial")).culprit_ranks == [2]


def test_fixtures_match_their_generator(tmp_path):
    for name, spec in make_dumps.FIXTURES.items():
        written = make_dumps.write_dumps(tmp_path / name, **spec)
        for path in written:
            assert path.read_bytes() == (DATA / name / path.name).read_bytes(), (
                f"{name}/{path.name}"
            )
        assert sorted(p.name for p in (DATA / name).iterdir()) == sorted(p.name for p in written)


def test_the_chain_across_groups_from_dumps_alone():
    """The wait-for graph crosses groups: the chain goes from the culprit's tp partner to the
    culprit, whose own wait is in the world group, and on to the ranks waiting there."""
    d = diagnose(load_run(DATA / "tp_skip"))
    chain = [
        (link["ranks"], link["waits_in"]["pg"], link["waits_in"]["seq"], link["waits_for"])
        for link in d.chain
    ]
    assert chain == [([3], "2", 5, [2]), ([2], "0", 5, [3]), ([0, 1], "0", 5, [3])]
    assert d.chain[0]["waits_in"]["site"] == "train.py:30"
    assert d.to_dict()["chain"][1]["text"].startswith("rank 2 waits in all_reduce on group 0")
    assert "chain: rank 3 waits in all_reduce on group 2 (tp1) #5" in d.render()


def _timed_dumps(folder: Path, *, scheduled: int | None, world: int = 4) -> Path:
    """NCCL dumps with timing on (entries carry their start times): every rank completed 11
    collectives and started the 12th, except ``scheduled``, whose stream never started it."""
    folder.mkdir()
    for rank in range(world):
        dump = make_dumps.build_dump(rank, world=world, entries=12, divergence="none")
        last = dump["entries"][-1]
        last.update(retired=False, duration_ms=None, time_discovered_completed_ns=None)
        last["state"] = "started"
        if rank == scheduled:
            last.update(state="scheduled", time_discovered_started_ns=None)
        for st in dump["pg_status"].values():
            st["last_completed_collective"] = 11
        (folder / f"{make_dumps.PREFIX}{rank}").write_bytes(pickle.dumps(dump))
    return folder


def test_a_collective_its_stream_never_started_points_at_that_rank_s_stream(tmp_path):
    """Ranks 0, 2, 3 started all_reduce #12 on their devices; rank 1 enqueued it and its stream
    never reached it (a kernel before it that never ends)."""
    d = diagnose(load_run(_timed_dumps(tmp_path / "dumps", scheduled=1)))
    assert (d.verdict, d.cause, d.culprit_ranks, d.waiting_ranks) == (
        "hang",
        "stream_stuck",
        [1],
        [0, 2, 3],
    ), d.render()
    # what the stream ran last, from the recorder
    assert "its last completed collective: all_reduce #11 on group 0" in d.reason, d.reason
    assert "never started" in d.reason and "CUDA_LAUNCH_BLOCKING" in d.fix


def test_started_everywhere_completed_nowhere_is_not_a_stream(tmp_path):
    d = diagnose(load_run(_timed_dumps(tmp_path / "dumps", scheduled=None)))
    assert d.verdict == "hang" and d.cause != "stream_stuck", d.render()


def test_the_entries_are_the_truth_where_the_counters_lag(tmp_path):
    """Seen on an H100 (torch 2.11, NCCL 2.28.9): a dump right after a healthy job's last
    collective had every entry completed while pg_status said last completed 4."""
    folder = tmp_path / "dumps"
    folder.mkdir()
    for rank in range(2):
        dump = make_dumps.build_dump(rank, world=2, entries=50, divergence="none")
        for st in dump["pg_status"].values():
            st["last_completed_collective"] = 4
        (folder / f"{make_dumps.PREFIX}{rank}").write_bytes(pickle.dumps(dump))
    d = diagnose(load_run(folder))
    assert d.verdict == "ok", d.render()


def test_one_rank_whose_stream_never_started_its_collective(tmp_path):
    """One rank on nccl, a kernel spinning in front of its all_reduce: issued, never started."""
    d = diagnose(load_run(_timed_dumps(tmp_path / "dumps", scheduled=0, world=1)))
    assert (d.verdict, d.cause, d.culprit_ranks) == ("hang", "stream_stuck", [0]), d.render()
