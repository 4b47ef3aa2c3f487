"""Faults around a job, each made for real: the run directory's disk full (``/dev/full`` under
the probe's record, then a small tmpfs under a whole job), and what the probe and the readers do
with it: the rank goes on, what cannot be written is dropped and said once, nothing written
before is lost, and the diagnosis says what is missing."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from rankscope.analyze import diagnose
from rankscope.collect import load_run
from rankscope.probe import _core


def _calls(probe: _core.Probe, n: int, size: int) -> None:
    def all_reduce(tensor, op=None, group=None, async_op=False):
        return None

    reduce = probe._wrap("all_reduce", all_reduce, None)
    for _ in range(n):
        reduce(torch.ones(size))


def test_a_full_disk_drops_the_record_says_so_once_and_keeps_what_was_written(tmp_path, capfd):
    """The probe's record written to ``/dev/full`` (every write fails with ENOSPC) for a while:
    no exception reaches the rank, one line on stderr says so, and when writes succeed again a
    ``dropped`` line says since when and how many; the calls before and after read whole, and
    the calls after name facts that are on disk (the ones written into the full disk are
    forgotten)."""
    run = tmp_path / "run"
    probe = _core.Probe(_core.RunDir(run), rank=0)
    saved = os.dup(probe._fd)
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        probe.emit("start", pid=os.getpid(), host="here", argv=[], env={})
        probe.flush()  # as start() does, before any call
        _calls(probe, 3, 2)
        probe.flush()
        before = (run / "ranks" / "0" / "events.jsonl").read_bytes()
        os.dup2(full, probe._fd)  # the disk fills
        _calls(probe, 4, 5)  # new facts: their line cannot be written either
        probe.emit("step", step=1)
        probe.flush()
        probe.flush()
        os.dup2(saved, probe._fd)  # space again
        _calls(probe, 2, 5)
        probe.flush()
    finally:
        os.close(full)
        os.close(saved)
        os.close(probe._fd)
        probe._stacks.close()
    err = capfd.readouterr().err
    assert err.count("rank 0: cannot write ") == 1, err
    assert "No space left on device" in err and err.count("writes its record again") == 1, err
    after = (run / "ranks" / "0" / "events.jsonl").read_bytes()
    assert after.startswith(before)  # nothing already written is lost
    loaded = load_run(run)
    assert loaded.problems.empty, loaded.problems
    events = loaded.events
    dropped = events[events["ev"] == "dropped"]
    assert len(dropped) == 1 and "No space left on device" in dropped["message"].iloc[0]
    assert "write(s) dropped since" in dropped["message"].iloc[0]
    calls = loaded.collectives
    # 3 calls before, 2 after; the 4 whose lines were dropped come from the ring, their facts
    # from the line kept back and written when space returned
    assert calls["coll_id"].tolist() == list(range(1, 10)), calls
    assert (calls["op"] == "all_reduce").all(), calls["op"]
    assert calls["shapes"].astype(str).str.contains("5").sum() == 6, calls["shapes"]
    d = diagnose(run)
    assert any("could not write part of its record" in m for m in d.missing), d.missing


@pytest.mark.slow  # it runs mount
def test_a_ring_that_the_disk_cannot_hold_is_kept_in_memory(tmp_path, capfd):
    """The ring file cannot take its blocks (a tmpfs too small for it): the probe keeps its
    ring in memory, says so, leaves no file that a reader would take for a ring, and records
    calls in events.jsonl as before."""
    from rankscope.probe._twins import _Ring
    from rankscope.rundir import RING_HEADER, RING_SLOT, RING_SLOTS

    mnt = tmp_path / "small"
    mnt.mkdir()
    size = RING_HEADER.size + RING_SLOTS * RING_SLOT.size
    tiny = max(64 * 1024, size // 4)
    mounted = os.system(f"mount -t tmpfs -o size={tiny} tmpfs {mnt} 2>/dev/null") == 0
    if not mounted:
        pytest.skip("cannot mount a tmpfs here (not root, or no mount permission)")
    try:
        ring = _Ring(mnt / "calls-1.ring", rank=0)
        assert ring.error is not None and "No space" in (ring.error.strerror or "")
        assert not (mnt / "calls-1.ring").exists()
        ring.map[0:4] = b"abcd"  # in memory, writable
    finally:
        os.system(f"umount {mnt}")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_job_whose_run_directory_fills_goes_on_and_says_what_is_missing(tmp_path):
    """A real two-rank job with its run directory on a 64 MB tmpfs that one rank fills and
    later frees: the job ends 0, each rank's record says what it dropped, the calls before and
    after are read, and the diagnosis lists what is missing."""
    from rankscope.launch import Job, JobSpec

    from .conftest import SCRIPTS, leftover_processes

    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.system(f"mount -t tmpfs -o size=64m tmpfs {mnt} 2>/dev/null") != 0:
        pytest.skip("cannot mount a tmpfs here (not root, or no mount permission)")
    try:
        job = Job(
            JobSpec(script=str(SCRIPTS / "faults/disk_full.py"), nproc_per_node=2, timeout_s=120),
            runs_root=mnt / "runs",
        ).start()
        try:
            code = job.wait(timeout=180)
        finally:
            if job.poll() is None:
                job.stop()
        run = job.run.path
        assert code == 0, job.info()
        loaded = load_run(run)
        events, calls = loaded.events, loaded.collectives
        dropped = events[events["ev"] == "dropped"]
        assert sorted(dropped["rank"].tolist()) == [0, 1], events["ev"].value_counts()
        assert dropped["message"].str.contains("No space left on device").all()
        # every call of each rank: from its lines, else from its ring (the lines dropped)
        per_rank = calls[calls["op"] == "all_reduce"].groupby("rank").size().to_dict()
        assert per_rank == {0: 29, 1: 29}, per_rank
        assert calls["op"].notna().all()  # the facts lines kept back were written later
        d = diagnose(run)
        assert d.verdict == "ok", d.render()
        assert sum("could not write part of its record" in m for m in d.missing) == 2, d.missing
        # The line that said it could not write went to a stderr file on the full disk; the
        # one that says it writes again tells the whole story.
        logs = loaded.logs
        said = logs[logs["text"].str.contains("writes its record again", na=False)]
        assert sorted(said["rank"].dropna().astype(int).unique().tolist()) == [0, 1], said
        assert said["text"].str.contains("No space left on device").all(), said["text"]
        assert not leftover_processes(run.parent)
    finally:
        if (mnt / "runs").is_dir():  # kept for a look after a failure
            shutil.copytree(mnt / "runs", tmp_path / "runs", dirs_exist_ok=True)
        os.system(f"umount -l {mnt}")


OWNER = """
import sys, time
from rankscope.launch import Job, JobSpec
job = Job(JobSpec(script=sys.argv[1], nproc_per_node=2, stall_timeout_s=2.0, timeout_s=240),
          runs_root=sys.argv[2], detached=True).start()
