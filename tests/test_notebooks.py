"""Every notebook under notebooks/ runs top to bottom with real jobs, in the memory Binder gives.

A notebook that passes is written, with its outputs, where the documentation site takes it from
(docs/make_site.py): the site's figures are those of this run."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import nbformat
import psutil
import pytest
from docs.make_site import EXECUTED, META_KEY, digest
from nbclient import NotebookClient

from .conftest import TEST_RUN, leftover_processes

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
#: mybinder.org gives a session 2 GB; the kernel and every job it starts must fit in it.
BINDER_MEMORY = 2 * 1024**3
#: A file per notebook that this file's test has ended (passed, failed or skipped) in a run of
#: the suite, holding that run's id and the folder the notebook ran in (its jobs' ``runs/``):
#: tests/test_site.py waits for them on other workers, tests/test_scenarios.py reads their runs.
ENDED = EXECUTED.parent / "notebooks-ended"


def _ended_mark(path: Path) -> list[str]:
    try:
        return (ENDED / path.stem).read_text().splitlines()
    except OSError:
        return []


def ended_in_this_run(path: Path) -> bool:
    return _ended_mark(path)[:1] == [TEST_RUN]


def workdir_in_this_run(path: Path) -> Path | None:
    """The folder the notebook at ``path`` ran in, if it ended in this run of the suite."""
    mark = _ended_mark(path)
    return Path(mark[1]) if mark[:1] == [TEST_RUN] and len(mark) > 1 else None


@pytest.fixture
def says_when_it_ends(path: Path, tmp_path: Path) -> Iterator[None]:
    """Marks ``path``'s run as ended in this run of the suite, however it ends."""
    try:
        yield
    finally:
        ENDED.mkdir(parents=True, exist_ok=True)
        (ENDED / path.stem).write_text(f"{TEST_RUN}\n{tmp_path}\n")


class PeakMemory:
    """Samples the proportional set size (shared pages split between the processes that map
    them, as a memory cgroup would count them once) of every process below this one.

    Reading a process's PSS walks its page tables in the kernel (tens of milliseconds for a
    rank with torch loaded), so it is read once a second, and not at all while the resident
    sizes, which bound it from above and cost little to read, leave no room for a new peak."""

    def __init__(self, every_s: float = 1.0):
        self.every_s = every_s
        self.peak = 0
        self.peak_procs: list[tuple[str, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(self.every_s):
            procs = me.children(recursive=True)
            if sum(_resident(proc) for proc in procs) <= self.peak:
                continue
            sizes = []
            for proc in procs:
                try:
                    sizes.append((" ".join(proc.cmdline()[:4]), proc.memory_full_info().pss))
                except psutil.Error:
                    continue
            total = sum(size for _, size in sizes)
            if total > self.peak:
                self.peak, self.peak_procs = total, sorted(sizes, key=lambda s: -s[1])


def _resident(proc: psutil.Process) -> int:
    try:
        return proc.memory_info().rss
    except psutil.Error:
        return 0


@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
@pytest.mark.slow
@pytest.mark.usefixtures("says_when_it_ends")
def test_notebook_runs(path: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if "cluster" in path.stem:  # its SLURM part runs where the test cluster starts
        with contextlib.suppress(pytest.skip.Exception):
            request.getfixturevalue("slurm_cluster")
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    with PeakMemory() as memory:
        client.execute()
    errors = [
        out
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.get("output_type") == "error"
    ]
    assert not errors
    assert not leftover_processes(tmp_path)
    top = "\n".join(f"  {size / 2**20:7.0f} MiB  {cmd}" for cmd, size in memory.peak_procs[:8])
    print(f"{path.stem}: peak {memory.peak / 2**20:.0f} MiB (kernel and jobs)\n{top}")
    assert memory.peak < BINDER_MEMORY, f"more than Binder's 2 GB at the peak:\n{top}"
    nb.metadata[META_KEY] = {"source": digest(path), "workdir": str(tmp_path)}
    EXECUTED.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, EXECUTED / path.name)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_notebooks_hold_no_outputs(path: Path) -> None:
    # Outputs are made by runs (the suite's, for the site), never committed.
    nb = nbformat.read(path, as_version=4)
    ran = [i for i, c in enumerate(nb.cells) if c.get("outputs") or c.get("execution_count")]
    assert not ran, f"cells {ran} hold outputs: clear them before committing"
    assert "widgets" not in nb.metadata and "rankscope" not in nb.metadata
