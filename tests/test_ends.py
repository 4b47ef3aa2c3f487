"""How each rank ended, in real gloo jobs under torchrun: the probe's end event (how, and the
stack where it left), that stack in the stacks table, a fatal signal's dump read from the rank's
stderr, and the last line the rank printed. rankscope's watchdog is kept out of the way."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from rankscope.analyze import diagnose
from rankscope.analyze.evidence import Evidence
from rankscope.analyze.parting import rank_path
from rankscope.collect import load_run
from rankscope.collect.stacks import read_stacks
from rankscope.launch.spec import JobSpec
from rankscope.launch.supervisor import Supervisor
from rankscope.launch.tracker import snapshot
from rankscope.rundir import RunDir, rank_records

from .conftest import site_of

SCRIPT = "analyze/ends.py"
SPEC = {"stall_timeout_s": 30.0, "on_stall": "keep", "collective_timeout_s": 20.0}


def site(tag: str) -> str:
    return site_of(SCRIPT, tag)


def run_job(start_job, how: str):
    job = start_job(SCRIPT, args=(how,), nproc_per_node=2, **SPEC)
    assert job.wait(timeout=90) is not None, "the job did not end"
    return load_run(job.run.path)


def end_of(run, rank: int) -> dict:
    row = run.ranks[run.ranks["rank"] == rank].iloc[0]
    return {k: (None if row.isna()[k] else row[k]) for k in ("end_how", "end_site", "last_output")}


def end_stacks(run, rank: int, reason: str):
    stacks = run.stacks
    """The rows of the rank's last capture taken for ``reason`` (an exception's and an
    os._exit's end follow a capture of every thread for the same reason)."""
    mine = stacks[
        (stacks["rank"].eq(rank) & stacks["reason"].astype(object).eq(reason))
        .fillna(False)
        .astype(bool)
    ]
    last = mine[["source", "capture"]].drop_duplicates().iloc[-1:] if len(mine) else None
    if last is None:
        return mine
    return mine[
        (mine["source"] == last["source"].iloc[0]) & (mine["capture"] == last["capture"].iloc[0])
    ]


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("how", "end", "tag"),
    [
        ("sys_exit", "sys_exit", "sys_exit"),
        ("record_sys_exit", "sys_exit", "sys_exit"),
        ("raise", "exception", "raise"),
        ("os_exit", "os._exit", "os_exit"),
    ],
)
def test_a_rank_that_leaves_says_how_and_where(start_job, how, end, tag):
    run = run_job(start_job, how)
    said = "loss is nan at step 7, stopping"
    assert end_of(run, 1) == {"end_how": end, "end_site": site(tag), "last_output": said}
    ev = run.events
    last = ev[(ev["rank"] == 1) & (ev["ev"] == "end")]
    assert last["message"].tolist()[-1:] == [{"sys_exit": "exit"}.get(end, end)]
    # The end's stack, in the stacks table: the thread that left, its user frames with their
    # source, and nothing of the probe's or runpy's.
    rows = end_stacks(run, 1, end)
    assert len(rows) and rows["is_current"].all() and rows["thread"].nunique() == 1
    user = rows[rows["is_user"].astype(bool)].sort_values("depth")
    assert [f"{f.rsplit('/', 1)[-1]}:{n}" for f, n in zip(user["file"], user["line"], strict=True)][
        :2
    ] == [
        site(tag),
        site("guard"),
    ]
    assert "guard" in user["func"].tolist() and user["code"].notna().all()
    assert not rows["file"].str.contains("rankscope/probe|runpy", regex=True).any()
    # The analyzer finds the path to where the rank left, and tells it.
    path = rank_path(run.stacks, 1)
    assert path and f"{path[-1][0].rsplit('/', 1)[-1]}:{path[-1][2]}" == site(tag), path
    facts = Evidence(run).ranks[1]
    assert (facts.end_how, facts.end_site, facts.last_output) == (end, site(tag), said)
    assert site(tag) in facts.ending and said in facts.ending, facts.ending
    if end == "sys_exit":
        assert facts.ending.startswith("called sys.exit(0) at "), facts.ending


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_teardown_signal_while_the_rank_reports_its_error_keeps_that_error(start_job):
    """SIGTERM lands while the bootstrap formats the rank's uncaught error, before its end is
    written (torchrun tears the job down moments after another rank failed): the rank still
    ends as one that failed there, with its error, its stack and the values at the raise."""
    run = run_job(start_job, "raise_sigterm")
    assert end_of(run, 1) == {
        "end_how": "exception",
        "end_site": site("raise"),
        "last_output": "loss is nan at step 7, stopping",
    }
    codes = dict(zip(run.ranks["rank"], run.ranks["exit_code"], strict=True))
    assert codes[1] == -15, codes
    ev = run.events
    errors = ev[(ev["rank"] == 1) & (ev["ev"] == "exception")]
    assert errors["message"].tolist() == ["NanLoss: loss is nan at step 7"], errors
    values = run.values[run.values["rank"] == 1]
    at_raise = values[(values["func"] == "guard") & (values["reason"] == "SIGTERM")]
    assert set(at_raise["name"]) >= {"loss", "how"}, values[["reason", "func", "name"]]
    facts = Evidence(run).ranks[1]
    assert facts.end_how == "exception" and site("raise") in facts.ending, facts.ending


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_abort_dump_in_stderr_is_read(start_job):
    """torch's ``record`` enables faulthandler on stderr, after the probe did on stacks.txt: the
    aborted rank's dump of its threads is in its stderr log, and it is read from there."""
    run = run_job(start_job, "abort")
    codes = dict(zip(run.ranks["rank"], run.ranks["exit_code"], strict=True))
    aborted = [r for r, c in codes.items() if c == -6]
    assert aborted, codes
    rank = aborted[0]
    rows = end_stacks(run, rank, "SIGABRT")
    assert len(rows) and rows["source"].str.endswith("stderr.log").all(), rows["source"]
    assert (rows["tool"] == "faulthandler").all()
    assert end_of(run, rank)["end_how"] == "SIGABRT"
    assert end_of(run, rank)["end_site"] == site("all_gather")
    assert end_of(run, rank)["last_output"] == f"rank {rank} up"
    facts = Evidence(run).ranks[rank]
    path = rank_path(run.stacks, rank, thread=facts.main_thread)  # as the analyzer asks
    assert ("main", int(site("all_gather").split(":")[1])) in [(f, n) for _, f, n in path], path
    assert facts.ending.startswith(f"died of SIGABRT at {site('all_gather')}"), facts.ending


