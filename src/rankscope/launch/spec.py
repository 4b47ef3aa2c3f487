"""What to run: :class:`JobSpec`, the debug presets, and the torchrun command lines."""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Backend = Literal["auto", "gloo", "nccl"]
OnStall = Literal["keep", "stop"]


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


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """A small torchrun job.

    Exactly one of ``script`` and ``module`` is given; ``args`` follow it on the command line.
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
    timeout_s: float | None = None
    """Hard limit for the whole job; it is stopped after this many seconds."""
    name: str | None = None
    cwd: str | None = None

    def __post_init__(self) -> None:
        if (self.script is None) == (self.module is None):
            raise ValueError("JobSpec needs exactly one of script= or module=")
        if self.script is not None:
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

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def target(self) -> str:
        return self.script if self.script is not None else f"-m {self.module}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

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


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


_port_lock = threading.Lock()
_ports_given: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free now and not handed out before by this process."""
    with _port_lock:
        for _ in range(50):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
            if port not in _ports_given:
                _ports_given.add(port)
                return port
    raise RuntimeError("no free TCP port found on the loopback interface")


def torchrun_commands(spec: JobSpec, *, run_dir: Path, port: int, run_id: str) -> list[list[str]]:
    """One ``python -m torch.distributed.run`` command per (simulated) node."""
    target = ["-m", "rankscope.probe.bootstrap"]
    target += [spec.script] if spec.script is not None else ["-m", spec.module]  # type: ignore[list-item]
    target += list(spec.args)
    commands = []
    for node in range(spec.nnodes):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
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
        commands.append(cmd + target)
    return commands
