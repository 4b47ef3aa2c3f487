"""The Binder set-up (``binder/``) says what ``pyproject.toml`` and the Makefile say."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parent.parent
BINDER = ROOT / "binder"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _binder_requirements() -> tuple[dict[str, Requirement], list[str]]:
    reqs, options = {}, []
    for raw in (BINDER / "requirements.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-"):
            options.append(line)
            continue
        req = Requirement(line)
        assert req.name not in reqs, f"{req.name} listed twice in binder/requirements.txt"
        reqs[req.name] = req
    return reqs, options


def _by_name(lines: list[str]) -> dict[str, Requirement]:
    return {req.name: req for req in map(Requirement, lines)}


def test_binder_installs_the_projects_dependencies_and_the_lab_extra():
    project = _pyproject()
    want = _by_name(project["dependencies"]) | _by_name(project["optional-dependencies"]["lab"])
    got, _ = _binder_requirements()
    assert set(got) == set(want), (
        "binder/requirements.txt and pyproject.toml name different packages"
    )
    for name, req in want.items():
        if name == "torch":
            continue
        assert got[name].specifier == req.specifier, (
            f"{name}: binder/requirements.txt says {got[name].specifier}, pyproject.toml says "
            f"{req.specifier}"
        )


def test_binder_torch_is_the_cpu_build_the_makefile_pins():
    got, options = _binder_requirements()
    torch = got["torch"]
    (spec,) = list(torch.specifier)
    assert spec.operator == "==" and spec.version.endswith("+cpu"), (
        f"torch must be pinned to a +cpu build, got {spec}"
    )
    version = spec.version.removesuffix("+cpu")
    pinned = re.search(r"^TORCH \?= torch==(\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert pinned is not None, "the Makefile no longer pins TORCH ?= torch==X"
    assert version == pinned.group(1), f"Binder installs torch {version}, the Makefile {pinned[1]}"
    (project_torch,) = [
        r for r in map(Requirement, _pyproject()["dependencies"]) if r.name == "torch"
    ]
    assert version in project_torch.specifier, f"torch {version} is outside {project_torch}"
    assert any(CPU_INDEX in option for option in options), f"no index option for {CPU_INDEX}"


def test_binder_python_and_postbuild():
    runtime = (BINDER / "runtime.txt").read_text().strip()
    match = re.fullmatch(r"python-(\d+\.\d+)", runtime)
    assert match, f"binder/runtime.txt should read python-X.Y, not {runtime!r}"
    assert f"{match[1]}.0" in SpecifierSet(_pyproject()["requires-python"])
    post = BINDER / "postBuild"
    assert os.access(post, os.X_OK), "binder/postBuild must be executable (repo2docker runs it)"
    text = post.read_text()
    assert "pip install --no-deps -e ." in text  # dependencies come from requirements.txt only
    landing = re.search(r'default_url = "/lab/tree/(\S+)"', text)
    assert landing and (ROOT / landing[1]).is_file(), "the landing page is not a notebook here"
    assert landing[1] == "notebooks/00-quickstart.ipynb"
    readme = (ROOT / "README.md").read_text()
    assert "urlpath=lab/tree/notebooks/00-quickstart.ipynb" in readme  # the Binder link
