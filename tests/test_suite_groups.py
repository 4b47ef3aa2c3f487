"""The suite's own scheduling (tests/conftest.py): under ``make test``'s ``--dist loadgroup``,
the tests that share something that exists once run on one worker, one after another."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict

import pytest

from .conftest import GROUP_BY_FILE, group_of, run_order


def test_a_test_s_group_comes_from_its_node_id() -> None:
    assert group_of("tests/test_site.py::test_the_site_reads_at_a_glance") == "site"
    assert group_of("tests/test_notebooks.py::test_notebook_runs[02-laptop-to-cluster]") == "slurm"
    assert group_of("tests/test_notebooks.py::test_notebook_runs[00-quickstart]") is None
    assert group_of("tests/test_state.py::test_x[test_site.py]") is None
    assert set(GROUP_BY_FILE.values()) >= {"slurm", "debug_server", "site", "browser", "bench"}


def test_the_longest_work_goes_out_first_and_the_quick_tests_last() -> None:
    nodeids = {
        "tests/test_state.py::test_words_not_reprs": False,
        "tests/test_site.py::test_the_site_reads_at_a_glance": False,
        "tests/test_launch.py::test_clean_job": True,
        "tests/test_browser.py::test_make_lab_serves_the_quickstart_at_the_url_it_prints": True,
        "tests/test_notebooks.py::test_notebook_runs[00-quickstart]": True,
        "tests/test_notebooks.py::test_committed_notebooks_hold_no_outputs[00-quickstart]": False,
        "tests/test_notebooks.py::test_notebook_runs[02-laptop-to-cluster]": True,
    }
    ordered = sorted(nodeids, key=lambda n: run_order(n, slow=nodeids[n]))
    assert ordered == [
        "tests/test_notebooks.py::test_notebook_runs[00-quickstart]",
        "tests/test_notebooks.py::test_notebook_runs[02-laptop-to-cluster]",
        "tests/test_browser.py::test_make_lab_serves_the_quickstart_at_the_url_it_prints",
        "tests/test_site.py::test_the_site_reads_at_a_glance",
        "tests/test_launch.py::test_clean_job",
        "tests/test_state.py::test_words_not_reprs",
        "tests/test_notebooks.py::test_committed_notebooks_hold_no_outputs[00-quickstart]",
    ]


#: Quick tests of no group, for the other worker.
_STATE_TESTS = (
    "test_a_state_said_of_several_ranks_agrees_with_them",
    "test_words_not_reprs",
    "test_done_counts_completed_collectives_only",
)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_group_s_tests_run_on_one_worker() -> None:
    """Two workers, two groups' quick tests and some others: each group on one worker."""
    tests = [
        "tests/test_site.py::test_every_summary_line_of_the_api_pages_reads_as_text",
        "tests/test_site.py::test_a_card_s_page_shows_the_call_paths_under_their_caption",
        "tests/test_debug_server.py::test_a_url_nobody_answers_says_how_to_start_the_debug_server",
        "tests/test_debug_server.py::test_a_frontend_without_its_dependencies_says_what_to_install",
        *(f"tests/test_state.py::{name}" for name in _STATE_TESTS),
    ]
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2"]
    cmd += ["--dist", "loadgroup", "-v", *tests]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "scheduling tests via Grouped" in done.stdout
    workers: dict[str, set[str]] = defaultdict(set)
    for worker, nodeid in re.findall(r"^\[(gw\d)\] .*?PASSED (\S+)", done.stdout, re.M):
        workers[group_of(nodeid) or nodeid].add(worker)
    assert {"site", "debug_server"} <= workers.keys(), done.stdout[-3000:]
    assert len({w for ws in workers.values() for w in ws}) == 2  # both workers ran tests
    split = {group: ws for group, ws in workers.items() if len(ws) > 1}
    assert not split, f"a group's tests ran on several workers: {split}"
