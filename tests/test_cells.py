"""A cell on every rank: a real Jupyter kernel loads the extension, starts 3 ranks (IPython
Parallel engines under torchrun), runs cells on them, one of which hangs; the card shows in
that cell's output, a restart replays the earlier cells, the fixed cell runs, and every process
is gone at the end."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import sys
import time
from pathlib import Path

import psutil
import pytest

pytest.importorskip("ipyparallel")
jupyter_client = pytest.importorskip("jupyter_client")

pytestmark = pytest.mark.slow

SRC = Path(__file__).resolve().parents[1] / "src"


class Kernel:
    """A real kernel; ``run`` executes code and returns the text of what it showed, while every
    display it made is kept by id with its latest content (the cells' views update later)."""

    def __init__(self, cwd: Path):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
        self.km = jupyter_client.KernelManager(kernel_name="python3")
        self.km.kernel_cmd = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        self.km.start_kernel(env=env, cwd=str(cwd))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)
        self.displays: dict[str, str] = {}
        self.by_parent: dict[str, list[str]] = {}  # execute msg id -> its display ids
        self.counts: dict[str, int] = {}  # execute msg id -> its In [N]

    def _take(self, msg: dict) -> tuple[str | None, str]:
        kind, content = msg["msg_type"], msg["content"]
        parent = msg["parent_header"].get("msg_id")
        text = ""
        if kind == "stream":
            text = content["text"]
        elif kind in ("display_data", "update_display_data", "execute_result"):
            text = content["data"].get("text/plain", "")
            did = (content.get("transient") or {}).get("display_id")
            if did:
                self.displays[did] = text
                if kind == "display_data":
                    self.by_parent.setdefault(parent, []).append(did)
        elif kind == "error":
            text = "\n".join(content["traceback"])
        return parent, text

    def run(self, code: str, *, timeout: float = 300) -> tuple[str, str]:
        """Execute; returns (msg id, the text it printed and showed)."""
        msg_id = self.kc.execute(code)
        out = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"{code!r} gave no answer in {timeout} s; so far: {''.join(out)}"
            try:
                msg = self.kc.get_iopub_msg(timeout=left)
            except queue.Empty:
                continue
            parent, text = self._take(msg)
            if parent == msg_id:
                out.append(text)
                if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                    break
        while (reply := self.kc.get_shell_msg(timeout=30))["parent_header"].get("msg_id") != msg_id:
            pass  # replies to earlier requests (kernel_info while waiting for the kernel)
        self.counts[msg_id] = reply["content"].get("execution_count")
        return msg_id, "".join(out)

    def view(self, msg_id: str) -> str:
        """The latest text of the cell view that execution ``msg_id`` displayed."""
        ids = self.by_parent.get(msg_id) or []
        return "\n".join(self.displays[d] for d in ids)

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


def _ours(root: Path) -> list[psutil.Process]:
    """Processes whose command line names the test's folder (controller, torchrun, ranks,
    supervisors)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info.get("cmdline") or [])
        if str(root) in cmd and p.pid != os.getpid():
            found.append(p)
    return found


@pytest.fixture
def kernel(tmp_path):
    k = Kernel(tmp_path)
    kernel_pid = k.km.provisioner.process.pid  # type: ignore[union-attr]
    try:
        yield k
    finally:
        with contextlib.suppress(Exception):
            k.run("%ranks stop", timeout=120)
        k.close()
        deadline = time.monotonic() + 60
        while (left := _ours(tmp_path)) and time.monotonic() < deadline:
            time.sleep(0.5)
        for p in left:  # what the test left: killed, and the test fails below
            with contextlib.suppress(psutil.Error):
                p.kill()
        assert not psutil.pid_exists(kernel_pid) or psutil.Process(kernel_pid).status() == "zombie"
        assert not left, f"processes left: {[(p.pid, p.cmdline()) for p in left]}"


def _wait_view(k: Kernel, msg_id: str, pattern: str, timeout: float = 240) -> str:
    """Let the kernel work (``%ranks wait``) until the cell's view matches ``pattern``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        k.run("%ranks wait 5", timeout=120)
        text = k.view(msg_id)
        if re.search(pattern, text):
            return text
    raise AssertionError(f"the cell's view never matched {pattern!r}: {k.view(msg_id)}")


