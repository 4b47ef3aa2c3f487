"""A job that rankscope did not start: plain torchrun, its ranks under the probe's bootstrap with
RANKSCOPE_RUN_DIR pointing at a run directory (as an existing sbatch script, a Kubernetes pod or
a Ray task would run them). Attaching to that directory follows the job live: status, stalls,
capture and diagnosis, as for a job rankscope started; stopping it is left to its launcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from rankscope.analyze import diagnose
from rankscope.cli import main
from rankscope.launch import Job
from rankscope.launch.job import NotStartedHere
from rankscope.launch.spec import free_port

from .conftest import SCRIPTS, leftover_processes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_a_job_started_elsewhere_is_followed_through_its_run_directory(tmp_path, capsys):
    run_dir = tmp_path / "shared" / "run"
    torchrun = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node=2",
            "--master-addr=127.0.0.1",
            f"--master-port={free_port()}",
            "-m",
            "rankscope.probe.bootstrap",
            str(SCRIPTS / "widgets/hang.py"),
        ],
        env={**os.environ, "RANKSCOPE_RUN_DIR": str(run_dir)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while len(list((run_dir / "ranks").glob("*/events.jsonl"))) < 2:
            assert time.monotonic() < deadline and torchrun.poll() is None
            time.sleep(0.2)
        time.sleep(1.0)  # both start events written
        job = Job.attach(run_dir)
        info = job.info()
        assert info["observed"] and info["launcher"] == "external" and info["world_size"] == 2
        assert job.status() == "running"
        # the watchdog follows it as any job: rank 0 alone in a barrier is a stall
        deadline = time.monotonic() + 60
        while not job.stalls:
            assert time.monotonic() < deadline, job.ranks()
            time.sleep(0.2)
        manifest = json.loads(
            (job.run.capture_dir(job.stalls[0]["capture_id"]) / "manifest.json").read_text()
        )
        assert manifest["missing"] == []
        d = diagnose(run_dir)
        assert d.verdict == "hang" and d.culprit_ranks == [1], d.summary

        # the command line works on it too, from other processes' point of view
        assert main(["status", str(run_dir)]) == 0
        assert "stalled" in capsys.readouterr().out
        assert main(["capture", str(run_dir)]) == 0
        assert "2/2 ranks answered" in capsys.readouterr().out
        # rankscope did not start it and does not stop it: it says how
        with pytest.raises(NotStartedHere, match="stop it the way it was started"):
            job.stop()
        assert main(["stop", str(run_dir)]) == 2
        assert "did not start" in capsys.readouterr().err
    finally:
        os.killpg(torchrun.pid, 15)
        torchrun.wait(timeout=30)
    # its ranks end (SIGTERM from torchrun): the observed job ends with them
    deadline = time.monotonic() + 20
    while job.poll() is None:
        assert time.monotonic() < deadline, job.ranks()
        time.sleep(0.2)
    assert job.info()["state"] == "exited" and job.poll() != 0
    left = leftover_processes(tmp_path)
    for proc in left:
        proc.kill()
    psutil.wait_procs(left, timeout=5)
    assert not left
