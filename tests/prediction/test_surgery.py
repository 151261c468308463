"""Dataset surgery (concat, subset, split) against L5Kit's own zarr_utils, value for value."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

import l5dask
from l5dask.cli import main
from l5dask.errors import L5DaskError
from l5dask.prediction import format as fmt
from l5dask.prediction import surgery
from tests.conftest import SMALL_CHUNKS, l5kit_data, read_all


def _zarr_utils():
    l5kit_data()
    from l5kit.data import zarr_utils
    from l5kit.data.zarr_dataset import ChunkedDataset

    return zarr_utils, ChunkedDataset


def write_mask(path: str, name: str, values: np.ndarray) -> None:
    """An agents mask as L5Kit's select_agents writes it (zarr-python 2, chunks (10000,))."""
    import zarr

    root = zarr.open_group(path, mode="a")
    if "agents_mask" not in root:
        root.create_group("agents_mask")
    arr = zarr.open_array(
        os.path.join(path, "agents_mask", name), mode="w", dtype=np.uint32, shape=values.shape, chunks=(10000,)
    )
    arr[:] = values


def read_mask(path: str, name: str) -> np.ndarray:
    import zarr

    return zarr.open_array(os.path.join(path, "agents_mask", name), mode="r")[:]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Two datasets with small chunks (scenes, frames and runs straddle chunk edges), with masks."""
    base = tmp_path_factory.mktemp("surgery")
    a, b = str(base / "a.zarr"), str(base / "b.zarr")
    l5dask.synthesize(a, num_scenes=7, seed=7, chunk_rows=SMALL_CHUNKS)
    l5dask.synthesize(b, num_scenes=4, seed=8, chunk_rows={**SMALL_CHUNKS, fmt.AGENTS: 3_001})
    rng = np.random.default_rng(0)
    for path in (a, b):
        n = len(read_all(path)["agents"])
        write_mask(path, "0.5", rng.integers(0, 50, (n, 2)).astype(np.uint32))
    write_mask(a, "0.8", rng.integers(0, 50, (len(read_all(a)["agents"]), 2)).astype(np.uint32))
    return a, b


def assert_same(ours: str, ref: str) -> None:
    r, o = read_all(ref), read_all(ours)
    assert sorted(r) == sorted(o)
    for name in r:
        assert o[name].dtype == r[name].dtype, name
        np.testing.assert_array_equal(o[name], r[name], err_msg=name)


def l5kit_subset(src: str, dst: str, scenes: np.ndarray) -> None:
    """L5Kit's _append_zarr_subset over each run of consecutive scenes, in order."""
    zu, ChunkedDataset = _zarr_utils()
    inp = ChunkedDataset(src).open()
    runs = surgery.runs_of(scenes)
    total = {"num_scenes": 0, "num_frames": 0, "num_agents": 0, "num_tl_faces": 0}
    sizes = [zu._get_num_els_in_scene_range(inp, s0, s1) for s0, s1 in runs]
    out = ChunkedDataset(dst).initialize(**{k: sum(s[k] for s in sizes) for k in total})
    for (s0, s1), size in zip(runs, sizes):
        zu._append_zarr_subset(inp, out, s0, s1, dict(total))
        total = {k: total[k] + size[k] for k in total}


@pytest.mark.parametrize("chunks_per_task", [1, None])
def test_concat_equals_l5kit_zarr_concat(inputs, tmp_path, chunks_per_task):
    zu, _ = _zarr_utils()
    a, b = inputs
    ref = str(tmp_path / "ref.zarr")
    zu.zarr_concat([a, b, a], ref)
    out = l5dask.concat([a, b, a], str(tmp_path / "out.zarr"), chunks_per_task=chunks_per_task)
    assert_same(out.url, ref)
    # beyond L5Kit: the mask every input holds is concatenated; the one only `a` holds is not
    assert sorted(out.masks) == ["0.5"]
    want = np.concatenate([read_mask(a, "0.5"), read_mask(b, "0.5"), read_mask(a, "0.5")])
    got = read_mask(out.url, "0.5")
    assert got.dtype == np.uint32 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    zarray = json.loads(open(os.path.join(out.url, "agents_mask", "0.5", ".zarray")).read())
    assert zarray["chunks"] == [10000, 2] and zarray["dtype"] == "<u4"
    # and l5dask reads the mask it wrote, as records of the same bytes
    assert np.array_equal(out.masks["0.5"].read(0, out.masks["0.5"].nchunks)["value"], want)


