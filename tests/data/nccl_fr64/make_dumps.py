"""Write the flight-recorder dumps of a 64-rank NCCL job that froze, one pickle per rank.

The job is 8-way tensor parallel by 8-way data parallel: the world group ``0``, tensor-parallel
groups ``tp0``..``tp7`` (names ``1``..``8``, ranks ``8i..8i+7``) and data-parallel groups
``dp0``..``dp7`` (names ``9``..``16``, ranks ``j, j+8, ..., j+56``), created in that order, as
torch names them. Each training step runs, from ``/srv/job/train.py``::

    line 30  all_reduce      on tp   [4096] float32   (activations)
    line 31  all_gather      on tp   [1024] -> [8, 1024] bfloat16
    line 35  reduce_scatter  on dp   [8, 2048] -> [2048] float32   (gradients)
    line 38  all_reduce      on the world  [1] float32   (loss)

In the last step rank ``CULPRIT`` (37: tp4, dp5) calls ``all_gather`` (line 70) where the rest of
dp5 calls ``reduce_scatter``. A small simulation of blocking collectives decides what every rank
recorded: a collective completes once every member has issued the same call; a rank stays in its
first call that does not. dp5 waits in the mismatched collective; the other ranks of the culprit's
tensor-parallel groups wait for their dp5 member in the next tp collective, and so on.

The dumps have the layout of ``_dump_nccl_trace()`` (format ``2.10``), as in
``tests/data/nccl_fr/make_dumps.py``: ``profiling_name`` ``nccl:<op>``, ``state`` ``completed``
for retired entries and ``started`` for the one in flight. Regenerate (from the repository root;
the output is deterministic)::

    python tests/data/nccl_fr64/make_dumps.py
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from typing import Any


def _small_fixtures() -> Any:
    """``tests/data/nccl_fr/make_dumps.py``, whose entry layout these dumps share."""
    path = Path(__file__).resolve().parent.parent / "nccl_fr" / "make_dumps.py"
    spec = importlib.util.spec_from_file_location("nccl_fr_make_dumps", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


_FR = _small_fixtures()
T0_NS, Entries, torch_pickle = _FR.T0_NS, _FR.Entries, _FR.torch_pickle

PREFIX = "nccl_trace_rank_"
WORLD = 64
TP = 8
STEPS = 2
CULPRIT = 37
ODD_LINE = 70


def groups() -> dict[str, tuple[str, list[int]]]:
    """Group name -> (desc, members), in creation order."""
    out = {"0": ("default_pg", list(range(WORLD)))}
    for i in range(WORLD // TP):
        out[str(1 + i)] = (f"tp{i}", list(range(i * TP, (i + 1) * TP)))
    for j in range(TP):
        out[str(1 + WORLD // TP + j)] = (f"dp{j}", list(range(j, WORLD, TP)))
    return out


def program(rank: int, by_name: dict[str, tuple[str, list[int]]]) -> list[dict[str, Any]]:
    """The calls one rank issues, in order: (group, op, input, output, dtype, line)."""
    tp = next(n for n, (d, m) in by_name.items() if d.startswith("tp") and rank in m)
    dp = next(n for n, (d, m) in by_name.items() if d.startswith("dp") and rank in m)
    calls = []
    for step in range(STEPS):
        last = step == STEPS - 1
        calls.append(dict(pg=tp, op="all_reduce", inp=[4096], out=[4096], dtype="Float", line=30))
        calls.append(
            dict(pg=tp, op="all_gather", inp=[1024], out=[TP, 1024], dtype="BFloat16", line=31)
        )
        if last and rank == CULPRIT:
            calls.append(
                dict(pg=dp, op="all_gather", inp=[2048], out=[TP, 2048], dtype="Float", line=70)
            )
        else:
            calls.append(
                dict(pg=dp, op="reduce_scatter", inp=[TP, 2048], out=[2048], dtype="Float", line=35)
            )
        calls.append(dict(pg="0", op="all_reduce", inp=[1], out=[1], dtype="Float", line=38))
    return calls


def simulate() -> dict[int, list[tuple[dict[str, Any], int, bool]]]:
    """Per rank: (call, its collective_seq_id on its group, completed) for every call it issued."""
    by_name = groups()
    progs = {r: program(r, by_name) for r in range(WORLD)}
    pc = dict.fromkeys(range(WORLD), 0)
    seqs: dict[int, dict[str, int]] = {r: {} for r in range(WORLD)}
    issued: dict[int, list[tuple[dict[str, Any], int, bool]]] = {r: [] for r in range(WORLD)}
    progress = True
    while progress:
        progress = False
        # Every rank issues its next call if it is not already inside one.
        for r in range(WORLD):
            if pc[r] < len(progs[r]) and (not issued[r] or issued[r][-1][2]):
                call = progs[r][pc[r]]
                seqs[r][call["pg"]] = seqs[r].get(call["pg"], 0) + 1
                issued[r].append((call, seqs[r][call["pg"]], False))
        # A collective completes when every member is inside the same call at the same position.
        for r in range(WORLD):
            if not issued[r] or issued[r][-1][2]:
                continue
            call, seq, _ = issued[r][-1]
            members = by_name[call["pg"]][1]
            mine = (call["op"], call["inp"], call["dtype"])
            others = [issued[m][-1] for m in members if issued[m]]
            if len(others) == len(members) and all(
                not done
                and s == seq
                and c["pg"] == call["pg"]
                and (c["op"], c["inp"], c["dtype"]) == mine
                for c, s, done in others
            ):
                for m in members:
                    c, s, _ = issued[m][-1]
                    issued[m][-1] = (c, s, True)
                    pc[m] += 1
                progress = True
    return issued


def build_dump(rank: int, issued: list[tuple[dict[str, Any], int, bool]]) -> dict[str, Any]:
    by_name = groups()
    rec = Entries(t0=T0_NS + rank * 1000)
    for call, seq, done in issued:
        rec.add(
            pg=(call["pg"], by_name[call["pg"]][0]),
            seq=seq,
            p2p_seq=0,
            name=f"nccl:{call['op']}",
            inp=rec.sizes(*call["inp"]),
            out=rec.sizes(*call["out"]),
            dtype=call["dtype"],
            frames=rec.frames(call["op"], call["line"]),
            done=done,
        )
    entries = rec.out
    mine = [n for n, (_, members) in by_name.items() if rank in members]
    status = {}
    for name in mine:
        on = [e for e in entries if e["process_group"][0] == name]
        status[name] = {
            "last_enqueued_collective": max((e["collective_seq_id"] for e in on), default=0),
            "last_started_collective": max((e["collective_seq_id"] for e in on), default=0),
            "last_completed_collective": max(
                (e["collective_seq_id"] for e in on if e["retired"]), default=0
            ),
        }
    return {
        "version": "2.10",
        "comm_lib_version": "2.21.5",
        "pg_config": {
            n: {"name": n, "desc": by_name[n][0], "ranks": str(by_name[n][1])} for n in mine
        },
        "pg_status": status,
        "entries": entries,
    }


def write_dumps(out: Path) -> list[Path]:
    """Write every rank's dump into ``out``; return the paths."""
    out.mkdir(parents=True, exist_ok=True)
    issued = simulate()
    paths = []
    for rank in range(WORLD):
        path = out / f"{PREFIX}{rank}"
        path.write_bytes(torch_pickle(build_dump(rank, issued[rank])))
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    target = Path(args[0]) if args else Path(__file__).resolve().parent / "dumps"
    shutil.rmtree(target, ignore_errors=True)
    written = write_dumps(target)
    print(f"wrote {len(written)} dumps into {target.name}/")


if __name__ == "__main__":
    main()
