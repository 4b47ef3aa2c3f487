"""Jobs started from a warm interpreter (rankscope._warm): the supervisor forked from an
interpreter that imported torch once for its owner, the agent forked from the supervisor, the
ranks from the agent's template. Real torchrun jobs, side by side with the same job started the
usual way; which jobs it starts; an owner that dies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from rankscope import _template, _warm
from rankscope.launch import Job
from rankscope.launch.procs import job_processes
from tests.conftest import leftover_processes
from tests.test_template import FORK, SCRIPT, seen

COLD = {**FORK, _warm.ENV_WARM: "0"}
#: What differs between the two jobs by design: each job's own port, and the switch.
PER_JOB = {"MASTER_PORT", _warm.ENV_WARM}
TORCHRUN = [sys.executable, "-m", "rankscope.torchrun", "--nproc-per-node=3", "-m", "x"]


def test_which_jobs_start_warm_and_which_share_a_warm_interpreter():
    env = {"PYTHONHASHSEED": "0", "PATH": "/bin"}
    key = _warm._key(_warm._agent_env(env, TORCHRUN))
    # the job's own variables do not split the warm interpreters; OMP_NUM_THREADS is as the
    # agent sets it before its import (several ranks a node)
    own = {**env, "RANKSCOPE_RUN_DIR": "/r/1", "RANKSCOPE_BACKEND": "gloo"}
    assert _warm._key(_warm._agent_env(own, TORCHRUN)) == key
    assert dict(key)["OMP_NUM_THREADS"] == "1"
    one = [*TORCHRUN[:3], "--nproc-per-node=1", "-m", "x"]
    assert "OMP_NUM_THREADS" not in dict(_warm._key(_warm._agent_env(env, one)))
    # any other variable is one the imports may read: another warm interpreter
    assert _warm._key(_warm._agent_env({**env, "TORCH_CPP_LOG_LEVEL": "INFO"}, TORCHRUN)) != key
    # never warm: switched off, ranks not forked (the hash seed not fixed), another launcher
    # or another interpreter
    assert _warm._agent_env({**env, _warm.ENV_WARM: "0"}, TORCHRUN) is None
    assert _warm._agent_env({**env, _template.ENV_FORK: "0"}, TORCHRUN) is None
    assert _warm._agent_env({"PATH": "/bin"}, TORCHRUN) is None
    assert _warm._agent_env(env, ["accelerate", "launch", "x.py"]) is None
    assert _warm._agent_env(env, ["/other/python", *TORCHRUN[1:]]) is None
    # an owner's first job of an environment starts no warm interpreter: an owner of one job
    # (rankscope run) never pays for one
    with open(os.devnull, "wb") as log:
        started = _warm.supervisor(
            ["x"], env=env, agent_env=env, commands=[TORCHRUN], pipe_stdin=False, stderr=log
        )
    assert started is None and key in _warm._seen and key not in _warm._servers
    _warm._seen.discard(key)


def _warm_job(start_job, *args: str, **spec: object) -> Job:
    """A job started from a warm interpreter: the first two jobs of an environment start the
    usual way, the second starting its warm interpreter; the next waits for it to be ready."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        job = start_job(SCRIPT, args=args, env=FORK, **spec)
        if isinstance(job._sup, _warm.Started):
            return job
        assert job.wait(timeout=90) is not None
        # the second job of an environment starts its warm interpreter: wait for it
        while (
            time.monotonic() < deadline
            and _warm._servers
            and not any(s.usable() for s in _warm._servers.values())
        ):
            time.sleep(0.2)
    states = [(s.ready, s.gone, s.proc.poll()) for s in _warm._servers.values()]
    raise AssertionError(f"no warm interpreter became ready in 120 s: {states}")


