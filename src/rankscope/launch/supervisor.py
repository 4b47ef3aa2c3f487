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

from rankscope.launch.procs import terminate
from rankscope.rundir import DIST_ENV, FINAL_STATES, RunDir, rank_summaries, torchrun_failures

log = logging.getLogger("rankscope.launch.supervisor")  # it runs as __main__


class Supervisor:
    def __init__(self, run: RunDir):
        self.run = run
        self.data = run.read_run()
        self.detached = bool(self.data.get("detached"))
        self.owner = int(self.data.get("owner_pid") or 0)
        self.agents: list[subprocess.Popen[bytes]] = []
        self.stop_reason: str | None = None
        self.killed: set[int] = set()
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
                    subprocess.Popen(
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
        if self.detached:
            return

        def reader() -> None:
            # Raw reads on fd 0: a buffered reader's lock would trip interpreter shutdown.
            try:
                while os.read(0, 1024):
                    pass
            except OSError:
                pass
            self.request_stop("owner_died")

        threading.Thread(target=reader, daemon=True).start()

    def wait(self) -> None:
        timeout = self.data["spec"].get("timeout_s")
        deadline = time.monotonic() + timeout if timeout else None
        while True:
            if all(p.poll() is not None for p in self.agents):
                return
            if not self.detached and os.getppid() != self.owner:
                self.request_stop("owner_died")
            if deadline is not None and time.monotonic() > deadline:
                self.request_stop("timeout")
            if self._stop.wait(0.1):
                break
        self._record_stop()
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
        text = ""
        for node in range(len(self.agents)):
            try:
                text += self.run.launcher_log(node).read_text(errors="replace")
            except OSError:
                pass
        failures = torchrun_failures(text)
        ranks = rank_summaries(self.run)
        world = int(self.data["world_size"])
        now = self.run.read_run()
        stopped = self.stop_reason is not None or now.get("stop_reason")
        never_started = self._never_started(now) if stopped and not ranks else None

        def final(d: dict[str, Any]) -> None:
            d["agents"] = [
                {"node": i, "pid": p.pid, "exit_code": p.returncode}
                for i, p in enumerate(self.agents)
            ]
            table = {}
            for r in range(world):
                info = dict(ranks.get(r, {}))
                # torchrun saw the process end; the probe's end event comes a little earlier
                # (a crash during interpreter shutdown happens after it).
                code = failures.get(r, info.get("exit_code"))
                if code is None and info.get("pid") is not None:
                    if stopped:  # ended by our SIGTERM, or by the SIGKILL after the grace period
                        code = -signal.SIGKILL if info["pid"] in self.killed else -signal.SIGTERM
                    elif all(c == 0 for c in codes):
                        code = 0
                info["exit_code"] = code
                table[str(r)] = info
            d["ranks"] = table
            if never_started is not None:
                d["state"] = "failed_to_start"
                d["error"] = never_started
            elif stopped:
                d["state"] = "stopped"
            elif not ranks and any(c != 0 for c in codes):
                d["state"] = "failed_to_start"
                d["error"] = (
                    f"{self.launcher} exited with {codes} before any rank started; "
                    f"see {self.run.launcher_log().name}"
                )
            else:
                d["state"] = "exited"
            rank_codes = [info["exit_code"] for info in table.values()]
            ok = all(c == 0 for c in codes) and all(c == 0 for c in rank_codes)
            d["exit_code"] = 0 if ok else (max((c for c in codes if c), default=0) or 1)
            d["ended_at"] = time.time()
            log.info("final state %s, exit code %s", d["state"], d["exit_code"])

        self.run.update_run(final)

    def _never_started(self, data: dict[str, Any]) -> str | None:
        """Why a job that the startup watchdog stopped never ran: no rank reported its start
        in time, so the launcher never got its workers going. None if the stop had another
        reason."""
        startup = [s for s in data.get("stalls") or [] if s.get("kind") == "startup"]
        if not startup:
            return None
        limit = self.data["spec"].get("startup_timeout_s")
        logs = ", ".join(self.run.launcher_log(n).name for n in range(len(self.agents)))
        return (
            f"the startup watchdog stopped the job after {limit:g} s with no rank started: the "
            f"{self.launcher} launcher never got its workers going. With several nodes that is "
            "usually a rendezvous that never completed (every node needs the same --rdzv-id, "
            f"--rdzv-endpoint and --nnodes); see {logs}"
        )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Its stderr is the run directory's supervisor.log: every decision lands there.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    run = RunDir(argv[0])
    sup = Supervisor(run)
    signal.signal(signal.SIGTERM, lambda *_: sup.request_stop("stopped"))
    signal.signal(signal.SIGINT, lambda *_: sup.request_stop("stopped"))
    sup.watch_owner()
    if not sup.launch():
        return 1
    print("started", flush=True)
    sup.wait()
    sup.finish()
    return 0 if run.read_run().get("state") in FINAL_STATES else 1


if __name__ == "__main__":
    raise SystemExit(main())
