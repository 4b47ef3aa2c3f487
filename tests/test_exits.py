"""What a process that outlived its script was doing in its exit, read from stacks taken after
its end (:func:`rankscope.analyze.activity.exit_wait`): waiting for its threads, in an exit hook,
freeing the script's objects in Python or in native code. The jobs themselves are corpus cases
(``tests/corpus/exit_*.py``); the kinds no script can make happen on cue are dumps here."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankscope.analyze.activity import exit_wait
from rankscope.collect import Source, read_stacks

MAIN = "0x00007f0000000001"
SCRIPT = """\
import queue, subprocess
jobs = queue.Queue()

def drain():
    while True:
        jobs.get()

def close(child):
    child.wait()

class Cache:
    def __del__(self):
        self.lock.acquire()
"""
THREADING = "/usr/lib/python3.11/threading.py"
BOOTSTRAP = "/v/site-packages/rankscope/probe/bootstrap.py"


def dump(tmp_path: Path, main: list[tuple[str, int, str]], other: list[tuple[str, int, str]]):
    """A faulthandler dump of the main thread (and one other where given), frames innermost
    first, as the watchdog's exit stall captures it; the script is ``train.py``."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)

    def frames(stack: list[tuple[str, int, str]]) -> str:
        return "".join(
            f'  File "{script if f == "train.py" else f}", line {line} in {func}\n'
            for f, line, func in stack
        )

    text = "# rankscope capture id=1 t=1000.0 reason=stall:exit pid=1 via=signal\n"
    if other:
        text += f"Thread 0x00007f0000000002 (most recent call first):\n{frames(other)}\n"
    text += f"Current thread {MAIN} (most recent call first):\n{frames(main)}"
    path = tmp_path / "stacks.txt"
    path.write_text(text)
    return read_stacks([Source(path, "ranks/0/stacks.txt", rank=0)])


DRAIN = [
    ("/usr/lib/python3.11/threading.py", 327, "wait"),
    ("/usr/lib/python3.11/queue.py", 171, "get"),
    ("train.py", 6, "drain"),
    (THREADING, 982, "run"),
    (THREADING, 1002, "_bootstrap"),
]


@pytest.mark.parametrize(
    ("main", "other", "kind", "words"),
    [
        (
            [(THREADING, 1590, "_shutdown")],
            DRAIN,
            "threads",
            "waits for threads that are not daemons: the thread that runs drain, waiting on a "
            "queue at train.py:6 (`jobs.get()`)",
        ),
        (
            [("/usr/lib/python3.11/subprocess.py", 2040, "_wait"), ("train.py", 9, "close")],
            [],
            "hook",
            "its exit hook close is waiting for a child process at train.py:9",
        ),
        (
            [("train.py", 13, "__del__"), (BOOTSTRAP, 70, "_release_globals")],
            [],
            "objects",
            "freeing the script's objects, in __del__, waiting to acquire a lock at train.py:13",
        ),
        ([(BOOTSTRAP, 70, "_release_globals")], [], "native", "in native code"),
    ],
)
def test_a_process_past_its_script_says_what_its_exit_waits_for(tmp_path, main, other, kind, words):
    got = exit_wait(dump(tmp_path, main, other), 0, main_thread=MAIN)
    assert got is not None and got.kind == kind, got
    assert words in got.what, got.what


def test_a_process_still_in_its_script_is_no_exit(tmp_path):
    stacks = dump(tmp_path, [("train.py", 6, "drain"), ("train.py", 2, "<module>")], [])
    assert exit_wait(stacks, 0, main_thread=MAIN) is None
