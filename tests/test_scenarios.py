"""Every scenario in the catalogue breaks and is diagnosed as the catalogue says; a hang's replay
freezes the same way. The fixes are run by the guided notebooks (tests/test_notebooks.py), each
with its own check that every rank exits 0; this file checks that every scenario has one.

A notebook that breaks a scenario with ``Lesson.break_it`` checks the catalogue's diagnosis too
(verdict, cause and culprits); such a scenario is run broken here only if it hangs, for the
replay, so that the suite does not run the same broken job twice. A hang's broken run that a
notebook made earlier in the same run of the suite (the same job but for its stall timeout and
name) is read here rather than run again; run alone, this file runs its own."""

from __future__ import annotations

import ast
import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import nbformat
import pytest

from rankscope.analyze import diagnose
from rankscope.launch import JobSpec
from rankscope.rundir import FINAL_STATES
from rankscope.scenarios import Scenario, catalogue, get
from rankscope.widgets.lesson import Lesson

from .test_notebooks import workdir_in_this_run
from .test_replay import assert_replay_reproduces

SCENARIOS = catalogue()
NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def _lesson_calls() -> list[tuple[str, str, bool, Path]]:
    """``(method, scenario id, checks the catalogue, notebook)`` for every ``lesson.verify(s)`` and
    ``lesson.break_it(s)`` of the notebooks, ``s`` resolved from ``s = get("d21")`` in the
    order of the source (a variable may name one scenario after another). A ``break_it`` checks
    the catalogue's diagnosis unless it, or ``Lesson(...)``, names another ``verdict``."""
    calls: list[tuple[str, str, bool, Path]] = []
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        try:
            tree = ast.parse(code)
        except SyntaxError:  # IPython syntax: not a lesson notebook
            continue
        ids: dict[str, str] = {}
        lesson_checks = True
        for node in sorted(ast.walk(tree), key=lambda n: getattr(n, "lineno", 0)):
            if isinstance(node, ast.Assign) and _call_name(node.value) == "get":
                (target,) = node.targets
                ids[ast.unparse(target)] = ast.literal_eval(node.value.args[0])  # type: ignore[attr-defined]
            elif isinstance(node, ast.Call) and _call_name(node) == "Lesson":
                lesson_checks = _checks_catalogue(node, default=True)
            elif isinstance(node, ast.Call) and _call_name(node) in (
                "lesson.verify",
                "lesson.break_it",
            ):
                name = ast.unparse(node.args[0])
                if name in ids:
                    method = _call_name(node).partition(".")[2]  # type: ignore[union-attr]
                    checks = _checks_catalogue(node, default=lesson_checks)
                    calls.append((method, ids[name], checks, path))
    return calls


def _call_name(node: ast.AST) -> str | None:
    return ast.unparse(node.func) if isinstance(node, ast.Call) else None


def _checks_catalogue(call: ast.Call, *, default: bool) -> bool:
    verdict = next((k.value for k in call.keywords if k.arg == "verdict"), None)
    return default if verdict is None else ast.unparse(verdict) == "CATALOGUE"


LESSON_CALLS = _lesson_calls()
#: Scenarios a notebook runs fixed with ``Lesson.verify`` (every rank exits 0).
FIXED_BY_A_NOTEBOOK = {sid for method, sid, _, _ in LESSON_CALLS if method == "verify"}
#: The notebooks that break each scenario with ``Lesson.break_it``, checking the catalogue's
#: diagnosis.
NOTEBOOKS_BREAKING: defaultdict[str, list[Path]] = defaultdict(list)
for _method, _sid, _checks, _path in LESSON_CALLS:
    if _method == "break_it" and _checks:
        NOTEBOOKS_BREAKING[_sid].append(_path)
BROKEN_BY_A_NOTEBOOK = set(NOTEBOOKS_BREAKING)
#: The broken runs this file makes: every hang (its replay), and what no notebook checks.
BROKEN_HERE = [
    s for s in SCENARIOS if s.expected["verdict"] == "hang" or s.id not in BROKEN_BY_A_NOTEBOOK
]


