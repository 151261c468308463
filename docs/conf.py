"""Sphinx configuration of l5dask's documentation (``python docs/build.py`` builds it)."""

from __future__ import annotations

import os
import re
import sys

sys.path.insert(0, os.path.abspath(os.path.dirname(__file__)))

import measured  # noqa: E402

import l5dask  # noqa: E402

project = "l5dask"
author = "the l5dask developers"
copyright = "the l5dask developers; Apache-2.0"
version = release = l5dask.__version__

extensions = [
    "myst_nb",  # MyST Markdown pages and the notebooks (with their outputs)
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "sphinx_click",
]

source_suffix = {
    ".rst": "restructuredtext",
    ".md": "myst-nb",
    ".ipynb": "myst-nb",
}  # (.rst first: autosummary writes .rst)
exclude_patterns = ["_build", "build.py", "**.ipynb_checkpoints"]
# the notebooks are executed before the build (docs/build.py, or the test suite), with real data,
# a local S3 endpoint and a cluster; the build renders them with their outputs
nb_execution_mode = "off"
myst_enable_extensions = ["colon_fence", "deflist", "substitution"]
# the benchmarks' figures, from the files they write (docs/figures/*.json): {{ scale_cold_stats_s }}
myst_substitutions = measured.substitutions()
myst_heading_anchors = 3

autosummary_generate = True
templates_path = ["_templates"]
autodoc_typehints = "none"  # the numpydoc sections give the types
autodoc_member_order = "bysource"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False

# Types of other libraries cannot be resolved without their inventories (no network at build time);
# every reference to l5dask's own names must resolve (the build runs with -n -W).
nitpick_ignore_regex = [
    (r"py:.*", r"(numpy|np|pandas|pd|dask|da|dd|xarray|xr|distributed|pyarrow|pa|fsspec|s3fs|click|matplotlib)(\..*)?"),
    (r"py:.*", r"(Any|Callable|Sequence|Mapping|Iterator|Iterable|optional|callable|default.*)"),
]

html_theme = "pydata_sphinx_theme"
html_title = f"l5dask {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_static_path = ["_static"]
html_css_files = ["l5dask.css"]

DOTS = re.compile(r"(?<=\w)\.(?=\w)")


def truth(value) -> bool:
    """A theme option as the theme's templates read it (jinja's ``tobool``: ``"False"`` is false)."""
    return value.strip().lower() in ("true", "1", "yes", "on") if isinstance(value, str) else bool(value)


def fit_the_window(app, pagename, templatename, context, doctree) -> None:
    """A page with no section navigation (a top-level page with no page below it) gets no left
    sidebar rather than an empty one, an API page whose contents are its own name no right
    sidebar; an API page's title and the previous/next links may break after each dot of a
    dotted name (``l5dask.prediction.aggregation.<wbr>aggregate``)."""
    make = context.get("generate_toctree_html")
    if make is not None and context.get("sidebars"):
        try:
            # (asked as the theme's sidebar template asks it, its options as it reads them: the theme
            # keeps the answer of each page, and its own call later takes it: 0.1 s a page made once)
            nav = make(
                "sidebar",
                show_nav_level=int(context.get("theme_show_nav_level", 1)),
                maxdepth=int(context.get("theme_navigation_depth", 4)),
                collapse=truth(context.get("theme_collapse_navigation", False)),
                includehidden=truth(context.get("theme_sidebar_includehidden", True)),
                titles_only=True,
            )
        except Exception:  # noqa: BLE001 - no page above this one (the index, search): the theme hides it itself
            nav = "<a"
        if "<a" not in str(nav):
            context["sidebars"] = []
    for key in ("prev", "next"):
        if context.get(key) and context[key].get("title"):
            context[key] = dict(context[key], title=DOTS.sub(".<wbr>", context[key]["title"]))
    if pagename.startswith("api/generated/") and str(context.get("toc", "")).count("<li") <= 2:
        # the right sidebar would list the page's own name only (a function's or a module's page,
        # not a class's with its members): its width goes to the page
        context["secondary_sidebar_items"] = []
    if pagename.startswith("api/generated/") and "body" in context:
        context["body"] = re.sub(
            r"(<h1>)(.*?)(<a class=\"headerlink\")",
            lambda m: m.group(1) + DOTS.sub(".<wbr>", m.group(2)) + m.group(3),
            context["body"],
            count=1,
        )


def setup(app) -> None:
    app.connect("html-page-context", fit_the_window, priority=900)
