"""The launchers besides torchrun (bare python, accelerate, deepspeed) and fixed ports: real jobs.

Each launcher must run the probe's bootstrap in every process it starts, so the run directory
looks the same whatever launched the job, and every process must carry RANKSCOPE_RUN_DIR so
that ``stop()`` finds it.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from rankscope.analyze import diagnose
from rankscope.launch import Job, JobSpec
from rankscope.launch.job import state_text
from rankscope.launch.procs import RankProc, pid_alive
from rankscope.launch.spec import (
    ACCELERATE_CONFIG,
    DEEPSPEED_HOSTFILE,
    PORT_FLOOR,
    free_port,
    launch_commands,
    launch_files,
    torchrun_commands,
)
from rankscope.rundir import RunDir

from .conftest import SCRIPTS

pytestmark = pytest.mark.timeout(120)

CLEAN = str(SCRIPTS / "launch/clean.py")
CONTRACT = str(SCRIPTS / "launch/env_contract.py")


def start_events(run: RunDir) -> dict[int, dict]:
    """The probe's start event of every rank that wrote it (a rank's events file exists a
    moment before its first line is in it)."""
    firsts = {r: next(iter(run.iter_events(r)), None) for r in run.rank_ids()}
    return {r: first for r, first in firsts.items() if first is not None}


def wait_for_ranks(job: Job, count: int, timeout: float = 60.0) -> None:
    """Until ``count`` ranks are up and have written their start event."""
    deadline = time.monotonic() + timeout
    while len(job.ranks()) < count or len(start_events(job.run)) < count:
        assert job.poll() is None, f"the job ended first: {job.info().get('error')}"
        assert time.monotonic() < deadline, f"{count} ranks did not start in {timeout} s"
        time.sleep(0.1)


def test_spec_rejects_launcher_mistakes_with_a_message():
    with pytest.raises(ValueError, match="launcher must be one of torchrun, python"):
        JobSpec(script=CLEAN, launcher="mpirun")
    with pytest.raises(ValueError, match="nproc_per_node=1 and nnodes=1"):
        JobSpec(script=CLEAN, launcher="python")  # nproc_per_node defaults to 2
    with pytest.raises(ValueError, match="sets no MASTER_PORT"):
        JobSpec(script=CLEAN, launcher="python", nproc_per_node=1, master_port=29500)
    with pytest.raises(ValueError, match="use launcher='torchrun' for nnodes > 1"):
        JobSpec(script=CLEAN, launcher="accelerate", nnodes=2)
    with pytest.raises(ValueError, match="read by DeepSpeed's launcher only"):
        JobSpec(script=CLEAN, hostfile="localhost slots=2")
    for port in (0, 70000, "29500", True):
        with pytest.raises(ValueError, match="master_port must be a TCP port"):
            JobSpec(script=CLEAN, master_port=port)
    with pytest.raises(ValueError, match="launcher_args must be a list of strings"):
        JobSpec(script=CLEAN, launcher_args="--cpu")
    with pytest.raises(ValueError, match="3 entries for 2 node"):
        JobSpec(script=CLEAN, nnodes=2, launcher_args_by_node=[[], [], []])


def test_launch_settings_survive_run_json():
    # Job.attach rebuilds the spec from run.json, where tuples have become lists.
    spec = JobSpec(
        script=CLEAN,
        nnodes=2,
        master_port=29555,
        launcher_args=["--monitor-interval=1"],
        launcher_args_by_node=[[], ["--rdzv-id=other"]],
    )
    data = json.loads(json.dumps(spec.to_dict()))
    assert JobSpec.from_dict(data) == spec
    ds = JobSpec(script=CLEAN, launcher="deepspeed", hostfile="localhost slots=2")
    assert JobSpec.from_dict(json.loads(json.dumps(ds.to_dict()))) == ds


def test_every_launcher_runs_the_bootstrap_with_the_script(tmp_path):
    run_dir = tmp_path / "run"
    default = JobSpec(script=CLEAN, args=["--x"], nnodes=2, launcher_args_by_node=[[], ["--a"]])
    got = launch_commands(default, run_dir=run_dir, port=1234, run_id="r")
    assert got[0] == torchrun_commands(default, run_dir=run_dir, port=1234, run_id="r")[0]
    assert got[1][-5:] == ["--a", "-m", "rankscope.probe.bootstrap", CLEAN, "--x"]
    assert "--rdzv-endpoint=127.0.0.1:1234" in got[1]
    assert (
        "--master-port=4321"
        in launch_commands(JobSpec(script=CLEAN), run_dir=run_dir, port=4321, run_id="r")[0]
    )
    specs = {
        "python": JobSpec(script=CLEAN, launcher="python", nproc_per_node=1),
        "accelerate": JobSpec(script=CLEAN, launcher="accelerate", launcher_args=["--cpu"]),
        "deepspeed": JobSpec(script=CLEAN, launcher="deepspeed", hostfile="localhost slots=2"),
    }
    for launcher, spec in specs.items():
        port = None if launcher == "python" else 1234
        (cmd,) = launch_commands(spec, run_dir=run_dir, port=port, run_id="r")
        assert cmd[-3:] in (
            ["-m", "rankscope.probe.bootstrap", CLEAN],
            ["--module", "rankscope.probe.bootstrap", CLEAN],
        ), (launcher, cmd)
    accelerate = launch_commands(specs["accelerate"], run_dir=run_dir, port=1234, run_id="r")[0]
    assert accelerate.index("--cpu") < accelerate.index("--module")
    config = launch_files(specs["accelerate"], port=1234, run_dir=Path("r"), run_id="r")[
        ACCELERATE_CONFIG
    ]
    assert "num_processes: 2" in config and "main_process_port: 1234" in config
    deepspeed = launch_commands(specs["deepspeed"], run_dir=run_dir, port=1234, run_id="r")[0]
    assert f"--hostfile={run_dir / DEEPSPEED_HOSTFILE}" in deepspeed
    assert not any(a.startswith("--num_gpus") for a in deepspeed)
    assert launch_files(specs["deepspeed"], port=1234, run_dir=Path("r"), run_id="r") == {
        DEEPSPEED_HOSTFILE: "localhost slots=2\n"
    }
    plain = JobSpec(script=CLEAN, launcher="deepspeed")
    assert "--num_gpus=2" in launch_commands(plain, run_dir=run_dir, port=1, run_id="r")[0]
    assert launch_files(plain, port=1, run_dir=Path("r"), run_id="r") == {}


@pytest.mark.slow
def test_bare_python_start_has_no_env_contract(start_job, monkeypatch):
    # Even from a shell that a launcher started, the bare start inherits none of the contract.
    for key, value in {"RANK": "3", "WORLD_SIZE": "4", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(key, value)
    job = start_job("launch/env_contract.py", launcher="python", nproc_per_node=1)
    assert job.wait(timeout=60) == 1
    info = job.info()
    assert info["state"] == "exited" and info["port"] is None
    assert info["commands"] == [
        [info["commands"][0][0], "-m", "rankscope.probe.bootstrap", CONTRACT]
    ]
    env = start_events(job.run)[0]["env"]
    assert not {"RANK", "WORLD_SIZE", "MASTER_PORT", "LOCAL_RANK"} & set(env)
    assert {"RANK", "WORLD_SIZE", "MASTER_PORT"} <= set(info["env_dropped"])
    d = diagnose(job.run.path)
    assert (d.verdict, d.cause, d.recipe) == ("launch_error", "env_contract_missing", "D1")
    assert "environment variable RANK expected, but not set" in d.reason


def test_free_ports_stay_out_of_the_range_connections_draw_from():
    """A job's port is found outside the kernel's ephemeral range, from which every outgoing
    connection (another job's ranks, its store's clients) takes one in the seconds before
    torchrun binds it; each is free, and handed out once."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    ports = [free_port() for _ in range(20)]
    assert len(set(ports)) == len(ports)
    if low > PORT_FLOOR + 1000:
        assert all(PORT_FLOOR <= p < low for p in ports), (low, ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))  # free: it binds


