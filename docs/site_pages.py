"""The pages of the site that are made from other sources, written before Sphinx reads any:

- ``notebooks/``: the executed notebooks (``make_site.EXECUTED``), made static: a plotly figure
  becomes a ``<div>`` drawn by the plotly.js the site serves once (``_static/plotly.min.js``); a
  widget becomes the HTML of what it showed, from the widget state the run saved (cards, tables
  and figures; its controls, which need a kernel, are left out); the run's folder is not shown;
- ``reference/public.md``: the names ``import rankscope`` gives (its lazy ``__all__``), each
  with the first line of its docstring and a link to its page of the API reference, which
  documents it where it is defined;
- ``recipes/``: a page per recipe D1-D23, the notebook section that teaches it (``## Dn: ...``)
  after what the scenario catalogue says of it, and an index of them.

Every generated folder is listed in ``docs/.gitignore``. The guide (``guide/``) is written by
hand: the README is the landing page and links to it.
"""

from __future__ import annotations

import copy
import html
import json
import re
import shutil
from pathlib import Path
from typing import Any

import make_site
import nbformat
from docutils import nodes
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.ext import napoleon

from rankscope.widgets._common import PLOTLY_MIME

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
RECIPES = [f"D{n}" for n in range(1, 24)]
#: A section of a notebook that teaches one recipe starts with this heading.
RECIPE_HEADING = re.compile(r"^## (D\d+): (.+)$", re.MULTILINE)
GENERATED = ("notebooks", "recipes", "landing", "reference")
#: The landing page shows the quickstart's card and timeline, as the quickstart's run drew them.
SHOWCASE = "00-quickstart.ipynb"
TAB_STYLE = "font-weight:600;border-bottom:1px solid #ccc;margin-top:0.8em"
SCENARIO_GET = re.compile(r'\bget\("([\w-]+)"\)')


# --- static outputs ---------------------------------------------------------------------------


def plotly_html(figure: dict[str, Any]) -> str:
    """A figure as a ``<div>`` and the call that draws it (plotly.js is loaded by the page)."""
    import plotly.io as pio

    # the title on the left, clear of the toolbar that shows on the right when hovered
    figure = copy.deepcopy(figure)
    layout = figure.setdefault("layout", {})
    title = layout.get("title") or {}
    title = {"text": title} if isinstance(title, str) else title
    layout["title"] = {**title, "x": 0, "xanchor": "left", "xref": "paper"}
    # validate=False: the figure is JSON that plotly itself wrote in the run
    return pio.to_html(
        figure,
        include_plotlyjs=False,
        full_html=False,
        validate=False,
        config={"responsive": True, "displaylogo": False},
    )


def output_html(output: dict[str, Any], state: dict[str, Any]) -> str:
    """One notebook output as HTML (what a widget's Output holds)."""
    kind = output.get("output_type")
    if kind == "stream":
        return f"<pre>{html.escape(output.get('text', ''))}</pre>"
    if kind == "error":
        return f"<pre>{html.escape(output.get('ename', ''))}: {html.escape(output.get('evalue', ''))}</pre>"
    data = output.get("data", {})
    if WIDGET_MIME in data:
        return widget_html(data[WIDGET_MIME]["model_id"], state)
    if PLOTLY_MIME in data:
        return plotly_html(data[PLOTLY_MIME])
    if "text/html" in data:
        return _text(data["text/html"])
    if "image/png" in data:
        return f"<img src='data:image/png;base64,{_text(data['image/png']).strip()}'>"
    if "text/plain" in data:
        return f"<pre>{html.escape(_text(data['text/plain']))}</pre>"
    return ""


def widget_html(model_id: str, state: dict[str, Any]) -> str:
    """What a widget showed, from the saved widget state: HTML, the outputs of an Output, the
    first rows of a grid, boxes of those, a tab's pages under their titles. Controls (buttons,
    fields), their labels, and widgets the state does not hold show nothing."""
    model = state.get(model_id)
    if model is None:
        return ""
    name, values = model.get("model_name", ""), model.get("state", {})
    layout = state.get(_ref(values.get("layout")) or "", {}).get("state", {})
    if layout.get("display") == "none" or layout.get("visibility") == "hidden":
        return ""
    children = [widget_html(_ref(c) or "", state) for c in values.get("children", [])]
    if name in ("HTMLModel", "HTMLMathModel"):
        return values.get("value", "")
    if name == "AnyModel" and "_dt_args" in values:
        return grid_html(values["_dt_args"], values.get("caption", ""))
    if name == "OutputModel":
        return "".join(output_html(o, state) for o in values.get("outputs", []))
    if name in ("VBoxModel", "BoxModel", "GridBoxModel"):
        return _box(children, "column")
    if name == "HBoxModel":
        return _box(children, "row")
    if name in ("TabModel", "AccordionModel", "StackModel"):
        titles = values.get("titles") or []
        pages = []
        for i, child in enumerate(children):
            title = titles[i] if i < len(titles) and titles[i] else f"page {i + 1}"
            if child.strip():
                # a caption, not a heading: the page's outline is the notebook's own
                caption = (
                    f"<div class='rankscope-tab' style='{TAB_STYLE}'>{html.escape(title)}</div>"
                )
                pages.append(caption + child)
        return _box(pages, "column")
    return ""


