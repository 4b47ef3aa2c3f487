"""What to run: :class:`JobSpec`, the debug presets, and the launchers' command lines.

Four launchers start the ranks; each one runs ``python -m rankscope.probe.bootstrap`` in every
process, so the probe records the same events whatever started it:

- ``torchrun`` (the default): one torchrun agent (``python -m rankscope.torchrun``, torchrun with
  torch imported settled) per (simulated) node.
- ``python``: the bare interpreter, one process, no torch.distributed environment at all, as
  ``python train.py`` typed in a shell (recipe D1).
- ``accelerate``: ``accelerate launch`` with a config file written into the run directory
  (recipe D5); it hands multi-process jobs to torch's elastic launcher.
- ``deepspeed``: DeepSpeed's own launcher, with an optional hostfile (recipe D6).
- ``slurm``: a batch job on a SLURM cluster, one torchrun per node under ``srun``
  (:mod:`rankscope.launch.slurm`).
"""

from __future__ import annotations

import contextvars
import dataclasses
import importlib.util
import json
import os
import random
import socket
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rankscope.launch import slurm as _slurm
from rankscope.rundir import ACCELERATE_CONFIG, DEEPSPEED_HOSTFILE

Backend = Literal["auto", "gloo", "nccl"]
OnStall = Literal["keep", "stop"]
Launcher = Literal["torchrun", "python", "accelerate", "deepspeed", "slurm"]
LAUNCHERS: tuple[str, ...] = ("torchrun", "python", "accelerate", "deepspeed", "slurm")


@dataclass(frozen=True)
class Preset:
    """A named set of environment variables that a user toggles on (``env``) or off (``off``)."""

    doc: str
    env: Mapping[str, str]
    off: Mapping[str, str] = field(default_factory=dict)


