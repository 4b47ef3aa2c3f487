"""Flight-recorder loading against a bare ``pickle.load`` loop over the same files, in one run.

Writes 1024 rank dumps x 2000 entries in torch's NCCL layout (format 2.10, every entry with its
stack, pickled as torch's recorder pickles them: ``tests/data/nccl_fr/make_dumps.py``) to a
temporary directory, warms the page cache, then times

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
import importlib.util
import pickle
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from rankscope.collect.flight_recorder import read_flight_recorder

MAKE_DUMPS = Path(__file__).resolve().parent.parent / "tests" / "data" / "nccl_fr" / "make_dumps.py"


def write_dumps(folder: Path, ranks: int, entries: int) -> list[Path]:
    """``ranks`` dumps of a clean run, in torch's own layout (the tests' generator)."""
    spec = importlib.util.spec_from_file_location("make_dumps", MAKE_DUMPS)
    dumps = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(dumps)  # type: ignore[union-attr]
    return dumps.write_dumps(folder, world=ranks, entries=entries, divergence="none")


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
