"""Each call's call path: interned by the probe (C and Python alike), read into the
collectives table's ``path`` and the ``paths`` table, bounded where paths never repeat."""

from __future__ import annotations

import json
import re

import pytest
import torch

from rankscope import schema
from rankscope.collect import load_run
from rankscope.collect._common import Problems, Source
from rankscope.collect.events import parse_events
from rankscope.probe import _core
from rankscope.rundir import RankRecord, RunDir, rank_records

from .conftest import SCRIPTS, close_probes, site_of

SCRIPT = "launch/paths.py"


def _line(tag: str) -> int:
    return int(site_of(SCRIPT, tag).rpartition(":")[2])


def _own_lines(run: RunDir, rank: int) -> list[bytes]:
    """The lines the probe writes itself (path, facts), without their times."""
    return [
        re.sub(rb',"t":[0-9.]+,', b",", line)
        for line in run.events(rank).read_bytes().splitlines()
        if line.startswith((b'{"ev":"path"', b'{"ev":"facts"'))
    ]


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_helper_called_from_two_lines_has_two_paths_in_c_and_python_alike(start_job):
    if _core._fast is None:
        pytest.skip("the probe's C extension is not built here (no C compiler at install)")
    jobs = {
        which: start_job(SCRIPT, nproc_per_node=2, env=env)
        for which, env in (("c", {}), ("python", {"RANKSCOPE_PYTHON_PROBE": "1"}))
    }
    for job in jobs.values():
        assert job.wait(timeout=90) == 0
    script = str(SCRIPTS / SCRIPT)
    for which, job in jobs.items():
        run = load_run(job.run.path)
        assert run.problems.empty, run.problems.to_string()
        schema.validate("paths", run.paths)
        calls = run.collectives
        for rank in (0, 1):
            mine = calls[(calls["rank"] == rank) & (calls["op"] == "all_reduce")]
            # one site, two paths: the normal step's (three times), then the retry's
            assert mine["site"].tolist() == [site_of(SCRIPT, "helper")] * 4, which
            ids = mine["path"].tolist()
            assert ids[0] == ids[1] == ids[2] != ids[3], which
            paths = run.paths[run.paths["rank"] == rank]
            for pid, (outer, middle) in zip(
                (ids[0], ids[3]), (("loop", "normal"), ("last", "retry")), strict=True
            ):
                frames = paths[paths["path"] == pid].sort_values("depth")
                assert frames["depth"].tolist() == [0, 1, 2]  # runpy and the bootstrap left out
                assert frames["file"].tolist() == [script] * 3
                assert frames["func"].tolist() == ["<module>", "step", "sync"]
                assert frames["line"].tolist() == [_line(outer), _line(middle), _line("helper")]
            # every recorded call has a path, each of its own line
            assert calls.loc[calls["rank"] == rank, "path"].notna().all()
            assert paths.groupby("path").size().size == 4  # init, normal, retry, destroy
            # the rank's record: its last call's path (destroy_process_group, at the top)
            record = rank_records(job.run)[rank]
            assert record.path == ((script, "<module>", _line("last") + 1),)
    # the C probe and the Python one write the same path and facts lines, but for the times
    for rank in (0, 1):
        c, python = (_own_lines(job.run, rank) for job in jobs.values())
        assert c == python and len(c) == 4 + 4


def all_reduce(tensor, op=None, group=None, async_op=False):
    return None


@pytest.mark.parametrize("which", ["c", "python"])
def test_paths_that_never_repeat_stay_bounded(tmp_path, monkeypatch, which):
    """Generated code: a fresh code object, and path, at every call. The probe forgets its
    paths with its facts (FACTS_KEPT), and its caches of raw frames stay bounded."""
    if which == "c" and _core._fast is None:
        pytest.skip("the probe's C extension is not built here (no C compiler at install)")
    if which == "python":
        monkeypatch.setattr(_core, "_fast", None)
    monkeypatch.setattr(_core, "FACTS_KEPT", 10)
    probe = _core.Probe(RunDir(tmp_path / "run"), rank=0)
    try:
        reduce = probe._wrap("all_reduce", all_reduce, None)
        x = torch.ones(1)
        for i in range(100):
            code = compile("\n" * i + "reduce(x)", f"<generated {i}>", "exec")
            exec(code, {"reduce": reduce, "x": x})
        assert len(probe._paths) <= 10 and len(probe._path_keys) <= 10
        assert len(probe._facts) <= 10
        probe.flush()
        evs = [json.loads(line) for line in probe.run.events(0).read_text().splitlines()]
        paths = {e["path"]: e for e in evs if e["ev"] == "path"}
        calls = [e for e in evs if e["ev"] == "call"]
        facts = {e["facts"]: e for e in evs if e["ev"] == "facts"}
        assert sorted(paths) == list(range(1, 101)) and len(calls) == 100
        for i, call in enumerate(calls):
            path = paths[facts[call["facts"]]["path"]]
            assert path["frames"][-1] == [f"<generated {i}>", "<module>", i + 1]
            assert path["frames"][-2][1] == "test_paths_that_never_repeat_stay_bounded"
        # the reader keeps as many as the probe names
        record = RankRecord(rank=0)
        for e in evs:
            record.apply(e)
        assert record.path[-1] == ("<generated 99>", "<module>", 100)
    finally:
        close_probes(probe)


