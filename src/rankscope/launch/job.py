"""A running job (torchrun, or another launcher): start it without blocking, watch every rank,
stop it, re-attach."""

from __future__ import annotations

import atexit
import contextlib
import html
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from rankscope import _warm
from rankscope import state as jobstate
from rankscope.launch import slurm
from rankscope.launch.capture import capture_evidence
from rankscope.launch.procs import pid_alive, terminate
from rankscope.launch.spec import JobSpec, free_port, launch_commands, launch_files
from rankscope.launch.tracker import RankTracker, busy_text, doing_now, exit_text
from rankscope.launch.watchdog import Watchdog
from rankscope.rundir import (
    FINAL_STATES,
    RunDir,
    RunDirError,
    claim_run_dir,
    new_run_dir,
    rank_records,
    rank_summaries,
)
from rankscope.waitfor import Proof

log = logging.getLogger(__name__)


class NotStartedHere(ValueError):
    """An action that needs the job to be rankscope's own (stopping it) on a job that its
    probes follow but another launcher started."""


class Job:
    """A job in the background, started by the spec's launcher (torchrun by default).

    ``Job(spec).start()`` returns at once. The job lives in its own run directory; ``attach``
    picks it up again from another process (a restarted notebook kernel). Unless started with
    ``detached=True`` the job is stopped when the process that started it exits or dies.
    """

    def __init__(
        self,
        spec: JobSpec,
        *,
        run_dir: str | os.PathLike[str] | None = None,
        runs_root: str | os.PathLike[str] = "runs",
        detached: bool = False,
    ):
        self.spec = spec
        self.detached = detached
        self._run_dir_arg = run_dir
        self._runs_root = runs_root
        self.run: RunDir | None = None
        self._sup: subprocess.Popen[bytes] | _warm.Started | None = None
        self._tracker: RankTracker | None = None
        self._watchdog: Watchdog | None = None
        self._stopper: threading.Thread | None = None  # the stop a stall started (policy "stop")
        self._lock = threading.Lock()
        self.stalls: list[dict[str, Any]] = []
        self.on_stall_callbacks: list[Any] = []

    def __repr__(self) -> str:
        where = self.run.path.name if self.run else "not started"
        return f"<Job {where} {self.status() if self.run else ''}>"

    #: Columns of :meth:`ranks` a notebook shows.
    GLANCE = ("rank", "node", "status", "step", "done", "now", "last_done", "end")

    def _repr_html_(self) -> str:
        """The job's live state in a notebook: its run, its state, and every rank now."""
        if self.run is None:
            return f"<div class='rankscope-job'>job of {html.escape(str(self.spec.script))}: not started</div>"
        self.status()  # reconciles a job whose supervisor vanished
        rows = self.ranks()
        cells = "".join(f"<th>{HEADERS.get(c, c)}</th>" for c in self.GLANCE)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in _glance(r)) + "</tr>"
            for r in rows
        )
        stalls = f", {len(self.stalls)} stall(s) caught" if self.stalls else ""
        return (
            f"<div class='rankscope-job'><div><b>{html.escape(self.run.path.name)}</b>: "
            f"{html.escape(state_text(self.info(), rows))}{stalls} "
            f"({html.escape(str(self.run.path))})</div>"
            f"<table><tr>{cells}</tr>{body}</table></div>"
        )

    # --- starting ---------------------------------------------------------------------------
    def start(self) -> Job:
        if self.run is not None:
            raise RuntimeError("this job was already started; create a new Job to run again")
        spec = self.spec
        spec.check_launcher_installed()
        backend = spec.resolve_backend()
        if self._run_dir_arg is not None:
            self.run = claim_run_dir(self._run_dir_arg)
        else:
            stem = spec.name or Path(spec.script or spec.module or "job").stem
            self.run = new_run_dir(self._runs_root, name=stem)
        run = self.run
        # The bare interpreter listens on nothing; a SLURM job's port is on its first node.
        port = spec.master_port
        if port is None and spec.launcher not in ("python", "slurm"):
            port = free_port()
        commands = launch_commands(spec, run_dir=run.path, port=port, run_id=run.path.name)
        for name, text in launch_files(
            spec, port=port, run_dir=run.path, run_id=run.path.name
        ).items():
            (run.path / name).write_text(text)
        env = spec.rank_env(run.path, backend)
        overrides = {k: v for k, v in env.items() if k in os.environ and os.environ[k] != v}
        run.write_run(
            {
                "id": run.path.name,
                "spec": spec.to_dict(),
                "backend": backend,
                "world_size": spec.world_size,
                "nnodes": spec.nnodes,
                "nproc_per_node": spec.nproc_per_node,
                "port": port,
                "launcher": spec.launcher,
                "commands": commands,
                "env": env,
                "env_overrides": overrides,
                "cwd": str(Path(spec.cwd).resolve()) if spec.cwd else os.getcwd(),
                "owner_pid": os.getpid(),
                "detached": self.detached,
                "created_at": time.time(),
                "state": "starting",
                "stalls": [],
            }
        )
        sup_env = {k: v for k, v in os.environ.items() if k != "RANKSCOPE_RUN_DIR"}
        argv = [sys.executable, "-m", "rankscope.launch.supervisor", str(run.path)]
        with open(run.path / "supervisor.log", "ab") as sup_log:
            self._sup = _warm.supervisor(
                argv,
                env=sup_env,
                agent_env={**sup_env, **env},
                commands=commands,  # only torchrun's are ever started warm
                pipe_stdin=not self.detached,
                stderr=sup_log,
            ) or subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL if self.detached else subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=sup_log,
                env=sup_env,
                start_new_session=True,
            )
        run.update_run(lambda d: d.__setitem__("supervisor_pid", self._sup.pid))  # type: ignore[union-attr]
        _live_jobs.add(self)
        self._start_watchdog()
        return self

    @classmethod
    def attach(cls, run_dir: str | os.PathLike[str]) -> Job:
        """Pick up a job from its run directory (a restarted kernel, another terminal).

        In the process that already follows the job, the same :class:`Job` is returned (one
        watchdog per job).
        """
        run = RunDir(run_dir)
        for job in list(_live_jobs):
            if job.run is not None and job.run.path == run.path:
                return job
        if not run.is_run() and run.rank_ids():
            _observe(run)
        data = run.read_run()
        try:
            spec = JobSpec.from_dict(data["spec"], recorded=True)
        except (KeyError, TypeError, ValueError) as exc:
            raise RunDirError(f"{run.run_json} has no usable job spec: {exc}") from exc
        job = cls(spec, detached=bool(data.get("detached")))
        job.run = run
        job.stalls = list(data.get("stalls") or [])
        if data.get("state") not in FINAL_STATES:
            _live_jobs.add(job)
            job._start_watchdog()
        else:
            job._tracker = RankTracker(run)
            job._tracker.update()
        return job

    # --- state ------------------------------------------------------------------------------
    def _data(self) -> dict[str, Any]:
        assert self.run is not None, "the job has not been started"
        return self.run.read_run()

    def status(self) -> str:
        """``starting``, ``queued`` (a SLURM job waiting for nodes), ``running``, ``stalled``,
        ``exited``, ``stopped`` or ``failed_to_start``."""
        self._reconcile()
        return self._data()["state"]

    def poll(self) -> int | None:
        """None while the job runs; then 0 if every rank exited 0, else non-zero."""
        self._reconcile()
        data = self._data()
        if data["state"] not in FINAL_STATES:
            return None
        code = data.get("exit_code")
        return 1 if code is None else int(code)

    def wait(self, timeout: float | None = None) -> int:
        """Block until the job ends; raise TimeoutError if it runs past ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            code = self.poll()
            if code is not None:
                # their last reads of run.json are done when wait returns: the caller may
                # remove the run directory next
                watcher = self._watchdog.thread if self._watchdog is not None else None
                for thread in (watcher, self._stopper):
                    if thread is not None and thread is not threading.current_thread():
                        thread.join(2.0)
                return code
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"job {self.run.path.name} still {self.status()} after {timeout} s"  # type: ignore[union-attr]
                )
            time.sleep(0.05)

    @property
    def finished(self) -> bool:
        return self.poll() is not None

    def info(self) -> dict[str, Any]:
        """run.json as it is now."""
        return self._data()

    def idle_s(self) -> float | None:
        """Seconds since the last progress the watchdog saw (a collective returned from, a
        step, a rank coming up); None where this process does not follow the job."""
        tracker = self._tracker
        return None if tracker is None else time.monotonic() - tracker.progressed_at

    def ranks(self) -> list[dict[str, Any]]:
        """A snapshot of every rank: status, step, collectives done, current collective, ..."""
        tracker = self._tracker
        if tracker is None:
            return []
        data = self._data()
        ended = data if data["state"] in FINAL_STATES else None
        with self._lock:
            tracker.update()
            return tracker.snapshots(job_ended=ended, stopping=jobstate.stopping(data))

    def _reconcile(self) -> None:
        """If the supervisor vanished without writing a final state, write one; an observed
        job has none and ends when every rank has."""
        data = self._data()
        if data["state"] in FINAL_STATES:
            return
        if data.get("observed"):
            self._end_if_every_rank_ended(int(data["world_size"]))
            return
        if self._sup is not None:
            if self._supervisor_runs():
                return
        elif pid_alive(data.get("supervisor_pid")):
            return
        if data["state"] not in FINAL_STATES:
            self._finish_without_supervisor("the supervisor process ended unexpectedly")

    def _supervisor_runs(self) -> bool:
        sup = self._sup
        if isinstance(sup, _warm.Started):  # the warm interpreter's child (rankscope._warm)
            return sup.running()
        return sup is not None and sup.poll() is None

    def _finish_without_supervisor(self, why: str) -> None:
        run = self.run
        assert run is not None
        log.warning("%s: %s; ending the job here", run.path.name, why)
        data = self._data()
        job_id = (data.get("slurm") or {}).get("job_id")
        if job_id:  # its processes are SLURM's to end, on every node
            with contextlib.suppress(slurm.SlurmError):
                slurm.cancel(str(job_id))
        agents = [a["pid"] for a in data.get("agents", [])]
        terminate(run, roots=[p for p in agents if pid_alive(p)], grace_s=1.0)
        table = rank_summaries(run)

        def final(d: dict[str, Any]) -> None:
            if d["state"] in FINAL_STATES:
                return
            d["state"] = "stopped" if d.get("stop_reason") else "exited"
            d["error"] = why
            d["ranks"] = {str(r): info for r, info in table.items()}
            d["exit_code"] = d.get("exit_code", 1) or 1
            d["ended_at"] = time.time()

        run.update_run(final)

    def _end_if_every_rank_ended(self, world_size: int) -> None:
        records = rank_records(self.run)  # type: ignore[arg-type]
        if len(records) < world_size or not all(r.ended for r in records.values()):
            return
        codes = [r.exit_code for r in records.values()]

        def final(d: dict[str, Any]) -> None:
            if d["state"] in FINAL_STATES:
                return
            d["state"] = "exited"
            d["ranks"] = {str(r): rec.summary() for r, rec in records.items()}
            d["exit_code"] = 0 if all(c == 0 for c in codes) else 1
            d["ended_at"] = max(r.ended_at or 0.0 for r in records.values())

        self.run.update_run(final)  # type: ignore[union-attr]

    # --- control ----------------------------------------------------------------------------
    def stop(self, *, grace_s: float = 5.0, reason: str = "stopped") -> int:
        """SIGTERM every process of the job, SIGKILL what is left after ``grace_s``."""
        run = self.run
        if run is None:
            raise RuntimeError("the job has not been started")
        if self.poll() is not None:
            return self.poll()  # type: ignore[return-value]
        data = self._data()
        if data.get("observed"):
            jobs = sorted({r.slurm_job for r in rank_records(run).values() if r.slurm_job})
            how = f"scancel {' '.join(jobs)}" if jobs else "its launcher, or kill its processes"
            raise NotStartedHere(
                f"rankscope did not start {run.path.name} (its probes write here, it was "
                f"launched another way), so it does not stop it: stop it the way it was "
                f"started ({how})"
            )

        def mark(d: dict[str, Any]) -> None:
            d.setdefault("stop_reason", reason)
            d["stop_grace_s"] = grace_s
            d["stop_requested_at"] = time.time()

        run.update_run(mark)
        log.info("%s: stopping (%s), grace %.1f s", run.path.name, reason, grace_s)
        sup_pid = self._sup.pid if self._sup is not None else self._data().get("supervisor_pid")
        if pid_alive(sup_pid):
            with contextlib.suppress(OSError):
                os.kill(sup_pid, signal.SIGTERM)
        # SLURM ends a cancelled job's steps on its own clock (SIGTERM, KillWait, SIGKILL).
        deadline = time.monotonic() + grace_s + (75.0 if self.spec.launcher == "slurm" else 5.0)
        while time.monotonic() < deadline:
            if self._data()["state"] in FINAL_STATES:
                break
            if self._sup is not None and not self._supervisor_runs():
                break
            time.sleep(0.05)
        if self._data()["state"] not in FINAL_STATES:
            with contextlib.suppress(OSError):
                os.kill(sup_pid, signal.SIGKILL)
            self._finish_without_supervisor("the supervisor did not finish the stop in time")
        code = self.wait(timeout=10)
        if self._watchdog is not None:
            self._watchdog.closing.set()
        return code

    def capture(self, reason: str = "user", *, timeout_s: float = 4.0) -> dict[str, Any]:
        """Capture evidence from every live rank now; returns the capture manifest."""
        if self.run is None or self._tracker is None:
            raise RuntimeError("the job has not been started")
        with self._lock:
            self._tracker.update()
            procs = self._tracker.procs()
        if not procs:
            raise RuntimeError("no live rank to capture evidence from (has the job started?)")
        return capture_evidence(self.run, procs, reason=reason, timeout_s=timeout_s)

    # --- the stall watchdog -----------------------------------------------------------------
    def _start_watchdog(self) -> None:
        assert self.run is not None
        self._tracker = RankTracker(self.run)
        spec = self.spec
        self._watchdog = Watchdog(
            self.run,
            self._tracker,
            world_size=spec.world_size,
            stall_timeout_s=spec.stall_timeout_s,
            startup_timeout_s=spec.startup_timeout_s,
            lock=self._lock,
            on_stall=self._on_stall,
            on_new_ranks=self._record_pids,
            on_clear=self._on_clear,
        ).start()

    def _record_pids(self) -> None:
        assert self._tracker is not None
        ranks = {
            str(r): {
                "pid": s.pid,
                "host": s.host,
                "local_rank": s.local_rank,
                "group_rank": s.group_rank,
                **({"node": s.node} if s.node else {}),
            }
            for r, s in self._tracker.records.items()
        }
        self.run.update_run(lambda d: d.__setitem__("ranks", ranks))  # type: ignore[union-attr]

    def _busy_stall(self, kind: str) -> bool:
        """A busy stall, or the no_progress one it became (not one that a rank that sleeps or
        waits on a lock makes: it is not busy)."""
        last = self.stalls[-1] if self.stalls else None
        became = (
            kind == "no_progress"
            and last is not None
            and last["kind"] == "busy"
            and "cleared_at" not in last
        )
        return kind == "busy" or became

    def _on_clear(self, stalled_s: float) -> None:
        """Progress after a stall: the job runs again, and its last stall says when it cleared
        (a busy rank reached its collective: a straggler)."""
        cleared = time.time()

        def change(d: dict[str, Any]) -> None:
            # ranks that end of a stop's SIGTERM move too: that clears nothing
            if d["state"] in FINAL_STATES or d.get("stop_requested_at"):
                return
            if d.get("stalls"):
                d["stalls"][-1].update(cleared_at=cleared, cleared_after_s=stalled_s)
                if self.stalls:
                    self.stalls[-1].update(cleared_at=cleared, cleared_after_s=stalled_s)
            if d["state"] == "stalled":
                d["state"] = "running"

        self.run.update_run(change)  # type: ignore[union-attr]

    def _on_stall(self, kind: str, idle_s: float, proven: Proof | None = None) -> None:
        run, tracker = self.run, self._tracker
        assert run is not None and tracker is not None
        detected = time.time()
        with self._lock:
            # an exit stall's ranks have ended their scripts: their processes are what is left
            procs = tracker.lingering(self.spec.world_size) if kind == "exit" else tracker.procs()
            snapshot = tracker.snapshots()
        manifest = capture_evidence(run, procs, reason=f"stall:{kind}") if procs else None
        log.info("%s: stall evidence %s", run.path.name, manifest["id"] if manifest else "none")
        stall = {
            "kind": kind,
            "detected_at": detected,
            "idle_s": idle_s,
            # the proof's sentence, and its parts: the diagnosis writes it in its own numbers
            "proven": proven.text() if proven else None,
            "proof": proven.to_json() if proven else None,
            "summary": (
                busy_text(snapshot)
                if self._busy_stall(kind)
                else exit_text(snapshot, sorted(procs))
                if kind == "exit"
                else None
            ),
            "capture_id": manifest["id"] if manifest else None,
            "evidence_complete_at": manifest["completed_at"] if manifest else time.time(),
            "missing": manifest["missing"] if manifest else [],
            "late": manifest["late"] if manifest else [],
            "capture_deadline_s": manifest["deadline_s"] if manifest else None,
            "ranks": snapshot,
        }
        self.stalls.append(stall)

        def record(d: dict[str, Any]) -> None:
            d.setdefault("stalls", []).append(stall)
            if d["state"] not in FINAL_STATES:
                d["state"] = "stalled"

        run.update_run(record)
        for callback in list(self.on_stall_callbacks):
            with contextlib.suppress(Exception):
                callback(self, stall)
        # A busy rank may yet come (a long step, a compile): it is stopped only once its stall
        # has become no_progress (BUSY_LIMIT stall timeouts); see "What counts as a stall".
        if self.spec.on_stall == "stop" and kind != "busy":
            self._stopper = threading.Thread(
                target=self.stop,
                kwargs={"reason": "stall"},
                name=f"rankscope-stop-{run.path.name}",
                daemon=True,
            )
            self._stopper.start()


def _observe(run: RunDir) -> None:
    """Write run.json for a run directory that probes of a job started some other way write
    into (an existing sbatch script, Kubernetes, Ray): from then on it is followed as a job
    rankscope started, but for stopping it. Its spec is what the ranks' start events say."""
    records = rank_records(run)
    sizes = {r.world_size for r in records.values() if r.world_size}
    if not sizes:
        raise RunDirError(
            f"{run.path} has rank folders but no rank has reported its start (with WORLD_SIZE) "
            "yet: wait for the ranks' probes to start, then attach again"
        )
    world = max(sizes)
    spec = JobSpec(module="(started elsewhere)", nproc_per_node=world)
    data = {
        "id": run.path.name,
        "spec": spec.to_dict(),
        "world_size": world,
        "nnodes": None,
        "nproc_per_node": None,
        "launcher": "external",
        "observed": True,
        "detached": True,
        "created_at": min(r.started_at or time.time() for r in records.values()),
        "state": "running",
        "stalls": [],
    }
    # Atomically, and only if no other observer wrote it first: a hard link fails if it exists.
    tmp = run.path / f".run.json.{os.getpid()}"
    tmp.write_text(json.dumps(data))
    try:
        os.link(tmp, run.run_json)
    except FileExistsError:
        pass
    finally:
        tmp.unlink()


