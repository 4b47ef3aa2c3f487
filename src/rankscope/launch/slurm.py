"""Jobs on a SLURM cluster, through SLURM's own commands.

rankscope talks to the scheduler with the commands every SLURM installation has and every cluster
user already runs: ``sbatch`` submits, ``scontrol show job`` (then ``sacct`` once the controller
has forgotten the job) reports, ``scancel`` ends and ``srun --overlap`` runs a command next to a
rank (py-spy, a signal). No daemon, no port and no Python client of ours: what crosses nodes goes
through SLURM or through the run directory, which must be on a filesystem every node mounts.

The batch script (written into the run directory as ``slurm.sbatch``) runs one ``torchrun`` per
node under ``srun``, joined by c10d rendezvous on the allocation's first node, each rank under
the probe's bootstrap: the run directory fills exactly as for a local job, plus ``slurm-<id>.out``
and one launcher log per node.
"""

from __future__ import annotations

import logging
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: What ``JobSpec.slurm`` may hold.
OPTIONS = {
    "partition": "sbatch --partition (None: the cluster's default partition)",
    "time": "sbatch --time, the job's time limit in SLURM's format ('10:00', '1-00:00:00')",
    "account": "sbatch --account",
    "sbatch_args": "more sbatch options, as a list of strings (['--qos=debug', '--mem=8G'])",
}
COMMANDS = ("sbatch", "scontrol", "scancel", "srun")
BATCH_SCRIPT = "slurm.sbatch"
#: SLURM job states that end a job (scontrol and sacct spell them the same way).
ENDED = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)
CALL_TIMEOUT_S = 20.0


class SlurmError(RuntimeError):
    """A SLURM command failed; the message quotes what it said."""


def check_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``JobSpec.slurm`` validated: known keys, strings where SLURM takes strings."""
    if not isinstance(options, Mapping):
        raise ValueError(f"slurm must be a dict of options, not {type(options).__name__}")
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        known = ", ".join(OPTIONS)
        raise ValueError(f"unknown slurm option(s) {unknown}; known: {known}")
    out = dict(options)
    for key in ("partition", "time", "account"):
        value = out.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ValueError(f"slurm {key!r} must be a non-empty string, got {value!r}")
    if "sbatch_args" in out:
        args = out["sbatch_args"]
        if isinstance(args, str) or not isinstance(args, Sequence):
            raise ValueError("slurm 'sbatch_args' must be a list of strings, one option each")
        out["sbatch_args"] = [str(a) for a in args]
    return out


def missing_commands() -> list[str]:
    return [c for c in COMMANDS if shutil.which(c) is None]


def require_slurm() -> None:
    """Raise ValueError, saying what to do, when SLURM's commands are not on PATH here."""
    missing = missing_commands()
    if missing:
        raise ValueError(
            f"launcher='slurm' needs SLURM's commands on PATH, and {', '.join(missing)} "
            "cannot be found on this machine: run rankscope on a login node of the cluster "
            "(where sbatch works), or use launcher='torchrun' to run on this machine"
        )


def batch_script(
    *,
    run_dir: Path,
    run_id: str,
    nnodes: int,
    nproc_per_node: int,
    options: Mapping[str, Any],
    port: int | None,
    torchrun_args: Sequence[str],
    target: Sequence[str],
) -> str:
    """The sbatch script: one torchrun per node under srun, c10d rendezvous on the first node.

    ``port`` is the rendezvous port (None: 20000 + the job id modulo 20000, so that jobs that
    share a first node rarely collide); ``torchrun_args`` are the user's extra launcher
    arguments; ``target`` is what the bootstrap runs (``script.py args`` or ``-m module``).
    """
    q = shlex.quote
    run = str(run_dir)
    lines = [
        "#!/bin/bash",
        "# written by rankscope: the job it submitted with sbatch",
        f"#SBATCH --job-name={q('rankscope-' + run_id)}",
        f"#SBATCH --nodes={nnodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --output={q(run + '/slurm-%j.out')}",
        "#SBATCH --open-mode=append",
        # A node failure ends the job where rankscope sees it, rather than requeueing it.
        "#SBATCH --no-requeue",
    ]
    for key in ("partition", "time", "account"):
        if options.get(key):
            lines.append(f"#SBATCH --{key}={q(options[key])}")
    torchrun = [
        sys.executable,
        "-m",
        "rankscope.torchrun",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        "--max-restarts=0",
        "--monitor-interval=0.1",
        "--rdzv-backend=c10d",
        f"--rdzv-id={run_id}",
        "--redirects=3",
        "--tee=3",
        *torchrun_args,
        "-m",
        "rankscope.probe.bootstrap",
        *target,
    ]
    # Each node's torchrun gets the endpoint and a log directory of its own, which only the
    # shell on that node knows ($SLURM_NODEID): the first three words are python -m
    # rankscope.torchrun, the node's own options follow them.
    per_node = (
        'exec "${@:1:3}" --rdzv-endpoint="$RANKSCOPE_RDZV_ENDPOINT" '
        f'--log-dir={q(run)}/logs/node"$SLURM_NODEID" "${{@:4}}"'
    )
    lines += [
        "set -u",
        "# The rendezvous is hosted by torchrun on the node this script runs on (the first).",
        'rdzv_host="${RANKSCOPE_RDZV_HOST:-$(hostname)}"',
        f"rdzv_port={port}" if port else "rdzv_port=$((20000 + SLURM_JOB_ID % 20000))",
        'export RANKSCOPE_RDZV_ENDPOINT="${rdzv_host}:${rdzv_port}"',
        'echo "rankscope: rendezvous at $RANKSCOPE_RDZV_ENDPOINT, nodes $SLURM_JOB_NODELIST"',
        "exec srun --kill-on-bad-exit=1 --unbuffered "
        f"--output={q(run + '/launcher.node%n.log')} bash -c {q(per_node)} bash "
        + shlex.join(torchrun),
    ]
    return "\n".join(lines) + "\n"


