"""The HTML report: self-contained, from the one pass, and rendered by a real headless Chromium."""

from __future__ import annotations

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


def test_page_is_self_contained(page, small_ds):
    text = page.read_text()
    assert text.count("<figure>") == len(plot.REPORT_FIGURES)
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)  # nothing fetched from a network
    assert "<link" not in text
    n = l5dask.open_dataset(small_ds).counts()
    assert f"{n['agents']:,} agents" in text and small_ds in text and l5dask.__version__ in text


def test_chromium_renders_title_and_figures_without_console_errors(page, tmp_path, small_ds):
    r = chromium(["--dump-dom", page.as_uri()], tmp_path)
    assert f"<title>l5dask report: {small_ds}</title>" in r.stdout
    assert f'data-figures-loaded="{len(plot.REPORT_FIGURES)}"' in r.stdout
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
    # once, and the frames once more for the agents' join rows (made again, not held for the pass)
    decoded = [n for n in ds.arrays if n not in (fmt.AGENTS, fmt.TL_FACES)] + [fmt.FRAMES]
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
