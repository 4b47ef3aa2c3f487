"""Write flight-recorder dumps in the NCCL layout, one pickle per rank, as torch's recorder does.

The files are named ``<prefix><rank>`` and hold what ``_dump_nccl_trace()`` returns (format
``2.10``): ``version``, ``pg_config``, ``comm_lib_version``, ``pg_status`` and ``entries`` with
``profiling_name`` like ``nccl:all_reduce`` or ``nccl:recv 0<-1``, ``state`` ``completed`` for
retired entries and ``started`` for the one in flight. torch's own analyzer
(``python -m torch.distributed.flight_recorder.fr_trace DIR --prefix nccl_trace_rank_``) accepts
them.

Every healthy rank runs the same schedule of collectives on the world group and is left waiting
in its last one. One rank (``culprit``) diverges at that last record:

- ``missing``: it never issues it (it is busy elsewhere: its dump ends one record earlier);
- ``op``: it issues another collective, called from another line of train.py;
- ``shape``: it passes a tensor with one element more;
- ``dtype``: it passes bfloat16 where the others pass float32;
- ``p2p_cycle``: no collective diverges; ranks 0 and 1 each wait in ``recv`` from the other, so
  the rest wait for them in the next collective;
- ``none``: every rank completes every record (a clean run).
- ``extra``: half-way, the culprit makes one all_reduce more (train.py:70 through a ``retry``
  helper at train.py:12) than the others; every rank then goes on, one collective apart, and
  waits in its last.
- ``tp_skip`` (4 ranks, groups ``tp0`` [0, 1] and ``tp1`` [2, 3] besides the world): each step
  all_reduces on the rank's tp group (train.py:30), then on the world (train.py:32); at the last
  step the culprit skips its tp all_reduce. Its tp partner waits in the tp group for it, and the
  other ranks wait in the world group for that partner: a chain across groups.

With ``subgroups`` every fourth record goes to the rank's half of the world (groups ``1`` and
``2``) and the culprit diverges in its half's last collective; the other half completes its own
and waits in one more world collective, which the culprit's half never reaches.

Healthy ranks share one byte-identical dump; ``link=True`` hard-links those files to save disk
(each is still read and unpickled on its own). Every entry has its stack (``frames``, 15 to 19
frames innermost first: torch.distributed, the library that issued the call, train.py, the
training framework's loops); the three calls of a step have two stacks each. The dumps are
written as torch's recorder writes them, byte for byte (:func:`torch_pickle`; a test checks it
against a real dump): each distinct frame one dict per file, stored once and referred to from
every entry's own frames list, each text stored once, and the rest of an entry (its sizes,
dtypes, process group) written anew.

Regenerate the committed fixtures (run from the repository root)::

    python tests/data/nccl_fr/make_dumps.py --fixtures

Write a benchmark set::

    python tests/data/nccl_fr/make_dumps.py OUT --ranks 1024 --entries 2000 --culprit 517
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import struct
from pathlib import Path
from typing import Any

PREFIX = "nccl_trace_rank_"
DIVERGENCES = ("missing", "op", "shape", "dtype", "p2p_cycle", "none", "tp_skip", "extra")
LIB = "/usr/local/lib/python3.11/site-packages"
TORCH_DIR = f"{LIB}/torch/distributed"
TORCH_FILE = f"{TORCH_DIR}/distributed_c10d.py"
#: The frame between torch.distributed's call and the caller (its logging wrapper).
_C10D = ((f"{TORCH_DIR}/c10d_logger.py", "wrapper", 83),)
USER_FILE = "/srv/job/train.py"
#: What issues each op between train.py and torch.distributed (innermost first): FSDP's
#: all-gather of parameters, the backward that runs DDP's gradient hooks, FSDP's
#: reduce-scatter of gradients.
_LIBRARY: dict[str, tuple[tuple[str, str, int], ...]] = {
    "all_gather": (
        (f"{TORCH_DIR}/fsdp/_fully_shard/_fsdp_collectives.py", "foreach_all_gather", 254),
        (f"{TORCH_DIR}/fsdp/_fully_shard/_fsdp_param_group.py", "pre_forward", 402),
        (f"{TORCH_DIR}/fsdp/_fully_shard/_fsdp_state.py", "_pre_forward", 232),
        (f"{LIB}/torch/nn/modules/module.py", "_call_impl", 1840),
        (f"{LIB}/lightning/pytorch/strategies/strategy.py", "training_step", 390),
    ),
    "all_reduce": (
        (f"{LIB}/torch/autograd/graph.py", "_engine_run_backward", 829),
        (f"{LIB}/torch/autograd/__init__.py", "backward", 353),
        (f"{LIB}/torch/_tensor.py", "backward", 648),
        (f"{LIB}/lightning/pytorch/plugins/precision/precision.py", "backward", 73),
        (f"{LIB}/lightning/pytorch/strategies/strategy.py", "backward", 212),
    ),
    "reduce_scatter": (
        (f"{TORCH_DIR}/fsdp/_fully_shard/_fsdp_collectives.py", "foreach_reduce", 420),
        (f"{LIB}/torch/utils/_contextlib.py", "decorate_context", 120),
        (f"{TORCH_DIR}/fsdp/_fully_shard/_fsdp_param_group.py", "post_backward", 470),
        (
            f"{TORCH_DIR}/fsdp/_fully_shard/_fsdp_state.py",
            "_root_post_backward_final_callback",
            310,
        ),
        (f"{LIB}/torch/autograd/graph.py", "_engine_run_backward", 829),
    ),
}
#: The training framework's loops between the script's main and its step (innermost first).
_LOOP: tuple[tuple[str, str, int], ...] = (
    (f"{LIB}/lightning/pytorch/trainer/call.py", "_call_lightning_module_hook", 167),
    (f"{LIB}/lightning/pytorch/loops/optimization/automatic.py", "_training_step", 319),
    (f"{LIB}/lightning/pytorch/loops/optimization/automatic.py", "run", 192),
    (f"{LIB}/lightning/pytorch/loops/training_epoch_loop.py", "advance", 268),
    (f"{LIB}/lightning/pytorch/loops/fit_loop.py", "advance", 455),
    (f"{LIB}/lightning/pytorch/trainer/trainer.py", "_run_stage", 1056),
    (f"{LIB}/lightning/pytorch/trainer/trainer.py", "fit", 561),
)
T0_NS = 1_700_000_000_000_000_000
STEP_NS = 1_000_000

#: The repeating world-group schedule: (op, line in train.py, elements per rank).
SCHEDULE = (("all_gather", 41, 1024), ("all_reduce", 44, 4096), ("reduce_scatter", 47, 1024))
#: What a subgroup runs, and the line of train.py the culprit's odd collective comes from.
SUBGROUP_OP = ("all_reduce", 52, 512)
ODD_LINE = 70
RECV_LINE = 60
#: ``extra``: the line of train.py's retry helper that makes the culprit's extra all_reduce.
RETRY_LINE = 12

#: Committed fixtures: directory name -> build arguments.
FIXTURES: dict[str, dict[str, Any]] = {
    "missing": {"world": 4, "entries": 7, "culprit": 2, "divergence": "missing"},
    "op": {"world": 4, "entries": 7, "culprit": 3, "divergence": "op"},
    "shape": {"world": 4, "entries": 7, "culprit": 1, "divergence": "shape"},
    "dtype": {"world": 4, "entries": 7, "culprit": 0, "divergence": "dtype"},
    "p2p_cycle": {"world": 4, "entries": 7, "culprit": None, "divergence": "p2p_cycle"},
    "clean": {"world": 4, "entries": 7, "culprit": None, "divergence": "none"},
    "subgroups": {
        "world": 8,
        "entries": 12,
        "culprit": 6,
        "divergence": "shape",
        "subgroups": True,
    },
    # As "missing", without rank 3's file: the analysis must still name rank 2 and say so.
    "partial": {"world": 4, "entries": 7, "culprit": 2, "divergence": "missing", "drop": [3]},
    "tp_skip": {"world": 4, "entries": 5, "culprit": 2, "divergence": "tp_skip"},
    "extra": {"world": 4, "entries": 8, "culprit": 1, "divergence": "extra"},
}
#: tp_skip's lines in train.py: the tp all_reduce, the world all_reduce.
TP_LINE, WORLD_LINE = 30, 32


def _groups(world: int, subgroups: bool) -> dict[str, tuple[str, list[int]]]:
    groups = {"0": ("default_pg", list(range(world)))}
    if subgroups:
        half = world // 2
        groups["1"] = ("dp_lo", list(range(half)))
        groups["2"] = ("dp_hi", list(range(half, world)))
    return groups


class Entries:
    """Builds one rank's entry dicts, sharing the repeated parts between entries (also used by
    ``tests/data/nccl_fr64/make_dumps.py``). ``t0``: when the rank's first record was created."""

    def __init__(self, t0: int = T0_NS) -> None:
        self.t0 = t0
        self.out: list[dict[str, Any]] = []
        self._shared: dict[Any, Any] = {}

    def _share(self, key: Any, value: Any) -> Any:
        return self._shared.setdefault(key, value)

    def frame(self, filename: str, name: str, line: int) -> dict[str, Any]:
        """One frame: one dict per distinct frame of the dump, which every entry's stack refers
        to (torch's recorder symbolizes all the stacks at once and makes a dict per distinct
        frame; its pickler writes each such dict once, then refers to it)."""
        return self._share(
            ("frame", filename, name, line), {"name": name, "filename": filename, "line": line}
        )

    def frames(
        self, op: str, line: int, *, variant: int = 0, retry: bool = False
    ) -> list[dict[str, Any]]:
        """The stack of a call of ``op`` from train.py's ``line``, innermost first, as torch
        records it: torch.distributed's own frames, the library that issues the call, the user's
        step function, the training framework's loops, the script's main. A new list per entry
        (as torch makes one) of shared frame dicts; ``variant`` picks one of a few stacks of the
        same call (an accumulation step takes one more frame of the framework's); ``retry``: the
        call comes from the user's ``retry`` helper, called from train_step's ``line``."""
        chain = _LIBRARY.get(op, _LIBRARY["all_reduce"])
        loop = (
            _LOOP
            if not variant
            else (
                *_LOOP[:3],
                (
                    f"{LIB}/lightning/pytorch/loops/optimization/automatic.py",
                    "_accumulate",
                    210 + variant,
                ),
                *_LOOP[3:],
            )
        )
        stack = [
            (TORCH_FILE, op, 2800),
            *_C10D,
            *chain,
            *([(USER_FILE, "retry", RETRY_LINE)] if retry else []),
            (USER_FILE, "train_step", line),
            *loop,
            (USER_FILE, "main", 90),
            (USER_FILE, "<module>", 120),
        ]
        return [self.frame(f, n, ln) for f, n, ln in stack]

    def sizes(self, *shape: int) -> list[list[int]]:
        return [list(shape)]

    def add(
        self,
        *,
        pg: tuple[str, str],
        seq: int,
        p2p_seq: int,
        name: str,
        inp: list[list[int]],
        out: list[list[int]],
        dtype: str,
        frames: list[dict[str, Any]],
        done: bool,
    ) -> None:
        record_id = len(self.out)
        t = self.t0 + record_id * STEP_NS
        # The group, sizes and dtypes: new containers in every entry, as torch makes them (so
        # torch_pickle writes them anew); the frame dicts are the dump's shared ones.
        self.out.append(
            {
                "record_id": record_id,
                "pg_id": int(pg[0]),
                "process_group": (pg[0], pg[1]),
                "collective_seq_id": seq,
                "p2p_seq_id": p2p_seq,
                "op_id": record_id + 1,
                "profiling_name": name,
                "time_created_ns": t,
                "duration_ms": 0.25 if done else None,
                "input_sizes": [list(s) for s in inp],
                "input_dtypes": [dtype],
                "output_sizes": [list(s) for s in out],
                "output_dtypes": [dtype],
                "state": "completed" if done else "started",
                "time_discovered_started_ns": t + 1000,
                "time_discovered_completed_ns": t + 250_000 if done else None,
                "retired": done,
                "timeout_ms": 600_000,
                "is_p2p": name.startswith(("nccl:send", "nccl:recv")),
                "frames": frames,
                "thread_name": "pt_main_thread",
                "thread_id": "140000000000000",
            }
        )


