"""What a rank outside every collective was doing, read from its stacks.

A faulthandler dump shows Python frames only: ``time.sleep``, ``Lock.acquire`` and socket reads
are C, so the innermost frame is the user's line that made them, and its source text (the stacks
table's ``code``) says what it waits on. Frames of the standard library say it too: a
``queue.get`` waiting in ``threading.Condition.wait``, a ``Thread.join``; and torch's own where
it waits on its DataLoader's workers or on a C++ extension's build lock. The classification looks at the main thread
(the one whose outermost frame is the script's ``<module>``), from its
innermost frame outwards, and lists what the rank's other user threads were doing: the thread
that holds a lock the main thread waits for is usually one of them.
"""

from __future__ import annotations

import ast
import functools
import linecache
import re
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from rankscope.collect import latest_captures, short_site

#: What a rank can be found waiting on (``{its}``: ``its`` or ``their``, for one rank or
#: several), with the advice that goes with each.
WAITS: dict[str, tuple[str, str]] = {
    "lock": (
        "waiting to acquire a lock",
        "The main thread waits for a lock that another thread holds and does not release (see "
        "what the other threads were doing): never hold a lock across something that can "
        "block (a sleep, I/O, a collective), and give acquire() a timeout that fails loudly.",
    ),
    "sleep": (
        "sleeping",
        "The rank sleeps while the others wait for it in a collective: a back-off or retry "
        "loop, a rate limit or a debugging pause on one rank. Make such waits bounded and the "
        "same on every rank, or keep them out of the steps where the ranks must meet.",
    ),
    "queue": (
        "waiting on a queue",
        "The rank waits for an item that never comes: the producer (a data-loading thread or "
        "process) died or is stuck. Give get() a timeout and check the producer's health.",
    ),
    "thread_join": (
        "waiting for a thread to finish",
        "The rank joins a thread that does not finish (it is stuck itself, see its stack): "
        "give join() a timeout, and make the thread's own waits bounded.",
    ),
    "event": (
        "waiting for an event or condition",
        "The rank waits for an event or condition that nothing sets: the thread or process "
        "that should set it failed or waits too. Use a timeout and report when it expires.",
    ),
    "io": (
        "waiting on I/O",
        "The rank waits on I/O (a socket, a pipe, a file on a slow or hung shared filesystem, "
        "standard input): make the I/O time out, keep slow I/O off the path between "
        "collectives, or do it on every rank alike.",
    ),
    "cell_done": (
        "done with {its} cell (idle, waiting for the next one)",
        "In a cell session (%%ranks) this rank finished the cell without making the collective "
        "that the others wait in: make every rank of the cell make it (a collective inside "
        "`if rank == 0:` is the usual case), or give the ranks that take part a group of their "
        "own (dist.new_group) and run the cell on them (%%ranks 0,2). %ranks restart starts "
        "fresh ranks.",
    ),
    "dataloader": (
        "waiting for a batch from its DataLoader's workers",
        "The rank waits for a batch that its DataLoader's worker processes do not deliver: a "
        "worker is stuck (a lock that another thread held when the workers were forked, a "
        "read from a hung filesystem, a dataset that blocks) or starved. Give the DataLoader "
        "a timeout (DataLoader(..., timeout=60)) so that a stuck worker raises on the rank it "
        "stops, read the worker's stack (py-spy dump --pid <worker's pid>), and start no "
        "threads that take locks the dataset uses before the workers start (or use "
        'multiprocessing_context="spawn").',
    ),
    "build_lock": (
        "waiting for a C++ extension's build lock",
        "The rank waits for the `lock` file in a C++ extension's build folder to go away "
        "(torch.utils.cpp_extension builds an op just in time: DeepSpeed's ops, a custom "
        "kernel). A build of the same extension holds it while it runs; a build that was "
        "killed (Ctrl-C, an out-of-memory kill, a job's time limit) left it behind, and torch "
        "then waits for it without end and without a word. When no build runs, delete that "
        "`lock` file: it is in the build_directory passed to load(), else in "
        "$TORCH_EXTENSIONS_DIR/<python and device tag>/<extension name>/ (~/.cache/"
        "torch_extensions by default). Build extensions once before the job starts, and give "
        "each environment its own TORCH_EXTENSIONS_DIR.",
    ),
    "subprocess": (
        "waiting for a child process",
        "The rank waits for a child process that does not end: give the wait a timeout and "
        "check the child's own output.",
    ),
}