#: Rows of a grid (itables) shown on a page; the grid itself sorts and filters with a kernel.
GRID_ROWS = 15


def grid_html(args: dict[str, Any], caption: str) -> str:
    """The first :data:`GRID_ROWS` rows of an itables grid, from its saved arguments (its
    header row as HTML, its rows as JSON), as a plain table."""
    head = re.search(r"<thead>.*</thead>", args.get("table_html", ""), re.DOTALL)
    rows = json.loads(args.get("data_json") or "[]")
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_grid_value(v))}</td>" for v in row) + "</tr>"
        for row in rows[:GRID_ROWS]
    )
    more = len(rows) - GRID_ROWS
    note = f"<p class='rankscope-grid-note'>the first {GRID_ROWS} of {len(rows)} rows</p>"
    return (
        "<div class='rankscope-grid'><table>"
        f"<caption>{html.escape(caption)}</caption>{head.group(0) if head else ''}"
        f"<tbody>{body}</tbody></table>{note if more > 0 else ''}</div>"
    )


def _grid_value(value: Any) -> str:
    """A grid cell's text (itables sends a float as ``[text, value]``); nothing where nothing
    is known (pandas' ``<NA>``, ``NaN``)."""
    text = str(value[0] if isinstance(value, list) else value)
    return "" if text in ("<NA>", "NaN", "None") else text


def _box(children: list[str], direction: str) -> str:
    shown = [c for c in children if c.strip()]
    if not shown:
        return ""
    # a row wraps; a column does not (a wrapping column's items take their content's width,
    # not the page's); no item is wider than the page
    wrap = ";flex-wrap:wrap" if direction == "row" else ""
    style = f"display:flex;flex-direction:{direction};gap:0.5em{wrap}"
    item = "<div style='min-width:0;max-width:100%'>{}</div>"
    return f"<div style='{style}'>{''.join(item.format(c) for c in shown)}</div>"


def _ref(value: Any) -> str | None:
    if isinstance(value, str) and value.startswith("IPY_MODEL_"):
        return value[len("IPY_MODEL_") :]
    return None


def _text(value: str | list[str]) -> str:
    return "".join(value) if isinstance(value, list) else value


