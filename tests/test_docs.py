"""The documentation: every example of the README and the docs runs, the site builds with no
warning, and a real browser renders it.

- Every ```python block of a page runs, in order, in one namespace per page, in a fresh folder
  holding what the README's first command leaves there (``l5dask-demo/``, from ``l5dask demo``)
  and nothing else: the data an example reads is made by that command or by a line of the page
  (``l5dask synth --output sample.zarr ...``), as for a user. Every ```console block runs its ``$`` lines
  with bash there, and each must exit 0 (a block that shows a failure says so with ``|| echo``).
  A block that cannot run (the set-up commands themselves, docker) has a
  ``<!-- docs-test: skip (why) -->`` line just before it; a ```bash block that calls ``l5dask``
  without one is an error (CLI examples are console blocks, so that they run). A block that needs
  a bucket of the reader's (``your-bucket``, which its page says) has a
  ``<!-- docs-test: bucket (why) -->`` line: it runs with the usual AWS environment naming a local
  S3 endpoint (moto's server) that has an empty ``your-bucket``; no other block sees that
  environment. A block with a ``<!-- docs-test: file (NAME) -->`` line (a job file, in TOML or
  YAML) is written to ``NAME`` in that folder, for the blocks after it.
- ``python docs/build.py`` (``sphinx-build -W --keep-going -n``: every warning and broken reference
  an error) builds the site from the notebooks executed once here (``executed_notebooks``); the
  notebook tests below check those same runs. They are in this file so that one test process makes
  them (the suite's processes each take whole files: the notebooks' 30 s runs once, not twice).
- Headless chromium opens the index, an API page and the search page: styles loaded, nothing wider
  than a 1280 px window, and the search finds ``open_dataset``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from .conftest import CHROMIUM, require

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)]
FENCE = re.compile(r"^```(\w*)\s*$")
MARK = re.compile(r"^<!-- docs-test: (skip|bucket|file) \((.+)\) -->$")
BUCKET = "your-bucket"  # the bucket the examples say stands for the reader's


def blocks(path: Path) -> list[tuple[int, str, str, tuple[str, str] | None]]:
    """``(line, language, code, mark)`` of each fenced block of a Markdown page, ``mark`` the
    ``(kind, why)`` of its ``docs-test`` line (``skip``, ``bucket`` or ``file``) or None."""
    out, lines, i = [], path.read_text().splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m and m.group(1) not in ("", "{toctree}", "{eval-rst}", "{include}"):
            start, lang, body = i + 1, m.group(1), []
            i += 1
            while i < len(lines) and lines[i].rstrip() != "```":
                body.append(lines[i])
                i += 1
            before = lines[start - 2].strip() if start >= 2 else ""
            mark = MARK.match(before)
            out.append((start, lang, "\n".join(body) + "\n", (mark.group(1), mark.group(2)) if mark else None))
        i += 1
    return out


def test_the_block_parser_sees_languages_and_skip_markers(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "text\n<!-- docs-test: skip (why not) -->\n```bash\nls\n```\n```python\nx = 1\n```\n"
        "<!-- docs-test: bucket (a bucket) -->\n```python\ny = 2\n```\n"
    )
    assert blocks(page) == [
        (3, "bash", "ls\n", ("skip", "why not")),
        (6, "python", "x = 1\n", None),
        (10, "python", "y = 2\n", ("bucket", "a bucket")),
    ]


@pytest.fixture(scope="session")
def after_first_command(tmp_path_factory) -> Path:
    """A folder as the README's first command leaves it: ``l5dask demo`` has run there (each
    page gets a copy of its ``l5dask-demo/``, hard links)."""
    root = tmp_path_factory.mktemp("docs-first-command")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    r = subprocess.run(
        [sys.executable, "-m", "l5dask.cli", "demo"], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert (root / "l5dask-demo" / "report.html").exists()
    return root


def page_env() -> dict[str, str]:
    """A user's environment: this one without any AWS variable (no bucket, no endpoint)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(MPLBACKEND="Agg", PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""))
    return env


