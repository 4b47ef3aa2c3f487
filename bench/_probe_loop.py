"""Worker for probe_overhead.py: times 1-element gloo all_reduces, 2 ranks.

Under the probe (``--mode probe``), once the probe's one-off warm-up is done, two measurements:

  * per call: torch's own all_reduce, the probe's wrapper and the probe's Python wrapper are
    called in turn, one call each, the order rotating every round, and every call is timed.
    Neighbouring calls see the same machine, so the slow drifts of a shared machine cancel.
    The probe thread runs during all arms alike: this is the wrapper's cost alone;
  * in blocks: the probe off (torch's own all_reduce, the probe thread parked) and on (the
    probe's wrapper, the probe thread running: heartbeats, looks, flushes) alternate in
    blocks of ``--block`` calls, the order swapped every pair. Everything the probe does counts.

Without the probe (``--mode loop``) it times a plain loop. Rank 0 prints one JSON line.
"""

import argparse
import json
import statistics
import threading
import time

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--mode", choices=("probe", "loop"), required=True)
ap.add_argument("--calls", type=int, default=20000, help="per-call rotation: calls per arm")
ap.add_argument("--blocks", type=int, default=40, help="pairs of off/on blocks")
ap.add_argument("--block", type=int, default=1000, help="calls per block")
args = ap.parse_args()

dist.init_process_group("gloo")
t = torch.ones(1)
clock = time.perf_counter_ns


def summary(ns: list[int]) -> dict:
    """Mean, and mean of the fastest 95 % (a 1-in-20 hiccup of the machine lands on any call)."""
    ordered = sorted(ns)
    kept = ordered[: int(len(ordered) * 0.95)]
    return {"mean_us": statistics.fmean(ns) / 1e3, "trim_us": statistics.fmean(kept) / 1e3}


class Gate:
    """Stands in for the probe thread's stop event; while closed, the thread sleeps in wait()."""

    def __init__(self, stop: threading.Event):
        self.stop = stop
        self.cond = threading.Condition()
        self.open = True
        self.parked = False

    def is_set(self) -> bool:
        return self.stop.is_set()

    def set(self) -> None:
        self.stop.set()
        self.reopen()

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not self.stop.is_set():
                left = deadline - time.monotonic()
                if self.open and left <= 0:
                    return False
                self.parked = not self.open
                self.cond.notify_all()
                self.cond.wait(left if self.open else None)
            self.parked = False
            return True

    def close(self) -> None:
        """Park the thread: return once it sleeps (it finishes what it is doing first)."""
        with self.cond:
            self.open = False
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.parked or self.stop.is_set())

    def reopen(self) -> None:
        with self.cond:
            self.open = True
            self.parked = False
            self.cond.notify_all()


def per_call(arms: dict) -> dict:
    fns, names = list(arms.values()), list(arms)
    times: list[list[int]] = [[] for _ in fns]
    for i in range(args.calls):
        for j in range(len(fns)):
            k = (i + j) % len(fns)
            start = clock()
            fns[k](t)
            times[k].append(clock() - start)
    return {name: summary(ns) for name, ns in zip(names, times, strict=True)}


def blocks(probe, torch_fn, barrier) -> dict:
    gate = Gate(probe._stop)
    probe._stop = gate
    times: dict[str, list[int]] = {"off": [], "on": []}
    for i in range(args.blocks):
        for mode in ("off", "on") if i % 2 == 0 else ("on", "off"):
            if mode == "off":
                gate.close()
            barrier()
            fn = torch_fn if mode == "off" else dist.all_reduce
            start = clock()
            for _ in range(args.block):
                fn(t)
            times[mode].append(clock() - start)
            gate.reopen()
    probe._stop = gate.stop
    off, on = sum(times["off"]), sum(times["on"])
    pairs = [b / a for a, b in zip(times["off"], times["on"], strict=True)]
    return {
        "off_us": off / (args.blocks * args.block) / 1e3,
        "on_us": on / (args.blocks * args.block) / 1e3,
        "pair_ratios": sorted(pairs),
    }


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
    originals = {name: fn for _, name, fn in probe._originals}
    torch_fn = originals["all_reduce"]
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
    for _ in range(2000):
        for fn in arms.values():
            fn(t)
    originals["barrier"]()
    out = {"per_call": per_call(arms), "blocks": blocks(probe, torch_fn, originals["barrier"])}
    out["c_wrapper"] = _core._fast is not None
if dist.get_rank() == 0:
    print(json.dumps(out))
dist.destroy_process_group()
