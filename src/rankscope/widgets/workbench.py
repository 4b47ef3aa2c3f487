"""The workbench: launch jobs, watch every rank live, and see what went wrong when one freezes."""

from __future__ import annotations

import contextlib
import html
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ipywidgets as widgets
from IPython.display import display as ipy_display

from rankscope.analyze import Diagnosis, diagnose, write_diagnosis
from rankscope.collect import Run, load_run
from rankscope.collect.debug_server import fetch_debug_server
from rankscope.launch import Job
from rankscope.rundir import FINAL_STATES, RunDir, RunDirError, new_run_dir
from rankscope.state import ends_text
from rankscope.widgets._common import guarded, report, report_failure
from rankscope.widgets.form import LaunchForm
from rankscope.widgets.live import NO_JOB, LivePanel
from rankscope.widgets.results import ResultsPanel

#: Job states that call for a diagnosis as soon as the workbench sees them.
DIAGNOSE_ON = frozenset({"stalled", *FINAL_STATES})


def _capture_said(manifest: dict[str, Any]) -> str:
    """A capture's status line: its id, who answered and how fast, what py-spy did."""
    ranks = manifest["ranks"]
    answered = sum(1 for info in ranks.values() if info.get("via"))
    spied = sum(1 for info in ranks.values() if info.get("pyspy") == "ok")
    missing = manifest.get("missing") or []
    text = (
        f"capture {manifest['id']}: {answered} of {len(ranks)} ranks answered in "
        f"{manifest['duration_s']:.2f} s (stacks and flight recorder; py-spy on {spied})"
    )
    return text + (f"; no answer from ranks {missing}" if missing else "")


def _ends(job: Job) -> str:
    """How each rank ended, ranks alike together (the words of every view)."""
    return ends_text({r["rank"]: r.get("end") or "" for r in job.ranks()})


def _diagnosis_said(d: Diagnosis) -> str:
    when = time.strftime("%H:%M:%S", time.localtime(d.diagnosed_at))
    return f"diagnosed at {when}: {d.verdict}" + (f": {d.cause_title}" if d.cause else "")


def _created(run: RunDir) -> float:
    """When the run was created (run.json), for listing runs in launch order."""
    try:
        return float(run.read_run().get("created_at") or 0.0)
    except (RunDirError, TypeError, ValueError):
        return 0.0


def _freeze(widget: widgets.Widget) -> None:
    """Disable every control under ``widget``: a closed workbench has no kernel side."""
    if hasattr(widget, "disabled"):
        widget.disabled = True
    for child in getattr(widget, "children", ()):
        _freeze(child)


@dataclass
class _Entry:
    """One job of the list and what the workbench knows about it."""

    job: Job
    state: str = ""
    auto_diagnose: bool = False
    """Seen running by this workbench: it is diagnosed when it first stalls or ends."""
    diagnosis: Diagnosis | None = None
    run: Run | None = None
    said: str = ""
    """What the last of Stop, Capture and Diagnose did to this job (the live panel's status
    line while it is selected)."""


