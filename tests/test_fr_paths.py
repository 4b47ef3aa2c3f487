"""Call paths from the flight recorder's own frames (issue 40): equal frames give equal paths on
every rank, the machinery is left out, a dump's paths part where one rank's do, and malformed or
missing frames cost the entry its path, never the analysis.

The dumps are written by ``tests/data/nccl_fr/make_dumps.py`` (frames as torch's recorder writes
them); ``nccl_fr/extra`` is its committed ``extra`` set: rank 1 makes one all_reduce more,
half-way, through a ``retry`` helper.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rankscope.analyze import diagnose
from rankscope.analyze.paths import CallPaths
from rankscope.collect import _fr_parse, load_run
from rankscope.collect.flight_recorder import load_flight_recorder
from rankscope.rundir import MACHINERY

DATA = Path(__file__).parent / "data" / "nccl_fr"
USER = "/srv/job/train.py"


def _make_dumps():
    spec = importlib.util.spec_from_file_location("make_dumps", DATA / "make_dumps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# One process, one rank: a real recorder's dump of calls from two lines, one through a helper.
REAL_DUMP = """
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
t = torch.ones(4)
def helper(i):
    dist.all_reduce(t) if i % 2 else dist.broadcast(t, 0)
for i in range(6):
    helper(i)
    dist.all_gather([torch.zeros(4)], t)
sys.stdout.buffer.write(torch._C._distributed_c10d._dump_fr_trace())
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_the_generator_writes_a_dump_as_torch_s_recorder_does(tmp_path: Path) -> None:
    """The bench's and the fixtures' dumps are laid out byte for byte as torch's own: the
    generator's pickler, given what a real dump holds, writes that dump's bytes again (frame
    dicts written once per dump and referred to by every entry, texts stored once, the rest
    anew). And the generator's entries share their frames as torch's do."""
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "100", "OMP_NUM_THREADS": "1"}
    real = subprocess.run(
        [sys.executable, "-c", REAL_DUMP], capture_output=True, env=env, timeout=120, check=True
    ).stdout
    dump = pickle.loads(real)
    entries = dump["entries"]
    assert len(entries) == 12 and all(e["frames"] for e in entries)
    assert entries[0]["frames"][-1] is entries[2]["frames"][-1]  # <module>'s frame, once
    assert _make_dumps().torch_pickle(dump) == real

    made = _make_dumps().build_dump(0, world=2, entries=9, divergence="none")["entries"]
    assert made[0]["frames"] is not made[6]["frames"]
    assert all(f is g for f, g in zip(made[0]["frames"], made[6]["frames"], strict=True))
    assert made[0]["input_sizes"] is not made[3]["input_sizes"]  # written anew, as torch does


def test_equal_frames_give_one_path_on_every_rank_outermost_first_without_machinery() -> None:
    fr = load_flight_recorder(sorted((DATA / "clean").iterdir())).entries
    assert fr["path"].notna().all()
    # the same record on every rank: one path
    assert (fr.groupby("record_id", observed=True)["path"].nunique() == 1).all()
    # the three calls of a step, two stacks each (an accumulation step has one frame more)
    assert fr["path"].nunique() == 6
    for text in fr["path"].cat.categories:
        frames = json.loads(text)
        assert not any(m in f[0] for f in frames for m in MACHINERY)
        assert frames[0] == [USER, "<module>", 120]  # outermost first
        assert frames[-1][0] != USER  # innermost: the library that issued the call
        assert any(f[:2] == [USER, "train_step"] for f in frames)


def test_paths_part_at_the_one_entry_where_one_rank_went_another_way() -> None:
    d = diagnose(load_run(DATA / "extra"))
    first = d.first_divergence
    assert first is not None and first["culprits"] == [1] and first["seq"] == 5
    culprit, others = first["classes"]
    assert culprit["culprit"] and culprit["ranks"] == [1] and others["ranks"] == [0, 2, 3]
    user = [tuple(f) for f in culprit["path"] if f[0] == USER]
    assert user == [
        (USER, "<module>", 120),
        (USER, "main", 90),
        (USER, "train_step", 70),
        (USER, "retry", 12),
    ]
    assert [tuple(f) for f in others["path"] if f[0] == USER][-1] == (USER, "train_step", 44)
    assert culprit["op"] == others["op"] == "all_reduce"


def test_a_dump_without_frames_is_analysed_by_call_keys(tmp_path: Path) -> None:
    for path in sorted((DATA / "op").iterdir()):
        if path.name.startswith("nccl_trace_rank_"):
            dump = pickle.loads(path.read_bytes())
            for e in dump["entries"]:
                del e["frames"]
            (tmp_path / path.name).write_bytes(pickle.dumps(dump))
    run = load_run(tmp_path)
    assert run.flight_recorder["path"].isna().all()
    assert run.problems.empty  # no frames is no problem
    d = diagnose(run)
    assert d.culprit_ranks == [3]
    first = d.first_divergence
    assert first is not None and first["culprits"] == [3]
    assert all(c["path"] == [] for c in first["classes"])


MALFORMED = {
    "a text": "train.py:3",
    "a tuple": ({"name": "f", "filename": "/srv/job/train.py", "line": 3},),
    "an item not a dict": [["f", "/srv/job/train.py", 3]],
    "no line": [{"name": "f", "filename": "/srv/job/train.py"}],
    "a line in words": [{"name": "f", "filename": "/srv/job/train.py", "line": "3"}],
    "a bool line": [{"name": "f", "filename": "/srv/job/train.py", "line": True}],
    "a file number": [{"name": "f", "filename": 7, "line": 3}],
}


