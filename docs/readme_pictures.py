"""Make the README's timeline picture (docs/_static/readme-timeline.png) from a real hang: the
quickstart's own script (read from notebooks/00-quickstart.ipynb) under torchrun with 3 gloo
ranks, diagnosed once it stalls, its timeline drawn as the quickstart's cell draws it, and a
screenshot of it taken in headless Chromium::

    python docs/readme_pictures.py [--chromium PATH] [--out docs/_static/readme-timeline.png]

Needs Chromium and Playwright (``sh tests/debian_setup.sh browser``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import textwrap
import time
from pathlib import Path

import plotly

from rankscope import plot
from rankscope.analyze import diagnose
from rankscope.collect import load_run
from rankscope.launch import Job, JobSpec

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "notebooks" / "00-quickstart.ipynb"
WIDTH, HEIGHT = 900, 330


def quickstart_script() -> str:
    """The training script the quickstart's first cell writes (its dedented text)."""
    cells = json.loads(QUICKSTART.read_text())["cells"]
    source = next("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    return textwrap.dedent(source.split('textwrap.dedent("""', 1)[1].split('""")', 1)[0])


def timeline_of_a_hang(work: Path) -> plot.go.Figure:
    """Run the quickstart's hang, stop it once it stalled, and draw its timeline."""
    script = work / "train.py"
    script.write_text(quickstart_script())
    spec = JobSpec(script=str(script), nproc_per_node=3, stall_timeout_s=2.0, on_stall="keep")
    job = Job(spec, runs_root=work / "runs").start()
    try:
        deadline = time.monotonic() + 180
        while not job.stalls:
            if job.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the quickstart's job did not stall: {job.status()}")
            time.sleep(0.5)
        run = load_run(job.run.path)
        diagnosis = diagnose(run)
    finally:
        job.stop(grace_s=2.0)
        job.wait(timeout=60)
    now = float(run.ranks["last_event_s"].max())
    return plot.rank_timeline(
        run.collectives,
        culprit_ranks=diagnosis.culprit_ranks,
        divergence=diagnosis.collective.to_dict() if diagnosis.collective else None,
        now=now,
        ranks=range(3),
    )


def screenshot(fig: plot.go.Figure, out: Path, *, chromium: str, work: Path) -> None:
    from playwright.sync_api import sync_playwright

    fig.update_layout(width=WIDTH, height=HEIGHT)
    shutil.copy(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", work)
    page_file = work / "timeline.html"
    page_file.write_text(fig.to_html(include_plotlyjs="plotly.min.js", full_html=True))
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
        page.goto(page_file.as_uri(), timeout=120_000)  # a loaded machine is slow
        page.wait_for_selector(".main-svg", timeout=120_000)
        page.locator(".js-plotly-plot").screenshot(path=str(out))
        browser.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "_static" / "readme-timeline.png")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rankscope-readme-") as tmp:
        work = Path(tmp)
        fig = timeline_of_a_hang(work)
        screenshot(fig, args.out, chromium=args.chromium, work=work)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
