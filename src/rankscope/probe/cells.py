"""Inside each rank of a cell session: the process group and the run of one notebook cell.

A cell session's ranks are IPython Parallel engines that torchrun starts under the probe
(``rankscope.cells``); the kernel runs :func:`setup` once in each, then :func:`run_cell` for
every ``%%ranks`` cell. A cell's source is a file of the run directory named ``<cell N>``
(:meth:`rankscope.rundir.RunDir.cell_source`), compiled under that path: the probe's call
sites, the stacks and the tracebacks name ``<cell N>:line``, and the analysis reads the line
from the file, as it reads a script's.

Standard library and torch only, like the rest of the probe.
"""

from __future__ import annotations

import ast
import os
import re
import sys
import threading
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist

from rankscope.probe import _core


class CellError(RuntimeError):
    """What a cell did that a cell session does not allow, said so that the user can act."""


def setup(ns: dict[str, Any]) -> int:
    """Initialise the default process group from torchrun's environment (``env://``) and define
    ``rank``, ``world_size``, ``local_rank``, ``device``, ``torch`` and ``dist`` in ``ns``;
    returns the rank."""
    backend = os.environ.get("RANKSCOPE_BACKEND", "gloo")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(backend)
    probe = _core.current()
    if probe is not None:  # a stop or restart ends the rank as a job's stop does, not a crash
        probe.take_sigterm()
    ns.update(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local,
        device=device,
        torch=torch,
        dist=dist,
    )
    return dist.get_rank()


def run_cell(path: str, ns: dict[str, Any], run: int | None = None) -> None:
    """Run the cell whose source is the file ``path`` in the namespace ``ns`` (the engine's
    own: state stays for the next cell). A last expression's value is displayed, as IPython
    does; ``sys.exit()`` and a second ``init_process_group`` raise :class:`CellError`.

    ``run`` numbers the cell runs of the session (the kernel's count): the probe writes a
    ``cell`` event as the cell starts and as it ends on this rank (however it ends: ``ok``
    false where it raised, with the error and the cell's line it raised at), with the threads the cell started that still run then, which the
    stall prover reads (a rank that finished the cell without making a call that others wait
    in during it)."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    number = _cell_number(path)
    probe = _core.current()
    before = set(threading.enumerate())
    if probe is not None:
        probe.emit("cell", cell=number, run=run, phase="start")
        probe.flush()
    ok, raised = False, {}
    try:
        _run(source, path, ns)
        ok = True
    except BaseException as exc:
        raised = _raised(exc, path)
        raise
    finally:
        if probe is not None:
            left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
            probe.emit(
                "cell", cell=number, run=run, phase="end", threads=len(left), ok=ok, **raised
            )
            probe.flush()


def _raised(exc: BaseException, path: str) -> dict[str, str]:
    """``error`` (``ValueError: bad batch``) and ``site`` (``<cell 7>:3``: the innermost line
    of this cell in its traceback) of what a cell raised."""
    try:
        said = str(exc)
    except Exception:  # a broken __str__ of the user's own error
        said = ""
    out = {"error": (f"{type(exc).__name__}: {said}" if said else type(exc).__name__)[:500]}
    tb, line = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == path:
            line = tb.tb_lineno
        tb = tb.tb_next
    if line is not None:
        out["site"] = f"{os.path.basename(path)}:{line}"
    return out


def _cell_number(path: str) -> int | None:
    """``7`` for a file named ``<cell 7>``."""
    match = re.fullmatch(r"<cell (\d+)>", os.path.basename(path))
    return int(match.group(1)) if match else None


def _run(source: str, path: str, ns: dict[str, Any]) -> None:
    tree = ast.parse(source, path)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    try:
        with _one_process_group():
            exec(compile(tree, path, "exec"), ns)
            if last is not None:
                value = eval(compile(last, path, "eval"), ns)
                if value is not None:
                    sys.displayhook(value)
    except SystemExit as exc:
        raise CellError(
            f"sys.exit({exc.code!r}) in a cell: the ranks stay up and keep their state "
            "(%ranks stop ends them, %ranks restart starts fresh ones)"
        ) from None
    except BaseException as exc:
        exc.__traceback__ = _from_cell(exc.__traceback__)
        raise


class _one_process_group:
    """A cell that calls ``init_process_group`` again gets a clear error, not torch's."""

    def __enter__(self) -> None:
        self.real = dist.init_process_group

        def init_process_group(*args: Any, **kwargs: Any) -> None:
            if dist.is_initialized():
                raise CellError(
                    "init_process_group in a cell: the ranks' default process group already "
                    "exists (%ranks start made it; rank, world_size and device are defined); "
                    "use dist.new_group for another group"
                )
            self.real(*args, **kwargs)

        dist.init_process_group = init_process_group

    def __exit__(self, *exc: object) -> None:
        dist.init_process_group = self.real


def _from_cell(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the cell's first frame on (this module's frames left out)."""
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return tb
