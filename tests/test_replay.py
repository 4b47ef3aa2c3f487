"""``rankscope.replay``: a frozen job's evidence becomes a plain torch script that, run on CPU with
gloo, freezes the same way and is diagnosed the same way.

The hang scenarios of the catalogue are replayed from their own broken runs in
``tests/test_scenarios.py`` (through :func:`assert_replay_reproduces`), so that no scenario runs
twice; here: the 64-rank NCCL dumps of ``tests/data/nccl_fr64/`` shrunk to 8 CPU ranks, the script
text, shrinking, scaling, and the errors.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import re
import shutil
from pathlib import Path

import pytest

from rankscope.analyze import Diagnosis, diagnose
from rankscope.launch import JobSpec
from rankscope.replay import REPRO_NAME, Replay, build

DATA = Path(__file__).parent / "data"
FR64 = DATA / "nccl_fr64"
NCCL = DATA / "nccl_fr"


def _generator():
    spec = importlib.util.spec_from_file_location("make_fr64", FR64 / "make_dumps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: What a replay's diagnosis may call the original's cause.
SAME_HANG = {"uneven_inputs": {"uneven_inputs", "rank_conditional_collective"}}


def assert_replay_reproduces(
    run_path: Path,
    original: Diagnosis,
    start_job,
    *,
    folder: Path | None = None,
    ranks: int | None = None,
    scale_down: int | None = None,
) -> tuple[Replay, Diagnosis | None]:
    """Replay a diagnosed run, run the replay under rankscope (gloo, CPU) and check that it is
    diagnosed with the same cause, the same culprits (remapped) and the same divergent ops.

    A hang with no collective where the ranks part has nothing to replay: ``build`` must say so.
    """
    if original.collective is None:
        with pytest.raises(ValueError, match=r"nothing to replay|no divergence"):
            build(run_path, diagnosis=original)
        return None, None  # type: ignore[return-value]
    replay = build(run_path, diagnosis=original, ranks=ranks, scale_down=scale_down)
    folder = folder or Path(start_job.root).parent
    script = replay.write(folder / f"repro-{Path(run_path).name}.py")
    assert "import rankscope" not in script.read_text()
    job = start_job.spec(
        JobSpec(
            script=str(script),
            nproc_per_node=replay.world_size,
            on_stall="stop",
            stall_timeout_s=3.0,
            timeout_s=120,
            name="replay",
        )
    )
    job.wait(timeout=150)
    got = diagnose(job.run.path)
    said = f"original: {original.render()}\n\nreplay: {got.render()}\n\n{replay.header}"
    # A cause that rests on the original's loops (a rank out of iterations) is a rank-conditional
    # collective in the replay, which writes each call out: the same hang, told less.
    assert got.cause in SAME_HANG.get(original.cause, {original.cause}), said
    assert got.culprit_ranks == replay.remap(original.culprit_ranks), said
    want_ops = {
        replay.rank_map[r]: op
        for r, op in original.collective.op_by_rank.items()
        if r in replay.rank_map
    }
    assert got.collective is not None, said
    assert {r: got.collective.op_by_rank.get(r) for r in want_ops} == want_ops, said
    return replay, got


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_64_rank_nccl_dumps_replay_on_8_cpu_ranks(start_job, tmp_path):
    original = diagnose(FR64 / "dumps")
    assert (original.cause, original.culprit_ranks) == ("op_mismatch", [37]), original.render()
    replay, got = assert_replay_reproduces(
        FR64 / "dumps", original, start_job, folder=tmp_path, ranks=8, scale_down=1024
    )
    assert replay.world_size <= 8 and replay.culprit_ranks == [replay.rank_map[37]]
    # The same collective: the culprit's data-parallel group (renamed in the replay), same number.
    assert got.collective.pg == replay.group_map[original.collective.pg]
    assert got.collective.seq == original.collective.seq
    assert replay.source == "flight_recorder"


def test_the_script_is_readable():
    replay = build(FR64 / "dumps", ranks=8)
    text = replay.script
    compile(text, REPRO_NAME, "exec")
    assert "import rankscope" not in text and "from rankscope" not in text
    # One function per role: the culprit, and the seven ranks it left waiting, which share one
    # function with their own tensor-parallel group as a parameter.
    assert replay.roles == {"role_1": [0, 1, 2, 3, 5, 6, 7], "role_2": [4]}
    assert len(re.findall(r"^def role_\d+\(", text, re.M)) == 2
    assert "def role_1(tp_group: str) -> None:" in text
    assert "1: partial(role_1, tp_group='2'),  # original rank 13 (tp1)" in text
    assert "4: role_2,  # original rank 37" in text
    assert '"""Original rank 37 (replay rank 4), the culprit: 7 calls;' in text
    # Comments name the original groups, sequence numbers and call sites.
    assert "group 14 #2, train.py:70: it never returned in the original" in text
    assert ">>> where the ranks part, group 14 #2:" in text
    assert "dist.all_gather(ts(8, 2048), t(2048), group=G['14'])" in text
    assert "group=G[tp_group])  # tp_group #1, train.py:30" in text
    # Groups are created by every rank, in the original order, with their kept members.
    assert "G['14'] = dist.new_group([0, 1, 2, 3, 4, 5, 6, 7], group_desc='dp5')" in text
    assert text.index("G['1'] = dist.new_group([0]") < text.index("G['14'] = dist.new_group(")
    # The entry point, with a collective timeout for runs under bare torchrun.
    assert 'if __name__ == "__main__":' in text
    assert 'dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S))' in text
    assert "ROLES[RANK]()" in text
    # No path of the machine that wrote it, nor of the one that recorded the dumps.
    for path in (str(Path.cwd()), str(FR64.resolve()), "/srv/job", "/usr/local/lib"):
        assert path not in text