def test_a_stderr_cut_mid_stack_keeps_its_complete_frames(tmp_path):
    """A log that ends inside a dump (copied while the rank died, or truncated): the frames
    written whole are read, the cut is a problem, nothing raises."""
    text = (
        "rank 1 up\n"
        "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
        "Fatal Python error: Aborted\n\n"
        "Thread 0x00007f7af39136c0 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 331 in wait\n\n'
        "Current thread 0x00007f7b13a12b80 (most recent call first):\n"
        '  File "/home/u/train.py", line 12 in step\n'
        '  File "/home/u/train.py", line 30 in ma'
    )
    log = tmp_path / "stderr.log"
    log.write_text(text)
    from rankscope.collect import Problems, Source

    problems = Problems()
    stacks = read_stacks([Source(log, "stderr.log", rank=1, stream="stderr")], problems=problems)
    main = stacks[stacks["thread"] == "0x00007f7b13a12b80"]
    assert main["line"].tolist() == [12] and (main["reason"] == "SIGABRT").all()
    assert main["is_current"].all()
    reasons = problems.frame()["reason"].tolist()
    assert len(reasons) == 1 and "cut short" in reasons[0], reasons
    # Cut right after the fatal line: no thread, no rows, one problem.
    log.write_text(text.split("\n\n")[0])
    problems = Problems()
    stacks = read_stacks([Source(log, "stderr.log", rank=1, stream="stderr")], problems=problems)
    assert stacks.empty
    assert "before its first thread" in problems.frame()["reason"].iloc[0]
    # Cut in every place: never raises.
    for n in range(0, len(text), 5):
        log.write_text(text[:n])
        read_stacks([Source(log, "stderr.log", rank=1, stream="stderr")], problems=Problems())


#: faulthandler's report of a fatal signal, as a rank's stacks file ends with it.
ABORT_DUMP = (
    "Fatal Python error: Aborted\n\n"
    "Current thread 0x00007f7b13a12b80 (most recent call first):\n"
    '  File "/home/u/train.py", line 12 in step\n'
    '  File "/home/u/train.py", line 30 in main\n'
)


def a_run_whose_launcher_missed_rank_3(tmp_path: Path) -> Path:
    """A recorded run (four ranks stopped by the watchdog) in which neither the launcher nor
    an end event gave rank 3 an exit code."""
    run_dir = tmp_path / "run"
    shutil.copytree(Path(__file__).parent / "data" / "gloo_barrier_hang" / "run", run_dir)
    info = json.loads((run_dir / "run.json").read_text())
    info["ranks"]["3"]["exit_code"] = None
    (run_dir / "run.json").write_text(json.dumps(info))
    return run_dir


def test_a_rank_whose_launcher_missed_its_abort_died_of_the_signal_its_dump_names(tmp_path):
    """torchrun leaves out of its summary a rank that aborted while it was already ending the
    others (another rank failed first): the rank's faulthandler dump says which signal ended
    it, and its exit code is that signal's; without a dump it stays unknown."""
    run_dir = a_run_whose_launcher_missed_rank_3(tmp_path)
    row = load_run(run_dir).ranks.set_index("rank").loc[3]
    assert pd.isna(row["exit_code"]) and pd.isna(row["signal"]), row
    with (run_dir / "ranks" / "3" / "stacks.txt").open("a") as stacks:
        stacks.write(ABORT_DUMP)
    ranks = load_run(run_dir).ranks.set_index("rank")
    row = ranks.loc[3]
    assert (row["exit_code"], row["signal"], row["end_how"]) == (-6, "SIGABRT", "SIGABRT"), row
    assert row["end"] == "aborted itself: SIGABRT (-6)", row["end"]
    assert ranks.loc[[0, 1, 2], "exit_code"].tolist() == [-15, -15, -15]


