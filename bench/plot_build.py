"""Build time of every plot and grouped table for a 1024-rank hang (requirement: each under 2 s).

Synthetic tables in the schemas of :mod:`rankscope.schema` (built with ``schema.conform``): every
rank makes ``--calls`` collectives on the world group and on its group of 8; one rank (the
culprit) enters a barrier where the others enter an all_reduce; stacks, probe events and NCCL
logs to match. Prints each plot's build time (best of ``--repeats``), the size of its JSON, and
the ratio of the time to the 2 s budget.

    python bench/plot_build.py [--ranks 1024] [--calls 200] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from rankscope import plot, schema

BUDGET_S = 2.0
CULPRIT = 37
T0 = 1.8e9
TP = 8  # ranks per tensor-parallel group


def collectives(n_ranks: int, n_calls: int, *, culprit: int = CULPRIT) -> pd.DataFrame:
    """Every rank's calls: 3 of 4 on the world group, 1 of 4 on its group of 8; the last call of
    every rank is in flight on the world group, and the culprit's is a barrier."""
    rank = np.repeat(np.arange(n_ranks), n_calls)
    i = np.tile(np.arange(n_calls), n_ranks)
    last = i == n_calls - 1
    tp = (i % 4 == 3) & ~last
    pg = np.where(tp, (rank // TP + 1).astype(str), "0")
    op = np.where(tp, "all_gather", np.where(i % 10 == 0, "broadcast", "all_reduce"))
    op = np.where(last & (rank == culprit), "barrier", op)
    frame = pd.DataFrame({"rank": rank, "pg": pg})
    seq = frame.groupby(["rank", "pg"]).cumcount().to_numpy() + 1
    rng = np.random.default_rng(0)
    start = T0 + i * 0.05 + rng.uniform(0, 0.01, len(i))
    end = np.where(last, np.nan, start + rng.uniform(0.005, 0.04, len(i)))
    group = (rank // TP) * TP
    members = np.array([",".join(map(str, range(g, g + TP))) for g in range(0, n_ranks, TP)])
    line = np.where(op == "barrier", 31, np.where(tp, 24, 20))
    return schema.conform(
        "collectives",
        pd.DataFrame(
            {
                "rank": rank,
                "coll_id": i + 1,
                "pg": pg,
                "pg_desc": np.where(tp, "tp", "default_pg"),
                "pg_ranks": np.where(tp, members[group // TP], None),
                "pg_size": np.where(tp, TP, n_ranks),
                "seq": seq,
                "op": op,
                "shapes": np.where(tp, "[[1024]]", "[[4096, 1024]]"),
                "dtypes": '["bfloat16"]',
                "async_op": False,
                "file": "/home/user/train.py",
                "line": line,
                "func": "step",
                "site": pd.Series(line).map("train.py:{}".format).to_numpy(),
                "t_start_s": start,
                "t_end_s": end,
                "duration_s": end - start,
                "completed": ~last,
                "ok": np.where(last, None, True),
            }
        ),
    )


def events(calls: pd.DataFrame, *, beats: int = 10) -> pd.DataFrame:
    """The probe's events behind ``calls``: start, enter and exit per call, heartbeats, steps."""
    rank = calls["rank"].to_numpy(dtype=np.int64)
    ranks = np.unique(rank)
    t_first = calls.groupby("rank")["t_start_s"].min().to_numpy(dtype=float)
    t_last = calls.groupby("rank")["t_start_s"].max().to_numpy(dtype=float)
    done = calls[calls["completed"].to_numpy(dtype=bool)]
    steps = calls[(calls["coll_id"] % 20 == 0).to_numpy(dtype=bool)]
    beat_t = np.linspace(t_first, t_last, beats).T.ravel()
    parts = [
        pd.DataFrame({"rank": ranks, "ev": "start", "t_s": t_first - 1.0}),
        pd.DataFrame({"rank": rank, "ev": "enter", "t_s": calls["t_start_s"], "op": calls["op"]}),
        pd.DataFrame({"rank": done["rank"], "ev": "exit", "t_s": done["t_end_s"], "ok": True}),
        pd.DataFrame({"rank": np.repeat(ranks, beats), "ev": "heartbeat", "t_s": beat_t}),
        pd.DataFrame(
            {
                "rank": steps["rank"],
                "ev": "step",
                "t_s": steps["t_start_s"],
                "step": steps["coll_id"] // 20,
            }
        ),
    ]
    frame = pd.concat(parts, ignore_index=True).sort_values(["rank", "t_s"], kind="stable")
    return schema.conform("events", frame)


def stacks(
    n_ranks: int, *, depth: int = 25, culprit: int = CULPRIT
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ``stacks`` and ``stack_summary`` of one capture: every rank in all_reduce under
    ``step``, the culprit in a barrier."""
    rank = np.repeat(np.arange(n_ranks), depth)
    d = np.tile(np.arange(depth), n_ranks)
    odd = rank == culprit
    func = np.where(
        d == 0,
        np.where(odd, "barrier", "all_reduce"),
        np.where(d == 1, "step", "f" + (depth - d).astype(str)),
    )
    file = np.where(
        d == 0, "/site-packages/torch/distributed/distributed_c10d.py", "/home/user/train.py"
    )
    line = np.where(d == 1, np.where(odd, 31, 20), 100 + d)
    frames = schema.conform(
        "stacks",
        pd.DataFrame(
            {
                "rank": rank,
                "capture_id": 1,
                "capture": 0,
                "t_s": T0 + 20,
                "tool": "faulthandler",
                "thread": "0x7f00",
                "is_current": True,
                "depth": d,
                "func": func,
                "file": file,
                "line": line,
                "is_user": d > 0,
                "source": "evidence/capture-1/rank.stacks.txt",
            }
        ),
    )
    ranks = np.arange(n_ranks)
    line_r = np.where(ranks == culprit, 31, 20)
    summary = schema.conform(
        "stack_summary",
        pd.DataFrame(
            {
                "rank": ranks,
                "capture_id": 1,
                "capture": 0,
                "t_s": T0 + 20,
                "tool": "faulthandler",
                "thread": "0x7f00",
                "func": "step",
                "file": "/home/user/train.py",
                "line": line_r,
                "site": pd.Series(line_r).map("train.py:{}".format).to_numpy(),
                "waiting_in": np.where(ranks == culprit, "barrier", "all_reduce"),
            }
        ),
    )
    return frames, summary


def nccl(
    n_ranks: int, *, lines: int = 50, culprit: int = CULPRIT
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """NCCL INFO lines, one WARN from the culprit, and two communicators per rank of which the
    culprit's second never completes."""
    rank = np.repeat(np.arange(n_ranks), lines)
    no = np.tile(np.arange(1, lines + 1), n_ranks)
    warn = (rank == culprit) & (no == lines)
    log = schema.conform(
        "nccl",
        pd.DataFrame(
            {
                "rank": rank,
                "host": "node" + (rank // 8).astype(str),
                "pid": 1000 + rank,
                "level": np.where(warn, "WARN", "INFO"),
                "message": np.where(warn, "NET/Socket : peer closed", "Bootstrap : Using eth0"),
                "source": "ranks/nccl.log",
                "line_no": no,
            }
        ),
    )
    r = np.repeat(np.arange(n_ranks), 4)
    k = np.tile(np.arange(4), n_ranks)
    keep = ~((r == culprit) & (k == 3))
    comms = schema.conform(
        "nccl_comms",
        pd.DataFrame(
            {
                "rank": r,
                "comm": "0x55d4c8a0b2c0",
                "comm_id": np.where(k < 2, "0xworld", "0xtp" + (r // TP).astype(str)),
                "nccl_rank": np.where(k < 2, r, r % TP),
                "nranks": np.where(k < 2, n_ranks, TP),
                "state": np.where(k % 2 == 0, "START", "COMPLETE"),
                "nccl_version": "2.21.5+cuda12.4",
                "source": "ranks/nccl.log",
                "line_no": np.array([5, 9, 20, 28])[k],
            }
        )[keep],
    )
    return comms, log


def ranks(n_ranks: int, *, culprit: int = CULPRIT) -> pd.DataFrame:
    """Every rank's row: alive, but the culprit, stopped by SIGTERM, and one rank in eight that
    raised."""
    rank = np.arange(n_ranks)
    code = np.where(rank == culprit, -15, np.where(rank % 8 == 3, 1, None))
    return schema.conform(
        "ranks",
        pd.DataFrame(
            {
                "rank": rank,
                "pid": 1000 + rank,
                "host": "node" + (rank // 8).astype(str),
                "local_rank": rank % 8,
                "started_s": T0 - 1.0,
                "exit_code": code,
                "signal": np.where(rank == culprit, "SIGTERM", None),
                "end_reason": np.where(
                    rank == culprit, "SIGTERM", np.where(pd.isna(code), None, "exception")
                ),
            }
        ),
    )


def figures(n_ranks: int, n_calls: int) -> dict[str, Callable[[], go.Figure | pd.DataFrame]]:
    """Each plot of a synthetic run, and each table the results grid groups, ready to build."""
    calls = collectives(n_ranks, n_calls)
    evs = events(calls)
    frames, summary = stacks(n_ranks)
    comms, log = nccl(n_ranks)
    people = ranks(n_ranks)
    culprits = [CULPRIT]
    divergence = {"pg": "0", "seq": int(calls[calls["rank"] == 0]["pg"].eq("0").sum())}
    return {
        "rank_timeline": lambda: plot.rank_timeline(
            calls, culprit_ranks=culprits, divergence=divergence
        ),
        "sequence_ladder": lambda: plot.sequence_ladder(calls, culprit_ranks=culprits),
        "where_is_everyone": lambda: plot.where_is_everyone(summary, culprit_ranks=culprits),
        "merged_stacks": lambda: plot.merged_stacks(frames, summary, culprit_ranks=culprits),
        "progress": lambda: plot.progress(evs, highlight=culprits),
        "nccl_view": lambda: plot.nccl_view(comms, log, culprit_ranks=culprits),
        # the results panel's grid past a few dozen ranks: a row per group of ranks alike
        "ranks (grouped)": lambda: plot.grouped_rows(people, culprits=culprits)[0],
        "calls (grouped)": lambda: plot.grouped_rows(calls, culprits=culprits)[0],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    t = time.perf_counter()
    builders = figures(args.ranks, args.calls)
    print(f"{args.ranks} ranks x {args.calls} calls: tables in {time.perf_counter() - t:.2f} s")
    print(f"{'plot':<20}{'build s':>10}{'json MB':>10}{'/ budget':>10}")
    worst = 0.0
    for name, build in builders.items():
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            fig = build()
            times.append(time.perf_counter() - t)
        best = min(times)
        worst = max(worst, best)
        size = len(fig.to_json()) / 1e6  # a table's rows as the grid gets them
        print(f"{name:<20}{best:>10.3f}{size:>10.1f}{best / BUDGET_S:>10.2f}")
    print(f"slowest: {worst:.3f} s = {worst / BUDGET_S:.2f} of the {BUDGET_S:.0f} s budget")


if __name__ == "__main__":
    main()
