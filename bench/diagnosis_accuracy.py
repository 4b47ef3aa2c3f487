"""Diagnosis accuracy: every scenario of the catalogue and every case of the corpus, run for real.

Each job runs under rankscope (torchrun, the probe, the stall watchdog, stopped after its
capture) on gloo, then ``diagnose()`` answers from its run directory. Printed: one row per case
with what was expected and what came out (verdict, cause, recipe, culprits, the parting line
and the values that decided it, where the ranks' paths first parted (the call's number and the
culprit class there), where the case names them) and how long the
answer took: from the start of the job to the verdict (``to verdict``, stall timeout included),
and ``diagnose()`` alone, and how the stall was called (``proven`` at once, ``no_progress`` after
the stall timeout, or none: the job ended on its own). Then the median time to verdict by that
kind, the accuracy of each field over all cases, and a confusion table
of causes, and the cases right per framework (plain torch, Lightning, the Hugging Face Trainer,
Accelerate, DeepSpeed: the corpus's framework cases, skipped, saying so, where one is not
installed). Target: every case right.

The catalogue's entries say what their broken run must give (``expected``); where an entry leaves
a field open (null), the table shows what came out without scoring it. The corpus
(``tests/corpus``) states every field of each case.

    python bench/diagnosis_accuracy.py [--only NAME ...] [--skip-catalogue] [--skip-corpus]
        [--load N] [--slow-disk] [--quiet-table FILE] [--save FILE] [--keep DIR]

Under load (the answer must not depend on it): ``--load N`` runs N CPU-bound processes beside
every case, and ``--slow-disk`` a writer that keeps the run directory's file system busy (large
writes, each flushed to the disk with fsync, so the ranks' writes queue behind them and the
page cache stays full of dirty pages; no FUSE, no privileges). Then each case runs quiet first
(or its quiet row is read from ``--quiet-table``, a file ``--save`` wrote on a quiet run), then
loaded, and a line per case says whether the loaded answer equals the quiet one (verdict,
cause, culprits, parting line, first divergence), naming the fields that differ.
``--keep DIR`` keeps every case's run directory there, and a wrong case's line names its own,
to be read after (``rankscope diagnose``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankscope.analyze import diagnose
from rankscope.launch import Job, JobSpec
from rankscope.scenarios import catalogue

ROOT = Path(__file__).resolve().parent.parent


def _corpus() -> Any:
    spec = importlib.util.spec_from_file_location("corpus_expect", ROOT / "tests/corpus/expect.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@dataclass
class Row:
    name: str
    kind: str
    want: dict[str, Any]
    got: dict[str, Any]
    wrong: list[str]
    to_verdict_s: float
    diagnose_s: float
    stall: str
    """How the stall was called: its kind (``proven``, ``no_progress``, ...), or ``none``."""
    framework: str = "torch"
    """What the case runs under: ``torch`` (a plain script), ``lightning``, ``transformers``,
    ``accelerate``, ``deepspeed``."""
    run: Path | None = None
    """The case's run directory."""


def run_case(
    name: str,
    kind: str,
    spec: JobSpec,
    want: dict[str, Any],
    root: Path,
    check: Any,
    framework: str = "torch",
) -> Row:
    start = time.monotonic()
    job = Job(spec, runs_root=root).start()
    try:
        job.wait(timeout=180)
    finally:
        if job.poll() is None:
            job.stop(grace_s=2.0)
    t0 = time.monotonic()
    d = diagnose(job.run.path)
    done = time.monotonic()
    parting = d.parting or {}
    got = {
        "verdict": d.verdict,
        "cause": d.cause,
        "recipe": d.recipe,
        "culprits": d.culprit_ranks,
        # the catalogue names the parting line by its text, the corpus by its file:line
        "parting": parting.get("source" if kind == "catalogue" else "site"),
        "values": sorted(set(parting.get("values", {})) & set(want.get("values") or [])) or None,
        # where the paths first parted: the call's number and the culprit class there
        "first": _first(d.first_divergence),
    }
    stalls = job.info()["stalls"]
    stall = stalls[0]["kind"] if stalls else "none"
    return Row(
        name, kind, want, got, check(d), done - start, done - t0, stall, framework, job.run.path
    )


#: The fields of a row that must not change with the machine's load.
SAME_UNDER_LOAD = ("verdict", "cause", "culprits", "parting", "first")

