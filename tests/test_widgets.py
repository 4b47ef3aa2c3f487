"""The workbench driven from code (``.value``, ``.click()``) against real 2-rank jobs, and
``rankscope.show`` on stored runs."""

from __future__ import annotations

import ast
import html
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import rankscope
from rankscope.launch import JobSpec
from rankscope.widgets import Workbench
from rankscope.widgets._common import PLOTLY_MIME

from .conftest import SCRIPTS, leftover_processes

pytestmark = pytest.mark.timeout(180)
DATA = Path(__file__).parent / "data"
SRC = Path(__file__).resolve().parent.parent / "src" / "rankscope"


def wait_until(check: Callable[[], Any], *, timeout_s: float = 60, what: str = "") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what or check}")


def error_text(wb: Workbench) -> str:
    """Every error the workbench shows, wherever it is shown."""
    places = (
        wb.errors,
        wb.form.errors,
        wb.live.errors,
        wb.attach_errors,
        wb.results.errors,
        wb.results.table_errors,
    )
    return "".join(out.get("text", "") for place in places for out in place.outputs)


def figure_title(out: Any) -> str:
    (shown,) = out.outputs
    return shown["data"][PLOTLY_MIME]["layout"]["title"]["text"]


@pytest.fixture
def workbench(tmp_path: Path):
    """A workbench on an empty runs folder; its jobs are stopped and nothing may outlive it."""
    wb = Workbench(runs_root=tmp_path / "runs", refresh_s=0.3)
    try:
        yield wb
    finally:
        wb.stop_all(grace_s=1.0)
        wb.close()
        left = leftover_processes(tmp_path)
        for proc in left:
            proc.kill()
        assert not left, f"processes outlived the test: {[p.pid for p in left]}"


def test_bad_script_path_is_shown_in_the_ui(workbench: Workbench, tmp_path: Path) -> None:
    def beside_launch() -> str:
        return "".join(out.get("text", "") for out in workbench.form.errors.outputs)

    workbench.form.launch.click()
    assert "choose a scenario or enter the path" in beside_launch()
    workbench.form.script.value = str(tmp_path / "no_such_script.py")
    workbench.form.launch.click()
    # beside the Launch button, the latest error only: the one before is cleared
    assert "no_such_script.py" in beside_launch() and "does not exist" in beside_launch()
    assert "choose a scenario" not in beside_launch()
    assert workbench.jobs.options == ()


def test_a_scenario_fills_the_form(workbench: Workbench) -> None:
    form = workbench.form
    if len(form.scenario.options) == 1:
        pytest.skip("the scenario catalogue is empty")
    from rankscope.scenarios import catalogue

    def same(spec: JobSpec) -> JobSpec:
        return replace(spec, name=None, presets=tuple(sorted(spec.presets)))

    # The form launches what the catalogue says, launcher and all, broken and fixed.
    for scenario in catalogue():
        form.scenario.value = scenario.id
        for fix in (False, True):
            form.fix.value = fix
            assert same(form.spec()) == same(scenario.spec(fix=fix)), (scenario.id, fix)
    assert not error_text(workbench)


