"""The probe-overhead bench runs end to end on a small workload and prints every figure it
promises (its numbers are for `make bench`; here only that they are there and make sense)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.probe import _core

from .conftest import leftover_processes

BENCH = Path(__file__).parent.parent / "bench" / "probe_overhead.py"


@pytest.mark.slow
def test_probe_overhead_bench_prints_its_ratios(tmp_path: Path) -> None:
    args = ["--calls=50", "--blocks=20", "--block=5", "--loop=200", "--jobs=1", "--age=0.5"]
    env = dict(os.environ, TMPDIR=str(tmp_path))  # its run directories, for the leftover check
    try:
        out = subprocess.run(
            [sys.executable, str(BENCH), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        left = leftover_processes(tmp_path)
        for proc in left:
            proc.kill()
    assert out.returncode == 0, out.stderr[-3000:]
    assert not left, f"processes outlived the bench: {[p.pid for p in left]}"
    text = out.stdout
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
    assert re.search(r"warm-up .* ended \d+\.\d s after", text), text
