"""The perception dataset against the Lyft SDK (``lyft-dataset-sdk``) on generated data reaching
the edge cases: the report, points in boxes, velocities, joins, the L5Kit bridge, archives, S3,
a real cluster, the HTML page in a real browser, and every bad input the issue names."""

from __future__ import annotations

import html
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from fractions import Fraction

import numpy as np
import pytest

from l5dask.errors import FormatError
from l5dask.perception import open_perception, perception_report
from tests.conftest import l5kit_data, require
from tests.perception_data import edge_perception, load, save
from tests.perception_reference import lyft, reference_points_in_boxes, reference_report


def _sdk():
    try:
        import lyft_dataset_sdk  # noqa: F401
    except ImportError:
        require(False, "lyft-dataset-sdk (pip install --no-deps lyft-dataset-sdk==0.0.8)")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("perception") / "edge")
    edits = edge_perception(root)
    return root, edits


@pytest.fixture(scope="module")
def on_s3(data, s3) -> str:
    """``data`` uploaded once to S3, for the tests that read it there; one that removes an object
    puts it back. Its tables, lidar and map, not its 2,646 camera images (of its 3,809 files: two
    thirds of the half minute the upload took through moto), which nothing of l5dask reads: a read
    of one would fail there, not pass."""
    s3.make_bucket("l5-perception")
    fs = s3.s3fs()
    for folder in sorted(os.listdir(data[0])):
        if folder != "images":
            fs.put(os.path.join(data[0], folder), f"l5-perception/edge/{folder}", recursive=True)
    assert os.listdir(os.path.join(data[0], "images"))  # (the local dataset has them)
    return "s3://l5-perception/edge"


@pytest.fixture(scope="module")
def sdk(data):
    _sdk()
    return lyft(data[0])


def cli(*args):
    return subprocess.run([sys.executable, "-m", "l5dask.cli", *args], capture_output=True, text=True)


def same(ours, ref, path="report"):
    """Integers exact, floats to 1e-9 relative, same keys (the perception report's contract, docs/perception.md)."""
    if isinstance(ref, dict):
        assert set(ours) == set(ref), (path, set(ours) ^ set(ref))
        for k in ref:
            same(ours[k], ref[k], f"{path}.{k}")
    elif isinstance(ref, list):
        assert len(ours) == len(ref), path
        for i, (a, b) in enumerate(zip(ours, ref)):
            same(a, b, f"{path}[{i}]")
    elif isinstance(ref, float) or isinstance(ours, float):
        assert math.isclose(ours, ref, rel_tol=1e-9, abs_tol=1e-12), (path, ours, ref)
    else:
        assert ours == ref and type(ours) is type(ref), (path, ours, ref)


def public(report):
    return {k: v for k, v in report.items() if not k.startswith("_")}


def test_report_matches_the_sdk(data, sdk):
    root, edits = data
    ours = public(perception_report(open_perception(root)))
    ref = reference_report(sdk, root)
    same(ours, ref)
    # the edits reached their edge cases
    assert ours["lidar"]["missing_files"] == [edits["missing"]]
    assert ours["lidar"]["points_per_sweep"]["min"] == 0  # the empty sweep
    assert ours["annotations"]["per_category"]["empty_category"] == 0
    assert ours["annotations"]["size_m"]["mean"]["empty_category"] == [0.0, 0.0, 0.0]
    assert ours["annotations"]["per_category"]["tricycle"] > 0


def test_points_in_boxes_match_the_sdk(data, sdk):
    from l5dask.perception.lidar import points_in_boxes

    ds = open_perception(data[0])
    ours = points_in_boxes(ds)
    tokens = ds.table("sample_annotation").tokens.to_pylist()
    ref = reference_points_in_boxes(sdk)
    expected = np.array([ref[t] for t in tokens])
    np.testing.assert_array_equal(ours, expected)
    assert expected.min() < expected.max()  # boxes with few and many points (the generator puts half of each
    # sweep in and around the boxes, the rest on the ground)


