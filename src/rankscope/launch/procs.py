"""Finding and ending every process of a job.

torchrun starts each worker in a session of its own, and a worker may start more (data loader
workers), so signalling one process group is not enough. Every process of a job carries
``RANKSCOPE_RUN_DIR`` in its environment; that marks it as ours without relying on parentage,
which is lost once an agent dies and its workers are re-parented.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import psutil

from rankscope.launch import slurm
from rankscope.rundir import ENV_RUN_DIR, RunDir


@dataclass(frozen=True)
class RankProc:
    """Where one rank's process runs: a pid on this host, or a pid on a SLURM node of a job,
    reached through ``srun --overlap`` (a pid means nothing on another host)."""

    pid: int
    node: str | None = None
    """The SLURM node it runs on; None: this host."""
    slurm_job: str | None = None

    @property
    def remote(self) -> bool:
        # A job started inside an allocation on this very node (salloc, then a local job)
        # runs here.
        here = os.environ.get("SLURMD_NODENAME")
        return self.node is not None and self.slurm_job is not None and self.node != here

    def alive(self) -> bool | None:
        """Whether it runs; None where this host cannot tell (another node)."""
        return None if self.remote else pid_alive(self.pid)

    def beside(self, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` where this rank runs."""
        if not self.remote:
            return list(argv)
        return slurm.next_to(self.slurm_job or "", self.node or "", argv)

    def send(self, sig: signal.Signals) -> None:
        """Send it a signal, here or through srun on its node; errors are ignored (it may have
        ended)."""
        if not self.remote:
            with contextlib.suppress(OSError):
                os.kill(self.pid, sig)
            return
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                self.beside(["kill", f"-{sig.name.removeprefix('SIG')}", str(self.pid)]),
                capture_output=True,
                timeout=slurm.CALL_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )


def job_processes(run: RunDir, *, roots: Iterable[int] = ()) -> list[psutil.Process]:
    """Live processes of the job: ``roots`` and their descendants, plus any process whose
    environment names this run directory."""
    found: dict[int, psutil.Process] = {}
    for pid in roots:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            found[proc.pid] = proc
            for child in proc.children(recursive=True):
                found[child.pid] = child
    target = str(run.path)
    me = os.getpid()
    for proc in psutil.process_iter():
        if proc.pid in found or proc.pid == me:
            continue
        try:
            if proc.environ().get(ENV_RUN_DIR) == target:
                found[proc.pid] = proc
        except (psutil.Error, OSError):
            continue
    return [p for p in found.values() if _alive(p)]


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def terminate(run: RunDir, *, roots: Iterable[int] = (), grace_s: float = 5.0) -> list[int]:
    """SIGTERM every process of the job, then SIGKILL what is left after ``grace_s``.

    Returns the pids that had to be killed. ``roots`` are the torchrun agents (their whole
    process groups are signalled first, so torchrun's own shutdown runs).
    """
    roots = list(roots)
    for pid in roots:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGTERM)
    procs = job_processes(run, roots=roots)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        procs = [p for p in procs if _alive(p)]
        if not procs:
            break
        time.sleep(0.05)
    killed = []
    for proc in job_processes(run, roots=roots):
        with contextlib.suppress(psutil.Error):
            proc.kill()
            killed.append(proc.pid)
    for pid in roots:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
    psutil.wait_procs([p for p in procs if _alive(p)], timeout=2)
    return killed


def when_owner_gone(callback: Callable[[], None]) -> threading.Thread:
    """Call ``callback`` (in a thread) when stdin reaches EOF: the owner holds the write end
    of this process's stdin, so its death closes it, however it dies."""

    def reader() -> None:
        # Raw reads on fd 0: a buffered reader's lock would trip interpreter shutdown.
        try:
            while os.read(0, 1024):
                pass
        except OSError:
            pass
        callback()

    thread = threading.Thread(target=reader, name="rankscope-owner", daemon=True)
    thread.start()
    return thread


def pid_alive(pid: int | None, *, created: float | None = None) -> bool:
    """Whether ``pid`` runs (and, given ``created``, is the same process that was recorded)."""
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if created is not None and abs(proc.create_time() - created) > 1.0:
            return False
        return _alive(proc)
    except psutil.Error:
        return False