#: Debug presets by name. ``flight_recorder`` is on unless switched off.
PRESETS: dict[str, Preset] = {
    "flight_recorder": Preset(
        doc="torch's flight recorder keeps the last 2000 collectives of every rank (gloo and "
        "nccl); the probe dumps it on request, on an exception and at exit. Off sets the "
        "buffer to 0, as in a job launched without rankscope.",
        env={"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"},
        off={"TORCH_FR_BUFFER_SIZE": "0", "TORCH_NCCL_TRACE_BUFFER_SIZE": "0"},
    ),
    "detail": Preset(
        doc="TORCH_DISTRIBUTED_DEBUG=DETAIL with C++ INFO logging: every collective is checked "
        "against the other ranks first (op, sequence number, shapes, dtypes), so a mismatch "
        "fails at once with 'Detected mismatch between collectives' instead of hanging. It "
        "runs extra collectives, so it slows the job and can change timing.",
        env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL", "TORCH_CPP_LOG_LEVEL": "INFO"},
    ),
    "nccl_debug": Preset(
        doc="NCCL_DEBUG=INFO for communicator set-up, bootstrap, environment and network; each "
        "rank's output goes to ranks/<rank>/nccl.log in the run directory. No effect on gloo.",
        env={"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,BOOTSTRAP,ENV,NET"},
    ),
    "async_errors": Preset(
        doc="TORCH_NCCL_ASYNC_ERROR_HANDLING=1 and dump-on-timeout: when an nccl collective "
        "times out or a peer dies, the process group is torn down promptly and the flight "
        "recorder is dumped, instead of ranks waiting out the timeout. torchrun sets 1 unless "
        "told otherwise; off sets 0 to show the difference. No effect on gloo.",
        env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"},
        off={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"},
    ),
}
DEFAULT_PRESETS = ("flight_recorder",)


#: Set while a spec is read back from a run directory (:meth:`JobSpec.from_dict`).
_RECORDED: contextvars.ContextVar[bool] = contextvars.ContextVar("recorded", default=False)


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """A small distributed job.

    Exactly one of ``script`` and ``module`` is given; ``args`` follow it on the command line.
    ``launcher`` picks what starts the ranks (see the module's docstring); the default,
    ``torchrun``, is what every other part of rankscope assumes unless told otherwise.
    """

    script: str | None = None
    module: str | None = None
    args: Sequence[str] = ()
    nproc_per_node: int = 2
    nnodes: int = 1
    """1, or more simulated on this host: one torchrun agent per node joined by c10d rendezvous."""
    backend: Backend = "auto"
    """Passed to the ranks as RANKSCOPE_BACKEND; ``auto`` is nccl when every rank gets a GPU."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment for every rank; a value that overrides the caller's own is recorded."""
    presets: Sequence[str] = DEFAULT_PRESETS
    collective_timeout_s: float | None = None
    """Default timeout for init_process_group when the script passes none (torch's otherwise)."""
    stall_timeout_s: float = 3.0
    """No progress for this long, with a rank waiting in a collective, is a stall. Counted once
    every rank has started; raise it for jobs that pause longer between collectives (a
    checkpoint written by one rank, evaluation on rank 0)."""
    startup_timeout_s: float = 60.0
    """Some rank not started after this long is a stall too (a launch or rendezvous hang)."""
    on_stall: OnStall = "keep"
    """What a stall does to the job once its evidence is captured: ``keep`` it running, or
    ``stop`` it. A ``busy`` stall (a rank running code outside the collectives while the others
    wait) is never stopped for: the rank may yet come. It is stopped once that stall becomes
    ``no_progress``, after ten stall timeouts (see "What counts as a stall" in the README)."""
    timeout_s: float | None = None
    """Hard limit for the whole job; it is stopped after this many seconds."""
    name: str | None = None
    cwd: str | None = None
    launcher: Launcher = "torchrun"
    """``torchrun``, ``python`` (one bare process: nproc_per_node=1, nnodes=1), ``accelerate``
    or ``deepspeed`` (both with nnodes=1), or ``slurm`` (``nnodes`` SLURM nodes)."""
    master_port: int | None = None
    """The rendezvous port (torchrun's --master-port, or the c10d endpoint's port with several
    nodes; accelerate's main_process_port; deepspeed's --master_port). None: a port that is
    free now, picked for this job, so that jobs on one host never collide (recipe D4); under
    SLURM, 20000 + the job id modulo 20000 on the first node."""
    slurm: Mapping[str, Any] = field(default_factory=dict)
    """launcher='slurm' only: ``partition``, ``time``, ``account`` and ``sbatch_args`` (see
    :data:`rankscope.launch.slurm.OPTIONS`)."""
    launcher_args: Sequence[str] = ()
    """Extra arguments for the launcher on every node, after rankscope's own (argparse keeps
    the last value of an option given twice, so these win) and before the script."""
    launcher_args_by_node: Sequence[Sequence[str]] = ()
    """Extra launcher arguments per simulated node (index = node), after ``launcher_args``:
    how one node's command line comes to differ from the others' (recipe D2)."""
    hostfile: str | None = None
    """deepspeed only: the text of the hostfile (one ``<host> slots=<n>`` line per node), written
    to the run directory and passed with --hostfile; its slots then set the number of processes
    (keep nproc_per_node equal to them). None: no hostfile, --num_gpus=nproc_per_node."""

    def __post_init__(self) -> None:
        if (self.script is None) == (self.module is None):
            raise ValueError("JobSpec needs exactly one of script= or module=")
        if self.script is not None and not _RECORDED.get():
            path = Path(self.cwd or ".", self.script)
            if not path.is_file():
                raise ValueError(f"script {str(path)!r} does not exist or is not a file")
        if isinstance(self.args, str):
            raise ValueError("args must be a list of strings, not one string")
        object.__setattr__(self, "args", tuple(str(a) for a in self.args))
        object.__setattr__(self, "presets", tuple(self.presets))
        object.__setattr__(self, "env", dict(self.env))
        if self.nproc_per_node < 1:
            raise ValueError(f"nproc_per_node must be at least 1, got {self.nproc_per_node}")
        if self.nnodes < 1:
            raise ValueError(f"nnodes must be at least 1, got {self.nnodes}")
        if self.backend not in ("auto", "gloo", "nccl"):
            raise ValueError(f"backend must be auto, gloo or nccl, got {self.backend!r}")
        unknown = [p for p in self.presets if p not in PRESETS]
        if unknown:
            raise ValueError(f"unknown preset(s) {unknown}; known: {sorted(PRESETS)}")
        if self.on_stall not in ("keep", "stop"):
            raise ValueError(f"on_stall must be 'keep' or 'stop', got {self.on_stall!r}")
        for name in ("stall_timeout_s", "startup_timeout_s", "timeout_s", "collective_timeout_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        self._validate_launch()

    def _validate_launch(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise ValueError(
                f"launcher must be one of {', '.join(LAUNCHERS)}, got {self.launcher!r}"
            )
        port = self.master_port
        if port is not None and (
            isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535
        ):
            raise ValueError(
                f"master_port must be a TCP port number (1-65535) or None for a free port, "
                f"got {port!r}"
            )
        object.__setattr__(self, "launcher_args", _strings("launcher_args", self.launcher_args))
        by_node = self.launcher_args_by_node
        if isinstance(by_node, str):
            raise ValueError("launcher_args_by_node must be one list of arguments per node")
        by_node = tuple(_strings(f"launcher_args_by_node[{i}]", a) for i, a in enumerate(by_node))
        if len(by_node) > self.nnodes:
            raise ValueError(
                f"launcher_args_by_node has {len(by_node)} entries for {self.nnodes} node(s); "
                "give at most one list of arguments per node"
            )
        object.__setattr__(self, "launcher_args_by_node", by_node)
        if self.slurm and self.launcher != "slurm":
            raise ValueError(
                f"slurm options are for launcher='slurm', not {self.launcher!r}; leave slurm "
                "empty or set launcher='slurm'"
            )
        object.__setattr__(self, "slurm", _slurm.check_options(self.slurm))
        if self.launcher == "slurm" and by_node:
            raise ValueError(
                "launcher_args_by_node simulates nodes that differ on one host; SLURM starts "
                "the same command on every node: use launcher_args"
            )
        if self.launcher == "python":
            if self.nproc_per_node != 1 or self.nnodes != 1:
                raise ValueError(
                    "launcher='python' starts one plain process, as `python train.py` does; set "
                    f"nproc_per_node=1 and nnodes=1 (got {self.nproc_per_node} and "
                    f"{self.nnodes}), or use launcher='torchrun' for several ranks"
                )
            if self.master_port is not None:
                raise ValueError(
                    "launcher='python' sets no MASTER_PORT (it sets no torch.distributed "
                    "variable at all); leave master_port=None, or put MASTER_PORT in env="
                )
        elif self.launcher in ("accelerate", "deepspeed") and self.nnodes != 1:
            raise ValueError(
                f"launcher={self.launcher!r} runs on one node here (nnodes=1, got "
                f"{self.nnodes}); simulated nodes are torchrun agents joined by c10d "
                "rendezvous, so use launcher='torchrun' for nnodes > 1"
            )
        if self.hostfile is not None:
            if self.launcher != "deepspeed":
                raise ValueError(
                    f"hostfile is read by DeepSpeed's launcher only, not by {self.launcher!r}; "
                    "use launcher='deepspeed' or leave hostfile=None"
                )
            if not isinstance(self.hostfile, str):
                raise ValueError(
                    "hostfile must be the text of the hostfile (lines like 'localhost slots=2'), "
                    f"not {type(self.hostfile).__name__}"
                )

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def target(self) -> str:
        return self.script if self.script is not None else f"-m {self.module}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, recorded: bool = False) -> JobSpec:
        """The spec from :meth:`to_dict`'s dict. ``recorded``: a run directory's, read on a
        machine where its script may not be (a run copied from a cluster): not checked."""
        known = {f.name for f in dataclasses.fields(cls)}
        token = _RECORDED.set(recorded)
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        finally:
            _RECORDED.reset(token)

    def check_launcher_installed(self) -> None:
        """Raise ValueError, saying what to install, if the launcher's package is missing here."""
        if self.launcher == "slurm":
            _slurm.require_slurm()
            return
        package = {"accelerate": "accelerate", "deepspeed": "deepspeed"}.get(self.launcher)
        if package is not None and importlib.util.find_spec(package) is None:
            raise ValueError(
                f"launcher={self.launcher!r} needs the {package} package, which is not "
                f"installed in this environment; install it (pip install "
                f"'rankscope[deepspeed]' brings accelerate and deepspeed) or use "
                "launcher='torchrun'"
            )

    def resolve_backend(self) -> str:
        """The backend the ranks will use; nccl only when there is a GPU for every local rank."""
        if self.backend == "gloo":
            return "gloo"
        gpus = _gpu_count()
        if self.backend == "nccl" and gpus < self.nproc_per_node:
            raise ValueError(
                f"backend 'nccl' needs {self.nproc_per_node} GPUs per node, {gpus} visible; "
                "use backend='gloo' (or 'auto') on this machine"
            )
        return "nccl" if gpus >= self.nproc_per_node else "gloo"

    def rank_env(self, run_dir: str | os.PathLike[str], backend: str) -> dict[str, str]:
        """Environment that the job adds on top of the caller's: presets, then ``env``."""
        env: dict[str, str] = {}
        for name, preset in PRESETS.items():
            env.update(preset.env if name in self.presets else preset.off)
        env.update(self.env)
        env["RANKSCOPE_RUN_DIR"] = str(run_dir)
        env["RANKSCOPE_BACKEND"] = backend
        env["PYTHONUNBUFFERED"] = "1"
        if self.collective_timeout_s is not None:
            env["RANKSCOPE_COLLECTIVE_TIMEOUT"] = str(self.collective_timeout_s)
        return env


#: Device nodes of a GPU driver (NVIDIA's, and ROCm's that torch.cuda also drives): without
#: any, there is no GPU, and importing torch to count none (seconds of CPU) is skipped.
_GPU_NODES = ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/kfd")


def _gpu_count() -> int:
    if "torch" not in sys.modules and not any(os.path.exists(p) for p in _GPU_NODES):
        return 0
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


_port_lock = threading.Lock()
_ports_given: set[int] = set()
#: Where free ports are looked for: below the kernel's ephemeral range, which every outgoing
#: connection draws its own port from (the ranks' gloo pairs, the store's clients, another
#: job's): a port found free there can be taken by one of those in the seconds before
#: torchrun binds it. Ports found busy are passed over.
PORT_FLOOR = 20000


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default where it is not known)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free now, not handed out before by this process, and outside the
    kernel's ephemeral range where it can (:data:`PORT_FLOOR`)."""
    low = _ephemeral_low()
    choose = random.SystemRandom()
    with _port_lock:
        for attempt in range(200):
            wanted = choose.randrange(PORT_FLOOR, low) if low > PORT_FLOOR + 1000 else 0
            if attempt >= 150:  # a range that is full: any port the kernel gives
                wanted = 0
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, wanted))
                except OSError:
                    continue
                port = s.getsockname()[1]
            if port not in _ports_given:
                _ports_given.add(port)
                return port
    raise RuntimeError(f"no free TCP port found on {host}")


