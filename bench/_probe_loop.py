"""Worker for probe_overhead.py: times 1-element gloo all_reduces, 2 ranks.

Under the probe (``--mode probe``), once the probe's one-off warm-up is done, two measurements:

  * per call: torch's own all_reduce, the probe's wrapper and a Python wrapper (of a second,
    idle probe made without the C extension) are called in turn, one call each, the order
    rotating every round, and every call is timed. Neighbouring calls see the same machine, so
    the slow drifts of a shared machine cancel. The probe thread runs during all arms alike.
    This shows where a wrapper's time lands on its own rank; what its work after the call
    costs the peer lands on the next call, which is another arm's, so the wrapper's whole cost
    is the blocks' figure;
  * in blocks: the probe off (torch's own all_reduce, the probe thread asleep) and on (the
    probe's wrapper, the probe thread at work: heartbeats, looks, flushes) alternate in
    blocks of ``--block`` calls, the order swapped every pair. Short blocks cancel the
    machine's drifts; a Pacer keeps the thread's rates per second of "on" blocks what they
    are on a running rank, and an "on" block ends only once the thread is asleep again.
    Everything the probe does counts. Every call is timed, so that the per-block totals come
    both as timed and with each call capped (see probe_overhead.py).

Without the probe (``--mode loop``) it times a plain loop. Rank 0 prints one JSON line.

``--async-op`` makes every call ``all_reduce(t, async_op=True).wait()``: the probe follows each
Work to its completion (its thread looks at it). The probe replaces ``Work.wait`` for every Work
(torch's blocking collectives call it too, on their own Work), so each arm calls the ``wait`` it
would have: torch's own in the torch arm and the "off" blocks (set on the class as the arm or
block begins, in every arm alike), the probe's in the others. ``--backend nccl`` all_reduces a 1-element
CUDA tensor and synchronizes the device after every call, in every arm alike.
"""

import argparse
import json
import math
import os
import statistics
import threading
import time
from array import array

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--mode", choices=("probe", "loop"), required=True)
ap.add_argument("--calls", type=int, default=20000, help="per-call rotation: calls per arm")
ap.add_argument("--blocks", type=int, default=1000, help="pairs of off/on blocks")
ap.add_argument("--block", type=int, default=200, help="calls per block")
ap.add_argument("--age", type=float, default=3.0, help="loop mode: seconds from set-up to loop")
ap.add_argument("--async-op", action="store_true", help="async_op=True, then wait on the Work")
ap.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
args = ap.parse_args()

if args.backend == "nccl":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    t = torch.ones(1, device="cuda")
else:
    t = torch.ones(1)
dist.init_process_group(args.backend)
clock = time.perf_counter_ns
DEVICE = args.backend == "nccl"


def issue(fn) -> None:
    """One call as the loop makes it."""
    if args.async_op:
        fn(t, async_op=True).wait()
    else:
        fn(t)
    if DEVICE:
        torch.cuda.synchronize()


CAP = 5  # a call over CAP times the plain call's median is counted at that (probe_overhead.py)


def summary(ns: list[int]) -> dict:
    """Mean, and mean of the fastest 95 % (a 1-in-20 hiccup of the machine lands on any call)."""
    ordered = sorted(ns)
    kept = ordered[: int(len(ordered) * 0.95)]
    return {"mean_us": statistics.fmean(ns) / 1e3, "trim_us": statistics.fmean(kept) / 1e3}


class Pacer:
    """Stands in for the probe thread's stop event and its clock, so that the thread can be
    switched off and on between blocks of a few calls and still do, in the "on" blocks, exactly
    what it does on a running rank.

    Its clock (``monotonic``, read by the thread for its heartbeat and flush deadlines) advances
    only while an "on" block runs. Its ``wait`` sleeps until the loop lets the thread go; the loop
    does that, between two calls, once the thread's wait has passed on that clock. So the
    thread looks, beats and flushes at its own rates per second of probed loop, never during an
    "off" block and never during the barriers between blocks. ``tick``, called after every call
    in both kinds of block, does the same work in both: one clock read and one comparison.
    """

    def __init__(self, stop: threading.Event):
        self.stop = stop
        self.cond = threading.Condition()
        self.base = time.monotonic()  # the thread's earlier deadlines stay meaningful
        self.elapsed = 0.0  # seconds of "on" blocks so far
        self.since: float | None = None  # start of the running "on" block
        self.due_at: float | None = None  # when the sleeping thread is to go; None: busy
        self.wake_at = math.inf  # due_at in real time while an "on" block runs, else inf
        self.go = False
        self.wakes = 0  # times the thread was let go

    def monotonic(self) -> float:
        since = self.since
        return self.base + self.elapsed + (time.monotonic() - since if since is not None else 0)

    def is_set(self) -> bool:
        return self.stop.is_set()

    def set(self) -> None:
        self.stop.set()
        self.release()

    def wait(self, timeout: float) -> bool:
        with self.cond:
            self.due_at = self.monotonic() + timeout
            self._schedule()
            self.cond.notify_all()  # settle() waits for this
            while not self.go and not self.stop.is_set():
                self.cond.wait()
            self.go = False
            return self.stop.is_set()

    def release(self) -> None:
        with self.cond:
            self.due_at = None
            self.wake_at = math.inf
            self.go = True
            self.cond.notify_all()

    def settle(self) -> None:
        """Return once the thread, if let go, is asleep again: its work counts in the block."""
        with self.cond:
            while (self.go or self.due_at is None) and not self.stop.is_set():
                self.cond.wait()

    def _schedule(self) -> None:
        due, since = self.due_at, self.since
        if due is None or since is None:
            self.wake_at = math.inf
        else:
            self.wake_at = since + (due - self.base - self.elapsed)

    def tick(self) -> None:
        """Called by the loop after every call, in both kinds of block: let the thread go if due."""
        if time.monotonic() >= self.wake_at:
            self.wakes += 1
            self.release()

    def on(self) -> None:
        self.since = time.monotonic()
        self._schedule()

    def off(self) -> None:
        if self.since is not None:
            self.elapsed += time.monotonic() - self.since
            self.since = None
        self._schedule()