def test_the_header_says_what_was_kept_dropped_and_remapped():
    replay = build(FR64 / "dumps", ranks=8, scale_down=256)
    header = replay.header
    assert replay.script.startswith(f'"""{header}"""')
    assert "64 ranks -> 8 ranks on CPU (gloo)" in header
    assert "HANG: collective op mismatch (recipe D19)" in header
    assert "Culprit: original rank 37 = replay rank 4." in header
    assert "Ranks (original -> replay): 5 -> 0, 13 -> 1, 21 -> 2" in header
    assert "37 -> 4" in header and "Dropped: ranks 0-4, 6-12" in header and "(56 of 64)" in header
    assert "14 (dp5): ranks 5, 13, 21, 29, 37, 45, 53, 61 -> group 9, ranks 0-7" in header
    assert "0 (default_pg): ranks 0-63 -> the world group, ranks 0-7" in header
    assert "(7 more groups with no kept rank: not created)" in header
    assert "rank 4 (original 37): 7 calls, in role_2(); never returned from all_gather" in header
    assert "torchrun --nproc-per-node 8 repro.py" in header
    assert "capped at 256 elements" in header and "[4096]->[256]" in header
    assert "reduce_scatter: gloo runs reduce_scatter as an all_reduce" in header
    assert replay.rank_map[37] == 4 and replay.group_map["14"] == "9"
    assert replay.group_map["9"] is None  # dp0: no rank kept
    assert replay.calls_kept == dict.fromkeys(range(8), 7)
    assert len(replay.dropped_ranks) == 56


def test_without_ranks_every_rank_is_replayed_in_three_roles():
    replay = build(FR64 / "dumps")
    assert replay.world_size == 64 and replay.rank_map == {r: r for r in range(64)}
    # Waiting in the world all_reduce; waiting in dp5's reduce_scatter; the culprit.
    assert sorted(len(r) for r in replay.roles.values()) == [1, 7, 56]
    assert "def role_1(tp_group: str, dp_group: str) -> None:" in replay.script


def test_scale_down_keeps_a_shape_mismatch(tmp_path):
    replay = build(NCCL / "shape", scale_down=64)
    sizes = {int(n) for n in re.findall(r"\bt\((\d+)\)", replay.script)}
    assert sizes and max(sizes) <= 64
    # rank 1 passed 1025 elements where the others passed 1024: still different after scaling.
    culprit = replay.script[replay.script.index("the culprit") :]
    others = replay.script[: replay.script.index("the culprit")]
    odd = re.search(r"dist\.all_gather\(ts\(4, (\d+)\), t\(\d+\)\)  # group 0 #7", culprit)
    usual = re.search(r"dist\.all_gather\(ts\(4, (\d+)\), t\(\d+\)\)  # group 0 #7", others)
    assert odd and usual and odd.group(1) != usual.group(1)
    assert "[1025]->[" in replay.header and "[1024]->[" in replay.header


