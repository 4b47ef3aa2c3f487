"""Diagnosis at cluster scale, against torch's own flight-recorder analyzer on the same files.

Writes one flight-recorder dump per rank in the NCCL layout (``tests/data/nccl_fr/make_dumps.py``),
one rank diverging in the last collective, then times, each in a fresh process:

- torch's analyzer: ``python -m torch.distributed.flight_recorder.fr_trace DIR --prefix P``;
- rankscope: ``diagnose(load_run(DIR))`` (reading the dumps included, as the analyzer does),
  with the time of each step (reading, calls table, alignment, wait-for graph, the rest), and
  ``rankscope diagnose DIR --json`` (not with ``--no-torch``).

It prints the wall time of both, their ratio, the peak memory (resident set of the process and
its children, sampled) and the culprit each names. The files are deleted afterwards, unless
``--reuse DIR`` keeps them in a folder of DIR named after the arguments that made them, where the
next run with the same arguments reads them again instead of writing them.

    python bench/analyze_scale.py                              # 1024 ranks x 2000 entries
    python bench/analyze_scale.py --ranks 16384 --no-torch --link
    python bench/analyze_scale.py --ranks 4096 --no-torch --link --reuse /tmp/dumps
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
MAKE_DUMPS = ROOT / "tests" / "data" / "nccl_fr" / "make_dumps.py"


def _make_dumps() -> Any:
    spec = importlib.util.spec_from_file_location("make_dumps", MAKE_DUMPS)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def measure(cmd: list[str], *, timeout_s: float) -> dict[str, Any]:
    """Run ``cmd``; return its wall time, peak RSS of its process tree, exit code and output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        root = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                tree = [root, *root.children(recursive=True)]
                peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
            except psutil.Error:
                pass
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    done.set()
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "wall_s": time.perf_counter() - start,
        # the process and its descendants (waited for): what the load of others does not add
        "cpu_s": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
        "peak_rss_bytes": peak,
        "returncode": proc.returncode,
        "stdout": out,
        "stderr": err,
    }


#: The derived facts whose time the bench reports, and what it calls them.
STEPS = {"calls": "calls table", "divergences": "alignment", "graph": "wait-for graph"}


def _time_steps(spent: dict[str, float]) -> None:
    """Time the first computation of each of :data:`STEPS` (cached properties of the
    diagnosis's context) into ``spent``."""
    from rankscope.analyze.context import Context

    for name in STEPS:
        compute = getattr(Context, name).func

        def timed(self: Any, compute: Any = compute, name: str = name) -> Any:
            t0 = time.perf_counter()
            try:
                return compute(self)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0

        prop = functools.cached_property(timed)
        prop.__set_name__(Context, name)
        setattr(Context, name, prop)