#: Source text of the innermost user frame, and what it waits on.
_CODE = [
    ("lock", re.compile(r"\bwith\b[^:]*lock|\.acquire\(|\block\.")),
    ("sleep", re.compile(r"\bsleep\(")),
    ("queue", re.compile(r"\.get\(|\.put\(")),
    ("thread_join", re.compile(r"\.join\(")),
    ("event", re.compile(r"\.wait\(")),
    ("io", re.compile(r"\binput\(|\.recv\w*\(|\.read\w*\(|\.accept\(|\.readline\(|\bselect\(")),
    ("subprocess", re.compile(r"subprocess\.|\.communicate\(")),
]
#: Standard-library frames (file, function) and what they wait on.
_LIBRARY = [
    ("queue", re.compile(r"(^|/)queue\.py$"), {"get", "put"}),
    ("thread_join", re.compile(r"(^|/)threading\.py$"), {"join", "_wait_for_tstate_lock"}),
    ("event", re.compile(r"(^|/)threading\.py$"), {"wait"}),
    ("lock", re.compile(r"(^|/)threading\.py$"), {"acquire", "__enter__"}),
    ("subprocess", re.compile(r"(^|/)subprocess\.py$"), {"wait", "communicate", "_wait"}),
    # a DataLoader's main side, waiting for its worker processes' next batch (its own
    # queue's and sockets' frames lie below)
    (
        "dataloader",
        re.compile(r"(^|/)torch/utils/data/dataloader\.py$"),
        {"_try_get_data", "_get_data"},
    ),
    # torch's file lock around a C++ extension's build (torch.utils.cpp_extension)
    ("build_lock", re.compile(r"(^|/)torch/utils/file_baton\.py$"), {"wait"}),
    # An IPython Parallel engine's own loop, with no user frame above it: a cell session's
    # rank between cells (rankscope.cells). Before "io": that loop waits on its sockets.
    ("cell_done", re.compile(r"/ipyparallel/engine/"), None),
    ("io", re.compile(r"(^|/)(socket|selectors|ssl)\.py$|(^|/)http/"), None),
]


@dataclass(frozen=True, kw_only=True)
class Activity:
    """Where a rank's main thread was, and what it waited on there, when its stacks were taken."""

    kind: str | None
    """A key of :data:`WAITS`, or None when the stacks do not say (running code, or no code
    text to read)."""
    site: str | None
    """``file.py:line`` of the innermost user frame."""
    func: str | None
    code: str | None
    """That line's source text, when the file was readable."""
    reason: str | None
    """Why those stacks were taken (``stall``, ``SIGTERM``, ...)."""
    others: list[str] = field(default_factory=list)
    """What the rank's other user threads were doing: ``thread 0x... at w.py:20 (sleeping:
    time.sleep(60))``."""

    @property
    def when(self) -> str:
        """When those stacks were taken, in words."""
        reason = self.reason or ""
        if reason.startswith("stall"):
            return "when the stall watchdog caught the hang"
        if reason == "SIGTERM":
            return "as the job was ended (SIGTERM)"
        if reason.startswith("SIG"):
            return f"as it died of {reason}"
        return {"exception": "when it raised", "exit": "at its exit"}.get(reason, "on request")

    @property
    def doing(self) -> str:
        """``sleeping at train.py:14 (time.sleep(60))``: what it was doing, in words."""
        return self.doing_of(1)

    def doing_of(self, ranks: int) -> str:
        """:attr:`doing` said of ``ranks`` ranks that do the same (``done with their cell``)."""
        what = waiting_on(self.kind, ranks) if self.kind else "outside any collective"
        return _in_words(what, self.site, self.code)


def waiting_on(kind: str, ranks: int = 1) -> str:
    """What :data:`WAITS` says of ``kind``, of one rank or of several."""
    return WAITS[kind][0].format(its="its" if ranks == 1 else "their")


def rank_activity(
    stacks: pd.DataFrame, rank: int, *, main_thread: str | None = None
) -> Activity | None:
    """What ``rank`` was doing in its latest capture of stacks, if it was outside every
    collective; None when it has no stacks or its main thread is inside torch.distributed."""
    threads = _threads(stacks, rank)
    main = _main_thread(threads, main_thread)
    if main is None:
        return None
    frames = threads[main]
    if frames["file"].fillna("").str.contains("torch/distributed/", regex=False).any():
        return None
    kind, user = _classify(frames)
    others = []
    for tid, other in threads.items():
        if tid == main:
            continue
        okind, ouser = _classify(other)
        if ouser is None or _is_probe_thread(other):
            continue
        what = waiting_on(okind) if okind else "running"
        code = f": {ouser['code']}" if _text(ouser.get("code")) else ""
        others.append(f"thread {tid} at {_site(ouser)} ({what}{code})")
    return Activity(
        kind=kind,
        site=_site(user) if user is not None else None,
        func=_text(user.get("func")) if user is not None else None,
        code=_code(user) if user is not None else None,
        reason=_text(frames["reason"].iloc[0]) if "reason" in frames else None,
        others=others,
    )


