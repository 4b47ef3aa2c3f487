"""What a capture's flight-recorder dump costs a rank: the stack traces of its entries are
symbolized only where that is free (the job imported torch's compiler itself), never by an
import of the compiler on the probe's thread (1.4 s of CPU holding the GIL, and a race with the
main thread's own imports)."""

from __future__ import annotations

import json

import pytest

from rankscope.collect import load_run


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["plain", "ddp"])
def test_a_capture_never_imports_the_compiler(mode, start_job, tmp_path):
    out = tmp_path / "cost.json"
    # a new interpreter: a rank forked from the template has the compiler imported already
    job = start_job(
        "launch/capture_cost.py",
        args=[str(out), mode],
        nproc_per_node=1,
        env={"RANKSCOPE_FORK_RANKS": "0"},
    )
    assert job.wait(timeout=120) == 0, job.info()
    cost = json.loads(out.read_text())
    # the job's own imports decide: DDP's constructor imports the compiler, all_reduce does not
    assert cost["inductor"] == cost["inductor_before"] == (mode == "ddp")
    assert cost["capture_s"] < 1.0, cost
    frames = load_run(job.run.path).fr_frames
    if mode == "ddp":  # the compiler was there: the dump carries the entries' stack traces,
        assert not frames.empty  # where DDP's all_reduce (issued from C++) has its only site
        assert frames["filename"].astype(str).str.endswith("capture_cost.py").any()
    else:  # the probe's events carry every call site
        assert frames.empty
