"""Jobs on a real SLURM cluster: two slurmd nodes on this host (tests/slurm_cluster.py), jobs
submitted with sbatch, followed with scontrol, cancelled with scancel. Skipped, saying why, where
the daemons cannot start (no SLURM installed, not root)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rankscope.analyze import diagnose
from rankscope.launch import Job, JobSpec
from rankscope.launch.capture import pyspy_path
from rankscope.rundir import rank_records
from rankscope.widgets.live import ranks_html

from .conftest import SCRIPTS, JobFactory, leftover_processes, site_of
from .slurm_cluster import LocalSlurm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture
def cluster(slurm_cluster: LocalSlurm) -> LocalSlurm:
    return slurm_cluster


@pytest.fixture
def start_slurm(cluster: LocalSlurm, start_job: JobFactory) -> Iterator[JobFactory]:
    yield start_job
    assert cluster.squeue() == [], "a job outlived its test in SLURM's queue"


def _story(job: Job) -> str:
    """What a failed SLURM test needs to be read: run.json's state and error, then the tail of
    SLURM's output, each node's launcher log and the supervisor's log."""
    info = job.info()
    parts = [f"state {info.get('state')}, slurm {info.get('slurm')}, error {info.get('error')}"]
    names = ["slurm-*.out", "launcher.node*.log", "supervisor.log"]
    for path in sorted(p for name in names for p in job.run.path.glob(name)):
        tail = path.read_text(errors="replace").splitlines()[-15:]
        parts.append(f"--- {path.name}\n" + "\n".join(tail))
    return "\n".join(parts)


def _spec(script: str, **kw: object) -> JobSpec:
    return JobSpec(script=str(SCRIPTS / script), launcher="slurm", nnodes=2, nproc_per_node=2, **kw)


def test_a_clean_two_node_run(start_slurm):
    job = start_slurm.spec(_spec("launch/clean.py"))
    assert job.wait(timeout=120) == 0, job.info()
    info = job.info()
    assert info["state"] == "exited" and info["slurm"]["job_id"].isdigit()
    assert info["slurm"]["state"] == "COMPLETED" and info["slurm"]["nodes"] == "node[1-2]"
    records = rank_records(job.run)
    assert sorted(records) == [0, 1, 2, 3]
    assert sorted(r.node for r in records.values()) == ["node1", "node1", "node2", "node2"]
    assert all(r.slurm_job == info["slurm"]["job_id"] for r in records.values())
    # one launcher log and one torchrun log folder per node, the batch script's own output
    assert {p.name for p in job.run.path.glob("launcher*.log")} == {
        "launcher.node0.log",
        "launcher.node1.log",
    }
    assert {p.name for p in job.run.logs.iterdir()} == {"node0", "node1"}
    assert (job.run.path / f"slurm-{info['slurm']['job_id']}.out").is_file()
    assert diagnose(job.run.path).verdict == "ok"


def test_a_hang_on_the_second_node_is_caught_captured_and_diagnosed(start_slurm, cluster):
    job = start_slurm.spec(_spec("slurm/second_node_hang.py", stall_timeout_s=2.0))
    deadline = time.monotonic() + 90
    while not job.stalls and time.monotonic() < deadline:
        assert job.poll() is None, job.info()
        time.sleep(0.2)
    assert job.stalls, f"no stall caught: {job.info()['state']}"
    stall = job.stalls[0]
    manifest = json.loads((job.run.capture_dir(stall["capture_id"]) / "manifest.json").read_text())
    # every rank on both nodes answered the capture through the shared run directory
    assert manifest["missing"] == [], manifest
    assert {r["node"] for r in manifest["ranks"].values()} == {"node1", "node2"}
    answered = [r["answered_at"] - manifest["requested_at"] for r in manifest["ranks"].values()]
    print(f"capture answered after {max(answered):.2f} s at most")
    assert max(answered) < 3.0
    # heartbeats from both nodes arrive through the run directory while the job hangs
    ages = [r["heartbeat_age_s"] for r in job.ranks()]
    print(f"heartbeat ages {[round(a, 2) for a in ages]}")
    assert all(a is not None and a < 2.0 for a in ages), ages
    assert "<th>node</th>" in ranks_html(job.ranks())
    # py-spy ran beside each rank, on its node, through srun --overlap
    spied = {r: v["pyspy"] for r, v in manifest["ranks"].items()}
    if pyspy_path() is not None:
        assert set(spied.values()) == {"ok"}, spied

    records = rank_records(job.run)
    culprit = next(r for r in records.values() if r.node == "node2" and r.local_rank == 1)
    d = diagnose(job.run.path)
    assert d.verdict == "hang", d.summary
    assert d.culprit_ranks == [culprit.rank], d.summary
    # the line it sleeps at, on its node, from its stacks captured through the run directory
    assert site_of("slurm/second_node_hang.py", "culprit") in json.dumps(d.to_dict())

    job.stop(grace_s=1.0)
    assert job.info()["state"] == "stopped"
    assert cluster.squeue() == []
    assert not leftover_processes(job.run.path.parent)


