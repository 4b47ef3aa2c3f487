"""Small runnable reproductions of the failure recipes and of reported deadlocks.

Each scenario is a plain torch script under ``scripts/`` (no rankscope import: it runs the same
under bare torchrun) with a ``--fix`` switch that applies the recipe's fix. ``catalogue.json`` is
the data: what goes wrong, the fix, how many ranks show it, and the diagnosis the workbench is
expected to reach. The workbench's scenario picker, the CLI and the tests all read it here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from rankscope.launch import JobSpec

SCRIPTS = Path(__file__).resolve().parent / "scripts"


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """One catalogue entry."""

    id: str
    title: str
    recipe: str | None
    kind: str  # "recipe" or "reported"
    script: str
    nproc_per_node: int
    what_goes_wrong: str
    fix: str
    expected: dict[str, Any]
    """Diagnosis of the broken run: verdict, cause, culprit_ranks (null: not asserted)."""
    source: str | None = None
    nnodes: int = 1
    args: tuple[str, ...] = ()
    presets: tuple[str, ...] = ()
    stall_timeout_s: float = 5.0
    expected_fixed: dict[str, Any] = field(default_factory=lambda: {"verdict": "ok"})

    @property
    def path(self) -> Path:
        return SCRIPTS / self.script

    def spec(self, *, fix: bool = False, **overrides: Any) -> JobSpec:
        """The job that runs this scenario (broken, or with ``--fix``)."""
        settings: dict[str, Any] = {
            "script": str(self.path),
            "args": [*self.args, *(["--fix"] if fix else [])],
            "nproc_per_node": self.nproc_per_node,
            "nnodes": self.nnodes,
            "stall_timeout_s": self.stall_timeout_s,
            "name": f"{self.id}{'-fixed' if fix else ''}",
        }
        if self.presets:
            settings["presets"] = ("flight_recorder", *self.presets)
        settings.update(overrides)
        return JobSpec(**settings)


def catalogue() -> list[Scenario]:
    """Every scenario, in catalogue order."""
    text = resources.files(__package__).joinpath("catalogue.json").read_text()
    out = []
    for entry in json.loads(text):
        entry = dict(entry)
        for key in ("args", "presets"):
            entry[key] = tuple(entry.get(key, ()))
        out.append(Scenario(**entry))
    return out


def get(scenario_id: str) -> Scenario:
    """The scenario with this id; ValueError naming the known ids otherwise."""
    for scenario in catalogue():
        if scenario.id == scenario_id:
            return scenario
    known = ", ".join(s.id for s in catalogue())
    raise ValueError(f"no scenario {scenario_id!r}; known: {known}")


__all__ = ["SCRIPTS", "Scenario", "catalogue", "get"]
