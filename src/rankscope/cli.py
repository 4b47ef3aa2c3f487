"""``rankscope``: the command line over the same pipeline the notebooks use.

rankscope run [options] SCRIPT [ARGS...]   start a job, watch every rank, capture a stall
rankscope diagnose PATH [--json]           explain a run directory or a folder of artifacts
rankscope attach URL [-o DIR] [--json]     diagnose a live job through torch's debug server
rankscope replay PATH [-o repro.py]        a small CPU job that freezes the way PATH's job did
rankscope status RUN_DIR [--json]          state and per-rank progress of a job
rankscope capture RUN_DIR                  capture evidence from a running job now
rankscope stop RUN_DIR                     stop a running job
rankscope presets                          the debug presets and what each one sets
rankscope scenarios [ID [--fix]]           the failure scenarios, or run one
rankscope lab [DIR [OPTION...]]           JupyterLab on the notebooks, open on the quickstart

Each command is its handler (``cmd_<name>``) with its parser's arguments just above it
(``_<name>_arguments``), made a command by :func:`command`; ``rankscope run``'s defaults are
:class:`~rankscope.launch.JobSpec`'s.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from rankscope.launch import PRESETS, Job, JobSpec
from rankscope.launch.job import state_text
from rankscope.launch.spec import DEFAULT_PRESETS, LAUNCHERS
from rankscope.launch.tracker import doing_now
from rankscope.rundir import FINAL_STATES, REPRO, RunDirError, new_run_dir
from rankscope.state import STEP_LABEL, proof_text

if TYPE_CHECKING:
    from rankscope.analyze import Diagnosis

#: ``rankscope diagnose``'s exit code when the evidence cannot tell what happened.
EXIT_UNKNOWN = 3


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


#: JobSpec's defaults, which ``rankscope run``'s options take.
SPEC: dict[str, Any] = {
    f.name: f.default for f in dataclasses.fields(JobSpec) if f.default is not dataclasses.MISSING
}

Handler = Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class Command:
    """A command: its parser's arguments (added by ``arguments``) next to its handler."""

    handler: Handler
    help: str
    description: str | None
    arguments: Callable[[argparse.ArgumentParser], None] | None


#: The commands, by name, in the order ``rankscope --help`` lists them (as they are defined
#: below, each by :func:`command` on its handler).
COMMANDS: dict[str, Command] = {}


def command(
    name: str,
    arguments: Callable[[argparse.ArgumentParser], None] | None = None,
    *,
    help: str,
    description: str | None = None,
) -> Callable[[Handler], Handler]:
    """Make the decorated handler the command ``name``, whose parser takes ``arguments``."""

    def register(handler: Handler) -> Handler:
        COMMANDS[name] = Command(handler, help, description, arguments)
        return handler

    return register


