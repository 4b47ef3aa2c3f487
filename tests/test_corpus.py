"""The diagnosis corpus (tests/corpus): hangs and failures that are hard to diagnose, each run
for real under rankscope and checked against its expected answer: culprit, cause, recipe, the
culprit's call site, the chain of waits, the thread, what the culprit was blocked on."""

from __future__ import annotations

import pytest

from rankscope.analyze import diagnose
from rankscope.launch import JobSpec

from .corpus.expect import cases, check

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]
CASES = cases()


def test_the_corpus_is_broad():
    assert len(CASES) >= 15
    causes = {c.cause for c in CASES}
    assert {
        "rank_conditional_collective",
        "stuck_outside",
        "uneven_inputs",
        "rank_killed",
    } <= causes
    assert any(c.verdict == "ok" for c in CASES), "a healthy run that must stay ok"


def test_the_framework_corpus_is_broad():
    """At least twelve framework cases, with a healthy run of each framework."""
    framed = [c for c in CASES if c.needs]
    assert len(framed) >= 12
    frameworks = {"lightning", "transformers", "accelerate", "deepspeed"}
    assert {c.framework for c in framed} == frameworks
    assert {c.framework for c in framed if c.verdict == "ok"} == frameworks
    assert {"rank_conditional_collective", "uneven_inputs", "rank_crashed"} <= {
        c.cause for c in framed
    }


#: A framework's case imports the framework in every rank (tens of seconds on a loaded machine)
#: before its first step: its job gets longer.
FRAMEWORK_WAIT_S = 420


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, marks=pytest.mark.timeout(FRAMEWORK_WAIT_S + 60)) if c.needs else c
        for c in CASES
    ],
    ids=[c.name for c in CASES],
)
def test_corpus_case_is_diagnosed(case, start_job):
    if case.missing():
        pytest.skip(
            f"{case.name} needs {', '.join(case.missing())}: pip install -e '.[frameworks]'"
        )
    job = start_job.spec(
        JobSpec(
            script=str(case.path),
            nproc_per_node=case.ranks,
            nnodes=case.nodes,
            **case.spec_settings(),
        )
    )
    wait = FRAMEWORK_WAIT_S if case.needs else 120
    assert job.wait(timeout=wait) is not None, "the job did not end"
    d = diagnose(job.run.path)
    assert not check(case, d), "\n".join(check(case, d)) + "\n\n" + d.render()
