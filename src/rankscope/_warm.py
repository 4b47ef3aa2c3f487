"""A warm interpreter that starts jobs by fork: torch is imported once per owner, not per job.

Each job's torchrun agent imports torch (about 2.5 s of CPU, settled) and the template its
ranks fork from imports torch and torch._dynamo (about 3.5 s; :mod:`rankscope._template`): on a
laptop's two cores, most of a small job's start, paid again by every job a notebook starts. A
process that starts jobs (a kernel, the CLI, a test worker: the *owner*) keeps a *warm*
interpreter that has imported all of it once, settled (:mod:`rankscope._settle`), and forks each
job's supervisor from it (:func:`supervisor`); the supervisor forks its torchrun agent
(:func:`agent_popen`), and the agent its template, which then has nothing left to import.

It is used only where that cannot change what the job does:

- the agent's environment, as torch's import reads it, is the warm interpreter's: every
  variable the same, but for the job's own (:data:`JOB_KEYS`, which no import reads), with
  ``OMP_NUM_THREADS`` as the agent sets it before its import
  (:func:`rankscope._template.import_env`);
- the ranks fork from the template (:func:`rankscope._template.wanted`: the string hash seed is
  fixed), the command is ``python -m rankscope.torchrun`` with this interpreter, on Linux.

What differs from new interpreters, besides the template's list:

- ``/proc/<pid>/environ`` of the supervisor, the agent and the ranks shows the warm
  interpreter's environment (the agent's, without the job's own variables); in the agent and
  the ranks with the job's ``RANKSCOPE_RUN_DIR`` written into the place the warm interpreter
  keeps for it at the end of its environment, in the supervisor without it, as they are
  started the usual way (:func:`_mark`): that variable is what finds a job's processes
  (:mod:`rankscope.launch.procs`). Their ``os.environ`` is exactly the usual one.
- The supervisor is the warm interpreter's child, not the owner's: the owner follows it by its
  pid (:class:`Started`); it learns of its owner's death from its stdin, the owner's pipe, as
  before. The warm interpreter ends once its owner is gone (or after :data:`IDLE_S` without a
  request) and its supervisors have ended.

At most :data:`SERVERS` warm interpreters an owner (one per environment, about 0.5 GB each,
most of it shared with the jobs it starts; the one used least recently gives way to a new one).
The first two jobs of an environment start the usual way: the second starts its warm
interpreter, which imports while that job runs (an owner that starts a single job, as
``rankscope run`` does, never starts one). ``RANKSCOPE_WARM=0`` starts every job the usual way.
Standard library and torch only in what the warm interpreter runs before a fork.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import pickle
import runpy
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
from typing import Any, NoReturn

from rankscope import _template

#: Set to 0 to start every job the usual way.
ENV_WARM = "RANKSCOPE_WARM"
#: Variables that change from job to job of one owner and that no import of the warm
#: interpreter reads, so jobs that differ only there share one: what a job sets for itself
#: (:meth:`rankscope.launch.spec.JobSpec.rank_env`), and the test pytest runs (read by
#: torch.testing's helpers alone).
JOB_KEYS = (
    "RANKSCOPE_RUN_DIR",
    "RANKSCOPE_BACKEND",
    "RANKSCOPE_COLLECTIVE_TIMEOUT",
    "PYTEST_CURRENT_TEST",
)
_RUN_DIR = JOB_KEYS[0]
#: The place kept for a job's run directory in the warm interpreter's environment block.
_PLACE = "_" * 4096
SERVERS = 2
#: A warm interpreter not asked for a job this long, with no supervisor of its own left, ends.
IDLE_S = 600.0
#: How long an owner waits for a warm interpreter's answer before it gives that one up.
REPLY_S = 30.0
_SHAPE = ("-m", "rankscope.torchrun")


# --- the owner's side ----------------------------------------------------------------------


class Started:
    """A supervisor the warm interpreter forked: its pid, the write end of its stdin (held as
    long as this object, as ``Popen`` holds it), and whether it runs."""

    def __init__(self, pid: int, stdin: Any):
        self.pid = pid
        self.stdin = stdin
        self._started = _stat(pid)[1]

    def running(self) -> bool:
        """Whether it runs (its exit status is its parent's, the warm interpreter's)."""
        state, started = _stat(self.pid)
        return started == self._started and state not in (None, "Z", "X")


class _Server:
    """The owner's end of one warm interpreter."""

    def __init__(self, env: dict[str, str]):
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # the job's run directory goes last, where the supervisor can write it (_mark)
        env = {k: v for k, v in env.items() if k not in JOB_KEYS} | {_RUN_DIR: _PLACE}
        with theirs:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "rankscope._warm", str(theirs.fileno())],
                env=env,
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.ready = False  # it imported everything and answered
        self.gone = False  # its socket is closed: it ends once its supervisors have

    def usable(self) -> bool:
        """Whether it is ready and still there (without waiting for it)."""
        if not self.gone and select.select([self.sock], [], [], 0)[0]:
            # "R" once it has imported everything; after that, only its end
            if not self.ready and self.sock.recv(1) == b"R":
                self.ready = True
            else:
                self.close()
        return self.ready and not self.gone

    def fork(self, request: dict[str, Any], fds: list[int]) -> int:
        """The pid of a process forked for ``request``, its stdio ``fds``; it runs once the
        pid is acknowledged, so a request that fails here starts nothing."""
        data = pickle.dumps(request)
        try:
            self.sock.settimeout(REPLY_S)
            pid = _template.send_request(self.sock, data, fds)
            if pid <= 0:
                raise OSError("the warm interpreter could not fork")
            self.sock.sendall(b"A")
            return pid
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Let it go: it ends once its supervisors have."""
        self.gone = True
        self.sock.close()
        with contextlib.suppress(OSError):
            self.proc.poll()


_servers: dict[tuple[tuple[str, str], ...], _Server] = {}
#: The environments of the jobs this owner started the usual way: the second job of one starts
#: its warm interpreter (an owner that starts one job, as ``rankscope run`` does, never does).
_seen: set[tuple[tuple[str, str], ...]] = set()
_lock = threading.Lock()


def _forget() -> None:
    """In a process forked from an owner: its warm interpreters are the owner's, not this
    one's (their sockets' copies closed here; the owner's stay open)."""
    global _lock
    _lock = threading.Lock()
    for server in _servers.values():
        with contextlib.suppress(OSError):
            server.sock.close()
    _servers.clear()
    _seen.clear()