print(job.run.path, flush=True)
while len(job.ranks()) < 2 or any(r["done"] < 1 for r in job.ranks()):
    time.sleep(0.1)
print("ready", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_kernel_killed_mid_job_leaves_a_job_that_attach_watches_to_its_stall(tmp_path):
    """The notebook kernel that started a detached job (and its watchdog thread with it) dies
    of SIGKILL; the job runs on; a hang starts after that; ``Job.attach`` from another process
    resumes watching, calls the stall, captures evidence, and the diagnosis names the rank."""
    import signal
    import subprocess
    import sys
    import time

    from rankscope.launch import Job
    from rankscope.rundir import RunDir

    from .conftest import SCRIPTS, leftover_processes

    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(SCRIPTS / "faults/hang_on_cue.py"), str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        run = RunDir(owner.stdout.readline().strip())
        assert owner.stdout.readline().strip() == "ready"
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        (run.path / "go").touch()  # the hang starts with no watchdog alive
        time.sleep(3.0)
        assert run.read_run()["stalls"] == []  # nobody was watching
        job = Job.attach(run.path)
        assert job.status() in ("running", "stalled")
        deadline = time.monotonic() + 90
        while not run.read_run()["stalls"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert run.read_run()["stalls"], job.info()  # in run.json, for whoever attaches next
        assert job.stalls[0]["capture_id"] == run.read_run()["stalls"][0]["capture_id"]
        assert job.stop(grace_s=2.0) != 0
        d = diagnose(run.path)
        assert d.verdict == "hang" and d.culprit_ranks == [1], d.render()
        assert d.waiting_ranks == [0], d.render()
    finally:
        if owner.poll() is None:
            owner.kill()
        for proc in leftover_processes(tmp_path):
            proc.kill()
    assert not leftover_processes(tmp_path)


def test_records_corrupted_mid_way_are_skipped_and_reading_goes_on(tmp_path):
    """A probe's files damaged in the middle of a record (garbage written over a line of
    events.jsonl, two lines run together, a ring slot overwritten): the damaged records are
    skipped and named in ``problems``, every record after them is read."""
    from rankscope.rundir import RING_HEADER, RING_SLOT

    run = tmp_path / "run"
    probe = _core.Probe(_core.RunDir(run), rank=0)
    try:
        probe.emit("start", pid=os.getpid(), host="here", argv=[], env={})
        probe.flush()
        for i in range(8):  # a flush after each: one line per call, facts for the first two
            _calls(probe, 1, 1 + i % 2)
            probe.flush()
        probe.emit("step", step=1)
        probe.flush()
    finally:
        os.close(probe._fd)
        probe._stacks.close()
    events = run / "ranks" / "0" / "events.jsonl"
    lines = events.read_bytes().split(b"\n")
    calls_at = [i for i, line in enumerate(lines) if b'"ev":"call"' in line]
    assert len(calls_at) == 8
    hit = calls_at[3]
    lines[hit] = lines[hit][:20] + b"\x00\xff\xfe garbage" + lines[hit][40:]  # mid-record
    glued = calls_at[5]
    lines[glued] = lines[glued][:-5] + lines[glued + 1]  # the next line run into it, cut
    del lines[glued + 1]
    events.write_bytes(b"\n".join(lines))
    ring = next((run / "ranks" / "0").glob("calls-*.ring"))
    data = bytearray(ring.read_bytes())
    at = RING_HEADER.size + 4 * RING_SLOT.size  # call 4's slot
    data[at : at + 8] = (12345).to_bytes(8, "little")  # an id that is not the slot's
    ring.write_bytes(bytes(data))

    loaded = load_run(run)
    problems = loaded.problems
    reasons = dict(zip(problems["source"], problems["reason"], strict=True))
    assert "2 line(s) are not JSON objects" in reasons["ranks/0/events.jsonl"], reasons
    ring_rel = f"ranks/0/{ring.name}"
    assert "1 slot(s) corrupted" in reasons[ring_rel], reasons
    calls = loaded.collectives
    ids = calls["coll_id"].tolist()
    # call 4's line was damaged and its slot too: it alone is unknown; calls after it are read
    # (calls 6 and 7 ran together: their slots fill them in), and the step after them
    assert ids == [1, 2, 3, 5, 6, 7, 8], ids
    shapes = ["[[1]]", "[[2]]", "[[1]]", "[[1]]", "[[2]]", "[[1]]", "[[2]]"]
    assert calls["shapes"].astype(str).tolist() == shapes
    assert (loaded.events["ev"] == "step").sum() == 1
