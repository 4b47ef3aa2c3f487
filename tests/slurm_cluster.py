"""A real SLURM cluster on this host for the tests: munged, slurmctld and two slurmd daemons
(nodes ``node1`` and ``node2``, both at 127.0.0.1 on ports of their own), from Debian's packages
(``tests/debian_setup.sh slurm``), with a configuration, state and logs in a temporary folder. The
daemons run in the foreground as children of the test process and are stopped at the end."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from rankscope.launch.spec import free_port

NODES = ("node1", "node2")
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "scancel")


class Unavailable(RuntimeError):
    """The cluster cannot start here; the message says why."""


class LocalSlurm:
    def __init__(self, root: Path):
        self.root = root
        self.conf = root / "slurm.conf"
        self.socket = root / "munge.socket"
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def env(self) -> dict[str, str]:
        """What a client needs to reach this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def start(self) -> LocalSlurm:
        missing = [d for d in DAEMONS if shutil.which(d) is None]
        if missing:
            raise Unavailable(f"{', '.join(missing)} not installed (tests/debian_setup.sh slurm)")
        if os.geteuid() != 0:
            raise Unavailable("the test cluster's daemons run as root here; not root")
        key = Path("/etc/munge/munge.key")
        if not key.is_file():
            raise Unavailable(f"no munge key at {key} (Debian's munge package makes one)")
        for sub in ("state", "spool", "logs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._write_conf()
        self._spawn(
            "munged",
            "--foreground",
            "--force",
            f"--socket={self.socket}",
            f"--key-file={key}",
            f"--pid-file={self.root / 'munged.pid'}",
            f"--log-file={self.root / 'logs' / 'munged.log'}",
            f"--seed-file={self.root / 'munge.seed'}",
        )
        self._wait_for(self.socket.exists, "munged's socket")
        self._spawn("slurmctld", "-D", "-i", "-f", str(self.conf))
        for node in NODES:
            self._spawn("slurmd", "-D", "-N", node, "-f", str(self.conf))
        self._wait_for(self._nodes_idle, "both nodes idle in sinfo", timeout=30)
        return self

    def stop(self) -> None:
        # Jobs first (their steps are the slurmds' children), then the daemons.
        subprocess.run(
            ["scancel", "--user=root"],
            env={**os.environ, **self.env},
            check=False,
            capture_output=True,
            timeout=20,
        )
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def squeue(self) -> list[str]:
        out = subprocess.run(
            ["squeue", "-h", "-o", "%i %T"],
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=20,
        )
        return out.stdout.split("\n")[:-1]

    def scontrol(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["scontrol", *args],
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=20,
        )

    def resume(self, node: str, timeout: float = 30.0) -> None:
        """Bring a node that a test set DOWN back: a responding slurmd returns to service by
        itself (ReturnToService=2), else RESUME it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._nodes_idle():
                return
            self.scontrol("update", f"NodeName={node}", "State=RESUME")
            time.sleep(0.5)
        raise AssertionError(f"{node} did not return to service in {timeout:g} s")

    def _spawn(self, *argv: str) -> None:
        log = open(self.root / "logs" / f"{argv[0]}-{len(self.procs)}.out", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **self.env},
        )
        log.close()
        self.procs.append(proc)
        time.sleep(0.2)
        if proc.poll() is not None:
            self.stop()
            text = (self.root / "logs" / f"{argv[0]}-{len(self.procs) - 1}.out").read_text()
            raise Unavailable(f"{argv[0]} exited at once: {text.strip()[-500:]}")

    def _nodes_idle(self) -> bool:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"],
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=20,
        )
        states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
        return all(states.get(n) == "idle" for n in NODES)

    def _wait_for(self, ready, what: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.2)
        logs = "\n".join(
            f"{p.name}: {p.read_text(errors='replace')[-400:]}"
            for p in sorted((self.root / "logs").glob("*"))
        )
        self.stop()
        raise Unavailable(f"{what} not ready after {timeout:g} s\n{logs}")

    def _write_conf(self) -> None:
        root = self.root
        ctld = free_port()
        lines = [
            "ClusterName=rankscope-test",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={ctld}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={root / 'state'}",
            f"SlurmdSpoolDir={root / 'spool'}/%n",
            f"SlurmctldPidFile={root / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / 'slurmd'}-%n.pid",
            f"SlurmctldLogFile={root / 'logs' / 'slurmctld.log'}",
            f"SlurmdLogFile={root / 'logs' / 'slurmd'}-%n.log",
            # The settings that run two slurmd on one host (checked with Debian's 22.05).
            "ProctrackType=proctrack/pgid",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SlurmdParameters=config_overrides",
            "MpiDefault=none",
            "ReturnToService=2",
            "InactiveLimit=0",
            "KillWait=5",
            "MinJobAge=300",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
        ]
        for node in NODES:
            lines.append(
                f"NodeName={node} NodeAddr=127.0.0.1 NodeHostname=localhost Port={free_port()} "
                "CPUs=4 RealMemory=4000 State=UNKNOWN"
            )
        lines.append(
            f"PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE "
            "State=UP OverSubscribe=YES"
        )
        self.conf.write_text("\n".join(lines) + "\n")
