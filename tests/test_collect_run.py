"""``load_run`` on run directories and foreign folders: laziness, schemas, layering, a live job."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rankscope import schema
from rankscope.collect import Run, load_run

DATA = Path(__file__).parent / "data"
RUN_FIXTURES = sorted(p.parent for p in DATA.glob("*/run/run.json"))


@pytest.mark.parametrize("folder", [*RUN_FIXTURES, DATA / "foreign_slurm"], ids=lambda p: p.name)
def test_every_table_matches_its_schema(folder):
    run = load_run(folder)
    for name in Run.TABLES:
        schema.validate(name, run.table(name))
    assert run.problems.empty, run.problems.to_string()


def test_tables_load_lazily_once(monkeypatch):
    from rankscope.collect import run as module

    calls = []
    real = module.parse_events

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "parse_events", counting)
    run = load_run(DATA / "gloo_clean" / "run")
    assert calls == []
    assert run.events is run.events and run.collectives is run.table("collectives")
    assert len(calls) == 1
    run.reload()
    assert not run.collectives.empty and len(calls) == 2


def test_a_copied_run_loads_without_the_paths_it_names(tmp_path):
    # run.json and the events name /home/user/runs/...: nothing may depend on those existing.
    copy = tmp_path / "elsewhere"
    shutil.copytree(DATA / "gloo_barrier_hang" / "run", copy)
    run = load_run(copy)
    assert set(run.logs.loc[run.logs["stream"] == "stderr", "rank"]) == {0, 1, 2, 3}
    assert run.ranks["exit_code"].tolist() == [-15] * 4
    assert run.ranks["group_rank"].tolist() == [0, 0, 1, 1]


def test_evidence_copies_stand_in_for_missing_rank_files(tmp_path):
    copy = tmp_path / "partial"
    shutil.copytree(DATA / "gloo_barrier_hang" / "run", copy)
    shutil.rmtree(copy / "ranks" / "3")
    run = load_run(copy)
    fr = run.flight_recorder
    assert set(fr["rank"]) == {0, 1, 2, 3}
    assert set(fr.loc[fr["rank"] == 3, "source"]) == {"evidence/capture-1/rank3.fr.pkl"}
    assert (run.stacks["rank"] == 3).any()


def test_a_foreign_folder_by_names_and_contents():
    run = load_run(DATA / "foreign_slurm")
    assert not run.is_rundir
    assert set(run.flight_recorder["rank"]) == {0, 1, 2, 3}
    assert set(run.nccl["rank"]) == {0, 1, 2, 3}
    assert len(run.stack_summary) == 1 and run.stack_summary["rank"].iloc[0] == 2
    assert set(run.ranks["rank"]) == {0, 1, 2, 3}
    assert "nccl_watchdog_timeout" in set(run.errors["kind"])


def test_torch_default_dump_names(tmp_path):
    for i, name in enumerate(
        ["nccl_trace_rank_", "comm_lib_trace_rank_", "rank_", "gpu7.pci3_rank_"]
    ):
        shutil.copy(DATA / "foreign_slurm" / "nccl_trace_rank_0", tmp_path / f"{name}{i}")
    shutil.copy(DATA / "fr_versions" / "v2.4_rank_0.pkl", tmp_path / "fr_rank_5.pkl")
    fr = load_run(tmp_path).flight_recorder
    assert sorted(fr.groupby("rank").size().index) == [0, 1, 2, 3, 5]


def test_bad_paths_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_run(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        load_run(tmp_path / "file")
    with pytest.raises(ValueError, match="unknown table"):
        load_run(tmp_path).table("bogus")


def test_an_empty_folder_gives_empty_tables(tmp_path):
    run = load_run(tmp_path)
    for name in Run.TABLES:
        assert run.table(name).empty


@pytest.mark.slow
def test_collect_needs_neither_plotly_nor_ipywidgets():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["ipywidgets"] = None
        sys.modules["plotly"] = None
        import rankscope.collect
        run = rankscope.collect.load_run(sys.argv[1])
        run.problems
        assert not any(m.startswith(("plotly", "ipywidgets")) for m in sys.modules if sys.modules[m])
        """
    )
    subprocess.run(
        [sys.executable, "-c", code, str(DATA / "gloo_barrier_hang" / "run")],
        check=True,
        timeout=60,
    )


@pytest.mark.timeout(90)
@pytest.mark.slow
def test_a_live_job(start_job):
    job = start_job("../data/gloo_clean/worker.py", nproc_per_node=2)
    assert job.wait(timeout=60) == 0
    run = load_run(job.run.path)
    assert run.problems.empty, run.problems.to_string()
    calls = run.collectives
    assert calls["completed"].all() and calls["ok"].all()
    assert set(calls["rank"]) == {0, 1}
    fr = run.flight_recorder
    sub = fr[fr["pg_name"] == "1"]
    assert set(sub["op"]) == {"all_reduce"} and set(sub["input_sizes"]) == {"[[2, 3]]"}
    probe_ops = calls[calls["pg"] == "0"].groupby("rank").size()
    assert (fr[fr["pg_name"] == "0"].groupby("rank").size() <= probe_ops).all()
    logs = run.logs
    assert set(logs.loc[logs["stream"] == "stdout", "text"]) == {"rank 0 sum 24", "rank 1 sum 24"}
    assert run.ranks["exit_code"].tolist() == [0, 0]
