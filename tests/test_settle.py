"""A rank's and a torchrun agent's first import (rankscope._settle): done with the collector
paused, the collector left as it was, what was alive frozen; the probe package imports torch only
when one of its names is used, so that the bootstrap decides how."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rankscope._settle import import_settled


@pytest.fixture
def collections_seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The generations the collector passes over from now on; a module ``made`` under tmp_path
    that makes 5000 lists; the collector as it was, nothing frozen, afterwards."""
    (tmp_path / "made.py").write_text("DATA = [[i] for i in range(5000)]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[int] = []

    def note(phase: str, info: dict) -> None:
        if phase == "start":
            seen.append(info["generation"])

    was_enabled = gc.isenabled()
    gc.callbacks.append(note)
    try:
        yield seen
    finally:
        gc.callbacks.remove(note)
        gc.unfreeze()
        sys.modules.pop("made", None)
        (gc.enable if was_enabled else gc.disable)()


@pytest.mark.parametrize("enabled", [True, False])
def test_an_import_settled_freezes_what_it_made_and_leaves_the_collector_as_it_was(
    collections_seen: list[int], enabled: bool
) -> None:
    (gc.enable if enabled else gc.disable)()
    module = import_settled("made")
    assert module is sys.modules["made"] and len(module.DATA) == 5000
    assert collections_seen == [], "the collector ran during the import"
    assert gc.isenabled() is enabled
    assert gc.get_freeze_count() > 5000


def test_a_failed_import_settled_leaves_the_collector_on(collections_seen: list[int]) -> None:
    gc.enable()
    with pytest.raises(ModuleNotFoundError):
        import_settled("no_such_module_here")
    assert gc.isenabled()


@pytest.mark.slow
def test_the_probe_package_imports_torch_on_first_use_of_a_name() -> None:
    code = (
        "import sys\n"
        "import rankscope.probe\n"
        "print('torch' in sys.modules)\n"
        "from rankscope.probe import step\n"
        "print('torch' in sys.modules, callable(step))\n"
        "try:\n"
        "    rankscope.probe.nope\n"
        "except AttributeError as e:\n"
        "    print(type(e).__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "True", "AttributeError"]