class _Clock:
    """``time`` for the probe thread, with the pacer's clock as ``monotonic``."""

    def __init__(self, pacer: Pacer):
        self.monotonic = pacer.monotonic

    def __getattr__(self, name: str):
        return getattr(time, name)


def use_wait(wait) -> None:
    """The ``Work.wait`` the next calls use: the async loop's, and the one torch's blocking
    collectives call on their own Work before they return."""
    dist.Work.wait = wait


def per_call(arms: dict, waits: dict) -> dict:
    fns, names = list(arms.values()), list(arms)
    times: list[list[int]] = [[] for _ in fns]
    for i in range(args.calls):
        for j in range(len(fns)):
            k = (i + j) % len(fns)
            use_wait(waits[names[k]])
            start = clock()
            issue(fns[k])
            times[k].append(clock() - start)
    return {name: summary(ns) for name, ns in zip(names, times, strict=True)}


def blocks(probe, torch_fn, torch_wait, barrier) -> dict:
    pacer = Pacer(probe._stop)
    probe._stop, _core.time = pacer, _Clock(pacer)
    tick = pacer.tick
    pacer.settle()  # the thread's first wait on the pacer
    calls = {"off": array("q"), "on": array("q")}  # every call's time, block after block
    # per block: from its last call's end to its end (in "on" blocks, the thread asleep again)
    tails = {"off": array("q"), "on": array("q")}
    for i in range(args.blocks):
        for mode in ("off", "on") if i % 2 == 0 else ("on", "off"):
            fn = torch_fn if mode == "off" else dist.all_reduce
            use_wait(torch_wait if mode == "off" else probe_wait)
            out = calls[mode]
            barrier()
            if mode == "on":
                pacer.on()
            last = clock()
            for _ in range(args.block):
                issue(fn)
                tick()
                end = clock()
                out.append(end - last)
                last = end
            if mode == "on":
                pacer.settle()
            tails[mode].append(clock() - last)
            pacer.off()
    probe._stop, _core.time = pacer.stop, time
    use_wait(probe_wait)
    pacer.release()
    cap = CAP * statistics.median(calls["off"])
    sums: dict = {}
    for mode, ns in calls.items():
        extra = tails[mode]
        per_block = [ns[k : k + args.block] for k in range(0, len(ns), args.block)]
        sums[mode] = [sum(b) + x for b, x in zip(per_block, extra, strict=True)]
        sums[mode + "_capped"] = [
            sum(min(c, cap) for c in b) + x for b, x in zip(per_block, extra, strict=True)
        ]
        sums[mode + "_over"] = sum(c > cap for c in ns)
    return {**sums, "cap_ns": cap, "cap_x": CAP, "wakes": pacer.wakes, "on_s": pacer.elapsed}


if args.mode == "loop":
    # Both jobs start their loop at the same age, --age seconds after the process group is up:
    # on this machine a job's calls slow down by a few per cent over its first seconds, so a
    # loop started sooner would be timed faster.
    time.sleep(args.age)
    fn = dist.all_reduce
    for _ in range(2000):
        issue(fn)
    dist.barrier()
    start = clock()
    for _ in range(args.calls):
        issue(fn)
    out = {"loop_us": (clock() - start) / args.calls / 1e3}
else:
    import rankscope.probe
    from rankscope.probe import _core
    from rankscope.rundir import RunDir

    probe = rankscope.probe.current()
    assert probe is not None, "run under rankscope's bootstrap"
    originals = {name: fn for _, name, fn in probe._originals}
    torch_fn, torch_wait, probe_wait = originals["all_reduce"], originals["wait"], dist.Work.wait
    arms = {"torch": torch_fn, "probe": dist.all_reduce}
    waits = {"torch": torch_wait, "probe": probe_wait, "python": probe_wait}
    # the Python wrapper, on a probe made without the C extension (not for async calls: its
    # thread never runs, so nothing would look at the Works it follows)
    if _core._fast is not None and not args.async_op:
        fast, _core._fast = _core._fast, None
        # its thread never runs; its files go with the run directory
        bare = _core.Probe(RunDir(probe.run.path / "python-arm"), probe.rank)
        arms["python"] = bare._wrap("all_reduce", torch_fn, None)
        _core._fast = fast
    for _ in range(2000):
        for name, fn in arms.items():
            use_wait(waits[name])
            issue(fn)
    use_wait(probe_wait)
    originals["barrier"]()
    out = {
        "per_call": per_call(arms, waits),
        "blocks": blocks(probe, torch_fn, torch_wait, originals["barrier"]),
    }
    out["c_wrapper"] = _core._fast is not None
    out["tensor_meta"] = _core._META is not None
if dist.get_rank() == 0:
    print(json.dumps(out))
dist.destroy_process_group()