def _run_dir_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR")


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command in :data:`COMMANDS`, each with its own arguments."""
    parser = argparse.ArgumentParser(
        prog="rankscope",
        description="Find which rank of a distributed PyTorch job diverged, where and why.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, c in COMMANDS.items():
        p = sub.add_parser(name, help=c.help, description=c.description)
        if c.arguments is not None:
            c.arguments(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command].handler(args)
    except (RunDirError, ValueError, FileNotFoundError) as exc:
        print(f"rankscope {args.command}: error: {exc}", file=sys.stderr)
        return 2


# --- run ------------------------------------------------------------------------------------
def _run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("script", metavar="SCRIPT", help="training script (or module with -m)")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="script arguments")
    p.add_argument("-m", "--module", action="store_true", help="SCRIPT is a module name")
    p.add_argument(
        "--nproc-per-node",
        type=int,
        default=SPEC["nproc_per_node"],
        metavar="N",
        help=f"ranks per node ({SPEC['nproc_per_node']})",
    )
    p.add_argument(
        "--nnodes",
        type=int,
        default=SPEC["nnodes"],
        metavar="N",
        help="nodes: simulated on this host by one torchrun agent each, or SLURM nodes with "
        f"--launcher slurm ({SPEC['nnodes']})",
    )
    p.add_argument(
        "--backend",
        choices=["auto", "gloo", "nccl"],
        default=SPEC["backend"],
        help="passed to the script as RANKSCOPE_BACKEND; auto = nccl if a GPU per rank "
        f"({SPEC['backend']})",
    )
    p.add_argument(
        "--preset",
        action="append",
        default=[],
        choices=sorted(PRESETS),
        metavar="NAME",
        help=f"switch a debug preset on (repeatable): {', '.join(sorted(PRESETS))}; "
        "see 'rankscope presets'",
    )
    p.add_argument(
        "--no-preset",
        action="append",
        default=[],
        choices=sorted(PRESETS),
        metavar="NAME",
        help=f"switch a preset off (on by default: {', '.join(SPEC['presets'])})",
    )
    p.add_argument(
        "--stall-timeout",
        type=_positive,
        default=SPEC["stall_timeout_s"],
        metavar="SECONDS",
        help="no progress for this long while a rank waits in a collective is a stall "
        f"({SPEC['stall_timeout_s']:g}); "
        "raise it for jobs that pause longer between collectives (a hang the ranks' state "
        "proves is called at once, whatever this)",
    )
    p.add_argument(
        "--on-stall",
        choices=["keep", "stop"],
        default="stop",  # JobSpec keeps a stalled job (a notebook inspects it); a terminal stops it
        help="after capturing evidence, stop the job or keep it running for inspection (stop)",
    )
    p.add_argument(
        "--timeout",
        type=_positive,
        default=SPEC["timeout_s"],
        metavar="SECONDS",
        help="hard limit for the whole job",
    )
    p.add_argument(
        "--collective-timeout",
        type=_positive,
        default=SPEC["collective_timeout_s"],
        metavar="SECONDS",
        help="timeout for init_process_group when the script passes none (torch's default)",
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        type=_env_pair,
        metavar="KEY=VALUE",
        help="extra environment for every rank (repeatable)",
    )
    p.add_argument(
        "--run-dir",
        default=None,
        metavar="DIR",
        help="the run directory itself: created if absent, refused if it holds a run "
        "(default: a fresh, named directory under ./runs/)",
    )
    p.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        default=SPEC["launcher"],
        help="what starts the ranks: torchrun on this machine (default), or slurm: a batch job "
        "of --nnodes nodes on the SLURM cluster this machine submits to",
    )
    p.add_argument("--partition", default=None, metavar="P", help="slurm: sbatch --partition")
    p.add_argument("--time", default=None, metavar="T", help="slurm: sbatch --time (10:00)")
    p.add_argument("--account", default=None, metavar="A", help="slurm: sbatch --account")
    p.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="slurm: one more sbatch option, as --sbatch-arg=--qos=debug (repeatable)",
    )
    p.add_argument("--quiet", action="store_true", help="no live progress, only the outcome")


@command(
    "run",
    _run_arguments,
    help="start a torchrun job, watch every rank, capture evidence on a stall",
    description="Start SCRIPT under torchrun with the rankscope probe in every rank, show "
    "live per-rank progress, capture evidence from every rank when the job stalls, stop "
    "it according to --on-stall, and print where the run directory is. Exits 0 only if "
    "every rank exited 0.",
)
def cmd_run(args: argparse.Namespace) -> int:
    presets = [
        p for p in dict.fromkeys([*SPEC["presets"], *args.preset]) if p not in args.no_preset
    ]
    return run_job(
        JobSpec(
            script=None if args.module else args.script,
            module=args.script if args.module else None,
            args=args.args,
            nproc_per_node=args.nproc_per_node,
            nnodes=args.nnodes,
            backend=args.backend,
            presets=presets,
            env=dict(args.env),
            stall_timeout_s=args.stall_timeout,
            on_stall=args.on_stall,
            timeout_s=args.timeout,
            collective_timeout_s=args.collective_timeout,
            launcher=args.launcher,
            slurm=_slurm_options(args),
        ),
        run_dir=args.run_dir,
        quiet=args.quiet,
    )


def _slurm_options(args: argparse.Namespace) -> dict[str, Any]:
    given = {
        "partition": args.partition,
        "time": args.time,
        "account": args.account,
        "sbatch_args": args.sbatch_arg,
    }
    given = {k: v for k, v in given.items() if v}
    if given and args.launcher != "slurm":
        flags = ", ".join("--" + k.replace("_args", "-arg").replace("_", "-") for k in given)
        raise ValueError(f"{flags} are for --launcher slurm")
    return given


def run_job(spec: JobSpec, *, run_dir: str | None, quiet: bool) -> int:
    """Start ``spec``, show progress, report stalls, the outcome and the diagnosis.

    A stall is reported from the watchdog's thread the moment its evidence is in, with the
    diagnosis of the frozen job, before the job is stopped; the diagnosis after the job ended
    is printed again only if it names another cause or other culprits."""
    out = sys.stdout
    printing = threading.Lock()  # the live view and the stall's report share the terminal
    said: list[tuple[Any, ...]] = []  # (verdict, cause, culprits) of each card printed

    def on_stall(job: Job, stall: dict[str, Any]) -> None:
        diagnosis = _diagnosis(job.run.path, out)
        with printing:
            _print_stall(job, stall, out)
            if diagnosis is not None:
                print(diagnosis.render(), file=out, flush=True)
                said.append(_gist(diagnosis))

    job = Job(spec, run_dir=run_dir)
    job.on_stall_callbacks.append(on_stall)
    job.start()
    print(f"rankscope: run directory {_rel(job.run.path)}", file=out, flush=True)
    # The analyzer's import (about half a second) is paid now, while the ranks start, not
    # between a stall and its card.
    importlib.import_module("rankscope.analyze")
    live = None if quiet else LiveView(out)
    interrupted = False

    def on_sigterm(*_: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        while job.poll() is None:
            if live is not None:
                with printing:
                    live.update(job)
            time.sleep(0.25)
    except KeyboardInterrupt:
        interrupted = True
        print("\nrankscope: interrupted; stopping the job", file=out, flush=True)
        job.stop(reason="interrupted")
    finally:
        signal.signal(signal.SIGTERM, previous)
    with printing:
        if live is not None:
            live.update(job, final=True)
        info = job.info()
        code = job.poll() or 0
        _print_outcome(info, out)
        diagnosis = _diagnosis(job.run.path, out)
        if diagnosis is not None and _gist(diagnosis) not in said:
            print(diagnosis.render(), file=out, flush=True)
        elif diagnosis is not None:
            print("rankscope: the diagnosis after the stop is the one above", file=out)
        print(f"rankscope: run directory {_rel(job.run.path)}", file=out, flush=True)
    if interrupted:
        return 130
    return 0 if code == 0 else 1


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _print_stall(job: Job, stall: dict[str, Any], out: TextIO) -> None:
    where = ", ".join(
        f"rank {r['rank']} in {r['op']} ({r['site']})"
        if r.get("in_collective_since")
        else f"rank {r['rank']} {doing_now(r) or r['status']}"
        for r in stall.get("ranks", [])
    )
    took = stall["evidence_complete_at"] - stall["detected_at"]
    why = (
        proof_text(stall["proven"])
        if stall.get("proven")
        else f"no progress for {stall['idle_s']:.1f} s"
    )
    if stall["kind"] == "exit":  # every rank ended its script: which process did not exit
        why, where = f"{stall.get('summary') or 'a process outlived its script'}", ""
    elif stall.get("summary"):  # a rank that works outside the collectives keeps them waiting
        why += f", {stall['summary']}" + (" (it may yet come)" if stall["kind"] == "busy" else "")
    print(
        f"rankscope: STALL: {why}{f' ({where})' if where else ''}; evidence "
        f"capture-{stall['capture_id']} complete in {took:.2f} s"
        + (f", missing ranks {stall['missing']}" if stall.get("missing") else ""),
        file=out,
        flush=True,
    )


def _print_outcome(info: dict[str, Any], out: TextIO) -> None:
    state = info.get("state")
    reason = info.get("stop_reason")
    codes = {int(r): v.get("exit_code") for r, v in (info.get("ranks") or {}).items()}
    shown = ", ".join(f"{r}: {'unknown' if c is None else c}" for r, c in sorted(codes.items()))
    line = f"rankscope: job {state}" + (f" ({reason})" if reason else "")
    line += f"; exit codes by rank: {shown or 'none recorded'}"
    if info.get("error"):
        line += f"\nrankscope: {info['error']}"
    print(line, file=out, flush=True)


def _diagnosis(path: Path, out: TextIO) -> Diagnosis | None:
    """The run's diagnosis, written into it; None, with the reason printed, when it fails."""
    from rankscope.analyze import diagnose, write_diagnosis

    try:
        diagnosis = diagnose(path)
        write_diagnosis(path, diagnosis)
    except Exception as exc:  # the job's outcome is printed all the same; say why no verdict
        print(f"rankscope: could not diagnose the run: {type(exc).__name__}: {exc}", file=out)
        return None
    return diagnosis


