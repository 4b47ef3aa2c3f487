"""Ranks forked from a template that imported torch once (rankscope._template): real torchrun
jobs whose ranks start and end as new interpreters would, side by side with the same job
started the usual way; and when the template is not used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rankscope import _template
from rankscope.launch import Job

SCRIPT = "launch/forked.py"
FORK = {"PYTHONHASHSEED": "0"}
EXEC = {"PYTHONHASHSEED": "0", _template.ENV_FORK: "0"}


def seen(job: Job) -> dict[int, dict]:
    """What each rank printed of itself, by rank, from its stdout file."""
    out = {}
    for path in Path(job.run.path, "logs").rglob("stdout.log"):
        text = path.read_text()
        head = "no newline yet, C, "  # Python's and C's output unbuffered, as python -u
        assert text.startswith(head), text
        line = json.loads(text.removeprefix(head).splitlines()[0])
        out[line["rank"]] = line
    return out


def test_the_template_is_used_only_where_the_ranks_hash_strings_alike():
    assert _template.wanted({"PYTHONHASHSEED": "0"}) is None
    assert "PYTHONHASHSEED" in _template.wanted({})
    assert "PYTHONHASHSEED" in _template.wanted({"PYTHONHASHSEED": "random"})
    assert _template.wanted(EXEC) == f"{_template.ENV_FORK}=0"


@pytest.mark.slow
def test_a_forked_rank_starts_as_a_new_interpreter_would(start_job):
    forked = start_job(SCRIPT, args=["return"], nproc_per_node=3, env=FORK)
    usual = start_job(SCRIPT, args=["return"], nproc_per_node=3, env=EXEC)
    assert forked.wait(timeout=90) == 0 and usual.wait(timeout=90) == 0
    a, b = seen(forked), seen(usual)
    assert sorted(a) == sorted(b) == [0, 1, 2]
    for job, ranks in ((forked, a), (usual, b)):
        (agent,) = [x["pid"] for x in job.info()["agents"]]
        for rank, line in ranks.items():
            assert line["ppid"] == agent and line["own_session"], line  # torchrun's child
            assert line["env_rank"] == str(rank) and line["threads"] == 1  # OMP_NUM_THREADS=1
            assert line["argv"][0].endswith("forked.py") and line["argv"][1:] == ["return"]
        assert len({line["hash"] for line in ranks.values()}) == 1  # PYTHONHASHSEED=0
        assert len({line["numpy"] for line in ranks.values()}) == 3  # drawn in each rank
    # the one difference: /proc shows the agent's command for a forked rank (or the warm
    # interpreter's that the agent was forked from: rankscope._warm)
    assert a[0]["cmdline"][1:3] in (["-m", "rankscope.torchrun"], ["-m", "rankscope._warm"])
    assert b[0]["cmdline"][1:3] == ["-u", "-m"]
    assert a[0]["hash"] == b[0]["hash"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("end", "code"), [("raise", 1), ("exit3", 3), ("os_exit4", 4), ("segv", -11)]
)
def test_a_forked_rank_ends_as_a_new_interpreter_would(start_job, end, code):
    job = start_job(SCRIPT, args=[end], nproc_per_node=2, env=FORK)
    assert job.wait(timeout=90) != 0
    assert job.info()["ranks"]["1"]["exit_code"] == code