@pytest.mark.slow
def test_live_job_freezes_and_the_culprit_is_shown(workbench: Workbench, tmp_path: Path) -> None:
    wb = workbench
    wb.form.script.value = str(SCRIPTS / "widgets" / "hang.py")
    wb.form.stall_timeout_s.value = 2
    start = time.perf_counter()
    wb.form.launch.click()
    assert time.perf_counter() - start < 2.0, "launching blocked the kernel"  # a start takes 10 s+
    # A second job at the same time: it finishes cleanly.
    wb.form.script.value = str(SCRIPTS / "launch" / "clean.py")
    wb.form.launch.click()
    wait_until(lambda: len(wb.jobs.options) == 2, what="both jobs listed")
    assert not error_text(wb)

    wb.jobs.value = 0  # the hanging job
    rows = wait_until(lambda: len(wb.live.rows) == 2 and wb.live.rows, what="both ranks live")
    assert {r["rank"] for r in rows} == {0, 1}
    # The panel updates by itself while the job runs: steps advance, then rank 0 waits.
    wait_until(lambda: any(r["step"] == 2 for r in wb.live.rows), what="step 2")
    wait_until(
        lambda: "waiting in barrier (group 0 #" in wb.live.ranks.value,
        what="rank 0 waiting in barrier",
    )
    # rank 1 is in no collective: the panel shows the line its main thread is at
    wait_until(lambda: "at hang.py:" in wb.live.ranks.value, what="rank 1's current line")
    assert "all_reduce (group 0 #" in wb.live.ranks.value  # the last one completed, apart
    wait_until(lambda: "finished step 2" in wb.live.logs.children[0].value, what="log tail")
    assert wb.live.logs.titles == ("rank 0", "rank 1")

    # Rank 0 waits in the barrier; rank 1, which never calls it, is the culprit.
    d = wb.wait_for_diagnosis(timeout_s=60)
    assert d.verdict == "hang" and d.culprit_ranks == [1] and d.recipe == "D21"
    assert "stalled" in wb.jobs.options[0][0]
    card = wb.results.card.value
    assert "rankscope-culprits" in card and "Culprit rank <b style='color:#d62728'>1</b>" in card
    assert "barrier" in card and "hang.py:21" in card and "(none recorded)" in card
    assert "never called it" in card  # its record is whole (its ring): known not to have called
    assert figure_title(wb.results.timeline).startswith("Rank timeline: 2 ranks")
    assert wb.results.plots.titles == (
        "call paths",
        "sequence ladder",
        "where is everyone",
        "merged stacks",
        "progress",
        "tables",
    )
    assert (wb.selected.run.path / "diagnosis.json").is_file()
    wait_until(lambda: "1 ⚑ culprit" in wb.live.ranks.value, what="the culprit row marked")

    # Capture evidence now, then drill down into the stack table of rank 0.
    evidence = wb.selected.run.evidence
    captures = len(list(evidence.iterdir()))
    manifest = wb.capture().result(timeout=30)
    assert wb.selected.run.capture_dir(manifest["id"]).is_dir()
    wait_until(
        lambda: f"capture {manifest['id']}: 2 of 2 ranks answered" in wb.live.status.value,
        what="the capture's status line",
    )
    assert len(list(evidence.iterdir())) == captures + 1
    wb.results.table_name.value = "stack_summary"
    wb.results.table_ranks.value = "0"  # the rows at once
    assert wb.results.table.caption == "stack_summary"
    assert "<b>stack_summary</b>: " in wb.results.table_info.value
    assert "thread" in wb.results.table_columns.options  # the columns to choose from
    wb.results.table_columns.value = ("rank", "site")
    assert list(wb.results.table.df.columns) == ["rank", "site"] and not error_text(wb)

    # The clean job was diagnosed when it ended, and is shown when selected.
    wait_until(lambda: "exited" in wb.jobs.options[1][0], what="clean job exited")
    wb.jobs.value = 1
    wait_until(lambda: "<b>OK</b>" in wb.results.card.value, what="the clean job's diagnosis")
    wait_until(
        lambda: (
            wb.live.stop.disabled and wb.live.capture.disabled and not wb.live.diagnose.disabled
        ),
        what="Stop and Capture off for an ended job",
    )

    # A kernel restart: a new workbench re-attaches both runs and can stop the live one.
    wb2 = Workbench(runs_root=tmp_path / "runs", refresh_s=0.3)
    try:
        assert [label.split(" · ")[1] for label, _ in wb2.jobs.options] == ["stalled", "exited"]
        wb2.jobs.value = 0
        wait_until(lambda: len(wb2.live.rows) == 2, what="re-attached ranks")
        wb2.live.stop.click()
        wait_until(lambda: "stopped" in wb2.jobs.options[0][0], what="stopped from the re-attached")
    finally:
        wb2.close()
    assert not error_text(wb) and not error_text(wb2)
    assert not leftover_processes(tmp_path)


def test_show_a_finished_run_and_foreign_artifacts() -> None:
    panel = rankscope.show(DATA / "gloo_barrier_hang" / "run")
    assert "Culprit rank <b style='color:#d62728'>0</b>" in panel.card.value
    title = figure_title(panel.timeline)
    assert title.startswith("Rank timeline: 4 ranks, 16 calls<br>") and "group 0 #4" in title
    assert panel.plots.titles[-1] == "tables"
    foreign = rankscope.show(DATA / "nccl_fr" / "op")
    assert "Culprit rank <b style='color:#d62728'>3</b>" in foreign.card.value
    assert "op mismatch" in foreign.card.value
    assert figure_title(foreign.timeline).startswith("Rank timeline: 4 ranks")
    foreign.table_ranks.value = "1-x"
    assert "'1-x' is not a rank" in "".join(o["text"] for o in foreign.table_errors.outputs)
    foreign.table_ranks.value = "1"  # fixed: the error beside the grid goes
    assert not foreign.table_errors.outputs
    with pytest.raises(ValueError, match="does not exist"):
        rankscope.show(DATA / "no_such_run")


