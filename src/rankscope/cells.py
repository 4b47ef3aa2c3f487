"""A cell on every rank: ranks that live across notebook cells, and which rank blocks a cell.

``%load_ext rankscope`` registers the magics (:class:`RanksMagics`)::

    %ranks start 3 [--timeout S] [--backend gloo|nccl|auto]   # 3 ranks, torch.distributed ready
    %%ranks            # the cell runs on every rank; %%ranks 0,2 on ranks 0 and 2
    %ranks status | wait [S] | interrupt | restart [--replay] [--timeout S] | stop

The ranks are IPython Parallel engines (``python -m ipyparallel.engine``) that a
:class:`~rankscope.launch.Job` starts under torchrun, so each is a rank as a script's would be:
torchrun's environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``PORT``, ``LOCAL_RANK``),
the probe installed by the bootstrap before anything else runs, the job's run directory, its
supervisor (the ranks end when the kernel does) and its stall watchdog. Only the controller that
routes cells to the engines is IPython Parallel's own (``ipcontroller``, one per session, under :mod:`rankscope.launch.tether`: it
ends with the kernel too).

A ``%%ranks`` cell returns at once: the kernel stays free while the ranks run it. Its output is
a live view, updated from a thread: every rank's state while it runs (the job's own panel),
then each rank's output and error apart, labelled; when the watchdog calls a stall (proven or
by timeout) or a rank dies, the diagnosis card of the run directory, whose sites name the cell
(``<cell 7>:3``: the cell's source is kept as the run directory's ``cells/<cell 7>``, see
:mod:`rankscope.probe.cells`).

A ``%%ranks`` cell has returned by the time it runs, so Kernel > Interrupt reaches it only
through ``%ranks wait`` (the interrupt is passed on) or ``%ranks interrupt``: the ranks still
running the cell get a KeyboardInterrupt, and the answer says which, and which wait inside a
collective (an interrupt cannot stop a call the backend holds: those need ``restart``). A rank
that the interrupt ends the cell on has finished the cell: where the others wait in a call it
did not make, that is the proof of a hang (see :mod:`rankscope.waitfor`).

``restart`` ends the ranks and starts new ones in a new run directory (an incarnation) in the
same session folder; each incarnation's directory stays readable by ``rankscope.load_run``,
``diagnose`` and ``show``. ``--replay`` runs again, in order, the cells that every rank of the
previous incarnation completed.
"""

from __future__ import annotations

import contextlib
import html
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankscope.launch import Job, JobSpec
from rankscope.launch.procs import pid_alive
from rankscope.launch.tracker import doing_now
from rankscope.rundir import FINAL_STATES, RunDir, new_run_dir, rank_records
from rankscope.state import agree, ranks_text

log = logging.getLogger(__name__)

#: The controller's id in the session's IPython profile: its engines' connection file is
#: ``<session>/ipython/security/ipcontroller-<id>-engine.json``.
CLUSTER_ID = "rankscope"
#: How often a running cell's view is redrawn.
LIVE_S = 0.5
#: A rank's output shown in a cell's view is its last this many characters: a cell that floods
#: from every rank keeps a view the browser can draw at every redraw.
OUTPUT_LIMIT = 20_000
#: A rank's output and traceback as code, in the notebook's code font (JupyterLab draws a
#: ``<pre>`` of HTML output in the text's font otherwise), its lines kept and wrapped.
RANK_PRE_CSS = (
    "margin:0 0 4px 0;font-family:var(--jp-code-font-family,monospace);"
    "font-size:var(--jp-code-font-size,0.9em);white-space:pre-wrap"
)


class CellsError(RuntimeError):
    """A cell session's action that cannot be done, said so that the user can act."""


@dataclass
class CellRun:
    """One cell sent to some ranks, and what came back."""

    cell: int
    ranks: list[int]
    result: Any  # ipyparallel.AsyncResult
    run: RunDir
    stalls_before: int
    replay: bool = False
    card: Any = None  # the Diagnosis, once a stall or a death was called
    note: str = ""
    ended: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    follower: threading.Thread | None = None  # the thread that redraws its view


