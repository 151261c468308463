"""The HTML report: self-contained, from the one pass, and rendered by a real headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import l5dask
import l5dask.prediction.reading as reading
from l5dask.cli import main
from l5dask.prediction import format as fmt
from l5dask.prediction import plots as plot
from l5dask.prediction.report import compute_report
from tests.conftest import chromium


@pytest.fixture(scope="module")
def page(small_ds, tmp_path_factory):
    out = tmp_path_factory.mktemp("html") / "report.html"
    r = subprocess.run(
        [sys.executable, "-m", "l5dask.cli", "report", small_ds, "--output", str(out), "--quiet"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    return out


def figures_of_the_report(path: str) -> int:
    """The report's figures and its catalog section's (a figure per distribution)."""
    from l5dask.prediction.catalog import catalog_table
    from l5dask.prediction.html import catalog_columns

    return len(plot.REPORT_FIGURES) + len(plot.catalog_figures(catalog_columns(catalog_table(path))))


def test_page_is_self_contained(page, small_ds):
    text = page.read_text()
    assert text.count("<figure>") == figures_of_the_report(small_ds)
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)  # nothing fetched from a network
    assert "<link" not in text
    n = l5dask.open_dataset(small_ds).counts()
    assert f"{n['agents']:,} agents" in text and small_ds in text and l5dask.__version__ in text


def test_chromium_renders_title_and_figures_without_console_errors(page, tmp_path, small_ds):
    r = chromium(["--dump-dom", page.as_uri()], tmp_path)
    assert f"<title>l5dask report: {small_ds}</title>" in r.stdout
    assert f'data-figures-loaded="{figures_of_the_report(small_ds)}"' in r.stdout
    assert "CONSOLE" not in r.stderr, r.stderr
    shot = tmp_path / "shot.png"
    chromium([f"--screenshot={shot}", "--window-size=1280,2400", page.as_uri()], tmp_path)
    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[:2] == (2400, 1280) and pixels[..., :3].std() > 0.05  # a page, not a blank


def test_page_fits_a_1280_px_window_and_the_summary_is_a_table(page, tmp_path):
    r = chromium(["--dump-dom", "--window-size=1280,1000", page.as_uri()], tmp_path)
    assert 'data-overflow="false"' in r.stdout, "something is wider than a 1280 px window"
    assert '<table class="summary">' in r.stdout and "<pre>" not in r.stdout
    r = chromium(["--dump-dom", "--window-size=600,1000", page.as_uri()], tmp_path)
    assert 'data-overflow="true"' in r.stdout  # the check itself sees overflow when there is some


def _utc(ns: int, ms: bool) -> str:
    """A time of ns since the epoch in UTC, cut to the millisecond or the minute, by Python's
    datetime from integers."""
    import datetime as dt

    t = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=int(ns) // 1000)
    return f"{t:%Y-%m-%d %H:%M:%S}.{t.microsecond // 1000:03d} UTC" if ms else f"{t:%Y-%m-%d %H:%M} UTC"


def _table(dom: str, start: str) -> tuple[list[str], list[list[str]]]:
    """The column names and the rows' cells of the first table after ``start`` in a page's DOM."""
    import html as htmlmod

    part = dom[dom.index(start) :]
    part = part[part.index("<table") : part.index("</table>")]
    head = [htmlmod.unescape(h) for h in re.findall(r"<th[^>]*>(.*?)</th>", part.split("</thead>")[0])]
    body = part.split("<tbody>")[1]
    rows = [
        [htmlmod.unescape(c) for c in re.findall(r"<td>(.*?)</td>", r)] for r in re.findall(r"<tr>(.*?)</tr>", body)
    ]
    return head, rows


def test_the_page_says_each_scene_time_in_utc(page, tmp_path, small_ds):
    """A new user's trial: the report page showed a scene's ``start_time`` without its time zone
    (beside ``local_hour``, in the dataset's). As headless chromium shows it, the report's table of
    scenes says each scene's start and end in UTC to the millisecond, and the catalog's table (made
    by the page's script) its start to the minute: the stored ns since the epoch, cut, as Python's
    datetime makes them from integers."""
    r = chromium(["--dump-dom", page.as_uri()], tmp_path)
    assert "CONSOLE" not in r.stderr, r.stderr
    ds = l5dask.open_dataset(small_ds)
    start, end = ds.scenes.start_time.values, ds.scenes.end_time.values
    head, rows = _table(r.stdout, "<h2>Scenes</h2>")
    assert len(rows) == len(start) >= 2
    got = [[row[head.index("start_time")], row[head.index("end_time")]] for row in rows]
    assert got == [[_utc(a, True), _utc(b, True)] for a, b in zip(start, end)]
    head, rows = _table(r.stdout, '<table id="catalog-table"')
    assert [row[head.index("start_time")] for row in rows] == [_utc(a, False) for a in start]
    assert "in UTC" in r.stdout


def test_a_time_is_cut_from_its_integer_nanoseconds():
    """The pages' times, at the edges: a nanosecond before a millisecond or a minute is still the
    one before (through a float rounded to the microsecond, as before, it showed the next one)."""
    from l5dask.core.page import utc_text

    ms = 1_557_000_123_456 * 10**6  # (a millisecond, in ns)
    minute = 25_950_002 * 60 * 10**9
    ns = [ms - 1, ms, ms + 999_999, ms - 400, minute - 1, minute, minute - 300, 0, 2**62]
    assert utc_text(ns, "ms") == [_utc(v, True) for v in ns]
    assert utc_text(ns) == [_utc(v, False) for v in ns]
    assert utc_text([ms - 400], "ms")[0].endswith(".455 UTC") and utc_text([minute - 300])[0].endswith("20:01 UTC")


def test_speed_histogram_shows_more_than_the_parked_agents(page, small_ds):
    """On a linear axis the bar at 0 m/s (parked agents) hides every other bar; with log counts,
    bars are drawn across the speeds: count the plot's columns that hold the bars' colour, on the
    page's figure and on the same counts drawn on a linear axis."""
    import base64
    import io

    from matplotlib.image import imread

    def bar_columns(png: bytes) -> float:
        """The share of the image's columns where a bar stands at least 5 pixels tall."""
        img = imread(io.BytesIO(png))[..., :3]
        green = np.all(np.abs(img - np.array([0x4C, 0x9A, 0x5D]) / 255) < 0.08, axis=2)
        return float((green.sum(axis=0) >= 5).mean())

    src = re.search(r'<img alt="speed histogram" src="data:image/png;base64,([^"]+)"', page.read_text())
    shown = bar_columns(base64.b64decode(src.group(1)))
    hist = compute_report(small_ds)["agents"]["speed_mps"]["histogram"]
    linear = bar_columns(plot.png(lambda r, ax: plot.histogram(ax, hist, "speed", "linear", "#4c9a5d"), {}))
    assert shown > 0.15 and shown > 3 * linear, (shown, linear)


def test_console_error_detection_works(tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>console.error('boom'); missing();</script></body></html>")
    r = chromium(["--dump-dom", bad.as_uri()], tmp_path)
    assert "CONSOLE" in r.stderr and "Uncaught ReferenceError" in r.stderr


def test_report_is_one_pass(small_ds, tmp_path, monkeypatch):
    calls = []
    original = reading.decode_chunk
    monkeypatch.setattr(reading, "decode_chunk", lambda *a, **kw: calls.append((a[1].name, a[3])) or original(*a, **kw))
    result = CliRunner().invoke(
        main, ["report", small_ds, "--output", str(tmp_path / "r.html"), "--quiet", "--json", str(tmp_path / "r.json")]
    )
    assert result.exit_code == 0, result.output
    ds = l5dask.open_dataset(small_ds)
    # the agents and faces read from their stored bytes (never decoded); every other chunk decoded
    # once (the frames' join rows held from their pass for the agents: not made again)
    decoded = [n for n in ds.arrays if n not in (fmt.AGENTS, fmt.TL_FACES)]
    assert ds.has(fmt.TL_FACES) and ds[fmt.TL_FACES].meta.nchunks
    assert sorted(calls) == sorted((n, str(i)) for n in decoded for i in range(ds[n].meta.nchunks))


def test_failed_report_leaves_no_page(small_ds, tmp_path):
    dest = tmp_path / "broken.zarr"
    shutil.copytree(small_ds, dest)
    (dest / "agents" / "0").write_bytes(b"junk")
    out = tmp_path / "report.html"
    r = subprocess.run(
        [sys.executable, "-m", "l5dask.cli", "report", str(dest), "--output", str(out), "--quiet"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "chunk '0'" in r.stderr and not out.exists()


def test_plots_draw_the_report_numbers(small_ds):
    import matplotlib

    matplotlib.use("Agg")
    rep = compute_report(small_ds)
    ax = plot.speed_histogram(rep)
    heights = [p.get_height() for p in ax.patches]
    assert heights == rep["agents"]["speed_mps"]["histogram"]["counts"]
    ax = plot.label_mix(rep)
    assert sorted(p.get_width() for p in ax.patches) == sorted(v for v in rep["agents"]["label_counts"].values() if v)
    ax = plot.agents_per_frame(rep)
    samples = rep["_plots"]["samples"]
    assert len(ax.lines) == len(np.unique(samples["scene"])) >= 2
    first = samples[samples["scene"] == samples["scene"][0]]
    np.testing.assert_array_equal(ax.lines[0].get_ydata(), first["agents"])
    ax = plot.scene_map(rep)
    assert len(ax.lines) == rep["counts"]["scenes"]
    ds = l5dask.open_dataset(small_ds)
    ax = plot.scene(ds, 1)
    ego = ds.frames.ego_translation.values[slice(*ds.scenes.frame_index_interval.values[1])]
    np.testing.assert_array_equal(ax.lines[-1].get_xdata(), ego[:, 0])
    ax = plot.traffic_lights(ds, 1)
    assert ax.images and ax.images[0].get_array().shape[1] == len(ego)


# --- the scene catalog's page --------------------------------------------------------------
CATALOG_PROBE = """
<script>
window.addEventListener("load", function () {
  setTimeout(function () {
    var t = document.getElementById("catalog-table");
    function shown() { return Array.from(t.tBodies[0].rows).map(function (r) { return r.cells[0].textContent; }).join(","); }
    var ths = t.querySelectorAll("th.sort"), inputs = t.querySelectorAll("input.filter");
    var names = Array.from(ths).map(function (th) { return th.textContent; });
    function type(name, text) {
      var box = inputs[names.indexOf(name)];
      box.value = text;
      box.dispatchEvent(new Event("input"));
    }
    var out = {initial: shown()};
    ths[names.indexOf("duration_s")].click();
    out.ascending = shown();
    ths[names.indexOf("duration_s")].click();
    out.descending = shown();
    type("host", "=HOST");
    out.host = shown();
    out.host_matching = t.getAttribute("data-matching");
    type("max_speed_mps", ">= SPEED");
    out.both = shown();
    out.status = document.getElementById("catalog-status").textContent;
    type("host", "");
    type("max_speed_mps", "");
    type("num_frames", "LO..HI");
    out.range = shown();
    document.documentElement.setAttribute("data-probe", JSON.stringify(out));
  }, 300);
});
</script>
"""


@pytest.fixture(scope="module")
def catalog_page(small_ds, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("catalog-page")
    out, page_path = tmp / "c.parquet", tmp / "c.html"
    r = subprocess.run(
        [sys.executable, "-m", "l5dask.cli", "catalog", small_ds, "-o", str(out), "--html", str(page_path), "-q"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"wrote {out} and {page_path}: "), r.stdout  # (both files said, not the parquet only)
    import pandas as pd

    return page_path, pd.read_parquet(out)


def test_catalog_page_sorts_and_filters_in_chromium(catalog_page, tmp_path):
    """Headless chromium clicks a column's name (twice) and types in the filter boxes (the page's
    own handlers): the rows shown are the catalog's, sorted and filtered as pandas does."""
    import html as htmlmod
    import json

    path, cat = catalog_page
    assert len(cat) > 3
    host = str(cat["host"].value_counts().index[0])
    speed = float(cat["max_speed_mps"].median())
    lo, hi = int(cat["num_frames"].min()), int(cat["num_frames"].median())
    probe = (
        CATALOG_PROBE.replace("HOST", host).replace("SPEED", repr(speed)).replace("LO", str(lo)).replace("HI", str(hi))
    )
    page_copy = tmp_path / "probe.html"
    page_copy.write_text(path.read_text().replace("</body>", probe + "</body>"))
    r = chromium(["--dump-dom", page_copy.as_uri()], tmp_path)
    m = re.search(r'data-probe="([^"]*)"', r.stdout)
    assert m, r.stderr[-2000:]
    got = json.loads(htmlmod.unescape(m.group(1)))

    def ids(frame) -> str:
        return ",".join(str(i) for i in frame["scene_index"])

    by_duration = cat.sort_values(["duration_s", "scene_index"], kind="stable")
    assert got["initial"] == ids(cat)
    assert got["ascending"] == ids(by_duration)
    desc = cat.assign(neg=-cat["duration_s"]).sort_values(["neg", "scene_index"], kind="stable")
    assert got["descending"] == ids(desc) != got["ascending"]
    on_host = desc[desc["host"] == host]
    assert got["host"] == ids(on_host) and got["host_matching"] == str(len(on_host)) and len(on_host) < len(cat)
    both = on_host[on_host["max_speed_mps"] >= speed]
    assert got["both"] == ids(both) and f"{len(both)} of {len(cat)} scenes match" in got["status"]
    in_range = desc[(desc["num_frames"] >= lo) & (desc["num_frames"] <= hi)]
    assert got["range"] == ids(in_range)
    assert "CONSOLE" not in r.stderr


def test_catalog_page_is_self_contained_and_bounded(catalog_page, monkeypatch, small_ds):
    """No network; a figure per distribution; the embedded rows bounded (the first scenes only,
    said on the page)."""
    from l5dask.prediction import html as page_module
    from l5dask.prediction.catalog import catalog_table
    from l5dask.prediction.plots import catalog_figures

    path, cat = catalog_page
    text = path.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text) and "<link" not in text
    columns = page_module.catalog_columns(cat)
    assert text.count("<figure>") == len(catalog_figures(columns))
    monkeypatch.setattr(page_module, "MAX_PAGE_SCENES", 2)
    small = page_module.render_catalog(catalog_table(small_ds), small_ds)
    data = json.loads(re.search(r'id="catalog-data">(.*?)</script>', small).group(1))
    assert [r[0] for r in data["rows"]] == [0, 1] and f"first 2 of {len(cat):,} scenes" in small


def test_report_has_the_catalog_section(page, small_ds):
    text = page.read_text()
    assert "Scene catalog" in text and 'id="catalog-table"' in text


def test_the_catalog_histograms_fixed_margins_hold_their_labels(catalog_page):
    """The catalog's histograms are drawn with fixed margins (no layout engine): at a full
    dataset's scale (134,622 scenes: counts of six digits, values of up to 1e7 and below 0) every
    tick label, axis label, offset text and title stays inside the figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from l5dask.core.figures import figure
    from l5dask.prediction import html as page_module
    from l5dask.prediction.plots import catalog_figures

    _, cat = catalog_page
    columns = page_module.catalog_columns(cat)
    rng = np.random.default_rng(0)
    n = 134_622
    fixed = [(c, d) for c, d in catalog_figures(columns) if getattr(d, "fixed_margins", False)]
    assert len(fixed) >= 20  # the numeric columns' histograms
    for scale in (1.0, 1e5, 1e7):
        big = {k: rng.normal(0, 2, n) * scale for k in columns}
        big[next(iter(columns))][:100_000] = scale  # a bin of 100,000 scenes: six-digit counts
        for caption, draw in fixed:
            fig = figure(draw, big)
            renderer = FigureCanvasAgg(fig).get_renderer()
            box, page = fig.get_tightbbox(renderer), fig.bbox_inches
            assert box.x0 >= page.x0 and box.y0 >= page.y0, (caption, scale, box)
            assert box.x1 <= page.x1 and box.y1 <= page.y1, (caption, scale, box)