def test_the_results_show_the_call_paths_first_or_say_they_never_parted() -> None:
    """The first tab: the call-path tree of a run whose ranks' paths parted (rank 0 called a
    barrier where ranks 1-3 all-reduced); one muted line for a run whose paths never did."""
    panel = rankscope.show(DATA / "gloo_barrier_hang" / "run")
    assert panel.plots.titles[0] == "call paths"
    paths = panel.plots.children[0]
    assert figure_title(paths) == (
        "Call paths: 4 ranks, 2 classes where they first parted, 2 at the end"
    )
    (shown,) = paths.outputs
    first = shown["data"][PLOTLY_MIME]["data"][0]
    leaves = [
        label for label in first["labels"] if label.startswith("<b>") and "Where" not in label
    ]
    assert sorted(leaves) == [
        "<b>all_reduce</b><br>3 ranks: 1-3",
        "<b>barrier</b> ✖ culprit<br>1 rank: 0",
    ]
    clean = rankscope.show(DATA / "gloo_clean" / "run")
    assert clean.diagnosis.first_divergence is None
    assert clean.plots.titles[0] == "call paths"
    (said,) = clean.plots.children[0].outputs
    text = said["data"]["text/html"]
    assert "followed one path" in text and "color:#777" in text
    assert PLOTLY_MIME not in said["data"]


def test_what_the_results_showed_stays_as_plain_outputs() -> None:
    from rankscope.widgets.results import ResultsPanel

    assert ResultsPanel().static() == []  # nothing shown, nothing to keep
    panel = rankscope.show(DATA / "gloo_barrier_hang" / "run")
    card, timeline, ranks = panel.static()
    assert card["data"]["text/html"] == panel.diagnosis.to_html()
    assert "diagnosed " in card["data"]["text/html"] and " from " in card["data"]["text/html"]
    assert "application/vnd.plotly.v1+json" in timeline["data"]
    assert ranks["data"]["text/html"].count("</tr>") == 1 + 4  # a header and four ranks
    assert "NA" not in ranks["data"]["text/html"]  # what is unknown is left blank


def test_choosing_a_table_shows_its_rows_and_no_rows_say_why() -> None:
    from rankscope.widgets.results import ResultsPanel

    panel = ResultsPanel()
    panel.table_name.value = "ranks"  # nothing loaded: no error, no grid
    assert panel.table.layout.display == "none" and not panel.table_errors.outputs
    panel = rankscope.show(DATA / "gloo_barrier_hang" / "run")
    assert panel.table.caption == "calls" and panel.table.layout.display != "none"
    # what there is to read: not the analyzer's own columns, nor a gloo run's empty ones
    shown = set(panel.table.df.columns)
    assert {"rank", "op", "state", "site"} <= shown
    assert not shown & {"key", "path", "p2p_seq", "peer", "root"}
    assert "key" in panel.table_columns.options  # one choice away
    panel.table_columns.value = ("rank", "key")
    assert list(panel.table.df.columns) == ["rank", "key"]
    panel.table_columns.value = ()
    panel.table_name.value = "stack_summary"  # at once, without "Show rows"
    assert panel.table.caption == "stack_summary"
    assert "waiting_in" in panel.table.df.columns and set(panel.table.df["rank"]) == {0, 1, 2, 3}
    assert "<b>stack_summary</b>: " in panel.table_info.value
    panel.table_name.value = "ranks"
    assert list(panel.table.df["rank"]) == [0, 1, 2, 3] and "waiting_in" not in panel.table.df
    panel.table_ranks.value = "9"  # no such rank: no empty grid, a sentence instead
    assert panel.table.layout.display == "none"
    assert panel.table_info.value == "<b>ranks</b>: no rows for rank 9"
    panel.table_name.value = "nccl"  # a gloo run has no NCCL log
    assert panel.table.layout.display == "none" and "no rows in this run" in panel.table_info.value
    panel.table_ranks.value = ""
    panel.table_name.value = "errors"
    assert (panel.table.layout.display != "none") == (len(panel.table.df) > 0)
    assert not panel.table_errors.outputs


