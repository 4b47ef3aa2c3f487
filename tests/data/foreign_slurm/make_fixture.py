"""Regenerate tests/data/foreign_slurm/ and tests/data/fr_versions/ (run from the repository root).

``foreign_slurm/`` is what a user copies from a 4-rank NCCL job on two SLURM nodes (no GPU here,
so these files are built to follow the real formats of reference/artifacts.md line for line):

- ``slurm-4242.out``: srun's output, torch's ``[rankN]:`` prefixes, NCCL lines mixed in, the
  watchdog timeout sequence on ranks 0, 1, 3 and a CUDA OOM on rank 2, torchrun's summary;
- ``nccl.<host>.<pid>.log``: one NCCL_DEBUG_FILE per process (``%h.%p``), no rank in the name;
- ``nccl_trace_rank_<r>`` / ``comm_lib_trace_rank_3``: flight-recorder dumps in the NCCL layout
  (pickles of versions 2.10, 2.7, 2.5 and a JSON 2.10 dump); rank 2 never issued the last
  all_reduce;
- ``invalid_ordinal.err``: the text torch prints for a bad ``cuda:<n>``.

Real captures, made here with plain ``python`` (paths rewritten to /home/user/...):

- ``env_missing.err``: ``init_process_group("gloo")`` without the torchrun environment;
- ``address_in_use.err``: the rendezvous port already taken;
- ``rank2.pyspy.json``: ``py-spy dump --json`` of a process blocked in a gloo barrier.

``fr_versions/`` holds one dump per format version (2.3, 2.4, 2.5, 2.7, 2.10; pickle and JSON).

    python tests/data/foreign_slurm/make_fixture.py
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
VERSIONS = HERE.parent / "fr_versions"
HOSTS = {0: ("gpu-a01", 41230), 1: ("gpu-a01", 41247), 2: ("gpu-a02", 5120), 3: ("gpu-a02", 5137)}
T0 = 1_767_344_000_000_000_000
TORCH = "/opt/conda/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
TRAIN = "/home/user/job/train.py"

#: (op, line of train.py, input size, output size) of the world group's schedule.
SCHEDULE = [
    ("all_reduce", 41, [[4096]], [[4096]]),
    ("all_gather_into_tensor", 44, [[1024]], [[4096]]),
    ("reduce_scatter_tensor", 47, [[4096]], [[1024]]),
]
NCCL_NAME = {
    "all_gather_into_tensor": "_allgather_base",
    "reduce_scatter_tensor": "_reduce_scatter_base",
}


# --- flight-recorder dumps ---------------------------------------------------------------------
def entries(
    rank: int, count: int, *, version: str, frames: bool, in_flight: bool
) -> list[dict[str, Any]]:
    """``count`` collectives; with ``in_flight`` the last one started and never completed."""
    out = []
    for i in range(count):
        op, line, size_in, size_out = SCHEDULE[i % len(SCHEDULE)]
        done = i < count - 1 or not in_flight
        created = T0 + i * 5_000_000 + rank * 1000
        entry: dict[str, Any] = {
            "record_id": i,
            "pg_id": 0,
            "process_group": ("0", "default_pg"),
            "collective_seq_id": i + 1,
            "p2p_seq_id": 0,
            "op_id": i + 1,
            "profiling_name": f"nccl:{NCCL_NAME.get(op, op)}",
            "time_created_ns": created,
            "input_sizes": size_in,
            "input_dtypes": ["Float"],
            "output_sizes": size_out,
            "output_dtypes": ["Float"],
            "state": "completed" if done else "started",
            "time_discovered_started_ns": created + 20_000,
            "time_discovered_completed_ns": created + 900_000 if done else None,
            "retired": done,
            "timeout_ms": 600000,
            "is_p2p": False,
        }
        if done:
            entry["duration_ms"] = 0.85
        if version == "2.10":
            entry["thread_id"] = "140233721579328"
            entry["thread_name"] = "pt_main_thread"
        if frames:
            entry["frames"] = [
                {"name": op, "filename": TORCH, "line": 3245},
                {"name": "train_step", "filename": TRAIN, "line": line},
                {"name": "<module>", "filename": TRAIN, "line": 88},
            ]
        out.append(entry)
    return out


def dump(
    rank: int, count: int, *, version: str, frames: bool = True, in_flight: bool = True
) -> dict[str, Any]:
    last = count  # collective_seq_id of the last entry
    data: dict[str, Any] = {
        "version": version,
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}},
        "pg_status": {
            "0": {
                "last_enqueued_collective": last,
                "last_started_collective": last,
                "last_completed_collective": last - 1 if in_flight else last,
            }
        },
        "entries": entries(rank, count, version=version, frames=frames, in_flight=in_flight),
    }
    if version == "2.7":
        data["nccl_version"] = "2.21.5"
    if version == "2.10":
        data["comm_lib_version"] = "2.21.5"
    return data


def as_json(data: dict[str, Any]) -> bytes:
    """What _dump_nccl_trace_json writes: no frames, 0 for unknown times, numbers in
    pg_status as strings, no 'entries' key when there are none."""
    out = json.loads(json.dumps({k: v for k, v in data.items() if k != "entries"}))
    out["pg_status"] = {
        pg: {k: str(v) for k, v in status.items()} for pg, status in data["pg_status"].items()
    }
    rows = []
    for entry in data.get("entries", []):
        row = {k: v for k, v in entry.items() if k != "frames"}
        row["process_group"] = list(row["process_group"])
        for key in ("time_discovered_started_ns", "time_discovered_completed_ns"):
            row[key] = row[key] or 0
        rows.append(row)
    if rows:
        out["entries"] = rows
    return json.dumps(out, sort_keys=True).encode()


def write_dumps() -> None:
    # Rank 2 never issues the 7th collective: its dump ends one record earlier.
    (HERE / "nccl_trace_rank_0").write_bytes(pickle.dumps(dump(0, 7, version="2.10"), protocol=2))
    (HERE / "nccl_trace_rank_1").write_bytes(pickle.dumps(dump(1, 7, version="2.7"), protocol=2))
    stuck = dump(2, 6, version="2.5", in_flight=False)
    (HERE / "nccl_trace_rank_2").write_bytes(pickle.dumps(stuck, protocol=2))
    (HERE / "comm_lib_trace_rank_3").write_bytes(as_json(dump(3, 7, version="2.10")))
    VERSIONS.mkdir(exist_ok=True)
    for version in ("2.3", "2.4", "2.5", "2.7", "2.10"):
        data = dump(0, 3, version=version)
        (VERSIONS / f"v{version}_rank_0.pkl").write_bytes(pickle.dumps(data, protocol=2))
        (VERSIONS / f"v{version}_rank_0.json").write_bytes(as_json(data))
    empty = dump(1, 0, version="2.10")
    (VERSIONS / "no_entries_rank_1.json").write_bytes(as_json(empty))


# --- NCCL logs ---------------------------------------------------------------------------------
def nccl_lines(rank: int, *, dev: int) -> list[str]:
    host, pid = HOSTS[rank]
    head = f"{host}:{pid}:{pid} [{dev}]"
    side = f"{host}:{pid}:{pid + 52} [{dev}]"
    comm = f"0x55d4c8a0{rank:04x}"
    lines = [
        "NCCL version 2.21.5+cuda12.4",
        f"{head} NCCL INFO Bootstrap : Using eth0:10.0.1.{9 + rank}<0>",
        f"{head} NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using internal implementation",
        f"{head} NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB eth0:10.0.1.{9 + rank}<0>",
        f"{head} NCCL INFO Using network IB",
        f"{head} NCCL INFO ncclCommInitRank comm {comm} rank {rank} nranks 4 cudaDev {dev} nvmlDev {dev} busId {dev + 1}b000 commId 0x996ee6f117cb8e1e - Init START",
        f"{side} NCCL INFO Channel 00/02 :    0   1   2   3",
        f"{side} NCCL INFO Trees [0] {(rank + 1) % 4}/-1/-1->{rank}->{(rank + 3) % 4} [1] -1/-1/-1->{rank}->{(rank + 3) % 4}",
        f"{side} NCCL INFO Channel 00/0 : {rank}[{dev + 1}b000] -> {(rank + 1) % 4}[{dev + 1}b000] [send] via NET/IB/0",
        f"{side} NCCL INFO Connected all rings",
        f"{side} NCCL INFO Connected all trees",
        f"{side} NCCL INFO 2 coll channels, 0 nvls channels, 2 p2p channels, 2 p2p channels per peer",
        f"{head} NCCL INFO comm {comm} rank {rank} nranks 4 cudaDev {dev} nvmlDev {dev} busId {dev + 1}b000 commId 0x996ee6f117cb8e1e - Init COMPLETE",
    ]
    if rank == 3:
        lines += [
            "",
            f"[2026-01-02 10:11:12] {host}:{pid}:{pid + 61} [{dev}] transport/net.cc:1143 NCCL WARN Socket recv failed while polling for opId=0x7fb582222f90",
            f"{host}:{pid}:{pid + 61} [{dev}] NCCL INFO transport/net.cc:288 -> 3",
            "",
            f"[2026-01-02 10:11:13] {host}:{pid}:{pid + 61} [{dev}] proxy.cc:1529 (ncclProxyProgress) NCCL WARN [Proxy Service 3] Failed to execute operation Connect from rank 3, retcode 3",
        ]
    return lines


def write_nccl_logs() -> None:
    for rank, (host, pid) in HOSTS.items():
        (HERE / f"nccl.{host}.{pid}.log").write_text(
            "\n".join(nccl_lines(rank, dev=rank % 2)) + "\n"
        )


WATCHDOG = """\
[rank{r}]:[E102 10:21:53.792630246 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=4096, NumelOut=4096, Timeout(ms)=600000) ran for 600086 milliseconds before timing out.
[rank{r}]:[E102 10:21:53.792772442 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank {r}] Exception (either an error or timeout) detected by watchdog at work: 7, last enqueued NCCL work: 7, last completed NCCL work: 6.
[rank{r}]:[E102 10:21:53.792780659 ProcessGroupNCCL.cpp:1834] [PG ID 0 PG GUID 0(default_pg) Rank {r}] Timeout at NCCL work: 7, last enqueued NCCL work: 7, last completed NCCL work: 6.
[rank{r}]:[E102 10:21:53.792790830 ProcessGroupNCCL.cpp:630] [Rank {r}] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.
[rank{r}]:[E102 10:21:53.792795153 ProcessGroupNCCL.cpp:636] [Rank {r}] To avoid data inconsistency, we are taking the entire process down."""

OOM = """\
[rank2]: Traceback (most recent call last):
[rank2]:   File "/home/user/job/train.py", line 40, in train_step
[rank2]:     out = model(batch)
[rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.15 GiB of which 10.81 MiB is free. Including non-PyTorch memory, this process has 79.13 GiB memory in use. Of the allocated memory 77.02 GiB is allocated by PyTorch, and 1.21 GiB is reserved by PyTorch but unallocated."""

SUMMARY = """\
Traceback (most recent call last):
  File "/opt/conda/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\x20
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-01-02_10:21:55
  host      : gpu-a02
  rank      : 3 (local_rank: 1)
  exitcode  : -6 (pid: 5137)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 5137
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-01-02_10:11:40
  host      : gpu-a02
  rank      : 2 (local_rank: 0)
  exitcode  : 1 (pid: 5120)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================"""

INVALID_ORDINAL = """\
Traceback (most recent call last):
  File "/home/user/job/train.py", line 12, in <module>
    torch.cuda.set_device(int(os.environ["RANK"]))
torch.AcceleratorError: CUDA error: invalid device ordinal
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
For debugging consider passing CUDA_LAUNCH_BLOCKING=1
Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.
"""


def write_slurm_log() -> None:
    parts = ["+ srun torchrun --nnodes 2 --nproc-per-node 2 train.py"]
    parts += nccl_lines(0, dev=0)[:3]
    parts += [f"[rank{r}]:step 100 loss 2.3117" for r in range(4)]
    parts.append(OOM)
    parts += [WATCHDOG.format(r=r) for r in (0, 1, 3)]
    parts.append(SUMMARY)
    (HERE / "slurm-4242.out").write_text("\n".join(parts) + "\n")
    (HERE / "invalid_ordinal.err").write_text(INVALID_ORDINAL)


# --- real captures -----------------------------------------------------------------------------
def sanitise(text: str) -> str:
    for old, new in sorted(
        {
            sys.prefix: "/home/user/venv",
            sys.base_prefix: "/usr/local",
            sysconfig.get_paths()["stdlib"]: "/usr/local/lib/python3.11",
            tempfile.gettempdir(): "/home/user",
        }.items(),
        key=lambda kv: -len(kv[0]),
    ):
        text = text.replace(old, new)
    return text


def plain_python(code: str, env: dict[str, str]) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp, "train.py")
        script.write_text(code)
        clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
        proc = subprocess.run(
            [sys.executable, str(script)], env={**clean, **env}, capture_output=True, text=True
        )
        return sanitise(proc.stderr.replace(tmp, "/home/user/job"))


def write_real_errors() -> None:
    code = 'import torch.distributed as dist\n\ndist.init_process_group("gloo")\n'
    (HERE / "env_missing.err").write_text(plain_python(code, {}))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": "0", "WORLD_SIZE": "1"}
        (HERE / "address_in_use.err").write_text(plain_python(code, env))


BLOCKED = """\
import os, time
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    dist.barrier()
time.sleep(30)
"""


def write_pyspy_json() -> None:
    pyspy = Path(sys.executable).with_name("py-spy")
    with tempfile.TemporaryDirectory() as tmp, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
        s.close()
        script = Path(tmp, "train.py")
        script.write_text(BLOCKED)
        procs = [
            subprocess.Popen(
                [sys.executable, str(script)],
                env={
                    **os.environ,
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": port,
                    "RANK": str(r),
                    "WORLD_SIZE": "2",
                },
            )
            for r in range(2)
        ]
        try:
            out = ""
            deadline = time.monotonic() + 120
            while '"barrier"' not in out and time.monotonic() < deadline:
                time.sleep(1)  # until rank 0 is inside the barrier
                out = subprocess.run(
                    [str(pyspy), "dump", "--json", "--pid", str(procs[0].pid)],
                    capture_output=True,
                    text=True,
                ).stdout
        finally:
            for p in procs:
                p.kill()
                p.wait()
        (HERE / "rank2.pyspy.json").write_text(sanitise(out.replace(tmp, "/home/user/job")))


def main() -> None:
    write_dumps()
    write_nccl_logs()
    write_slurm_log()
    write_real_errors()
    write_pyspy_json()


if __name__ == "__main__":
    main()