os.register_at_fork(after_in_child=_forget)


def _key(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in env.items() if k not in JOB_KEYS))


def _agent_env(env: dict[str, str], command: list[str]) -> dict[str, str] | None:
    """The environment torch's import sees in the agent ``command`` starts with ``env``, or
    None where the warm start does not apply to it."""
    if env.get(ENV_WARM, "1") == "0" or _template.wanted(env) is not None:
        return None
    if len(command) < 3 or command[0] != sys.executable or tuple(command[1:3]) != _SHAPE:
        return None
    return {**env, **_template.import_env(env, command[3:])}


def supervisor(
    argv: list[str],
    *,
    env: dict[str, str],
    agent_env: dict[str, str],
    commands: list[list[str]],
    pipe_stdin: bool,
    stderr: Any,
) -> Started | None:
    """Start a job's supervisor (``argv``: ``python -m MODULE ARGS``) from a warm interpreter
    whose environment is its agents' (each started with ``agent_env`` and one of
    ``commands``); None where none is ready: the caller starts it the usual way. With
    ``pipe_stdin`` its stdin is a pipe whose write end the returned object holds, else
    /dev/null."""
    keys = {_key(e) for c in commands if (e := _agent_env(agent_env, c)) is not None}
    if len(keys) != 1 or len(commands) == 0 or not sys.platform.startswith("linux"):
        return None
    if len(agent_env.get(_RUN_DIR, "").encode()) > len(_PLACE):
        return None  # no room for it where /proc shows it (_mark)
    (key,) = keys
    with _lock:
        server = _servers.get(key)
        if server is not None and not server.usable():
            if not server.gone or not server.ready:
                return None  # still importing, or it could not start: the usual way
            del _servers[key]  # it ended (idle): a new one for the jobs after this one
            server = None
        if server is None:
            if key not in _seen:
                _seen.add(key)
                return None
            if len(_servers) >= SERVERS:  # the one used least recently goes, once its jobs have
                _servers.pop(next(iter(_servers))).close()
            _servers[key] = _Server(dict(key))
            return None
        _servers[key] = _servers.pop(key)  # the most recently used last
        read, write = os.pipe() if pipe_stdin else (None, None)
        null = os.open(os.devnull, os.O_RDWR)
        try:
            pid = server.fork(
                {"argv": argv, "env": env, "cwd": os.getcwd()},
                [read if read is not None else null, null, stderr.fileno()],
            )
        except BaseException as exc:
            if write is not None:
                os.close(write)
            if isinstance(exc, (OSError, EOFError)):
                return None  # nothing was started (_Server.fork): the usual way
            raise
        finally:
            os.close(null)
            if read is not None:
                os.close(read)
    return Started(pid, os.fdopen(write, "wb") if write is not None else None)