_SPIN = "while True: pass"
# Writes 32 MB, flushes it to the disk, again and again, in the folder given: the ranks' own
# writes to that file system queue behind it.
_WRITER = """
import os, sys
path = os.path.join(sys.argv[1], ".rankscope-bench-disk-load")
block = os.urandom(1 << 20)
while True:
    with open(path, "wb") as f:
        for _ in range(32):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
"""


@contextlib.contextmanager
def load_beside(n: int, disk: Path | None):
    """N CPU-bound processes, and a disk writer in ``disk`` when given, for the block's
    duration; each stopped by its pid after."""
    procs = [
        subprocess.Popen([sys.executable, "-c", _SPIN], stdin=subprocess.DEVNULL) for _ in range(n)
    ]
    if disk is not None:
        disk.mkdir(parents=True, exist_ok=True)
        procs.append(
            subprocess.Popen([sys.executable, "-c", _WRITER, str(disk)], stdin=subprocess.DEVNULL)
        )
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
        if disk is not None:
            with contextlib.suppress(OSError):
                os.unlink(disk / ".rankscope-bench-disk-load")


def differs(quiet: dict[str, Any], loaded: dict[str, Any]) -> list[str]:
    """The fields of :data:`SAME_UNDER_LOAD` whose loaded answer is not the quiet one."""
    return [f for f in SAME_UNDER_LOAD if _plain(quiet.get(f)) != _plain(loaded.get(f))]


def _plain(value: Any) -> Any:
    """A field as JSON keeps it (tuples as lists), so a saved quiet table compares alike."""
    return json.loads(json.dumps(value, default=str))


def _first(fd: dict[str, Any] | None) -> tuple[int, list[int]] | None:
    return (fd["seq"], fd["culprits"]) if fd else None


def catalogue_cases(only: set[str]) -> list[tuple[str, JobSpec, dict[str, Any], Any, str]]:
    out = []
    for s in catalogue():
        if only and s.id not in only:
            continue
        if s.missing():
            print(f"skipped {s.id}: needs {', '.join(s.missing())}", file=sys.stderr)
            continue
        want = {
            "verdict": s.expected["verdict"],
            "cause": s.expected.get("cause"),
            "recipe": s.expected.get("recipe"),
            "culprits": s.expected.get("culprit_ranks"),
            "parting": s.expected.get("parting"),
            "values": None,
            "first": (s.expected["first_seq"], s.expected["culprit_ranks"])
            if s.expected.get("first_seq")
            else None,
        }
        out.append((s.id, s.spec(on_stall="stop"), want, s.wrong, "torch"))
    return out


def corpus_cases(only: set[str]) -> list[tuple[str, JobSpec, dict[str, Any], Any, str]]:
    corpus = _corpus()
    out = []
    for c in corpus.cases():
        if only and c.name not in only:
            continue
        if c.missing():
            print(f"skipped {c.name}: needs {', '.join(c.missing())}", file=sys.stderr)
            continue
        spec = JobSpec(
            script=str(c.path),
            nproc_per_node=c.ranks,
            nnodes=c.nodes,
            name=c.name,
            **c.spec_settings(),
        )
        want = {
            "verdict": c.verdict,
            "cause": c.cause,
            "recipe": c.recipe,
            "culprits": c.culprits,
            "parting": c.line(c.parting) if c.parting else None,
            "values": sorted(c.values) or None,
            "first": (c.first["seq"], c.culprits) if c.first else None,
        }
        out.append((c.name, spec, want, lambda d, c=c: corpus.check(c, d), c.framework))
    return out