@pytest.mark.slow
def test_a_fixed_port_collides_with_a_running_job(start_job):
    port = free_port()  # one rank per job: the clash is between the torchrun agents
    first = start_job("launch/sleeper.py", nproc_per_node=1, master_port=port)
    wait_for_ranks(first, 1)  # its torchrun agent serves the store on the port by now
    second = start_job("launch/clean.py", nproc_per_node=1, master_port=port)
    assert second.wait(timeout=60) != 0
    assert second.info()["state"] == "failed_to_start"
    d = diagnose(second.run.path)
    assert (d.verdict, d.cause, d.recipe) == ("launch_error", "address_in_use", "D4")
    assert first.poll() is None, "the first job must not notice"
    assert {s["env"]["MASTER_PORT"] for s in start_events(first.run).values()} == {str(port)}
    third = start_job("launch/clean.py", nproc_per_node=1)  # no master_port: a free one
    assert third.wait(timeout=60) == 0 and third.info()["port"] != port
    first.stop(grace_s=1.0)


@pytest.mark.slow
def test_a_rendezvous_that_never_completes_is_a_failed_start(start_job):
    # A single-node job told --nnodes=2 (launcher_args win over rankscope's own) waits for a
    # second node that never comes; the startup watchdog ends it.
    job = start_job(
        "launch/clean.py",
        launcher_args=["--nnodes=2"],
        startup_timeout_s=3.0,
        on_stall="stop",
    )
    job.wait(timeout=60)
    info = job.info()
    assert info["state"] == "failed_to_start", info
    assert [s["kind"] for s in info["stalls"]] == ["startup"]
    assert "no rank started" in info["error"] and "--rdzv-id" in info["error"]
    assert not list(job.run.ranks.glob("*/events.jsonl"))
    d = diagnose(job.run.path)
    assert (d.verdict, d.cause) == ("launch_error", "launch_failed")
    assert "startup watchdog" in d.reason