@pytest.mark.parametrize("ranges", ["2:5", "5:7,0:2", "0:1,3:4,6:7"])
def test_subset_by_scene_ranges_equals_l5kit(inputs, tmp_path, ranges):
    a, _ = inputs
    scenes = np.concatenate([np.arange(*map(int, r.split(":"))) for r in ranges.split(",")])
    ref = str(tmp_path / "ref.zarr")
    l5kit_subset(a, ref, scenes)
    out = l5dask.subset(a, str(tmp_path / "out.zarr"), scenes=ranges, chunks_per_task=1)
    assert_same(out.url, ref)
    # the masks are sliced with their agents
    ref_agents = np.concatenate([np.arange(*r) for r in _agent_ranges(a, scenes)])
    for name in ("0.5", "0.8"):
        np.testing.assert_array_equal(read_mask(out.url, name), read_mask(a, name)[ref_agents])


def _agent_ranges(path: str, scenes: np.ndarray) -> list[tuple[int, int]]:
    d = read_all(path)
    out = []
    for s in scenes:
        f0, f1 = d["scenes"]["frame_index_interval"][s]
        out.append((d["frames"]["agent_index_interval"][f0][0], d["frames"]["agent_index_interval"][f1 - 1][1]))
    return out


def test_subset_by_hosts_and_time_equal_l5kit(inputs, tmp_path):
    a, _ = inputs
    d = read_all(a)
    hosts = sorted(set(d["scenes"]["host"].tolist()))[:2]
    want = np.flatnonzero(np.isin(d["scenes"]["host"], hosts))
    ref = str(tmp_path / "ref.zarr")
    l5kit_subset(a, ref, want)
    out = l5dask.subset(a, str(tmp_path / "hosts.zarr"), hosts=hosts)
    assert_same(out.url, ref)

    # a time range selects the scenes whose first frame's timestamp is in [start, end)
    first = d["frames"]["timestamp"][d["scenes"]["frame_index_interval"][:, 0]]
    lo, hi = int(np.sort(first)[2]), int(np.sort(first)[5])
    want = np.flatnonzero((first >= lo) & (first < hi))
    ref2 = str(tmp_path / "ref2.zarr")
    l5kit_subset(a, ref2, want)
    iso = lambda ns: np.datetime_as_string(np.datetime64(ns, "ns"), unit="ns")  # noqa: E731
    out = l5dask.subset(a, str(tmp_path / "time.zarr"), start=iso(lo), end=iso(hi))
    assert_same(out.url, ref2)
    assert len(out["scenes"]) == 3
    # a time zone is honoured: the same instant written in UTC+02:00
    t = np.datetime64(lo, "ns").astype("datetime64[us]").item()
    import datetime as dt

    local = (t.replace(tzinfo=dt.timezone.utc) + dt.timedelta(hours=2)).replace(
        tzinfo=dt.timezone(dt.timedelta(hours=2))
    )
    assert surgery.parse_time(local.isoformat(), "--start") == lo // 1000 * 1000


def test_split_equals_l5kit_zarr_split(inputs, tmp_path):
    zu, _ = _zarr_utils()
    a, _ = inputs
    size_gb = zu._compute_path_size(a) / zu.GIGABYTE
    infos = [
        {"name": "train", "split_size_GB": size_gb * 0.45},
        {"name": "val", "split_size_GB": size_gb * 0.2},
        {"name": "rest", "split_size_GB": -1},
    ]
    cuts = zu.zarr_split(a, str(tmp_path / "ref"), infos)
    parts = l5dask.split(
        a, str(tmp_path / "ours"), [f"train={size_gb * 0.45!r}GB", f"val={size_gb * 0.2!r}GB", "rest=rest"]
    )
    assert list(parts) == ["train", "val", "rest"]
    for (s0, s1), name in zip(cuts, parts):
        assert len(parts[name]["scenes"]) == s1 - s0
        assert_same(parts[name].url, str(tmp_path / "ref" / name))
    # by counts: consecutive parts of N scenes
    parts = l5dask.split(a, str(tmp_path / "n"), ["x=2", "y=3"])
    d = read_all(a)
    ref = str(tmp_path / "ref-y.zarr")
    l5kit_subset(a, ref, np.arange(2, 5))
    assert_same(parts["y"].url, ref)
    assert len(parts["x"]["scenes"]) == 2 and len(d["scenes"]) == 7


