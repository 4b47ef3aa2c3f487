"""A running job (torchrun, or another launcher): start it without blocking, watch every rank,
stop it, re-attach."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from rankscope.launch.evidence import capture_evidence
from rankscope.launch.procs import pid_alive, terminate
from rankscope.launch.spec import JobSpec, free_port, launch_commands, launch_files
from rankscope.rundir import (
    FINAL_STATES,
    EventTail,
    RunDir,
    RunDirError,
    as_int,
    claim_run_dir,
    new_run_dir,
    rank_table,
)

POLL_S = 0.1
#: A live rank outside every collective that used at least this share of a core since the last
#: look is busy (computing, loading, saving), not stuck: the others wait for a straggler.
BUSY_CPU_SHARE = 0.2
#: How long a busy rank may keep the others waiting before it counts as a stall anyway (a rank
#: spinning in a loop it never leaves), in multiples of the stall timeout.
BUSY_LIMIT = 10.0


@dataclass
class RankState:
    """What the owner knows about one rank right now (from the probe's events)."""

    rank: int
    pid: int | None = None
    host: str | None = None
    local_rank: int | None = None
    group_rank: int | None = None
    started_at: float | None = None
    done: int = 0
    step: int | None = None
    op: str | None = None
    pg: str | None = None
    seq: int | None = None
    site: str | None = None
    in_collective_since: float | None = None
    last_event_at: float | None = None
    exception: str | None = None
    exit_code: int | None = None
    ended: bool = False
    fr: dict[str, list[int]] | None = None
    """Flight recorder per group: [last enqueued, last completed], from the heartbeat."""

    def status(self) -> str:
        """``running``, ``waiting`` (inside a collective), ``exited``, ``failed`` or ``dead``."""
        if self.ended:
            return "exited" if self.exit_code in (0, None) else "failed"
        if self.pid is not None and not pid_alive(self.pid):
            return "dead"
        return "waiting" if self.in_collective_since is not None else "running"

    def snapshot(
        self, now: float | None = None, *, job_ended: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The state as a dict, with ages relative to ``now``.

        ``job_ended`` (the final run.json) freezes a rank that never reported its end: its exit
        code comes from run.json, its status is ``stopped`` when the job was stopped, and no age
        keeps growing.
        """
        now = time.time() if now is None else now
        d = asdict(self)
        d["status"] = self.status()
        d["heartbeat_age_s"] = None if self.last_event_at is None else now - self.last_event_at
        d["in_collective_s"] = (
            None if self.in_collective_since is None else now - self.in_collective_since
        )
        if job_ended is not None and not self.ended:
            info = (job_ended.get("ranks") or {}).get(str(self.rank), {})
            d["exit_code"] = info.get("exit_code")
            d["status"] = "stopped" if job_ended.get("state") == "stopped" else "dead"
            d["heartbeat_age_s"] = d["in_collective_s"] = None
        return d


class RankTracker:
    """Follows every rank's events.jsonl incrementally and keeps a :class:`RankState` each."""

    def __init__(self, run: RunDir):
        self.run = run
        self.tails: dict[int, EventTail] = {}
        self.states: dict[int, RankState] = {}
        self._cpu: dict[int, tuple[float, float]] = {}  # rank -> (monotonic time, CPU seconds)
        #: When an update last read progress (monotonic). Whoever reads the events (the
        #: watchdog, a live panel through ``Job.ranks()``), the watchdog sees it here.
        self.progressed_at = time.monotonic()

    def update(self) -> bool:
        """Read new events; return True if any rank made progress (started, completed,
        stepped), and then stamp :attr:`progressed_at`."""
        progress = False
        for rank in self.run.rank_ids():
            if rank not in self.tails:
                self.tails[rank] = EventTail(self.run.events(rank))
                self.states[rank] = RankState(rank=rank)
            state = self.states[rank]
            for ev in self.tails[rank].read():
                try:
                    progress |= _apply(state, ev)
                except (TypeError, ValueError, AttributeError):
                    continue  # a malformed event must not stop the watchdog
        if progress:
            self.progressed_at = time.monotonic()
        return progress

    def pids(self, *, alive_only: bool = True) -> dict[int, int]:
        return {
            r: s.pid
            for r, s in self.states.items()
            if s.pid is not None and (not alive_only or (not s.ended and pid_alive(s.pid)))
        }

    def busy_outside_collectives(self) -> bool:
        """Some live rank outside every collective used CPU on its main thread since the last
        call (see :data:`BUSY_CPU_SHARE`): it is working, and the ranks waiting for it are not
        stuck."""
        busy = False
        now = time.monotonic()
        for rank, state in self.states.items():
            if state.ended or state.pid is None or _in_collective(state):
                self._cpu.pop(rank, None)
                continue
            # The main thread only: the probe's own threads (its first flight-recorder dump
            # imports a good part of torch) are not the rank's work.
            if _main_thread_runs(state.pid):  # running or runnable, or in disk I/O, right now
                busy = True
                continue
            try:
                main = [t for t in psutil.Process(state.pid).threads() if t.id == state.pid]
            except psutil.Error:
                continue
            if not main:
                continue
            cpu = main[0].user_time + main[0].system_time
            last = self._cpu.get(rank)
            self._cpu[rank] = (now, cpu)
            if last is not None and now > last[0]:
                busy |= (cpu - last[1]) / (now - last[0]) >= BUSY_CPU_SHARE
        return busy

    def waiting_in_collective(self) -> bool:
        """A live rank is inside a collective: one the probe saw it enter, or one the flight
        recorder has enqueued but not completed (issued from C++: DDP, FSDP)."""
        return any(not s.ended and _in_collective(s) for s in self.states.values())


def _main_thread_runs(pid: int) -> bool:
    """Linux: the scheduler state of the process's main thread is R (running or waiting for a
    core: on a loaded machine a computing rank gets little CPU but stays runnable) or D (disk).
    False where /proc does not say."""
    try:
        with open(f"/proc/{pid}/task/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] in (b"R", b"D")


def _in_collective(state: RankState) -> bool:
    return state.in_collective_since is not None or any(e > c for e, c in (state.fr or {}).values())


def _apply(state: RankState, ev: dict[str, Any]) -> bool:
    kind = ev.get("ev")
    t = ev.get("t")
    state.last_event_at = t
    if kind == "heartbeat":
        fr = ev.get("fr")
        if not isinstance(fr, dict):
            return False
        before = state.fr or {}
        state.fr = fr
        return any(c > before.get(pg, [0, -1])[1] for pg, (_, c) in fr.items())
    if kind == "enter":
        state.op, state.pg, state.seq = ev.get("op"), ev.get("pg"), ev.get("seq")
        file, line = ev.get("file"), ev.get("line")
        state.site = f"{Path(file).name}:{line}" if file else None
        state.in_collective_since = None if ev.get("async_op") else t
        return False
    if kind == "exit":
        state.done += 1
        state.in_collective_since = None
        return True
    if kind == "step":
        state.step = ev.get("step")
        return True
    if kind == "start":
        env = ev.get("env") or {}
        state.pid, state.host, state.started_at = ev.get("pid"), ev.get("host"), t
        state.local_rank = as_int(env.get("LOCAL_RANK"))
        state.group_rank = as_int(env.get("GROUP_RANK"))
        return True
    if kind == "exception":
        state.exception = f"{ev.get('type')}: {ev.get('message')}"
        return False
    if kind == "end":
        state.ended, state.exit_code = True, ev.get("code")
        state.in_collective_since = None
        return True
    return False


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
        self._sup: subprocess.Popen[bytes] | None = None
        self._tracker: RankTracker | None = None
        self._watchdog: threading.Thread | None = None
        self._stopper: threading.Thread | None = None  # the stop a stall started (policy "stop")
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self.stalls: list[dict[str, Any]] = []
        self.on_stall_callbacks: list[Any] = []

    def __repr__(self) -> str:
        where = self.run.path.name if self.run else "not started"
        return f"<Job {where} {self.status() if self.run else ''}>"

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
        port: int | None = None  # the bare interpreter listens on nothing
        if spec.launcher != "python":
            port = spec.master_port if spec.master_port is not None else free_port()
        commands = launch_commands(spec, run_dir=run.path, port=port, run_id=run.path.name)
        for name, text in launch_files(spec, port=port).items():
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
        with open(run.path / "supervisor.log", "ab") as log:
            self._sup = subprocess.Popen(
                [sys.executable, "-m", "rankscope.launch.supervisor", str(run.path)],
                stdin=subprocess.DEVNULL if self.detached else subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=log,
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
        data = run.read_run()
        try:
            spec = JobSpec.from_dict(data["spec"])
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
        """``starting``, ``running``, ``stalled``, ``exited``, ``stopped`` or ``failed_to_start``."""
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
                for thread in (self._watchdog, self._stopper):
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

    def ranks(self) -> list[dict[str, Any]]:
        """A snapshot of every rank: status, step, collectives done, current collective, ..."""
        tracker = self._tracker
        if tracker is None:
            return []
        data = self._data()
        ended = data if data["state"] in FINAL_STATES else None
        with self._lock:
            tracker.update()
            now = time.time()
            return [
                tracker.states[r].snapshot(now, job_ended=ended) for r in sorted(tracker.states)
            ]

    def _reconcile(self) -> None:
        """If the supervisor vanished without writing a final state, write one."""
        data = self._data()
        if data["state"] in FINAL_STATES:
            return
        if self._sup is not None:
            if self._sup.poll() is None:
                return
        elif pid_alive(data.get("supervisor_pid")):
            return
        if data["state"] not in FINAL_STATES:
            self._finish_without_supervisor("the supervisor process ended unexpectedly")

    def _finish_without_supervisor(self, why: str) -> None:
        run = self.run
        assert run is not None
        agents = [a["pid"] for a in self._data().get("agents", [])]
        terminate(run, roots=[p for p in agents if pid_alive(p)], grace_s=1.0)
        table = rank_table(run)

        def final(d: dict[str, Any]) -> None:
            if d["state"] in FINAL_STATES:
                return
            d["state"] = "stopped" if d.get("stop_reason") else "exited"
            d["error"] = why
            d["ranks"] = {str(r): info for r, info in table.items()}
            d["exit_code"] = d.get("exit_code", 1) or 1
            d["ended_at"] = time.time()

        run.update_run(final)

    # --- control ----------------------------------------------------------------------------
    def stop(self, *, grace_s: float = 5.0, reason: str = "stopped") -> int:
        """SIGTERM every process of the job, SIGKILL what is left after ``grace_s``."""
        run = self.run
        if run is None:
            raise RuntimeError("the job has not been started")
        if self.poll() is not None:
            return self.poll()  # type: ignore[return-value]

        def mark(d: dict[str, Any]) -> None:
            d.setdefault("stop_reason", reason)
            d["stop_grace_s"] = grace_s
            d["stop_requested_at"] = time.time()

        run.update_run(mark)
        sup_pid = self._sup.pid if self._sup is not None else self._data().get("supervisor_pid")
        if pid_alive(sup_pid):
            with contextlib.suppress(OSError):
                os.kill(sup_pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s + 5.0
        while time.monotonic() < deadline:
            if self._data()["state"] in FINAL_STATES:
                break
            if self._sup is not None and self._sup.poll() is not None:
                break
            time.sleep(0.05)
        if self._data()["state"] not in FINAL_STATES:
            with contextlib.suppress(OSError):
                os.kill(sup_pid, signal.SIGKILL)
            self._finish_without_supervisor("the supervisor did not finish the stop in time")
        code = self.wait(timeout=10)
        self._closing.set()
        return code

    def capture(self, reason: str = "user", *, timeout_s: float = 4.0) -> dict[str, Any]:
        """Capture evidence from every live rank now; returns the capture manifest."""
        if self.run is None or self._tracker is None:
            raise RuntimeError("the job has not been started")
        with self._lock:
            self._tracker.update()
            pids = self._tracker.pids()
        if not pids:
            raise RuntimeError("no live rank to capture evidence from (has the job started?)")
        return capture_evidence(self.run, pids, reason=reason, timeout_s=timeout_s)

    # --- the stall watchdog -----------------------------------------------------------------
    def _start_watchdog(self) -> None:
        assert self.run is not None
        self._tracker = RankTracker(self.run)
        self._watchdog = threading.Thread(
            target=self._watch, name=f"rankscope-watchdog-{self.run.path.name}", daemon=True
        )
        self._watchdog.start()

    def _watch(self) -> None:
        run, tracker, spec = self.run, self._tracker, self.spec
        assert run is not None and tracker is not None
        started = last_busy = time.monotonic()
        next_cpu_look = 0.0
        stalled, stalled_at = False, 0.0
        known: set[int] = set()
        while not self._closing.is_set():
            try:
                data = run.read_run()
            except RunDirError:
                time.sleep(POLL_S)
                continue
            if data["state"] in FINAL_STATES:
                break
            with self._lock:
                tracker.update()
                new = set(tracker.states) - known
            now = time.monotonic()
            if new:
                known |= new
                self._record_pids(tracker)
                # A rank coming up is progress (its start event may not be written yet): on a
                # loaded machine the last rank may start after the stall timeout.
                tracker.progressed_at = last_busy = now
            if stalled and tracker.progressed_at > stalled_at:
                stalled = False
                self._set_state("running", only_from="stalled")
            idle = now - tracker.progressed_at
            stall = None
            if not stalled and data["state"] in ("running", "stalled"):
                all_up = len(tracker.states) >= spec.world_size
                if not all_up and now - started > spec.startup_timeout_s:
                    stall = "startup"
                elif all_up and tracker.waiting_in_collective():
                    if now >= next_cpu_look:  # CPU counters tick coarsely: look twice a second
                        next_cpu_look = now + 0.5
                        if tracker.busy_outside_collectives():
                            last_busy = now
                    quiet = now - last_busy > spec.stall_timeout_s
                    if idle > spec.stall_timeout_s and (
                        quiet or idle > BUSY_LIMIT * spec.stall_timeout_s
                    ):
                        stall = "no_progress"
            if stall is not None:
                stalled, stalled_at = True, now
                self._on_stall(stall, idle)
            time.sleep(POLL_S)

    def _record_pids(self, tracker: RankTracker) -> None:
        ranks = {
            str(r): {
                "pid": s.pid,
                "host": s.host,
                "local_rank": s.local_rank,
                "group_rank": s.group_rank,
            }
            for r, s in tracker.states.items()
        }
        self.run.update_run(lambda d: d.__setitem__("ranks", ranks))  # type: ignore[union-attr]

    def _set_state(self, state: str, *, only_from: str | None = None) -> None:
        def change(d: dict[str, Any]) -> None:
            if d["state"] in FINAL_STATES:
                return
            if only_from is None or d["state"] == only_from:
                d["state"] = state

        self.run.update_run(change)  # type: ignore[union-attr]

    def _on_stall(self, kind: str, idle_s: float) -> None:
        run, tracker = self.run, self._tracker
        assert run is not None and tracker is not None
        detected = time.time()
        with self._lock:
            pids = tracker.pids()
            snapshot = [tracker.states[r].snapshot() for r in sorted(tracker.states)]
        manifest = capture_evidence(run, pids, reason=f"stall:{kind}") if pids else None
        stall = {
            "kind": kind,
            "detected_at": detected,
            "idle_s": idle_s,
            "capture_id": manifest["id"] if manifest else None,
            "evidence_complete_at": manifest["completed_at"] if manifest else time.time(),
            "missing": manifest["missing"] if manifest else [],
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
        if self.spec.on_stall == "stop":
            self._stopper = threading.Thread(
                target=self.stop,
                kwargs={"reason": "stall"},
                name=f"rankscope-stop-{run.path.name}",
                daemon=True,
            )
            self._stopper.start()


_live_jobs: weakref.WeakSet[Job] = weakref.WeakSet()


@atexit.register
def _stop_owned_jobs() -> None:
    for job in list(_live_jobs):
        if job.detached or job.run is None:
            continue
        with contextlib.suppress(Exception):
            if job.info().get("owner_pid") == os.getpid() and job.poll() is None:
                job.stop(grace_s=2.0, reason="owner_exited")
