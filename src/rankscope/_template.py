"""Ranks forked from a template that imported torch once.

torchrun starts each rank as a new interpreter, and each imports torch: about 3 s of CPU, 5 to
6 s with torch._dynamo, which a rank's first optimizer imports. On a laptop's two cores a
three-rank job spends most of its start there. Here :mod:`rankscope.torchrun`'s agent forks,
before any thread of its own starts, a *template* process that imports torch and torch._dynamo
once (settled: :mod:`rankscope._settle`), and each rank the agent starts is forked from the
template instead of exec'd. The rank is still the agent's own child, as torchrun expects: the
agent is made a child subreaper, and the process between the template and the rank exits at
once. Its pid, exit status, session and process group, stdout and stderr, environment (what
``os.environ`` holds), working directory and argv are what ``Popen`` gives a new interpreter.

What is not the same as a new interpreter, and why the template is used only where that cannot
change what the job does:

- Python's string hashes: a new interpreter draws its own hash seed, so two ranks may iterate a
  set of names in two orders (a real cause of mismatched collectives); ranks forked from one
  template share the template's. The template is used only where the ranks' environment fixes
  ``PYTHONHASHSEED`` (the same for every rank, and the template's own).
- ``/proc/<pid>/cmdline`` and ``/proc/<pid>/environ`` show the agent's start, not the rank's
  (what finds a job's processes reads ``RANKSCOPE_RUN_DIR``, which both carry).
- numpy's global random state is drawn again in each rank (Python's ``random`` does this
  itself); ``OMP_NUM_THREADS``, which torchrun sets after the template's import, is applied with
  ``torch.set_num_threads``.

A command of another shape than ``python -u -m rankscope.probe.bootstrap ...``, a template that
is gone, or ``RANKSCOPE_FORK_RANKS=0`` starts the rank the usual way. Linux only.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import io
import os
import pickle
import socket
import struct
import subprocess
import sys
import threading
from typing import Any

#: Set to 0 to start every rank as a new interpreter.
ENV_FORK = "RANKSCOPE_FORK_RANKS"
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36
#: The rank commands the template starts: torchrun's ``python -u -m MODULE ARGS``.
_SHAPE = ("-u", "-m", "rankscope.probe.bootstrap")

_sock: socket.socket | None = None  # the agent's end; None where there is no template
_inherited: list[int] = []  # the agent's descriptors at the fork, past stdio
_lock = threading.Lock()


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def wanted(env: dict[str, str] | os._Environ[str]) -> str | None:
    """Why the template is not used for a job with this environment, or None where it is."""
    if env.get(ENV_FORK, "1") == "0":
        return f"{ENV_FORK}=0"
    if not sys.platform.startswith("linux"):
        return "not Linux"
    if not env.get("PYTHONHASHSEED") or env.get("PYTHONHASHSEED") == "random":
        return "PYTHONHASHSEED is not fixed: each rank draws its own string hashes"
    return None


def start() -> dict[str, Any] | None:
    """In the agent, before torchrun's main: fork the template and make the agent start its
    ranks from it; return None. In a rank forked from the template, return the rank's request
    (its fds, environment and directory are in place): the caller runs it
    (:func:`run_rank`)."""
    global _sock
    if wanted(os.environ) is not None or threading.active_count() != 1:
        return None
    if not _prctl(_PR_SET_CHILD_SUBREAPER, 1):
        return None
    global _inherited
    _inherited = [int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) > 2]
    agent, template = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:  # the agent
        template.close()
        _sock = agent
        atexit.register(_close, pid)
        if not _patch_torchrun():  # a torch whose torchrun starts ranks otherwise
            _close(pid)
        return None
    agent.close()
    return _serve(template)


def _close(template: int) -> None:
    """At the agent's exit: the template sees the socket close and ends; the agent reaps it."""
    global _sock
    with _lock:
        if _sock is not None:
            _sock.close()
        _sock = None
    with contextlib.suppress(OSError):
        os.waitpid(template, 0)