def _gist(d: Diagnosis) -> tuple[Any, ...]:
    return (d.verdict, d.cause, tuple(d.culprit_ranks))


class LiveView:
    """Per-rank progress: redrawn in place on a terminal, a line on change otherwise."""

    def __init__(self, out: TextIO):
        self.out = out
        self.tty = out.isatty()
        self._drawn = 0
        self._last_text = ""
        self._last_print = 0.0

    def update(self, job: Job, *, final: bool = False) -> None:
        ranks = job.ranks()
        job.status()  # reconciles a job whose supervisor vanished
        lines = [f"job {state_text(job.info())}  ({len(ranks)}/{job.spec.world_size} ranks up)"]
        lines += [format_rank(r) for r in ranks]
        text = "\n".join(lines)
        if self.tty:
            if self._drawn:
                self.out.write(f"\x1b[{self._drawn}F\x1b[J")
            self.out.write(text + "\n")
            self.out.flush()
            self._drawn = len(lines)
            return
        now = time.monotonic()
        summary = _without_ages(text)
        if final or (summary != self._last_text and now - self._last_print > 2.0):
            self.out.write(text + "\n")
            self.out.flush()
            self._last_text, self._last_print = summary, now


def _without_ages(text: str) -> str:
    return "\n".join(line.split("  hb ")[0] for line in text.splitlines())