@pytest.mark.timeout(1200)
def test_cells_hang_card_restart(kernel, tmp_path):
    k = kernel
    k.run("%load_ext rankscope")
    # A stall timeout longer than the test waits for the hang's card: only the proof calls it.
    _, out = k.run(f"%ranks start 3 --timeout 120 --runs {tmp_path / 'runs'}", timeout=400)
    assert "3 ranks, incarnation 1: running" in out, out
    assert re.search(r"\(run runs/[^/ ]*-cells-[^/ ]*/[^/ ]*-cells-1-[^/ )]*\)", out), out
    assert str(tmp_path) not in out, out

    # Every rank runs the cell, with torchrun's names defined; output apart, labelled.
    first, _ = k.run("%%ranks\nx = rank * 10\nprint('hello', rank, world_size, device)")
    text = _wait_view(k, first, r"done on every rank")
    for r in range(3):
        assert f"--- rank {r} ---\nhello {r} 3 cpu" in text, text

    # State stays; a subset of the ranks; a last expression's value is shown.
    subset, _ = k.run("%%ranks 0,2\nx + 1")
    text = _wait_view(k, subset, r"done on every rank")
    assert "on ranks [0, 2]" in text and "--- rank 2 ---\n21" in text, text
    assert "--- rank 1 ---" not in text

    # Output flooding from every rank: each rank's view keeps its last lines.
    flood, _ = k.run("%%ranks\nfor i in range(20000):\n    print(rank, i)")
    text = _wait_view(k, flood, r"done on every rank")
    assert text.count("characters of output before these left out") == 3, text[:500]
    assert "2 19999" in text and len(text) < 4 * 20_000, len(text)

    # An error on one rank: its traceback, in the cell's own lines, on that rank only.
    bad, _ = k.run("%%ranks\ny = 1\nif rank == 1:\n    raise ValueError('boom on one')")
    text = _wait_view(k, bad, r"failed on ranks \[1\]")
    n_bad = int(re.search(r"cell (\d+) on ranks", text).group(1))
    assert "ValueError: boom on one" in text and f"<cell {n_bad}>" in text, text

    # sys.exit() and a second init_process_group: a clear message, the ranks stay up.
    exits, _ = k.run("%%ranks 0\nimport sys\nsys.exit(3)")
    text = _wait_view(k, exits, r"failed on ranks \[0\]")
    assert "sys.exit(3) in a cell: the ranks stay up" in text, text
    again, _ = k.run("%%ranks\ndist.init_process_group('gloo')")
    text = _wait_view(k, again, r"failed on ranks \[0, 1, 2\]")
    assert "the ranks' default process group already exists" in text, text

    # The hang: a rank-conditional all_reduce. The kernel stays free while it hangs. Ranks 1
    # and 2 finish the cell without the call rank 0 waits in: proven, long before the timeout.
    hang, _ = k.run("%%ranks\nt = torch.ones(2)\nif rank == 0:\n    dist.all_reduce(t)")
    began = time.monotonic()
    _, out = k.run("print(6 * 7)", timeout=30)
    assert "42" in out and time.monotonic() - began < 30
    text = _wait_view(k, hang, r"HANG", timeout=100)
    assert time.monotonic() - began < 100, "the proof, not the 120 s timeout, called it"
    n_hang = int(re.search(r"cell (\d+) on ranks", text).group(1))
    assert re.search(
        rf"Cell \[{n_hang}\] hangs, proven: rank 1 finished cell \[{n_hang}\] without calling "
        r"all_reduce #\d+ of group 0 that rank 0 waits in\. %ranks restart",
        text,
    ), text
    assert re.search(r"culprit ranks: 1-2", text), text
    assert "HANG: rank-conditional collective (recipe D21)" in text, text
    assert f"all_reduce at <cell {n_hang}>:3" in text, text
    assert f'parted: rank 0 took the branch at <cell {n_hang}>:2 "if rank == 0:"' in text, text
    assert n_hang == k.counts[hang]  # the number of the notebook's In [N]
    assert "interactiveshell" not in text and "ipykernel" not in text, text

    # Restart with replay: a new incarnation; the cells every rank completed run again.
    _, out = k.run("%ranks restart --replay", timeout=400)
    assert "incarnation 2: running" in out, out
    assert "(replay)" in out and "boom on one" not in out, out
    fixed, _ = k.run("%%ranks\nt = torch.ones(2)\ndist.all_reduce(t)\nprint(x, t.tolist())")
    text = _wait_view(k, fixed, r"done on every rank")
    for r in range(3):
        assert f"--- rank {r} ---\n{r * 10} [3.0, 3.0]" in text, text

    # The first incarnation's evidence stays readable, with the cell's source beside it.
    import rankscope

    (old,) = (tmp_path / "runs").glob("*-cells-*/*-cells-1-*")
    d = rankscope.diagnose(rankscope.load_run(old))
    assert d.culprit_ranks == [1, 2] and f"<cell {n_hang}>:3" in d.render(), d.render()
    assert (old / "cells" / f"<cell {n_hang}>").read_text().startswith("t = torch.ones(2)")