def _serve(sock: socket.socket) -> dict[str, Any]:
    """The template: import what every rank imports, then fork a rank at each request. Returns
    only in a rank."""
    _prctl(_PR_SET_PDEATHSIG, 9)  # gone with its agent
    gc.disable()
    try:
        import torch
        import torch.distributed

        if not (os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/kfd")):
            # its import may ask whether there is a GPU: never before a fork where there is one
            import torch._dynamo  # noqa: F401
    except Exception:
        os._exit(0)  # the agent starts ranks the usual way once the socket is closed
    finally:
        gc.enable()
    gc.freeze()
    while True:
        try:
            head = _recv_exact(sock, 8)
            (size,) = struct.unpack("!Q", head)
            data, fds, _, _ = socket.recv_fds(sock, size, 2)
            while len(data) < size:
                data += _recv_exact(sock, size - len(data))
        except (OSError, EOFError):
            os._exit(0)
        request = pickle.loads(data)  # from the agent that forked us, over our own socketpair
        read, write = os.pipe()
        middle = os.fork()
        if middle == 0:
            os.close(read)
            rank = os.fork()
            if rank == 0:
                os.close(write)
                sock.close()
                return _become(request, fds)
            os.write(write, struct.pack("!q", rank))
            os._exit(0)
        os.close(write)
        for fd in fds:
            os.close(fd)
        got = _read_all(read)
        os.close(read)
        os.waitpid(middle, 0)  # the rank is the agent's child from here on
        pid = struct.unpack("!q", got)[0] if len(got) == 8 else -1
        try:
            sock.sendall(struct.pack("!q", pid))
        except OSError:
            os._exit(0)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _read_all(fd: int) -> bytes:
    out = b""
    while chunk := os.read(fd, 64):
        out += chunk
    return out


def _become(request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
    """Make this process the rank ``request`` describes, as ``Popen`` would have made it."""
    os.setsid()
    for target, fd in zip((1, 2), fds, strict=False):
        if fd != target:
            os.dup2(fd, target)
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd in _inherited:  # what Popen's close_fds closes: the agent's, not the rank's
        with contextlib.suppress(OSError):
            os.close(fd)
    # the interpreter's -u: no buffer under the text layer, which writes through
    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        raw = io.FileIO(fd, "w", closefd=False)
        stream = io.TextIOWrapper(raw, encoding=old.encoding, errors=old.errors, write_through=True)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    threads = request["env"].get("OMP_NUM_THREADS")
    if threads and threads.isdigit() and int(threads) > 0:
        sys.modules["torch"].set_num_threads(int(threads))
    return request


def run_rank(request: dict[str, Any]) -> None:
    """Run the rank's module as ``python -m`` would, as this process's main program: its
    SystemExit, its uncaught exception and its end are the interpreter's to handle."""
    import runpy

    args = request["args"]
    sys.argv = [args[3], *args[4:]]
    runpy.run_module(args[3], run_name="__main__", alter_sys=True)


class _Forked(subprocess.Popen):
    """A ``Popen`` whose child is forked from the template: everything else (its attributes,
    ``poll``, ``wait``, ``send_signal``) is Popen's own."""

    def _execute_child(self, args: Any, *rest: Any, **kwargs: Any) -> None:
        env, cwd = self._spawn_env, os.getcwd()
        fds = [f.fileno() for f in self._spawn_files]
        data = pickle.dumps({"args": list(args), "env": dict(env), "cwd": cwd})
        with _lock:
            sock = _sock
            if sock is None:
                raise OSError("the template is gone")
            sock.sendall(struct.pack("!Q", len(data)))
            socket.send_fds(sock, [data], fds)
            (pid,) = struct.unpack("!q", _recv_exact(sock, 8))
        if pid <= 0:
            raise OSError("the template could not fork the rank")
        self.pid = pid
        self._child_created = True


def _spawn(args: tuple[str, ...], env: dict[str, str], stdout: Any, stderr: Any) -> Any:
    """A rank forked from the template, or None where it cannot be."""
    global _sock
    if _sock is None or tuple(args[1:4]) != _SHAPE or args[0] != sys.executable:
        return None
    if wanted(env) is not None or env.get("PYTHONHASHSEED") != os.environ.get("PYTHONHASHSEED"):
        return None
    files = [stdout, stderr]

    class Rank(_Forked):
        _spawn_env, _spawn_files = env, files

    try:
        return Rank(list(args), env=env, stdout=stdout, stderr=stderr, start_new_session=True)
    except (OSError, EOFError):
        with _lock:
            if _sock is not None:
                _sock.close()
            _sock = None
        return None


def _patch_torchrun() -> bool:
    """Make torchrun's agent start its ranks from the template; False where this torch's agent
    has no ``SubprocessHandler._popen(args, env)`` to take them from."""
    try:
        from torch.distributed.elastic.multiprocessing.subprocess_handler import (
            subprocess_handler as handler,
        )

        usual = handler.SubprocessHandler._popen
    except (ImportError, AttributeError):
        return False

    def _popen(self: Any, args: tuple[str, ...], env: dict[str, str]) -> Any:
        files = [getattr(self, "_stdout", None), getattr(self, "_stderr", None)]
        if all(isinstance(f, io.IOBase) for f in files):
            # the agent's whole environment with the rank's on top, as Popen's child gets it
            forked = _spawn(args, {**os.environ, **env}, *files)
            if forked is not None:
                return forked
        return usual(self, args, env)

    handler.SubprocessHandler._popen = _popen
    return True