def build_dump(
    rank: int,
    *,
    world: int,
    entries: int,
    culprit: int | None = None,
    divergence: str = "missing",
    subgroups: bool = False,
) -> dict[str, Any]:
    """One rank's dump of ``entries`` records, as described in the module docstring."""
    if divergence == "tp_skip":
        return build_tp_dump(rank, world=world, steps=entries, culprit=culprit)
    if divergence not in DIVERGENCES:
        raise ValueError(f"divergence must be one of {DIVERGENCES}, got {divergence!r}")
    if divergence in ("missing", "op", "shape", "dtype", "extra") and culprit not in range(world):
        raise ValueError(f"divergence {divergence!r} needs a culprit rank in 0..{world - 1}")
    if subgroups and (world % 2 or entries % 4 != 0):
        raise ValueError("subgroups need an even world and a multiple of 4 entries")
    groups = _groups(world, subgroups)
    mine = [name for name, (_, members) in groups.items() if rank in members]
    seqs = dict.fromkeys(mine, 0)
    rec = Entries()
    hang = divergence != "none"
    # With subgroups the culprit diverges in its half's last collective; the other half finishes
    # its own and waits in the next world collective, where the culprit's half never arrives.
    other_half = int(subgroups and culprit is not None and culprit not in groups[mine[1]][1])
    for i in range(entries + other_half):
        last = i >= entries - 1
        if divergence == "p2p_cycle" and last and rank in (0, 1):
            sizes = rec.sizes(256)
            rec.add(
                pg=("0", "default_pg"),
                seq=seqs["0"],
                p2p_seq=1,
                name=f"nccl:recv {rank}<-{1 - rank}",
                inp=sizes,
                out=sizes,
                dtype="Float",
                frames=rec.frames("recv", RECV_LINE),
                done=False,
            )
            break
        name = mine[1] if subgroups and i % 4 == 3 and i < entries else "0"
        desc, members = groups[name]
        op, line, numel = SCHEDULE[seqs[name] % len(SCHEDULE)] if name == "0" else SUBGROUP_OP
        dtype = "Float"
        if divergence == "extra" and rank == culprit and i == entries // 2:
            # one more all_reduce, from a retry branch (one more frame of the user's)
            seqs[name] += 1
            sizes = rec.sizes(1)
            rec.add(
                pg=(name, desc),
                seq=seqs[name],
                p2p_seq=0,
                name="nccl:all_reduce",
                inp=sizes,
                out=sizes,
                dtype="Float",
                frames=rec.frames("all_reduce", ODD_LINE, retry=True),
                done=True,
            )
        if last and rank == culprit:
            if divergence == "missing":
                break
            if divergence == "op":
                op, line = ("all_reduce" if op == "all_gather" else "all_gather"), ODD_LINE
            elif divergence == "shape":
                numel += 1
            elif divergence == "dtype":
                dtype = "BFloat16"
        seqs[name] += 1
        n = len(members)
        inp = rec.sizes(n, numel) if op == "reduce_scatter" else rec.sizes(numel)
        out = rec.sizes(n, numel) if op == "all_gather" else rec.sizes(numel)
        rec.add(
            pg=(name, desc),
            seq=seqs[name],
            p2p_seq=0,
            name=f"nccl:{op}",
            inp=inp,
            out=out,
            dtype=dtype,
            frames=rec.frames(op, line, variant=(i // len(SCHEDULE)) % 2),
            done=not (hang and i == entries - 1 + other_half),
        )
    return _dump(rec, groups, seqs)


def _dump(rec: Entries, groups: dict[str, tuple[str, list[int]]], seqs: dict[str, int]) -> dict:
    """A dump of the entries in ``rec``, for the groups in ``seqs`` (with their last numbers)."""
    status = {}
    for name in seqs:
        mine = [e for e in rec.out if e["process_group"][0] == name and not e["is_p2p"]]
        done = [e["collective_seq_id"] for e in mine if e["retired"]]
        status[name] = {
            "last_enqueued_collective": seqs[name],
            "last_started_collective": seqs[name],
            "last_completed_collective": max(done, default=0),
        }
    return {
        "version": "2.10",
        "comm_lib_version": "2.21.5",
        "pg_config": {
            name: {"name": name, "desc": groups[name][0], "ranks": str(groups[name][1])}
            for name in seqs
        },
        "pg_status": status,
        "entries": rec.out,
    }


def build_tp_dump(rank: int, *, world: int, steps: int, culprit: int | None) -> dict[str, Any]:
    """``tp_skip``: tensor-parallel pairs inside the world group, one rank skipping a tp call."""
    if world != 4 or culprit not in range(world):
        raise ValueError("tp_skip is 4 ranks (tp0 = 0, 1 and tp1 = 2, 3) with a culprit rank")
    partner = culprit ^ 1
    tp = "1" if rank < 2 else "2"
    groups = {"0": ("default_pg", [0, 1, 2, 3]), "1": ("tp0", [0, 1]), "2": ("tp1", [2, 3])}
    rec = Entries()
    seqs = {"0": 0, tp: 0}
    for step in range(1, steps + 1):
        last = step == steps
        for name, line in ((tp, TP_LINE), ("0", WORLD_LINE)):
            if last and rank == culprit and name == tp:
                continue  # the skipped call
            seqs[name] += 1
            waits = last and (name == "0" or rank == partner)
            sizes = rec.sizes(256)
            rec.add(
                pg=(name, groups[name][0]),
                seq=seqs[name],
                p2p_seq=0,
                name="nccl:all_reduce",
                inp=sizes,
                out=sizes,
                dtype="Float",
                frames=rec.frames("all_reduce", line),
                done=not waits,
            )
            if waits:
                break
    return _dump(rec, groups, seqs)


def torch_pickle(obj: Any) -> bytes:
    """``obj`` pickled as torch's recorder pickles a dump (``torch::jit::Pickler``, protocol 2),
    byte for byte: every text stored once (its first occurrence memoized, the others referring
    to it), a list, dict or tuple referred to from more than one place (a frame dict, which
    every entry's stack shares) memoized after its items, every other container written anew;
    lists and dicts always within MARK .. APPENDS/SETITEMS; the top-level dict memoized last.
    The Python pickler memoizes every container, before its items: a different layout, which a
    reader must handle too but is not what torch writes."""
    refs: dict[int, int] = {}
    stack = [obj]
    while stack:  # how often each container is referred to (torch: its use count)
        v = stack.pop()
        if isinstance(v, (list, dict, tuple)):
            refs[id(v)] = refs.get(id(v), 0) + 1
            if refs[id(v)] == 1:
                stack.extend(v.values() if isinstance(v, dict) else v)
    out = bytearray(b"\x80\x02")
    texts: dict[str, int] = {}
    shared: dict[int, int] = {}
    memo = 0

    def put() -> int:
        nonlocal memo
        out.extend(b"q" + bytes([memo]) if memo < 256 else b"r" + memo.to_bytes(4, "little"))
        memo += 1
        return memo - 1

    def get(at: int) -> None:
        out.extend(b"h" + bytes([at]) if at < 256 else b"j" + at.to_bytes(4, "little"))

    def write(v: Any) -> None:
        if isinstance(v, (list, dict, tuple)) and id(v) in shared:
            return get(shared[id(v)])
        if v is None:
            out.extend(b"N")
        elif isinstance(v, bool):
            out.extend(b"\x88" if v else b"\x89")
        elif isinstance(v, int):
            if 0 <= v < 256:
                out.extend(b"K" + bytes([v]))
            elif 0 <= v < 65536:
                out.extend(b"M" + v.to_bytes(2, "little"))
            elif -(2**31) <= v < 2**31:
                out.extend(b"J" + v.to_bytes(4, "little", signed=True))
            else:
                out.extend(b"\x8a\x08" + v.to_bytes(8, "little", signed=True))
        elif isinstance(v, float):
            out.extend(b"G" + struct.pack(">d", v))
        elif isinstance(v, str):
            if v in texts:
                return get(texts[v])
            data = v.encode("utf-8", "surrogatepass")
            out.extend(b"X" + len(data).to_bytes(4, "little") + data)
            texts[v] = put()
        elif isinstance(v, tuple) and len(v) <= 3:
            for item in v:
                write(item)
            out.extend(b")\x85\x86\x87"[len(v) : len(v) + 1])
        elif isinstance(v, tuple):
            out.extend(b"(")
            for item in v:
                write(item)
            out.extend(b"t")
        elif isinstance(v, list):
            out.extend(b"](")
            for item in v:
                write(item)
            out.extend(b"e")
        elif isinstance(v, dict):
            out.extend(b"}(")
            for key, item in v.items():
                write(key)
                write(item)
            out.extend(b"u")
        else:
            raise TypeError(f"torch's recorder writes no {type(v).__name__}")
        if isinstance(v, (list, dict, tuple)) and (refs[id(v)] > 1 or v is obj):
            shared[id(v)] = put()

    write(obj)
    return bytes(out + b".")


def write_dumps(
    out: Path,
    *,
    world: int,
    entries: int,
    culprit: int | None = None,
    divergence: str = "missing",
    subgroups: bool = False,
    drop: tuple[int, ...] | list[int] = (),
    prefix: str = PREFIX,
    link: bool = False,
) -> list[Path]:
    """Write one dump per rank (except ``drop``) into ``out``; return the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    args = {"world": world, "entries": entries, "culprit": culprit, "divergence": divergence}
    args["subgroups"] = subgroups
    healthy: dict[tuple[str, ...], Path] = {}
    # Ranks whose dumps are identical: those outside the culprit and p2p pair, same subgroup.
    special = {culprit, 0, 1} if divergence == "p2p_cycle" else {culprit}
    if divergence == "tp_skip":
        special = set(range(world))
    paths = []
    for rank in range(world):
        path = out / f"{prefix}{rank}"
        paths.append(path)
        if rank in drop:
            continue
        key = tuple(n for n, (_, members) in _groups(world, subgroups).items() if rank in members)
        if rank not in special and key in healthy:
            if link:
                if path.exists():
                    path.unlink()
                os.link(healthy[key], path)
            else:
                shutil.copyfile(healthy[key], path)
            continue
        data = torch_pickle(build_dump(rank, **args))
        path.write_bytes(data)
        if rank not in special:
            healthy[key] = path
    return [p for i, p in enumerate(paths) if i not in drop]


_MISSING = re.compile(r"missing ranks: \{([\d, ]+)\}")
_CULPRIT = re.compile(r"Culprit rank (\d+)")


def torch_culprits(text: str) -> list[int]:
    """The ranks torch's analyzer blames first: missing ranks, else the culprit of an error."""
    for line in text.splitlines():
        m = _MISSING.search(line)
        if m:
            return sorted(int(r) for r in m.group(1).split(","))
        m = _CULPRIT.search(line)
        if m:
            return [int(m.group(1))]
    return []


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=Path, help="folder to write the dumps into")
    parser.add_argument("--fixtures", action="store_true", help="regenerate the test fixtures")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--entries", type=int, default=20)
    parser.add_argument("--culprit", type=int, default=None)
    parser.add_argument("--divergence", choices=DIVERGENCES, default="missing")
    parser.add_argument("--subgroups", action="store_true")
    parser.add_argument("--link", action="store_true", help="hard-link identical dumps")
    args = parser.parse_args(argv)
    if args.fixtures:
        here = Path(__file__).resolve().parent
        for name, spec in FIXTURES.items():
            target = here / name
            shutil.rmtree(target, ignore_errors=True)
            write_dumps(target, **spec)
            print(f"wrote {target.relative_to(here)}")
        return
    if args.out is None:
        parser.error("give an output folder, or --fixtures")
    write_dumps(
        args.out,
        world=args.ranks,
        entries=args.entries,
        culprit=args.culprit,
        divergence=args.divergence,
        subgroups=args.subgroups,
        link=args.link,
    )


if __name__ == "__main__":
    main()
