"""Every call is on disk the moment the rank enters it, and its end the moment it returns, however
the process dies next: a process with the probe installed makes calls through a stand-in with
all_reduce's signature and is killed with SIGKILL inside one (or right after one returns), with
no time for the probe's thread to write anything; so is the last step it marked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from rankscope.collect import load_run
from rankscope.collect.events import read_ring
from rankscope.probe import _core
from rankscope.rundir import RunDir, whole_record

WORKER = textwrap.dedent(
    """
    import os, signal, sys
    import torch
    from rankscope.probe import install

    probe = install(sys.argv[1], rank=0)
    when = sys.argv[2]

    def all_reduce(tensor, op=None, group=None, async_op=False):
        if when == "inside" and tensor.numel() == 3:
            os.kill(os.getpid(), signal.SIGKILL)

    reduce = probe._wrap("all_reduce", all_reduce, None)
    for _ in range(5):
        probe.step()
        reduce(torch.ones(2))  # site: done
    reduce(torch.ones(3, dtype=torch.float16))  # site: last
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def line_of(tag: str) -> int:
    return next(n for n, text in enumerate(WORKER.splitlines(), 1) if f"# site: {tag}" in text)


@pytest.mark.parametrize("wrapper", ["c", "python"])
@pytest.mark.parametrize("when", ["inside", "after"])
@pytest.mark.slow
def test_a_call_is_on_disk_however_fast_the_rank_dies(tmp_path, wrapper, when):
    if wrapper == "c" and _core._fast is None:
        pytest.skip("the probe's C extension is not built here (no C compiler at install)")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ)
    env.pop("RANKSCOPE_PYTHON_PROBE", None)
    if wrapper == "python":
        env["RANKSCOPE_PYTHON_PROBE"] = "1"
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, str(script), str(run_dir), when], env=env, timeout=60, check=False
    )
    assert done.returncode == -signal.SIGKILL
    run = load_run(run_dir)
    calls = run.collectives
    assert calls["op"].tolist() == ["all_reduce"] * 6
    assert calls["seq"].tolist() == [1, 2, 3, 4, 5, 6]
    assert calls["completed"].tolist() == [True] * 5 + [when == "after"]
    last = calls.iloc[-1]
    assert (last["shapes"], last["dtypes"], last["line"]) == (
        "[[3]]",
        '["float16"]',
        line_of("last"),
    )
    assert last["file"] == str(script) and calls["line"].iloc[0] == line_of("done")
    assert last["thread"].startswith("0x") and calls["thread"].nunique() == 1
    # the last step it marked, kept in the ring's header: in the events table and the live record
    ev = run.events
    assert ev.loc[ev["ev"] == "step", "step"].tolist()[-1:] == [5], ev[["ev", "step"]]
    assert whole_record(RunDir(run_dir), 0).step == 5
    assert run.problems.empty, run.problems


def test_a_torn_or_cut_ring_reads_what_is_whole(tmp_path):
    """A slot being written when the process died, and a file cut short, are reported; the
    whole slots are read."""
    from rankscope.collect import Problems
    from rankscope.rundir import RING_HEADER, RING_SLOT

    run = tmp_path / "run"
    probe = _core.Probe(_core.RunDir(run), rank=0)
    try:

        def all_reduce(tensor, op=None, group=None, async_op=False):
            return None

        import torch

        reduce = probe._wrap("all_reduce", all_reduce, None)
        for _ in range(3):
            reduce(torch.ones(1))
        path = run / "ranks" / "0" / f"calls-{os.getpid()}.ring"
        data = bytearray(path.read_bytes())
    finally:
        os.close(probe._fd)
        probe._stacks.close()
    # Call n is in slot n. Call 2's id zeroed (torn), its numbers left; cut inside slot 4.
    at = RING_HEADER.size + 2 * RING_SLOT.size
    data[at : at + 8] = bytes(8)
    cut = tmp_path / "cut.ring"
    cut.write_bytes(bytes(data[: RING_HEADER.size + 4 * RING_SLOT.size + 10]))
    problems = Problems()
    ring = read_ring(cut, problems)
    assert ring is not None and ring.slots["cid"].tolist() == [1, 3]
    reasons = " / ".join(problems.frame()["reason"])
    assert "1 slot(s) torn" in reasons and "cut short: 4 of" in reasons
    (tmp_path / "junk.ring").write_bytes(b"not a ring at all")
    assert read_ring(tmp_path / "junk.ring", problems) is None
    assert "not a rankscope ring" in " ".join(problems.frame()["reason"])


LATE_SIGNAL = textwrap.dedent(
    """
    import faulthandler, os, signal, sys, time
    from rankscope.probe import install

    install(sys.argv[1], rank=0)
    os.kill(os.getpid(), signal.SIGUSR1)  # while the probe runs: every thread's stack
    time.sleep(0.2)
    # what the interpreter's finalization does: faulthandler gives back what it replaced
    faulthandler.unregister(signal.SIGUSR1)
    os.kill(os.getpid(), signal.SIGUSR1)  # a capture's signal that comes that late
    time.sleep(0.2)
    print("still here", flush=True)
    """
)


@pytest.mark.slow
def test_a_capture_signal_in_a_rank_last_moments_does_not_kill_it(tmp_path):
    """The watchdog's fallback capture sends SIGUSR1 to a rank whose probe does not answer; a
    rank that has just ended (its probe stopped) is finalizing, and faulthandler's finalization
    gives SIGUSR1 back its earlier disposition: that must be 'ignore', or the capture kills a rank
    that was about to exit 0 and torchrun ends the others."""
    script = tmp_path / "late.py"
    script.write_text(LATE_SIGNAL)
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, str(script), str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and "still here" in done.stdout, done.stderr
    assert "Current thread" in RunDir(run_dir).stacks(0).read_text()