def user_path(
    stacks: pd.DataFrame, rank: int, *, thread: str | None = None
) -> list[tuple[str, str, int]] | None:
    """The user's frames ``(file, func, line)`` of one of ``rank``'s threads in its latest
    capture of stacks, outermost first: ``thread`` when the capture has it, else the main
    thread. None when the rank has no stacks."""
    frames = thread_frames(stacks, rank, thread)
    if frames is None:
        return None
    user = frames[frames["is_user"].fillna(False).astype(bool)].iloc[::-1]
    return [
        (str(f), str(fn), int(ln))
        for f, fn, ln in zip(user["file"], user["func"], user["line"], strict=True)
        if _text(f) is not None and _text(ln) is not None
    ]


def thread_frames(
    stacks: pd.DataFrame, rank: int, thread: str | None = None
) -> pd.DataFrame | None:
    """The frames of one of ``rank``'s threads in its latest capture of stacks, innermost first:
    ``thread`` when the capture has it, else the main thread. None when the rank has none."""
    threads = _threads(stacks, rank)
    tid = _main_thread(threads, thread)
    return None if tid is None else threads[tid]


def passed(
    waiter: list[tuple[str, str, int]], other: list[tuple[str, str, int]], last: str | None
) -> bool:
    """Whether ``other`` went past the line where ``waiter`` is without stopping there: the two
    paths share their outer frames down to one function, where ``other`` is at a later line,
    and ``last`` (``file.py:line`` of ``other``'s latest call) is in that same function at an
    earlier line than the waiter's, so ``other`` came from before that line to after it.
    (A later line alone says nothing in a loop: ``other`` may still be in the pass before.)
    False when the paths or the source do not show it."""
    for w, o in zip(waiter, other, strict=False):
        if w == o:
            continue
        if w[:2] != o[:2] or o[2] <= w[2]:
            return False
        file, line = w[0], w[2]
        scope = _scope(file, line)
        if scope is None:
            return False
        if last is None:
            return True
        last_file, _, last_line = last.rpartition(":")
        if last_file != short_site(file, line).rpartition(":")[0] or not last_line.isdigit():
            return False
        return int(last_line) < line and _scope(file, int(last_line)) == scope
    return False


def _scope(file: str, line: int) -> tuple[int, int] | None:
    """(first, last) line of the innermost function of ``file`` whose body holds ``line`` (the
    whole module when none does); None when the source cannot be read or parsed."""
    scopes = _scopes(file)
    if scopes is None:
        return None
    inside = [s for s in scopes if s[0] <= line <= s[1]]
    return min(inside, key=lambda s: s[1] - s[0]) if inside else None


@functools.lru_cache(maxsize=64)
def _scopes(file: str) -> list[tuple[int, int]] | None:
    lines = linecache.getlines(file)
    try:
        tree = ast.parse("".join(lines))
    except (SyntaxError, ValueError):
        return None
    if not lines:
        return None
    defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
    return [(1, len(lines))] + [
        (n.lineno, n.end_lineno or n.lineno) for n in ast.walk(tree) if isinstance(n, defs)
    ]


def _threads(stacks: pd.DataFrame, rank: int) -> dict[Any, pd.DataFrame]:
    """The threads of ``rank``'s latest capture, each thread's frames innermost first."""
    mine = stacks[stacks["rank"] == rank]
    if mine.empty:
        return {}
    latest = latest_captures(mine)
    return {tid: f.sort_values("depth") for tid, f in latest.groupby("thread", sort=False)}


def _main_thread(threads: dict[Any, pd.DataFrame], main_thread: str | None) -> Any:
    if main_thread is not None and main_thread in threads:
        return main_thread
    for tid, frames in threads.items():
        if (frames["thread_name"].astype(str) == "MainThread").any():
            return tid
    for tid, frames in threads.items():
        if frames["func"].iloc[-1] == "<module>":
            return tid
    return None


def _classify(frames: pd.DataFrame) -> tuple[str | None, dict[str, Any] | None]:
    """(what the thread waits on, its innermost user frame) from its frames, innermost first."""
    records = frames.to_dict("records")
    user = next((r for r in records if r.get("is_user") is True), None)
    inner = records[: records.index(user)] if user is not None else records
    for r in reversed(inner):  # the library call the user's code made, then what it made
        file, func = str(r.get("file") or ""), str(r.get("func") or "")
        for kind, pattern, funcs in _LIBRARY:
            if pattern.search(file) and (funcs is None or func in funcs):
                return kind, user
    code = _text(user.get("code")) if user is not None else None
    if code:
        for kind, pattern in _CODE:
            if pattern.search(code):
                return kind, user
    return None, user


