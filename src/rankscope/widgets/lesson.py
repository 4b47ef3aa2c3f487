"""What the guided notebooks share: run a catalogue scenario broken, then fixed, and show what
rankscope makes of each.

A notebook makes one :class:`Lesson` in its first cell; every job it starts goes into the
lesson's run folder and list, so the last cell can check that none is left running::

    lesson = Lesson(hang_after_s=6.0)
    s = get("d21")
    show_lines(s, 41, 51)              # the lines that go wrong
    hung, panel = lesson.break_it(s)   # the broken run, its results area and its diagnosis
    fixed = lesson.verify(s)           # the fixed run: every rank exits 0
    lesson.all_ended()
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from IPython.display import display

from rankscope.analyze import diagnose
from rankscope.collect import Run, load_run
from rankscope.launch import Job, JobSpec
from rankscope.scenarios import Scenario
from rankscope.widgets import ResultsPanel, show

#: ``verdict="catalogue"`` (the default): the diagnosis the catalogue expects of the scenario,
#: its verdict, and its cause and culprit ranks where the catalogue names them.
CATALOGUE = "catalogue"
_DEFAULT = object()


class Lesson:
    """The jobs of one notebook.

    Args:
        hang_after_s: the stall timeout of a broken run: that long without a completed
            collective while a rank waits in one, and the watchdog captures and stops the job
            (None: the scenario's own).
        runs: where the run directories go.
        presets: the evidence presets of every run (the scenario's own when None).
        verdict: what :meth:`break_it` expects of a broken run unless told otherwise: a
            verdict, a tuple of verdicts, :data:`CATALOGUE`, or None for no check.
        wait_s: how long a run may take before it is stopped.
    """

    def __init__(
        self,
        *,
        hang_after_s: float | None = 6.0,
        runs: str | os.PathLike[str] = "runs",
        presets: Sequence[str] | None = None,
        verdict: str | tuple[str, ...] | None = CATALOGUE,
        wait_s: float = 120.0,
    ):
        self.hang_after_s = hang_after_s
        self.runs = Path(runs)
        self.presets = None if presets is None else tuple(presets)
        self.verdict = verdict
        self.wait_s = wait_s
        self.jobs: list[Job] = []
        # A Jupyter kernel asks child processes for coloured output (FORCE_COLOR,
        # CLICOLOR_FORCE), and py-spy, which the watchdog runs on the ranks, obeys; rankscope
        # reads its dumps as plain text.
        for name in ("FORCE_COLOR", "CLICOLOR_FORCE"):
            os.environ.pop(name, None)

    def start(self, spec: JobSpec) -> Job:
        """Start a job of this lesson (in the background)."""
        job = Job(spec, runs_root=self.runs)
        self.jobs.append(job.start())
        return job

    def run(
        self, scenario: Scenario, *, fix: bool = False, extra: Sequence[str] = (), **spec: Any
    ) -> Job:
        """Run a scenario to its end, print how it ended, and return the finished job.

        A run that hangs is caught by the stall watchdog: it captures evidence from every rank,
        then stops the job. A fixed run gets a long stall timeout: it should never stall, and a
        busy machine must not make it look as if it had. ``extra``: script arguments besides
        the catalogue's (and ``--fix``).
        """
        settings: dict[str, Any] = {"backend": "gloo", "on_stall": "stop"}
        stall = 30.0 if fix else self.hang_after_s
        if stall is not None:
            settings["stall_timeout_s"] = stall
        if self.presets is not None:
            settings["presets"] = self.presets
        if extra:
            fix_flag = ["--fix"] if fix and scenario.fix_flag else []
            settings["args"] = [*scenario.args, *extra, *fix_flag]
        settings.update(spec)
        return self._to_the_end(scenario.spec(fix=fix, **settings))

    def run_script(self, script: str | os.PathLike[str], **spec: Any) -> Job:
        """Run a script of the notebook's own to its end (3 ranks, gloo, the lesson's stall
        timeout, stopped once its evidence is captured), print how it ended, and return the
        finished job. ``spec``: :class:`~rankscope.launch.JobSpec` settings over those."""
        settings: dict[str, Any] = {"nproc_per_node": 3, "backend": "gloo", "on_stall": "stop"}
        if self.hang_after_s is not None:
            settings["stall_timeout_s"] = self.hang_after_s
        if self.presets is not None:
            settings["presets"] = self.presets
        settings.update(spec)
        return self._to_the_end(JobSpec(script=str(script), **settings))

    def _to_the_end(self, spec: JobSpec) -> Job:
        job = self.start(spec)
        try:
            job.wait(timeout=self.wait_s)
        finally:
            job.stop(grace_s=1.0)  # a no-op once the job has ended; never leaves one running
        self.outcome(job)
        return job

    @staticmethod
    def outcome(job: Job) -> None:
        """One line: how the job ended, its exit code, and how long it took."""
        info = job.info()
        how = {"stopped": "stopped by the watchdog", "exited": "ended on its own"}
        took = (info.get("ended_at") or 0) - info["created_at"]
        print(
            f"{job.run.path.name}: {how.get(info['state'], info['state'])}, "  # type: ignore[union-attr]
            f"exit code {job.poll()}, {took:.1f} s"
        )

    def break_it(
        self, scenario: Scenario, *, verdict: Any = _DEFAULT, **spec: Any
    ) -> tuple[Job, ResultsPanel]:
        """Run the broken scenario; show the workbench's results area and the diagnosis as
        text. The run must fail, with the verdict expected (see :class:`Lesson`)."""
        job = self.run(scenario, **spec)
        panel = self.results(job)
        d = panel.diagnosis
        assert d is not None
        want = self.verdict if verdict is _DEFAULT else verdict
        if want == CATALOGUE:
            wrong = scenario.wrong(d)
            assert not wrong, "; ".join(wrong)
        elif isinstance(want, str):
            assert d.verdict == want, d.summary
        elif want is not None:
            assert d.verdict in want, d.summary
        return job, panel

    @staticmethod
    def results(job: Job) -> ResultsPanel:
        """Show a broken run's results area and its diagnosis as text; the run must have
        failed."""
        panel = show(job.run.path)  # type: ignore[union-attr]
        display(panel)
        assert panel.diagnosis is not None
        print(panel.diagnosis.render())
        assert job.poll() != 0, "the broken run should fail"
        return panel

    def verify(self, scenario: Scenario, **spec: Any) -> Job:
        """Run the scenario fixed: every rank must exit 0. Prints the run's diagnosis."""
        fixed = self.run(scenario, fix=True, **spec)
        print(diagnose(fixed.run.path).render())  # type: ignore[union-attr]
        assert fixed.poll() == 0, f"the fixed run exited with {fixed.poll()}"
        return fixed

    def all_ended(self) -> None:
        """Check that every job of the lesson has ended."""
        assert all(job.poll() is not None for job in self.jobs)
        print(f"{len(self.jobs)} jobs started, all ended")


def show_lines(
    script: Scenario | str | os.PathLike[str], first: int | str = 1, last: int | str = -1
) -> None:
    """Lines of a scenario's script (or of any script), numbered as stacks and the diagnosis
    number them: from line ``first`` to line ``last`` (-1: the last line), or from the first
    line containing the text ``first`` to the next one containing ``last``."""
    path = script.path if isinstance(script, Scenario) else Path(script)
    lines = path.read_text().splitlines()
    start = first - 1 if isinstance(first, int) else _find(lines, first, 0)
    if isinstance(last, str):
        end = _find(lines, last, start)
    else:
        end = len(lines) - 1 if last == -1 else last - 1
    print(f"# {path.name}")
    for i in range(start, end + 1):
        print(f"{i + 1:3}  {lines[i]}")


def line_of(script: Scenario | str | os.PathLike[str], text: str) -> str:
    """``file.py:N`` of the first line of the script containing ``text``, as the diagnosis
    names a line."""
    path = script.path if isinstance(script, Scenario) else Path(script)
    return f"{path.name}:{_find(path.read_text().splitlines(), text, 0) + 1}"


def needs(*packages: str) -> bool:
    """Whether every package can be imported here. Where one cannot, one line says so and how
    to install it: the notebook skips the part that needs it."""
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    if missing:
        print(
            f"skipped: this part needs {', '.join(missing)}, not installed here "
            "(pip install -e '.[frameworks]')"
        )
    return not missing


def _find(lines: list[str], text: str, start: int) -> int:
    try:
        return next(i for i in range(start, len(lines)) if text in lines[i])
    except StopIteration:
        raise ValueError(f"no line containing {text!r} after line {start + 1}") from None


def where(tables: Run) -> pd.DataFrame:
    """The stack summary to group ranks by: py-spy's rows when the run has any (they show
    every rank the same way, native frames included), else faulthandler's."""
    summary = tables.stack_summary
    spy = summary[summary["tool"] == "py-spy"]
    return spy if len(spy) else summary


def printed(job: Job, tag: str) -> pd.DataFrame:
    """The JSON objects the ranks printed after ``tag`` (``tag {...}`` lines of stdout), one
    row per line, from the run's logs table."""
    logs = load_run(job.run.path).logs  # type: ignore[union-attr]
    text = logs.loc[logs["stream"] == "stdout", "text"].dropna()
    rows = [json.loads(line[len(tag) + 1 :]) for line in text if line.startswith(tag + " ")]
    assert rows, f"no '{tag}' line in {job.run.path.name}"  # type: ignore[union-attr]
    table = pd.DataFrame(rows)
    return table.sort_values("rank", ignore_index=True) if "rank" in table else table
