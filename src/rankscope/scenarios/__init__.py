"""Small runnable reproductions of the failure recipes and of reported deadlocks.

Each scenario is a plain torch script under ``scripts/`` (no rankscope import: it runs the same
under bare torchrun) with a ``--fix`` switch that applies the recipe's fix. ``catalogue.json`` is
the data: what goes wrong, the fix, how many ranks show it, and the diagnosis the workbench is
expected to reach. The workbench's scenario picker, the CLI and the tests all read it here.

Where the mistake is in the launch rather than in the script (the launcher recipes D1-D6), the
entry says how each run is launched: ``launch`` and ``launch_fixed`` hold :class:`JobSpec`
settings for the broken and the fixed run (a launcher, its arguments, a port, a hostfile), and
``fix_flag`` is false when the script has no ``--fix`` switch because nothing in it changes.
"""

from __future__ import annotations

import dataclasses
import importlib.util
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
    """Diagnosis of the broken run: verdict, cause, culprit_ranks (null: not asserted), the
    recipe where the card names one other than its cause's (a crash whose text is a known
    error, :func:`rankscope.collect.recognise`), and where the script has one, parting: the text of the line that sent the culprits another
    way (``elif rank == 0:``); first_seq: the collective where the ranks' paths first part
    (``first_divergence``), where that lies before the hang."""
    source: str | None = None
    nnodes: int = 1
    args: tuple[str, ...] = ()
    presets: tuple[str, ...] = ()
    stall_timeout_s: float = 5.0
    launch: dict[str, Any] = field(default_factory=dict)
    """JobSpec settings of the broken run on top of the ones above (``launcher``,
    ``launcher_args``, ``master_port``, ``hostfile``, a shorter ``startup_timeout_s``, ...)."""
    launch_fixed: dict[str, Any] = field(default_factory=dict)
    """JobSpec settings of the fixed run on top of the ones above."""
    fix_flag: bool = True
    """Whether the fixed run passes ``--fix`` to the script; false when the fix is all in the
    launch and the script has no such switch."""
    requires: tuple[str, ...] = ()
    """Modules the script imports beyond torch (an optional extra such as ``deepspeed``)."""

    def __post_init__(self) -> None:
        known = {f.name for f in dataclasses.fields(JobSpec)}
        for name in ("launch", "launch_fixed"):
            unknown = sorted(set(getattr(self, name)) - known)
            if unknown:
                raise ValueError(
                    f"scenario {self.id}: {name} has settings that JobSpec does not take: "
                    f"{unknown}; known: {sorted(known)}"
                )

    def wrong(self, diagnosis: Any) -> list[str]:
        """What ``diagnosis`` (a :class:`~rankscope.analyze.Diagnosis` of the broken run) gets
        wrong against :attr:`expected`; empty when it is as catalogued."""
        want, got = self.expected, diagnosis.to_dict()
        parting = (got.get("parting") or {}).get("source")
        checks = [
            ("verdict", got["verdict"]),
            ("cause", got["cause"]),
            ("culprit_ranks", got["culprit_ranks"]),
            ("recipe", got["recipe"]),
            ("parting", parting),
            ("first_seq", (got.get("first_divergence") or {}).get("seq")),
        ]
        return [
            f"{key} {value!r}, expected {want[key]!r}: {got['summary']}"
            for key, value in checks
            if want.get(key) is not None and value != want[key]
        ]

    @property
    def path(self) -> Path:
        return SCRIPTS / self.script

    def missing(self) -> list[str]:
        """The modules of ``requires`` that cannot be imported here (the scenario cannot run)."""
        return [m for m in self.requires if importlib.util.find_spec(m) is None]

    def spec(self, *, fix: bool = False, **overrides: Any) -> JobSpec:
        """The job that runs this scenario (broken, or fixed: with ``--fix`` and
        ``launch_fixed``). ``overrides`` win over the catalogue's settings."""
        settings: dict[str, Any] = {
            "script": str(self.path),
            "args": [*self.args, *(["--fix"] if fix and self.fix_flag else [])],
            "nproc_per_node": self.nproc_per_node,
            "nnodes": self.nnodes,
            "stall_timeout_s": self.stall_timeout_s,
            "name": f"{self.id}{'-fixed' if fix else ''}",
        }
        if self.presets:
            settings["presets"] = ("flight_recorder", *self.presets)
        settings.update(self.launch_fixed if fix else self.launch)
        settings.update(overrides)
        return JobSpec(**settings)


def catalogue() -> list[Scenario]:
    """Every scenario, in catalogue order."""
    text = resources.files(__package__).joinpath("catalogue.json").read_text()
    out = []
    for entry in json.loads(text):
        entry = dict(entry)
        for key in ("args", "presets", "requires"):
            entry[key] = tuple(entry.get(key, ()))
        for key in ("launch", "launch_fixed"):
            entry[key] = dict(entry.get(key) or {})
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