def _is_probe_thread(frames: pd.DataFrame) -> bool:
    return frames["file"].fillna("").str.contains("rankscope/probe/", regex=False).any()


def _site(frame: dict[str, Any]) -> str | None:
    file, line = _text(frame.get("file")), frame.get("line")
    if file is None:
        return None
    return short_site(file, line)


def _code(frame: dict[str, Any]) -> str | None:
    """A frame's source line without its trailing comment."""
    text = _text(frame.get("code"))
    return re.sub(r"\s+#.*$", "", text) if text else None


def _text(value: Any) -> str | None:
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return None
    return str(value)


@dataclass(frozen=True, kw_only=True)
class ExitWait:
    """What the process of a rank that had ended its script was doing in its exit, from the
    stacks taken after that end (:func:`exit_wait`)."""

    kind: str
    """``threads`` (the interpreter waits for threads that are not daemons), ``hook`` (an exit
    hook runs), ``objects`` (the script's objects are being freed: a destructor runs) or
    ``native`` (no Python frame runs: a destructor or a library's exit in native code)."""
    what: str
    """In words: ``its exit waits for threads that are not daemons: the thread that runs
    write_metrics, waiting on a queue at train.py:22 (`metrics.get()`)``."""


def exit_wait(stacks: pd.DataFrame, rank: int, *, main_thread: str | None) -> ExitWait | None:
    """What ``rank``'s main thread does in its latest capture of stacks, read as a process
    past its script: waiting for its threads, in an exit hook, freeing its objects, or in
    native code. None when it has no stacks, or they show it in its script."""
    threads = _threads(stacks, rank)
    main = _main_thread(threads, main_thread)
    if main is None:
        return None
    frames = threads[main]
    records = frames.to_dict("records")  # innermost first
    funcs = [(str(r.get("file") or ""), str(r.get("func") or "")) for r in records]
    if any(func == "<module>" for _, func in funcs):
        return None  # still in the script
    kind, user = _classify(frames)
    if any(file.endswith("threading.py") and func == "_shutdown" for file, func in funcs):
        return _waits_for_threads(threads, main)
    if any(
        f.endswith("rankscope/probe/bootstrap.py") and fn == "_release_globals" for f, fn in funcs
    ):
        if user is None:
            return ExitWait(
                kind="native",
                what="it is freeing the script's objects, in native code (a destructor that "
                "does not return; no Python frame of it runs)",
            )
        return ExitWait(
            kind="objects",
            what=f"it is freeing the script's objects, in {_text(user.get('func'))}, "
            f"{_doing(kind, user)}",
        )
    hook = _text(records[-1].get("func"))
    if user is None:  # a library's exit hook: its innermost frame says where it is
        inner = records[0]
        return ExitWait(
            kind="hook",
            what=f"its exit runs {hook}, a library's exit hook, in {_text(inner.get('func'))} "
            f"at {_site(inner)}",
        )
    return ExitWait(
        kind="hook",
        what=f"its exit hook {hook} is {_doing(kind, user)}",
    )


def _waits_for_threads(threads: dict[Any, pd.DataFrame], main: Any) -> ExitWait:
    """The interpreter waits at exit for every thread that is not a daemon: those of the
    rank's threads that run the user's code (or, where none does, any but rankscope's)."""
    ours = {tid: f for tid, f in threads.items() if tid != main and not _is_probe_thread(f)}
    told = []
    for frames in ours.values():
        kind, user = _classify(frames)
        if user is None:
            continue
        own = frames[frames["is_user"].fillna(False).astype(bool)]
        target = _text(own["func"].iloc[-1])  # the outermost: the function the thread runs
        told.append(f"the thread that runs {target}, {_doing(kind, user)}")
    if not told:
        told = [
            f"a thread in {_text(f['func'].iloc[0])} ({_site(f.to_dict('records')[0])})"
            for f in ours.values()
        ]
    what = "its exit waits for threads that are not daemons"
    what += f": {'; '.join(told)}" if told else " (no other thread's stack was captured)"
    return ExitWait(kind="threads", what=what)


def _doing(kind: str | None, user: dict[str, Any]) -> str:
    """``waiting on a queue at train.py:22 (`metrics.get()`)``: a thread's user frame in
    words."""
    return _in_words(waiting_on(kind) if kind else "running", _site(user), _code(user))


def _in_words(what: str, site: str | None, code: str | None) -> str:
    return what + (f" at {site}" if site else "") + (f" (`{code}`)" if code else "")
