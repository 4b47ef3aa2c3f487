"""Regenerate the run-directory fixtures under tests/data/ from real gloo jobs.

Each scenario runs its ``worker.py`` (or another scenario's, where they share one) with :class:`rankscope.launch.Job` (torchrun, the probe, the
stall watchdog), then copies the run directory to ``tests/data/<scenario>/run/`` with every
absolute path of this machine rewritten to a neutral placeholder (``/home/user/...``), so the
fixtures carry nothing of the machine they were made on. Pickles are rewritten through the
restricted unpickler. Run from the repository root::

    python tests/data/_regen/regenerate.py                 # every scenario
    python tests/data/_regen/regenerate.py gloo_clean ...  # some

The texts of two failures that need no job (plain ``python``) are regenerated the same way into
``tests/data/foreign_slurm/``: see ``plain_errors.py``.
"""

from __future__ import annotations

import pickle
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from rankscope.collect.safe_pickle import loads
from rankscope.launch import Job, JobSpec

DATA = Path(__file__).resolve().parent.parent
REPO = DATA.parent.parent

#: scenario -> JobSpec arguments (besides the script).
SCENARIOS: dict[str, dict[str, Any]] = {
    "gloo_clean": {"nproc_per_node": 2},
    "gloo_barrier_hang": {"nproc_per_node": 2, "nnodes": 2, "on_stall": "stop"},
    "gloo_detail_mismatch": {"nproc_per_node": 2, "presets": ("flight_recorder", "detail")},
    "gloo_rank_raises": {"nproc_per_node": 2},
    # The same mismatch as gloo_detail_mismatch, without DETAIL: it waits out gloo's timeout.
    "gloo_timeout": {
        "script": "gloo_detail_mismatch/worker.py",
        "nproc_per_node": 2,
        "collective_timeout_s": 3,
        "stall_timeout_s": 30,
    },
    "ddp_unused": {"nproc_per_node": 2},
    "monitored_barrier": {"nproc_per_node": 2},
}


def placeholders(run_dir: Path, scenario_dir: Path) -> list[tuple[str, str]]:
    """(this machine's path, placeholder) pairs, longest first so nested paths map cleanly."""
    pairs = {
        str(run_dir): f"/home/user/runs/{run_dir.name}",
        str(scenario_dir): "/home/user/project",
        str(REPO / "src"): "/home/user/rankscope/src",
        sys.prefix: "/home/user/venv",
        sys.base_prefix: "/usr/local",
        sysconfig.get_paths()["stdlib"]: "/usr/local/lib/python3.11",
        str(REPO): "/home/user/rankscope",
        tempfile.gettempdir(): "/home/user/tmp",
    }
    return sorted(pairs.items(), key=lambda kv: -len(kv[0]))


def rewrite(value: Any, pairs: list[tuple[str, str]]) -> Any:
    if isinstance(value, str):
        for old, new in pairs:
            value = value.replace(old, new)
        return value
    if isinstance(value, dict):
        return {rewrite(k, pairs): rewrite(v, pairs) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(rewrite(v, pairs) for v in value)
    return value


def copy_sanitised(src: Path, dst: Path, pairs: list[tuple[str, str]]) -> None:
    if dst.exists():
        shutil.rmtree(dst)
    for path in sorted(src.rglob("*")):
        if not path.is_file() or path.name.startswith("."):
            continue
        rel = path.relative_to(src)
        out = dst / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        data = path.read_bytes()
        if path.suffix == ".pkl":
            data = pickle.dumps(rewrite(loads(data), pairs), protocol=2)
        else:
            for old, new in pairs:
                data = data.replace(old.encode(), new.encode())
        for bad in [old for old, _ in pairs] + [str(Path.home())]:
            if bad.encode() in data:
                raise SystemExit(f"{out}: still holds {bad}; add a placeholder for it")
        out.write_bytes(data)


def regenerate(name: str) -> None:
    scenario_dir = DATA / name
    options = {"script": f"{name}/worker.py", "stall_timeout_s": 2, **SCENARIOS[name]}
    spec = JobSpec(**{**options, "script": str(DATA / options["script"])})
    with tempfile.TemporaryDirectory() as tmp:
        job = Job(spec, runs_root=Path(tmp) / "runs").start()
        code = job.wait(timeout=120)
        run = job.run
        assert run is not None
        print(f"{name}: exit {code}, state {job.status()}, {len(job.stalls)} stall(s)")
        pairs = placeholders(run.path, Path(spec.script).parent)  # type: ignore[arg-type]
        copy_sanitised(run.path, scenario_dir / "run", pairs)


def main(argv: list[str]) -> None:
    names = argv or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise SystemExit(f"unknown scenario(s) {unknown}; known: {sorted(SCENARIOS)}")
    for name in names:
        regenerate(name)


if __name__ == "__main__":
    main(sys.argv[1:])