def test_attach_from_a_new_process_and_stop_there(start_slurm, cluster):
    job = start_slurm.spec(_spec("slurm/second_node_hang.py"), detached=True)
    deadline = time.monotonic() + 90
    while job.status() != "running" and time.monotonic() < deadline:
        time.sleep(0.2)
    code = (
        "import sys; from rankscope.launch import Job\n"
        "job = Job.attach(sys.argv[1])\n"
        "print(job.status(), job.info()['slurm']['job_id'])\n"
        "job.stop(grace_s=1.0)\n"
        "print(job.status())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(job.run.path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    first, last = out.stdout.split("\n")[:2]
    assert first.split()[0] in ("running", "stalled") and first.split()[1].isdigit()
    assert last == "stopped"
    assert cluster.squeue() == []


def test_a_rejected_submission_says_what_sbatch_said(start_slurm):
    job = start_slurm.spec(_spec("launch/clean.py", slurm={"partition": "nosuch"}))
    assert job.wait(timeout=60) != 0
    info = job.info()
    assert info["state"] == "failed_to_start"
    assert "sbatch rejected the job" in info["error"] and "partition" in info["error"]


def test_a_queued_job_reads_queued_and_is_cancelled_after_the_startup_timeout(start_slurm):
    # --begin holds the job in the queue (reason BeginTime) past its startup timeout
    spec = _spec(
        "launch/clean.py", startup_timeout_s=4.0, slurm={"sbatch_args": ["--begin=now+600"]}
    )
    job = start_slurm.spec(spec)
    deadline = time.monotonic() + 30
    while job.status() != "queued" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert job.status() == "queued"
    deadline = time.monotonic() + 10
    while job.info().get("slurm", {}).get("reason") is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert job.info()["slurm"]["reason"] == "BeginTime"
    assert job.wait(timeout=60) != 0
    info = job.info()
    assert info["state"] == "failed_to_start"
    assert "still queued" in info["error"] and "BeginTime" in info["error"]


def test_no_slurm_here_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    spec = _spec("launch/clean.py")
    with pytest.raises(ValueError, match="needs SLURM's commands on PATH"):
        Job(spec, runs_root=tmp_path).start()


def test_the_job_does_not_outlive_its_owner(cluster, tmp_path):
    code = (
        "import sys, time; from rankscope.launch import Job, JobSpec\n"
        f"spec = JobSpec(script={str(SCRIPTS / 'slurm/second_node_hang.py')!r}, "
        "launcher='slurm', nnodes=2, nproc_per_node=2)\n"
        "job = Job(spec, runs_root=sys.argv[1]).start()\n"
        "while job.status() != 'running': time.sleep(0.2)\n"
        "print(job.run.path, flush=True)\n"
        "import os; os._exit(0)  # the owner dies without stopping it\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    run = Path(out.stdout.strip())
    job = Job.attach(run)
    assert job.wait(timeout=90) != 0
    assert job.info()["state"] == "stopped" and job.info()["stop_reason"] == "owner_died"
    assert cluster.squeue() == []
    assert not leftover_processes(tmp_path)


@pytest.mark.timeout(360)
def test_a_node_that_fails_ends_the_job_with_slurm_s_reason(start_slurm, cluster):
    job = start_slurm.spec(_spec("slurm/second_node_hang.py", stall_timeout_s=60.0))
    # The node goes down once every rank has made the first all_reduce: a job that ended before
    # (it failed to start) says how, rather than reading as a node failure that never happened.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and job.poll() is None:
        if sum((r.get("done") or 0) >= 1 for r in job.ranks()) == 4:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"the job did not reach its hang before the node went down:\n{_story(job)}")
    try:
        down = cluster.scontrol("update", "NodeName=node2", "State=DOWN", "Reason=rankscope-test")
        assert down.returncode == 0, down.stderr
        assert job.wait(timeout=90) != 0
    finally:
        cluster.resume("node2")
    info = job.info()
    assert info["slurm"]["state"] == "NODE_FAIL", _story(job)
    # SLURM's reason where the node was seen down, else srun's word (it may be back already)
    assert list(info["slurm"]["lost_nodes"]) == ["node2"], info["slurm"]
    assert "NODE_FAIL" in info["error"] and "NodeDown" in info["error"]
    assert "node node2 went down" in info["error"], info["error"]
    # The ranks on the lost node are the cause, the others wait for them: whatever the moment
    # the node went down caught them doing (the first all_reduce on a loaded machine, the hang).
    d = diagnose(job.run.path)
    records = rank_records(job.run)
    lost = sorted(r.rank for r in records.values() if r.node == "node2")
    assert len(lost) == 2 and len(records) == 4
    assert d.verdict == "crash" and d.cause == "node_lost", d.render()
    assert d.culprit_ranks == lost, d.render()
    assert set(d.waiting_ranks) <= set(records) - set(lost), d.render()
    assert "node2" in d.reason and "NodeDown" in d.reason, d.reason
    assert any("NODE_FAIL" in note for note in d.notes), d.notes
    assert not leftover_processes(job.run.path.parent)
