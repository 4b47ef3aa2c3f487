"""The supervisor: a small process between the owner and the launcher (torchrun by default).

``python -m rankscope.launch.supervisor RUN_DIR`` starts one launcher per (simulated) node,
waits for them, enforces the hard time limit, ends the job when its owner dies (unless the job is
detached) and writes the final state and per-rank exit codes to run.json. Being the agents' parent
is what lets it know their exit codes; keeping it out of the job's environment is what lets
``stop()`` find every job process without ever hitting the supervisor.

The owner holds the write end of the supervisor's stdin: EOF there means the owner is gone.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from rankscope import _warm
from rankscope.launch import slurm
from rankscope.launch.procs import pid_alive, terminate, when_owner_gone
from rankscope.rundir import (
    DIST_ENV,
    FINAL_STATES,
    RunDir,
    rank_records,
    rank_summaries,
    torchrun_failures,
)
from rankscope.state import EXITING_S, fatal_signal, signal_code

log = logging.getLogger("rankscope.launch.supervisor")  # it runs as __main__
#: How much of the end of a rank's stacks file is read for a fatal signal's dump (one dump
#: of every thread's stack is a few kB; a rank with hundreds of threads writes more).
STACKS_TAIL = 1 << 20


class Supervisor:
    def __init__(self, run: RunDir):
        self.run = run
        self.data = run.read_run()
        self.detached = bool(self.data.get("detached"))
        # the owner's process, or the warm interpreter it started this one from (rankscope._warm)
        self.parent = os.getppid()
        self.agents: list[subprocess.Popen[bytes]] = []
        self.stop_reason: str | None = None
        self.killed: set[int] = set()
        self.outlived: set[int] = set()
        self._stop = threading.Event()
        self.launcher = str(self.data.get("launcher") or "torchrun")

    def request_stop(self, reason: str) -> None:
        if self.stop_reason is None:
            log.info("stop requested: %s", reason)
            self.stop_reason = reason
        self._stop.set()

    def launch(self) -> bool:
        env = dict(os.environ)
        dropped: list[str] = []
        if self.launcher == "python":  # a bare start inherits no launcher's contract
            dropped = sorted(k for k in env if k in DIST_ENV or k.startswith("TORCHELASTIC_"))
            for key in dropped:
                del env[key]
        env.update(self.data["env"])
        cwd = self.data.get("cwd") or None
        try:
            for node, cmd in enumerate(self.data["commands"]):
                out = open(self.run.launcher_log(node), "ab")  # noqa: SIM115
                self.agents.append(
                    _warm.agent_popen(cmd, env)(
                        cmd,
                        env=env,
                        cwd=cwd,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
                out.close()
        except OSError as exc:
            self._finish_failed(f"could not start {self.launcher}: {exc}")
            return False
        pids = [p.pid for p in self.agents]
        log.info("started %d %s agent(s): pids %s", len(pids), self.launcher, pids)

        def started(d: dict[str, Any]) -> None:
            if dropped:
                d["env_dropped"] = dropped
            d["state"] = "running"
            d["started_at"] = time.time()
            d["agents"] = [{"node": i, "pid": pid} for i, pid in enumerate(pids)]

        self.run.update_run(started)
        return True

    def _finish_failed(self, why: str) -> None:
        log.error("failed to start: %s", why)

        def failed(d: dict[str, Any]) -> None:
            d["state"] = "failed_to_start"
            d["error"] = why
            d["ended_at"] = time.time()

        self.run.update_run(failed)

    def watch_owner(self) -> None:
        """EOF on stdin (or a new parent) means the owner died: end the job unless detached."""
        if not self.detached:
            when_owner_gone(lambda: self.request_stop("owner_died"))

    def wait(self) -> None:
        timeout = self.data["spec"].get("timeout_s")
        deadline = time.monotonic() + timeout if timeout else None
        while True:
            if all(p.poll() is not None for p in self.agents):
                return
            if not self.detached and os.getppid() != self.parent:
                self.request_stop("owner_died")
            if deadline is not None and time.monotonic() > deadline:
                self.request_stop("timeout")
            if self._stop.wait(0.1):
                break
        self._record_stop()
        # A rank whose script ended a while ago but whose process still runs has outlived its
        # end (its exit waits for something): the stop, not its script, ends it. (One that
        # ended a moment ago may be exiting as it should.)
        before = time.time() - EXITING_S
        self.outlived = {
            rank
            for rank, record in rank_records(self.run).items()
            if record.ended and (record.last_event_at or before) < before and pid_alive(record.pid)
        }
        roots = [p.pid for p in self.agents]
        self.killed = set(terminate(self.run, roots=roots, grace_s=self.grace_s))
        if self.killed:
            log.info("SIGKILLed after the %.1f s grace period: pids %s", self.grace_s, self.killed)
        for p in self.agents:
            p.wait()

    @property
    def grace_s(self) -> float:
        return float(self.data.get("stop_grace_s", 5.0))

    def _record_stop(self) -> None:
        reason = self.stop_reason

        def stopping(d: dict[str, Any]) -> None:
            d.setdefault("stop_reason", reason)
            d["stop_requested_at"] = d.get("stop_requested_at") or time.time()

        self.run.update_run(stopping)

    def finish(self) -> None:
        codes = [p.returncode for p in self.agents]

        def agents(d: dict[str, Any]) -> None:
            d["agents"] = [
                {"node": i, "pid": p.pid, "exit_code": p.returncode}
                for i, p in enumerate(self.agents)
            ]

        self.run.update_run(agents)
        ok = all(c == 0 for c in codes)
        failed = None
        if any(c != 0 for c in codes):
            failed = f"{self.launcher} exited with {codes} before any rank started"
        self._finish(
            ok=ok,
            code=max((c for c in codes if c), default=0),
            failed=failed,
            see=self.run.launcher_log().name,
        )

    def _launcher_text(self) -> str:
        text = ""
        for path in sorted(self.run.path.glob("launcher*.log")):
            try:
                text += path.read_text(errors="replace")
            except OSError:
                pass
        return text

    def _finish(
        self, *, ok: bool, code: int, failed: str | None, see: str, error: str | None = None
    ) -> None:
        """Write the final state: ``ok`` when the launcher (or the scheduler) saw success,
        ``code`` its exit code, ``failed`` why it failed when no rank started."""
        failures = torchrun_failures(self._launcher_text())
        ranks = rank_summaries(self.run)
        world = int(self.data["world_size"])
        now = self.run.read_run()
        stopped = self.stop_reason is not None or now.get("stop_reason")
        never_started = self._never_started(now) if stopped and not ranks else None

        def final(d: dict[str, Any]) -> None:
            table = {}
            for r in range(world):
                info = dict(ranks.get(r, {}))
                # torchrun saw the process end; the probe's end event comes a little earlier
                # (a crash during interpreter shutdown happens after it).
                rank_code = failures.get(r, info.get("exit_code"))
                if r in self.outlived and r not in failures:
                    rank_code = self._stop_code(info["pid"])  # not its script's code
                if rank_code is None and info.get("pid") is not None:
                    rank_code = self._unreported_code(r, info["pid"], stopped=bool(stopped), ok=ok)
                info["exit_code"] = rank_code
                table[str(r)] = info
            d["ranks"] = table
            if never_started is not None:
                d["state"] = "failed_to_start"
                d["error"] = never_started
            elif stopped:
                d["state"] = "stopped"
            elif not ranks and failed is not None:
                d["state"] = "failed_to_start"
                d["error"] = f"{failed}; see {see}"
            else:
                d["state"] = "exited"
            if error is not None:
                d.setdefault("error", error)
            rank_codes = [info["exit_code"] for info in table.values()]
            all_ok = ok and all(c == 0 for c in rank_codes)
            d["exit_code"] = 0 if all_ok else (code or 1)
            d["ended_at"] = time.time()
            log.info("final state %s, exit code %s", d["state"], d["exit_code"])

        self.run.update_run(final)

    def _unreported_code(self, rank: int, pid: int, *, stopped: bool, ok: bool) -> int | None:
        """The exit code of a rank that neither torchrun nor its end event reported: the fatal
        signal that faulthandler's dump names (torchrun leaves out of its summary a rank that
        died of one while it was already ending the others); else that of the stop (our
        SIGTERM, or the SIGKILL after the grace period), or 0 when the launcher saw success."""
        fatal = signal_code(fatal_signal(self._stacks_tail(rank)))
        if fatal is not None:
            return fatal
        if stopped:
            return self._stop_code(pid)
        return 0 if ok else None

    def _stop_code(self, pid: int) -> int:
        """The exit code the stop gave a rank's process: our SIGTERM, or the SIGKILL after the
        grace period."""
        return -signal.SIGKILL if pid in self.killed else -signal.SIGTERM

    def _stacks_tail(self, rank: int) -> str:
        """The end of the rank's stacks file, where a fatal signal's dump is the last thing
        written."""
        try:
            with self.run.stacks(rank).open("rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - STACKS_TAIL))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _never_started(self, data: dict[str, Any]) -> str | None:
        """Why a job that the startup watchdog stopped never ran: no rank reported its start
        in time, so the launcher never got its workers going. None if the stop had another
        reason."""
        startup = [s for s in data.get("stalls") or [] if s.get("kind") == "startup"]
        if not startup:
            return None
        limit = self.data["spec"].get("startup_timeout_s")
        logs = ", ".join(sorted(p.name for p in self.run.path.glob("launcher*.log")))
        return (
            f"the startup watchdog stopped the job after {limit:g} s with no rank started: the "
            f"{self.launcher} launcher never got its workers going. With several nodes that is "
            "usually a rendezvous that never completed (every node needs the same --rdzv-id, "
            f"--rdzv-endpoint and --nnodes); see {logs}"
        )


class SlurmSupervisor(Supervisor):
    """The same duties for a SLURM batch job: it submits with sbatch, follows the job with
    scontrol (queued with SLURM's reason, then running on its nodes), cancels it with scancel
    when stopped, timed out, left in the queue past the startup timeout or orphaned, and
    writes the final state. It starts no process on the nodes: SLURM does."""

    POLL_S = 0.5

    def __init__(self, run: RunDir):
        super().__init__(run)
        self.job_id: str | None = None
        self.last: slurm.JobState | None = None
        self.queue_error: str | None = None
        self.nodes: str | None = None
        """The job's nodes (a SLURM host list) while it ran."""
        self.lost_nodes: dict[str, str] = {}
        """The nodes SLURM lost under the job (NODE_FAIL), each with SLURM's reason."""

    def launch(self) -> bool:
        env = dict(os.environ)
        env.update(self.data["env"])
        try:
            job_id = slurm.submit(
                self.run.path / slurm.BATCH_SCRIPT,
                options=self.data["spec"].get("slurm") or {},
                env=env,
                cwd=self.data.get("cwd") or os.getcwd(),
            )
        except slurm.SlurmError as exc:
            self._finish_failed(str(exc))
            return False
        self.job_id = job_id
        log.info("submitted SLURM job %s", job_id)

        def queued(d: dict[str, Any]) -> None:
            d["state"] = "queued"
            d["slurm"] = {"job_id": job_id, "state": "PENDING", "submitted_at": time.time()}

        self.run.update_run(queued)
        return True

    def wait(self) -> None:
        assert self.job_id is not None
        spec = self.data["spec"]
        timeout, startup = spec.get("timeout_s"), float(spec.get("startup_timeout_s") or 60)
        submitted = time.monotonic()
        deadline = None
        while not self._stop.is_set():
            state = self._look()
            if state is not None and state.ended:
                return
            now = time.monotonic()
            if state is not None and state.state == "PENDING" and now - submitted > startup:
                self.queue_error = (
                    f"SLURM job {self.job_id} was still queued after the startup timeout "
                    f"({startup:g} s; SLURM's reason: {state.reason or 'none given'}), so "
                    "rankscope cancelled it; raise startup_timeout_s, or pick a partition with "
                    "free nodes (sinfo shows them)"
                )
                self.request_stop("queue_timeout")
                break
            if state is not None and state.state == "RUNNING" and deadline is None and timeout:
                deadline = now + float(timeout)
            if not self.detached and os.getppid() != self.parent:
                self.request_stop("owner_died")
            if deadline is not None and now > deadline:
                self.request_stop("timeout")
            self._stop.wait(self.POLL_S)
        self._record_stop()
        slurm.cancel(self.job_id)
        # scancel returns at once; SLURM signals the steps (SIGTERM, then SIGKILL after its
        # KillWait) and the job leaves RUNNING and COMPLETING when every node is clean.
        end = time.monotonic() + self.grace_s + 60.0
        while time.monotonic() < end:
            state = self._look()
            if state is None or state.ended or state.state == "UNKNOWN":
                return
            time.sleep(self.POLL_S)
        log.error("SLURM job %s had not ended %.0f s after scancel", self.job_id, end)

    def _look(self) -> slurm.JobState | None:
        """SLURM's view of the job now, written to run.json when it changed."""
        try:
            state = slurm.job_state(self.job_id or "")
        except slurm.SlurmError as exc:
            log.warning("%s", exc)
            return None
        if state == self.last:
            return state
        log.info("SLURM job %s: %s (%s) on %s", self.job_id, state.state, state.reason, state.nodes)
        self.last = state
        if state.state == "RUNNING" and state.nodes:
            self.nodes = state.nodes
        # Which node SLURM lost, asked at once: the job's record does not say (while the job
        # completes it lists the nodes left), and the node may be back in service soon.
        nodes = self.nodes or state.nodes
        failing = state.state == "NODE_FAIL" or state.reason == "NodeDown"
        lost = slurm.down_nodes(nodes) if failing and nodes else {}
        if lost:
            log.info("SLURM job %s lost node(s) %s", self.job_id, lost)
            self.lost_nodes.update(lost)

        def seen(d: dict[str, Any]) -> None:
            info = d.setdefault("slurm", {})
            info.update(state=state.state, reason=state.reason)
            if self.lost_nodes:
                info["lost_nodes"] = dict(self.lost_nodes)
            if state.nodes:
                info["nodes"] = state.nodes
            if state.state in ("RUNNING", "COMPLETING") and d["state"] == "queued":
                d["state"] = "running"
                d["started_at"] = time.time()

        self.run.update_run(seen)
        return state

    def _read_node_failures(self) -> None:
        """The nodes srun said it lost, from the job's output, where SLURM's node states did
        not show them (a node back in service before the supervisor looked): into run.json."""
        out = self.run.path / f"slurm-{self.job_id}.out"
        try:
            text = out.read_text(errors="replace")
        except OSError:
            return
        found = {
            node: f"srun: Node failure on {node}"
            for node in slurm.failed_nodes_in(text)
            if node not in self.lost_nodes
        }
        if not found:
            return
        self.lost_nodes.update(found)
        lost = dict(self.lost_nodes)
        self.run.update_run(lambda d: d.setdefault("slurm", {}).__setitem__("lost_nodes", lost))

    def finish(self) -> None:
        state = self.last or slurm.JobState(state="UNKNOWN")
        ok = state.state == "COMPLETED" and not state.exit_code
        failed = None
        if not ok:
            failed = f"SLURM job {self.job_id} ended {state.state}"
            if state.exit_code is not None:
                failed += f" (exit code {state.exit_code}, signal {state.signal})"
            failed += " before any rank started"
        error = self.queue_error
        if state.state == "NODE_FAIL":
            self._read_node_failures()
        if error is None and state.state in ("NODE_FAIL", "BOOT_FAIL", "TIMEOUT", "PREEMPTED"):
            error = f"SLURM ended the job: {state.state} ({state.reason or 'no reason given'})"
            if self.lost_nodes:
                error += ": " + ", ".join(
                    f"node {node} went down ({why})"
                    for node, why in sorted(self.lost_nodes.items())
                )
        self._finish(
            ok=ok,
            code=state.exit_code or (0 if ok else 1),
            failed=failed,
            see=f"slurm-{self.job_id}.out",
            error=error,
        )
        if self.queue_error is not None:

            def never(d: dict[str, Any]) -> None:
                d["state"] = "failed_to_start"
                d["error"] = self.queue_error

            self.run.update_run(never)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Its stderr is the run directory's supervisor.log: every decision lands there.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    run = RunDir(argv[0])
    data = run.read_run()
    sup = (SlurmSupervisor if data.get("launcher") == "slurm" else Supervisor)(run)
    signal.signal(signal.SIGTERM, lambda *_: sup.request_stop("stopped"))
    signal.signal(signal.SIGINT, lambda *_: sup.request_stop("stopped"))
    # the agents first: one forked from this process (rankscope._warm) is forked before any
    # thread of this one starts
    if not sup.launch():
        return 1
    sup.watch_owner()
    print("started", flush=True)
    sup.wait()
    sup.finish()
    return 0 if run.read_run().get("state") in FINAL_STATES else 1


if __name__ == "__main__":
    raise SystemExit(main())
