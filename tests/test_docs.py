"""The documentation: every example of the README and the docs runs, the site builds with no
warning, and a real browser renders it.

- Every ```python block of a page runs, in order, in one namespace per page, in a fresh folder
  holding a generated prediction dataset (``sample.zarr``) and perception dataset
  (``perception``), with a local S3 endpoint (moto's server, bucket ``l5dask-docs``) named by the
  usual AWS environment. Every ```console block runs its ``$`` lines with bash there, and each must
  exit 0 (a block that shows a failure says so with ``|| echo``). A block that cannot run (the
  set-up commands themselves, docker) has a ``<!-- docs-test: skip (why) -->`` line just before
  it; a ```bash block that calls ``l5dask`` without one is an error (CLI examples are console
  blocks, so that they run).
- ``python docs/build.py`` (``sphinx-build -W --keep-going -n``: every warning and broken reference
  an error) builds the site from the notebooks executed once here; the notebook tests check those
  same runs (tests/test_notebooks.py).
- Headless chromium opens the index, an API page and the search page: styles loaded, nothing wider
  than a 1280 px window, and the search finds ``open_dataset``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import require

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)]
FENCE = re.compile(r"^```(\w*)\s*$")
SKIP = re.compile(r"^<!-- docs-test: skip \((.+)\) -->$")


def blocks(path: Path) -> list[tuple[int, str, str, str | None]]:
    """``(line, language, code, skip reason)`` of each fenced block of a Markdown page."""
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
            skip = SKIP.match(before)
            out.append((start, lang, "\n".join(body) + "\n", skip.group(1) if skip else None))
        i += 1
    return out


def test_the_block_parser_sees_languages_and_skip_markers(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("text\n<!-- docs-test: skip (why not) -->\n```bash\nls\n```\n```python\nx = 1\n```\n")
    assert blocks(page) == [(3, "bash", "ls\n", "why not"), (6, "python", "x = 1\n", None)]


@pytest.fixture(scope="session")
def docs_data(tmp_path_factory, s3) -> Path:
    """The data the examples use (read-only: each page gets a copy)."""
    import l5dask
    from l5dask.perception.synth import generate

    root = tmp_path_factory.mktemp("docs-data")
    l5dask.synthesize(str(root / "sample.zarr"), scenes=8, seed=0)
    generate(root / "perception", scenes=2, seed=0, lidar_points=500, images=False)
    s3.make_bucket("l5dask-docs")
    s3.s3fs().put(str(root / "sample.zarr"), "l5dask-docs/sample.zarr", recursive=True)
    return root


def page_env(s3) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        AWS_ACCESS_KEY_ID=s3.key,
        AWS_SECRET_ACCESS_KEY=s3.secret,
        AWS_ENDPOINT_URL=s3.endpoint,
        AWS_DEFAULT_REGION="us-east-1",
        MPLBACKEND="Agg",
        PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
    )
    return env


RUNNER = """
import subprocess, sys, traceback
blocks = eval(open(sys.argv[1]).read())
ns = {"__name__": "__docs__"}
for line, lang, code in blocks:
    where = f"{sys.argv[2]}:{line}"
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
"""


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_example_of_the_page_runs(page, docs_data, s3, tmp_path):
    found = blocks(page)
    for line, lang, code, skip in found:
        if lang in ("bash", "sh", "shell") and re.search(r"(^|\s)l5dask\s", code) and skip is None:
            pytest.fail(f"{page.name}:{line}: a CLI example in a bash block: make it a console block, or mark it")
    runnable = [
        (line, lang, code) for line, lang, code, skip in found if skip is None and lang in ("python", "console")
    ]
    if not runnable:
        pytest.skip("no runnable block")
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(docs_data / "sample.zarr", work / "sample.zarr")
    (work / "perception").symlink_to(docs_data / "perception")
    # the page's blocks in order, in one process (one namespace), console lines run by bash
    spec = tmp_path / "blocks.py"
    spec.write_text(repr(runnable))
    r = subprocess.run(
        [sys.executable, "-c", RUNNER, str(spec), page.name], cwd=work, env=page_env(s3), capture_output=True, text=True
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


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
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
    r = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--allow-file-access-from-files",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--window-size=1280,1000",
            "--virtual-time-budget=8000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return r.stdout


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
