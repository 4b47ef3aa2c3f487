"""Untrusted input: hostile pickles never run, and no mutated file stops ``load_run``."""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from rankscope.collect import Run, load_run, read_flight_recorder
from rankscope.collect.safe_pickle import UnsafePickleError, loads

DATA = Path(__file__).parent / "data"
HANG = DATA / "gloo_barrier_hang" / "run"
FOREIGN = DATA / "foreign_slurm"


class _Call:
    """Pickles as ``func(*args)``: what an attacker's dump does to whoever unpickles it."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def hostile_pickles(marker: Path) -> dict[str, bytes]:
    """Pickles that would create ``marker`` (or worse) if anything in them were called."""
    command = f"touch {marker}"
    return {
        "os_system": pickle.dumps(_Call(os.system, command)),
        "inside_a_dump": pickle.dumps({"version": "2.10", "entries": [_Call(os.system, command)]}),
        "subprocess": pickle.dumps(_Call(subprocess.call, ["touch", str(marker)])),
        "builtins_exec": pickle.dumps(_Call(exec, f"open({str(marker)!r}, 'w')")),
        "protocol_0_global": f"cos\nsystem\n(S'{command}'\ntR.".encode(),
        "a_class": pickle.dumps(Path("/etc/passwd")),
    }


def test_a_malicious_pickle_never_executes(tmp_path):
    marker = tmp_path / "pwned"
    folder = tmp_path / "dumps"
    folder.mkdir()
    payloads = hostile_pickles(marker)
    for i, data in enumerate(payloads.values()):
        (folder / f"nccl_trace_rank_{i}").write_bytes(data)
        with pytest.raises(UnsafePickleError, match="refused"):
            loads(data)
    run = load_run(folder)
    for name in Run.TABLES:
        run.table(name)
    assert not marker.exists()
    refused = run.problems[run.problems["reader"] == "flight_recorder"]
    assert set(refused["source"]) == {f"nccl_trace_rank_{i}" for i in range(len(payloads))}
    assert refused["reason"].str.contains("refused").all()
    assert run.flight_recorder.empty


@pytest.mark.slow
def test_a_malicious_pickle_in_a_worker_process(tmp_path):
    marker = tmp_path / "pwned"
    (tmp_path / "fr_rank_0.pkl").write_bytes(hostile_pickles(marker)["os_system"])
    shutil.copy(FOREIGN / "nccl_trace_rank_1", tmp_path / "nccl_trace_rank_1")
    fr = read_flight_recorder(
        sorted(tmp_path.glob("*rank*")), problems=(problems := _problems()), workers=2
    )
    assert not marker.exists()
    assert set(fr["rank"]) == {1} and problems.rows[0][0] == "fr_rank_0.pkl"


def _problems():
    from rankscope.collect import Problems

    return Problems()


# --- fuzz ---------------------------------------------------------------------------------------
BASES = {
    "fr_pickle": HANG / "ranks/0/fr.pkl",
    "fr_json": DATA / "gloo_clean/run/ranks/0/fr.json",
    "events": HANG / "ranks/0/events.jsonl",
    "stacks": HANG / "ranks/0/stacks.txt",
    "pyspy": HANG / "evidence/capture-1/rank0.pyspy.txt",
    "pyspy_json": FOREIGN / "rank2.pyspy.json",
    "nccl": FOREIGN / "nccl.gpu-a02.5137.log",
    "log": FOREIGN / "slurm-4242.out",
    "error_json": next((DATA / "gloo_rank_raises/run/logs").rglob("1/error.json")),
    # "ring": made by make_ring, in the test's folder
}
#: Where each kind goes in a run directory (rank r, per file).
PLACES = {
    "fr_pickle": "ranks/{r}/fr.pkl",
    "fr_json": "ranks/{r}/fr.json",
    "events": "ranks/{r}/events.jsonl",
    "stacks": "ranks/{r}/stacks.txt",
    "pyspy": "evidence/capture-1/rank{r}.pyspy.txt",
    "pyspy_json": "evidence/capture-1/rank{r}.pyspy.json",
    "nccl": "ranks/{r}/nccl.log",
    "log": "logs/node0/job_x/attempt_0/{r}/stderr.log",
    "error_json": "logs/node0/job_x/attempt_0/{r}/error.json",
    "ring": "ranks/{r}/calls-4242.ring",
}
#: The same kinds in a plain folder, named as users' copies are.
FOREIGN_NAMES = {
    "fr_pickle": "nccl_trace_rank_{r}",
    "fr_json": "comm_lib_trace_rank_{r}.json",
    "events": "rank{r}.events.jsonl",
    "stacks": "rank{r}.stacks.txt",
    "pyspy": "rank{r}.pyspy.txt",
    "pyspy_json": "rank{r}.pyspy.json",
    "nccl": "nccl.host{r}.{r}.log",
    "log": "slurm-{r}.out",
    "error_json": "error_{r}/error.json",
    "ring": "rank{r}.calls.ring",
}
#: Kinds whose every cut is fatal (documents, and rings, whose size is fixed).
STRUCTURED = {"fr_pickle", "fr_json", "pyspy_json", "error_json", "ring"}


def make_ring(folder: Path) -> Path:
    """A small ring file as the probe writes it: ten calls, the last one in flight."""
    from rankscope.probe._core import _Call, _Ring

    path = folder / "calls-1.ring"
    ring = _Ring(path, rank=0, slots=64)
    for cid in range(1, 11):
        call = _Call(
            cid,
            cid,
            1.8e9 + cid,
            77,
            "all_reduce",
            "0",
            None,
            None,
            None,
            (),
            (),
            False,
            (None,) * 3,
            None,
            1,
        )
        ring.enter(call)
        if cid < 10:
            ring.exit(call, 1.8e9 + cid + 0.5, True)
    ring.map.flush()
    return path


def wrong_types() -> list[tuple[str, bytes]]:
    """Dumps whose fields have the wrong types: every one must be reported, none may raise."""
    good = pickle.loads(BASES["fr_pickle"].read_bytes())  # our own fixture: trusted
    variants = [
        ("entries_str", {**good, "entries": "oops"}),
        ("top_list", [good]),
        ("entries_ints", {**good, "entries": [1, 2, 3]}),
    ]
    out = [(name, pickle.dumps(v)) for name, v in variants]
    out.append(("deep_json", b"[" * 200_000 + b"]" * 200_000))
    out.append(("json_scalar", b"{" + b'"version": 2.10, "entries": {"a": 1}' + b"}"))
    return out


def odd_fields() -> list[bytes]:
    """Dumps with odd values inside entries: loaded (what can be), never raising."""
    good = pickle.loads(BASES["fr_pickle"].read_bytes())
    entry = good["entries"][0]
    odd = [
        {**entry, "record_id": "abc", "process_group": [1, 2, 3], "frames": {"a": 1}},
        {**entry, "input_sizes": {"x": [1]}, "input_dtypes": [True, None], "retired": "yes"},
        {**entry, "profiling_name": ["nccl", "x"], "time_created_ns": 2**80, "state": 7},
        {**entry, "pg_id": 1.5, "timeout_ms": None, "thread_id": 140, "duration_ms": "slow"},
        {**entry, "output_sizes": "[[1, 2]] ' \" injected", "frames": [None, 3, {"line": "x"}]},
    ]
    return [
        pickle.dumps({**good, "entries": [e], "pg_config": {"": {"ranks": "[0, 1; x]"}}})
        for e in odd
    ]


def mutations(rng: random.Random, bases: dict[str, Path]) -> list[tuple[str, bytes, bool]]:
    """(kind, bytes, must be reported) for at least 200 broken files of every kind."""
    out: list[tuple[str, bytes, bool]] = []
    for kind, path in bases.items():
        data = path.read_bytes()
        for _ in range(10):  # truncation: fatal to pickles and JSON documents
            cut = rng.randrange(1, len(data) - 1)
            out.append((kind, data[:cut], kind in STRUCTURED))
        for _ in range(8):  # bit flips
            flipped = bytearray(data)
            for _ in range(rng.randint(1, 12)):
                flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
            out.append((kind, bytes(flipped), False))
        garbage = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 4000)))
        out.append((kind, b"\xff\xfe" + garbage, True))
        binary_inside = data[: len(data) // 2] + b"\x00\xff\xc3\x28" + data[len(data) // 2 :]
        out.append((kind, binary_inside, True))
        out.append((kind, b"", kind in ("fr_pickle", "fr_json")))
        huge = data + b"x" * (3 << 20) + b"\n"  # one 3 MB line
        out.append((kind, huge, kind in STRUCTURED or kind == "events"))
    marker = Path("/nonexistent/rankscope-fuzz-marker")
    out += [("fr_pickle", data, True) for data in hostile_pickles(marker).values()]
    out += [("fr_pickle", data, True) for _, data in wrong_types()]
    out += [("fr_pickle", data, False) for data in odd_fields()]
    return out


def place(root: Path, pattern: str, rank: int, data: bytes) -> str:
    rel = pattern.format(r=rank)
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return rel


@pytest.mark.timeout(60)
@pytest.mark.parametrize("layout", ["rundir", "folder"])
def test_fuzz_no_exception_escapes_load_run(tmp_path, layout):
    rng = random.Random(20261121)
    cases = mutations(rng, {**BASES, "ring": make_ring(tmp_path)})
    assert len(cases) >= 200
    root = tmp_path / layout
    root.mkdir()
    if layout == "rundir":
        (root / "run.json").write_text(json.dumps({"id": "fuzz", "world_size": len(cases)}))
        (root / "launcher.log").write_bytes(b"[default3]:\xff\xfe garbage\n" * 3)
    names = PLACES if layout == "rundir" else FOREIGN_NAMES
    bad = {
        place(root, names[kind], r, data) for r, (kind, data, fatal) in enumerate(cases) if fatal
    }
    run = load_run(root)
    for name in Run.TABLES:
        run.table(name)
    reported = set(run.problems["source"])
    assert bad <= reported, sorted(bad - reported)[:10]
    assert not run.problems["reason"].isna().any()