def _stat(pid: int) -> tuple[str | None, int | None]:
    """A process's state letter and start time in clock ticks (/proc), or Nones where it is
    gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2 :].split()
        return fields[0].decode(), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None, None


# --- the supervisor's side -----------------------------------------------------------------

#: In a process forked from a warm interpreter: the environment (as :func:`_key` keys it) that
#: its imports saw; None elsewhere.
_served: tuple[tuple[str, str], ...] | None = None
#: The descriptors the warm interpreter's imports left open: a process forked from it keeps
#: these, and closes the rest, as ``Popen``'s ``close_fds`` does before a new interpreter.
_kept: frozenset[int] = frozenset()
_logging: tuple[list[logging.Handler], int] = ([], logging.WARNING)
#: Where the environment block keeps ``RANKSCOPE_RUN_DIR`` (:func:`_slot`).
_place: tuple[int, int] | None = None


class Become(BaseException):
    """Raised in a process forked from a warm interpreter's child to become another program:
    it unwinds the program it was to the warm interpreter's main, which runs ``argv``."""

    def __init__(self, argv: list[str]):
        super().__init__(argv)
        self.argv = argv


def agent_popen(command: list[str], env: dict[str, str]) -> type[subprocess.Popen]:
    """``Popen``, or in a supervisor forked from a warm interpreter that imported for the
    torchrun agent ``command`` started with ``env``, a ``Popen`` whose child is forked from this
    process (:class:`_Agent`)."""
    if _served is None or threading.active_count() != 1:
        return subprocess.Popen
    agent_env = _agent_env(env, command)
    return _Agent if agent_env is not None and _key(agent_env) == _served else subprocess.Popen


class _Agent(subprocess.Popen):
    """A ``Popen`` whose child is this process forked, made what ``Popen`` makes of a new one
    (:func:`_become`), that then runs the command as its main program (:class:`Become`); the
    rest (``poll``, ``wait``, ``returncode``) is Popen's own."""

    def _execute_child(self, args: Any, *rest: Any) -> None:
        cwd, env = rest[4], rest[5]
        p2cread, c2pwrite, errwrite = rest[9], rest[12], rest[14]
        _template._flush_all()
        pid = os.fork()
        if pid == 0:
            try:
                _mark(env.get(_RUN_DIR))
                _become(env, os.fspath(cwd) if cwd else os.getcwd(), [p2cread, c2pwrite, errwrite])
                logging.root.handlers[:] = _logging[0]  # the supervisor's log is not its
                logging.root.setLevel(_logging[1])
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.default_int_handler)
            except BaseException:
                os._exit(255)  # as a command that could not be executed
            raise Become(list(args))
        self.pid = pid
        self._child_created = True


def _become(env: dict[str, str], cwd: str, fds: list[int]) -> None:
    """Make this forked process what ``Popen`` makes of a new one: a session of its own,
    ``fds`` as its stdin, stdout and stderr and no other descriptor of its parent's, ``cwd``
    and ``env``."""
    os.setsid()
    for target, fd in enumerate(fds):
        if fd != target:
            os.dup2(fd, target)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in _kept:
            with contextlib.suppress(OSError):
                os.close(fd)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)


# --- the warm interpreter ------------------------------------------------------------------