def _strings(name: str, values: Any) -> tuple[str, ...]:
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise ValueError(f"{name} must be a list of strings, not {type(values).__name__}")
    return tuple(str(v) for v in values)


def _user_target(spec: JobSpec) -> list[str]:
    """The script (or ``-m module``) and its arguments, as the bootstrap takes them."""
    target = [spec.script] if spec.script is not None else ["-m", spec.module]
    return [*target, *spec.args]  # type: ignore[list-item]


def _node_args(spec: JobSpec, node: int) -> list[str]:
    extra = list(spec.launcher_args)
    if node < len(spec.launcher_args_by_node):
        extra += spec.launcher_args_by_node[node]
    return extra


def launch_commands(
    spec: JobSpec, *, run_dir: Path, port: int | None, run_id: str
) -> list[list[str]]:
    """The command line of every (simulated) node for the spec's launcher.

    Files that the command names (accelerate's config, DeepSpeed's hostfile) are those of
    :func:`launch_files`, to be written into ``run_dir`` first. ``port`` is None only for the
    ``python`` launcher.
    """
    if spec.launcher == "python":
        return [[sys.executable, "-m", "rankscope.probe.bootstrap", *_user_target(spec)]]
    if spec.launcher == "slurm":
        extra = spec.slurm.get("sbatch_args", ())
        return [["sbatch", "--parsable", *extra, str(run_dir / _slurm.BATCH_SCRIPT)]]
    if port is None:
        raise ValueError(f"launcher {spec.launcher!r} needs a port")
    if spec.launcher == "accelerate":
        return [_accelerate_command(spec, run_dir=run_dir)]
    if spec.launcher == "deepspeed":
        return [_deepspeed_command(spec, run_dir=run_dir, port=port)]
    return torchrun_commands(spec, run_dir=run_dir, port=port, run_id=run_id)