@pytest.mark.timeout(900)
def test_cells_rank_conditional_collective_card(kernel, tmp_path):
    """``if rank != 0: dist.all_reduce(t)`` in a cell: ranks 1-2 wait, rank 0 finished the cell
    without the call and sits idle between cells. For that cell it is like a rank that ended
    its script: the card names it the culprit of a rank-conditional collective (D21), parted at
    the cell's ``if``, with the fix to call the collective on every rank; not a rank stuck
    outside the collectives."""
    k = kernel
    k.run("%load_ext rankscope")
    _, out = k.run(f"%ranks start 3 --timeout 120 --runs {tmp_path / 'runs'}", timeout=400)
    assert "3 ranks, incarnation 1: running" in out, out
    hang, _ = k.run("%%ranks\nt = torch.ones(2)\nif rank != 0:\n    dist.all_reduce(t)")
    text = _wait_view(k, hang, r"HANG", timeout=150)
    n = k.counts[hang]
    assert "HANG: rank-conditional collective (recipe D21)" in text, text
    assert re.search(r"culprit ranks: 0; waiting ranks: 1-2", text), text
    assert f'parted: ranks 1-2 took the branch at <cell {n}>:2 "if rank != 0:"' in text, text
    assert f"rank 0 finished cell [{n}] without calling all_reduce while ranks 1-2 wait" in text
    assert "stuck outside" not in text and "which is" not in text, text

    import rankscope

    (run,) = (tmp_path / "runs").glob("*-cells-*/*-cells-1-*")
    d = rankscope.diagnose(rankscope.load_run(run))
    assert (d.cause, d.culprit_ranks, d.waiting_ranks) == (
        "rank_conditional_collective",
        [0],
        [1, 2],
    ), d.render()
    assert d.parting is not None and d.parting["site"] == f"<cell {n}>:2", d.parting
    assert "Call collectives on every rank" in d.fix, d.fix


@pytest.mark.timeout(900)
def test_cells_a_cell_that_raised_on_one_rank_is_that_rank_s_crash(kernel, tmp_path):
    """A cell raises on rank 1 before its all_reduce: ranks 0 and 2 wait in it for a call rank
    1 will not make. The card names rank 1's error and the cell's line it raised at (a crash
    of that rank, for that cell), with the fix to correct the cell and restart; not a rank
    stuck outside the collectives, done with its cell."""
    k = kernel
    k.run("%load_ext rankscope")
    _, out = k.run(f"%ranks start 3 --timeout 120 --runs {tmp_path / 'runs'}", timeout=400)
    assert "3 ranks, incarnation 1: running" in out, out
    code = "%%ranks\nt = torch.ones(2)\nif rank == 1:\n    raise ValueError('bad batch')\n"
    cell, _ = k.run(code + "dist.all_reduce(t)")
    text = _wait_view(k, cell, r"CRASH", timeout=150)
    n = k.counts[cell]
    assert "CRASH: a rank crashed (recipe D20)" in text, text
    assert (
        f"rank 1 failed with ValueError: bad batch at <cell {n}>:3, leaving ranks 0, 2 waiting"
        in text
    ), text
    assert f"rank 1's cell [{n}] raised before all_reduce, which ranks 0, 2 wait in at " in text
    assert re.search(r"culprit ranks: 1; waiting ranks: 0, 2", text), text
    assert "%ranks restart" in text and "stuck outside" not in text, text

    import rankscope

    (run,) = (tmp_path / "runs").glob("*-cells-*/*-cells-1-*")
    loaded = rankscope.load_run(run)
    row = loaded.ranks.set_index("rank").loc[1]
    assert (row["cell_state"], row["cell_error"], row["cell_error_site"]) == (
        "raised",
        "ValueError: bad batch",
        f"<cell {n}>:3",
    )
    d = rankscope.diagnose(loaded)
    assert (d.cause, d.culprit_ranks, d.waiting_ranks) == ("rank_crashed", [1], [0, 2])