@pytest.mark.slow
def test_torchrun_gives_up_on_a_rendezvous_that_never_fills(start_job):
    # The second node joins a round of its own (another --rdzv-id): with a short join timeout
    # torchrun itself fails, before the startup watchdog would.
    conf = "--rdzv-conf=is_host={},join_timeout=2"
    job = start_job(
        "launch/clean.py",
        nproc_per_node=1,
        nnodes=2,
        launcher_args_by_node=[[conf.format("true")], [conf.format("false"), "--rdzv-id=other"]],
    )
    assert job.wait(timeout=90) != 0
    info = job.info()
    assert info["state"] == "failed_to_start" and not info["stalls"], info
    d = diagnose(job.run.path)
    assert (d.verdict, d.cause, d.recipe) == ("launch_error", "rendezvous_timeout", "D2")
    assert "RendezvousTimeoutError" in d.reason


@pytest.mark.slow
def test_accelerate_launch_runs_every_rank_with_the_probe(start_job):
    pytest.importorskip("accelerate", reason="the launcher needs the 'deepspeed' extra")
    job = start_job("launch/env_contract.py", launcher="accelerate")
    assert job.wait(timeout=90) == 0
    info = job.info()
    assert info["commands"][0][1:3] == ["-m", "accelerate.commands.launch"]
    assert (job.run.path / ACCELERATE_CONFIG).is_file()
    env = {r: s["env"] for r, s in start_events(job.run).items()}
    assert sorted(env) == [0, 1] and {e["WORLD_SIZE"] for e in env.values()} == {"2"}
    assert {e["MASTER_PORT"] for e in env.values()} == {str(info["port"])}
    assert {r: v["exit_code"] for r, v in info["ranks"].items()} == {"0": 0, "1": 0}
    assert diagnose(job.run.path).verdict == "ok"


@pytest.mark.slow
def test_deepspeed_ranks_are_found_and_stopped(start_job):
    pytest.importorskip("deepspeed", reason="the launcher needs the 'deepspeed' extra")
    job = start_job("launch/sleeper.py", launcher="deepspeed", hostfile="localhost slots=2")
    wait_for_ranks(job, 2, timeout=90)
    env = {r: s["env"] for r, s in start_events(job.run).items()}
    assert {e["RANK"] for e in env.values()} == {"0", "1"}
    assert {e["WORLD_SIZE"] for e in env.values()} == {"2"}
    assert not any("GROUP_RANK" in e for e in env.values())  # DeepSpeed does not set it
    assert (job.run.path / DEEPSPEED_HOSTFILE).read_text() == "localhost slots=2\n"
    pids = [r["pid"] for r in job.ranks()]
    assert all(pid_alive(p) for p in pids)
    job.stop(grace_s=2.0)
    assert job.info()["state"] == "stopped"
    assert not any(pid_alive(p) for p in pids)