def launch_files(spec: JobSpec, *, port: int | None, run_dir: Path, run_id: str) -> dict[str, str]:
    """Files the launcher reads, by name in the run directory, with their text."""
    if spec.launcher == "slurm":
        script = _slurm.batch_script(
            run_dir=run_dir,
            run_id=run_id,
            nnodes=spec.nnodes,
            nproc_per_node=spec.nproc_per_node,
            options=spec.slurm,
            port=port,
            torchrun_args=spec.launcher_args,
            target=_user_target(spec),
        )
        return {_slurm.BATCH_SCRIPT: script}
    if spec.launcher == "accelerate":
        return {ACCELERATE_CONFIG: accelerate_config(spec, port=port)}
    if spec.launcher == "deepspeed" and spec.hostfile is not None:
        text = spec.hostfile if spec.hostfile.endswith("\n") else spec.hostfile + "\n"
        return {DEEPSPEED_HOSTFILE: text}
    return {}


def accelerate_config(spec: JobSpec, *, port: int | None) -> str:
    """The ``accelerate launch`` config for this spec, as YAML.

    Written by rankscope for every accelerate job so that a default config in the user's
    home (``accelerate config``) cannot change what runs. ``distributed_type: MULTI_GPU`` is
    accelerate's name for "start the processes with torch.distributed.run"; it is the one
    type that starts several processes on one host without mpirun, GPUs or not (``--cpu``
    and ``MULTI_CPU`` expect mpirun; without it accelerate starts one plain process).
    """
    several = spec.world_size > 1
    settings: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "MULTI_GPU" if several else "NO",
        "num_processes": spec.world_size,
        "num_machines": 1,
        "machine_rank": 0,
        "main_process_ip": "127.0.0.1",
        "main_process_port": port,
        "rdzv_backend": "static",
        "same_network": True,
        "gpu_ids": "all",
        "mixed_precision": "no",
        "use_cpu": False,
        "debug": False,
        "downcast_bf16": False,
        "enable_cpu_affinity": False,
    }
    # JSON scalars are YAML scalars: no YAML library needed to write the file.
    lines = ["# written by rankscope for this run: what `accelerate launch` read"]
    lines += [f"{key}: {json.dumps(value)}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


def _accelerate_command(spec: JobSpec, *, run_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        f"--config_file={run_dir / ACCELERATE_CONFIG}",
        # torch.distributed.run's settings, as torchrun jobs get them (used on its path only)
        "--max_restarts=0",
        "--monitor_interval=0.1",
        f"--log_dir={run_dir / 'logs' / 'node0'}",
        "--tee=3",
        *_node_args(spec, 0),
        "--module",
        "rankscope.probe.bootstrap",
        *_user_target(spec),
    ]


def _deepspeed_command(spec: JobSpec, *, run_dir: Path, port: int) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "deepspeed.launcher.runner",
        "--master_addr=127.0.0.1",
        f"--master_port={port}",
    ]
    if spec.hostfile is None:
        cmd.append(f"--num_gpus={spec.nproc_per_node}")
    else:
        # One host, no ssh: the launcher reads the hostfile and starts this node's slots.
        cmd += [f"--hostfile={run_dir / DEEPSPEED_HOSTFILE}", "--no_ssh", "--node_rank=0"]
    # DeepSpeed puts --local_rank=N right after the module it runs, where the bootstrap expects
    # the script: the ranks read LOCAL_RANK from the environment instead, as under torchrun.
    cmd.append("--no_local_rank")
    cmd += _node_args(spec, 0)
    return [*cmd, "--module", "rankscope.probe.bootstrap", *_user_target(spec)]


def torchrun_commands(spec: JobSpec, *, run_dir: Path, port: int, run_id: str) -> list[list[str]]:
    """One torchrun command (``python -m rankscope.torchrun``) per (simulated) node."""
    target = ["-m", "rankscope.probe.bootstrap", *_user_target(spec)]
    commands = []
    for node in range(spec.nnodes):
        cmd = [
            sys.executable,
            "-m",
            "rankscope.torchrun",
            f"--nnodes={spec.nnodes}",
            f"--nproc-per-node={spec.nproc_per_node}",
            "--max-restarts=0",
            "--monitor-interval=0.1",
            f"--log-dir={run_dir / 'logs' / f'node{node}'}",
            "--redirects=3",
            "--tee=3",
        ]
        if spec.nnodes == 1:
            cmd += ["--master-addr=127.0.0.1", f"--master-port={port}", f"--rdzv-id={run_id}"]
        else:
            cmd += [
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                f"--rdzv-id={run_id}",
                f"--rdzv-conf=is_host={'true' if node == 0 else 'false'},join_timeout=60",
                "--local-addr=127.0.0.1",
            ]
        commands.append(cmd + _node_args(spec, node) + target)
    return commands