def test_sweeps_array_matches_the_sdks_point_clouds(data, sdk):
    """Every lidar sweep through ``sweeps``: as stored (the SDK's ``LidarPointCloud.from_file``
    keeps x, y, z, intensity) and moved to the world frame, bit for bit the SDK's rotate and
    translate; missing files left out and named; a chunk per group of sweeps, sizes known before
    anything is read."""
    from lyft_dataset_sdk.utils.data_classes import LidarPointCloud
    from pyquaternion import Quaternion

    from l5dask.perception.lidar import sweeps

    ds = open_perception(data[0])
    sensor = sweeps(ds, sweeps_per_task=3)
    world = sweeps(ds, frame="world", sweeps_per_task=5)
    assert len(sensor.points.chunks[0]) == -(-len(sensor) // 3) and sensor.points.shape == (sensor.offsets[-1], 5)
    tokens = ds.table("sample_data").tokens.to_pylist()
    lidar = [
        r
        for r in sdk.sample_data
        if sdk.get("sensor", sdk.get("calibrated_sensor", r["calibrated_sensor_token"])["sensor_token"])["modality"]
        == "lidar"
    ]
    present = [r for r in lidar if sdk.get_sample_data_path(r["token"]).exists()]
    assert [tokens[i] for i in sensor.rows] == [r["token"] for r in present]
    assert set(sensor.missing) == {r["filename"] for r in lidar} - {r["filename"] for r in present} != set()
    got, moved = sensor.points.compute(), world.points.compute()
    empty = 0
    for i, r in enumerate(present):
        pc = LidarPointCloud.from_file(sdk.get_sample_data_path(r["token"]))
        part = slice(sensor.offsets[i], sensor.offsets[i + 1])
        np.testing.assert_array_equal(got[part, :4], pc.points.T)
        cs, pose = sdk.get("calibrated_sensor", r["calibrated_sensor_token"]), sdk.get("ego_pose", r["ego_pose_token"])
        pc.rotate(Quaternion(cs["rotation"]).rotation_matrix)
        pc.translate(np.array(cs["translation"]))
        pc.rotate(Quaternion(pose["rotation"]).rotation_matrix)
        pc.translate(np.array(pose["translation"]))
        np.testing.assert_array_equal(moved[part, :3].view(np.uint32), pc.points[:3].T.view(np.uint32))
        np.testing.assert_array_equal(moved[part, 3:], got[part, 3:])
        empty += part.start == part.stop
    assert empty  # the edge data has an empty sweep
    top = sweeps(ds, channels=["LIDAR_TOP"], key_frames=True)
    assert len(top) and all(sdk.get("sample_data", tokens[i])["is_key_frame"] for i in top.rows)
    with pytest.raises(ValueError, match=r"no lidar channel 'CAM_FRONT': the lidars are LIDAR_"):
        sweeps(ds, channels=["CAM_FRONT"])
    with pytest.raises(ValueError, match=r"frame 'ego': one of sensor, world"):
        sweeps(ds, frame="ego")


def test_sweeps_from_a_zip_and_files_changed_since_the_listing(data, tmp_path):
    """The sweeps read from a zip equal those read from the folder; a file that shrank, grew or
    went away between the listing and the read is an error naming it, never a short array."""
    from l5dask.perception.lidar import sweeps

    root = tmp_path / "edge"
    shutil.copytree(data[0], root)
    base = sweeps(open_perception(str(root)), frame="world")
    zpath = tmp_path / "p.zip"
    with zipfile.ZipFile(zpath, "w") as z:
        for folder, _, files in os.walk(root):
            for f in files:
                full = os.path.join(folder, f)
                z.write(full, os.path.relpath(full, root))
    zipped = sweeps(open_perception(str(zpath)), frame="world")
    np.testing.assert_array_equal(zipped.points.compute(), base.points.compute())
    ds = open_perception(str(root))
    names = ds.table("sample_data").strings("filename")
    for change in ("shrink", "grow", "remove"):
        sw = sweeps(ds, sweeps_per_task=4)
        for i in (int(np.flatnonzero(np.diff(sw.offsets) > 1)[0]), len(sw) - 1):  # in a task, and the last
            path = root / names[sw.rows[i]]
            size = path.stat().st_size
            now = {"shrink": "has 20 bytes now", "grow": f"has more than {size} bytes now", "remove": "is missing now"}[
                change
            ]
            if change == "remove":
                path.unlink()
            else:
                path.write_bytes(path.read_bytes()[:20] if change == "shrink" else path.read_bytes() + b"\0" * 20)
            with pytest.raises(FormatError, match=rf"{path.name}: a lidar sweep listed with {size} bytes {now}"):
                sw.points.compute()
            shutil.copy(os.path.join(data[0], names[sw.rows[i]]), path)


def test_velocity_matches_box_velocity(data, sdk):
    ds = open_perception(data[0])
    df = ds.frame("sample_annotation", ["token", "velocity_x", "velocity_y", "velocity_z"])
    ref = np.array([sdk.box_velocity(t) for t in df["token"]])
    np.testing.assert_array_equal(df[["velocity_x", "velocity_y", "velocity_z"]].to_numpy(), ref)
    assert np.isnan(ref[:, 0]).any() and (~np.isnan(ref[:, 0])).any()


def test_joins_match_the_sdk(data, sdk):
    ds = open_perception(data[0])
    cols = [
        "token",
        "category_name",
        "scene",
        "scene_name",
        "position",
        "sample_position",
        "distance_to_ego",
        "visibility",
        "attributes",
        "timestamp",
        "vehicle",
    ]
    df = ds.frame("sample_annotation", cols)
    scene_row = {s["token"]: i for i, s in enumerate(sdk.scene)}
    pos_in_scene = {}
    for s in sdk.scene:
        tok, k = s["first_sample_token"], 0
        while tok:
            pos_in_scene[tok] = k
            tok, k = sdk.get("sample", tok)["next"], k + 1
    for row in df.itertuples():
        ann = sdk.get("sample_annotation", row.token)
        sample = sdk.get("sample", ann["sample_token"])
        scene = sdk.get("scene", sample["scene_token"])
        assert row.category_name == ann["category_name"]
        assert row.scene == scene_row[scene["token"]] and row.scene_name == scene["name"]
        assert row.sample_position == pos_in_scene[sample["token"]]
        k, tok = 0, ann["prev"]
        while tok:
            k, tok = k + 1, sdk.get("sample_annotation", tok)["prev"]
        assert row.position == k
        assert row.timestamp == sample["timestamp"]
        assert row.vehicle == sdk.get("log", scene["log_token"])["vehicle"]
        vis = ann["visibility_token"]
        assert row.visibility == (sdk.get("visibility", vis)["level"] if vis else "")
        assert row.attributes == [sdk.get("attribute", a)["name"] for a in ann["attribute_tokens"]]
        lidar = sample["data"].get("LIDAR_TOP")
        if lidar is None:
            assert np.isnan(row.distance_to_ego)
        else:
            ego = sdk.get("ego_pose", sdk.get("sample_data", lidar)["ego_pose_token"])["translation"]
            assert math.isclose(
                row.distance_to_ego,
                math.hypot(ann["translation"][0] - ego[0], ann["translation"][1] - ego[1]),
                rel_tol=1e-14,
            )
    sd = ds.frame("sample_data", ["token", "channel", "modality"])
    assert sd["channel"].tolist() == [r["channel"] for r in sdk.sample_data]
    assert sd["modality"].tolist() == [r["sensor_modality"] for r in sdk.sample_data]
    with pytest.raises(KeyError, match="offers"):
        ds.frame("sample", ["no_such_column"])


def test_tables_are_parsed_only_when_needed(data):
    ds = open_perception(data[0])
    assert ds._raw == {}
    ds.frame("category")
    assert set(ds._raw) == {"category"}
    ds.table("sample")
    assert "sample_annotation" not in ds._raw and "sample_data" not in ds._raw
    ddf = ds.to_dask_dataframe("sample_annotation", ["category_name", "distance_to_ego"], npartitions=3)
    assert ddf.npartitions == 3
    got = ddf.groupby("category_name")["distance_to_ego"].count().compute()
    df = ds.frame("sample_annotation", ["category_name", "distance_to_ego"])
    assert got.to_dict() == df.groupby("category_name")["distance_to_ego"].count().to_dict()


def test_a_table_name_that_is_not_one_is_a_usage_error(data):
    """A typo'd table name in frame/table/to_dask_dataframe said the table's file was missing (a
    FormatError about the data); it names the tables, as raw() did, and reads nothing."""
    ds = open_perception(data[0])
    tables = "attribute, calibrated_sensor, category, ego_pose, instance, log, map, sample, sample_annotation, "
    for call in (ds.frame, ds.table, ds.to_dask_dataframe):
        with pytest.raises(KeyError) as err:
            call("sample_annotations")
        assert not isinstance(err.value, FormatError)
        assert str(err.value).strip("'\"").startswith(f"no table 'sample_annotations'; the tables are {tables}")
    assert ds._raw == {}


def test_test_split_without_annotation_tables(tmp_path, data):
    _sdk()
    root = str(tmp_path / "test_split")
    shutil.copytree(data[0], root)
    os.remove(os.path.join(root, "data", "sample_annotation.json"))
    os.remove(os.path.join(root, "data", "instance.json"))
    ours = public(perception_report(open_perception(root)))
    same(ours, reference_report(lyft(root), root))
    assert ours["counts"]["sample_annotation"] == 0 and ours["annotations"]["per_sample"]["mean"] == 0.0


def test_cli_stats_and_html_report(data, tmp_path):
    root = data[0]
    out = tmp_path / "r.json"
    r = cli("perception", "stats", root, "--output", str(out))
    assert r.returncode == 0, r.stderr
    assert "scenes" in r.stdout and "l5dask: tables: " in r.stderr  # summary on stdout, progress on stderr
    same(json.loads(out.read_text()), json.loads(json.dumps(public(perception_report(open_perception(root))))))
    page, rep = tmp_path / "r.html", tmp_path / "p.json"
    r = cli("perception", "report", root, "--output", str(page), "--json", str(rep), "--points-in-boxes", "--quiet")
    assert r.returncode == 0, r.stderr
    text = page.read_text()
    from l5dask.perception.plots import PERCEPTION_FIGURES

    assert text.count("<figure>") == len(PERCEPTION_FIGURES) and "http" not in text.split("<body")[1]
    from tests.conftest import chromium

    d = chromium(["--dump-dom", page.as_uri()], tmp_path)
    assert f'data-figures-loaded="{len(PERCEPTION_FIGURES)}"' in d.stdout, d.stderr[-2000:]
    # the page shows the points-in-boxes histogram of the JSON (every category, every bin)
    hist = json.loads(rep.read_text())["lidar"]["points_in_box"]
    section = d.stdout.split("<h2>Lidar points in boxes</h2>")[1].split("</table>")[0]
    rows = [
        [html.unescape(c) for c in re.findall(r"<t[hd]>(.*?)</t[hd]>", row)]
        for row in re.findall(r"<tr>(.*?)</tr>", section)
    ]
    assert f"{hist['total']:,} points" in section
    assert rows[0] == [
        "category",
        "0",
        "1",
        "2-4",
        "5-9",
        "10-19",
        "20-49",
        "50-99",
        "100-199",
        "200-499",
        "500-999",
        "1000+",
    ]
    assert {r[0]: [int(c.replace(",", "")) for c in r[1:]] for r in rows[1:]} == hist["per_category"]
    assert sum(map(sum, hist["per_category"].values())) == json.loads(rep.read_text())["counts"]["sample_annotation"]


def test_archives_s3_and_a_cluster_give_the_same_report(data, tmp_path, s3, on_s3, dask_cluster):
    root = data[0]  # (with a missing sweep: read ahead locally, fetched in batches elsewhere)
    base = public(perception_report(open_perception(root), points_in_boxes=True))
    zpath = tmp_path / "p.zip"
    with zipfile.ZipFile(zpath, "w") as z:
        for folder, _, files in os.walk(root):
            for f in files:
                full = os.path.join(folder, f)
                z.write(full, os.path.join("edge", os.path.relpath(full, root)))
    tpath = tmp_path / "p.tar"
    with tarfile.open(tpath, "w") as t:
        t.add(root, arcname=".")
    for url in (str(zpath), str(tpath)):
        same(public(perception_report(open_perception(url), points_in_boxes=True)), base)
    opts = s3.storage_options()
    same(public(perception_report(open_perception(on_s3, opts), points_in_boxes=True)), base)
    # the sweeps' array from S3, computed by the cluster's worker processes
    from distributed import Client

    from l5dask.perception.lidar import sweeps

    local = sweeps(open_perception(root), frame="world", sweeps_per_task=4).points.compute()
    with Client(dask_cluster.address, set_as_default=False) as client:
        remote = client.compute(sweeps(open_perception(on_s3, opts), frame="world", sweeps_per_task=4).points).result()
    np.testing.assert_array_equal(remote, local)
    # a real scheduler and worker processes: the tables' tasks and the lidar tasks run there
    out = tmp_path / "c.json"
    r = cli(
        "perception",
        "stats",
        root,
        "--output",
        str(out),
        "--points-in-boxes",
        "--scheduler",
        dask_cluster.address,
        "--quiet",
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(out.read_text())
    same(got, json.loads(json.dumps(base)))


def test_to_l5kit_timestamps_are_the_exact_nanoseconds():
    """``to_ns``: the JSON's microseconds times 1000, exactly (``Fraction``), rounded half to even
    where a fraction of a nanosecond is left (timestamps, and small values with many fraction
    bits): float64's product was off by up to 128 ns (a new user's trial: no frame's timestamp a
    multiple of 1000)."""
    from l5dask.perception.to_l5kit import to_ns

    rng = np.random.default_rng(9)
    us = np.concatenate(
        [
            rng.integers(1_500_000_000_000_000, 1_600_000_000_000_000, 200).astype(np.float64),  # whole us
            rng.uniform(1.5e15, 1.6e15, 200),  # (fractions of 0.25 us at this size)
            rng.uniform(0, 1e6, 200),  # small: many fraction bits
            [0.0, 0.25, 2.0**53, 1557861643224377.0],  # (not 0.0005: a half nanosecond, plus 1e-20)
        ]
    )
    assert to_ns(us).tolist() == [round(Fraction(float(u)) * 1000) for u in us]
    assert to_ns(np.array([1557861643224377.0]))[0] == 1557861643224377000


def test_to_l5kit_opens_in_l5kit_and_agrees_with_the_report(data, sdk, tmp_path):
    from l5dask import open_dataset
    from l5dask.perception.to_l5kit import CATEGORY_LABELS

    root = data[0]
    out = str(tmp_path / "p.zarr")
    r = cli("perception", "to-l5kit", root, "-o", out)
    assert r.returncode == 0, r.stderr
    l5kit_data()
    from l5kit.data.zarr_dataset import ChunkedDataset

    z = ChunkedDataset(out).open()
    rep = perception_report(open_perception(root), lidar=False)
    assert len(z.scenes) == rep["counts"]["scene"] and len(z.frames) == rep["counts"]["sample"]
    assert len(z.agents) == rep["counts"]["sample_annotation"]
    labels = ["PERCEPTION_LABEL_NOT_SET", "PERCEPTION_LABEL_UNKNOWN"]
    from l5dask.prediction import format as fmt

    for s_i, scene in enumerate(sdk.scene):
        f0, f1 = z.scenes[s_i]["frame_index_interval"]
        assert z.scenes[s_i]["host"] == "host-" + sdk.get("log", scene["log_token"])["vehicle"]
        tok, f = scene["first_sample_token"], f0
        while tok:
            sample = sdk.get("sample", tok)
            frame = z.frames[f]
            # (exact: the microseconds' value times 1000, where float64's product rounds to 256 ns)
            assert frame["timestamp"] == round(Fraction(sample["timestamp"]) * 1000)
            a0, a1 = frame["agent_index_interval"]
            assert a1 - a0 == len(sample["anns"])
            agents = z.agents[a0:a1]
            by_pos = {(round(float(a["centroid"][0]), 6), round(float(a["centroid"][1]), 6)): a for a in agents}
            for t in sample["anns"]:
                ann = sdk.get("sample_annotation", t)
                a = by_pos[(round(ann["translation"][0], 6), round(ann["translation"][1], 6))]
                name = CATEGORY_LABELS.get(ann["category_name"], "PERCEPTION_LABEL_UNKNOWN")
                assert fmt.LABELS[int(np.argmax(a["label_probabilities"]))] == name
                v = sdk.box_velocity(t)[:2]
                np.testing.assert_array_equal(a["velocity"], np.where(np.isnan(v), 0, v).astype(np.float32))
                np.testing.assert_array_equal(a["extent"], np.array(ann["size"])[[1, 0, 2]].astype(np.float32))
                w, x, y, zq = ann["rotation"]
                assert a["yaw"] == np.float32(math.atan2(2 * (w * zq + x * y), 1 - 2 * (y * y + zq * zq)))
            tok, f = sample["next"], f + 1
        assert f == f1
    ids = [
        (s, int(a["track_id"]))
        for s in range(len(z.scenes))
        for a in z.agents[
            slice(
                *z.frames[z.scenes[s]["frame_index_interval"][0]]["agent_index_interval"][:1],
                z.frames[z.scenes[s]["frame_index_interval"][1] - 1]["agent_index_interval"][1],
            )
        ]
    ]
    assert min(i for _, i in ids) == 1
    counts = open_dataset(out).counts()
    assert counts["scenes"] == rep["counts"]["scene"] and counts["agents"] == rep["counts"]["sample_annotation"]
    r = cli("stats", out, "--quiet")
    assert r.returncode == 0 and "PERCEPTION_LABEL_UNKNOWN" in r.stdout, r.stderr
    assert labels  # the unmapped category went to UNKNOWN (checked per agent above)


# -- bad input: a clear error, one line from the CLI, exit 2, nothing written ------------------
def _edit_remove_sensor(root):
    os.remove(os.path.join(root, "data", "sensor.json"))


def _edit_bad_json(root):
    path = os.path.join(root, "data", "scene.json")
    text = open(path).read()
    open(path, "w").write(text[: len(text) // 2])


def _edit_no_token(root):
    rows = load(root, "log")
    del rows[1]["token"]
    save(root, "log", rows)


def _edit_duplicate(root):
    rows = load(root, "attribute")
    rows[2]["token"] = rows[0]["token"]
    save(root, "attribute", rows)


def _edit_dangling(root):
    rows = load(root, "sample_annotation")
    rows[4]["sample_token"] = "ab" * 32
    save(root, "sample_annotation", rows)


def _edit_loop(root):
    rows = load(root, "sample")
    by = {r["token"]: r for r in rows}
    scene = load(root, "scene")[0]
    first, last = by[scene["first_sample_token"]], by[scene["last_sample_token"]]
    # close the scene's chain into a ring: no sample starts it any more
    first["prev"], last["next"] = last["token"], first["token"]
    save(root, "sample", rows)


def _edit_break(root):
    rows = load(root, "sample_annotation")
    a = next(r for r in rows if r["next"])
    a["next"] = ""
    save(root, "sample_annotation", rows)


def _edit_lidar_size(root):
    sd = [r for r in load(root, "sample_data") if r["sensor_modality"] == "lidar"]
    path = os.path.join(root, sd[3]["filename"])
    with open(path, "ab") as f:
        f.write(b"\0" * 7)
    return sd[3]["filename"]


def _edit_modality_list(root):
    rows = load(root, "sensor")
    lidar = next(r for r in rows if r["modality"] == "lidar")
    lidar["modality"] = ["lidar"]  # DuckDB made it the string '["lidar"]': 0 lidar sweeps, exit 0
    save(root, "sensor", rows)
    return f'row {rows.index(lidar)} (token {lidar["token"]}): modality is a list (["lidar"]), expected a string'


def _edit_name_number(root):
    rows = load(root, "category")
    rows[2]["name"] = 5
    save(root, "category", rows)
    return f"row 2 (token {rows[2]['token']}): name is a number (5), expected a string"


def _edit_timestamp_string(root):
    rows = load(root, "sample")
    rows[7]["timestamp"] = str(rows[7]["timestamp"])
    save(root, "sample", rows)
    return f"row 7 (token {rows[7]['token']}): timestamp is a string"


def _edit_translation_element(root):
    rows = load(root, "sample_annotation")
    rows[3]["translation"][1] = "1.5"
    save(root, "sample_annotation", rows)
    return f'row 3 (token {rows[3]["token"]}): translation[1] is a string ("1.5"), expected a number'


def _edit_zero_rotation(root):
    """A trial's: a box whose rotation has norm 0 was counted by stats (no point in it, where the
    SDK's test counts every one) and refused by evaluate alone; now refused by every command."""
    rows = load(root, "sample_annotation")
    rows[5]["rotation"] = [0, 0, 0, 0]
    save(root, "sample_annotation", rows)
    return "rotation [0.0, 0.0, 0.0, 0.0] has norm 0 (it is no rotation)"


def _edit_zero_size(root):
    rows = load(root, "sample_annotation")
    rows[6]["size"] = [0, 0, 0]
    save(root, "sample_annotation", rows)
    return "size must be positive, got [0.0, 0.0, 0.0]"


def _edit_escaped_key(root):
    """A key spelled with an escape: the compiled scan does not vouch for it; json does."""
    path = os.path.join(root, "data", "sensor.json")
    text = open(path).read().replace('"modality": "lidar"', '"m\\u006fdality": ["lidar"]', 1)
    open(path, "w").write(text)
    return "modality is a list"


def _edit_key_twice(root):
    """A key twice in one object: json keeps the last, DuckDB refuses; one line says which."""
    path = os.path.join(root, "data", "sensor.json")
    text = open(path).read().replace('"modality": "lidar"', '"modality": "camera", "modality": "lidar"', 1)
    open(path, "w").write(text)
    return "the key 'modality' appears twice in one object"


def _edit_deep(root):
    path = os.path.join(root, "data", "log.json")
    rows = load(root, "log")
    text = json.dumps(rows)
    open(path, "w").write(text[:-1] + ", " + "[" * 5000 + "]" * 5000 + "]")
    return "nested too deeply"


BAD = [
    (_edit_modality_list, "sensor.json: row"),
    (_edit_name_number, "category.json: row 2"),
    (_edit_timestamp_string, "sample.json: row 7"),
    (_edit_translation_element, "sample_annotation.json: row 3"),
    (_edit_zero_rotation, "sample_annotation.json: row 5"),
    (_edit_zero_size, "sample_annotation.json: row 6"),
    (_edit_escaped_key, "sensor.json: row"),
    (_edit_deep, "log.json"),
    (_edit_key_twice, "sensor.json: row"),
    (_edit_remove_sensor, "the table sensor.json is missing"),
    (_edit_bad_json, "scene.json: not valid JSON at line"),
    (_edit_no_token, "log.json: row 1 has no token"),
    (_edit_duplicate, "attribute.json: duplicate token"),
    (_edit_dangling, "sample_annotation.json: row 4 (token"),
    (_edit_loop, "sample.json: the prev/next chain loops"),
    (_edit_break, "sample_annotation.json: the prev/next chain breaks"),
    (_edit_lidar_size, "not a multiple of 20"),
]


@pytest.mark.parametrize("edit,message", BAD, ids=[f.__name__[6:] for f, _ in BAD])
def test_bad_input_is_one_clear_line(edit, message, data, tmp_path):
    root = str(tmp_path / "bad")
    shutil.copytree(data[0], root, ignore=shutil.ignore_patterns("images"))
    named = edit(root)
    with pytest.raises(FormatError) as err:
        perception_report(open_perception(root))
    assert message in str(err.value)
    if named:
        assert named in str(err.value)
    if edit is _edit_dangling:
        assert "sample_token" in str(err.value) and "ab" * 32 in str(err.value) and "dangling" in str(err.value)
    out = tmp_path / "out.json"
    r = cli("perception", "stats", root, "--output", str(out), "--quiet")
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in r.stderr
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".out.json")]


def test_not_a_perception_dataset(tmp_path, small_ds):
    r = cli("perception", "stats", small_ds)
    assert r.returncode == 2 and "L5Kit prediction dataset" in r.stderr
    r = cli("perception", "stats", str(tmp_path / "nothing"))
    assert r.returncode == 2 and "no such file" in r.stderr


def test_synth_cli_writes_a_dataset_the_sdk_loads(tmp_path):
    _sdk()
    out = str(tmp_path / "s")
    r = cli("perception", "synth", "-o", out, "--num-scenes", "1", "--lidar-points", "50", "--no-images", "--seed", "3")
    assert r.returncode == 0, r.stderr
    l = lyft(out)
    assert len(l.scene) == 1 and len(l.sample) == 126
    names = {c["name"] for c in l.category}
    assert names == {
        "car",
        "pedestrian",
        "animal",
        "other_vehicle",
        "bus",
        "motorcycle",
        "truck",
        "emergency_vehicle",
        "bicycle",
    }
    assert {s["channel"] for s in l.sensor if s["modality"] == "lidar"} == {
        "LIDAR_TOP",
        "LIDAR_FRONT_LEFT",
        "LIDAR_FRONT_RIGHT",
    }
    assert all(len(r["token"]) == 64 for r in l.sample_annotation)
    r = cli("perception", "synth", "-o", out, "--num-scenes", "1")
    assert r.returncode == 2 and "already exists" in r.stderr


def test_synth_never_replaces_a_users_files(tmp_path):
    """A folder holding a user's file at any depth (``notes.txt``, ``lidar/notes.txt``) was replaced
    whole, without ``--overwrite`` even: refused in one line, left as it is; a dataset written
    before is replaced with ``--overwrite``."""
    for mine in ("notes.txt", "lidar/notes.txt", "data/.hidden.json"):
        out = tmp_path / mine.replace("/", "_")
        (out / mine).parent.mkdir(parents=True, exist_ok=True)
        (out / mine).write_text("mine")
        for flag in ([], ["--overwrite"]):
            r = cli("perception", "synth", "-o", out, "--num-scenes", "1", "--no-images", *flag)
            assert r.returncode == 2 and r.stderr == (
                f"l5dask: error: {out}: the folder holds {mine}, which is not a perception dataset's; write to a "
                "new or empty folder (only a dataset is replaced)\n"
            ), r.stderr
            assert [p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()] == [mine]
    out = tmp_path / "ds"
    for flag in ([], ["--overwrite"]):
        r = cli("perception", "synth", "-o", out, "--num-scenes", "1", "--no-images", "--lidar-points", "50", *flag)
        assert r.returncode == 0, r.stderr


def test_a_sweep_gone_from_s3_after_the_listing_is_named(data, s3, on_s3):
    """On an object store a task's sweeps are fetched ahead while it counts the earlier ones
    (Store.iter_many); one deleted after the dataset was opened is named in one line, as on a disk."""
    from l5dask.perception.lidar import sweeps

    fs = s3.s3fs()
    opts = s3.storage_options()
    ds = open_perception(on_s3, opts)
    sw = sweeps(ds, sweeps_per_task=4)
    local = sweeps(open_perception(data[0]), sweeps_per_task=4).points.compute()
    np.testing.assert_array_equal(sw.points.compute(), local)
    names = ds.table("sample_data").strings("filename")
    i = int(np.flatnonzero(np.diff(sw.offsets) > 1)[1])  # inside a task
    name = names[sw.rows[i]]
    key = f"{on_s3.removeprefix('s3://')}/{name}"
    size = fs.size(key)
    fs.rm(key)
    try:
        with pytest.raises(
            FormatError, match=rf"{os.path.basename(name)}: a lidar sweep listed with {size} bytes is missing now"
        ):
            sweeps(ds, sweeps_per_task=4).points.compute()
    finally:
        fs.put(os.path.join(data[0], name), key)  # (the module's other tests read it whole)
