"""The documentation site (make docs): it builds from the notebooks the suite executed
(tests/test_notebooks.py, which the suite runs first; on several workers the build waits for
them), and a reader's browser shows real figures and cards with no kernel behind them; a broken
internal link fails the build."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from docs.make_site import DOCS, HTML, ROOT

from .conftest import runs_a_notebook
from .test_browser import ARTIFACTS, _page, assert_legible
from .test_notebooks import ended_in_this_run

#: How long the build waits for the notebooks that other workers run (the longest takes a few
#: minutes on 2 cores; the suite runs them first).
NOTEBOOKS_WAIT_S = 1200.0


def wait_for_the_notebooks(session: pytest.Session) -> None:
    """Until every notebook that this run of the suite executes has ended (on any worker):
    the build then takes their executed copies rather than running them again."""
    paths = {item.callspec.params["path"] for item in session.items if runs_a_notebook(item.nodeid)}
    deadline = time.monotonic() + NOTEBOOKS_WAIT_S
    while waiting := sorted(p.stem for p in paths if not ended_in_this_run(p)):
        assert time.monotonic() < deadline, f"notebooks still running: {', '.join(waiting)}"
        time.sleep(1.0)


@pytest.fixture(scope="module")
def site(request: pytest.FixtureRequest) -> Path:
    """``make docs``' build (it executes any notebook the suite has not, first)."""
    wait_for_the_notebooks(request.session)
    done = subprocess.run(
        [sys.executable, str(DOCS / "make_site.py")], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return HTML


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # no line per request in the test's output
        pass


@pytest.fixture
def served(site: Path) -> Iterator[str]:
    """The site over HTTP on a free localhost port, as a host would serve it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.slow
@pytest.mark.timeout(1800)  # alone, it runs every notebook first
def test_the_site_shows_the_quickstart_and_a_recipe_with_their_figures(
    chromium: str, served: str, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    with _page(chromium, tmp_path, "site") as page:
        page.goto(f"{served}/notebooks/00-quickstart.html")
        card = page.locator(".rankscope-card").first
        expect(card).to_contain_text("Culprit rank", timeout=30_000)
        timeline = page.locator(".js-plotly-plot", has_text="Rank timeline").first
        expect(timeline).to_be_visible(timeout=30_000)
        assert timeline.locator(".main-svg").count() > 0, "plotly.js did not draw the timeline"
        timeline.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "site-quickstart.png"))
        # from the recipe index to a recipe's page, by its link
        page.goto(f"{served}/recipes/index.html")
        page.locator("a", has_text="D21").first.click()
        expect(page).to_have_url(f"{served}/recipes/d21.html")
        expect(page.locator("article h1").first).to_contain_text("D21")
        figure = page.locator(".js-plotly-plot").first
        expect(figure).to_be_visible(timeout=30_000)
        expect(page.locator(".rankscope-card").first).to_contain_text("Culprit rank")
        figure.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "site-recipe-d21.png"))
        # the API's root lists the public names, each a link to where it is documented
        page.goto(f"{served}/reference/public.html")
        page.locator("a", has_text="rankscope.diagnose").first.click()
        expect(page).to_have_url(re.compile(r"/api/rankscope/analyze/driver/index\.html#"))
        page.screenshot(path=str(ARTIFACTS / "site-public-api.png"))
    # no folder of the machine that ran the notebooks on the pages
    local = [
        p
        for p in HTML.rglob("*.html")
        if str(ROOT) in p.read_text() or "pytest-of-" in p.read_text()
    ]
    assert not local, f"pages that show a local folder: {local}"


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_site_reads_at_a_glance(chromium: str, served: str, tmp_path: Path) -> None:
    """The landing page says what rankscope is, shows a card and a timeline and links in; a
    page has one search box and a contents list that follows the reading; cards and tables
    fit their boxes with padded cells; a grid's caption has its rows under it; text output
    wraps; a closed workbench's snapshot says how its job ended; no link to a placeholder."""
    from playwright.sync_api import expect

    with _page(chromium, tmp_path, "site-legible") as page:
        page.set_viewport_size({"width": 1400, "height": 1000})
        page.goto(f"{served}/index.html")
        article = page.locator("article")
        expect(article).to_contain_text("workbench for distributed PyTorch hangs")
        for link in ("Quickstart", "Recipes", "Reference"):
            expect(article.locator(".rs-links a", has_text=link)).to_be_visible()
        card = article.locator(".rankscope-card")
        expect(card).to_contain_text("Culprit rank")
        timeline = article.locator(".js-plotly-plot", has_text="Rank timeline")
        expect(timeline).to_be_visible(timeout=30_000)
        # one screen: the card and the timeline begin within the first 1000 px
        assert card.bounding_box()["y"] < 1000 and timeline.bounding_box()["y"] < 1000
        page.screenshot(path=str(ARTIFACTS / "site-landing.png"))
        assert_legible(card, "the landing page's card")
        search = page.locator("input[type=search], .search-button-field, .search-button")
        assert search.locator("visible=true").count() == 1, "more than one search box"

        page.goto(f"{served}/notebooks/00-quickstart.html")
        expect(page.locator(".rankscope-card").first).to_contain_text("Culprit rank")
        assert_legible(page.locator(".rankscope-card"), "the quickstart's cards")
        assert_legible(page.locator("table.rankscope-ranks"), "the quickstart's ranks tables")
        # the workbench's snapshot: how the job ended, above rows that say the same
        snapshot = page.locator("table.rankscope-ranks").first
        expect(snapshot).to_contain_text("SIGTERM")
        header = page.locator("div", has_text="waiting in a collective").last.inner_text()
        assert "stopped" in header and "running" not in header, header
        # the diagnosis in plain text wraps instead of being cut off
        pres = page.locator("div.cell_output pre")
        wide = pres.evaluate_all("ps => ps.filter(p => p.scrollWidth > p.clientWidth + 1).length")
        assert wide == 0, f"{wide} text outputs cut off on the right"
        # a grid's caption has its rows under it
        for caption in page.locator(".rankscope-grid caption").all():
            grid = caption.locator("xpath=ancestor::table[1]")
            assert grid.locator("tbody tr").count() > 0, caption.inner_text()
        # the contents list follows the reading: at section 6, section 6 is marked
        heading = page.locator("h2", has_text="6. Stop").first
        heading.evaluate("h => h.scrollIntoView({block: 'start'})")  # at the top of the window
        page.mouse.wheel(0, 200)  # and read on
        page.wait_for_timeout(500)
        active = page.locator("nav.page-toc a.active")
        expect(active.last).to_contain_text("6. Stop")
        page.screenshot(path=str(ARTIFACTS / "site-quickstart-section-6.png"))

        page.goto(f"{served}/cli.html")
        assert page.locator("a[href*='HOST']").count() == 0, "a link to http://HOST:PORT"
        expect(page.locator("article")).to_contain_text("http://HOST:PORT")


@pytest.mark.slow
@pytest.mark.timeout(1800)  # alone, it runs every notebook first
def test_search_results_read_as_text(chromium: str, served: str, tmp_path: Path) -> None:
    """A command the reference documents by its help ("Fetch every rank's Python stacks...")
    is found by the site's search and listed as text: no entity (&#x27;) and no markup."""
    from playwright.sync_api import expect

    index = (HTML / "searchindex.js").read_text()
    assert not re.search(r"&(#x?[0-9a-fA-F]+|[a-z]+);", index), "an HTML entity in the index"
    with _page(chromium, tmp_path, "site-search") as page:
        page.goto(f"{served}/search.html?q=python+stacks")
        results = page.locator("#search-results ul.search li")
        expect(results.first).to_be_visible(timeout=30_000)
        expect(page.locator("#search-results")).to_contain_text("every rank's Python stacks")
        text = page.locator("#search-results").inner_text()
        assert "&#" not in text and "&amp;" not in text and "<code" not in text, text[:500]
        page.screenshot(path=str(ARTIFACTS / "site-search.png"))


@pytest.mark.slow
def test_a_broken_internal_link_fails_the_build(tmp_path: Path) -> None:
    """The site's own build command and settings, on two small pages (only myst's extension:
    links are myst's to check): it builds with a good link and fails, naming the target,
    with a broken one."""
    from docs.make_site import sphinx

    src = tmp_path / "src"
    src.mkdir()
    (src / "other.md").write_text("# Other\n")
    index = "# Index\n\nSee [the other page]({}).\n\n```{{toctree}}\n:hidden:\n\nother\n```\n"
    (src / "index.md").write_text(index.format("other.md"))
    only_myst = ["-D", "extensions=myst_nb"]
    assert sphinx(src, tmp_path / "good", conf=DOCS, extra=only_myst).returncode == 0
    (src / "index.md").write_text(index.format("no-such-page.md"))
    done = sphinx(src, tmp_path / "broken", conf=DOCS, extra=only_myst)
    assert done.returncode != 0
    assert "no-such-page" in done.stderr, done.stderr[-2000:]


def test_a_card_s_page_shows_the_call_paths_under_their_caption(monkeypatch) -> None:
    """What the site makes of a results area a notebook saved (its widget state): the
    call-path tree under its tab's caption, drawn by the page's plotly.js; one muted line for a
    run whose ranks' paths never parted."""
    import ipywidgets as widgets

    import rankscope

    monkeypatch.syspath_prepend(str(DOCS))
    from site_pages import widget_html

    hang = rankscope.show(ROOT / "tests" / "data" / "gloo_barrier_hang" / "run")
    clean = rankscope.show(ROOT / "tests" / "data" / "gloo_clean" / "run")
    state = widgets.Widget.get_manager_state(drop_defaults=False)["state"]
    page = widget_html(hang.model_id, state)
    caption = page.index(">call paths</div>")
    figure = page.index("Call paths: 4 ranks, 2 classes where they first parted, 2 at the end")
    assert caption < figure < page.index(">sequence ladder</div>")
    assert "Plotly.newPlot" in page[caption:] and '"type":"icicle"' in page[caption:]
    quiet = widget_html(clean.model_id, state)
    assert "rankscope-no-parting" in quiet and "followed one path" in quiet
    assert "Call paths:" not in quiet


def test_every_summary_line_of_the_api_pages_reads_as_text() -> None:
    """The API pages list each object with the first line of its docstring (sphinx-autoapi's
    summary), parsed alone: an inline literal that runs on to the next line breaks the build
    (``-W``). Each first line parses here without a warning, so the site's build does too."""
    import ast
    import io

    from docutils import nodes
    from docutils.core import publish_doctree
    from docutils.parsers.rst import roles

    def literal(name, rawtext, text, lineno, inliner, options=None, content=None):
        return [nodes.literal(rawtext, text)], []

    for role in ("mod", "func", "data", "class", "meth", "attr", "exc", "obj", "pep", "ref"):
        roles.register_local_role(role, literal)  # Sphinx's, which docutils alone lacks
    broken = []
    for path in sorted((ROOT / "src" / "rankscope").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(
                node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
            ):
                continue
            doc = ast.get_docstring(node)
            first = doc.strip().splitlines()[0] if doc else ""
            warnings = io.StringIO()
            publish_doctree(first, settings_overrides={"warning_stream": warnings})
            if warnings.getvalue():
                name = getattr(node, "name", "(module)")
                broken.append(f"{path.relative_to(ROOT)} {name}: {first!r}")
    assert not broken, "docstrings whose first line is not whole:\n" + "\n".join(broken)