@pytest.mark.slow
def test_a_warm_job_starts_and_ends_as_the_usual_one(start_job):
    warm = _warm_job(start_job, "return", nproc_per_node=3)
    usual = start_job(SCRIPT, args=["return"], nproc_per_node=3, env=COLD)
    assert not isinstance(usual._sup, _warm.Started)
    assert warm.wait(timeout=90) == 0 and usual.wait(timeout=90) == 0
    a, b = seen(warm), seen(usual)
    assert sorted(a) == sorted(b) == [0, 1, 2]
    for job, ranks in ((warm, a), (usual, b)):
        (agent,) = [x["pid"] for x in job.info()["agents"]]
        for rank, line in ranks.items():
            assert line["ppid"] == agent and line["own_session"], line  # torchrun's child
            assert line["env_rank"] == str(rank) and line["threads"] == 1
            assert line["argv"][0].endswith("forked.py") and line["argv"][1:] == ["return"]
            # what finds the job's processes (/proc/<pid>/environ) names its run directory
            assert line["proc_run_dir"] == str(job.run.path), line
        assert len({line["hash"] for line in ranks.values()}) == 1
        assert len({line["numpy"] for line in ranks.values()}) == 3
    for rank in a:
        one, other = a[rank], b[rank]
        assert one["signals"] == other["signals"] and one["fds"] == other["fds"], rank
        assert one["cwd"] == other["cwd"] and one["hash"] == other["hash"]
        mine, theirs = _environ(one, warm), _environ(other, usual)
        assert mine == theirs, set(mine.items()) ^ set(theirs.items())
    # /proc shows the warm interpreter's command; the supervisor says nothing more than usual
    assert a[0]["cmdline"][1:3] == ["-m", "rankscope._warm"]
    for job in (warm, usual):
        log = (job.run.path / "supervisor.log").read_text()
        assert "Warning" not in log and "started 1 torchrun agent(s)" in log, log
        assert not job_processes(job.run)


@pytest.mark.slow
@pytest.mark.parametrize(("end", "code"), [("raise", 1), ("exit3", 3), ("segv", -11)])
def test_a_warm_job_s_rank_ends_as_it_would_have(start_job, end, code):
    job = _warm_job(start_job, end, nproc_per_node=2)
    assert job.wait(timeout=90) == 1  # torchrun's, as for a job started the usual way
    assert job.info()["ranks"]["1"]["exit_code"] == code
    assert job.info()["agents"][0]["exit_code"] == 1


def _environ(line: dict, job: Job) -> dict[str, str]:
    """A rank's ``os.environ`` with what names its job's run (its run directory, its id) as
    ``<run>``, and what :data:`PER_JOB` names left out."""
    name = job.run.path.name
    return {k: "<run>" if name in v else v for k, v in line["environ"].items() if k not in PER_JOB}


OWNER = """
import json, os, sys, time
from rankscope import _warm
from rankscope.launch import Job, JobSpec
spec = dict(script=sys.argv[1], args=["return"], nproc_per_node=2, env={"PYTHONHASHSEED": "0"})
jobs = []
while True:  # the first two jobs start the usual way; the next, once it is ready, warm
    job = Job(JobSpec(**spec), runs_root=sys.argv[2]).start()
    jobs.append(job)
    if isinstance(job._sup, _warm.Started):
        break
    while _warm._servers and not any(s.usable() for s in _warm._servers.values()):
        time.sleep(0.2)
servers = [s.proc.pid for s in _warm._servers.values()]
print(json.dumps({"runs": [str(j.run.path) for j in jobs], "servers": servers}), flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_an_owner_that_dies_takes_its_warm_jobs_and_interpreter_with_it(tmp_path):
    """A non-detached job ends with its owner however it was started; the owner's warm
    interpreter ends once its jobs have."""
    script = tmp_path / "wait.py"
    script.write_text(
        textwrap.dedent(
            """
            import time
            import torch.distributed as dist
            dist.init_process_group("gloo")
            time.sleep(600)
            """
        )
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(script), str(tmp_path / "runs")],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONHASHSEED": "0"},
        start_new_session=True,
    )
    try:
        line = owner.stdout.readline()  # type: ignore[union-attr]
        assert line, "the owner ended before its warm job started"
        said = json.loads(line)
        runs = [Path(r) for r in said["runs"]]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(
            len(list((r / "ranks").glob("*/events.jsonl"))) == 2 for r in runs
        ):
            time.sleep(0.2)
        assert all(job_processes(Job.attach(r).run) for r in runs)
        os.killpg(owner.pid, signal.SIGKILL)
        owner.wait()
        deadline = time.monotonic() + 60
        servers = [psutil.Process(p) for p in said["servers"] if psutil.pid_exists(p)]
        while time.monotonic() < deadline and (
            leftover_processes(tmp_path) or any(s.is_running() for s in servers)
        ):
            time.sleep(0.2)
        assert not leftover_processes(tmp_path)
        assert not any(s.is_running() and s.status() != psutil.STATUS_ZOMBIE for s in servers)
        for run in runs:
            info = json.loads((run / "run.json").read_text())
            assert info["state"] == "stopped" and info["stop_reason"] == "owner_died", info
    finally:
        if owner.poll() is None:
            os.killpg(owner.pid, signal.SIGKILL)
            owner.wait()
