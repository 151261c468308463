"""Columnar exports: Parquet read by pyarrow.dataset and DuckDB, zarr v3 read by zarr-python 3,
xarray and l5dask itself; all against the arrays as zarr-python 2 decodes them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import l5dask
from l5dask.cli import main
from l5dask.core.store import Store
from l5dask.errors import L5DaskError
from l5dask.prediction import format as fmt
from l5dask.prediction.exports import export
from l5dask.prediction.report import compute_report
from tests.conftest import SMALL_CHUNKS, read_all, require

ZARR3_PYTHON = Path(__file__).resolve().parents[2] / ".venv-zarr3" / "bin" / "python"


def joins_of(d: dict) -> dict[str, dict[str, np.ndarray]]:
    """The join columns by plain numpy: each row's frame (from the intervals), scene, timestamp."""
    siv, fr = d["scenes"]["frame_index_interval"], d["frames"]
    frame_scene = np.repeat(np.arange(len(siv)), siv[:, 1] - siv[:, 0])
    out = {"frames": {"scene_index": frame_scene}}
    for child, field in (
        ("agents", "agent_index_interval"),
        ("traffic_light_faces", "traffic_light_faces_index_interval"),
    ):
        iv = fr[field]
        frame = np.repeat(np.arange(len(iv)), iv[:, 1] - iv[:, 0])
        out[child] = {"frame_index": frame, "scene_index": frame_scene[frame], "timestamp": fr["timestamp"][frame]}
    return out


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """Small chunks (scenes, frames straddle chunk edges), some label ties."""
    path = str(tmp_path_factory.mktemp("exp") / "src.zarr")
    l5dask.synthesize(path, num_scenes=6, seed=11, chunk_rows=SMALL_CHUNKS, label_ties=0.05)
    return path


@pytest.mark.parametrize("chunks_per_task", [1, 3])
def test_parquet_read_by_pyarrow_and_duckdb(source, tmp_path, chunks_per_task):
    import duckdb
    import pyarrow.dataset as pds
    import pyarrow.parquet as pq

    out = str(tmp_path / "pq")
    rows = export(source, out, "parquet", chunks_per_task=chunks_per_task)
    d = read_all(source)
    joins = joins_of(d)
    assert rows == {fmt.SHORT_NAMES[n]: len(v) for n, v in d.items()}

    agents = pds.dataset(os.path.join(out, "agents")).to_table().sort_by("agent_index")
    a = d["agents"]
    np.testing.assert_array_equal(agents["agent_index"].to_numpy(), np.arange(len(a)))
    np.testing.assert_array_equal(agents["centroid_y"].to_numpy(), a["centroid"][:, 1])
    np.testing.assert_array_equal(agents["extent_height"].to_numpy(), a["extent"][:, 2])
    np.testing.assert_array_equal(agents["track_id"].to_numpy(), a["track_id"])
    for i, label in enumerate(fmt.LABELS):
        np.testing.assert_array_equal(agents[label].to_numpy(), a["label_probabilities"][:, i])
    for j, want in joins["agents"].items():
        np.testing.assert_array_equal(agents[j].to_numpy(), want, err_msg=j)
    faces = pds.dataset(os.path.join(out, "traffic_light_faces")).to_table().sort_by("tl_face_index")
    assert faces["face_id"].to_pylist() == d["traffic_light_faces"]["face_id"].tolist()
    for j, want in joins["traffic_light_faces"].items():
        np.testing.assert_array_equal(faces[j].to_numpy(), want, err_msg=j)
    frames = pds.dataset(os.path.join(out, "frames")).to_table().sort_by("frame_index")
    np.testing.assert_array_equal(frames["scene_index"].to_numpy(), joins["frames"]["scene_index"])
    np.testing.assert_array_equal(frames["ego_rotation_yx"].to_numpy(), d["frames"]["ego_rotation"][:, 1, 0])
    np.testing.assert_array_equal(frames["agent_index_end"].to_numpy(), d["frames"]["agent_index_interval"][:, 1])
    scenes = pds.dataset(os.path.join(out, "scenes")).to_table()
    assert scenes["host"].to_pylist() == d["scenes"]["host"].tolist()

    # one row group per stored chunk, each with statistics on scene_index (engines prune by them)
    groups = []
    for f in sorted(Path(out, "agents").glob("*.parquet")):
        md = pq.ParquetFile(f).metadata
        col = md.schema.names.index("scene_index")
        groups += [(md.row_group(g).num_rows, md.row_group(g).column(col).statistics) for g in range(md.num_row_groups)]
    assert [n for n, _ in groups] == [
        min(SMALL_CHUNKS[fmt.AGENTS], len(a) - i) for i in range(0, len(a), SMALL_CHUNKS[fmt.AGENTS])
    ]
    pos = 0
    for n, st in groups:
        sc = joins["agents"]["scene_index"][pos : pos + n]
        assert st.has_min_max and (st.min, st.max) == (sc.min(), sc.max())
        pos += n

    # SQL joins across the tables, in DuckDB, against numpy
    con = duckdb.connect()
    got = con.execute(f"""
        SELECT s.host, count(*) AS n, avg(a.velocity_x) AS vx
        FROM read_parquet('{out}/agents/*.parquet') a
        JOIN read_parquet('{out}/frames/*.parquet') f ON a.frame_index = f.frame_index
        JOIN read_parquet('{out}/scenes/*.parquet') s ON f.scene_index = s.scene_index
        GROUP BY s.host ORDER BY s.host""").fetchall()
    host = d["scenes"]["host"][joins["agents"]["scene_index"]]
    want = [
        (h, int((host == h).sum()), float(a["velocity"][host == h, 0].astype(np.float64).mean()))
        for h in sorted(set(host.tolist()))
    ]
    assert [(h, n) for h, n, _ in got] == [(h, n) for h, n, _ in want]
    np.testing.assert_allclose([v for *_, v in got], [v for *_, v in want], rtol=1e-12)


