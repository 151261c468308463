"""Every notebook runs top to bottom (nbclient, a real kernel) on generated data, a local S3
endpoint and the test cluster, with no manual step."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).parent.parent / "notebooks"


def run(name: str, cwd: Path) -> nbformat.NotebookNode:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "outputs are committed"
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def outputs(nb) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]


def test_quickstart(tmp_path, monkeypatch):
    monkeypatch.setenv("L5DASK_SCENES", "4")
    nb = run("01_quickstart.ipynb", tmp_path)
    assert (tmp_path / "quickstart.zarr" / ".zgroup").exists()
    assert sum("image/png" in o.get("data", {}) for o in outputs(nb)) >= 2
    assert not [o for o in outputs(nb) if o.output_type == "error"]


def test_cluster_and_s3(tmp_path, monkeypatch, s3, s3_small, dask_cluster):
    monkeypatch.setenv("L5DASK_SCHEDULER", dask_cluster.address)
    monkeypatch.setenv("L5DASK_S3_URL", s3_small)
    monkeypatch.setenv("L5DASK_S3_ENDPOINT", s3.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    nb = run("02_cluster_and_s3.ipynb", tmp_path)
    text = "".join(o.get("text", "") for o in outputs(nb))
    assert "Num Scenes" in text


def test_scene_explorer(tmp_path):
    nb = run("03_scene_explorer.ipynb", tmp_path)
    assert sum("image/png" in o.get("data", {}) for o in outputs(nb)) == 3


def test_custom_aggregations(tmp_path, monkeypatch):
    monkeypatch.setenv("L5DASK_SCENES", "6")
    nb = run("04_custom_aggregations.ipynb", tmp_path)
    assert not [o for o in outputs(nb) if o.output_type == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs(nb)) >= 3
    import pandas as pd

    assert list(pd.read_csv(tmp_path / "by_label.csv").columns) == ["label", "speed_mean", "speed_count"]