def format_rank(r: dict[str, Any]) -> str:
    step = "-" if r.get("step") is None else r["step"]
    hb = r.get("heartbeat_age_s")
    node = f"  {r['node']}" if r.get("node") else ""
    now = doing_now(r)
    last = f"  (last completed {r['last_done']})" if r.get("last_done") else ""
    if r.get("unfinished"):
        last += f"  (ended with {', '.join(r['unfinished'])} never completed)"
    end = r.get("end")
    return (
        f"  rank {r['rank']:>3}{node}  pid {r['pid'] or '-':>7}  {r['status']:<8} "
        f"done {r['done']:>5}  {STEP_LABEL} {step:>5}  {now}{last}"
        + (f"  {end}" if end else "")
        + ("" if hb is None else f"  hb {hb:.1f}s")
    )


# --- other commands -------------------------------------------------------------------------
def _diagnose_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="PATH")
    p.add_argument("--json", action="store_true", help="print the diagnosis as JSON")


@command(
    "diagnose",
    _diagnose_arguments,
    help="explain a run directory or a folder of foreign artifacts",
    description="Say which rank diverged, in which collective, from which line, why, and "
    "what to do, from a run directory or a folder of dumps and logs. Exits 0 when the "
    f"evidence gives an answer (whatever the verdict), {EXIT_UNKNOWN} when it cannot tell "
    "(verdict 'unknown': nothing readable, or ranks that ended for reasons the evidence does "
    "not show), 2 on bad input.",
)
def cmd_diagnose(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    return _diagnose_and_print(path, as_json=args.json, keep=(path / "run.json").is_file())


def _diagnose_and_print(path: Path, *, as_json: bool, keep: bool) -> int:
    """Print the diagnosis of ``path`` (and write it there if ``keep``); the exit code."""
    from rankscope.analyze import diagnose, write_diagnosis

    diagnosis = diagnose(path)
    if keep:
        write_diagnosis(path, diagnosis)
    if as_json:
        print(json.dumps(diagnosis.to_dict(), indent=2, default=str))
    else:
        print(diagnosis.render())
    return EXIT_UNKNOWN if diagnosis.verdict == "unknown" else 0


def _attach_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", metavar="URL", help="the debug server's frontend: http://HOST:PORT")
    p.add_argument(
        "-o",
        "--output",
        default=None,
        metavar="DIR",
        help="where to keep what was fetched (new or empty; by default a fresh folder under ./runs/)",
    )
    p.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    p.add_argument(
        "--timeout",
        type=_positive,
        default=10.0,
        metavar="SECONDS",
        help="how long to wait for each answer (10)",
    )


@command(
    "attach",
    _attach_arguments,
    help="diagnose a live job, not started by rankscope, through torch's debug server",
    description="Fetch every rank's Python stacks and flight-recorder dump from the debug "
    "server of a running job (torch.distributed.debug.start_debug_server on every rank; URL "
    "is rank 0's frontend, http://HOST:PORT), keep them in DIR, and diagnose them as "
    "'rankscope diagnose DIR' would. Exits as diagnose does: 0 with an answer, "
    f"{EXIT_UNKNOWN} when the evidence cannot tell, 2 when URL gives nothing to diagnose.",
)
def cmd_attach(args: argparse.Namespace) -> int:
    """Fetch a live job's evidence from torch's debug server into a folder, then diagnose that
    folder: the evidence stays, so the verdict can be checked and re-read later."""
    from rankscope.collect.debug_server import fetch_debug_server

    dest = Path(args.output) if args.output else new_run_dir("runs", name="attach").path
    try:
        fetch_debug_server(args.url, dest, timeout_s=args.timeout)
    except ValueError:
        if args.output is None:  # keep no empty folder of ours behind a failure
            with contextlib.suppress(OSError):
                (dest / "manifest.json").unlink(missing_ok=True)
                dest.rmdir()
        raise
    manifest = json.loads((dest / "manifest.json").read_text())
    missing = manifest["missing"]
    line = f"rankscope attach: {len(manifest['ranks'])} ranks -> {_rel(dest)}"
    gaps = [
        f"no {what.replace('_', ' ')} from ranks {', '.join(map(str, ranks))}"
        for what, ranks in missing.items()
        if ranks
    ]
    if gaps:
        line += f" ({'; '.join(gaps)}: manifest.json says why)"
    print(line, file=sys.stderr)
    return _diagnose_and_print(dest, as_json=args.json, keep=True)


def _replay_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="PATH", help="run directory or folder of dumps")
    p.add_argument(
        "-o",
        "--output",
        default=REPRO,
        metavar="FILE",
        help="where to write the script (repro.py; a folder gets repro.py inside; - prints it)",
    )
    p.add_argument(
        "--ranks",
        type=_count,
        default=None,
        metavar="K",
        help="keep at most K ranks that still show the divergence (the culprits, ranks waiting "
        "on them, the ranks they wait for), renumbered from 0; the others are dropped",
    )
    p.add_argument(
        "--scale-down",
        type=_count,
        default=None,
        metavar="N",
        help="cap every tensor at N elements (shapes that differed still differ)",
    )


