"""Every notebook runs top to bottom (nbclient, a real kernel) on generated data, a local S3
endpoint and the test cluster, with no manual step. The runs are the session's
``executed_notebooks`` (tests/conftest.py), which the documentation renders too."""

from __future__ import annotations

import nbformat
import pandas as pd


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