def _run_interrupted(k: Kernel, code: str, after_s: float, timeout: float = 120) -> str:
    """Execute ``code``, press Kernel > Interrupt after ``after_s``; the text it printed."""
    msg_id = k.kc.execute(code)
    time.sleep(after_s)
    k.km.interrupt_kernel()
    out, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = k.kc.get_iopub_msg(timeout=5)
        except queue.Empty:
            continue
        parent, text = k._take(msg)
        if parent == msg_id:
            out.append(text)
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return "".join(out)
    raise AssertionError(f"{code!r} did not end after the interrupt: {''.join(out)}")


@pytest.mark.timeout(900)
def test_cells_interrupt_and_a_cell_that_never_returns_on_one_rank(kernel, tmp_path):
    """A cell that never returns on rank 1 while rank 0 waits in a barrier: no proof while
    rank 1 runs it. Kernel > Interrupt while waiting for the cell passes a KeyboardInterrupt
    to the ranks still running it and says which wait inside a collective; rank 1 then has
    finished the cell without the barrier: proven. After a restart, the same cell left alone
    is called by the stall timeout."""
    k = kernel
    k.run("%load_ext rankscope")
    _, out = k.run(f"%ranks start 2 --timeout 120 --runs {tmp_path / 'runs'}", timeout=400)
    assert "2 ranks, incarnation 1: running" in out, out
    never = "%%ranks\nimport time\nif rank == 1:\n    time.sleep(3600)\ndist.barrier()"
    cell, _ = k.run(never)
    out = _run_interrupted(k, "%ranks wait 600", after_s=10)
    n = k.counts[cell]
    assert (
        f"Interrupted cell [{n}]: KeyboardInterrupt sent to ranks 0-1, still running it. "
        "Rank 0 waits inside a collective, which an interrupt cannot stop" in out
    ), out
    text = _wait_view(k, cell, r"HANG", timeout=100)
    assert re.search(
        rf"Cell \[{n}\] hangs, proven: rank 1 finished cell \[{n}\] without calling barrier "
        r"#\d+ of group 0 that rank 0 waits in\.",
        text,
    ), text
    assert re.search(r"culprit ranks: 1\b", text), text
    # Rank 1's cell raised (the interrupt): it failed the cell, no branch took it past the call.
    assert "rank-conditional" not in text, text

    _, out = k.run("%ranks restart --timeout 5", timeout=400)
    assert "incarnation 2: running" in out, out
    cell, _ = k.run(never)
    n = k.counts[cell]
    text = _wait_view(k, cell, r"HANG", timeout=120)
    assert f"Cell [{n}] hangs: no rank completed a call for 5 s, the stall timeout." in text, text
    assert re.search(r"culprit ranks: 1\b", text) and "proven" not in text, text
    _, out = k.run("%ranks interrupt")
    assert "KeyboardInterrupt sent to ranks 0-1" in out, out


def test_cells_errors_without_ranks(tmp_path):
    """The magics say what to do when there are no ranks, without starting anything."""
    from rankscope.cells import CellsError, RanksMagics

    magics = RanksMagics(shell=None)
    with pytest.raises(CellsError, match="%ranks start N"):
        magics.cell("", "print(1)")
    with pytest.raises(CellsError, match="no ranks yet"):
        magics.line("status")
    with pytest.raises(CellsError, match="not understood"):
        magics.line("start 3 --bogus")