def test_zarr3_export_reads_back_as_the_same_dataset(source, tmp_path, monkeypatch):
    out = str(tmp_path / "v3")
    export(source, out, "zarr3")
    back = l5dask.open_dataset(out)
    orig = l5dask.open_dataset(source)
    d = read_all(source)
    for name, want in d.items():
        arr = back[name]
        assert arr.dtype == want.dtype and len(arr) == len(want) and arr.meta.chunk_rows == orig[name].meta.chunk_rows
        np.testing.assert_array_equal(arr.read(0, arr.nchunks), want, err_msg=name)
        np.testing.assert_array_equal(arr.to_dask(chunks_per_task=2).compute(), want, err_msg=name)
    # the report on it equals the report on the original, and reads no agent extent or yaw
    keys: list[str] = []
    get = Store.get

    def counting(self, key, **kw):
        keys.append(key)
        return get(self, key, **kw)

    monkeypatch.setattr(Store, "get", counting)
    r_back = compute_report(back)
    monkeypatch.undo()
    r_orig = compute_report(orig)
    for r in (r_back, r_orig):
        r.pop("dataset")
    assert json.dumps(r_back, default=str, sort_keys=True) == json.dumps(r_orig, default=str, sort_keys=True)
    agent_arrays = {k.split("/")[1] for k in keys if k.startswith("agents/")}
    assert agent_arrays == {"centroid", "velocity", "track_id", "label_probabilities"}
    assert not [k for k in keys if k.startswith("frames/ego_rotation")]
    # xarray views and dataframes work on it as on the original
    np.testing.assert_array_equal(back.agents["velocity"].values, d["agents"]["velocity"])


