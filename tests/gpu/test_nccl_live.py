"""nccl jobs on a real GPU: what the backend runs after the Python call returns. Skipped,
saying why, where torch sees no CUDA device (CI and the CPU machines have none)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rankscope.analyze import diagnose
from rankscope.cli import main
from rankscope.collect import load_run
from rankscope.launch.spec import free_port

from ..conftest import SCRIPTS, site_of
from . import ON_A_GPU

pytestmark = [*ON_A_GPU, pytest.mark.timeout(240)]

STALL_S = 3.0
BENCH = Path(__file__).parents[2] / "bench" / "probe_overhead.py"


def test_a_kernel_that_never_ends_holds_the_all_reduce_behind_it(start_job, capsys):
    """The all_reduce is issued, not started: the stall card comes within the stall timeout
    plus a second, the live view says so, and the diagnosis points at the rank's stream."""
    job = start_job(
        "gpu/spin_before_all_reduce.py",
        nproc_per_node=1,
        backend="nccl",
        stall_timeout_s=STALL_S,
        on_stall="keep",
    )
    deadline = time.monotonic() + 120
    while job.status() != "stalled":
        assert time.monotonic() < deadline, job.status()
        time.sleep(0.1)
    (stall,) = job.info()["stalls"]
    assert stall["idle_s"] <= STALL_S + 1.0, stall
    # The rank answers the capture at once, although it sits in a stream synchronize and the
    # dump's first stack traces take seconds to symbolize there.
    assert stall["missing"] == [], stall
    assert stall["evidence_complete_at"] - stall["detected_at"] <= 1.5, stall
    capsys.readouterr()
    assert main(["status", str(job.run.path)]) == 0
    out = capsys.readouterr().out
    issued = site_of("gpu/spin_before_all_reduce.py", "all_reduce")
    waited = site_of("gpu/spin_before_all_reduce.py", "wait")
    assert re.search(rf"waiting in all_reduce \(group 0 #\d+\) issued at {issued}", out), out
    assert "not started (the stream is still busy with earlier work)" in out, out
    assert f"waited at {waited}" in out, out
    job.stop(grace_s=10.0)
    d = diagnose(load_run(job.run.path))
    assert (d.verdict, d.cause, d.culprit_ranks) == ("hang", "stream_stuck", [0]), d.render()


def test_a_healthy_job_of_long_kernels_is_no_stall(start_job):
    job = start_job(
        "gpu/spin_before_all_reduce.py",
        args=("healthy",),
        nproc_per_node=1,
        backend="nccl",
        stall_timeout_s=STALL_S,
        env={"SLEEP_S": "1.0"},
    )
    assert job.wait(timeout=180) == 0
    assert job.info()["stalls"] == []
    d = diagnose(load_run(job.run.path))
    assert d.verdict == "ok", d.render()


def test_the_probe_s_overhead_on_nccl():
    args = ["--backend=nccl", "--calls=2000", "--blocks=500", "--block=20", "--jobs=0"]
    out = subprocess.run(
        [sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=200
    )
    assert out.returncode == 0, out.stderr[-3000:]
    ratios = [float(r) for r in re.findall(r"ratio (\d+\.\d+) \+-", out.stdout)]
    print(out.stdout)
    assert len(ratios) == 2, out.stdout


def test_two_ranks_on_one_gpu_started_by_hand(tmp_path):
    """torchrun by hand (rankscope run refuses more nccl ranks than GPUs): NCCL's error is
    read from torchrun's logs as a launch error with its fix."""
    logs = tmp_path / "logs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2"]
    cmd += [f"--master-port={free_port()}", f"--log-dir={logs}", "--redirects=3"]
    cmd.append(str(SCRIPTS / "gpu" / "two_ranks_one_gpu.py"))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode != 0
    (tmp_path / "launcher.log").write_text(done.stdout + done.stderr)
    d = diagnose(load_run(tmp_path))
    assert (d.verdict, d.cause) == ("launch_error", "duplicate_gpu"), d.render()
    assert "LOCAL_RANK" in d.fix