def submit(script: Path, *, options: Mapping[str, Any], env: Mapping[str, str], cwd: str) -> str:
    """``sbatch --parsable`` the script; return the job id or raise SlurmError with sbatch's
    own words (an unknown partition, a time limit over the partition's, a bad option)."""
    cmd = ["sbatch", "--parsable", *options.get("sbatch_args", ()), str(script)]
    proc = _call(cmd, env=env, cwd=cwd)
    if proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip() or f"exit code {proc.returncode}"
        raise SlurmError(f"sbatch rejected the job: {said}")
    job_id = proc.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch answered {proc.stdout.strip()!r}, not a job id")
    return job_id


@dataclass(frozen=True)
class JobState:
    """What SLURM says of a job now."""

    state: str
    """PENDING, RUNNING, COMPLETING, COMPLETED, FAILED, CANCELLED, NODE_FAIL, ... or UNKNOWN."""
    reason: str | None = None
    """Why it waits (Priority, Resources, BeginTime, ...) or ended as it did."""
    nodes: str | None = None
    exit_code: int | None = None
    signal: int | None = None

    @property
    def ended(self) -> bool:
        return self.state in ENDED


def job_state(job_id: str) -> JobState:
    """Ask ``scontrol show job``; once the controller has purged the job, ``sacct``."""
    proc = _call(["scontrol", "show", "job", "-o", job_id])
    if proc.returncode == 0 and proc.stdout.strip():
        fields = dict(re.findall(r"(\w+)=(\S*)", proc.stdout))
        code, sig = _exit_code(fields.get("ExitCode"))
        reason = fields.get("Reason")
        return JobState(
            state=fields.get("JobState", "UNKNOWN").split()[0],
            reason=None if reason in (None, "None", "(null)") else reason,
            nodes=None if fields.get("NodeList") in (None, "(null)", "") else fields["NodeList"],
            exit_code=code,
            signal=sig,
        )
    if shutil.which("sacct"):
        acct = _call(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State,ExitCode,NodeList"])
        row = acct.stdout.strip().splitlines()
        if acct.returncode == 0 and row:
            state, code_text, nodes = [*row[0].split("|"), "", ""][:3]
            code, sig = _exit_code(code_text)
            return JobState(state=state.split()[0], nodes=nodes or None, exit_code=code, signal=sig)
    return JobState(state="UNKNOWN", reason=(proc.stderr or "").strip() or None)


#: Node states (``scontrol show node``'s ``State``, flags after ``+``) that mean the node is lost.
LOST_NODE_STATES = frozenset({"DOWN", "FAIL", "FAILING", "NOT_RESPONDING", "POWERED_DOWN"})


def down_nodes(nodes: str) -> dict[str, str]:
    """The nodes of ``nodes`` (a SLURM host list, ``node[1-2]``) that SLURM holds lost now
    (down, failed, not responding), each with the reason SLURM gives (``Reason=``, else its
    state): what a job that ended ``NODE_FAIL`` lost."""
    proc = _call(["scontrol", "show", "node", "-o", nodes])
    if proc.returncode != 0:
        log.warning("scontrol show node %s: %s", nodes, (proc.stderr or proc.stdout).strip())
        return {}
    lost = {}
    for line in proc.stdout.splitlines():
        name = re.search(r"\bNodeName=(\S+)", line)
        state = re.search(r"\bState=(\S+)", line)
        if name is None or state is None:
            continue
        flags = set(re.split(r"[+*]", state.group(1).upper()))
        if not flags & LOST_NODE_STATES:
            continue
        # The reason runs to its stamp ("[root@2024-05-01T10:00:00]") or to the next field.
        why = re.search(r"\bReason=(.*?)(?:\s+\[[^\]]*\])?(?=\s+\w+=|\s*$)", line)
        reason = why.group(1).strip() if why else ""
        lost[name.group(1)] = reason if reason and reason != "(null)" else state.group(1)
    return lost


_NODE_FAILURE = re.compile(r"^srun: error: Node failure on (\S+)\s*$", re.MULTILINE)


def failed_nodes_in(text: str) -> list[str]:
    """The nodes srun reported lost in a job's output, as in
    ``srun: error: Node failure on node2``: what says which node failed after SLURM has
    already put it back in service."""
    return sorted(set(_NODE_FAILURE.findall(text)))


def cancel(job_id: str) -> None:
    """``scancel``: SLURM signals every step on every node (SIGTERM, SIGKILL after KillWait)."""
    proc = _call(["scancel", job_id])
    if proc.returncode != 0:
        log.warning("scancel %s: %s", job_id, (proc.stderr or proc.stdout).strip())


def next_to(job_id: str, node: str, argv: Sequence[str]) -> list[str]:
    """A command line that runs ``argv`` on ``node`` inside the job's allocation, beside its
    ranks (``srun --overlap``: no resources taken from them)."""
    return [
        "srun",
        "--overlap",
        f"--jobid={job_id}",
        f"--nodelist={node}",
        "--nodes=1",
        "--ntasks=1",
        "--quiet",
        *argv,
    ]


def _exit_code(text: str | None) -> tuple[int | None, int | None]:
    m = re.fullmatch(r"(\d+):(\d+)", (text or "").strip())
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def _call(
    cmd: list[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=CALL_TIMEOUT_S,
            env=None if env is None else dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise SlurmError(
            f"{cmd[0]} did not answer within {CALL_TIMEOUT_S:g} s: is slurmctld reachable?"
        ) from exc
    except OSError as exc:
        raise SlurmError(f"could not run {cmd[0]}: {exc}") from exc