def score(rows: list[Row], field: str) -> str:
    scored = [r for r in rows if r.want.get(field) is not None]
    right = sum(r.got[field] == r.want[field] for r in scored)
    return f"{right}/{len(scored)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=[], help="case names to run")
    ap.add_argument("--skip-catalogue", action="store_true")
    ap.add_argument("--skip-corpus", action="store_true")
    ap.add_argument("--load", type=int, default=0, help="CPU-bound processes beside each case")
    ap.add_argument(
        "--slow-disk", action="store_true", help="keep the run directory's disk busy too"
    )
    ap.add_argument("--quiet-table", type=Path, help="quiet rows saved by --save, not rerun")
    ap.add_argument("--save", type=Path, help="write the rows (what came out) as JSON here")
    ap.add_argument("--keep", type=Path, help="keep every case's run directory under this folder")
    args = ap.parse_args()
    if args.load < 0:
        ap.error("--load takes a number of processes, 0 or more")
    loaded = args.load > 0 or args.slow_disk
    quiet_rows: dict[str, Any] = {}
    if args.quiet_table is not None:
        quiet_rows = {r["name"]: r["got"] for r in json.loads(args.quiet_table.read_text())}
    only = set(args.only)
    cases = []
    if not args.skip_catalogue:
        cases += [("catalogue", *c) for c in catalogue_cases(only)]
    if not args.skip_corpus:
        cases += [("corpus", *c) for c in corpus_cases(only)]
    rows: list[Row] = []
    same: dict[str, list[str]] = {}
    with contextlib.ExitStack() as stack:
        tmp = args.keep or stack.enter_context(
            tempfile.TemporaryDirectory(prefix="rankscope-accuracy-")
        )
        for kind, name, spec, want, check, framework in cases:
            quiet = quiet_rows.get(name)
            if loaded and quiet is None:
                quiet = run_case(name, kind, spec, want, Path(tmp), check, framework).got
            disk = Path(tmp) if args.slow_disk else None
            with load_beside(args.load, disk) if loaded else contextlib.nullcontext():
                row = run_case(name, kind, spec, want, Path(tmp), check, framework)
            rows.append(row)
            if loaded:
                same[name] = differs(quiet, row.got)
                print(
                    f"    {name}: "
                    + (
                        "same as quiet"
                        if not same[name]
                        else "DIFFERS from quiet in "
                        + ", ".join(
                            f"{f} ({quiet.get(f)!r} quiet, {row.got.get(f)!r} loaded)"
                            for f in same[name]
                        )
                    ),
                    flush=True,
                )
            mark = "ok " if not row.wrong else "BAD"
            print(
                f"{mark} {kind:9} {name:26} {row.got['verdict']:12} {row.got['cause'] or '-':28} "
                f"{row.got['recipe'] or '-':4} culprits {row.got['culprits']!s:10} "
                f"parted at {row.got['parting'] or '-':24} "
                f"to verdict {row.to_verdict_s:5.1f} s  diagnose {row.diagnose_s:5.2f} s  "
                f"stall {row.stall}"
                + (f"  <- {'; '.join(row.wrong)}" if row.wrong else "")
                + (f"  ({row.run})" if args.keep and row.wrong else ""),
                flush=True,
            )
    print()
    if args.save is not None:
        args.save.write_text(
            json.dumps([{"name": r.name, "got": r.got} for r in rows], indent=1, default=str)
        )
    right = sum(not r.wrong for r in rows)
    print(f"cases right: {right}/{len(rows)}")
    if loaded:
        what = f"{args.load} CPU-bound process(es)" + (" and a busy disk" if args.slow_disk else "")
        print(
            f"  same as quiet under {what}: {sum(not d for d in same.values())}/{len(same)}"
            + "".join(f"\n    differs: {n} ({', '.join(d)})" for n, d in same.items() if d)
        )
    for field in ("verdict", "cause", "recipe", "culprits", "parting", "values", "first"):
        print(f"  {field:9} {score(rows, field)}")
    frameworks = sorted({r.framework for r in rows}, key=lambda f: (f != "torch", f))
    print(
        "  by framework: "
        + ", ".join(
            f"{f} {sum(not r.wrong for r in rows if r.framework == f)}/"
            f"{sum(r.framework == f for r in rows)}"
            for f in frameworks
        )
    )
    times = sorted(r.to_verdict_s for r in rows)
    diag = sorted(r.diagnose_s for r in rows)
    if times:
        print(
            f"  time to verdict: median {times[len(times) // 2]:.1f} s, max {times[-1]:.1f} s; "
            f"diagnose(): median {diag[len(diag) // 2]:.2f} s, max {diag[-1]:.2f} s"
        )
    for stall in sorted({r.stall for r in rows}):
        by = sorted(r.to_verdict_s for r in rows if r.stall == stall)
        print(
            f"  time to verdict, stall {stall}: median {by[len(by) // 2]:.1f} s ({len(by)} cases)"
        )
    print("\ncauses, expected (rows) against diagnosed (columns):")
    pairs = Counter((r.want["cause"] or "(open)", r.got["cause"] or "(none)") for r in rows)
    expected = sorted({a for a, _ in pairs})
    got = sorted({b for _, b in pairs})
    width = max(len(x) for x in [*expected, *got, "expected"]) + 2
    print(" " * width + "".join(f"{g[:14]:>15}" for g in got))
    for e in expected:
        print(f"{e:<{width}}" + "".join(f"{pairs.get((e, g), 0) or '.':>15}" for g in got))
    if right < len(rows) or any(same.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