def make_static(nb: nbformat.NotebookNode, hide: list[str]) -> nbformat.NotebookNode:
    """A copy of an executed notebook whose outputs need no kernel and no widget manager, with
    the paths in ``hide`` (the run's folder) taken out of every output."""
    nb = copy.deepcopy(nb)
    state = nb.metadata.pop("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for output in cell.get("outputs", []):
            data = output.get("data")
            if data and (WIDGET_MIME in data or PLOTLY_MIME in data):
                output["data"] = {"text/html": output_html(output, state)}
        for output in cell.get("outputs", []):
            for path in hide:
                _replace_in(output, path.rstrip("/") + "/", "")
                _replace_in(output, path.rstrip("/"), ".")
    return nb


def _replace_in(output: dict[str, Any], old: str, new: str) -> None:
    if "text" in output:
        output["text"] = _text(output["text"]).replace(old, new)
    for mime, value in output.get("data", {}).items():
        if mime.startswith("text/"):
            output["data"][mime] = _text(value).replace(old, new)


# --- recipes ----------------------------------------------------------------------------------


def recipe_sections(nb: nbformat.NotebookNode) -> dict[str, tuple[str, list[Any]]]:
    """``{"D21": (title, cells)}``: each ``## Dn: title`` section of a notebook, up to the next
    ``##`` heading, the heading line itself left out and the section's own headings one level
    up (the page's title is the section's)."""
    sections: dict[str, tuple[str, list[Any]]] = {}
    current: list[Any] | None = None
    for cell in nb.cells:
        source = cell.source
        if cell.cell_type == "markdown" and re.search(r"^## ", source, re.MULTILINE):
            found = RECIPE_HEADING.search(source)
            current = None
            if found:
                current = []
                sections[found.group(1)] = (found.group(2).strip(), current)
                cell = copy.deepcopy(cell)
                cell.source = source.replace(found.group(0), "").strip()
                if not cell.source:
                    continue
        if current is not None:
            if cell.cell_type == "markdown":  # the page's title is the section's: one level up
                cell = copy.deepcopy(cell)
                cell.source = re.sub(r"^#(#{2,}) ", r"\1 ", cell.source, flags=re.MULTILINE)
            current.append(cell)
    return sections


def recipe_intro(recipe: str, title: str, notebook: str, notebook_of: dict[str, str]) -> str:
    """What the catalogue says of a recipe: its scenarios, and the reported deadlocks like it
    (``notebook_of``: the notebook that runs each scenario)."""
    from rankscope.scenarios import catalogue

    lines = [f"# {recipe}: {title}", ""]
    mine = [s for s in catalogue() if s.recipe == recipe]
    for s in (s for s in mine if s.kind == "recipe"):
        want = s.expected
        culprits = want.get("culprit_ranks")
        lines += [
            f"**Scenario `{s.id}`** ({s.script}, {s.nnodes * s.nproc_per_node} ranks): "
            f"{s.what_goes_wrong}",
            "",
            f"**The fix:** {s.fix}",
            "",
            f"**What rankscope says of the broken run:** verdict `{want['verdict']}`"
            + (f", cause `{want['cause']}`" if want.get("cause") else "")
            + (f", culprit ranks {culprits}" if culprits else "")
            + ".",
            "",
        ]
    reported = [s for s in mine if s.kind == "reported"]
    if reported:
        links = ", ".join(f"[{s.title}](../notebooks/{notebook_of[s.id]})" for s in reported)
        lines += [f"Reported deadlocks of this kind: {links}.", ""]
    lines += [
        f"This page is the section of [{notebook}](../notebooks/{notebook}) that teaches "
        f"{recipe}, run on CPU with gloo; the notebook's first cells set it up.",
        "",
    ]
    return "\n".join(lines)


# --- the landing page -------------------------------------------------------------------------


def showcase(nb: nbformat.NotebookNode) -> str:
    """The first diagnosis card and the first rank timeline of a static notebook, side by
    side, as a Markdown page of raw HTML (the landing page includes it)."""
    found: dict[str, str] = {}
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            text = _text(data.get("text/html", ""))
            if _text(data.get("text/plain", "")).startswith("Diagnosis("):
                found.setdefault("card", text)  # a cell's Diagnosis, not the workbench
            elif "Rank timeline" in text and "rankscope-card" not in text:
                found.setdefault("timeline", text)  # a cell's figure
    if len(found) < 2:
        raise ExtensionError(f"{SHOWCASE} has no diagnosis card or no rank timeline to show")
    return (
        "```{raw} html\n<div class='rs-showcase'>"
        f"<div class='rs-showcase-card'>{found['card']}</div>"
        f"<div class='rs-showcase-timeline'>{found['timeline']}</div></div>\n```\n"
    )


# --- the public names -------------------------------------------------------------------------


def _assigns(module: Any, name: str) -> bool:
    """Whether ``module``'s source assigns ``name`` at its top level (defines it, not imports it)."""
    import ast

    tree = ast.parse(Path(module.__file__).read_text())
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
    return False


def public_names() -> str:
    """The API reference's root: every public name of the package, where it is documented."""
    import sys

    import rankscope

    rows = []
    for name in rankscope.__all__:
        obj = getattr(rankscope, name)
        if name == "__version__":
            continue
        where = getattr(obj, "__module__", None)
        if where is None or not hasattr(obj, "__qualname__"):  # a value: the module defining it
            where = next(
                m
                for m, mod in list(sys.modules.items())
                if m.startswith("rankscope.") and vars(mod).get(name) is obj and _assigns(mod, name)
            )
            target = f"{where}.{name}"
        else:
            target = f"{where}.{obj.__qualname__}"
        doc = (getattr(obj, "__doc__", None) or "").strip().split("\n\n")[0]
        if not callable(obj) or not doc:
            doc = f"defined in {{py:mod}}`{where}`"
        rows.append(f"| {{py:obj}}`rankscope.{name} <{target}>` | {' '.join(doc.split())} |")
    return (
        "# Public API\n\n"
        "What `import rankscope` gives; each name links to its page of the reference, where it "
        "is defined. Every module: {doc}`the reference by module <../api/rankscope/index>`.\n\n"
        "| name | what it is |\n| --- | --- |\n" + "\n".join(rows) + "\n"
    )


# --- the build --------------------------------------------------------------------------------


def generate(app: Sphinx) -> None:
    src = Path(app.srcdir)
    for name in GENERATED:
        shutil.rmtree(src / name, ignore_errors=True)
        (src / name).mkdir()

    static: dict[str, nbformat.NotebookNode] = {}
    notebook_of: dict[str, str] = {}  # scenario id -> the first notebook that runs it
    for path in sorted(make_site.NOTEBOOKS.glob("*.ipynb")):
        executed = make_site.EXECUTED / path.name
        if not executed.is_file():
            raise ExtensionError(
                f"no executed copy of {path.name} in {make_site.EXECUTED.relative_to(make_site.ROOT)}: "
                "build the site with make docs, which runs it"
            )
        nb = nbformat.read(executed, as_version=4)
        meta = nb.metadata.pop(make_site.META_KEY, {})
        hide = [p for p in (meta.get("workdir"), str(make_site.ROOT)) if p]
        static[path.name] = make_static(nb, hide)
        nbformat.write(static[path.name], src / "notebooks" / path.name)
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        for scenario_id in SCENARIO_GET.findall(code):  # s = get("d21")
            notebook_of.setdefault(scenario_id, path.name)

    (src / "landing" / "showcase.md").write_text(showcase(static[SHOWCASE]))
    (src / "reference" / "public.md").write_text(public_names())

    found: dict[str, tuple[str, str, list[Any]]] = {}
    for name, nb in static.items():
        for recipe, (title, cells) in recipe_sections(nb).items():
            found.setdefault(recipe, (name, title, cells))
    missing = [r for r in RECIPES if r not in found]
    if missing:
        raise ExtensionError(f"no notebook section '## Dn: ...' teaches {', '.join(missing)}")
    rows = [
        "# The recipes D1-D23",
        "",
        "| recipe | what goes wrong | taught in |",
        "| --- | --- | --- |",
    ]
    for recipe in RECIPES:
        notebook, title, cells = found[recipe]
        page = nbformat.v4.new_notebook(metadata=static[notebook].metadata)
        page.cells = [
            nbformat.v4.new_markdown_cell(recipe_intro(recipe, title, notebook, notebook_of)),
            *cells,
        ]
        nbformat.write(page, src / "recipes" / f"{recipe.lower()}.ipynb")
        rows.append(
            f"| [{recipe}]({recipe.lower()}.ipynb) | {title} | [{notebook}](../notebooks/{notebook}) |"
        )
    rows += [
        "",
        "```{toctree}",
        ":hidden:",
        "",
        *(f"{r.lower()}" for r in RECIPES),
        "```",
        "",
    ]
    (src / "recipes" / "index.md").write_text("\n".join(rows))

    import plotly

    static_dir = make_site.STATIC
    static_dir.mkdir(parents=True, exist_ok=True)
    plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    shutil.copyfile(plotly_js, static_dir / "plotly.min.js")


def napoleon_except_attributes(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    """napoleon for the docstrings of modules, classes and functions (their ``Args:`` and
    ``Attributes:`` sections), not for those of attributes: ours are prose
    (``Diagnosis of the broken run: verdict, ...``), and napoleon would take the text before
    their first colon for a type."""
    if what not in ("attribute", "data", "property"):
        napoleon._process_docstring(app, what, name, obj, options, lines)


#: A URL with a placeholder for its host or port (``http://HOST:PORT``) is text, not a link.
PLACEHOLDER_URL = re.compile(r"^https?://[^/]*\b(HOST|PORT)\b")


def placeholder_urls_as_text(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    """docutils links every URL it sees, ``http://HOST:PORT`` of the CLI's help included."""
    for ref in list(doctree.findall(nodes.reference)):
        if PLACEHOLDER_URL.match(ref.get("refuri", "")):
            ref.replace_self(nodes.literal(text=ref.astext()))


def plain_search_names(app: Sphinx, *_: Any) -> list[Any]:
    """The search index gets the documented objects' names as text. Sphinx escapes them for
    HTML, and its search page escapes what it shows again: a command documented by its help
    ("Fetch every rank's Python stacks...") was listed as "rank&#x27;s". Runs before the index
    is written (the HTML builder collects extra pages first); adds no page."""
    indexer = getattr(app.builder, "indexer", None)
    if indexer is not None and not hasattr(indexer.get_objects, "plain"):
        escaped = indexer.get_objects

        def get_objects(fn2index: dict[str, int]) -> dict[str, list[tuple[Any, ...]]]:
            objects: dict[str, list[tuple[Any, ...]]] = {}
            for prefix, rows in escaped(fn2index).items():
                plain = [(*row[:-1], html.unescape(row[-1])) for row in rows]
                objects.setdefault(html.unescape(prefix), []).extend(plain)
            return objects

        get_objects.plain = True  # type: ignore[attr-defined]
        indexer.get_objects = get_objects
    return []


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("builder-inited", generate)
    app.connect("html-collect-pages", plain_search_names)
    app.connect("doctree-resolved", placeholder_urls_as_text)
    app.add_css_file("rankscope.css")
    app.add_js_file("rankscope.js")
    for listener in list(app.events.listeners.get("autodoc-process-docstring", [])):
        if listener.handler is napoleon._process_docstring:
            app.disconnect(listener.id)
    app.connect("autodoc-process-docstring", napoleon_except_attributes)
    app.add_js_file("plotly.min.js", priority=100)
    return {"parallel_read_safe": True}
