"""NCCL log parsing throughput against ``wc -l`` on the same file, measured in one run.

Writes a ≥ 500 MB NCCL_DEBUG=INFO log (subsystems INIT,COLL: communicator set-up, then one line
per collective, as a long job prints them; 8 processes interleaved, as in a shared SLURM output
file) in a temporary directory, times ``wc -l`` on it and then
:func:`rankscope.collect.read_nccl`, prints both and the throughput ratio, and deletes the file.
The target is a ratio of at least 0.25. Both run with the file in the page cache (a first
``wc -l`` warms it); each is run three times, interleaved, and its best time counts.

    python bench/collect_nccl_logs.py [--mb 520] [--keep DIR]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rankscope.collect.nccl import read_nccl

HOST = "gpu-a017"
RANKS = 8
OPS = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast")


def preamble(rank: int, pid: int) -> list[str]:
    head = f"{HOST}:{pid}:{pid} [{rank}] NCCL INFO"
    comm = f"0x55d4c8a0{rank:04x}"
    lines = [
        f"{head} Bootstrap : Using eth0:10.0.1.9<0>",
        f"{head} NET/Plugin : No plugin found (libnccl-net.so), using internal implementation",
        f"{head} NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB eth0:10.0.1.9<0>",
        f"{head} Using network IB",
        f"{head} ncclCommInitRank comm {comm} rank {rank} nranks {RANKS} cudaDev {rank} "
        f"nvmlDev {rank} busId {rank + 1}b000 commId 0x996ee6f117cb8e1e - Init START",
    ]
    lines += [
        f"{HOST}:{pid}:{pid + 7} [{rank}] NCCL INFO Channel {c:02d}/0 : {rank}[{rank + 1}b000] -> "
        f"{(rank + 1) % RANKS}[{(rank + 1) % RANKS + 1}b000] via P2P/CUMEM/read"
        for c in range(8)
    ]
    lines += [
        f"{head} Connected all rings",
        f"{head} Connected all trees",
        f"{head} comm {comm} rank {rank} nranks {RANKS} cudaDev {rank} nvmlDev {rank} "
        f"busId {rank + 1}b000 commId 0x996ee6f117cb8e1e - Init COMPLETE",
    ]
    return lines


def write_log(path: Path, megabytes: int) -> None:
    pids = [41230 + 17 * r for r in range(RANKS)]
    target = megabytes << 20
    with open(path, "w") as f:
        f.write("NCCL version 2.21.5+cuda12.4\n")
        for rank, pid in enumerate(pids):
            f.write("\n".join(preamble(rank, pid)) + "\n")
        op = 0
        while f.tell() < target:
            block = []
            for _ in range(2000):
                op += 1
                name = OPS[op % len(OPS)]
                for rank, pid in enumerate(pids):
                    block.append(
                        f"{HOST}:{pid}:{pid} [{rank}] NCCL INFO {name}: opCount {op:x} sendbuff "
                        f"0x7f2e4c{op % 4096:06x} recvbuff 0x7f2e4d{op % 4096:06x} count "
                        f"{262144 << (op % 3)} datatype 7 op 0 root 0 comm 0x55d4c8a0{rank:04x} "
                        f"[nranks={RANKS}] stream 0x55d4c8f0{rank:04x}"
                    )
            if op % 100_000 == 0:
                block.append("")
                block.append(
                    f"[2026-01-02 10:11:12] {HOST}:{pids[3]}:{pids[3] + 9} [3] transport/net.cc:1143 "
                    "NCCL WARN Socket recv failed while polling for opId=0x7fb582222f90"
                )
            f.write("\n".join(block) + "\n")


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=520, help="size of the log (default 520)")
    parser.add_argument("--keep", type=Path, help="write the log here and keep it")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs each")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = (args.keep or Path(tmp)) / f"nccl.{HOST}.41230.log"
        t_gen, _ = timed(lambda: write_log(path, args.mb))
        size = path.stat().st_size
        print(f"wrote {size / 2**20:.0f} MiB in {t_gen:.1f} s: {path.name}")

        def wc() -> int:
            out = subprocess.run(
                ["wc", "-l", str(path)], capture_output=True, text=True, check=True
            )
            return int(out.stdout.split()[0])

        wc()  # warm the page cache
        # Interleaved, best of three each: the machine may be shared, and noise only adds time.
        t_wc = t_parse = float("inf")
        for _ in range(args.repeat):
            t_wc = min(t_wc, timed(wc)[0])
            elapsed, table = timed(lambda: read_nccl([path]))
            t_parse = min(t_parse, elapsed)
        n_lines = wc()
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"wc -l:      {n_lines:>10,} lines in {t_wc:6.3f} s ({size / t_wc / 2**20:8.1f} MiB/s)"
        )
        print(
            f"read_nccl:  {len(table):>10,} rows  in {t_parse:6.3f} s "
            f"({size / t_parse / 2**20:8.1f} MiB/s)"
        )
        print(f"throughput ratio (read_nccl / wc -l): {t_wc / t_parse:.3f}   (target >= 0.25)")
        print(f"peak RSS of this process: {rss:.0f} MiB")
        assert table["level"].value_counts()["WARN"] > 0, "the WARN lines were not parsed"


if __name__ == "__main__":
    sys.exit(main())