def _dump_with(frames: list) -> bytes:
    good = [
        {"name": "all_reduce", "filename": "/x/torch/distributed/distributed_c10d.py", "line": 9},
        {"name": "step", "filename": "/srv/job/train.py", "line": 3},
        {"name": "<module>", "filename": "/srv/job/train.py", "line": 30},
    ]
    entries = []
    for i, f in enumerate([good, *frames, None, good[:1]]):
        entry = {"record_id": i, "collective_seq_id": i + 1, "profiling_name": "nccl:all_reduce"}
        entry["process_group"] = ("0", "default_pg")
        if i != len(frames) + 1:  # the None one has no key at all
            entry["frames"] = f
        entries.append(entry)
    return pickle.dumps({"version": "2.10", "entries": entries})


def _read_both_ways(items: list[tuple[int, str]], monkeypatch: pytest.MonkeyPatch) -> dict:
    """The entries of ``items`` as the compiled scanner reads them, checked equal (meta and
    paths) to what the Python reader makes of them."""
    scanned = _fr_parse.parse_entries(items)
    with monkeypatch.context() as m:
        m.setattr(_fr_parse, "_fr_scan", None)
        python = _fr_parse.parse_entries(items)
    assert scanned["meta"] == python["meta"]
    assert np.array_equal(scanned["arrays"]["code:path"], python["arrays"]["code:path"])
    return scanned


def test_malformed_frames_cost_the_entry_its_path_and_are_said_once_per_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "nccl_trace_rank_0").write_bytes(_dump_with(list(MALFORMED.values())))
    scanned = _read_both_ways([(0, str(tmp_path / "nccl_trace_rank_0"))], monkeypatch)
    [(index, reason)] = scanned["meta"]["problems"]
    assert index == 0 and reason.startswith(f"{len(MALFORMED)} entries have malformed frames")
    # the good entry has its path, outermost first; the rest none (the last: only machinery)
    codes = scanned["arrays"]["code:path"]
    assert codes[0] == 0 and (codes[1:] == -1).all()
    [text] = scanned["meta"]["categories"]["path"]
    assert json.loads(text) == [[USER, "<module>", 30], [USER, "step", 3]]


def test_a_frames_list_of_any_size_or_sharing_reads_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shared lists, shared frame dicts, deeper than PATH_DEPTH, an empty list: the scanner and
    the Python reader give the same paths, and a deep path keeps its innermost frames."""
    frame = {"name": "f", "filename": "/srv/job/a.py", "line": 1}
    shared = [frame, frame]
    deep = [{"name": f"g{i}", "filename": "/srv/job/b.py", "line": i} for i in range(100)]
    data = pickle.dumps(
        {
            "entries": [
                {"record_id": i, "frames": f}
                for i, f in enumerate([shared, shared, [frame], deep, [], shared])
            ]
        }
    )
    (tmp_path / "d").write_bytes(data)
    assert _fr_parse._scan(data) is not None
    scanned = _read_both_ways([(0, str(tmp_path / "d"))], monkeypatch)
    assert scanned["arrays"]["code:path"].tolist() == [0, 0, 1, 2, -1, 0]
    deep_path = json.loads(scanned["meta"]["categories"]["path"][2])
    assert len(deep_path) == 64 and deep_path[-1] == ["/srv/job/b.py", "g0", 0]


def test_a_probe_path_and_a_recorder_path_of_the_same_frames_share_a_code() -> None:
    frames = [("/srv/job/train.py", "<module>", 30), ("/srv/job/train.py", "step", 3)]
    paths = pd.DataFrame(
        {
            "rank": [0, 0],
            "path": [5, 5],
            "depth": [0, 1],
            "file": [f for f, _, _ in frames],
            "func": [fn for _, fn, _ in frames],
            "line": [ln for _, _, ln in frames],
        }
    )
    collectives = pd.DataFrame(
        {
            "rank": [0],
            "path": [5],
            "file": ["/srv/job/train.py"],
            "func": ["step"],
            "line": [3],
        }
    )
    fr = pd.Series(
        pd.Categorical([_fr_parse.path_text(tuple(frames)), "not json", None]),
        dtype="category",
    )
    cp = CallPaths(collectives, paths, fr)
    code = int(cp.codes[0])
    assert cp.of(code) == tuple(frames)
    by_text = dict(zip(fr.cat.categories, cp.fr_codes.tolist(), strict=True))
    assert by_text[_fr_parse.path_text(tuple(frames))] == code and by_text["not json"] == -1


def test_first_divergences_at_scale_names_the_one_rank_among_thousands(tmp_path: Path) -> None:
    """2048 ranks: the vectorised grouping finds the culprit's extra call among 2048 sequences."""
    _make_dumps().write_dumps(
        tmp_path, world=2048, entries=40, culprit=1500, divergence="extra", link=True
    )
    d = diagnose(load_run(tmp_path, workers=1))  # in this process (the test starts none)
    first = d.first_divergence
    assert first is not None and first["culprits"] == [1500] and first["seq"] == 21
    assert any(f[1] == "retry" for f in first["classes"][0]["path"])