RUNNER = """
import os, subprocess, sys, traceback
blocks = eval(open(sys.argv[1]).read())
bucket_env = eval(open(sys.argv[3]).read())
ns = {"__name__": "__docs__"}
for line, lang, code, mark in blocks:
    where = f"{sys.argv[2]}:{line}"
    if mark and mark[0] == "file":
        with open(mark[1], "w") as f:
            f.write(code)
        continue
    bucket = bool(mark and mark[0] == "bucket")
    saved = dict(os.environ)
    if bucket:
        os.environ.update(bucket_env)
    try:
        if lang == "console":
            for cmd in [c[2:] for c in code.splitlines() if c.startswith("$ ")]:
                r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=300)
                if r.returncode != 0:
                    print(r.stdout[-2000:], r.stderr[-3000:], f"DOCS-BLOCK-FAILED {where}: $ {cmd}", file=sys.stderr)
                    sys.exit(1)
            continue
        try:
            exec(compile(code, where, "exec"), ns)
        except BaseException:
            traceback.print_exc()
            print(f"DOCS-BLOCK-FAILED {where}", file=sys.stderr)
            sys.exit(1)
    finally:
        os.environ.clear()
        os.environ.update(saved)
"""


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_example_of_the_page_runs(page, after_first_command, s3, tmp_path):
    found = blocks(page)
    for line, lang, code, mark in found:
        if lang in ("bash", "sh", "shell") and re.search(r"(^|\s)l5dask\s", code) and mark is None:
            pytest.fail(f"{page.name}:{line}: a CLI example in a bash block: make it a console block, or mark it")
        if BUCKET not in code and mark and mark[0] == "bucket":
            pytest.fail(f"{page.name}:{line}: a block marked as needing a bucket names no {BUCKET}")
        if BUCKET in code and not (mark and mark[0] in ("bucket", "skip", "file")):
            pytest.fail(f"{page.name}:{line}: a block that reads {BUCKET} needs a docs-test: bucket line")
        if re.search(r"s3://(?!(your-bucket|bucket)/)[a-z0-9][a-z0-9.-]{2,}/", code) and mark is None:
            pytest.fail(f"{page.name}:{line}: a bucket the reader does not have (say your-bucket, and mark the block)")
    runnable = [
        (line, lang, code, mark)
        for line, lang, code, mark in found
        if (lang in ("python", "console") and (mark is None or mark[0] == "bucket")) or (mark and mark[0] == "file")
    ]
    if not runnable:
        pytest.skip("no runnable block")
    work = tmp_path / "work"
    shutil.copytree(after_first_command, work, copy_function=os.link)
    if any(mark and mark[0] == "bucket" for *_, mark in runnable):
        s3.make_bucket(BUCKET)
        fs = s3.s3fs()
        if fs.exists(BUCKET):  # empty, as a reader's new bucket (pages do not see each other's objects)
            for key in fs.ls(BUCKET):
                fs.rm(key, recursive=True)
    # the page's blocks in order, in one process (one namespace), console lines run by bash
    spec, bucket_env = tmp_path / "blocks.py", tmp_path / "bucket_env.py"
    spec.write_text(repr(runnable))
    bucket_env.write_text(repr({k: v for k, v in s3.environment().items() if k.startswith("AWS_")}))
    r = subprocess.run(
        [sys.executable, "-c", RUNNER, str(spec), page.name, str(bucket_env)],
        cwd=work,
        env=page_env(),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-5000:]


def documented_callables() -> list[str]:
    """The dotted names of docs/api.md's autosummary entries (each under its ``currentmodule``)."""
    names, module = [], ""
    for line in (ROOT / "docs" / "api.md").read_text().splitlines():
        if line.startswith(".. currentmodule:: "):
            module = line.split("::", 1)[1].strip()
        elif re.fullmatch(r"   [A-Za-z_][\w.]*", line) and module:
            names.append(f"{module}.{line.strip()}")
    return names


def test_every_documented_function_shows_its_parameters():
    """The API pages show a function's signature as ``inspect`` sees it: a bare ``(*args,
    **kwargs)`` (a pass-through wrapper) would hide its parameters there."""
    import importlib
    import inspect

    names, hidden = documented_callables(), []
    assert "l5dask.prediction.aggregation.aggregate" in names
    for name in names:
        parts, obj = name.split("."), None
        for i in range(len(parts), 0, -1):  # the longest importable module, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for attr in parts[i:]:
                obj = getattr(obj, attr)
            break
        if inspect.isfunction(obj):
            kinds = {p.kind for p in inspect.signature(obj).parameters.values()}
            if kinds and kinds <= {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}:
                hidden.append(name)
    assert not hidden


def measured():
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import measured
    finally:
        sys.path.pop(0)
    return measured


