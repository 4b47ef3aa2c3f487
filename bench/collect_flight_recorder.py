"""Flight-recorder loading against a bare ``pickle.load`` loop over the same files, in one run.

Writes 1024 rank dumps x 2000 entries in torch's NCCL layout (format 2.10, stack frames shared
between entries as torch's pickler shares them) to a temporary directory, warms the page cache,
then times

- the reference: ``for f in files: pickle.load(open(f, "rb"))`` (one process, results dropped);
- :func:`rankscope.collect.read_flight_recorder` (the compiled scanner, every core, the table;
  ``--workers 1``: in this process, against the one-process loop core for core);

and prints both, their ratio (target: at most 1.5) and the peak memory of this process and of
its worker processes (sampled; the workers are grandchildren, under the forkserver). The files are
deleted at the end.

    python bench/collect_flight_recorder.py [--ranks 1024] [--entries 2000] [--workers N]
"""

from __future__ import annotations

import argparse
import pickle
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from rankscope.collect.flight_recorder import read_flight_recorder

TORCH = "/opt/conda/lib/python3.11/site-packages/torch/distributed/"
OPS = (("all_reduce", [[4096]], [[4096]]), ("_allgather_base", [[1024]], [[8192]]))
OPS += (("_reduce_scatter_base", [[8192]], [[1024]]), ("send 0->1", [[512]], [[512]]))
VARIANTS = 16  # distinct contents; ranks share them round-robin


def make_dump(rank: int, world: int, entries: int) -> dict[str, Any]:
    # A real stack: torch's wrappers, the user's code, then the launcher's frames (about 12).
    outer = [
        {"name": "train_step", "filename": "/home/user/job/train.py", "line": 40},
        {"name": "train", "filename": "/home/user/job/train.py", "line": 71},
        {"name": "<module>", "filename": "/home/user/job/train.py", "line": 88},
        {"name": "_run_code", "filename": "<frozen runpy>", "line": 88},
        {"name": "_run_module_code", "filename": "<frozen runpy>", "line": 98},
        {"name": "run_path", "filename": "<frozen runpy>", "line": 291},
        {
            "name": "main",
            "filename": "/opt/conda/lib/python3.11/site-packages/launch.py",
            "line": 96,
        },
        {"name": "_run_module_as_main", "filename": "<frozen runpy>", "line": 198},
    ]
    frames = [
        [
            {"name": op.split()[0], "filename": TORCH + "distributed_c10d.py", "line": 3245},
            {"name": "wrapper", "filename": TORCH + "c10d_logger.py", "line": 83},
            {"name": "reduce_grads", "filename": "/home/user/job/model.py", "line": 120 + k},
            {"name": "step", "filename": "/home/user/job/model.py", "line": 200},
            *outer,
        ]
        for k, (op, _, _) in enumerate(OPS)
    ]
    t0 = 1_767_344_000_000_000_000 + rank * 1000
    rows = []
    for i in range(entries):
        k = i % len(OPS)
        op, size_in, size_out = OPS[k]
        p2p = op.startswith("send")
        done = i < entries - 1
        rows.append(
            {
                "frames": list(frames[k]),
                "record_id": i,
                "pg_id": 0,
                "process_group": ("0", "default_pg"),
                "collective_seq_id": i + 1,
                "p2p_seq_id": i // len(OPS) if p2p else 0,
                "op_id": i + 1,
                "profiling_name": f"nccl:{op}",
                "time_created_ns": t0 + i * 1_000_000,
                "duration_ms": 0.42 if done else None,
                "input_sizes": size_in,
                "input_dtypes": ["Float"],
                "output_sizes": size_out,
                "output_dtypes": ["Float"],
                "state": "completed" if done else "started",
                "time_discovered_started_ns": t0 + i * 1_000_000 + 5_000,
                "time_discovered_completed_ns": t0 + i * 1_000_000 + 400_000 if done else None,
                "retired": done,
                "timeout_ms": 600000,
                "is_p2p": p2p,
                "thread_id": "140233721579328",
                "thread_name": "pt_main_thread",
            }
        )
    for row in rows:  # as torch's pickle does: None-valued keys are still present
        if row["duration_ms"] is None:
            del row["duration_ms"]
    ranks = ", ".join(map(str, range(world)))
    return {
        "version": "2.10",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": f"[{ranks}]"}},
        "pg_status": {
            "0": {
                "last_enqueued_collective": entries,
                "last_started_collective": entries,
                "last_completed_collective": entries - 1,
            }
        },
        "comm_lib_version": "2.21.5",
        "entries": rows,
    }


def write_dumps(folder: Path, ranks: int, entries: int) -> list[Path]:
    blobs = [pickle.dumps(make_dump(v, ranks, entries), protocol=2) for v in range(VARIANTS)]
    paths = []
    for rank in range(ranks):
        path = folder / f"nccl_trace_rank_{rank}"
        path.write_bytes(blobs[rank % VARIANTS])
        paths.append(path)
    return paths


def bare_loop(paths: list[Path]) -> int:
    n = 0
    for path in paths:
        with open(path, "rb") as f:
            n += len(pickle.load(f)["entries"])
    return n


class PeakRSS:
    """Peak resident memory of this process and, separately, of all its descendants together
    (the loader's worker processes), sampled every 20 ms."""

    def __init__(self) -> None:
        self.own = self.workers = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(0.02):
            total = 0
            for child in me.children(recursive=True):
                try:
                    total += child.memory_info().rss
                except psutil.Error:
                    continue
            self.own = max(self.own, me.memory_info().rss)
            self.workers = max(self.workers, total)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=None, help="default: every core")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs each")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        paths = write_dumps(Path(tmp), args.ranks, args.entries)
        size = sum(p.stat().st_size for p in paths)
        print(
            f"wrote {len(paths)} dumps, {size / 2**20:.0f} MiB, in {time.perf_counter() - t0:.1f} s"
        )
        for path in paths:  # warm the page cache for both contenders
            path.read_bytes()

        # Both contenders, interleaved, three times; the best time of each counts (the
        # machine may be shared, and noise only ever adds time).
        t_ref = t_ours = float("inf")
        base = psutil.Process().memory_info().rss
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            n_ref = bare_loop(paths)
            t_ref = min(t_ref, time.perf_counter() - t0)
            with PeakRSS() as peak:
                t0 = time.perf_counter()
                table = read_flight_recorder(paths, workers=args.workers)
                t_ours = min(t_ours, time.perf_counter() - t0)
            assert len(table) == n_ref, (len(table), n_ref)
        own, workers = (peak.own - base) / 2**20, peak.workers / 2**20
        table_mib = table.memory_usage(deep=True).sum() / 2**20
        print(
            f"bare pickle.load loop:  {n_ref:>10,} entries in {t_ref:6.2f} s (best of {args.repeat})"
        )
        print(
            f"read_flight_recorder:   {len(table):>10,} rows    in {t_ours:6.2f} s (best of {args.repeat})"
        )
        print(
            f"time ratio (read_flight_recorder / pickle.load loop): {t_ours / t_ref:.2f}   (target <= 1.5)"
        )
        print(
            f"peak RSS while loading: this process +{own:.0f} MiB, workers together "
            f"{workers:.0f} MiB; the table itself {table_mib:.0f} MiB"
        )


if __name__ == "__main__":
    sys.exit(main())