def test_zarr3_opens_in_zarr_python_3_and_xarray(source, tmp_path):
    require(ZARR3_PYTHON.exists(), "a venv with zarr-python 3 and xarray at .venv-zarr3")
    out = str(tmp_path / "v3")
    export(source, out, "zarr3")
    d = read_all(source)
    script = """
import json, sys, warnings
import numpy as np, xarray as xr, zarr
warnings.simplefilter("error")  # e.g. xarray's warning on stores without consolidated metadata
out = sys.argv[1]
g = zarr.open_group(out, mode="r")
res = {"zarr": zarr.__version__, "labels": g.attrs["labels"],
       "centroid": g["agents/centroid"][:].tolist(), "dims": list(g["agents/centroid"].metadata.dimension_names),
       "host": g["scenes/host"][:].tolist(), "face_id": g["traffic_light_faces/face_id"][:].tolist(),
       "shards": g["agents/label_probabilities"].shards is not None}
tree = xr.open_datatree(out, engine="zarr")
ds = tree["agents"].to_dataset()
res["tree"] = sorted(tree.children)
res["xr_sizes"] = dict(ds.sizes)
res["xr_labels_sum"] = ds["label_probabilities"].astype("float64").sum("agent_index").values.tolist()
res["xr_scene_count"] = np.bincount(ds["scene_index"].values).tolist()
res["rot"] = tree["frames"]["ego_rotation"].isel(frame_index=-1).values.tolist()
print(json.dumps(res))
"""
    got = subprocess.run([str(ZARR3_PYTHON), "-c", script, out], capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    res = json.loads(got.stdout)
    assert int(res["zarr"].split(".")[0]) >= 3 and res["shards"]
    assert res["labels"] == list(fmt.LABELS)
    np.testing.assert_array_equal(np.array(res["centroid"]), d["agents"]["centroid"])
    assert res["dims"] == ["agent_index", "xy"]
    assert (
        res["host"] == d["scenes"]["host"].tolist() and res["face_id"] == d["traffic_light_faces"]["face_id"].tolist()
    )
    assert res["tree"] == sorted(fmt.ARRAY_NAMES)
    assert res["xr_sizes"] == {"agent_index": len(d["agents"]), "label": 17, "xy": 2, "lwh": 3}
    np.testing.assert_allclose(
        res["xr_labels_sum"], d["agents"]["label_probabilities"].sum(0, dtype=np.float64), rtol=1e-12
    )
    assert res["xr_scene_count"] == np.bincount(joins_of(d)["agents"]["scene_index"]).tolist()
    np.testing.assert_array_equal(np.array(res["rot"]), d["frames"]["ego_rotation"][-1])


def test_zarr3_export_on_s3_reads_fewer_bytes(source, s3, tmp_path, monkeypatch):
    """On the moto S3 server: export there, report from there; the report reads fewer bytes of the
    export than of the L5Kit layout (the benchmark gives the figures on 30 M agents)."""
    s3.make_bucket("exports")
    opts = s3.storage_options()
    s3.s3fs().put(source, "exports/src.zarr", recursive=True)
    export("s3://exports/src.zarr", "s3://exports/v3", "zarr3", storage_options=opts)
    sizes: dict[str, int] = {}
    get = Store.get

    def counting(self, key, **kw):
        data = get(self, key, **kw)
        sizes[self.url] = sizes.get(self.url, 0) + len(data)
        return data

    iter_ranges = Store.iter_ranges  # (get_many and iter_many read through it on object stores)

    def counting_ranges(self, ranges, what=None, depth=None):
        for data in iter_ranges(self, ranges, what, depth):
            sizes[self.url] = sizes.get(self.url, 0) + len(data)
            yield data

    monkeypatch.setattr(Store, "get", counting)
    monkeypatch.setattr(Store, "iter_ranges", counting_ranges)
    r1 = compute_report("s3://exports/v3", storage_options=opts)
    r2 = compute_report("s3://exports/src.zarr", storage_options=opts)
    monkeypatch.undo()
    assert r1["agents"] == r2["agents"] and r1["counts"] == r2["counts"]
    assert sizes["s3://exports/v3"] < 0.8 * sizes["s3://exports/src.zarr"], sizes


def test_export_bad_input(source, tmp_path):
    with pytest.raises(L5DaskError, match="unknown export format 'csv'; the formats are parquet, zarr3"):
        export(source, str(tmp_path / "o"), "csv")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("keep me")
    for overwrite in (False, True):
        with pytest.raises(L5DaskError, match="taken: it holds x, which is not an export's"):
            export(source, str(tmp_path / "taken"), "parquet", overwrite=overwrite)
    assert (tmp_path / "taken" / "x").read_text() == "keep me"
    export(source, str(tmp_path / "done"), "parquet")
    with pytest.raises(L5DaskError, match="done: already exists"):
        export(source, str(tmp_path / "done"), "parquet")
    with pytest.raises(L5DaskError, match="the output is the input"):
        export(source, source, "zarr3", overwrite=True)
    assert l5dask.open_dataset(source).counts()["scenes"] == 6


@pytest.mark.parametrize("kind", ["parquet", "zarr3"])
def test_failed_export_leaves_nothing(source, tmp_path, kind):
    broken = str(tmp_path / "broken.zarr")
    shutil.copytree(source, broken)
    with open(os.path.join(broken, "agents", "2"), "r+b") as f:
        f.truncate(50)
    out = tmp_path / "out"
    with pytest.raises(L5DaskError, match="truncated or corrupt"):
        export(broken, str(out), kind)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["broken.zarr"]  # no partial folder left beside it


def test_cli_export(source, tmp_path):
    r = CliRunner().invoke(main, ["export", source, "-o", str(tmp_path / "v3"), "--format", "zarr3", "-q"])
    assert r.exit_code == 0, r.output
    assert "agents" in r.output
    r = CliRunner().invoke(main, ["info", str(tmp_path / "v3")])
    assert r.exit_code == 0 and "agents" in r.output, r.output
    r = CliRunner().invoke(main, ["export", source, "-o", str(tmp_path / "x"), "--format", "csv"])
    assert r.exit_code != 0
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "unknown export format 'csv'" in lines[0]
    assert not (tmp_path / "x").exists()


def test_zarr3_metadata_is_valid_json_with_dimension_names(source, tmp_path):
    out = tmp_path / "v3"
    export(source, str(out), "zarr3")
    meta = json.loads((out / "agents" / "label_probabilities" / "zarr.json").read_text())
    assert meta["zarr_format"] == 3 and meta["dimension_names"] == ["agent_index", "label"]
    assert meta["codecs"][0]["name"] == "sharding_indexed"
    assert meta["attributes"]["labels"] == list(fmt.LABELS)
    assert sys.getsizeof(meta) > 0


def with_extra_fields(src: str, dst: str) -> np.ndarray:
    """A copy of ``src`` whose agents carry two more fields (the format keeps any others): a bool
    ``flag`` and an int16 ``small``; their values returned (records)."""
    import zarr

    shutil.copytree(src, dst)
    z = zarr.open_group(dst, "r+")
    old = z["agents"]
    a = old[:]
    dtype = np.dtype(a.dtype.descr + [("flag", "?"), ("small", "<i2")])
    b = np.zeros(len(a), dtype)
    for name in a.dtype.names:
        b[name] = a[name]
    rng = np.random.default_rng(5)
    b["flag"] = rng.random(len(b)) < 0.3
    b["small"] = rng.integers(-300, 300, len(b))
    chunks, compressor = old.chunks, old.compressor
    del z["agents"]
    z.create_dataset("agents", data=b, chunks=chunks, compressor=compressor)
    return b


def test_a_bool_field_is_exported_and_aggregated_as_stored(source, tmp_path):
    """Arrow's booleans are bits, numpy's bytes: every bool written to Parquet (the export, an
    aggregation's table) reads back as stored (a bool field was written as its bytes, wrong)."""
    import pandas as pd
    import pyarrow.dataset as pds
    import pyarrow.parquet as pq

    from l5dask.core.outputs import arrow_array

    for n in (0, 1, 7, 8, 9, 1001):
        v = np.random.default_rng(n).random(n) < 0.5
        assert arrow_array(v).to_pylist() == v.tolist()
        assert arrow_array(v[3:]).to_pylist() == v[3:].tolist()
    data = str(tmp_path / "extra.zarr")
    want = with_extra_fields(source, data)
    out = str(tmp_path / "pq")
    export(data, out, "parquet")
    agents = pds.dataset(os.path.join(out, "agents")).to_table().sort_by("agent_index")
    assert agents["flag"].to_pylist() == want["flag"].tolist()
    np.testing.assert_array_equal(agents["small"].to_numpy(), want["small"])
    label = want["label_probabilities"].argmax(1)
    result = CliRunner().invoke(
        main, ["agg", data, "--by", "label", "--value", "flag:sum,min,max", "-o", str(tmp_path / "f.parquet"), "-q"]
    )
    assert result.exit_code == 0, result.output
    got = pq.read_table(tmp_path / "f.parquet").to_pandas()
    ref = pd.DataFrame({"label": label, "flag": want["flag"]}).groupby("label")["flag"].agg(["sum", "min", "max"])
    assert got["flag_sum"].tolist() == ref["sum"].tolist()
    assert got["flag_min"].tolist() == ref["min"].tolist()
    assert got["flag_max"].tolist() == ref["max"].tolist()