# The README's sentence of figures, each a figure of docs/figures/*.json: edit both together.
README_FIGURES = (
    "`l5dask stats` takes {stats_stats_s} for 30 M agents on 2 cores, {stats_numpy_x} the time of a plain numpy "
    "loop (`python benchmarks/stats_benchmark.py`); `l5dask evaluate` runs {evaluation_evaluate_l5kit_x} L5Kit's "
    "rows per second (`python benchmarks/evaluation_benchmark.py`). At 1.02 G agents (28.6 GB stored, read cold "
    "from the disk) `l5dask stats` takes {scale_cold_stats_s}, {scale_cold_stats_x} reading and decoding every "
    "chunk, in {scale_cold_stats_gb} of memory"
)


def test_the_readme_quotes_the_recorded_figures():
    """The README's figures are those the benchmarks recorded in docs/figures (the pages take them
    from there through substitutions, so only the README could drift)."""
    subs = measured().substitutions()
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert README_FIGURES.format(**subs) in readme


def test_every_figure_the_pages_name_is_recorded():
    """Each ``{{ name }}`` of a page is a recorded figure (a misspelt one would print as is), and
    each file holds a command, a date and figures whose names say their unit."""
    m = measured()
    subs = m.substitutions()
    files = m.load()
    assert {"scale_cold", "scale_warm", "s3_latency", "stats", "evaluation"} <= set(files)
    for data in files.values():
        assert data["command"].startswith("python benchmarks/") and re.fullmatch(r"\d{4}-\d\d-\d\d", data["date"])
    used = set()
    for page in PAGES[1:]:
        used |= set(re.findall(r"\{\{\s*(\w+)\s*\}\}", page.read_text()))
    assert used and not used - set(subs)
    assert m.text("a_x", [1.13, 1.14]) == "1.13-1.14x" and m.text("a_x", 0.037) == "0.037x"
    assert (
        m.text("a_s", 28.5) == "28.5 s" and m.text("a_gb", 0.21) == "0.21 GB" and m.text("a_x", [98, 149]) == "98-149x"
    )
    with pytest.raises(ValueError, match="unit"):
        m.text("seconds", 1.0)


def test_the_recorded_figures_are_strict_json():
    """docs/figures/*.json parse with a parser that refuses NaN and Infinity, and a figure that is
    not a finite number is refused before anything is written."""

    def refuse(name):
        raise AssertionError(f"{name} is not JSON")

    m = measured()
    for path in sorted(m.FIGURES.glob("*.json")):
        json.loads(path.read_text(), parse_constant=refuse)
    before = {p: p.read_bytes() for p in m.FIGURES.glob("*")}
    for bad in (float("nan"), [1.0, float("inf")]):
        with pytest.raises(ValueError, match="finite"):
            m.record("stats", "python benchmarks/stats_benchmark.py", {"stats_s": bad})
    assert {p: p.read_bytes() for p in m.FIGURES.glob("*")} == before


def test_a_benchmark_records_its_figures(tmp_path, monkeypatch):
    """``record`` writes the file the pages read (atomically: no partial file), with the commit."""
    m = measured()
    monkeypatch.setattr(m, "FIGURES", tmp_path)
    path = m.record("probe", "python benchmarks/probe.py", {"stats_s": 1.5, "stats_x": [1.1, 1.2]})
    assert m.load()["probe"]["figures"] == {"stats_s": 1.5, "stats_x": [1.1, 1.2]}
    assert m.substitutions()["probe_stats_x"] == "1.10-1.20x" and path == tmp_path / "probe.json"
    assert [p.name for p in tmp_path.iterdir()] == ["probe.json"]
    with pytest.raises(ValueError):
        m.record("bad", "python benchmarks/bad.py", {"seconds": 1.0})
    assert not (tmp_path / "bad.json").exists()


OUTSIDE = ".." + "/shared"  # (spelled apart: this file names it without referring to it)


def test_no_file_refers_outside_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    bad = []
    for name in tracked:
        path = ROOT / name
        if path.suffix in (".py", ".md", ".toml", ".yaml", ".yml", ".txt", ".ipynb", ".cfg", ".pyx", ".h"):
            if OUTSIDE in path.read_text(errors="replace"):
                bad.append(name)
    assert not bad


def test_readme_is_short_and_starts_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) <= 6 * 1024
    first = blocks(ROOT / "README.md")[0]
    assert first[1] == "bash" and "l5dask demo" in first[2] and "bash .ci/run" in first[2]
    assert first[0] <= 5  # the first thing on the page


# --- the site -------------------------------------------------------------------------------------
HAVE_SPHINX = importlib.util.find_spec("sphinx") is not None and importlib.util.find_spec("myst_nb") is not None


