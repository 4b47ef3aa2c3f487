"""The probe-overhead bench runs end to end on a small workload and prints every figure it
promises (its numbers are for `make bench`; here only that they are there and make sense)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.probe import _core

from .conftest import leftover_processes

BENCH = Path(__file__).parent.parent / "bench" / "probe_overhead.py"


def run_bench(bench: Path, args: list[str], tmp_path: Path, *, timeout: float) -> str:
    """A bench's standard output; it must succeed and leave no process behind (its run
    directories go under ``tmp_path``, where the leftover check looks)."""
    env = dict(os.environ, TMPDIR=str(tmp_path))
    try:
        out = subprocess.run(
            [sys.executable, str(bench), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    finally:
        left = leftover_processes(tmp_path)
        for proc in left:
            proc.kill()
    assert out.returncode == 0, out.stderr[-3000:]
    assert not left, f"processes outlived the bench: {[p.pid for p in left]}"
    return out.stdout


@pytest.mark.slow
def test_probe_overhead_bench_prints_its_ratios(tmp_path: Path) -> None:
    args = ["--calls=50", "--blocks=20", "--block=5", "--loop=200", "--jobs=1", "--age=0.5"]
    text = run_bench(BENCH, args, tmp_path, timeout=300)
    built = "Python (no C extension built)"
    if _core._fast is not None:
        built = "C, reading tensors" if _core._META is not None else "C, with torch's getters"
    assert f"the probe's wrapper in {built}" in text, text
    ratios = re.findall(r"ratio (\d+\.\d+) \+- (\d+\.\d+) \(95 %\)", text)
    assert len(ratios) == 2, text  # as timed, and capped
    assert all(0.5 < float(r) < 2 and float(h) >= 0 for r, h in ratios), text
    over = re.search(r"calls over the cap \(\d+ us, 5x .*\): off (\d+), on (\d+) of 100 each", text)
    assert over is not None, text
    assert re.search(r"separate jobs, 1 pairs .* ratio \d+\.\d+", text, re.S), text


LIVE = Path(__file__).parent.parent / "bench" / "live_scale.py"
SCALE = Path(__file__).parent.parent / "bench" / "analyze_scale.py"


@pytest.mark.slow
def test_live_scale_bench_follows_a_simulated_job_and_prints_each_figure(tmp_path: Path) -> None:
    args = ["--ranks=16", "--steady=3", "--stall-timeout=0.5", f"--dir={tmp_path}"]
    out = subprocess.run(
        [sys.executable, str(LIVE), *args], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert re.search(r"following \(tracker \+ watchdog\): \d+\.\d% of one core", text), text
    assert re.search(r"\d+ collectives a second followed \(the job.s 320", text), text
    assert re.search(r"hang events written -> live state: \d+\.\d\d s", text), text
    late = re.search(r"stall decided (-?\d+\.\d\d) s after the rule asks", text)
    assert late is not None and -0.5 < float(late.group(1)) < 5, text
    assert re.search(r"capture of every rank: \d+\.\d\d s, 0 missing", text), text
    assert not list(tmp_path.iterdir())  # its run directory is gone
    spec = importlib.util.spec_from_file_location("live_scale", LIVE)
    live = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(live)
    assert (live.HEARTBEAT_S, live.POLL_S) == (_core.HEARTBEAT_S, _core.POLL_S)


@pytest.mark.slow
def test_analyze_scale_bench_names_the_culprit_and_times_each_step(tmp_path: Path) -> None:
    args = ["--ranks=64", "--entries=50", "--no-torch", f"--dir={tmp_path}"]
    out = subprocess.run(
        [sys.executable, str(SCALE), *args], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(
        r"calls table \d+\.\d s, alignment \d+\.\d s, wait-for graph \d+\.\d s, facts and rules",
        out.stdout,
    ), out.stdout
    assert "hang lagging_rank, culprit [37], seq 50" in out.stdout, out.stdout


@pytest.mark.slow
def test_analyze_scale_bench_reuses_the_dumps_it_kept(tmp_path: Path) -> None:
    args = ["--ranks=16", "--entries=20", "--no-torch", f"--reuse={tmp_path}"]
    said = []
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, str(SCALE), *args], capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, out.stderr[-3000:]
        assert "hang lagging_rank, culprit [13], seq 20" in out.stdout, out.stdout
        said.append(out.stdout.split(" ", 1)[0])
    assert said == ["wrote", "reused"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "rankscope-bench-16x20-missing-13",
        "rankscope-bench-16x20-missing-13.done",
    ]


FRAMEWORKS = Path(__file__).parent.parent / "bench" / "framework_overhead.py"


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None,
    reason="needs lightning: pip install -e '.[frameworks]'",
)
def test_framework_overhead_bench_prints_the_ratio_under_lightnings_loop(tmp_path: Path) -> None:
    args = ["--blocks=3", "--block=3", "--warmup=3", "--framework", "lightning"]
    text = run_bench(FRAMEWORKS, args, tmp_path, timeout=360)
    assert "Lightning Trainer (DDP):" in text, text
    ratios = re.findall(r"ratio (\d+\.\d+) \+- (\d+\.\d+) \(95 %\)", text)
    assert len(ratios) == 2, text  # as timed, and capped
    assert all(0.3 < float(r) < 3 and float(h) >= 0 for r, h in ratios), text
    assert re.search(r"steps over the cap .*: off \d+, on \d+ of 9 each", text), text