def test_without_traffic_lights(tmp_path):
    old = str(tmp_path / "old.zarr")
    l5dask.synthesize(old, num_scenes=4, seed=2, chunk_rows=SMALL_CHUNKS, traffic_lights=False)
    out = l5dask.subset(old, str(tmp_path / "sub.zarr"), scenes="1:3")
    d, o = read_all(old), read_all(out.url)
    assert "traffic_light_faces" not in o
    f0, f1 = d["scenes"]["frame_index_interval"][1][0], d["scenes"]["frame_index_interval"][2][1]
    a0, a1 = d["frames"]["agent_index_interval"][f0][0], d["frames"]["agent_index_interval"][f1 - 1][1]
    np.testing.assert_array_equal(o["agents"], d["agents"][a0:a1])
    want = d["frames"][f0:f1].copy()
    want["agent_index_interval"] -= a0
    np.testing.assert_array_equal(o["frames"], want)
    both = l5dask.concat([old, out.url], str(tmp_path / "both.zarr"))
    assert len(both["agents"]) == len(d["agents"]) + a1 - a0


def test_empty_scenes_and_frames_are_carried(tmp_path):
    """Scenes without frames and frames without agents (L5Kit's copy cannot take them): numpy."""
    src = str(tmp_path / "src.zarr")
    l5dask.synthesize(src, num_scenes=3, seed=4, chunk_rows=SMALL_CHUNKS)
    d = read_all(src)
    scenes = np.concatenate([d["scenes"][:1], d["scenes"][1:2], d["scenes"][1:]])
    scenes[1]["frame_index_interval"] = scenes[2]["frame_index_interval"][0]  # an empty scene
    frames = d["frames"].copy()
    f = int(d["scenes"]["frame_index_interval"][1][0])  # the first frame of scene 2 loses its agents
    drop = frames["agent_index_interval"][f].copy()
    agents = np.concatenate([d["agents"][: drop[0]], d["agents"][drop[1] :]])
    frames["agent_index_interval"][f, 1] = drop[0]
    frames["agent_index_interval"][f + 1 :] -= drop[1] - drop[0]
    edge = str(tmp_path / "edge.zarr")
    l5dask.write_dataset(
        edge,
        {"scenes": scenes, "frames": frames, "agents": agents, "traffic_light_faces": d["traffic_light_faces"]},
        chunk_rows=SMALL_CHUNKS,
    )
    out = read_all(l5dask.subset(edge, str(tmp_path / "o.zarr"), scenes="1:3").url)
    f0, f1 = scenes["frame_index_interval"][1][0], scenes["frame_index_interval"][2][1]
    a0, a1 = frames["agent_index_interval"][f0][0], frames["agent_index_interval"][f1 - 1][1]
    t0 = frames["traffic_light_faces_index_interval"][f0][0]
    want_scenes = scenes[1:3].copy()
    want_scenes["frame_index_interval"] -= f0
    want_frames = frames[f0:f1].copy()
    want_frames["agent_index_interval"] -= a0
    want_frames["traffic_light_faces_index_interval"] -= t0
    np.testing.assert_array_equal(out["scenes"], want_scenes)
    np.testing.assert_array_equal(out["frames"], want_frames)
    np.testing.assert_array_equal(out["agents"], agents[a0:a1])


def test_s3_to_s3(inputs, s3, tmp_path):
    a, _ = inputs
    s3.make_bucket("surgery")
    opts = s3.storage_options()
    fs = s3.s3fs()
    fs.put(a, "surgery/a.zarr", recursive=True)
    out = l5dask.subset("s3://surgery/a.zarr", "s3://surgery/sub.zarr", scenes="1:4", storage_options=opts)
    ref = str(tmp_path / "ref.zarr")
    l5kit_subset(a, ref, np.arange(1, 4))
    local = str(tmp_path / "back.zarr")
    fs.get("surgery/sub.zarr", local, recursive=True)
    assert_same(local, ref)
    assert sorted(out.masks) == ["0.5", "0.8"]


# --- bad input: clear errors, nothing written ---------------------------------------------------
@pytest.mark.parametrize(
    "ranges, message",
    [
        ("3:3", "is empty"),
        ("5:2", "is empty"),
        ("0:4,2:6", "overlap"),
        ("0:8", "out of range: the dataset has 7 scenes"),
        ("-1:3", "out of range"),
        ("a:b", "is not START:END"),
    ],
)
def test_bad_scene_ranges(inputs, tmp_path, ranges, message):
    out = tmp_path / "out.zarr"
    with pytest.raises(L5DaskError, match=message):
        l5dask.subset(inputs[0], str(out), scenes=ranges)
    assert not out.exists()


