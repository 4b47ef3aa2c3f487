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
- What a new interpreter draws or sizes at its start is done again in each rank: numpy's global
  random state (Python's ``random`` does it itself), multiprocessing's key, the C library's
  streams unbuffered as ``-u`` makes them; ``OMP_NUM_THREADS=1``, which torchrun sets for
  several ranks a node after its own import of torch, is set before that import
  (:func:`prepare`), so the thread pools the import sizes are a rank's.
- The agent is a child subreaper: a process a rank leaves behind (a data loader's worker) is
  the agent's when the rank ends, a zombie until the agent ends, not init's.

A command of another shape than ``python -u -m rankscope.probe.bootstrap ...``, a template that
is gone, or ``RANKSCOPE_FORK_RANKS=0`` starts the rank the usual way. Linux only.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import gc
import io
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
import traceback
from typing import Any

#: Set to 0 to start every rank as a new interpreter.
ENV_FORK = "RANKSCOPE_FORK_RANKS"
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36
#: The rank commands the template starts: torchrun's ``python -u -m MODULE ARGS``.
_SHAPE = ("-u", "-m", "rankscope.probe.bootstrap")
#: How long the agent waits for the template to fork a rank before it starts ranks the usual way.
REPLY_S = 60.0

_sock: socket.socket | None = None  # the agent's end; None where there is no template
_inherited: list[int] = []  # the agent's descriptors at the fork, past stdio
_lock = threading.Lock()


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        zero = ctypes.c_ulong(0)
        return libc.prctl(option, ctypes.c_ulong(value), zero, zero, zero) == 0
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
    if sys.flags.ignore_environment or sys.flags.isolated:
        return "the agent ignores the environment (-E, -I), which its ranks read"
    return None


def prepare(argv: list[str]) -> None:
    """Before the agent imports torch: where its ranks will fork from the template, set what
    torchrun sets for them after that import and what the import reads (:func:`import_env`),
    so that the thread pools the import sizes are a new rank's."""
    os.environ.update(import_env(os.environ, argv))


def import_env(env: dict[str, str] | os._Environ[str], argv: list[str]) -> dict[str, str]:
    """What :func:`prepare` adds to ``env`` for an agent started with ``argv``:
    ``OMP_NUM_THREADS=1`` for several ranks a node, where not set and the template is used."""
    if wanted(env) is not None or "OMP_NUM_THREADS" in env:
        return {}
    for i, arg in enumerate(argv):
        name, _, value = arg.partition("=")
        if name in ("--nproc-per-node", "--nproc_per_node"):
            value = value or (argv[i + 1] if i + 1 < len(argv) else "")
            return {"OMP_NUM_THREADS": "1"} if value.isdigit() and int(value) > 1 else {}
    return {}


def start() -> dict[str, Any] | None:
    """In the agent, before torchrun's main: fork the template and make the agent start its
    ranks from it; return None. In a rank forked from the template, return the rank's request
    (its fds, environment and directory are in place): the caller runs it
    (:func:`run_rank`)."""
    global _sock, _inherited
    if wanted(os.environ) is not None or threading.active_count() != 1:
        return None
    if not _patch_torchrun() or not _prctl(_PR_SET_CHILD_SUBREAPER, 1):
        return None
    _inherited = _open_fds()
    agent, template = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    _flush_all()
    me = os.getpid()
    pid = os.fork()
    if pid:  # the agent
        template.close()
        agent.settimeout(REPLY_S)
        _sock = agent
        atexit.register(_close, pid)
        return None
    agent.close()
    try:
        return _serve(template, me)
    except BaseException:  # a template, an intermediate or a rank not made never runs torchrun
        with contextlib.suppress(Exception):
            traceback.print_exc()  # a rank's: into its stderr file
        os._exit(1)


def _open_fds() -> list[int]:
    """The descriptors open past stdio (the listing's own left out)."""
    listed = [int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) > 2]
    out = []
    for fd in listed:
        try:
            fcntl.fcntl(fd, fcntl.F_GETFD)
        except OSError:
            continue
        out.append(fd)
    return out


def _flush_all() -> None:
    """Python's and the C library's buffered output, written before a fork copies it."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)


def _close(template: int) -> None:
    """At the agent's exit: the template is ended (it may still be importing) and reaped."""
    global _sock
    with _lock:
        if _sock is not None:
            _sock.close()
        _sock = None
    with contextlib.suppress(OSError):
        os.kill(template, signal.SIGKILL)
        os.waitpid(template, 0)


def _serve(sock: socket.socket, agent: int) -> dict[str, Any]:
    """The template: import what every rank imports, then fork a rank at each request. Returns
    only in a rank."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # gone with its agent
    if os.getppid() != agent:  # the agent went before the line above
        os._exit(0)
    os.setpgid(0, 0)  # the terminal's ^C is for the agent and the ranks, not for the template
    gc.disable()
    try:
        import torch
        import torch.distributed

        gpu = torch.version.cuda or torch.version.hip or getattr(torch._C, "_has_xpu", False)
        if not gpu:  # its import may ask for a GPU: never before a fork where there can be one
            import torch._dynamo
    except Exception:
        os._exit(0)  # the agent starts ranks the usual way once the socket is closed
    finally:
        gc.enable()
    gc.freeze()
    while True:
        try:
            (size,) = struct.unpack("!Q", _recv_exact(sock, 8))
            data, fds = recv_request(sock, size, 2)
        except (OSError, EOFError):
            os._exit(0)
        request = pickle.loads(data)  # from the agent that forked us, over our own socketpair
        read, write = os.pipe()
        _flush_all()
        middle = os.fork()
        if middle == 0:
            os.close(read)
            if os.fork() == 0:
                sock.close()
                return _become(request, fds, write)
            os._exit(0)
        os.close(write)
        for fd in fds:
            os.close(fd)
        got = _read_all(read)  # the rank's pid, written once its session is its own
        os.close(read)
        os.waitpid(middle, 0)  # the rank is the agent's child from here on
        pid = struct.unpack("!q", got)[0] if len(got) == 8 else -1
        try:
            sock.sendall(struct.pack("!q", pid))
        except OSError:
            if pid > 0:
                os.kill(pid, signal.SIGKILL)
            os._exit(0)


def send_request(sock: socket.socket, data: bytes, fds: list[int]) -> int:
    """Send a fork request (its length, then ``data`` with ``fds`` passed along) and return
    the pid the other end answers (the template's, or a warm interpreter's:
    :mod:`rankscope._warm`)."""
    sock.sendall(struct.pack("!Q", len(data)))
    sent = socket.send_fds(sock, [data], fds)
    sock.sendall(data[sent:])
    return struct.unpack("!q", _recv_exact(sock, 8))[0]


def recv_request(sock: socket.socket, size: int, most_fds: int) -> tuple[bytes, list[int]]:
    """The rest of a request whose length ``size`` was read: its data and passed descriptors."""
    data, fds, _, _ = socket.recv_fds(sock, size, most_fds)
    if not data:
        raise EOFError
    return data + _recv_exact(sock, size - len(data)), fds


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


def _become(request: dict[str, Any], fds: list[int], ready: int) -> dict[str, Any]:
    """Make this process the rank ``request`` describes, as ``Popen`` would have made it, then
    tell its pid through ``ready``."""
    os.setsid()
    os.write(ready, struct.pack("!q", os.getpid()))
    os.close(ready)
    for target, fd in zip((1, 2), fds, strict=False):
        if fd != target:
            os.dup2(fd, target)
            os.close(fd)
    for fd in _inherited:  # what Popen's close_fds closes: the agent's, not the rank's
        with contextlib.suppress(OSError):
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # the interpreter's -u: the C library's streams unbuffered, and Python's with no buffer
    # under the text layer, which writes through
    with contextlib.suppress(OSError, AttributeError, ValueError):
        libc = ctypes.CDLL(None)
        for name in ("stdout", "stderr"):
            libc.setvbuf(ctypes.c_void_p.in_dll(libc, name), None, 2, 0)  # _IONBF
    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        raw = io.FileIO(fd, "w", closefd=False)
        raw.name = f"<{name}>"
        stream = io.TextIOWrapper(raw, encoding=old.encoding, errors=old.errors, write_through=True)
        stream.mode = "w"
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "multiprocessing" in sys.modules:  # a new interpreter's own key
        sys.modules["multiprocessing"].current_process().authkey = os.urandom(32)
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
        global _sock
        env, cwd = self._spawn_env, os.getcwd()
        fds = [f.fileno() for f in self._spawn_files]
        data = pickle.dumps({"args": list(args), "env": dict(env), "cwd": cwd})
        with _lock:
            sock = _sock
            if sock is None:
                raise OSError("the template is gone")
            try:
                pid = send_request(sock, data, fds)
            except BaseException:
                # a reply not read (a timeout, torchrun's signal exception) would be the next
                # request's: the template is given up, and ranks start the usual way
                sock.close()
                _sock = None
                raise
        if pid <= 0:
            raise OSError("the template could not fork the rank")
        self.pid = pid
        self._child_created = True


def _spawn(args: tuple[str, ...], env: dict[str, str], stdout: Any, stderr: Any) -> Any:
    """A rank forked from the template, or None where it cannot be."""
    if _sock is None or tuple(args[1:4]) != _SHAPE or args[0] != sys.executable:
        return None
    if wanted(env) is not None or env.get("PYTHONHASHSEED") != os.environ.get("PYTHONHASHSEED"):
        return None
    files = [stdout, stderr]

    class Rank(_Forked):
        _spawn_env, _spawn_files = env, files

    try:
        return Rank(list(args), env=env, stdout=stdout, stderr=stderr, start_new_session=True)
    except (OSError, EOFError):  # the template is gone (its socket closed): the usual way
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
