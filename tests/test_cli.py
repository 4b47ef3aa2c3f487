"""`rankscope` on the command line: real jobs, real exit codes, stable option names."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.cli import build_parser

from .conftest import SCRIPTS, leftover_processes

pytestmark = pytest.mark.timeout(120)


def rankscope(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rankscope.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=110,
    )


def test_help_documents_every_run_option():
    text = build_parser()._subparsers._group_actions[0].choices["run"].format_help()
    for option in (
        "--nproc-per-node",
        "--nnodes",
        "--backend",
        "--preset",
        "--stall-timeout",
        "--on-stall",
        "--timeout",
        "--run-dir",
    ):
        assert option in text


def test_clean_run_exits_zero_and_names_its_run_dir(tmp_path):
    out = rankscope("run", "--quiet", str(SCRIPTS / "launch/clean.py"), cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "job exited" in out.stdout and "0: 0, 1: 0" in out.stdout
    (run,) = (tmp_path / "runs").iterdir()
    assert f"run directory runs/{run.name}" in out.stdout


def test_hang_is_caught_and_stopped(tmp_path):
    script = str(SCRIPTS / "launch/conditional_barrier.py")
    out = rankscope("run", "--stall-timeout", "2", "--run-dir", "hang", script, cwd=tmp_path)
    assert out.returncode == 1
    assert (
        "STALL: no progress" in out.stdout
        and "rank 0 in barrier (conditional_barrier.py:16)" in (out.stdout)
    )
    info = json.loads((tmp_path / "hang/run.json").read_text())
    assert info["state"] == "stopped" and info["stop_reason"] == "stall"
    assert not leftover_processes(tmp_path)
    again = rankscope("run", "--run-dir", "hang", script, cwd=tmp_path)
    assert again.returncode == 2 and "already holds a run" in again.stderr


def test_a_kept_stall_is_diagnosed_while_the_job_is_still_frozen(tmp_path):
    script = str(SCRIPTS / "launch/conditional_barrier.py")
    args = ("run", "--quiet", "--stall-timeout", "2", "--on-stall", "keep", "--timeout", "20")
    out = rankscope(*args, script, cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    stall = out.stdout.index("STALL: no progress")
    hang = out.stdout.index("HANG: rank_conditional_collective")
    ended = out.stdout.index("rankscope: job stopped")
    assert stall < hang < ended, out.stdout
    assert not leftover_processes(tmp_path)


def test_failing_rank_gives_nonzero_exit(tmp_path):
    out = rankscope("run", "--quiet", str(SCRIPTS / "launch/raises.py"), cwd=tmp_path)
    assert out.returncode == 1
    assert "1: 1" in out.stdout


def test_bad_input_is_a_clear_error(tmp_path):
    out = rankscope("run", "missing.py", cwd=tmp_path)
    assert out.returncode == 2 and "does not exist" in out.stderr
    out = rankscope("status", str(tmp_path), cwd=tmp_path)
    assert out.returncode == 2 and "not a rankscope run directory" in out.stderr


def test_presets_are_listed(tmp_path):
    out = rankscope("presets", cwd=tmp_path)
    assert out.returncode == 0
    assert "flight_recorder (on by default)" in out.stdout
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in out.stdout