def test_the_results_tables_group_ranks_alike_at_64_ranks() -> None:
    """64 ranks (nccl_fr64: rank 37 all_gathers where the 7 others of its data-parallel group
    reduce_scatter): the grid shows a row per group of ranks alike, the culprit's first and
    those that wait for it next; a group's rows are one choice away; the saved ranks table is
    a row per group too."""
    panel = rankscope.show(DATA / "nccl_fr64" / "dumps")
    assert panel.table_name.value == "calls"  # the diagnosis's own, probe and recorder merged
    rows = panel.table.df
    assert 1 < len(rows) < 64 * 8  # a row per group, not per rank and call
    assert list(rows["ranks"][:2]) == ["rank 37 ⚑ culprit", "7 ranks: 5, 13, 21, 29, 45, 53, 61"]
    assert list(rows["op"][:2]) == ["all_gather", "reduce_scatter"]
    assert "rank" not in rows.columns and "groups of ranks alike" in panel.table_info.value
    label, index = panel.table_group.options[2]
    assert label.startswith("7 ranks: 5, 13, 21, 29, 45, 53, 61 — ") and "reduce_scatter" in label
    panel.table_group.value = index  # one choice: that group's rows, a rank each
    mine = panel.table.df
    assert list(mine["rank"]) == [5, 13, 21, 29, 45, 53, 61]  # in rank order
    assert set(mine["op"]) == {"reduce_scatter"}
    assert "the 7 rows of 7 ranks" in panel.table_info.value
    panel.table_group.value = None  # every group again
    assert panel.table.df["ranks"].iloc[0] == "rank 37 ⚑ culprit"
    panel.table_name.value = "pg_status"
    panel.table_ranks.value = "30-40"
    assert panel.table.df["ranks"].iloc[0] == "rank 37 ⚑ culprit"
    assert sum(len(g.rows) for g in panel._groups) == 11 * 3  # ranks 30-40, 3 groups each
    panel.table_grouped.value = False  # a row each, as at a few ranks
    assert len(panel.table.df) == 33 and "rank" in panel.table.df.columns
    assert panel.table_group.disabled
    _, _, ranks = panel.static()
    assert ranks["data"]["text/html"].count("</tr>") == 1 + 1  # a header and one group
    assert "64 ranks: 0-63" in ranks["data"]["text/html"]


def test_only_widgets_imports_ipywidgets_and_nothing_imports_widgets() -> None:
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        inside = path.parent.name == "widgets"
        assert inside or not any(n.split(".")[0] == "ipywidgets" for n in names), path
        assert inside or not any(n.startswith("rankscope.widgets") for n in names), path


def test_the_replay_button_writes_repro_into_the_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(DATA / "gloo_barrier_hang" / "run", run)
    panel = rankscope.show(run)
    assert not panel.replay.disabled
    panel.replay.click()
    path = run / "repro.py"
    text = path.read_text()
    compile(text, "repro.py", "exec")
    shown = html.unescape(panel.replay_info.value)
    assert f"wrote <code>{path}</code>" in shown
    assert "torchrun --nproc-per-node 4 repro.py" in shown
    assert "Ranks (original -> replay): 0-3 -> 0-3." in shown
    assert not panel.errors.outputs
    # A healthy run has nothing to replay: the button is off, and a click says why.
    clean = tmp_path / "clean"
    shutil.copytree(DATA / "nccl_fr" / "clean", clean)
    panel.load(clean)
    assert panel.replay.disabled and panel.replay_info.value == ""
    panel.replay.click()
    assert "no divergence found in clean" in "".join(o["text"] for o in panel.errors.outputs)
    assert not (clean / "repro.py").exists()


def test_the_form_runs_a_script_on_slurm(workbench: Workbench) -> None:
    form = workbench.form
    assert form.slurm_box.layout.display == "none"  # SLURM's fields only when it is chosen
    form.scenario.value = ""
    form.script.value = str(SCRIPTS / "launch" / "clean.py")
    form.launcher.value = "slurm"
    assert form.slurm_box.layout.display == "flex"
    form.nnodes.value = 2
    form.partition.value = "debug"
    form.time_limit.value = "5:00"
    form.sbatch_args.value = "--qos=low --mem=1G"
    spec = form.spec()
    assert (spec.launcher, spec.nnodes) == ("slurm", 2)
    assert spec.slurm == {
        "partition": "debug",
        "time": "5:00",
        "sbatch_args": ["--qos=low", "--mem=1G"],
    }


