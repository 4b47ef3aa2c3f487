"""``make docs``: the static site, built by Sphinx with myst-nb into ``docs/_build/html``.

The guided notebooks are committed without outputs. The site shows them with the outputs of a
real run: those of the test suite's run (``tests/test_notebooks.py`` writes each notebook it ran
without error into ``docs/_build/executed``, with a digest of the source). A notebook whose
executed copy is missing, or older than its source, is run here by that same test first, so the
site never shows a figure that no run made. Then Sphinx builds the site; any warning (a broken
internal link among them) fails the build.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
NOTEBOOKS = ROOT / "notebooks"
#: Where the test suite leaves the notebooks it executed, and the site takes them from.
EXECUTED = DOCS / "_build" / "executed"
HTML = DOCS / "_build" / "html"
#: Files the pages load, copied in by the build (plotly.js, once for every figure).
STATIC = DOCS / "_build" / "static"
#: Where an executed copy keeps what it was made from (``source``: the digest of the notebook
#: file; ``workdir``: the folder it ran in, which the site does not show).
META_KEY = "rankscope"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stale() -> list[Path]:
    """The notebooks whose executed copy is missing or was made from another version."""
    import nbformat

    out = []
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        executed = EXECUTED / path.name
        if executed.is_file():
            meta = nbformat.read(executed, as_version=4).metadata.get(META_KEY, {})
            if meta.get("source") == digest(path):
                continue
        out.append(path)
    return out


def execute(paths: list[Path]) -> None:
    """Run ``paths`` through the notebook test, which writes their executed copies."""
    print(f"executing with the test suite: {', '.join(p.stem for p in paths)}", flush=True)
    tests = [f"tests/test_notebooks.py::test_notebook_runs[{p.stem}]" for p in paths]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests]
    done = subprocess.run(cmd, cwd=ROOT)
    if done.returncode != 0:
        sys.exit(f"a notebook failed (pytest exit code {done.returncode}); the site is not built")


def sphinx(
    src: Path = DOCS, out: Path = HTML, *, conf: Path = DOCS, extra: list[str] = ()
) -> subprocess.CompletedProcess[str]:
    """Sphinx's HTML build of the pages in ``src`` (with the settings in ``conf``, and
    ``extra`` options) into ``out``; every warning is an error (``-W``): a broken internal link
    fails the build."""
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]
    cmd += ["-c", str(conf), *extra, str(src), str(out)]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--no-execute",
        action="store_true",
        help="fail instead of running the notebooks whose executed copy is missing or stale",
    )
    args = parser.parse_args(argv)
    todo = stale()
    if todo and args.no_execute:
        names = ", ".join(p.name for p in todo)
        sys.exit(f"no executed copy of {names}: run make docs (or make test) without --no-execute")
    if todo:
        execute(todo)
    done = sphinx()
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    if done.returncode != 0:
        return done.returncode
    print(f"the site is in {(HTML / 'index.html').relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