@command(
    "replay",
    _replay_arguments,
    help="write a standalone torch script that freezes the way a job did, on CPU",
    description="Read the flight-recorder dumps (and the probe's events, when the run has "
    "them) of PATH, a run directory or a folder of dumps from another machine, and write a "
    "plain torch script (no rankscope import) that, run under torchrun on CPU (gloo), "
    "issues every rank's collectives in the recorded order, on the same process groups, "
    "with the same ops, dtypes and shapes, and freezes (or fails) where the original did. "
    "Its docstring says what was kept, dropped and remapped.",
)
def cmd_replay(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if not path.exists():
        raise FileNotFoundError(
            f"{path} does not exist; pass a run directory or a folder of flight-recorder dumps"
        )
    from rankscope.replay import build

    replay = build(path, ranks=args.ranks, scale_down=args.scale_down)
    if args.output == "-":
        print(replay.script, end="")
        return 0
    out = replay.write(args.output)
    print(replay.header)
    print(
        f"\nrankscope replay: wrote {_rel(out)} ({replay.world_size} ranks); run it with:\n"
        f"    {replay.command(out)}\n"
        f"    rankscope run --nproc-per-node {replay.world_size} {_rel(out)}"
    )
    return 0


def _status_arguments(p: argparse.ArgumentParser) -> None:
    _run_dir_argument(p)
    p.add_argument("--json", action="store_true", help="print run.json and rank states")


@command(
    "status",
    _status_arguments,
    help="state and per-rank progress of a job",
    description="state and per-rank progress of a job",
)
def cmd_status(args: argparse.Namespace) -> int:
    job = Job.attach(args.run_dir)
    info = job.info()
    ranks = job.ranks()
    if args.json:
        print(json.dumps({"run": info, "ranks": ranks}, indent=1, default=str))
        return 0
    print(f"{_rel(job.run.path)}: {state_text(info, ranks)}")
    for r in ranks:
        print(format_rank(r))
    return 0


@command(
    "capture",
    _run_dir_argument,
    help="capture evidence from every rank of a running job now",
    description="capture evidence from every rank of a running job now",
)
def cmd_capture(args: argparse.Namespace) -> int:
    job = Job.attach(args.run_dir)
    if job.status() in FINAL_STATES:
        raise ValueError(f"{args.run_dir} is not running ({job.status()}): nothing to capture")
    manifest = job.capture(reason="cli")
    got = [r for r, v in manifest["ranks"].items() if v["via"]]
    print(
        f"capture-{manifest['id']}: {len(got)}/{len(manifest['ranks'])} ranks answered in "
        f"{manifest['duration_s']:.2f} s -> {_rel(job.run.capture_dir(manifest['id']))}"
    )
    return 0 if not manifest["missing"] else 1


@command(
    "stop",
    _run_dir_argument,
    help="stop a running job (SIGTERM, then SIGKILL after a grace period)",
    description="stop a running job (SIGTERM, then SIGKILL after a grace period)",
)
def cmd_stop(args: argparse.Namespace) -> int:
    job = Job.attach(args.run_dir)
    code = job.stop()
    print(f"{_rel(job.run.path)}: {job.status()} (exit code {code})")
    return 0


@command("presets", help="the debug presets and what each one sets")
def cmd_presets(args: argparse.Namespace) -> int:
    for name, preset in PRESETS.items():
        default = " (on by default)" if name in DEFAULT_PRESETS else ""
        print(f"{name}{default}")
        print(f"  on:  {' '.join(f'{k}={v}' for k, v in preset.env.items())}")
        if preset.off:
            print(f"  off: {' '.join(f'{k}={v}' for k, v in preset.off.items())}")
        print(f"  {preset.doc}\n")
    return 0


def _scenarios_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", nargs="?", metavar="ID")
    p.add_argument("--fix", action="store_true", help="run with the recipe's fix applied")
    p.add_argument("--quiet", action="store_true", help="no live progress, only the outcome")


@command(
    "scenarios",
    _scenarios_arguments,
    help="list the failure scenarios, or run one",
    description="Without ID: the catalogue of scenarios (recipes D1-D23 and reported "
    "deadlocks). With ID: run it like 'rankscope run' (broken, or with --fix).",
)
def cmd_scenarios(args: argparse.Namespace) -> int:
    from rankscope.scenarios import catalogue, get

    if args.id is None:
        for s in catalogue():
            where = s.recipe if s.kind == "recipe" else f"{s.source} ({s.recipe})"
            print(f"{s.id:<22} {s.nproc_per_node} ranks  {where:<28} {s.title}")
        return 0
    scenario = get(args.id)
    print(f"{scenario.title}: {scenario.fix if args.fix else scenario.what_goes_wrong}")
    return run_job(scenario.spec(fix=args.fix, on_stall="stop"), run_dir=None, quiet=args.quiet)


#: The notebook a newcomer starts with: ``rankscope lab`` opens on it where DIR holds it.
QUICKSTART = "00-quickstart.ipynb"
#: The port Jupyter tries first when nothing names another (env: JUPYTER_PORT).
JUPYTER_PORT = 8888


def _lab_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "notebooks", nargs="?", default="notebooks", metavar="DIR", help="its root (notebooks)"
    )
    p.add_argument(
        "jupyter_args",
        nargs=argparse.REMAINDER,
        metavar="JUPYTER_OPTION",
        help="after DIR: options for JupyterLab as given, e.g. --ip=0.0.0.0 in a container",
    )