def test_the_rank_table_marks_culprits_and_names_signals() -> None:
    from rankscope.state import RankEnd
    from rankscope.widgets.live import ranks_html

    ended = RankEnd(code=-15)  # no stop: the launcher's teardown
    rows = [
        {
            "rank": 0,
            "status": ended.status,
            "done": 3,
            "exit_code": -15,
            "end": ended.words,
            "last_done": "barrier (group 0 #3)",
        },
        {"rank": 1, "status": "running", "done": 2, "at": "t.py:14", "exit_code": None},
    ]
    text = ranks_html(rows, culprits=[1])
    assert ">ended by the launcher: SIGTERM (-15)<" in text and ">ended<" in text
    assert "1 ⚑ culprit" in text and "at t.py:14" in text
    assert "<th>now</th>" in text and "<th>last completed</th>" in text
    # every column a fixed width but "now" and "end", which share what is left, and wrap
    assert "padding" in text and text.count("<col style='width:") == 6
    assert text.count("<col>") == 2
    assert "class='wrap'>at t.py:14<" in text
    assert "<th>node</th>" not in text  # no SLURM node to show


def test_the_rank_table_groups_ranks_alike_at_scale() -> None:
    """1024 ranks: one row per group of ranks in the same state, the culprit first, a group's
    ranks listed under its row when it is the one chosen."""
    from rankscope.state import RankEnd
    from rankscope.widgets.live import ranks_html, snapshot_groups

    def waiting(rank: int) -> dict:
        return {
            "rank": rank,
            "status": "waiting",
            "step": 12,
            "done": 2000 + rank % 2,
            "in_collective_s": 4.0 + rank / 1000,
            "op": "all_reduce",
            "pg": "0",
            "seq": 2001,
            "site": "train.py:41",
            "last_done": "all_reduce (group 0 #2000)",
            "heartbeat_age_s": 0.5,
        }

    rows = [waiting(r) for r in range(1024)]
    rows[517] = {"rank": 517, "status": "running", "step": 12, "done": 2000, "at": "train.py:70"}
    rows[900] = {"rank": 900, "status": "killed", "done": 1999, "exit_code": -9}
    rows[900]["end"] = RankEnd(code=-9).words
    groups = snapshot_groups(rows, culprits=[517])
    assert [g.label for g in groups] == [
        "rank 517",
        "rank 900",
        "1022 ranks: 0-516, 518-899, 901-1023",
    ]
    text = ranks_html(rows, culprits=[517])
    assert text.count("<tr") == 4  # the head and three groups, not 1024 rows
    assert text.index("517 ⚑ culprit") < text.index("SIGKILL") < text.index("1022 ranks")
    assert "2000-2001" in text and "for 4.0-5.0 s" in text and "up to 0.5" in text
    opened = ranks_html(rows, culprits=[517], expand=groups[2].label)
    assert opened.count("<tr") == 4 + 1022 and "▾ 1022 ranks" in opened
    assert ranks_html(rows[:8], culprits=[517]).count("<tr") == 9  # few ranks: a row each

    from rankscope.widgets.live import LivePanel

    panel = LivePanel()
    panel.rows, panel.culprits = rows, {517}
    panel._show_ranks()
    assert panel.expand.layout.display == "" and panel.ranks.value.count("<tr") == 4
    assert [label for label, _ in panel.expand.options] == ["no group", groups[2].label]
    panel.expand.value = groups[2].label  # a click: its ranks under its row
    assert panel.ranks.value.count("<tr") == 4 + 1022
    panel._show_ranks()  # the next refresh keeps the choice
    assert panel.expand.value == groups[2].label


def test_stopping_or_closing_leaves_the_answer_once(tmp_path: Path, monkeypatch) -> None:
    from rankscope.widgets import workbench as wb_module

    shown: list[dict] = []
    monkeypatch.setattr(wb_module, "ipy_display", lambda data, raw: shown.append(data))
    wb = Workbench(runs_root=tmp_path / "runs", attach=False)
    wb.stop_all()  # nothing diagnosed yet: nothing to leave
    assert shown == []
    wb.results.load(DATA / "gloo_barrier_hang" / "run")
    wb.stop_all()  # a cell that stops the jobs keeps the answer ...
    assert [sorted(d) for d in shown] == [
        ["text/html"],
        ["application/vnd.plotly.v1+json", "text/plain"],
        ["text/html"],
    ]
    wb.close()  # ... and closing after it does not repeat it
    assert len(shown) == 3
    wb.close()
    assert len(shown) == 3