def worker(folder: str, workers: int | None) -> None:
    """In a fresh process: load the folder, diagnose it, print the result as JSON."""
    from rankscope.analyze import diagnose
    from rankscope.collect import load_run

    spent: dict[str, float] = {}
    _time_steps(spent)
    t0 = time.perf_counter()
    run = load_run(folder, workers=workers)
    run.flight_recorder  # noqa: B018  (load the entries first, to time the two parts)
    t1 = time.perf_counter()
    diagnosis = diagnose(run)
    t2 = time.perf_counter()
    out = diagnosis.to_dict()
    print(
        json.dumps(
            {
                "load_s": t1 - t0,
                "diagnose_s": t2 - t1,
                "steps_s": spent,
                "verdict": out["verdict"],
                "cause": out["cause"],
                "culprit_ranks": out["culprit_ranks"],
                "seq": (out["collective"] or {}).get("seq"),
                "summary": out["summary"],
            }
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--culprit", type=int, default=None, help="default: ranks // 2 + 5")
    parser.add_argument(
        "--divergence", default="missing", choices=["missing", "op", "shape", "dtype", "extra"]
    )
    parser.add_argument("--no-torch", action="store_true", help="skip torch's analyzer")
    parser.add_argument("--link", action="store_true", help="hard-link identical dumps")
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to write (default: a temp dir)"
    )
    parser.add_argument(
        "--reuse", type=Path, default=None, metavar="DIR", help="keep the dumps in DIR, reuse them"
    )
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument(
        "--workers", type=int, default=None, help="processes reading the dumps (default: collect's)"
    )
    parser.add_argument("--worker", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.workers)
        return 0
    culprit = args.ranks // 2 + 5 if args.culprit is None else args.culprit
    made = f"{args.ranks}x{args.entries}-{args.divergence}-{culprit}{'-link' if args.link else ''}"
    if args.reuse is None:
        base = Path(tempfile.mkdtemp(prefix="rankscope-bench-", dir=args.dir))
        folder = base / "dumps"
    else:
        base, folder = None, args.reuse / f"rankscope-bench-{made}"
    try:
        t0 = time.perf_counter()
        dumps = _make_dumps()
        # written last, beside the dumps: a run cut short leaves no set to reuse
        done = folder.with_name(folder.name + ".done")
        if done.is_file():
            paths = sorted(folder.glob(f"{dumps.PREFIX}*"))
            wrote = "reused"
        else:
            shutil.rmtree(folder, ignore_errors=True)
            paths = dumps.write_dumps(
                folder,
                world=args.ranks,
                entries=args.entries,
                culprit=culprit,
                divergence=args.divergence,
                link=args.link,
            )
            if base is None:
                done.write_text(made)
            wrote = "wrote"
        size = sum(p.stat().st_size for p in paths)
        print(
            f"{wrote} {len(paths)} dumps x {args.entries} entries ({size / 2**30:.2f} GiB"
            f"{', hard-linked' if args.link else ''}) in {time.perf_counter() - t0:.1f} s; "
            f"rank {culprit} diverges ({args.divergence})",
            flush=True,
        )
        cmd = [sys.executable, __file__, "--worker", str(folder)]
        cmd += [] if args.workers is None else ["--workers", str(args.workers)]
        mine = measure(cmd, timeout_s=args.timeout)
        if mine["returncode"] != 0:
            print(mine["stderr"][-4000:], file=sys.stderr)
            return 1
        result = json.loads(mine["stdout"].strip().splitlines()[-1])
        steps = result["steps_s"]
        rest = result["diagnose_s"] - sum(steps.values())
        parts = ", ".join(f"{STEPS[k]} {v:.1f} s" for k, v in steps.items())
        print(
            f"rankscope: {mine['wall_s']:.1f} s wall, {mine['cpu_s']:.1f} s CPU (reading the dumps {result['load_s']:.1f} s, "
            f"diagnose {result['diagnose_s']:.1f} s: {parts}, facts and rules {rest:.1f} s), "
            f"peak RSS {mine['peak_rss_bytes'] / 2**30:.2f} GiB; {result['verdict']} "
            f"{result['cause']}, culprit {result['culprit_ranks']}, seq {result['seq']}",
            flush=True,
        )
        if args.no_torch:
            return 0
        cli = Path(sys.executable).with_name("rankscope")
        cmd = [str(cli)] if cli.is_file() else [sys.executable, "-m", "rankscope.cli"]
        by_cli = measure([*cmd, "diagnose", str(folder), "--json"], timeout_s=args.timeout)
        blamed_cli = json.loads(by_cli["stdout"] or "{}").get("culprit_ranks")
        print(
            f"rankscope diagnose --json: {by_cli['wall_s']:.1f} s wall, "
            f"{by_cli['cpu_s']:.1f} s CPU, peak RSS "
            f"{by_cli['peak_rss_bytes'] / 2**30:.2f} GiB, exit {by_cli['returncode']}; "
            f"culprit {blamed_cli}",
            flush=True,
        )
        cmd = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace"]
        theirs = measure(
            [*cmd, str(folder), "--prefix", "nccl_trace_rank_"], timeout_s=args.timeout
        )
        blamed = dumps.torch_culprits(theirs["stderr"] + theirs["stdout"])
        print(
            f"torch fr_trace: {theirs['wall_s']:.1f} s wall, {theirs['cpu_s']:.1f} s CPU, peak RSS "
            f"{theirs['peak_rss_bytes'] / 2**30:.2f} GiB, exit {theirs['returncode']}; "
            f"culprit {blamed}",
            flush=True,
        )
        same = blamed == result["culprit_ranks"] == blamed_cli
        print(
            f"ratio: rankscope is {theirs['wall_s'] / mine['wall_s']:.1f}x faster "
            f"({theirs['wall_s'] / by_cli['wall_s']:.1f}x by the command line; in CPU time "
            f"{theirs['cpu_s'] / mine['cpu_s']:.1f}x and {theirs['cpu_s'] / by_cli['cpu_s']:.1f}x); "
            f"same culprit: {'yes' if same else 'no'}"
        )
        return 0 if same else 1
    finally:
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