def test_a_slurm_job_is_one_batch_script_that_runs_torchrun_on_every_node(tmp_path):
    spec = JobSpec(
        script=CLEAN,
        args=["--x"],
        launcher="slurm",
        nnodes=2,
        launcher_args=["--max-restarts=1"],
        slurm={"partition": "gpu", "time": "10:00", "sbatch_args": ["--qos=debug"]},
    )
    run_dir = tmp_path / "my run"
    (cmd,) = launch_commands(spec, run_dir=run_dir, port=None, run_id="r1")
    assert cmd == ["sbatch", "--parsable", "--qos=debug", str(run_dir / "slurm.sbatch")]
    script = launch_files(spec, port=None, run_dir=run_dir, run_id="r1")["slurm.sbatch"]
    assert "#SBATCH --nodes=2\n" in script and "#SBATCH --ntasks-per-node=1\n" in script
    assert "#SBATCH --partition=gpu\n" in script and "#SBATCH --time=10:00\n" in script
    assert f"#SBATCH --output='{run_dir}/slurm-%j.out'" in script
    srun = script.splitlines()[-1]
    assert srun.startswith("exec srun --kill-on-bad-exit=1")
    assert "--rdzv-backend=c10d" in srun and "--rdzv-id=r1" in srun
    assert "--nnodes=2" in srun and "--max-restarts=1" in srun
    assert srun.endswith(f"-m rankscope.probe.bootstrap {CLEAN} --x")
    assert "rdzv_port=$((20000 + SLURM_JOB_ID % 20000))" in script
    fixed = launch_files(
        JobSpec(script=CLEAN, launcher="slurm", master_port=29400),
        port=29400,
        run_dir=run_dir,
        run_id="r1",
    )["slurm.sbatch"]
    assert "rdzv_port=29400" in fixed


def test_slurm_options_are_checked():
    with pytest.raises(ValueError, match="for launcher='slurm'"):
        JobSpec(script=CLEAN, slurm={"partition": "p"})
    with pytest.raises(ValueError, match="unknown slurm option"):
        JobSpec(script=CLEAN, launcher="slurm", slurm={"nodes": 2})
    with pytest.raises(ValueError, match="list of strings"):
        JobSpec(script=CLEAN, launcher="slurm", slurm={"sbatch_args": "--qos=x"})
    with pytest.raises(ValueError, match="non-empty string"):
        JobSpec(script=CLEAN, launcher="slurm", slurm={"time": ""})
    with pytest.raises(ValueError, match="same command on every node"):
        JobSpec(script=CLEAN, launcher="slurm", nnodes=2, launcher_args_by_node=[["--a"]])


def test_a_slurm_job_s_state_reads_with_slurm_s_words():
    assert state_text({"state": "running"}) == "running"
    queued = {"state": "queued", "slurm": {"job_id": "12", "reason": "Priority"}}
    assert state_text(queued) == "queued (SLURM job 12: Priority)"
    running = {"state": "running", "slurm": {"job_id": "12", "nodes": "node[1-2]"}}
    assert state_text(running) == "running (SLURM job 12 on node[1-2])"


def test_a_rank_on_another_node_is_reached_through_srun(monkeypatch):
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    here = RankProc(4242)
    assert not here.remote and here.beside(["py-spy", "dump"]) == ["py-spy", "dump"]
    there = RankProc(4242, node="node2", slurm_job="12")
    assert there.remote and there.alive() is None
    assert there.beside(["kill", "-USR1", "4242"])[:3] == ["srun", "--overlap", "--jobid=12"]
    assert "--nodelist=node2" in there.beside(["true"])
    monkeypatch.setenv("SLURMD_NODENAME", "node2")  # inside the allocation, on that node
    assert not there.remote