@pytest.mark.timeout(900)
def test_cells_killed_rank_then_the_kernel_dies(tmp_path):
    """A rank killed from outside while a cell runs: the cell says the ranks ended and shows
    the card. Then the kernel is killed: the ranks, torchrun, the supervisor and the
    controller all end with it."""
    import signal

    from rankscope.rundir import RunDir, rank_records

    k = Kernel(tmp_path)
    kernel_pid = k.km.provisioner.process.pid  # type: ignore[union-attr]
    try:
        k.run("%load_ext rankscope")
        _, out = k.run(f"%ranks start 2 --timeout 30 --runs {tmp_path / 'runs'}", timeout=400)
        assert "2 ranks, incarnation 1: running" in out, out
        (run,) = (tmp_path / "runs").glob("*-cells-*/*-cells-1-*")
        pid = rank_records(RunDir(run))[1].pid
        assert pid, "rank 1 reported its pid at start"
        cell, _ = k.run("%%ranks\nimport time\nif rank == 1:\n    time.sleep(600)\ndist.barrier()")
        time.sleep(3)  # rank 0 in the barrier, rank 1 asleep
        os.kill(pid, signal.SIGKILL)
        text = _wait_view(k, cell, r"The ranks ended while cell \[\d+\] ran")
        assert "%ranks restart" in text and "rank 1" in text, text
        assert "SIGKILL" in text, text
        _, out = k.run("%%ranks\nprint(rank)")
        assert "the ranks are not running" in out and "%ranks restart" in out, out
        assert _ours(tmp_path), "the controller ends with the kernel, not before"
    finally:
        k.kc.stop_channels()
        os.kill(kernel_pid, signal.SIGKILL)
        k.km.shutdown_kernel(now=True)
    deadline = time.monotonic() + 60
    while (left := _ours(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    assert not left, f"processes left after the kernel died: {[p.pid for p in left]}"


@pytest.mark.parametrize("how", ["owner_gone", "sigterm"])
def test_tether_ends_its_child(how):
    """The tether ends its child's process group when its owner's pipe closes or on SIGTERM."""
    import signal
    import subprocess

    tether = subprocess.Popen(
        [sys.executable, "-m", "rankscope.launch.tether", "sh", "-c", "sleep 600 & sleep 600"],
        stdin=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(SRC)},
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while len(psutil.Process(tether.pid).children(recursive=True)) < 2:
            assert time.monotonic() < deadline, "the tether's child never started"
            time.sleep(0.1)
        family = psutil.Process(tether.pid).children(recursive=True)
        if how == "owner_gone":
            tether.stdin.close()  # type: ignore[union-attr]
        else:
            tether.send_signal(signal.SIGTERM)
        tether.wait(30)
        _, alive = psutil.wait_procs(family, timeout=30)
        assert not alive, f"left: {[p.pid for p in alive]}"
    finally:
        with contextlib.suppress(OSError):
            os.killpg(tether.pid, signal.SIGKILL)


def test_cells_state_lines_read_as_sentences(tmp_path, monkeypatch):
    """The state line of a stalled cell, for each way it stalls, and the run's folder as the
    magics print it: relative to the working directory, else its name, never absolute."""
    from rankscope.cells import _stall_words, shown_path

    proven = {"kind": "proven", "proven": "rank 2 finished cell [7] without calling x."}
    assert _stall_words(7, proven, [2], 10.0).startswith(
        "Cell [7] hangs, proven: rank 2 finished cell [7] without calling x. %ranks restart"
    )
    assert _stall_words(7, {"kind": "no_progress"}, [1, 2], 4.0).startswith(
        "Cell [7] hangs: no rank completed a call for 4 s, the stall timeout; ranks 1-2 had "
        "finished it."
    )
    assert "is stalled" in _stall_words(7, {"kind": "busy"}, [], 4.0)
    assert _stall_words(7, None, [0], 4.0).startswith(
        "The ranks ended while cell [7] ran; rank 0 had finished it."
    )
    run = tmp_path / "runs" / "s" / "r"
    run.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert shown_path(run) == "runs/s/r"
    monkeypatch.chdir(run)
    assert shown_path(tmp_path / "runs") == "runs"