def test_bad_subsets_and_splits(inputs, tmp_path):
    a, _ = inputs
    with pytest.raises(L5DaskError, match="no scene has host 'host-x'; the hosts are host-"):
        l5dask.subset(a, str(tmp_path / "o.zarr"), hosts="host-x")
    with pytest.raises(L5DaskError, match="not an ISO date"):
        l5dask.subset(a, str(tmp_path / "o.zarr"), start="yesterday")
    with pytest.raises(L5DaskError, match="no scene matches"):
        l5dask.subset(a, str(tmp_path / "o.zarr"), start="1990-01-01", end="1990-01-02")
    with pytest.raises(L5DaskError, match="say which scenes"):
        l5dask.subset(a, str(tmp_path / "o.zarr"))
    with pytest.raises(L5DaskError, match="only the last part may be 'rest'"):
        l5dask.split(a, str(tmp_path / "p"), ["x=rest", "y=2"])
    with pytest.raises(L5DaskError, match="nothing is left for z=rest"):
        l5dask.split(a, str(tmp_path / "p"), ["x=4", "y=3", "z=rest"])
    with pytest.raises(L5DaskError, match="the parts take 9 scenes; the dataset has 7"):
        l5dask.split(a, str(tmp_path / "p"), ["x=4", "y=5"])
    with pytest.raises(L5DaskError, match="given twice"):
        l5dask.split(a, str(tmp_path / "p"), ["x=1", "x=2"])
    with pytest.raises(L5DaskError, match="is not NAME=N"):
        l5dask.split(a, str(tmp_path / "p"), ["x"])
    with pytest.raises(L5DaskError, match="holds no scene"):
        l5dask.split(a, str(tmp_path / "p"), ["x=0.0000000001GB", "y=rest"])
    assert not (tmp_path / "o.zarr").exists() and not (tmp_path / "p").exists()


def test_concat_refuses_what_it_cannot_join(inputs, tmp_path):
    a, b = inputs
    old = str(tmp_path / "old.zarr")
    l5dask.synthesize(old, num_scenes=2, seed=1, traffic_lights=False)
    with pytest.raises(L5DaskError, match="has a traffic_light_faces array and .* does not"):
        l5dask.concat([a, old], str(tmp_path / "o.zarr"))
    relabelled = str(tmp_path / "relabelled.zarr")
    shutil.copytree(b, relabelled)
    attrs = json.loads(open(os.path.join(relabelled, ".zattrs")).read())
    attrs["labels"] = attrs["labels"][::-1]
    open(os.path.join(relabelled, ".zattrs"), "w").write(json.dumps(attrs))
    with pytest.raises(L5DaskError, match="label list differs"):
        l5dask.concat([a, relabelled], str(tmp_path / "o.zarr"))
    with pytest.raises(L5DaskError, match="no such file, folder or bucket"):
        l5dask.concat([a, str(tmp_path / "missing.zarr")], str(tmp_path / "o.zarr"))
    with pytest.raises(L5DaskError, match="the output is an input"):
        l5dask.concat([a, b], a, overwrite=True)
    assert not (tmp_path / "o.zarr").exists()
    assert l5dask.open_dataset(a).counts()["scenes"] == 7  # the input is untouched


def test_existing_output_is_refused_unless_overwrite(inputs, tmp_path):
    a, b = inputs
    out = str(tmp_path / "out.zarr")
    l5dask.subset(a, out, scenes="0:1")
    with pytest.raises(L5DaskError, match="a dataset already exists there"):
        l5dask.subset(a, out, scenes="0:2")
    assert len(l5dask.open_dataset(out)["scenes"]) == 1
    l5dask.subset(a, out, scenes="0:2", overwrite=True)
    assert len(l5dask.open_dataset(out)["scenes"]) == 2


def test_failure_midway_leaves_nothing_that_opens(inputs, tmp_path):
    a, _ = inputs
    broken = str(tmp_path / "broken.zarr")
    shutil.copytree(a, broken)
    with open(os.path.join(broken, "agents", "3"), "r+b") as f:  # a corrupt agents chunk
        f.truncate(40)
    out = tmp_path / "out.zarr"
    with pytest.raises(L5DaskError, match="truncated or corrupt"):
        l5dask.concat([a, broken], str(out))
    assert not out.exists()
    with pytest.raises(L5DaskError):
        l5dask.open_dataset(str(out))


