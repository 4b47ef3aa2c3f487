"""Sphinx settings of the site (``make docs``; see make_site.py and site_pages.py)."""

import sys
from pathlib import Path

from astroid import MANAGER
from astroid.manager import AstroidManager

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # make_site.py and site_pages.py

project = "rankscope"
author = "the rankscope authors"
copyright = "the rankscope authors"

# napoleon reads the Google-style sections (Args:, Attributes:) of the docstrings
extensions = ["myst_nb", "autoapi.extension", "sphinxarg.ext", "sphinx.ext.napoleon", "site_pages"]
exclude_patterns = ["_build"]
root_doc = "index"

# myst-nb: the notebooks come executed (make_site.py), never run here; their outputs are made
# static by site_pages.py, so no widget manager or plotly renderer is loaded from elsewhere.
nb_execution_mode = "off"
nb_output_stderr = "show"
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# The API reference, from the docstrings of the public modules (read, not imported).
autoapi_dirs = [str(HERE.parent / "src" / "rankscope")]
autoapi_root = "api"
autoapi_add_toctree_entry = False
autoapi_keep_files = False
autoapi_ignore = ["*/scenarios/scripts/*", "*/__pycache__/*"]
autoapi_options = ["members", "undoc-members", "show-module-summary"]
autoapi_member_order = "bysource"


class _Libraries(set):
    """Every module but rankscope's and the standard library's. autoapi reads the sources with
    astroid, which follows each import into the libraries it names (pandas, numba, torch) and
    infers through them: a quarter of the build's time, for pages that only name those classes
    (their output is the same without)."""

    def __contains__(self, name: object) -> bool:
        top = str(name).partition(".")[0]
        return top != "rankscope" and top not in sys.stdlib_module_names


# every manager astroid makes shares its brain's list (and the one made at its import holds it)
AstroidManager.brain["module_denylist"] = MANAGER.module_denylist = _Libraries()

# A class's "Attributes:" section as fields of the class, not a second entry of each attribute.
napoleon_use_ivar = True

html_theme = "sphinx_book_theme"
html_title = "rankscope"
# the pages are the docs; their sources (notebooks with every output) would double the site
html_copy_source = False
html_show_sourcelink = False
# the site's stylesheet and script (_static), and plotly.js, copied in by site_pages.py (the
# folder exists for any build of these settings)
html_static_path = ["_static", "_build/static"]
(HERE / "_build" / "static").mkdir(parents=True, exist_ok=True)
html_theme_options = {
    "show_toc_level": 2,
    "use_download_button": False,
    "use_fullscreen_button": False,
    # the sidebar opens the current page's branch only: each page's copy of the whole tree
    # (the API reference's hundred pages) was a third of the build's time
    "collapse_navbar": True,
}
# One search box: the header's button (the sidebar's field would be a second one).
html_sidebars = {"**": ["navbar-logo.html", "icon-links.html", "sbt-sidebar-nav.html"]}
# No request to another host while the site is built or read, beyond what a reader follows.
html_theme_options["navigation_with_keys"] = False

# Names a package re-exports from its private modules: the reference documents them where they
# are defined, so an import autoapi cannot follow to a page is not a broken link.
suppress_warnings = ["autoapi.python_import_resolution"]
smartquotes = False  # option names keep their two hyphens (--on-stall)