def test_catalogue_is_complete_and_consistent():
    ids = [s.id for s in SCENARIOS]
    assert len(ids) == len(set(ids))
    recipes = {s.recipe for s in SCENARIOS if s.kind == "recipe"}
    assert {"D8", "D9", "D10", "D11", "D19", "D20", "D21", "D22", "D23"} <= recipes
    # D4 (two jobs on one port) and D7 (choosing a launcher) need more than one job: notebook 12
    assert {"D1", "D2", "D3", "D5", "D6"} <= recipes
    assert {"D12", "D13", "D14", "D15"} <= recipes
    assert sum(s.kind == "reported" for s in SCENARIOS) == 4
    for s in SCENARIOS:
        assert s.path.is_file(), s.path
        assert "import rankscope" not in s.path.read_text()  # plain torch scripts
        assert s.expected["verdict"] in {"hang", "crash", "launch_error"}
        # a --fix switch exactly where the fix is in the script; the launch settings are valid
        assert ('add_argument("--fix"' in s.path.read_text()) == s.fix_flag, s.id
        broken, fixed = s.spec(), s.spec(fix=True)
        if not s.fix_flag:  # the fix is all in the launch: the two runs must launch differently
            assert replace(broken, name=None) != replace(fixed, name=None), s.id
    unverified = set(ids) - FIXED_BY_A_NOTEBOOK
    assert not unverified, f"no notebook runs the fix of {sorted(unverified)}"
    with pytest.raises(ValueError, match="known: d08"):
        get("nope")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("scenario", BROKEN_HERE, ids=[s.id for s in BROKEN_HERE])
@pytest.mark.slow
def test_scenario_breaks_as_catalogued(scenario, start_job):
    if scenario.missing():  # an optional extra that is not installed here
        pytest.skip(f"{scenario.id} needs {', '.join(scenario.missing())}, which is not installed")
    path = a_notebook_s_run(scenario)
    if path is None:
        job = start_job.spec(scenario.spec(on_stall="stop"))
        job.wait(timeout=120)
        path = job.run.path
    diagnosis = diagnose(path)
    wrong = scenario.wrong(diagnosis)
    assert not wrong, "; ".join(wrong)
    if (
        scenario.expected["verdict"] == "hang"
    ):  # its replay freezes the same way (tests/test_replay.py)
        assert_replay_reproduces(path, diagnosis, start_job)


def _the_job(spec: JobSpec) -> JobSpec:
    """A broken run's job, but for what a lesson sets its own way (its stall timeout) and the
    name; its backend as it resolves here (a lesson's gloo is the catalogue's auto on CPU)."""
    return replace(spec, backend=spec.resolve_backend(), stall_timeout_s=None, name=None)


def a_notebook_s_run(scenario: Scenario) -> Path | None:
    """A hang's broken run that a notebook made in this run of the suite (``Lesson.break_it``):
    the job this file would start (:func:`_the_job`), ended, stopped by the watchdog at a
    stall; None where there is none (this file run alone, or that notebook not run yet)."""
    if scenario.expected["verdict"] != "hang":
        return None
    want = _the_job(scenario.spec(on_stall="stop"))
    for notebook in NOTEBOOKS_BREAKING.get(scenario.id, ()):
        workdir = workdir_in_this_run(notebook)
        for run_json in sorted(workdir.glob("runs/*/run.json")) if workdir else ():
            try:
                data = json.loads(run_json.read_text())
                spec = JobSpec.from_dict(data["spec"], recorded=True)
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if data.get("state") in FINAL_STATES and data.get("stalls") and _the_job(spec) == want:
                return run_json.parent
    return None


@pytest.mark.parametrize(
    "sid", sorted(s.id for s in BROKEN_HERE if s.id in BROKEN_BY_A_NOTEBOOK and not s.missing())
)
def test_a_lesson_s_broken_run_is_the_job_this_file_runs(sid, monkeypatch):
    """Where a notebook breaks a hang, its run is the one :func:`a_notebook_s_run` looks for:
    ``Lesson.run`` starts the catalogue's job, but for the stall timeout and the name."""
    scenario = get(sid)
    started: list[JobSpec] = []
    monkeypatch.setattr(Lesson, "_to_the_end", lambda self, spec: started.append(spec))
    Lesson(hang_after_s=7.0).run(scenario)
    assert _the_job(started[0]) == _the_job(scenario.spec(on_stall="stop"))
    assert started[0].stall_timeout_s == 7.0
