"""A process that ends when its owner does: ``python -m rankscope.launch.tether ARGV...``.

It starts ``ARGV`` in a process group of its own and waits for it; when the owner (which holds
the write end of the tether's stdin, as a job's owner holds its supervisor's) dies, or when the
tether is sent SIGTERM, it ends that group: SIGTERM, then SIGKILL after ``GRACE_S``. Its exit
code is the child's. A cell session's IPython Parallel controller runs under one
(:mod:`rankscope.cells`): the ranks end with the kernel through their job's supervisor, the
controller through its tether.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

from rankscope.launch.procs import when_owner_gone

GRACE_S = 3.0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        sys.stderr.write("usage: python -m rankscope.launch.tether ARGV...\n")
        return 2
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
    ending = threading.Event()

    def end() -> None:
        if ending.is_set():
            return
        ending.set()
        with contextlib.suppress(OSError):
            os.killpg(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        while child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(OSError):
            os.killpg(child.pid, signal.SIGKILL)

    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=end, daemon=True).start())
    when_owner_gone(end)
    return child.wait()


if __name__ == "__main__":
    raise SystemExit(main())
