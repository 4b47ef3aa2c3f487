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


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
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
    assert job.wait(timeout=120) is not None, "the job did not end"
    d = diagnose(job.run.path)
    assert not check(case, d), "\n".join(check(case, d)) + "\n\n" + d.render()