@pytest.mark.parametrize("which", ["c", "python"])
def test_a_deep_path_keeps_its_innermost_frames(tmp_path, monkeypatch, which):
    if which == "c" and _core._fast is None:
        pytest.skip("the probe's C extension is not built here (no C compiler at install)")
    if which == "python":
        monkeypatch.setattr(_core, "_fast", None)
    probe = _core.Probe(RunDir(tmp_path / "run"), rank=0)
    try:
        reduce = probe._wrap("all_reduce", all_reduce, None)

        def down(n):
            return reduce(torch.ones(1)) if n == 0 else down(n - 1)

        for depth in (300, 300, 10):
            down(depth)
        probe.flush()
        evs = [json.loads(line) for line in probe.run.events(0).read_text().splitlines()]
        paths = [e for e in evs if e["ev"] == "path"]
        assert len(paths) == 2  # the deep one once, however deep
        deep, shallow = paths
        assert len(deep["frames"]) == _core.PATH_DEPTH and deep["cut"] > 300 - 64
        assert all(f[1] == "down" for f in deep["frames"])
        assert shallow["cut"] == 0 and [f[1] for f in shallow["frames"]].count("down") == 11
        tables = parse_events([Source(probe.run.events(0), "events.jsonl", rank=0)])
        rows = tables.paths[tables.paths["path"] == deep["path"]]
        assert rows["depth"].tolist() == list(range(deep["cut"], deep["cut"] + 64))
    finally:
        close_probes(probe)


def _events_file(tmp_path, lines: list[str]) -> Source:
    path = tmp_path / "events.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return Source(path, "ranks/0/events.jsonl", rank=0)


GOOD = '{"ev":"path","path":1,"frames":[["t.py","<module>",3],["t.py","sync",1]],"cut":0,"t":1.0,"rank":0}'
FACTS = (
    '{"ev":"facts","facts":%d,"op":"all_reduce","pg":"0","pg_desc":"default_pg","pg_ranks":[0,1],'
    '"peer":null,"shapes":[[4]],"dtypes":["float32"],"async_op":false,"file":"t.py","line":1,'
    '"func":"sync","path":%d,"t":1.0,"rank":0}'
)
CALL = '{"id":%d,"seq":%d,"tid":1,"facts":%d,"dur_s":0.001,"ok":true,"ev":"call","t":2.0,"rank":0}'


@pytest.mark.parametrize(
    "bad",
    [
        '{"ev":"path","path":2,"frames":[["t.py","<module>"]],"cut":0,"t":1.0,"rank":0}',
        '{"ev":"path","path":2,"frames":"t.py","cut":0,"t":1.0,"rank":0}',
        '{"ev":"path","path":"2","frames":[],"cut":0,"t":1.0,"rank":0}',
        '{"ev":"path","path":2,"frames":[[1,2,3]],"cut":-1,"t":1.0,"rank":0}',
        f'{{"ev":"path","path":{2**70},"frames":[],"cut":0,"t":1.0,"rank":0}}',
        '{"ev":"path","path":2,"frames":[["t.py","<mod',  # torn by a kill
    ],
)
def test_a_malformed_path_line_is_skipped_and_reported(tmp_path, bad):
    source = _events_file(
        tmp_path,
        [
            '{"ev":"start","pid":1,"t":0.5,"rank":0}',
            GOOD,
            FACTS % (1, 1),
            CALL % (1, 1, 1),
            bad,
            FACTS % (2, 2),
            CALL % (2, 2, 2),
        ],
    )
    problems = Problems()
    tables = parse_events([source], problems=problems)
    assert tables.collectives["path"].tolist() == [1, 2]
    assert tables.paths["path"].tolist() == [1, 1] and tables.paths["depth"].tolist() == [0, 1]
    assert tables.paths["func"].tolist() == ["<module>", "sync"]
    assert len(problems.rows) == 1 and "line 5" in problems.rows[0][2]
    # the rank's record: the first call's path, then none known for the second
    record = RankRecord(rank=0)
    seen = []
    for line in source.path.read_text().splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        record.apply(ev)
        if ev["ev"] == "call":
            seen.append(record.path)
    assert seen == [(("t.py", "<module>", 3), ("t.py", "sync", 1)), None]


def test_a_restarted_rank_numbers_its_paths_after_its_earlier_process(tmp_path):
    life = ['{"ev":"start","pid":%d,"t":0.5,"rank":0}', GOOD, FACTS % (1, 1), CALL % (1, 1, 1)]
    lines = [life[0] % 1, *life[1:], life[0] % 2, *life[1:]]
    tables = parse_events([_events_file(tmp_path, lines)])
    assert tables.collectives["path"].tolist() == [1, 2]
    assert tables.paths["path"].tolist() == [1, 1, 2, 2]


def test_old_run_directories_have_no_paths():
    from .test_collect_run import RUN_FIXTURES

    for folder in RUN_FIXTURES:
        run = load_run(folder)
        assert run.paths.empty and run.collectives["path"].isna().all()
