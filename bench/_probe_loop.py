"""Worker for probe_overhead.py: times 1-element gloo all_reduces, 2 ranks.

Under the probe (``--mode ab``) it calls torch's own all_reduce, the probe's wrapper and the
probe's Python wrapper in turn, one call each, the order rotating every round, and times every
call. Neighbouring calls see the same machine, so the slow drifts of a shared machine cancel.
Without the probe (``--mode loop``) it times a plain loop. Rank 0 prints one JSON line.
"""

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--mode", choices=("ab", "loop"), required=True)
ap.add_argument("--calls", type=int, default=20000)
args = ap.parse_args()

dist.init_process_group("gloo")
t = torch.ones(1)
clock = time.perf_counter_ns


def summary(ns: list[int]) -> dict:
    """Mean, and mean of the fastest 95 % (a 1-in-20 hiccup of the machine lands on any call)."""
    ordered = sorted(ns)
    kept = ordered[: int(len(ordered) * 0.95)]
    return {"mean_us": statistics.fmean(ns) / 1e3, "trim_us": statistics.fmean(kept) / 1e3}


if args.mode == "loop":
    fn = dist.all_reduce
    for _ in range(2000):
        fn(t)
    dist.barrier()
    start = clock()
    for _ in range(args.calls):
        fn(t)
    out = {"loop_us": (clock() - start) / args.calls / 1e3}
else:
    import rankscope.probe
    from rankscope.probe import _core

    probe = rankscope.probe.current()
    assert probe is not None, "run under rankscope's bootstrap"
    torch_fn = next(fn for _, name, fn in probe._originals if name == "all_reduce")
    arms = {"torch": torch_fn, "probe": dist.all_reduce}
    if _core._fast is not None:  # the same probe with its Python wrapper
        fast, _core._fast = _core._fast, None
        arms["python"] = probe._wrap("all_reduce", torch_fn, None)
        _core._fast = fast
    deadline = time.monotonic() + 30
    while probe._warmup is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if probe._warmup is not None:
        probe._warmup.join()  # steady state: the one-off import of the first dump is paid
    fns, names = list(arms.values()), list(arms)
    times: list[list[int]] = [[] for _ in fns]
    for _ in range(2000):
        for fn in fns:
            fn(t)
    dist.barrier()
    for i in range(args.calls):
        for j in range(len(fns)):
            k = (i + j) % len(fns)
            start = clock()
            fns[k](t)
            times[k].append(clock() - start)
    out = {name: summary(ns) for name, ns in zip(names, times, strict=True)}
    out["c_wrapper"] = _core._fast is not None
if dist.get_rank() == 0:
    print(json.dumps(out))
dist.destroy_process_group()