@pytest.fixture(scope="session")
def site(executed_notebooks, tmp_path_factory) -> Path:
    require(HAVE_SPHINX, "sphinx and the docs extras (pip install -e '.[docs]')")
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        from build import build
    finally:
        sys.path.pop(0)
    out = tmp_path_factory.mktemp("site")
    r = build(out, executed_notebooks)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    assert "WARNING" not in r.stderr and "ERROR" not in r.stderr, r.stderr[-6000:]
    return out


def test_the_site_builds_with_every_page(site):
    for page in (
        "index.html",
        "getting-started.html",
        "guide/prediction.html",
        "api.html",
        "cli.html",
        "notebooks/01_quickstart.html",
        "changelog.html",
        "search.html",
    ):
        assert (site / page).exists(), page
    quickstart = (site / "notebooks/01_quickstart.html").read_text()
    assert "data:image/png" in quickstart or "<img" in quickstart  # rendered with its figures
    cli = (site / "cli.html").read_text()
    assert "select-agents" in cli and "perception" in cli
    # the right sidebar ("On this page") stays where it lists something: gone only from API pages
    # whose contents are their own name
    assert "bd-sidebar-secondary" in (site / "guide/clusters.html").read_text()
    assert "bd-sidebar-secondary" in (site / "api/generated/l5dask.prediction.dataset.L5Dataset.html").read_text()
    assert (
        "bd-sidebar-secondary" not in (site / "api/generated/l5dask.prediction.aggregation.aggregate.html").read_text()
    )


PROBE = """
<script>
window.addEventListener("load", function () {
  setTimeout(function () {
    var html = document.documentElement;
    var sheets = 0;
    for (var i = 0; i < document.styleSheets.length; i++) {
      try { if (document.styleSheets[i].cssRules.length > 0) sheets++; } catch (e) {}
    }
    html.setAttribute("data-sheets", String(sheets));
    html.setAttribute("data-overflow", String(html.scrollWidth > window.innerWidth + 1));
    var found = document.querySelectorAll("#search-results li, #search-results a").length;
    html.setAttribute("data-results", String(found));
  }, 2500);
});
</script>
"""


def render(site: Path, page: str, tmp_path: Path, query: str = "") -> str:
    """The DOM of ``page`` after load, as headless chromium at 1280 px saw it (the page with a
    probe script added, beside the original so that its relative links hold)."""
    require(CHROMIUM is not None, "chromium (Debian's package)")
    src = site / page
    probe = src.with_name(f"_probe_{src.name}")
    probe.write_text(src.read_text().replace("</body>", PROBE + "</body>"))
    url = probe.as_uri() + query
    return dump_dom(url, tmp_path, "1280,1000", 8000, timeout=120).stdout


def dump_dom(url: str, tmp_path: Path, window: str, budget_ms: int, timeout: int) -> subprocess.CompletedProcess:
    """Headless chromium's DOM of ``url`` after ``budget_ms`` of virtual time, in a window of ``window``."""
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--allow-file-access-from-files",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--window-size={window}",
            f"--virtual-time-budget={budget_ms}",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize("page", ["index.html", "api/generated/l5dask.prediction.dataset.open_dataset.html"])
def test_chromium_renders_pages_styled_and_within_1280_px(site, page, tmp_path):
    dom = render(site, page, tmp_path)
    sheets = re.search(r'data-sheets="(\d+)"', dom)
    assert sheets and int(sheets.group(1)) >= 2, "the theme's styles did not load"
    assert 'data-overflow="false"' in dom, "something is wider than a 1280 px window"


def test_search_finds_open_dataset(site, tmp_path):
    dom = render(site, "search.html", tmp_path, "?q=open_dataset")
    found = re.search(r'data-results="(\d+)"', dom)
    assert found and int(found.group(1)) > 0, "the search found nothing"
    assert "open_dataset" in dom


