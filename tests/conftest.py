"""Shared fixtures: real jobs in a temporary runs folder, and a check that none outlives its test;
the fast lane's rule: a test that starts a process is marked ``slow``; and the order and groups
that let ``make test`` run the suite on several workers (pytest-xdist, ``--dist loadgroup``)."""

from __future__ import annotations

import multiprocessing.process
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest

from rankscope.launch import Job, JobSpec

from .slurm_cluster import LocalSlurm, Unavailable

if TYPE_CHECKING:
    from rankscope.probe import _core

SCRIPTS = Path(__file__).parent / "scripts"
# The suite's jobs hash strings alike on every rank (no script here depends on a rank's own hash
# seed), so their ranks fork from a template that imported torch once (rankscope._template): a
# job starts in a fraction of the CPU. tests/test_template.py sets ranks so started beside ranks
# started the usual way, and a job of its own may ask for the usual way (RANKSCOPE_FORK_RANKS=0).
os.environ.setdefault("PYTHONHASHSEED", "0")
#: This run of the suite, the same in every xdist worker (tests/test_site.py waits for the
#: notebooks that this run executes, wherever they run).
TEST_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex

#: Tests that share something that exists once (a session's cluster, a module's job, a folder of
#: the checkout) run on one worker, one after another: the scheduler below gives every test of
#: such a file one work unit. (xdist's own ``xdist_group`` mark renames each test's node id,
#: which pytest 9.2's node ids no longer allow: the mark groups nothing there.)
GROUP_BY_FILE = {
    # JupyterLab and Chromium, `make lab` in the checkout itself
    "test_browser.py": "browser",
    # the site's build into docs/_build/html, once for the module
    "test_site.py": "site",
    # the benchmarks, one at a time (their bounds allow for a loaded machine)
    "test_bench.py": "bench",
    # the session's SLURM cluster (and the notebooks that start it: group_of)
    "test_slurm.py": "slurm",
    # the module's hung job
    "test_debug_server.py": "debug_server",
}
#: Fixtures that exist once, and the group every test that uses them must be in.
GROUP_OF_FIXTURE = {"slurm_cluster": "slurm", "hung_job": "debug_server"}


def group_of(nodeid: str) -> str | None:
    """The group of a test, from its node id alone (the scheduler, in xdist's controller, has
    no more)."""
    if runs_a_notebook(nodeid) and "cluster" in nodeid:
        return "slurm"  # it asks for slurm_cluster by name, inside the test
    return GROUP_BY_FILE.get(nodeid.partition("::")[0].rpartition("/")[2])


def runs_a_notebook(nodeid: str) -> bool:
    path, _, name = nodeid.partition("::")
    return path.rpartition("/")[2] == "test_notebooks.py" and name.startswith("test_notebook_runs[")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadgroup``: xdist's scheduling by work units, a group's tests one unit (their
    order kept), every other test a unit of its own, handed out in the order of the collection
    (pytest_collection_modifyitems), not the largest unit first."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class Grouped(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid) or nodeid

    return Grouped(config, log)


def run_order(nodeid: str, *, slow: bool) -> int:
    """Where a test goes in the order that work units are handed out (the longest work first,
    the shortest last, so that both workers run until the end):

    0. the notebooks: the longest tests; the site's build waits for them;
    1. the other groups' tests (JupyterLab and Chromium, the SLURM cluster, ...): units of
       several long tests each;
    2. the site's tests: its build waits for the notebooks, which by then have ended (unless one
       is still running on the other worker), and it is one long unit, which would leave the
       other worker idle at the end;
    3. the other slow tests (each starts a job);
    4. the tests not marked ``slow``: quick, they share out the end evenly.
    """
    group = group_of(nodeid)
    if runs_a_notebook(nodeid):
        return 0
    if group is not None:
        return 2 if group == "site" else 1
    return 3 if slow else 4


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests in :func:`run_order`, each file's in their order. A test that uses a fixture
    that exists once outside its group is an error: it would share the fixture with another
    worker."""
    for item in items:
        for fixture, group in GROUP_OF_FIXTURE.items():
            if fixture in getattr(item, "fixturenames", ()) and group_of(item.nodeid) != group:
                raise pytest.UsageError(
                    f"{item.nodeid} uses {fixture}, which exists once: put its file in "
                    f"tests/conftest.py's GROUP_BY_FILE as {group!r}"
                )
    # stable: the rest keep their order
    items.sort(
        key=lambda item: run_order(item.nodeid, slow=item.get_closest_marker("slow") is not None)
    )


def site_of(script: str, tag: str) -> str:
    """``name.py:line`` of the line marked ``# site: <tag>`` in a worker script (a path under
    ``tests/scripts``): where a diagnosis should place that call."""
    path = SCRIPTS / script
    for no, line in enumerate(path.read_text().splitlines(), 1):
        if f"# site: {tag}" in line:
            return f"{path.name}:{no}"
    raise AssertionError(f"no line marked 'site: {tag}' in {script}")


def processes_with(name: str, test: Callable[[str], bool]) -> list[psutil.Process]:
    """Processes whose environment variable ``name`` passes ``test``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if test(proc.environ().get(name, "")):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def leftover_processes(root: Path) -> list[psutil.Process]:
    """Processes whose RANKSCOPE_RUN_DIR lies under ``root``."""
    root_s = str(root.resolve())
    return processes_with("RANKSCOPE_RUN_DIR", lambda value: value.startswith(root_s))


class JobFactory:
    def __init__(self, root: Path):
        self.root = root
        self.jobs: list[Job] = []

    def __call__(self, script: str, *, detached: bool = False, **spec: object) -> Job:
        return self.spec(JobSpec(script=str(SCRIPTS / script), **spec), detached=detached)

    def spec(self, spec: JobSpec, *, detached: bool = False) -> Job:
        job = Job(spec, runs_root=self.root, detached=detached)
        self.jobs.append(job.start())
        return job