def test_broken_intervals_are_refused_before_writing(inputs, tmp_path):
    import zarr

    a, _ = inputs
    broken = str(tmp_path / "broken.zarr")
    shutil.copytree(a, broken)
    frames = zarr.open_array(os.path.join(broken, "frames"), mode="r+")
    row = frames[500]
    row["agent_index_interval"][1] += 3  # frame 500 ends after frame 501 starts
    frames[500] = row
    out = tmp_path / "out.zarr"
    with pytest.raises(L5DaskError, match="frames.*agent_index_interval.*row 50[01]"):
        l5dask.subset(broken, str(out), scenes="0:3")
    assert not out.exists()


# --- the CLI ---------------------------------------------------------------------------------------
def test_cli_surgery(inputs, tmp_path):
    a, b = inputs
    runner = CliRunner()
    r = runner.invoke(main, ["concat", a, b, "--output", str(tmp_path / "c.zarr")])
    assert r.exit_code == 0, r.output
    assert "c.zarr" in r.output and "scenes" in r.output
    assert len(l5dask.open_dataset(str(tmp_path / "c.zarr"))["scenes"]) == 11
    # a's mask 0.8, which b lacks, is dropped (documented) and said (a trial found it silent)
    assert "l5dask: note: agent masks 0.8 are not in the output (not every input holds them)" in r.output
    assert list(l5dask.open_dataset(str(tmp_path / "c.zarr")).masks) == ["0.5"]
    r = runner.invoke(main, ["concat", b, b, "--output", str(tmp_path / "bb.zarr")])
    assert r.exit_code == 0 and "note" not in r.output, r.output
    r = runner.invoke(main, ["subset", a, "-o", str(tmp_path / "s.zarr"), "--ranges", "1:3"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["split", a, "-o", str(tmp_path / "parts"), "--part", "a=2", "--part", "b=rest"])
    assert r.exit_code == 0, r.output
    assert len(l5dask.open_dataset(str(tmp_path / "parts" / "b"))["scenes"]) == 5


@pytest.mark.parametrize(
    "args, message",
    [
        (["subset", "{a}", "-o", "{out}", "--ranges", "0:0"], "is empty"),
        (["subset", "{a}", "-o", "{out}", "--ranges", "2:20"], "out of range"),
        (["subset", "{a}", "-o", "{a}", "--ranges", "0:2"], "the output is an input"),
        (["subset", "{a}", "-o", "{out}"], "say which scenes"),
        (["concat", "{a}", "{a}", "--output", "{b}"], "a dataset already exists there"),
        (["split", "{a}", "-o", "{out}", "--part", "x=rest", "--part", "y=1"], "only the last part"),
        # (its form checked before the dataset is read: the bound was said as 9223372036854775807 scenes)
        (["subset", "{a}", "-o", "{out}", "--ranges", "-3:2"], "is out of range: scene indices start at 0"),
        (
            [
                "split",
                "{a}",
                "-o",
                "{out}",
                "--scenes",
                "scene_index >= 2",
                "--part",
                "x=0.001GB",
                "--part",
                "y=rest",
                "-q",
            ],
            "part x=0.001GB: a part in GB is cut by the size of a stored dataset's files (L5Kit's zarr_split), "
            "and these are 5 of its scenes: write them first (l5dask subset)",
        ),
    ],
)
def test_cli_surgery_errors_are_one_line(inputs, tmp_path, args, message):
    a, b = inputs
    args = [x.format(a=a, b=b, out=str(tmp_path / "out")) for x in args]
    r = CliRunner().invoke(main, args)
    assert r.exit_code != 0
    lines = [ln for ln in r.output.strip().splitlines() if ln]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in r.output, r.output
    assert not (tmp_path / "out").exists()


def test_an_output_that_holds_or_lies_in_its_input_is_refused_and_nothing_is_lost(inputs, tmp_path):
    """A new user's finding: ``subset``/``export --overwrite`` with an output folder that holds the
    input replaced that folder whole and deleted the input; an output inside the input was
    accepted. Both are refused in one line, the input untouched; a folder of other things is not
    taken for a dataset's, with or without ``--overwrite``."""
    a, _ = inputs
    dd = tmp_path / "dd"
    dd.mkdir()
    src = dd / "in.zarr"
    shutil.copytree(a, src)
    counts = l5dask.open_dataset(str(src)).counts()
    cases = [
        (["subset", src, "-o", dd, "--ranges", "0:2", "--overwrite"], "the output holds an input"),
        (["subset", src, "-o", src / "sub.zarr", "--ranges", "0:2"], "the output is inside an input"),
        (["export", src, "-o", dd, "--overwrite"], "the output holds the input"),
        (["export", src, "-o", src / "ex"], "the output is inside the input"),
    ]
    for args, message in cases:
        r = CliRunner().invoke(main, [str(x) for x in args])
        lines = [ln for ln in r.output.strip().splitlines() if ln]
        assert r.exit_code != 0 and len(lines) == 1 and message in lines[0], (args, r.output)
        assert l5dask.open_dataset(str(src)).counts() == counts
        assert sorted(os.listdir(dd)) == ["in.zarr"] and not (src / "sub.zarr").exists() and not (src / "ex").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("keep me")
    for extra in ([], ["--overwrite"]):
        r = CliRunner().invoke(main, ["subset", str(src), "-o", str(kept), "--ranges", "0:2", *extra])
        assert r.exit_code != 0 and "holds notes.txt, which is not a dataset's" in r.output, r.output
        assert sorted(os.listdir(kept)) == ["notes.txt"]
    r = CliRunner().invoke(main, ["export", str(src), "-o", str(kept), "--overwrite"])
    assert r.exit_code != 0 and "holds notes.txt, which is not an export's" in r.output, r.output
    assert sorted(os.listdir(kept)) == ["notes.txt"]
    with pytest.raises(L5DaskError, match="holds notes.txt, which is not a dataset's"):
        l5dask.synthesize(str(kept), num_scenes=2, overwrite=True)
    assert (kept / "notes.txt").read_text() == "keep me"
    # a dataset (or an empty folder) is still replaced with --overwrite
    out = tmp_path / "out.zarr"
    for _ in range(2):
        r = CliRunner().invoke(main, ["subset", str(src), "-o", str(out), "--ranges", "0:2", "--overwrite"])
        assert r.exit_code == 0, r.output
    assert l5dask.open_dataset(str(out)).counts()["scenes"] == 2


@pytest.mark.parametrize("fault", [OSError, KeyboardInterrupt])
def test_an_overwrite_that_fails_part_way_keeps_the_previous_output(inputs, tmp_path, monkeypatch, fault):
    """A new user's finding: ``subset --overwrite`` interrupted (Ctrl-C) after the old output was
    removed left a half-written folder that is not a dataset. The new output is written beside
    and replaces the old one whole at the end: a failure or Ctrl-C part way keeps the old one, and
    leaves no temporary folder; ``split`` and ``concat`` alike."""
    a, b = inputs
    out, parts = tmp_path / "out.zarr", tmp_path / "parts"
    l5dask.subset(a, str(out), scenes="0:2")
    l5dask.split(a, str(parts), ["x=2", "y=rest"])
    before = {p: l5dask.open_dataset(str(p)).counts() for p in (out, parts / "x", parts / "y")}
    calls = []

    def failing(*args, **kw):
        calls.append(1)
        if len(calls) > 1:
            raise fault("stopped part way")
        return copy(*args, **kw)

    copy = surgery.copy_rows
    monkeypatch.setattr(surgery, "copy_rows", failing)
    for run in (
        lambda: l5dask.subset(a, str(out), scenes="0:5", overwrite=True, chunks_per_task=1, scheduler="sync"),
        lambda: l5dask.concat([a, b], str(out), overwrite=True, chunks_per_task=1, scheduler="sync"),
        lambda: l5dask.split(a, str(parts), ["x=3", "y=rest"], overwrite=True, chunks_per_task=1, scheduler="sync"),
    ):
        calls.clear()
        with pytest.raises(fault):
            run()
        assert {p: l5dask.open_dataset(str(p)).counts() for p in before} == before
        assert sorted(os.listdir(tmp_path)) == ["out.zarr", "parts"] and sorted(os.listdir(parts)) == ["x", "y"]
    monkeypatch.setattr(surgery, "copy_rows", copy)
    assert l5dask.subset(a, str(out), scenes="0:5", overwrite=True).counts()["scenes"] == 5


def _tree(folder) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes)."""
    out = {}
    for d, _, names in os.walk(folder):
        for n in names:
            p = os.path.join(d, n)
            out[os.path.relpath(p, folder)] = open(p, "rb").read()
    return out


@pytest.mark.parametrize(
    "command",
    [
        ["subset", "{a}", "--ranges", "0:2"],
        ["concat", "{a}", "{b}"],
        ["export", "{a}"],
        ["export", "{a}", "--format", "zarr3"],
        ["synth", "--num-scenes", "2"],
    ],
    ids=["subset", "concat", "export", "export-zarr3", "synth"],
)
def test_a_users_files_anywhere_in_an_output_are_never_replaced(inputs, tmp_path, command):
    """A file of a user's at any depth of the output folder (``agents/NOTES.md``, a hidden
    ``frames/.keep``, a folder of results) makes the output refused, with or without ``--overwrite``,
    in one line naming it; the folder is left byte for byte. The output the command wrote itself
    (a dataset with its agent masks, an export) is replaced with ``--overwrite``."""
    a, b = inputs
    args = [x.format(a=a, b=b) for x in command]
    out = tmp_path / "out"
    first = CliRunner().invoke(main, [*args, "-o", str(out), "-q"])
    assert first.exit_code == 0, first.output
    if command[0] in ("subset", "concat"):  # (the masks are written too: claimed as a dataset's)
        assert any(k.startswith("agents_mask/") for k in _tree(out))
    for extra in ("agents/NOTES.md", "frames/analysis/a.csv", "frames/.keep", "scenes/old/0"):
        path = out / extra
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("mine")
        before = _tree(out)
        for flag in ([], ["--overwrite"]):
            r = CliRunner().invoke(main, [*args, "-o", str(out), "-q", *flag])
            lines = [ln for ln in r.output.strip().splitlines() if ln]
            assert r.exit_code == 2 and len(lines) == 1, r.output
            assert f"holds {extra}, which is not" in lines[0], lines
            assert _tree(out) == before
        os.unlink(path)
    shutil.rmtree(out / "frames" / "analysis")
    shutil.rmtree(out / "scenes" / "old")
    r = CliRunner().invoke(main, [*args, "-o", str(out), "-q", "--overwrite"])
    assert r.exit_code == 0, r.output
    # the same with the output not yet there: a folder holding only a user's file under agents/
    fresh = tmp_path / "fresh"
    (fresh / "agents").mkdir(parents=True)
    (fresh / "agents" / "NOTES.md").write_text("mine")
    r = CliRunner().invoke(main, [*args, "-o", str(fresh), "-q"])
    assert r.exit_code == 2 and "holds agents/NOTES.md" in r.output, r.output
    assert _tree(fresh) == {os.path.join("agents", "NOTES.md"): b"mine"}


def test_a_dataset_and_an_export_do_not_replace_each_other(inputs, tmp_path):
    """``export small.zarr -o train.zarr --overwrite`` (arguments swapped) would have replaced an
    L5Kit dataset with an export; a dataset's writer would replace an export: both refused, in
    one line saying what is there; a split into a dataset's folder is refused too."""
    a, _ = inputs
    ds, ex = tmp_path / "ds.zarr", tmp_path / "ex"
    shutil.copytree(a, ds)
    assert CliRunner().invoke(main, ["export", a, "-o", str(ex), "-q"]).exit_code == 0
    kept = (_tree(ds), _tree(ex))
    for args, message in (
        (["export", a, "-o", str(ds), "--overwrite"], "ds.zarr: is a dataset, not an export"),
        (["export", a, "-o", str(ds), "--format", "zarr3", "--overwrite"], "ds.zarr: is a dataset, not an export"),
        (["subset", a, "-o", str(ex), "--ranges", "0:1", "--overwrite"], "ex: is an export, not a dataset"),
        (["synth", "-o", str(ex), "--num-scenes", "2", "--overwrite"], "ex: is an export, not a dataset"),
        (["split", a, "-o", str(ds), "--part", "x=2", "--part", "y=rest", "--overwrite"], "ds.zarr: is a dataset"),
    ):
        r = CliRunner().invoke(main, [*args, "-q"])
        lines = [ln for ln in r.output.strip().splitlines() if ln]
        assert r.exit_code == 2 and len(lines) == 1 and message in lines[0], (args, r.output)
        assert (_tree(ds), _tree(ex)) == kept