def state_text(info: dict[str, Any], ranks: list[dict[str, Any]] | None = None) -> str:
    """The job's state in words, with SLURM's view where SLURM runs it, never contradicting
    its ``ranks`` (:meth:`Job.ranks`; see :func:`rankscope.state.job_state_words`).

    For instance ``queued (SLURM job 12: BeginTime)``, ``running (SLURM job 12 on node[1-2])``.
    """
    state = jobstate.job_state_words(
        str(info.get("state")),
        [r["status"] for r in ranks or ()],
        stopping=jobstate.stopping(info),
    )
    sl = info.get("slurm") or {}
    if not sl.get("job_id"):
        return state
    where = f"SLURM job {sl['job_id']}"
    if state == "queued":
        return f"{state} ({where}: {sl.get('reason') or 'waiting'})"
    if sl.get("nodes"):
        where += f" on {sl['nodes']}"
    return f"{state} ({where})"


#: The words a person reads over :attr:`Job.GLANCE`'s columns (the live panel's).
HEADERS = {"step": jobstate.STEP_LABEL, "last_done": "last completed"}


def _glance(snap: dict[str, Any]) -> tuple[Any, ...]:
    """A rank's snapshot as the columns of :attr:`Job.GLANCE`."""
    derived = {"now": doing_now(snap)}
    return tuple(derived[c] if c in derived else snap.get(c) for c in Job.GLANCE)


def _cell(value: Any) -> str:
    return "" if value is None else str(value)


_live_jobs: weakref.WeakSet[Job] = weakref.WeakSet()


@atexit.register
def _stop_owned_jobs() -> None:
    for job in list(_live_jobs):
        if job.detached or job.run is None:
            continue
        with contextlib.suppress(Exception):
            if job.info().get("owner_pid") == os.getpid() and job.poll() is None:
                job.stop(grace_s=2.0, reason="owner_exited")