@pytest.fixture(autouse=True)
def _only_slow_tests_start_processes(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``make check`` runs the tests not marked ``slow`` and promises they start no job: a test
    outside the mark that starts a process (a job, a kernel, a browser) fails, naming the mark."""
    if request.node.get_closest_marker("slow") is not None:
        return
    who = request.node.nodeid

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"{who} starts a process: mark it @pytest.mark.slow")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)


@pytest.fixture
def start_job(tmp_path: Path) -> Iterator[JobFactory]:
    """``start_job("launch/clean.py", nproc_per_node=2, ...)`` starts a real job; every job is
    stopped at teardown and the test fails if any of its processes survive."""
    factory = JobFactory(tmp_path / "runs")
    try:
        yield factory
    finally:
        for job in factory.jobs:
            if job.run is not None and job.poll() is None:
                job.stop(grace_s=1.0)
        left = leftover_processes(tmp_path)
        for proc in left:
            proc.kill()
        assert not left, f"processes outlived the test: {[p.pid for p in left]}"


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    """A real SLURM cluster on this host (tests/slurm_cluster.py) for the session, reached
    through SLURM_CONF in this process's environment; skips, saying why, where it cannot
    start."""
    try:
        slurm = LocalSlurm(tmp_path_factory.mktemp("slurm")).start()
    except Unavailable as exc:
        pytest.skip(f"no SLURM test cluster here: {exc}")
    saved = os.environ.get("SLURM_CONF")
    os.environ.update(slurm.env)  # the jobs' supervisors, the tests' clients, kernels reach it
    try:
        yield slurm
    finally:
        slurm.stop()
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved


@pytest.fixture
def chromium() -> str:
    """Debian's chromium, installed by tests/debian_setup.sh if missing; skip if it cannot be."""
    found = shutil.which("chromium")
    if found is None:
        setup = subprocess.run(
            ["sh", str(Path(__file__).parent / "debian_setup.sh"), "browser"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        found = shutil.which("chromium")
        if found is None:
            why = (setup.stderr or setup.stdout).strip()[-400:]
            pytest.skip(f"chromium is not installed and could not be installed: {why}")
    return found


@pytest.fixture
def python() -> str:
    return sys.executable


def close_probes(*probes: _core.Probe) -> None:
    """Close the files of probes made in the test process (never started, or stopped)."""
    for p in probes:
        os.close(p._fd)
        p._stacks.close()


#: The fields of an older probe's enter line that are the call's facts.
FACT_FIELDS = ("op", "pg", "pg_desc", "pg_ranks", "peer", "shapes", "dtypes", "async_op")
FACT_FIELDS += ("file", "line", "func")


def as_probe_lines(events: list[dict]) -> list[dict]:
    """An older probe's events (the facts in every enter line) as the probe writes them now:
    each distinct facts' ``facts`` line before the first call with them, a ``call`` line for a
    call whose exit line came right after its enter line (and returned), else its enter line
    (naming its facts) and its exit line as they were. Written apart from the readers, to
    check them: ``rankscope.rundir.EVENT_KINDS`` says the format."""
    out: list[dict] = []
    fids: dict[str, int] = {}
    for ev in events:
        if ev.get("ev") != "enter":
            if ev.get("ev") != "exit" or not out or out[-1].get("id") != ev.get("id"):
                out.append(ev)
            elif out[-1]["ev"] == "enter" and ev.get("ok") is True and ev.get("error") is None:
                out[-1] = {**out[-1], "ev": "call", "dur_s": ev.get("dur_s"), "ok": True}
            else:
                out.append(ev)
            continue
        facts = {k: ev[k] for k in FACT_FIELDS if k in ev}
        where = {k: ev[k] for k in ("t", "rank") if k in ev}
        key = repr(sorted(facts.items()))
        if key not in fids:
            fids[key] = len(fids) + 1
            out.append({"ev": "facts", "facts": fids[key], **facts, **where})
        head = {k: ev[k] for k in ("id", "seq", "tid") if k in ev}
        out.append({**head, "facts": fids[key], "ev": "enter", **where})
    return out


def older_lines() -> list[dict]:
    """An older probe's lines for calls of every kind: returned, raised, an async one
    completed later, one in flight at a flush (a heartbeat between its enter and exit), and
    the last one still in flight; every member of the group in each enter line."""
    where = {"file": "/x/train.py", "line": 41, "func": "step", "tid": 5, "rank": 0}
    group = {"pg": "0", "pg_desc": "default_pg", "pg_ranks": [0, 1, 2], "peer": None}
    call = {"op": "all_reduce", **group, "shapes": [[4]], "dtypes": ["float32"], **where}
    out: list[dict] = [{"ev": "start", "t": 10.0, "pid": os.getpid(), "rank": 0, "works": True}]
    for cid in range(1, 9):
        t = 20.0 + cid
        facts = {"async_op": cid == 3, "shapes": [[cid % 2 + 1]]}
        exit_ = {"ev": "exit", "id": cid, "op": "all_reduce", "pg": "0", "seq": cid}
        exit_ |= {"dur_s": 0.25, "ok": cid != 2, "t": t + 0.25, "rank": 0}
        exit_["error"] = "RuntimeError: no" if cid == 2 else None
        out.append({"ev": "enter", "id": cid, "seq": cid, **call, **facts, "t": t})
        if cid == 5:
            out.append({"ev": "heartbeat", "t": t + 0.1, "done": 4})
        if cid < 8:
            out.append(exit_)
        if cid == 4:
            out.append({"ev": "done", "t": t + 0.5, "ids": [3], "failed": []})
    return out