def test_a_dataset_written_part_way_is_replaced_only_with_overwrite(inputs, tmp_path):
    """A dataset folder without its group metadata (a run killed part way) is refused without
    ``--overwrite`` (it was written over, without a word) and replaced with it."""
    a, _ = inputs
    out = tmp_path / "out.zarr"
    l5dask.subset(a, str(out), scenes="0:1")
    os.unlink(out / ".zgroup")
    with pytest.raises(L5DaskError, match="part of a dataset is there"):
        l5dask.subset(a, str(out), scenes="0:2")
    l5dask.subset(a, str(out), scenes="0:2", overwrite=True)
    assert len(l5dask.open_dataset(str(out))["scenes"]) == 2


@pytest.mark.parametrize("name", ["out.zip", "out.tar.gz"])
def test_an_output_named_as_an_archive_is_refused_as_such(inputs, tmp_path, name):
    """A dataset (or an export, or a split) is written as a folder: an output named ``*.zip`` is
    refused saying so (it said ``no such file``; ``split`` made a folder named ``out.zip``)."""
    a, _ = inputs
    out = str(tmp_path / name)
    for args in (
        ["subset", a, "--ranges", "0:1"],
        ["concat", a, a],
        ["synth", "--num-scenes", "1"],
        ["export", a],
        ["split", a, "--part", "x=1", "--part", "y=rest"],
    ):
        r = CliRunner().invoke(main, [*args, "-o", out, "-q"])
        lines = [ln for ln in r.output.strip().splitlines() if ln]
        assert r.exit_code == 2 and len(lines) == 1, (args, r.output)
        assert "is written as a folder, not a " in lines[0] and "no such file" not in lines[0], lines
    assert os.listdir(tmp_path) == []


