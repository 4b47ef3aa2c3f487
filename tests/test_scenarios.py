"""Every scenario in the catalogue, broken and fixed, diagnosed as the catalogue says."""

from __future__ import annotations

import pytest

from rankscope.analyze import diagnose
from rankscope.scenarios import catalogue, get

SCENARIOS = catalogue()


def test_catalogue_is_complete_and_consistent():
    ids = [s.id for s in SCENARIOS]
    assert len(ids) == len(set(ids))
    recipes = {s.recipe for s in SCENARIOS if s.kind == "recipe"}
    assert {"D8", "D9", "D10", "D11", "D19", "D20", "D21", "D22", "D23"} <= recipes
    assert sum(s.kind == "reported" for s in SCENARIOS) == 4
    for s in SCENARIOS:
        assert s.path.is_file(), s.path
        assert "import rankscope" not in s.path.read_text()  # plain torch scripts
        assert s.expected["verdict"] in {"hang", "crash", "launch_error"}
    with pytest.raises(ValueError, match="known: d08"):
        get("nope")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.id for s in SCENARIOS])
def test_scenario_breaks_as_catalogued_and_the_fix_passes(scenario, start_job):
    job = start_job.spec(scenario.spec(on_stall="stop"))
    job.wait(timeout=120)
    got = diagnose(job.run.path).to_dict()
    want = scenario.expected
    assert got["verdict"] == want["verdict"], got["summary"]
    if want.get("cause") is not None:
        assert got["cause"] == want["cause"], got["summary"]
    if want.get("culprit_ranks") is not None:
        assert got["culprit_ranks"] == want["culprit_ranks"], got["summary"]

    fixed = start_job.spec(scenario.spec(fix=True, on_stall="stop"))
    assert fixed.wait(timeout=120) == 0
    assert diagnose(fixed.run.path).to_dict()["verdict"] == scenario.expected_fixed["verdict"]