class Workbench(widgets.VBox):
    """Launch torchrun jobs, watch every rank live, and diagnose them, all without blocking the
    kernel: jobs start, refresh, stop, capture and diagnose on background threads.

    A job that stalls or ends is diagnosed at once; the results area then shows the culprit
    ranks, the collective where the ranks parted and the timeline. Run directories already under
    ``runs_root`` are listed too (re-attached), so the workbench picks up where it was after a
    kernel restart.

    Attributes:
        form: the :class:`LaunchForm`.
        jobs: the list of jobs (newest last); selecting one shows it.
        live: the :class:`LivePanel` of the selected job.
        results: the :class:`ResultsPanel` of the selected job.
        errors: what went wrong in the background (the refresh, re-attaching runs); each control's
            own errors are shown beside it (``form.errors``, ``live.errors``,
            ``attach_errors``, ``results.errors``, ``results.table_errors``).

    Args:
        runs_root: where new run directories go, and where existing ones are re-attached from.
        refresh_s: seconds between refreshes of the live panel.
        attach: list the run directories already under ``runs_root``.
    """

    def __init__(
        self,
        *,
        runs_root: str | os.PathLike[str] = "runs",
        refresh_s: float = 1.0,
        attach: bool = True,
    ) -> None:
        if refresh_s <= 0:
            raise ValueError(f"refresh_s must be positive, got {refresh_s}")
        self.runs_root = Path(runs_root)
        self.refresh_s = refresh_s
        self.errors = widgets.Output()
        self.form = LaunchForm()
        self.jobs = widgets.Select(options=[], rows=4, description="jobs", layout={"width": "70%"})
        self.attach_to = widgets.Text(
            placeholder="a run directory, or http://HOST:PORT of torch's debug server",
            description="attach",
            layout={"width": "60%"},
        )
        self.attach_button = widgets.Button(description="Attach", icon="link")
        self.attach_errors = widgets.Output()
        self.live = LivePanel()
        self.results = ResultsPanel()
        self._entries: list[_Entry] = []
        self._lock = threading.RLock()
        self._relabelling = False
        self._last_error: str | None = None
        self._live_job: Job | None = None
        self._kept: Diagnosis | None = None  # the diagnosis last left as plain output
        # One worker: actions run in the order they were asked for (launches list in click order).
        self._actions = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rankscope-action")
        self._closing = threading.Event()
        self.form.launch.on_click(lambda _: guarded(self.form.errors, self.launch)())
        self.live.stop.on_click(lambda _: guarded(self.live.errors, self.stop)())
        self.live.capture.on_click(lambda _: guarded(self.live.errors, self.capture)())
        self.live.diagnose.on_click(lambda _: guarded(self.live.errors, self.diagnose)())
        self.jobs.observe(lambda change: guarded(self.errors, self._select)(change), names="value")
        self.attach_button.on_click(
            lambda _: guarded(self.attach_errors, self.attach_any)(self.attach_to.value.strip())
        )
        super().__init__(
            [
                widgets.HTML("<h3 style='margin:0'>rankscope workbench</h3>"),
                self.form,
                widgets.HBox([self.attach_to, self.attach_button, self.attach_errors]),
                self.jobs,
                self.live,
                self.results,
                self.errors,
            ]
        )
        if attach:
            self.attach_all()
        self._refresher = threading.Thread(
            target=self._refresh_loop, name="rankscope-workbench-refresh", daemon=True
        )
        self._refresher.start()

    # --- the public API the buttons call ---------------------------------------------------
    def launch(self) -> Future[Job]:
        """Start the job the form describes, in the background; the future holds the Job.

        Raises:
            ValueError: the form is incomplete or invalid (checked before anything starts).
        """
        spec = self.form.spec()
        detached = self.form.detached.value
        with self._lock:
            self.jobs.value = None  # the panel shows the new job, never the last one meanwhile
            self.live.clear(f"<i>launching {html.escape(str(spec.script))}</i>")
        future = self._submit(
            lambda: self._add(
                Job(spec, runs_root=self.runs_root, detached=detached).start(), select=True
            ),
            errors=self.form.errors,
        )
        future.add_done_callback(lambda f: f.exception() and self.live.clear(NO_JOB))
        return future

    def attach(self, run_dir: str | os.PathLike[str]) -> Job:
        """List and select the job of a run directory (a live one is watched again)."""
        return self._add(Job.attach(run_dir), select=True)

    def attach_any(self, where: str) -> Future[Any]:
        """What the attach field holds: a run directory (a job rankscope started, or one whose
        probes write there) is listed and followed live; the URL of torch's debug server
        (a job with no probe) is read now, every rank's stacks and flight recorder fetched into
        a folder under ``runs_root``, and that folder diagnosed and shown. Attach again for a
        newer look.

        Raises:
            ValueError: the field is empty.
        """
        if not where:
            raise ValueError("enter a run directory or the URL of a torch debug server")
        if where.startswith(("http://", "https://")):
            return self._submit(self._attach_url, where, errors=self.attach_errors)
        return self._submit(self.attach, where, errors=self.attach_errors)

    def _attach_url(self, url: str) -> Diagnosis:
        folder = new_run_dir(self.runs_root, name="attach").path
        try:
            fetch_debug_server(url, folder)
        except ValueError:
            shutil.rmtree(folder, ignore_errors=True)  # nothing of use came
            raise
        with self._lock:
            self.jobs.value = None  # the results area shows the fetched folder, not a job
        return self.results.load(folder, now=time.time())

    def attach_all(self) -> list[Job]:
        """List every run directory under ``runs_root``, oldest first; one that cannot be read
        is reported in ``errors`` and skipped."""
        runs = [RunDir(p) for p in self.runs_root.iterdir()] if self.runs_root.is_dir() else []
        found = []
        for run in sorted((r for r in runs if r.is_run()), key=_created):
            try:
                found.append(self._add(Job.attach(run.path), select=False))
            except Exception as exc:
                report(self.errors, exc)
        return found

    @property
    def selected(self) -> Job | None:
        """The job shown in the live panel and the results area."""
        entry = self._selected_entry()
        return entry.job if entry else None

    def stop(self) -> Future[int]:
        """Stop the selected job in the background; the future holds its exit code."""
        entry = self._require_selected()
        job = entry.job
        self._say(entry, "<i>stopping: SIGTERM to every rank, SIGKILL after the grace period</i>")
        return self._submit(
            job.stop,
            entry=entry,
            done=lambda code: f"stopped {job.run.path.name}: {_ends(job)}",
        )

    def capture(self) -> Future[dict[str, Any]]:
        """Capture evidence from every rank of the selected job now; the future holds the
        capture's manifest."""
        entry = self._require_selected()
        self._say(entry, "<i>capturing evidence from every rank</i>")
        return self._submit(entry.job.capture, entry=entry, done=_capture_said)

    def diagnose(self) -> Future[Diagnosis]:
        """Diagnose the selected job in the background and show the result."""
        entry = self._require_selected()
        self._say(entry, "<i>diagnosing</i>")
        return self._submit(self._diagnose, entry, entry=entry, done=_diagnosis_said)

    # --- for scripts and notebooks ---------------------------------------------------------
    def wait_for_diagnosis(self, *, timeout_s: float = 120.0) -> Diagnosis:
        """Block until the selected job has a diagnosis (it stalled or ended); return it.

        Meant for notebooks driven from code; the UI itself never waits.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            entry = self._selected_entry()
            if entry is not None and entry.diagnosis is not None:
                return entry.diagnosis
            time.sleep(0.1)
        raise TimeoutError(f"no diagnosis within {timeout_s} s (is the job still running fine?)")

    def stop_all(self, *, grace_s: float = 2.0, keep: bool = True) -> None:
        """Stop every job of the list that still runs; return when they have stopped. With
        ``keep``, what the results area shows stays in this cell's output (see :meth:`keep`)."""
        for entry in list(self._entries):
            if entry.job.poll() is None:
                entry.job.stop(grace_s=grace_s)
        if keep:
            self.keep()

    def keep(self) -> None:
        """Leave what the results area shows in the output of the cell that calls this, as plain
        outputs (the card, with when and from what it was diagnosed, the timeline, the ranks):
        a saved notebook shows the answer without any widget behind it. A diagnosis already
        left is not left twice (``stop_all`` then ``close``)."""
        diagnosis = self.results.diagnosis
        if diagnosis is None or diagnosis is self._kept:
            return
        for output in self.results.static():
            ipy_display(output["data"], raw=True)
        self._kept = diagnosis

    def close(self, *, keep: bool = True) -> None:
        """Stop refreshing and finish pending actions; jobs keep running (see ``stop_all``).

        With ``keep``, the workbench stays on screen as it last was, its controls disabled, the
        live panel showing the selected job's final state; and what the results area showed
        stays in the output of the cell that closes it (:meth:`keep`), for a saved notebook.
        Without, its widgets are removed. Closing again does nothing.
        """
        if self._closing.is_set():
            return
        self._closing.set()
        self._refresher.join(timeout=10)
        self._actions.shutdown(wait=True)
        if not keep:
            super().close()
            return
        entry = self._selected_entry()
        if entry is not None:
            with contextlib.suppress(Exception):  # the last look; a job gone leaves the one before
                self.live.update(entry.job)
        _freeze(self)
        self.keep()

    def __del__(self) -> None:
        # Garbage collection (or the interpreter's end) is no cell to leave a snapshot in.
        with contextlib.suppress(Exception):
            self.close(keep=False)

    # --- internals -------------------------------------------------------------------------
    def _submit(
        self,
        action: Callable[..., Any],
        *args: Any,
        errors: widgets.Output | None = None,
        entry: _Entry | None = None,
        done: Callable[[Any], str] | None = None,
    ) -> Future[Any]:
        """Run ``action`` on the action thread; its failure is shown in ``errors`` (beside the
        control that asked for it; the workbench's own by default). An action on a job's
        ``entry`` (Stop, Capture, Diagnose) reports beside the live panel's buttons, and
        ``done`` says in that job's status line what it did."""
        future = self._actions.submit(action, *args)
        if entry is not None:
            errors = self.live.errors
        future.add_done_callback(lambda f: report_failure(errors or self.errors, f))
        if entry is not None and done is not None:

            def said(f: Future[Any]) -> None:
                text = html.escape(done(f.result())) if f.exception() is None else ""
                self._say(entry, text)

            future.add_done_callback(said)
        return future

    def _add(self, job: Job, *, select: bool) -> Job:
        """List ``job`` (and ``select`` it); a running one is diagnosed when it stalls or ends."""
        state = job.status()
        entry = _Entry(job=job, state=state, auto_diagnose=state not in DIAGNOSE_ON)
        # A job this process follows says when it stalls, its evidence in: diagnose it then
        # rather than at the next refresh. (Others are seen stalled by the refresh.)
        job.on_stall_callbacks.append(lambda job, stall: self._auto_diagnose(entry))
        with self._lock:
            self._entries.append(entry)
            self._relabel()
            if select:
                self.jobs.value = len(self._entries) - 1
        return job

    def _selected_entry(self) -> _Entry | None:
        index = self.jobs.value
        return None if index is None else self._entries[index]

    def _require_selected(self) -> _Entry:
        entry = self._selected_entry()
        if entry is None:
            raise ValueError("no job selected: launch one or pick one in the list")
        return entry

    def _say(self, entry: _Entry, text: str) -> None:
        """``entry``'s status line: shown beside the buttons while it is the job selected."""
        with self._lock:
            entry.said = text
            if entry is self._selected_entry():
                self.live.status.value = text

    def _relabel(self) -> None:
        """Job labels carry the state; keep the selection while options are replaced."""
        with self._lock:
            current = self.jobs.value
            self._relabelling = True
            try:
                self.jobs.options = [
                    (f"{e.job.run.path.name} · {e.state}", i) for i, e in enumerate(self._entries)
                ]
                self.jobs.value = current
            finally:
                self._relabelling = False

    def _select(self, change: dict[str, Any]) -> None:
        if self._relabelling or change["new"] is None:
            return
        entry = self._entries[change["new"]]
        self.live.status.value = entry.said  # this job's status line, not the last job's
        self.live.errors.outputs = ()
        self.live.culprits = set(entry.diagnosis.culprit_ranks) if entry.diagnosis else set()
        if entry.diagnosis is not None:
            self._submit(self.results.show, entry.run, entry.diagnosis)
        elif entry.state in DIAGNOSE_ON:
            self._submit(self._diagnose, entry)
        else:
            self.results.clear()

    def _diagnose(self, entry: _Entry) -> Diagnosis:
        live = entry.job.poll() is None
        run = load_run(entry.job.run.path)
        d = diagnose(run)
        write_diagnosis(entry.job.run, d)
        if entry is self._selected_entry():
            self.results.show(run, d, now=time.time() if live else None)
            self.live.culprits = set(d.culprit_ranks)
            self.live.update(entry.job)
        # Set last: wait_for_diagnosis() returns once the results area shows it.
        entry.run, entry.diagnosis = run, d
        return d

    def _auto_diagnose(self, entry: _Entry) -> None:
        """Diagnose a job seen running, once, when it first stalls or ends."""
        with self._lock:
            if not entry.auto_diagnose:
                return
            entry.auto_diagnose = False
        self._submit(self._diagnose, entry)

    def _refresh_loop(self) -> None:
        while not self._closing.wait(self.refresh_s):
            try:
                self._refresh()
            except Exception as exc:
                # A failure that repeats every refresh is shown once, not once a second.
                if repr(exc) != self._last_error:
                    self._last_error = repr(exc)
                    report(self.errors, exc)
            else:
                self._last_error = None

    def _refresh(self) -> None:
        changed = False
        for entry in list(self._entries):
            if entry.state in FINAL_STATES:
                continue
            state = entry.job.status()
            if state != entry.state:
                entry.state, changed = state, True
                if state in DIAGNOSE_ON:
                    self._auto_diagnose(entry)
        if changed:
            self._relabel()
        entry = self._selected_entry()
        if entry is not None and (
            entry.state not in FINAL_STATES or changed or entry.job is not self._live_job
        ):
            self.live.update(entry.job)
            self._live_job = entry.job
