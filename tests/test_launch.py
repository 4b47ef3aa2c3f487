"""Real torchrun jobs: start, exit codes, stalls with evidence, stop, owner death, attach, 2 nodes."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from rankscope.collect import load_run
from rankscope.launch import Job, JobSpec
from rankscope.launch.procs import job_processes, pid_alive
from rankscope.probe import _core
from rankscope.rundir import RunDir, RunDirError

from .conftest import SCRIPTS, leftover_processes

pytestmark = pytest.mark.timeout(120)


def events(run: RunDir, rank: int) -> list[dict]:
    return list(run.iter_events(rank))


@pytest.mark.slow
def test_clean_run_records_every_rank_beside_another_job(start_job):
    job = start_job("launch/clean.py", nproc_per_node=2)
    other = start_job("launch/clean.py", nproc_per_node=2)  # two jobs at the same time
    assert job.wait(timeout=90) == 0 and other.wait(timeout=90) == 0
    assert job.info()["port"] != other.info()["port"]
    assert job.run.path != other.run.path
    info = job.info()
    assert info["state"] == "exited"
    assert {r: v["exit_code"] for r, v in info["ranks"].items()} == {"0": 0, "1": 0}
    assert info["commands"][0][1:3] == ["-m", "rankscope.torchrun"]
    for rank in (0, 1):
        evs = events(job.run, rank)
        kinds = [e["ev"] for e in evs]
        assert kinds[0] == "start" and kinds[-1] == "end" and evs[-1]["code"] == 0
        start = evs[0]
        assert start["env"]["RANK"] == str(rank) and start["env"]["WORLD_SIZE"] == "2"
        assert {"LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"} <= set(start["env"])
        ops = [(e["op"], e["seq"]) for e in evs if e["ev"] == "enter" and e["pg"] == "0"]
        assert ops == [
            ("all_reduce", 1),
            ("all_reduce", 2),
            ("barrier", 3),
            ("destroy_process_group", 4),
        ]
        enter = next(e for e in evs if e["ev"] == "enter" and e["op"] == "all_reduce")
        assert Path(enter["file"]).name == "clean.py" and enter["line"] == 11
        assert enter["shapes"] == [[4]] and enter["dtypes"] == ["float32"]
        assert enter["pg_ranks"] == [0, 1]
        assert any(e["ev"] == "heartbeat" for e in evs)
        dump = pickle.loads(job.run.fr_dump(rank).read_bytes())
        names = [e["profiling_name"] for e in dump["entries"]]
        assert names.count("gloo:all_reduce") == 2
        assert all(e["retired"] for e in dump["entries"])
    stdout = list(job.run.logs.glob("node0/*/attempt_0/1/stdout.log"))
    assert stdout and "rank 1 sum 16" in stdout[0].read_text()
    assert "[default0]:rank 0 sum 16" in job.run.launcher_log().read_text()
    # the flight recorder is on, under the one name this torch reads: no deprecation warning
    assert "is deprecated" not in job.run.launcher_log().read_text()


@pytest.mark.slow
def test_rank_that_raises(start_job):
    job = start_job("launch/raises.py", nproc_per_node=2)
    assert job.wait(timeout=60) != 0
    info = job.info()
    assert info["state"] == "exited"
    assert info["ranks"]["1"]["exit_code"] == 1
    exc = [e for e in events(job.run, 1) if e["ev"] == "exception"]
    assert exc and exc[0]["type"] == "ValueError" and "corrupt shard on rank 1" in exc[0]["message"]
    assert "line 11, in load_batch" in exc[0]["traceback"]
    # the uncaught exception dumps the flight recorder and the stacks before the rank ends (the
    # stacks are the bootstrap's by then: the exception event carries the traceback)
    capture = [e for e in events(job.run, 1) if e["ev"] == "capture"][-1]
    assert capture["reason"] == "exception"
    assert job.run.fr_dump(1).name in capture["files"]
    dump = pickle.loads(job.run.fr_dump(1).read_bytes())
    assert [e["profiling_name"] for e in dump["entries"]] == ["gloo:all_reduce"]
    assert "reason=exception" in job.run.stacks(1).read_text().splitlines()[0]
    stderr = next(job.run.logs.glob("node0/*/attempt_0/1/stderr.log")).read_text()
    assert 'raises.py", line 11, in load_batch' in stderr
    assert "rankscope" not in stderr  # the bootstrap and probe frames are not shown
    error_json = next(job.run.logs.glob("node0/*/attempt_0/1/error.json"))
    message = json.loads(error_json.read_text())["message"]
    assert message["message"] == "ValueError: corrupt shard on rank 1"
    assert "load_batch" in message["extraInfo"]["py_callstack"]
    assert "Root Cause" in job.run.launcher_log().read_text()


@pytest.mark.slow
def test_exit_codes_per_rank(start_job):
    job = start_job("launch/exit_code.py", nproc_per_node=3)
    assert job.wait(timeout=60) != 0
    codes = {r: v["exit_code"] for r, v in job.info()["ranks"].items()}
    # rank 1 leaves before init; the others then fail to form the group or exit with 3 + rank
    assert codes["1"] == 4
    assert all(c not in (0, None) for c in codes.values())


@pytest.mark.slow
def test_rank_conditional_barrier_stalls_with_evidence_then_stops(start_job):
    job = start_job(
        "launch/conditional_barrier.py", nproc_per_node=2, stall_timeout_s=2, on_stall="stop"
    )
    assert job.wait(timeout=60) != 0
    # the watchdog and the stop it started are done with the run directory
    mine = [t.name for t in threading.enumerate() if t.name.endswith(job.run.path.name)]
    assert not mine, mine
    info = job.info()
    assert info["state"] == "stopped" and info["stop_reason"] == "stall"
    (stall,) = info["stalls"]
    assert stall["kind"] == "no_progress" and stall["missing"] == []
    assert stall["evidence_complete_at"] - stall["detected_at"] < 5.0
    waiting = {r["rank"]: r for r in stall["ranks"]}
    assert waiting[0]["op"] == "barrier" and waiting[0]["site"] == "conditional_barrier.py:16"
    assert waiting[1]["in_collective_since"] is None
    capture = job.run.capture_dir(stall["capture_id"])
    manifest = json.loads((capture / "manifest.json").read_text())
    assert set(manifest["ranks"]) == {"0", "1"}
    for rank in ("0", "1"):
        assert manifest["ranks"][rank]["via"] == "probe"
        assert manifest["ranks"][rank]["pyspy"].startswith(("ok", "skipped: "))
        stacks = (capture / f"rank{rank}.stacks.txt").read_text()
        assert stacks.startswith(f"# rankscope capture id={stall['capture_id']}")
        line = 16 if rank == "0" else 17
        assert f'conditional_barrier.py", line {line} in <module>' in stacks
    dump = pickle.loads((capture / "rank0.fr.pkl").read_bytes())
    in_flight = [e for e in dump["entries"] if not e["retired"]]
    assert [e["profiling_name"] for e in in_flight] == ["gloo:barrier"]
    assert in_flight[0]["collective_seq_id"] == 4
    # stack traces are in the dump once the probe's warm-up has imported what torch needs
    frames = in_flight[0].get("frames") or []
    assert not frames or any("conditional_barrier.py" in f["filename"] for f in frames)
    assert not job_processes(job.run)


@pytest.mark.slow
def test_progress_read_by_a_live_panel_still_reaches_the_watchdog(start_job):
    # A live panel (the CLI's, the workbench's) reads the ranks' events as fast as it likes;
    # the watchdog must still see every collective that completed, or a job that makes
    # progress twice a second is called stalled.
    job = start_job("launch/slow_peer.py", nproc_per_node=2, stall_timeout_s=2)
    deadline = time.monotonic() + 60
    while job.poll() is None:
        job.ranks()
        assert time.monotonic() < deadline, "the job did not end"
    assert job.info()["stalls"] == [] and job.wait(timeout=10) == 0


@pytest.mark.slow
def test_capture_on_request_and_keep_policy(start_job):
    job = start_job(
        "launch/conditional_barrier.py", nproc_per_node=2, stall_timeout_s=2, on_stall="keep"
    )
    deadline = time.monotonic() + 60
    while job.status() != "stalled":
        assert time.monotonic() < deadline, "the stall was not detected"
        time.sleep(0.1)
    assert job.poll() is None  # kept running for inspection
    manifest = job.capture("look again")
    assert manifest["id"] == 2 and manifest["reason"] == "look again"
    assert manifest["missing"] == []
    ranks = {r["rank"]: r for r in job.ranks()}
    assert ranks[0]["status"] == "waiting" and ranks[0]["op"] == "barrier"
    assert job.stop() != 0
    assert job.status() == "stopped"


@pytest.mark.slow
def test_gil_held_rank_answers_through_faulthandler_signal(start_job):
    job = start_job("launch/gil_holder.py", nproc_per_node=2, stall_timeout_s=2, on_stall="stop")
    job.wait(timeout=60)
    stalls = job.info()["stalls"]
    # rank 1 runs (a regex) outside every collective: a busy stall at the timeout, then, when
    # the job is still there ten timeouts on, no progress (which stops it)
    assert [s["kind"] for s in stalls] in (["busy"], ["busy", "no_progress"]), stalls
    stall = stalls[0]
    manifest = json.loads((job.run.capture_dir(stall["capture_id"]) / "manifest.json").read_text())
    assert manifest["ranks"]["0"]["via"] == "probe"
    assert manifest["ranks"]["1"]["via"] == "signal"
    stacks = (job.run.capture_dir(stall["capture_id"]) / "rank1.stacks.txt").read_text()
    assert "via=signal" in stacks and 'gil_holder.py", line 13 in <module>' in stacks


@pytest.mark.slow
def test_stop_leaves_no_process_behind(start_job, tmp_path):
    job = start_job("launch/sleeper.py", nproc_per_node=2)
    deadline = time.monotonic() + 60
    while len(job.ranks()) < 2 or any(r["done"] < 1 for r in job.ranks()):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    pids = [r["pid"] for r in job.ranks()] + [a["pid"] for a in job.info()["agents"]]
    assert all(pid_alive(p) for p in pids)
    job.stop(grace_s=2.0)
    assert job.status() == "stopped"
    assert not any(pid_alive(p) for p in pids)
    assert not leftover_processes(tmp_path)
    assert {v["exit_code"] for v in job.info()["ranks"].values()} <= {-15, -9}


OWNER = textwrap.dedent(
    """
    import sys, time
    from rankscope.launch import Job, JobSpec
    job = Job(JobSpec(script=sys.argv[1], nproc_per_node=2), runs_root=sys.argv[2],
              detached=sys.argv[3] == "1").start()
    print(job.run.path, flush=True)
    while len(job.ranks()) < 2 or any(r["done"] < 1 for r in job.ranks()):
        time.sleep(0.1)
    print("ready", flush=True)
    time.sleep(600)
    """
)


def _owner(tmp_path: Path, *, detached: bool) -> tuple[subprocess.Popen, RunDir]:
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            OWNER,
            str(SCRIPTS / "launch/sleeper.py"),
            str(tmp_path / "runs"),
            "1" if detached else "0",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    run = RunDir(owner.stdout.readline().strip())
    assert owner.stdout.readline().strip() == "ready"
    return owner, run


@pytest.mark.slow
def test_owner_death_takes_its_jobs_with_it(tmp_path):
    owner, run = _owner(tmp_path, detached=False)
    pids = [v["pid"] for v in run.read_run()["ranks"].values()]
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    deadline = time.monotonic() + 20
    while leftover_processes(tmp_path) or run.read_run()["state"] != "stopped":
        assert time.monotonic() < deadline, "the job outlived its owner"
        time.sleep(0.1)
    assert run.read_run()["stop_reason"] == "owner_died"
    assert not any(pid_alive(p) for p in pids)


@pytest.mark.slow
def test_detached_job_survives_owner_and_reattaches(tmp_path):
    owner, run = _owner(tmp_path, detached=True)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    try:
        time.sleep(1.0)
        job = Job.attach(run.path)
        assert job.status() == "running"
        ranks = job.ranks()
        assert [r["rank"] for r in ranks] == [0, 1] and all(r["status"] == "running" for r in ranks)
        manifest = job.capture("attached")
        assert manifest["missing"] == []
        assert job.stop(grace_s=2.0) != 0
        assert Job.attach(run.path).status() == "stopped"
    finally:
        for proc in leftover_processes(tmp_path):
            proc.kill()
    assert not leftover_processes(tmp_path)


@pytest.mark.slow
def test_two_simulated_nodes_form_one_world(start_job):
    job = start_job("launch/env_contract.py", nproc_per_node=2, nnodes=2)
    assert job.wait(timeout=90) == 0
    contract = [next(iter(events(job.run, r)))["env"] for r in range(4)]
    assert sorted(int(c["RANK"]) for c in contract) == [0, 1, 2, 3]
    assert {c["WORLD_SIZE"] for c in contract} == {"4"}
    assert sorted(int(c["GROUP_RANK"]) for c in contract) == [0, 0, 1, 1]
    assert sorted(int(c["LOCAL_RANK"]) for c in contract) == [0, 0, 1, 1]
    for c in contract:
        assert int(c["RANK"]) == int(c["GROUP_RANK"]) * 2 + int(c["LOCAL_RANK"])
    info = job.info()
    assert len(info["agents"]) == 2 and all(a["exit_code"] == 0 for a in info["agents"])
    assert job.run.launcher_log(1).exists()


@pytest.mark.parametrize("wrapper", ["c", "python"])
@pytest.mark.slow
def test_probe_records_every_kind_of_call(start_job, wrapper):
    if wrapper == "c" and _core._fast is None:
        pytest.skip("the probe's C extension is not built here (no C compiler at install)")
    env = {"RANKSCOPE_PYTHON_PROBE": "1"} if wrapper == "python" else {}
    job = start_job("launch/many_ops.py", nproc_per_node=2, env=env)
    assert job.wait(timeout=60) == 0
    enters = [e for e in events(job.run, 1) if e["ev"] == "enter"]
    ops = [e["op"] for e in enters]
    assert ops == [
        "init_process_group",
        "all_reduce",
        "broadcast",
        "all_gather",
        "all_gather_object",
        "broadcast_object_list",
        "all_to_all_single",
        "recv",
        "new_group",
        "all_reduce",
        "monitored_barrier",
        "barrier",
        "destroy_process_group",
    ]
    recv = enters[ops.index("recv")]
    assert recv["peer"] == 0 and recv["shapes"] == [[2]] and recv["dtypes"] == ["float32"]
    reduce = enters[ops.index("all_reduce")]
    assert reduce["file"].endswith("many_ops.py") and reduce["line"] == 12
    sub = enters[9]
    assert sub["pg"] != "0" and sub["seq"] == 1 and sub["dtypes"] == ["float64"]
    exits = [e for e in events(job.run, 1) if e["ev"] == "exit"]
    assert len(exits) == len(enters) and all(e["ok"] for e in exits)
    # the Python wrapper says so once in the rank's log (its stderr), and why; the C one says
    # nothing
    logs = load_run(job.run.path).logs
    own = logs[(logs["rank"] == 1) & (logs["stream"] == "stderr")]
    said = [t for t in own["text"] if "rankscope probe:" in str(t)]
    assert len(said) == (wrapper == "python")
    assert all("RANKSCOPE_PYTHON_PROBE is set" in t for t in said)


@pytest.mark.slow
def test_step_markers_count_as_progress(start_job):
    job = start_job("launch/step_marker.py", nproc_per_node=2)
    assert job.wait(timeout=60) == 0
    steps = [e["step"] for e in events(job.run, 0) if e["ev"] == "step"]
    assert steps == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("pause", ["compute", "sleep", "child"])
@pytest.mark.slow
def test_a_rank_busy_outside_collectives_is_a_busy_stall_that_clears(pause, start_job):
    # Rank 0 waits in all_reduce for 4 s either way; a working rank 1 makes that a busy stall
    # (it may yet come), an idle one a no_progress stall (also while the probe's warm-up import
    # holds the GIL: a sleeping thread does not want it). Waiting for a process of its own that
    # computes (a compiler) is work. Either clears when rank 1 comes.
    args = ["4", pause]
    job = start_job("launch/busy_rank.py", args=args, nproc_per_node=2, stall_timeout_s=1.5)
    assert job.wait(timeout=60) == 0
    stalls = job.info()["stalls"]
    assert [s["kind"] for s in stalls] == ["no_progress" if pause == "sleep" else "busy"], stalls
    assert stalls[0]["cleared_after_s"] > 0


@pytest.mark.slow
def test_run_dir_is_refused_when_it_holds_a_run(tmp_path):
    spec = JobSpec(script=str(SCRIPTS / "launch/clean.py"))
    target = tmp_path / "mine"
    job = Job(spec, run_dir=target).start()
    try:
        assert job.wait(timeout=60) == 0
    finally:
        if job.poll() is None:
            job.stop()
    with pytest.raises(RunDirError, match="already holds a run"):
        Job(spec, run_dir=target).start()


def test_spec_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        JobSpec(script=str(tmp_path / "nope.py"))
    with pytest.raises(ValueError, match="unknown preset"):
        JobSpec(script=str(SCRIPTS / "launch/clean.py"), presets=["nope"])
    with pytest.raises(ValueError, match="exactly one"):
        JobSpec()
    if not os.environ.get("CUDA_VISIBLE_DEVICES"):
        with pytest.raises(ValueError, match="GPUs per node"):
            JobSpec(script=str(SCRIPTS / "launch/clean.py"), backend="nccl").resolve_backend()


@pytest.mark.slow
def test_presets_reach_the_ranks(start_job):
    job = start_job(
        "launch/clean.py",
        nproc_per_node=2,
        presets=["detail", "nccl_debug"],
        env={"MY_FLAG": "1"},
    )
    assert job.wait(timeout=60) == 0
    env = next(iter(events(job.run, 0)))["env"]
    assert env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
    assert env["TORCH_FR_BUFFER_SIZE"] == "0"  # flight_recorder switched off
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_FILE"].endswith("ranks/0/nccl.log")
    assert env["RANKSCOPE_BACKEND"] == "gloo"
    assert job.info()["env"]["MY_FLAG"] == "1"


@pytest.mark.slow
def test_probe_installed_by_hand_under_plain_torchrun(tmp_path):
    run_dir = tmp_path / "by-hand"
    from rankscope.launch.spec import free_port

    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node=2",
            f"--master-port={free_port()}",
            str(SCRIPTS / "launch/install_by_hand.py"),
        ],
        env={**os.environ, "RANKSCOPE_RUN_DIR": str(run_dir)},
        check=True,
        timeout=60,
        capture_output=True,
    )
    run = RunDir(run_dir)
    assert run.rank_ids() == [0, 1]
    for rank in (0, 1):
        evs = events(run, rank)
        assert [e["op"] for e in evs if e["ev"] == "enter"][:2] == [
            "init_process_group",
            "all_reduce",
        ]
        assert evs[-1]["ev"] == "end" and run.fr_dump(rank).exists()


@pytest.mark.slow
def test_collective_timeout_applies_when_the_script_sets_none(start_job):
    job = start_job(
        "launch/conditional_barrier.py",
        nproc_per_node=2,
        collective_timeout_s=3,
        stall_timeout_s=30,
    )
    start = time.monotonic()
    deadline = start + 60
    while not any(e["ev"] == "exception" for e in events(job.run, 0)):
        assert time.monotonic() < deadline, "the barrier did not time out"
        time.sleep(0.1)
    assert time.monotonic() - start < 30
    (exc,) = [e for e in events(job.run, 0) if e["ev"] == "exception"]
    assert "Timed out waiting 3000ms" in exc["message"]


@pytest.mark.slow
def test_stall_in_a_collective_issued_from_cpp_is_detected(start_job):
    job = start_job(
        "launch/ddp_extra_step.py", nproc_per_node=2, stall_timeout_s=2, on_stall="stop"
    )
    job.wait(timeout=60)
    (stall,) = job.info()["stalls"]
    assert stall["kind"] == "no_progress"
    ranks = {r["rank"]: r for r in stall["ranks"]}
    enqueued, completed = ranks[0]["fr"]["0"]
    assert enqueued > completed  # rank 0's third gradient bucket never completes
    assert ranks[0]["in_collective_since"] is None  # the probe's wrappers never saw it