def test_a_subset_that_selects_no_scene_exits_1_as_every_scene_filter(inputs, tmp_path):
    """``subset --start`` past the data selects no scene: exit 1 (an answer, as ``--scenes``
    choosing none), where it was 2 (a mistake); an unknown host is still a mistake (2)."""
    a, _ = inputs
    out = tmp_path / "none.zarr"
    for args, code, message in (
        (["--start", "2030-01-01"], 1, "no scene matches the subset asked for; nothing written"),
        (["--scenes", "num_frames < 0"], 1, "selects no scene (of 7)"),
        (["--hosts", "host-zzz"], 2, "no scene has host 'host-zzz'"),
    ):
        r = CliRunner().invoke(main, ["subset", a, "-o", str(out), "-q", *args])
        assert r.exit_code == code and message in r.output, (args, r.output)
        assert not out.exists()


def test_a_split_in_gb_of_some_scenes_is_refused_and_one_of_all_scenes_is_l5kits(inputs, tmp_path):
    """A new user's finding: ``split --scenes EXPR --part a=xGB`` cut the chosen scenes by the whole
    dataset's size (2 of 20 chosen scenes where L5Kit's zarr_split of the written subset cuts 7).
    The chosen scenes' stored size is known only once written: refused in one line, nothing
    written; a choice of every scene is the dataset itself, cut as zarr_split cuts it."""
    zu, _ = _zarr_utils()
    a, _ = inputs
    ds = l5dask.open_dataset(a)
    with pytest.raises(L5DaskError, match=r"^part x=0.01GB: a part in GB .* these are 3 of its scenes"):
        l5dask.split(ds.isel([1, 2, 3]), str(tmp_path / "some"), ["x=0.01GB", "y=rest"])
    assert not (tmp_path / "some").exists()
    size_gb = zu._compute_path_size(a) / zu.GIGABYTE
    cuts = zu.zarr_split(
        a, str(tmp_path / "ref"), [{"name": "x", "split_size_GB": size_gb * 0.45}, {"name": "y", "split_size_GB": -1}]
    )
    parts = l5dask.split(ds.isel(slice(None)), str(tmp_path / "all"), [f"x={size_gb * 0.45!r}GB", "y=rest"])
    assert [len(p["scenes"]) for p in parts.values()] == [s1 - s0 for s0, s1 in cuts]


def test_a_split_that_leaves_scenes_out_says_so(inputs, tmp_path):
    """``split --part a=2 --part b=3`` of 7 scenes (no NAME=rest, which L5Kit's zarr_split asks
    for) wrote 5 and said nothing of the 2 left out: a note on stderr names them."""
    a, _ = inputs
    r = CliRunner().invoke(main, ["split", a, "-o", str(tmp_path / "p"), "--part", "a=2", "--part", "b=3", "-q"])
    assert r.exit_code == 0, r.output
    assert "l5dask: note: scenes 5 to 6 (2 of 7) are in no part (no NAME=rest)" in r.output
    r = CliRunner().invoke(main, ["split", a, "-o", str(tmp_path / "q"), "--part", "a=2", "--part", "b=rest", "-q"])
    assert r.exit_code == 0 and "note" not in r.output, r.output