@command(
    "lab",
    _lab_arguments,
    help="JupyterLab on the guided notebooks, opened on the quickstart",
    description=f"Start JupyterLab with DIR (notebooks) as its root, opened on {QUICKSTART}. "
    "It runs as whoever starts it, root included (saying so); without a display it opens "
    "no browser; when the port is taken JupyterLab takes the next free one. The URL it "
    "prints, with its token, is the one to open.",
)
def cmd_lab(args: argparse.Namespace) -> int:
    folder = Path(args.notebooks)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder of notebooks")
    argv, notes = lab_command(
        folder,
        jupyter_args=args.jupyter_args,
        euid=os.geteuid(),
        env=os.environ,
        platform=sys.platform,
    )
    for note in notes:
        print(f"rankscope lab: {note}", flush=True)
    # JupyterLab in this process's place: Ctrl-C and a stop signal reach the server itself,
    # which asks, or shuts its kernels down, rather than a parent that would kill it.
    sys.stderr.flush()
    os.execv(argv[0], argv)


def lab_command(
    folder: Path,
    *,
    jupyter_args: Sequence[str] = (),
    euid: int,
    env: Mapping[str, str],
    platform: str,
) -> tuple[list[str], list[str]]:
    """The command that starts JupyterLab on ``folder``, and a line for each thing it chose
    that the user should know (as whom it runs, no browser, the port taken).

    ``euid`` 0 (root, as in a container) passes ``--allow-root``, which JupyterLab otherwise
    asks for and stops without. On Linux without ``DISPLAY`` or ``WAYLAND_DISPLAY`` no browser
    is opened (none could show; a text browser would take the terminal). A taken port is
    left to JupyterLab's own retries (``ServerApp.port_retries``): the URL it prints names
    the port it took."""
    argv = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={folder.resolve()}"]
    notes = []
    if (folder / QUICKSTART).is_file():
        argv.append(f"--LabApp.default_url=/lab/tree/{QUICKSTART}")
    if euid == 0:
        argv.append("--allow-root")
        notes.append(
            "running as root (--allow-root): JupyterLab, its kernels and every rank a "
            "notebook starts run as root; to avoid it, run as a normal user (in Docker: "
            "docker run --user UID:GID)"
        )
    if platform.startswith("linux") and not (env.get("DISPLAY") or env.get("WAYLAND_DISPLAY")):
        argv.append("--no-browser")
        notes.append("no display here, so no browser: open the URL below, token included")
    named = {a.split("=")[0] for a in jupyter_args}
    if not named & {"--port", "--ServerApp.port"}:  # a port the user names is theirs to check
        given = env.get("JUPYTER_PORT") or str(JUPYTER_PORT)
        if not given.isdigit():
            raise ValueError(f"JUPYTER_PORT must be a port number, not {given!r}")
        port = int(given)
        if _port_taken(port):
            notes.append(
                f"port {port} is taken: JupyterLab takes another, the URL below says which"
            )
    return [*argv, *jupyter_args], notes


def _port_taken(port: int) -> bool:
    """Whether ``port`` on the loopback interface is in use, as a server binding it sees it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as JupyterLab binds
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
