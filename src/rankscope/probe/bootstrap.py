"""Entry point that torchrun starts in every rank: install the probe, then run the user's code.

``python -m rankscope.probe.bootstrap SCRIPT [ARGS...]`` or ``... -m MODULE [ARGS...]`` runs the
script as ``__main__`` with the same ``sys.argv``, the same traceback (the bootstrap's own frames
are left out) and the same exit code as ``python SCRIPT ARGS``.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import threading
import time
import traceback
from types import FrameType, TracebackType
from typing import Any

from rankscope._settle import import_settled

_core = import_settled("rankscope.probe._core")  # and with it torch
frame_stack, install, tb_stack = _core.frame_stack, _core.install, _core.tb_stack

# Frames of the bootstrap, runpy and the probe's collective wrappers are not the user's: a
# traceback printed by the bootstrap leaves them out, as if the script had run under plain python.
_SKIP = {os.path.abspath(__file__), runpy.__file__, "<frozen runpy>", _core.__file__}


#: The script's globals, kept after the script ends until the interpreter exits, as
#: ``python SCRIPT`` keeps its ``__main__``'s. runpy lets them go as it returns, which tears the
#: script's objects down then and there, before its exit hooks and non-daemon threads: a DDP
#: model whose reducer holds the last reference to a process group the script destroyed then
#: destroys that group with the GIL held while a gloo worker thread may still need the GIL to
#: drop its last call's tensors (torch's deadlock, pytorch/pytorch#56297), and the rank never
#: exits.
_SCRIPT_GLOBALS: list[dict[str, Any]] = []


def _keep_globals(tb: TracebackType | None) -> None:
    """Keep the globals of the script's frame in ``tb`` (its first not in ``_SKIP``)."""
    while tb is not None and tb.tb_frame.f_code.co_filename in _SKIP:
        tb = tb.tb_next
    if tb is not None:
        _SCRIPT_GLOBALS.append(tb.tb_frame.f_globals)


def _release_globals() -> None:
    """Let the script's globals go, after its own exit hooks (registered later, so run earlier)
    and its non-daemon threads, where the interpreter would clear its ``__main__``."""
    while _SCRIPT_GLOBALS:
        _SCRIPT_GLOBALS.pop().clear()


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1  # sys.exit("message") prints the message and exits 1


def _user_frames(tb: TracebackType | None) -> TracebackType | None:
    """The same traceback chain without the frames in ``_SKIP``."""
    kept = []
    while tb is not None:
        if tb.tb_frame.f_code.co_filename not in _SKIP:
            kept.append(tb)
        tb = tb.tb_next
    out = None
    for t in reversed(kept):
        out = TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


def _innermost(tb: TracebackType | None) -> FrameType | None:
    """The frame where a traceback was raised (alive while the traceback is)."""
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame if tb is not None else None


def _strip(exc: BaseException | None, seen: set[int]) -> None:
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.__traceback__ = _user_frames(exc.__traceback__)
        _strip(exc.__cause__, seen)
        exc = exc.__context__


def _record_error_file(exc: BaseException, text: str) -> None:
    """Write torchrun's error.json (as its ``@record`` decorator does), so the failure summary
    that torchrun prints names the exception and carries the traceback."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):
        return
    data = {
        "message": {
            "message": f"{type(exc).__name__}: {exc}",
            "extraInfo": {"py_callstack": text, "timestamp": str(int(time.time()))},
        }
    }
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError:
        pass


class _ExitAsked:
    """``sys.exit`` as the script sees it, remembering the last call: where code swallows the
    ``SystemExit`` before it reaches the bootstrap (torchrun's ``@record`` turns
    ``sys.exit(0)`` into a return), the rank still ends as one that called ``sys.exit``, at the
    line that called it, not as one whose script returned."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.code: object = None
        self.frame: FrameType | None = None

    def __call__(self, status: object = None) -> None:
        if threading.current_thread() is threading.main_thread():  # another thread's only ends it
            self.code, self.frame = status, sys._getframe(1)
        self.real(status)

    def swallowed(self) -> tuple[list[list[Any]], FrameType] | None:
        """The stack and frame of a ``sys.exit(0)`` whose ``SystemExit`` never got out."""
        if self.frame is None or _exit_code(self.code) != 0:
            return None
        return frame_stack(self.frame), self.frame


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[:1] == ["-m"] and len(argv) < 2):
        sys.stderr.write(
            "usage: python -m rankscope.probe.bootstrap (SCRIPT | -m MODULE) [ARGS...]\n"
        )
        raise SystemExit(2)
    module = argv[1] if argv[0] == "-m" else None
    target = module or argv[0]
    args = argv[2:] if module else argv[1:]
    sys._rankscope_bootstrap = True  # type: ignore[attr-defined]
    probe = install()
    atexit.register(_release_globals)
    if module:
        sys.argv = [target, *args]
    else:
        script = os.path.abspath(target)
        sys.argv = [target, *args]
        sys.path[0] = os.path.dirname(script)
    asked = _ExitAsked(sys.exit)
    sys.exit = asked
    try:
        if module:
            kept = runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            kept = runpy.run_path(script, run_name="__main__")
        _SCRIPT_GLOBALS.append(kept)
    except SystemExit as exc:
        _keep_globals(exc.__traceback__)
        code = _exit_code(exc.code)
        stack, frame = tb_stack(exc.__traceback__), _innermost(exc.__traceback__)
        failed = code != 0  # sys.exit(1) or sys.exit("message"): the rank failed on purpose
        probe.leaving("sys_exit", stack, frame, exc if failed else None)
        if failed:
            probe.on_exception(exc)
        probe.end(code, how="sys_exit", stack=stack, frame=frame)
        raise
    except BaseException as exc:
        _keep_globals(exc.__traceback__)
        stack, frame = tb_stack(exc.__traceback__), _innermost(exc.__traceback__)
        probe.leaving("exception", stack, frame, exc)
        _strip(exc, set())
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        sys.stderr.write(text)
        sys.stderr.flush()
        probe.on_exception(exc)
        _record_error_file(exc, text)
        code = 130 if isinstance(exc, KeyboardInterrupt) else 1
        probe.end(code, reason="exception", stack=stack, frame=frame)
        raise SystemExit(code) from None
    swallowed = asked.swallowed()
    if swallowed is not None:
        probe.end(0, how="sys_exit", stack=swallowed[0], frame=swallowed[1])
    else:
        probe.end(0, how="returned")


if __name__ == "__main__":
    main()