def test_shrinking_keeps_what_the_divergence_needs():
    # A point-to-point cycle: both ranks of the cycle, nothing else needed.
    cycle = build(NCCL / "p2p_cycle", ranks=2)
    assert cycle.rank_map == {0: 0, 1: 1}
    assert "dist.recv(t(256), src=1)" in cycle.script
    # Subgroups: the culprit's half, renumbered; its group keeps its description.
    half = build(NCCL / "subgroups", ranks=4)
    assert half.rank_map == {4: 0, 5: 1, 6: 2, 7: 3} and half.culprit_ranks == [2]
    assert half.group_map == {"0": "0", "1": None, "2": "1"}
    assert "G['2'] = dist.new_group([0, 1, 2, 3], group_desc='dp_hi')" in half.script
    # A mismatch needs the culprit and more ranks of the usual call than culprits.
    with pytest.raises(ValueError, match=r"--ranks 1 is too few.*at least 3 ranks"):
        build(NCCL / "op", ranks=1)
    assert build(NCCL / "op", ranks=3).world_size == 3


def test_ranks_end_as_they_did_in_the_original():
    raises = build(DATA / "gloo_rank_raises" / "run").script
    assert "raise RuntimeError('replayed failure: ValueError: corrupt shard on rank 1')" in raises
    assert "# in original rank 0 the call above raised (a symptom" in raises
    early = build(DATA / "gloo_exit_race" / "run").script
    assert "# original rank 1 exited 0 here, leaving the others waiting" in early
    # A rank whose dump ends with a completed call and nothing says it exited stays alive.
    missing = build(NCCL / "missing").script
    assert "stay('made no further call (its last recorded call had completed)')" in missing
    # A rank with no dump at all is not replayed (what it did is unknown).
    partial = build(NCCL / "partial")
    assert partial.world_size == 3 and "Not replayed: rank 3: no flight-recorder dump" in (
        partial.header
    )


def test_write_names_the_file_it_writes(tmp_path):
    replay = build(NCCL / "op")
    path = replay.write(tmp_path / "hang_repro.py")
    text = path.read_text()
    assert "torchrun --nproc-per-node 4 hang_repro.py" in text
    assert replay.write(tmp_path) == tmp_path / REPRO_NAME
    assert replay.command(path) == "torchrun --nproc-per-node 4 hang_repro.py"


def test_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="no divergence found in clean"):
        build(NCCL / "clean")
    with pytest.raises(ValueError, match=r"no divergence found.*did not part in any collective"):
        build(DATA / "ddp_unused" / "run")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"nothing to replay in empty.*flight-recorder dump"):
        build(empty)
    # Hostile pickles are refused by the collectors; the replay says which file and why.
    hostile = tmp_path / "hostile"
    hostile.mkdir()

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo replay-was-fooled",))

    (hostile / "nccl_trace_rank_0").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(ValueError, match=r"nothing to replay.*could not read: nccl_trace_rank_0"):
        build(hostile)
    with pytest.raises(ValueError, match="does not exist"):
        build(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="ranks must be at least 1"):
        build(NCCL / "op", ranks=0)
    with pytest.raises(ValueError, match="scale_down must be at least 1"):
        build(NCCL / "op", scale_down=0)


def test_fixture_matches_its_generator(tmp_path):
    written = _generator().write_dumps(tmp_path / "dumps")
    assert len(written) == 64
    for path in written:
        assert path.read_bytes() == (FR64 / "dumps" / path.name).read_bytes(), path.name
    assert sorted(p.name for p in (FR64 / "dumps").iterdir()) == sorted(p.name for p in written)
    # small enough to keep in the repository, though every entry keeps its stack as torch's do
    assert sum(p.stat().st_size for p in written) < 500_000


def test_a_copy_of_the_dumps_elsewhere_replays_the_same(tmp_path):
    # The run directory is the contract: a copied folder gives the same script (its name aside).
    copy = tmp_path / "dumps"
    shutil.copytree(FR64 / "dumps", copy)
    assert build(copy, ranks=8).script == build(FR64 / "dumps", ranks=8).script


def test_ring_buffers_that_wrapped_at_different_calls(tmp_path):
    # Rank 0's buffer lost its first two records and rank 1's its first three (a ring buffer
    # keeps the last N): every rank replays each group from the latest first call.
    spec = importlib.util.spec_from_file_location("make_dumps", NCCL / "make_dumps.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    for rank in range(4):
        dump = make.build_dump(rank, world=4, entries=7, culprit=3, divergence="op")
        dump["entries"] = dump["entries"][{0: 2, 1: 3}.get(rank, 0) :]
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump))
    replay = build(tmp_path)
    assert replay.culprit_ranks == [3] and replay.calls_kept == dict.fromkeys(range(4), 4)
    assert "group 0: some rank's dump starts at #4, so every rank replays it from #4" in (
        replay.header
    )
    assert "calls left out per replay rank" in replay.header and "2: 3, 3: 3" in replay.header
    assert "# group 0 #4, train.py:41" in replay.script
    assert "# group 0 #3," not in replay.script