def test_the_supervisor_gives_such_a_rank_the_signal_its_dump_names(tmp_path):
    """The same rank as the job ends: the supervisor writes the code into run.json, where the
    live panel reads it ("aborted itself", not "gone, exit not known")."""
    run_dir = a_run_whose_launcher_missed_rank_3(tmp_path)
    run = RunDir(run_dir)
    run.update_run(lambda d: d.update(state="running", stop_reason=None))
    Supervisor(run)._finish(ok=False, code=1, failed=None, see="launcher.log")
    assert run.read_run()["ranks"]["3"]["exit_code"] is None  # no dump: not known
    with run.stacks(3).open("a") as stacks:
        stacks.write(ABORT_DUMP)
    Supervisor(run)._finish(ok=False, code=1, failed=None, see="launcher.log")
    job = run.read_run()
    assert job["ranks"]["3"]["exit_code"] == -6
    record = rank_records(run)[3]
    assert snapshot(record, job_ended=job)["end"] == "aborted itself: SIGABRT (-6)"


#: A script whose one object lives in its globals and says when it is freed (its class is in a
#: module of its own, so the script's globals are in no reference cycle: freed as soon as
#: nothing holds them), with an exit hook and a thread that outlives the script's last line.
ORDER_HELPER = """
import os

class Held:
    def __del__(self):
        os.write(1, b"freed\\n")
"""
ORDER_SCRIPT = """
import atexit, os, threading, time
from order_helper import Held
held = Held()
atexit.register(os.write, 1, b"exit hook\\n")
threading.Thread(target=lambda: (time.sleep(0.3), os.write(1, b"thread\\n"))).start()
os.write(1, b"returned\\n")
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["script", "module"])
def test_a_script_s_globals_outlive_it_as_under_python(tmp_path, how):
    """The bootstrap frees the script's objects where python would, after the script's threads
    and exit hooks, not as the script returns (runpy's way): a DDP model freed there, holding
    the last reference to a destroyed gloo group, deadlocks in torch and the rank never ends."""
    (tmp_path / "order_helper.py").write_text(ORDER_HELPER)
    (tmp_path / "order_script.py").write_text(ORDER_SCRIPT)
    target = ["order_script.py"] if how == "script" else ["-m", "order_script"]
    env = {**os.environ, "RANKSCOPE_RUN_DIR": str(tmp_path / "run"), "PYTHONPATH": str(tmp_path)}

    def output(*command: str) -> str:
        done = subprocess.run(
            [sys.executable, *command, *target],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    plain = output()
    assert plain == "returned\nthread\nexit hook\nfreed\n", plain
    assert output("-m", "rankscope.probe.bootstrap") == plain


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_process_that_outlives_its_script_is_an_exit_stall_and_the_stop_ends_it(start_job):
    """Every rank ends its script; rank 0's interpreter then waits at exit for a thread that
    never ends. The watchdog calls an ``exit`` stall at the timeout (the evidence of that
    process alone, the summary in words); kept, the job goes on to its time limit, whose stop
    ends rank 0: its exit code is the stop's SIGTERM, not its script's 0."""
    script = Path(__file__).parent / "corpus" / "exit_writer_thread.py"
    job = start_job.spec(
        JobSpec(
            script=str(script),
            nproc_per_node=2,
            stall_timeout_s=2.0,
            on_stall="keep",
            timeout_s=20.0,
        )
    )
    deadline = time.monotonic() + 60
    while not job.stalls:
        assert time.monotonic() < deadline and job.poll() is None, job.ranks()
        time.sleep(0.2)
    # live, the rank says it: its script ended, its process has not exited
    ranks = {r["rank"]: (r["status"], r["end"]) for r in job.ranks()}
    assert ranks == {
        0: ("exiting", "script ended (exited 0), process not exited"),
        1: ("exited", "exited 0"),
    }, ranks
    assert job.wait(timeout=90) is not None, "the job did not end"
    info = job.run.read_run()
    (stall,) = info["stalls"]
    assert stall["kind"] == "exit", stall
    assert stall["summary"].startswith("rank 0 ended its script (returned) "), stall["summary"]
    assert stall["summary"].endswith("and has not exited; rank 1 exited"), stall["summary"]
    manifest = json.loads((job.run.capture_dir(stall["capture_id"]) / "manifest.json").read_text())
    assert list(manifest["ranks"]) == ["0"] and manifest["missing"] == [], manifest
    assert info["stop_reason"] == "timeout"
    assert {r: v["exit_code"] for r, v in info["ranks"].items()} == {"0": -15, "1": 0}
    d = diagnose(job.run.path)
    assert (d.cause, d.culprit_ranks) == ("stuck_at_exit", [0]), d.render()
    assert "the thread that runs write_metrics, waiting on a queue" in d.reason, d.reason