CUT = r"""
function cut(doc, win) {
  var out = [];
  var article = doc.querySelector("article.bd-article");
  if (!article) return ["no article"];
  var right = article.getBoundingClientRect().right;
  function said(el) { return el.tagName.toLowerCase() + " '" + (el.textContent || "").trim().slice(0, 60) + "'"; }
  doc.querySelectorAll("article h1, article h2, article h3, .prev-next-title").forEach(function (el) {
    var r = el.getBoundingClientRect();
    if (r.width > 0 && (el.scrollWidth > el.clientWidth + 1 || r.right > right + 1)) out.push("title " + said(el));
  });
  doc.querySelectorAll("article table").forEach(function (el) {
    var box = el.parentElement;
    if (el.getBoundingClientRect().right > right + 1 || box.scrollWidth > box.clientWidth + 1)
      out.push("table " + said(el.querySelector("th, td") || el));
  });
  var side = doc.querySelector(".bd-sidebar-primary");
  if (side && side.getBoundingClientRect().width > 0) {
    var shown = Array.prototype.filter.call(side.querySelectorAll("a"), function (a) {
      return a.getBoundingClientRect().width > 0;
    });
    if (shown.length === 0) out.push("an empty left sidebar");
  }
  if (doc.documentElement.scrollWidth > win.innerWidth + 1) out.push("the page is wider than the window");
  return out;
}
"""
EACH_PAGE = """<!doctype html><html><body style="margin:0">
<iframe id="page" style="width:1280px;height:900px;border:0"></iframe>
<script>%s
var pages = %s, found = {}, i = 0, frame = document.getElementById("page");
function next() {
  if (i >= pages.length) { document.body.setAttribute("data-cut", JSON.stringify(found)); return; }
  frame.onload = function () {
    setTimeout(function () {
      try { found[pages[i]] = cut(frame.contentDocument, frame.contentWindow); }
      catch (e) { found[pages[i]] = ["not measured: " + e]; }
      i++;
      next();
    }, 300);
  };
  frame.src = pages[i];
}
next();
</script></body></html>"""


def test_nothing_is_cut_in_a_1280_px_window(site, tmp_path):
    """Every page of the site in a 1280x900 frame of headless chromium: no title (an API page's
    dotted name), previous/next link or table runs past the article's edge or scrolls inside its
    box, no left sidebar is shown empty, and the page is no wider than the window."""
    require(CHROMIUM is not None, "chromium (Debian's package)")
    import html
    import json

    pages = sorted(
        str(p.relative_to(site))
        for p in site.rglob("*.html")
        if p.name not in ("search.html", "genindex.html") and not any(part.startswith("_") for part in p.parts)
    )
    assert "benchmarks.html" in pages and "api/generated/l5dask.prediction.aggregation.aggregate.html" in pages
    harness = site / "_cut_probe.html"
    harness.write_text(EACH_PAGE % (CUT, json.dumps(pages)))
    try:
        r = dump_dom(harness.as_uri(), tmp_path, "1300,950", 2000 * len(pages), timeout=900)
    finally:
        harness.unlink()
    found = re.search(r'data-cut="([^"]*)"', r.stdout)
    assert found, r.stderr[-3000:]
    cut = json.loads(html.unescape(found.group(1)))
    assert sorted(cut) == pages  # every page measured
    bad = {page: what for page, what in cut.items() if what}
    assert not bad, bad


# --- the notebooks ----------------------------------------------------------------------------------
# Every notebook runs top to bottom (nbclient, a real kernel) on generated data, a local S3 endpoint
# and the test cluster, with no manual step: the session's ``executed_notebooks`` (tests/conftest.py),
# which the site renders too.
def outputs(nb) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]


def load(executed_notebooks, name: str):
    return nbformat.read(executed_notebooks / name, as_version=4)


def test_quickstart(executed_notebooks):
    nb = load(executed_notebooks, "01_quickstart.ipynb")
    assert (executed_notebooks / "01_quickstart" / "quickstart.zarr" / ".zgroup").exists()
    assert sum("image/png" in o.get("data", {}) for o in outputs(nb)) >= 2
    assert not [o for o in outputs(nb) if o.output_type == "error"]


def test_cluster_and_s3(executed_notebooks):
    nb = load(executed_notebooks, "02_cluster_and_s3.ipynb")
    text = "".join(o.get("text", "") for o in outputs(nb))
    assert "Num Scenes" in text


def test_scene_explorer(executed_notebooks):
    nb = load(executed_notebooks, "03_scene_explorer.ipynb")
    assert sum("image/png" in o.get("data", {}) for o in outputs(nb)) == 3


def test_custom_aggregations(executed_notebooks):
    nb = load(executed_notebooks, "04_custom_aggregations.ipynb")
    assert not [o for o in outputs(nb) if o.output_type == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs(nb)) >= 3
    by_label = pd.read_csv(executed_notebooks / "04_custom_aggregations" / "by_label.csv")
    assert list(by_label.columns) == ["label", "speed_mean", "speed_count"]


def test_markdown_cells_start_with_their_text():
    """No markdown cell opens with a stray marker line (such as ``md``), which the pages render as
    a paragraph of its own."""
    from pathlib import Path

    stray = []
    for path in sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
            first = cell.source.split("\n", 1)[0].strip() if cell.cell_type == "markdown" else ""
            if first.lower() in ("md", "markdown", "%%md", "%%markdown"):
                stray.append(f"{path.name} cell {i}: {first!r}")
    assert not stray
