"""The launch form: what to run and how, as a :class:`rankscope.launch.JobSpec`."""

from __future__ import annotations

import shlex

import ipywidgets as widgets

from rankscope.launch import DEFAULT_PRESETS, PRESETS, JobSpec
from rankscope.widgets._common import guarded, scenarios

SCRIPT_PATH = "(any script path)"


class LaunchForm(widgets.VBox):
    """A scenario from the catalogue or any script, ranks per node, nodes, backend, debug
    presets, stall timeout, and the Launch button.

    Attributes:
        scenario: the catalogue entry; choosing one fills the other fields with its settings.
        script: the path of the script to run (relative to the kernel's working directory).
        args: the script's arguments, as on a command line.
        fix: add ``--fix`` to the arguments (a scenario's switch that applies the recipe's fix).
        nproc_per_node: ranks per node.
        nnodes: nodes (simulated on this host, or SLURM nodes).
        backend: ``auto``, ``gloo`` or ``nccl``.
        presets: one toggle per debug preset of :data:`rankscope.launch.PRESETS`, by name.
        stall_timeout_s: seconds without progress that count as a stall.
        detached: keep the job running when the kernel stops (re-attach after a restart).
        launcher: ``torchrun`` (this machine) or ``slurm``; with ``slurm``, ``partition``,
            ``time_limit``, ``account`` and ``sbatch_args`` appear.
        launch: the button; the workbench connects it.
        errors: beside the Launch button: what is wrong with the form, until the next try.
    """

    def __init__(self) -> None:
        self.errors = widgets.Output()
        self._scenarios = {s.id: s for s in scenarios()}
        self.scenario = widgets.Dropdown(
            options=[
                (SCRIPT_PATH, ""),
                *((f"{s.id}: {s.title}", s.id) for s in self._scenarios.values()),
            ],
            description="scenario",
            # wide enough for a scenario's title, a path's whole name
            layout=widgets.Layout(width="min(100%, 44em)"),
        )
        self.script = widgets.Text(
            placeholder="path/to/train.py",
            description="script",
            layout=widgets.Layout(width="min(100%, 44em)"),
        )
        self.args = widgets.Text(
            placeholder="--lr 0.1", description="args", layout=widgets.Layout(width="22em")
        )
        self.fix = widgets.Checkbox(value=False, description="with --fix", indent=False)
        self.nproc_per_node = widgets.BoundedIntText(
            value=2, min=1, max=256, description="ranks/node"
        )
        self.nnodes = widgets.BoundedIntText(value=1, min=1, max=16, description="nodes")
        self.backend = widgets.Dropdown(options=["auto", "gloo", "nccl"], description="backend")
        self.presets = {
            name: widgets.ToggleButton(
                value=name in DEFAULT_PRESETS, description=name, tooltip=preset.doc
            )
            for name, preset in PRESETS.items()
        }
        self.stall_timeout_s = widgets.BoundedFloatText(
            value=JobSpec.stall_timeout_s, min=0.1, max=86400, description="stall after s"
        )
        self.launcher = widgets.Dropdown(
            options=[("this machine (torchrun)", "torchrun"), ("SLURM cluster", "slurm")],
            description="run on",
        )
        narrow = {"layout": widgets.Layout(width="230px")}
        self.partition = widgets.Text(
            placeholder="cluster default", description="partition", **narrow
        )
        self.time_limit = widgets.Text(placeholder="10:00", description="time limit", **narrow)
        self.account = widgets.Text(placeholder="(none)", description="account", **narrow)
        self.sbatch_args = widgets.Text(
            placeholder="--qos=debug --mem=8G",
            description="sbatch args",
            layout=widgets.Layout(width="340px"),
        )
        self.slurm_box = widgets.HBox(
            [self.partition, self.time_limit, self.account, self.sbatch_args],
            layout=widgets.Layout(display="none", flex_flow="row wrap"),
        )
        self.launcher.observe(self._show_slurm, names="value")
        self.detached = widgets.Checkbox(
            value=False, description="survive kernel restart", indent=False
        )
        self.launch = widgets.Button(description="Launch", button_style="primary", icon="play")
        self.scenario.observe(
            lambda change: guarded(self.errors, self.use_scenario)(change["new"]), names="value"
        )
        super().__init__(
            [
                self.scenario,
                widgets.HBox(
                    [self.script, self.args, self.fix], layout=widgets.Layout(flex_flow="row wrap")
                ),
                widgets.HBox(
                    [self.nproc_per_node, self.nnodes, self.backend, self.stall_timeout_s]
                ),
                widgets.HBox(
                    [
                        widgets.Label(
                            "debug presets", layout={"flex": "0 0 auto", "width": "auto"}
                        ),
                        *self.presets.values(),
                        self.detached,
                    ]
                ),
                self.launcher,
                self.slurm_box,
                widgets.HBox([self.launch, self.errors]),
            ]
        )

    def _show_slurm(self, change: dict[str, object]) -> None:
        self.slurm_box.layout.display = "flex" if change["new"] == "slurm" else "none"

    def use_scenario(self, scenario_id: str) -> None:
        """Fill the form with a catalogue scenario's settings (nothing for ``""``)."""
        if not scenario_id:
            return
        scenario = self._scenarios[scenario_id]
        self.script.value = str(scenario.path)
        self.args.value = shlex.join(scenario.args)
        self.nproc_per_node.value = scenario.nproc_per_node
        self.nnodes.value = scenario.nnodes
        self.stall_timeout_s.value = scenario.stall_timeout_s
        for name, toggle in self.presets.items():
            toggle.value = name in DEFAULT_PRESETS or name in scenario.presets

    def spec(self) -> JobSpec:
        """The job the form describes.

        Raises:
            ValueError: no script, or a value :class:`JobSpec` refuses (the message says which).
        """
        script = self.script.value.strip()
        if not script:
            raise ValueError("choose a scenario or enter the path of a script to run")
        fix = self.fix.value
        launch: dict[str, object] = {}
        scenario = self._scenarios.get(self.scenario.value)
        if scenario is not None and script == str(scenario.path):
            # A scenario's own launch (another launcher, a fixed port; the fix may live there)
            launch = dict(scenario.launch_fixed if fix else scenario.launch)
            fix = fix and scenario.fix_flag
        settings: dict[str, object] = {
            "script": script,
            "args": [*shlex.split(self.args.value), *(["--fix"] if fix else [])],
            "nproc_per_node": self.nproc_per_node.value,
            "nnodes": self.nnodes.value,
            "backend": self.backend.value,
            "presets": [name for name, toggle in self.presets.items() if toggle.value],
            "stall_timeout_s": self.stall_timeout_s.value,
        }
        if self.launcher.value == "slurm":
            if launch:
                raise ValueError(
                    "this scenario is launched its own way on this machine (another launcher "
                    "or a fixed port): run it here, or enter a script path to run on SLURM"
                )
            options = {
                "partition": self.partition.value.strip() or None,
                "time": self.time_limit.value.strip() or None,
                "account": self.account.value.strip() or None,
                "sbatch_args": shlex.split(self.sbatch_args.value),
            }
            settings["launcher"] = "slurm"
            settings["slurm"] = {k: v for k, v in options.items() if v}
        return JobSpec(**{**settings, **launch})  # type: ignore[arg-type]