class CellRanks:
    """N ranks that live across cells (see the module's docstring)."""

    def __init__(
        self,
        nproc: int,
        *,
        runs_root: str | Path = "runs",
        backend: str = "auto",
        stall_timeout_s: float = 10.0,
        startup_timeout_s: float = 180.0,
    ):
        if nproc < 1:
            raise ValueError(f"the number of ranks must be at least 1, got {nproc}")
        self.nproc = nproc
        self.backend = backend
        self.stall_timeout_s = stall_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.session = new_run_dir(runs_root, name="cells").path
        self.incarnation = 0
        self.job: Job | None = None
        self.engines: dict[int, int] = {}  # rank -> engine id
        self.history: list[CellRun] = []
        self._controller: subprocess.Popen[bytes] | None = None
        self._client: Any = None

    # --- starting and stopping --------------------------------------------------------------
    @property
    def run(self) -> RunDir:
        if self.job is None or self.job.run is None:
            raise CellsError("the ranks are not started: %ranks start N")
        return self.job.run

    def start(self) -> CellRanks:
        """Start the controller (once per session), then the ranks; returns when every rank
        has its process group."""
        import ipyparallel as ipp

        security = self.session / "ipython" / "security"
        if self._controller is None or self._controller.poll() is not None:
            with open(self.session / "controller.log", "ab") as out:
                self._controller = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "rankscope.launch.tether",
                        sys.executable,
                        "-m",
                        "ipyparallel.controller",
                        f"--profile-dir={self.session / 'ipython'}",
                        f"--cluster-id={CLUSTER_ID}",
                        "--ip=127.0.0.1",
                        "--IPController.use_threads=True",
                        "--log-level=WARN",
                    ],
                    stdin=subprocess.PIPE,  # its end closes when this process dies: see tether
                    stdout=out,
                    stderr=out,
                    start_new_session=True,
                )
        url = security / f"ipcontroller-{CLUSTER_ID}-engine.json"
        client_url = security / f"ipcontroller-{CLUSTER_ID}-client.json"
        _wait_for(
            lambda: url.exists() and client_url.exists(),
            60.0,
            f"the IPython Parallel controller wrote no {url.name} (see "
            f"{shown_path(self.session)}/controller.log)",
        )
        if self._client is None:
            self._client = ipp.Client(str(client_url), timeout=60)
        before = set(self._client.ids)
        previous = self.job.run.path.name if self.job is not None else None
        self.incarnation += 1
        spec = JobSpec(
            module="ipyparallel.engine",
            args=[f"--file={url}", "--IPEngine.enable_nanny=False", "--log-level=WARN"],
            nproc_per_node=self.nproc,
            backend=self.backend,  # type: ignore[arg-type]
            stall_timeout_s=self.stall_timeout_s,
            startup_timeout_s=self.startup_timeout_s,
            name=f"cells-{self.incarnation}",
        )
        self.job = Job(spec, runs_root=self.session).start()
        run = self.job.run
        assert run is not None
        run.cells.mkdir(exist_ok=True)
        run.cells_session.write_text(
            json.dumps(
                {
                    "session": self.session.name,
                    "incarnation": self.incarnation,
                    "previous": previous,
                }
            )
        )
        self.engines = self._new_engines(before)
        view = self._client[list(self.engines.values())]
        setup = view.execute(
            "import rankscope.probe.cells as __rankscope_cells\n__rankscope_cells.setup(globals())",
            block=False,
        )
        try:
            setup.get(timeout=self.startup_timeout_s)
        except ipp.TimeoutError:
            raise CellsError(
                f"the ranks did not initialise their process group in "
                f"{self.startup_timeout_s:.0f} s; see {shown_path(run.path)}/logs"
            ) from None
        return self

    def _new_engines(self, before: set[int]) -> dict[int, int]:
        """Wait for the new incarnation's engines; their ids by rank (torchrun's RANK)."""
        assert self.job is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            new = sorted(set(self._client.ids) - before)
            if len(new) >= self.nproc:
                break
            state = self.job.status()
            if state in FINAL_STATES:
                raise CellsError(
                    f"the ranks ended while starting ({state}); see {shown_path(self.job.run.path)}"  # type: ignore[union-attr]
                )
            if time.monotonic() > deadline:
                raise CellsError(
                    f"{len(new)} of {self.nproc} ranks connected after "
                    f"{self.startup_timeout_s:.0f} s; see {shown_path(self.job.run.path)}/logs"  # type: ignore[union-attr]
                )
            time.sleep(0.2)
        ranks = self._client[new].apply_sync(_rank_of_engine)
        return dict(sorted(zip(ranks, new, strict=True)))

    def stop(self) -> None:
        """End the ranks and the controller (what the session wrote stays)."""
        if self.job is not None and self.job.poll() is None:
            self.job.stop(grace_s=2.0, reason="cells_stop")
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None
        if self._controller is not None:
            self._controller.terminate()  # the tether ends the controller's process group
            try:
                self._controller.wait(10.0)
            except subprocess.TimeoutExpired:
                self._controller.kill()
                self._controller.wait(5.0)
            self._controller = None

    def restart(self, *, replay: bool = False) -> list[CellRun]:
        """End the ranks, start new ones (a new incarnation); with ``replay``, run again the
        cells every rank of the previous incarnation completed. Returns the replayed runs."""
        old = [c for c in self.history if c.run == self.run and _completed(c)]
        if self.job is not None and self.job.poll() is None:
            self.job.stop(grace_s=2.0, reason="cells_restart")
        # The dead engines leave the controller's list when their heartbeats stop.
        self.start()
        runs = []
        for old_run in old if replay else []:
            source = old_run.run.cell_source(old_run.cell).read_text()
            run = self.run_cell(old_run.cell, source, old_run.ranks, replay=True)
            run.result.wait(self.startup_timeout_s)
            _finish(self, run)
            runs.append(run)
            if not _completed(run):
                break
        return runs

    # --- cells ------------------------------------------------------------------------------
    def targets(self, text: str) -> list[int]:
        """``0,2`` or ``1-3`` or nothing (every rank) as a list of ranks."""
        text = text.strip()
        if not text or text == "all":
            return sorted(self.engines)
        ranks: set[int] = set()
        try:
            for part in text.split(","):
                lo, _, hi = part.strip().partition("-")
                ranks.update(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            raise CellsError(f"ranks {text!r}: write them as 0,2 or 1-3") from None
        unknown = sorted(ranks - set(self.engines))
        if unknown:
            raise CellsError(f"no rank {unknown} among ranks 0-{self.nproc - 1}")
        return sorted(ranks)

    def run_cell(
        self, cell: int, source: str, ranks: list[int] | None = None, *, replay: bool = False
    ) -> CellRun:
        """Send cell ``cell`` to ``ranks`` (every rank by default); returns at once."""
        if self.job is None or self.job.poll() is not None:
            raise CellsError(
                "the ranks are not running"
                + (f" ({self.job.status()})" if self.job is not None else "")
                + ": %ranks restart starts new ones (--replay runs the earlier cells again)"
            )
        run = self.run
        ranks = sorted(self.engines) if ranks is None else ranks
        path = run.cell_source(cell)
        path.write_text(source)
        _log(run, {"cell": cell, "ranks": ranks, "t": time.time(), "replay": replay})
        view = self._client[[self.engines[r] for r in ranks]]
        number = len(self.history)  # the probe's cell events name this run of the cell
        result = view.execute(
            f"__rankscope_cells.run_cell({str(path)!r}, globals(), {number})", block=False
        )
        cell_run = CellRun(
            cell=cell,
            ranks=ranks,
            result=result,
            run=run,
            stalls_before=len(self.job.stalls),
            replay=replay,
        )
        self.history.append(cell_run)
        return cell_run

    def follow(self, cell_run: CellRun, handle: Any) -> threading.Thread:
        """Redraw ``handle`` (an IPython display handle) with the cell's live view until it
        ends, a stall is called or the ranks die; in a thread, so the kernel stays free."""

        def loop() -> None:
            while not _finish(self, cell_run):
                with contextlib.suppress(Exception):
                    handle.update(CellView(self, cell_run))
                time.sleep(LIVE_S)
            with contextlib.suppress(Exception):
                handle.update(CellView(self, cell_run))

        thread = threading.Thread(target=loop, name=f"rankscope-cell-{cell_run.cell}", daemon=True)
        cell_run.follower = thread
        thread.start()
        return thread

    def interrupt(self) -> str:
        """Send a KeyboardInterrupt (SIGINT, which an engine takes as one while it runs a cell)
        to the ranks still running the latest cell; says which got it, and which wait inside a
        collective, where it cannot reach them until the call returns (those need a restart)."""
        last = next((c for c in reversed(self.history) if c.run == self.run), None)
        if last is None or last.result.ready():
            return "No cell runs on the ranks: nothing to interrupt."
        running = [
            r for r, md in zip(last.ranks, _per_rank(last), strict=True) if not md.get("completed")
        ]
        records = rank_records(self.run)
        sent = []
        for r in running:
            pid = records[r].pid if r in records else None
            if pid is not None and pid_alive(pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGINT)
                    sent.append(r)
        stuck = sorted(
            s["rank"]
            for s in self.job.ranks()
            if s["rank"] in sent and s.get("status") == "waiting"  # type: ignore[union-attr]
        )
        if not sent:
            return f"Cell [{last.cell}] runs on no live rank: nothing to interrupt."
        said = (
            f"Interrupted cell [{last.cell}]: KeyboardInterrupt sent to {ranks_text(sent)}, "
            "still running it."
        )
        if stuck:
            said += (
                f" {ranks_text(stuck).capitalize()} {agree(ranks_text(stuck), 'waits', 'wait')} "
                "inside a "
                "collective, which an interrupt cannot stop until the call returns: "
                "%ranks restart starts new ranks (--replay runs the earlier cells again)."
            )
        else:
            said += " The ranks stay up, with their state."
        _log(last.run, {"cell": last.cell, "interrupt": sent, "t": time.time()})
        return said

    def status_text(self) -> str:
        if self.job is None:
            return "no ranks"
        return (
            f"{self.nproc} rank{'' if self.nproc == 1 else 's'}, incarnation "
            f"{self.incarnation}: {self.job.status()} "
            f"(run {shown_path(self.job.run.path)})"  # type: ignore[union-attr]
        )


def _finish(ranks: CellRanks, cell_run: CellRun) -> bool:
    """Whether the cell's view is final: it ended on every rank, or a stall or a death was
    called (then the card is made, once)."""
    if cell_run.ended or cell_run.card is not None:
        return True
    job = ranks.job
    ours = job is not None and job.run == cell_run.run
    # A rank's death ends the incarnation (torchrun ends the others): the engines' results
    # come back as errors, so the death is looked at before the results.
    died = ours and job.poll() is not None  # type: ignore[union-attr]
    if ours and not died and cell_run.result.ready() and _a_rank_died(cell_run):
        with contextlib.suppress(TimeoutError):  # the supervisor's final state comes soon
            job.wait(15.0)  # type: ignore[union-attr]
        died = job.poll() is not None  # type: ignore[union-attr]
    if cell_run.result.ready() and not died:
        # The reply can come before the last output (two channels): the output ends at "idle".
        with contextlib.suppress(Exception):
            cell_run.result.wait_for_output(10.0)
        cell_run.ended = True
        failed = [r for r, e in zip(cell_run.ranks, _errors(cell_run), strict=True) if e]
        _log(cell_run.run, {"cell": cell_run.cell, "end": True, "t": time.time(),
                            "ok": not failed, "failed": failed})  # fmt: skip
        cell_run.done.set()
        return True
    if not ours:
        return False
    stalled = len(job.stalls) > cell_run.stalls_before  # type: ignore[union-attr]
    if not (stalled or died):
        return False
    import rankscope

    if died:
        job.wait(5.0)
    try:
        cell_run.card = rankscope.diagnose(rankscope.load_run(cell_run.run.path))
    except Exception as exc:  # the card is the answer; its failure is said, not hidden
        cell_run.note = f"the diagnosis failed: {type(exc).__name__}: {exc}"
        cell_run.card = False
    done = [
        r
        for r, md in zip(cell_run.ranks, _per_rank(cell_run), strict=True)
        if md.get("completed") and md.get("error") is None
    ]
    failure = cell_run.note
    cell_run.note = _stall_words(
        cell_run.cell,
        None if died else job.stalls[-1],
        done,
        ranks.stall_timeout_s,  # type: ignore[union-attr]
    ) + (f" ({failure})" if failure else "")
    cell_run.done.set()
    return True


def _stall_words(cell: int, stall: dict[str, Any] | None, done: list[int], timeout_s: float) -> str:
    """The state line of a cell whose ranks stalled (``stall``, the job's record of it) or
    died (None), as a sentence, with what to do next."""
    finished = f"; {ranks_text(done)} had finished it" if done else ""
    if stall is None:
        what = f"The ranks ended while cell [{cell}] ran{finished}."
    elif stall.get("proven"):
        what = f"Cell [{cell}] hangs, proven: {str(stall['proven']).rstrip('.')}."
    elif stall.get("kind") == "busy":
        what = (
            f"Cell [{cell}] is stalled: ranks have waited in a call for {timeout_s:g} s while "
            f"another works outside the collectives{finished}."
        )
    else:
        what = (
            f"Cell [{cell}] hangs: no rank completed a call for {timeout_s:g} s, the stall "
            f"timeout{finished}."
        )
    return f"{what} %ranks restart starts new ranks (--replay runs the earlier cells again)."


def shown_path(path: Path) -> str:
    """A run's folder as the user is shown it: relative to the working directory where it
    lies under it, else its name (never this machine's absolute path)."""
    with contextlib.suppress(ValueError):
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    return path.name


def _a_rank_died(cell_run: CellRun) -> bool:
    """Whether a target rank failed the cell and its process is gone (killed, crashed): the
    incarnation ends then, though the other ranks' errors may come first."""
    if not any(_errors(cell_run)):
        return False
    records = rank_records(cell_run.run)
    return any(r in records and not pid_alive(records[r].pid) for r in cell_run.ranks)


def _completed(cell_run: CellRun) -> bool:
    return cell_run.ended and not any(_errors(cell_run))


def _per_rank(cell_run: CellRun) -> list[dict[str, Any]]:
    """IPython Parallel's record of the cell on each target rank (output, error, completion),
    in the order of ``cell_run.ranks``."""
    metadata = cell_run.result.metadata
    return metadata if isinstance(metadata, list) else [metadata]  # one target: unwrapped


def _errors(cell_run: CellRun) -> list[str | None]:
    """Per target rank, its error's traceback as text, or None."""
    out: list[str | None] = []
    for md in _per_rank(cell_run):
        err = md.get("error")
        out.append(None if err is None else _error_text(err))
    return out


def _error_text(err: Any) -> str:
    tb = getattr(err, "traceback", None)
    if tb:
        return _strip_ansi(str(tb))
    return f"{getattr(err, 'ename', type(err).__name__)}: {getattr(err, 'evalue', err)}"


def _strip_ansi(text: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _rank_of_engine() -> int:
    import os

    return int(os.environ["RANK"])


def _log(run: RunDir, record: dict[str, Any]) -> None:
    run.cells.mkdir(exist_ok=True)
    with open(run.cells_log, "a") as f:
        f.write(json.dumps(record) + "\n")


def _wait_for(ok: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        if time.monotonic() > deadline:
            raise CellsError(f"{what} within {timeout_s:.0f} s")
        time.sleep(0.1)


class CellView:
    """What a ``%%ranks`` cell shows now: its state, every rank's output and error apart, and
    the card when a stall or a death was called. Renders itself (HTML and text), so a saved
    notebook keeps it."""

    def __init__(self, ranks: CellRanks, cell_run: CellRun):
        self.cell_run = cell_run
        c = cell_run
        self.header = f"cell {c.cell} on ranks {c.ranks}" + (" (replay)" if c.replay else "")
        if c.card is not None:
            self.state = c.note
        elif c.ended:
            failed = [r for r, e in zip(c.ranks, _errors(c), strict=True) if e]
            self.state = f"failed on ranks {failed}" if failed else "done on every rank"
        else:
            self.state = "running"
        self.live, self.live_text = "", []
        if not c.ended and c.card is None and ranks.job is not None:
            with contextlib.suppress(Exception):
                self.live = ranks.job._repr_html_()
                self.live_text = [
                    f"rank {s['rank']}: {doing_now(s) or s.get('status')}"
                    for s in ranks.job.ranks()
                ]
        self.outputs = _outputs(c)

    def __repr__(self) -> str:
        lines = [f"{self.header}: {self.state}", *self.live_text]
        for rank, text, error in self.outputs:
            if text or error:
                lines.append(f"--- rank {rank} ---")
                lines += [t for t in (text.rstrip("\n"), error) if t]
        card = self.cell_run.card
        if card:
            lines += ["", card.render()]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        parts = [
            f"<div class='rankscope-cell'><b>{html.escape(self.header)}</b>: "
            f"{html.escape(self.state)}</div>"
        ]
        if self.live:
            parts.append(self.live)
        for rank, text, error in self.outputs:
            if not (text or error):
                continue
            body = html.escape(text)
            if error:
                body += f"<span style='color:#d62728'>{html.escape(error)}</span>"
            parts.append(
                f"<div class='rankscope-rank'><b>rank {rank}</b>"
                f"<pre style='{RANK_PRE_CSS}'>{body}</pre></div>"
            )
        card = self.cell_run.card
        if card:
            parts.append(card._repr_html_())
        return "".join(parts)


def _outputs(cell_run: CellRun) -> list[tuple[int, str, str | None]]:
    """Per target rank: its stdout and stderr so far (and displayed values), and its error."""
    errors = _errors(cell_run) if cell_run.ended else [None] * len(cell_run.ranks)
    out = []
    for rank, md, error in zip(cell_run.ranks, _per_rank(cell_run), errors, strict=True):
        text = md.get("stdout", "") + md.get("stderr", "")
        for o in md.get("outputs", []):
            data = getattr(o, "data", None) or (o.get("data") if isinstance(o, dict) else None)
            if data and "text/plain" in data:
                text += data["text/plain"] + "\n"
        result_data = (md.get("execute_result") or {}).get("data") or {}
        if "text/plain" in result_data:
            text += result_data["text/plain"] + "\n"
        if len(text) > OUTPUT_LIMIT:
            cut = len(text) - OUTPUT_LIMIT
            text = f"[{cut} characters of output before these left out]\n" + text[cut:]
        out.append((rank, text, error))
    return out


class RanksMagics:
    """``%ranks`` and ``%%ranks`` (see the module's docstring); one session per kernel."""

    def __init__(self, shell: Any):
        self.shell = shell
        self.ranks: CellRanks | None = None

    def line(self, line: str) -> Any:
        args = shlex.split(line)
        if not args:
            raise CellsError(
                "%ranks start N | status | wait [S] | interrupt | restart [--replay] [--timeout S] "
                "| stop"
            )
        command, rest = args[0], args[1:]
        if command == "start":
            return self._start(rest)
        if self.ranks is None:
            raise CellsError("no ranks yet: %ranks start N")
        if command == "status":
            print(self.ranks.status_text())
            return self.ranks.job
        if command == "stop":
            self.ranks.stop()
            print(f"ranks stopped; their runs stay in {shown_path(self.ranks.session)}")
            self.ranks = None
            return None
        if command == "restart":
            if "--timeout" in rest:  # the new ranks' stall timeout
                at = rest.index("--timeout") + 1
                try:
                    self.ranks.stall_timeout_s = float(rest[at])
                except (IndexError, ValueError):
                    raise CellsError("%ranks restart [--replay] [--timeout S]") from None
            replayed = self.ranks.restart(replay="--replay" in rest)
            print(self.ranks.status_text())
            for run in replayed:
                print(repr(CellView(self.ranks, run)))
            return None
        if command == "interrupt":
            print(self.ranks.interrupt())
            return None
        if command == "wait":
            timeout = float(rest[0]) if rest else None
            last = self.ranks.history[-1] if self.ranks.history else None
            try:
                if last is not None and not last.done.wait(timeout):
                    print(f"cell [{last.cell}] still runs after {timeout:g} s")
                elif last is not None and last.follower is not None:
                    # its view's last redraw is sent (slow on a loaded machine)
                    last.follower.join(30.0)
            except KeyboardInterrupt:  # Kernel > Interrupt while waiting: passed on to the ranks
                print(self.ranks.interrupt())
            return None
        raise CellsError(
            f"%ranks {command}: unknown; use start, status, wait, interrupt, restart or stop"
        )

    def _start(self, args: list[str]) -> Any:
        if self.ranks is not None and self.ranks.job is not None and self.ranks.job.poll() is None:
            raise CellsError("the ranks are already started: %ranks restart, or %ranks stop")
        options = {"--timeout": 10.0, "--backend": "auto", "--runs": "runs"}
        n = None
        it = iter(args)
        for a in it:
            if a in options:
                options[a] = next(it, None)  # type: ignore[assignment]
            elif n is None and a.isdigit():
                n = int(a)
            else:
                raise CellsError(f"%ranks start: {a!r} not understood")
        if n is None:
            raise CellsError("%ranks start N [--timeout S] [--backend gloo|nccl|auto]")
        self.ranks = CellRanks(
            n,
            runs_root=str(options["--runs"]),
            backend=str(options["--backend"]),
            stall_timeout_s=float(options["--timeout"]),  # type: ignore[arg-type]
        ).start()
        print(self.ranks.status_text())
        return None

    def cell(self, line: str, cell: str) -> None:
        from IPython.display import display

        if self.ranks is None:
            raise CellsError("no ranks yet: %ranks start N")
        # IPython counts the cell in before running it: In [N] runs while the count is N + 1.
        number = int(self.shell.execution_count) - 1
        cell_run = self.ranks.run_cell(number, cell, self.ranks.targets(line))
        handle = display(CellView(self.ranks, cell_run), display_id=True)
        self.ranks.follow(cell_run, handle)


def load_ipython_extension(shell: Any) -> None:
    """``%load_ext rankscope``: register ``%ranks`` and ``%%ranks``."""
    from IPython.core.error import UsageError

    magics = RanksMagics(shell)

    def said(method: Any) -> Any:
        # What the user can act on is one line (IPython's UsageError), not a traceback.
        def magic(*args: Any) -> Any:
            try:
                return method(*args)
            except (CellsError, ValueError) as exc:
                raise UsageError(str(exc)) from None

        return magic

    shell.register_magic_function(said(magics.line), "line", "ranks")
    shell.register_magic_function(said(magics.cell), "cell", "ranks")
    shell._rankscope_cells = magics
