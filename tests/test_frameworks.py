"""Coexisting with the frameworks: a rank whose script (or its framework: Lightning's Trainer)
takes SIGTERM over still leaves its stacks and flight recorder when the job is stopped, and the
card says where they come from rather than that none exist; a framework's own launcher
(`accelerate launch`) gives the card torchrun gives. Real jobs, gloo."""

from __future__ import annotations

import importlib.util

import pytest

from rankscope.analyze import diagnose
from rankscope.collect import load_run
from rankscope.launch import JobSpec

from .corpus.expect import cases, check
from .test_corpus import FRAMEWORK_WAIT_S

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

#: Stopped once its stall is proven: the stop's SIGTERM, then SIGKILL after the grace period.
SPEC = {"stall_timeout_s": 3.0, "on_stall": "stop", "collective_timeout_s": 120.0}
NOT_KEPT = "no stacks or flight-recorder dump from its last moment"


def stopped_with_own_handler(job, ranks: int):
    """The run of a job whose ranks outlived the stop's SIGTERM: each died of the SIGKILL after
    it, with stacks taken at the SIGTERM, and the card says so."""
    assert job.wait(timeout=200) is not None, "the job did not end"
    return outlived_sigterm(job.run.path, ranks)


def outlived_sigterm(path, ranks: int):
    run = load_run(path)
    codes = dict(zip(run.ranks["rank"].tolist(), run.ranks["exit_code"].tolist(), strict=True))
    assert codes == dict.fromkeys(range(ranks), -9), "the script's handler kept the ranks alive"
    summary = run.stack_summary
    for rank in range(ranks):
        taken = summary[summary["rank"].eq(rank) & summary["reason"].eq("SIGTERM").fillna(False)]
        assert len(taken), f"rank {rank} left no stacks at the SIGTERM its handler took"
    d = diagnose(run)
    text = d.render()
    assert NOT_KEPT not in text, text
    assert "outlived its SIGTERM" in text, text
    return run, d


def test_a_script_that_handles_sigterm_still_leaves_its_evidence(start_job):
    job = start_job("launch/own_sigterm.py", nproc_per_node=3, **SPEC)
    run, d = stopped_with_own_handler(job, 3)
    assert d.verdict == "hang", d.render()
    stacks = run.stacks
    mine = stacks["file"].fillna("").astype(str).str.endswith("own_sigterm.py")
    at_stop = stacks[stacks["reason"].eq("SIGTERM").fillna(False) & mine]
    assert set(at_stop["rank"].astype(int)) == {0, 1, 2}, "the SIGTERM's stacks hold the script"


@pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None,
    reason="needs lightning: pip install -e '.[frameworks]'",
)
def test_lightnings_sigterm_handler_leaves_the_evidence(start_job):
    """Lightning installs its own SIGTERM handler (it notes the signal, and broadcasts it at its
    next step): the probe's capture still runs at the stop, on every rank."""
    case = next(c for c in cases() if c.name == "fw_lightning_gather_on_zero")
    job = start_job.spec(JobSpec(script=str(case.path), nproc_per_node=case.ranks, **SPEC))
    _run, d = stopped_with_own_handler(job, case.ranks)
    assert d.culprit_ranks == [0], d.render()


#: Each framework's own launcher that starts several CPU processes here, and a case of the
#: corpus it runs: the card must be the one the corpus expects under torchrun. Lightning has no
#: launcher of its own beyond torchrun (its `python train.py` start re-executes the script in
#: processes it spawns itself, outside any launcher rankscope starts). DeepSpeed's launcher
#: (`launcher="deepspeed"`, tested in test_launchers.py) starts the ranks, but its
#: `init_distributed` then builds DeepSpeed's shared-memory op with torch's cpp_extension (ninja)
#: in every rank: on a loaded two-core machine that ran past six minutes, so no card is asked of it.
OWN_LAUNCHERS = {"accelerate": ("fw_accelerate_gather_on_main", {})}


@pytest.mark.timeout(FRAMEWORK_WAIT_S + 60)
@pytest.mark.parametrize("launcher", sorted(OWN_LAUNCHERS))
def test_a_framework_s_own_launcher_gives_the_card_torchrun_gives(start_job, launcher):
    name, settings = OWN_LAUNCHERS[launcher]
    case = next(c for c in cases() if c.name == name)
    missing = [n for n in sorted({launcher, *case.needs}) if importlib.util.find_spec(n) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}: pip install -e '.[frameworks]'")
    job = start_job.spec(
        JobSpec(
            script=str(case.path),
            nproc_per_node=case.ranks,
            launcher=launcher,
            **settings,
            **case.spec_settings(),
        )
    )
    assert job.wait(timeout=FRAMEWORK_WAIT_S) is not None, "the job did not end"
    assert job.info()["spec"]["launcher"] == launcher
    d = diagnose(job.run.path)
    wrong = check(case, d)
    assert not wrong, "\n".join(wrong) + "\n\n" + d.render()