def _serve(sock: socket.socket) -> list[str]:
    """Import what a job's processes import, then fork one at each request. Returns only in
    a forked process: its command line."""
    global _served, _kept, _logging, _place
    _place = _slot()
    if _place is None:
        os._exit(0)  # no place for the run directory: the owner starts jobs the usual way
    served = _key(dict(os.environ))  # what the imports read (torch._dynamo's sets a variable)
    gc.disable()
    try:
        import torch
        import torch.distributed.run

        gpu = torch.version.cuda or torch.version.hip or getattr(torch._C, "_has_xpu", False)
        if not gpu:  # its import may ask for a GPU: never before a fork where there can be one
            import torch._dynamo
        # what the supervisor imports (not itself: ``-m`` runs a module not yet imported)
        import rankscope.launch  # noqa: F401
    except Exception:
        os._exit(0)
    finally:
        gc.enable()
    gc.freeze()
    _served = served
    _kept = frozenset(_template._open_fds()) - {sock.fileno()}
    _logging = (list(logging.root.handlers), logging.root.level)
    children: set[int] = set()

    def reap(*_: Any) -> None:
        with contextlib.suppress(ChildProcessError):
            while (pid := os.waitpid(-1, os.WNOHANG)[0]) > 0:
                children.discard(pid)

    signal.signal(signal.SIGCHLD, reap)
    sock.sendall(b"R")
    while True:
        sock.settimeout(IDLE_S)
        try:
            (size,) = struct.unpack("!Q", _template._recv_exact(sock, 8))
        except TimeoutError:
            if children:
                continue
            os._exit(0)
        except (OSError, EOFError, struct.error):
            _last(children)
        try:  # the rest of a request comes at once: anything else ends the conversation
            sock.settimeout(REPLY_S)
            data, fds = _template.recv_request(sock, size, 3)
        except (OSError, EOFError):
            _last(children)
        request = pickle.loads(data)  # from the owner that started us, over our socketpair
        gate, go = os.pipe()
        _template._flush_all()
        # a child that ends at once is reaped after it is counted, not before
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            sock.close()
            os.close(go)
            if os.read(gate, 1) != b"G":  # the owner did not take the pid: nothing runs
                os._exit(0)
            os.close(gate)
            _mark(None)  # the supervisor's own environment does not name the run
            _become(request["env"], request["cwd"], fds)
            return list(request["argv"])
        children.add(pid)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        os.close(gate)
        for fd in fds:
            os.close(fd)
        try:
            sock.sendall(struct.pack("!q", pid))
            taken = _template._recv_exact(sock, 1) == b"A"
        except (OSError, EOFError):
            taken = False
        if taken:
            os.write(go, b"G")
        os.close(go)
        if not taken:
            _last(children)


def _last(children: set[int]) -> NoReturn:
    """The owner is gone: end once every process forked for it has."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    with contextlib.suppress(ChildProcessError):
        while True:
            os.waitpid(-1, 0)
    os._exit(0)


def _slot() -> tuple[int, int] | None:
    """Where ``RANKSCOPE_RUN_DIR`` lies in this process's environment block (the block
    ``/proc/<pid>/environ`` reads), and its length: the block's last variable, the place kept
    for it (:data:`_PLACE`). None where it is not so."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2 :].split()
        start, end = int(fields[47]), int(fields[48])
    except (OSError, ValueError, IndexError):
        return None
    place = f"{_RUN_DIR}={_PLACE}\0".encode()
    if not ctypes.string_at(start, end - start).endswith(place):
        return None
    return end - len(place), len(place) - 1


def _mark(run_dir: str | None) -> None:
    """Write ``RANKSCOPE_RUN_DIR=run_dir`` into the place kept for it at the end of the
    environment block, or nothing (the block then ends before it), so that this process and
    what forks from it show it in ``/proc/<pid>/environ`` as a process started with it would."""
    if _place is None:
        return
    address, size = _place
    entry = f"{_RUN_DIR}={run_dir}".encode() if run_dir else b""
    if len(entry) > size or b"\0" in entry:
        entry = b""
    ctypes.memmove(address, entry + b"\0" * (size - len(entry)), size)


def _main(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    os.set_inheritable(fd, False)
    argv = _serve(sock)
    while True:
        sys.argv = argv[2:]
        try:
            runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
            return
        except Become as become:
            argv = become.argv


if __name__ == "__main__":
    # run as the module the supervisor imports (rankscope._warm), whose globals it reads
    from rankscope._warm import _main as main

    main(int(sys.argv[1]))
