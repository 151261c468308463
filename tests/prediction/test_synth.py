"""The generator follows the real data's shape and is deterministic for a seed."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import l5dask
from l5dask.errors import UsageError
from l5dask.prediction import format as fmt
from tests.conftest import read_all


def test_deterministic_for_a_seed(tmp_path):
    a, b, c = (tmp_path / n for n in ("a.zarr", "b.zarr", "c.zarr"))
    l5dask.synthesize(a, num_scenes=2, seed=11)
    l5dask.synthesize(b, num_scenes=2, seed=11)
    l5dask.synthesize(c, num_scenes=2, seed=12)
    ra, rb, rc = read_all(str(a)), read_all(str(b)), read_all(str(c))
    for name in ra:
        assert ra[name].tobytes() == rb[name].tobytes()
    assert ra["agents"].tobytes() != rc["agents"].tobytes()


def test_shape_follows_the_real_data(small_ds):
    d = read_all(small_ds)
    scenes, frames, agents, tl = d["scenes"], d["frames"], d["agents"], d["traffic_light_faces"]
    fpi = np.diff(scenes["frame_index_interval"], axis=1).ravel()
    assert set(fpi) <= {248, 249}
    # intervals are contiguous and cover the arrays
    for parent, field, child in (
        (scenes, "frame_index_interval", frames),
        (frames, "agent_index_interval", agents),
        (frames, "traffic_light_faces_index_interval", tl),
    ):
        iv = parent[field]
        assert iv[0, 0] == 0 and iv[-1, 1] == len(child) and (iv[1:, 0] == iv[:-1, 1]).all()
    # 10 Hz
    dts = np.concatenate([np.diff(frames["timestamp"][s:e]) for s, e in scenes["frame_index_interval"]])
    assert abs(np.median(dts) - 1e8) < 1e6
    per_frame = np.diff(frames["agent_index_interval"], axis=1)
    assert 50 < per_frame.mean() < 120
    labels = np.bincount(agents["label_probabilities"].argmax(1), minlength=17) / len(agents)
    assert 0.6 < labels[fmt.LABELS.index("PERCEPTION_LABEL_UNKNOWN")] < 0.8
    assert 0.2 < labels[fmt.LABELS.index("PERCEPTION_LABEL_CAR")] < 0.35
    assert 0.005 < labels[fmt.LABELS.index("PERCEPTION_LABEL_PEDESTRIAN")] < 0.05


def test_tracks_persist_and_move_smoothly(small_ds):
    d = read_all(small_ds)
    frames, agents = d["frames"], d["agents"]
    s, e = d["scenes"]["frame_index_interval"][0]
    a0, a1 = frames["agent_index_interval"][s, 0], frames["agent_index_interval"][e - 1, 1]
    frame_of = np.repeat(np.arange(s, e), np.diff(frames["agent_index_interval"][s:e], axis=1).ravel())
    ag = agents[a0:a1]
    assert len(np.unique(ag["track_id"])) < len(ag) / 20  # tracks last many frames
    order = np.lexsort((frame_of, ag["track_id"]))
    same = (np.diff(ag["track_id"][order].astype(np.int64)) == 0) & (np.diff(frame_of[order]) == 1)
    steps = np.linalg.norm(np.diff(ag["centroid"][order], axis=0), axis=1)[same]
    assert np.percentile(steps, 99) < 3.5  # < 35 m/s between 10 Hz frames


def test_traffic_lights_change_and_compression_is_realistic(default_ds):
    d = read_all(default_ds)
    tl = d["traffic_light_faces"]
    status = tl["traffic_light_face_status"].argmax(1)
    for face in np.unique(tl["face_id"])[:50]:
        if len(np.unique(status[tl["face_id"] == face])) > 1:
            break
    else:
        raise AssertionError("no face ever changed status")
    per_frame = len(tl) / len(d["frames"])
    assert 5 < per_frame < 25
    import os

    stored = sum(
        os.path.getsize(os.path.join(default_ds, "agents", f))
        for f in os.listdir(os.path.join(default_ds, "agents"))
        if not f.startswith(".")
    )
    ratio = len(d["agents"]) * fmt.AGENT_DTYPE.itemsize / stored
    assert 3 <= ratio <= 5.5


def test_cli_synth(tmp_path):
    out = tmp_path / "cli.zarr"
    r = subprocess.run(
        [sys.executable, "-m", "l5dask.cli", "synth", "-o", str(out), "--num-scenes", "2", "--seed", "4"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert len(read_all(str(out))["scenes"]) == 2
    r = subprocess.run(
        [sys.executable, "-m", "l5dask.cli", "synth", "-o", str(out), "--num-scenes", "1"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "already exists" in r.stderr
    assert len(read_all(str(out))["scenes"]) == 2  # nothing lost


def test_the_generators_count_is_num_scenes_and_the_old_keyword_still_works(tmp_path):
    """``scenes=`` is a scene filter in ``subset`` and ``query``: the generators' count is
    ``num_scenes=`` (as the command line's -n/--num-scenes); ``scenes=`` still works until the next
    release with a FutureWarning naming ``num_scenes=``; both given are refused in one line."""
    import inspect

    from l5dask.perception.synth import generate

    for func, out in ((l5dask.synthesize, "{}.zarr"), (generate, "{}")):
        assert "num_scenes" in inspect.signature(func).parameters
        assert "scenes" not in inspect.signature(func).parameters
        kw = {} if func is l5dask.synthesize else {"lidar_points": 0, "images": False}
        new = func(str(tmp_path / out.format(f"{func.__name__}-new")), num_scenes=1, seed=3, **kw)
        with pytest.warns(FutureWarning, match=r"scenes= is deprecated .* pass num_scenes="):
            old = func(str(tmp_path / out.format(f"{func.__name__}-old")), scenes=1, seed=3, **kw)
        assert old == new and (new.get("scenes") or new.get("scene")) == 1
        with pytest.raises(UsageError) as e:
            func(str(tmp_path / out.format(f"{func.__name__}-both")), num_scenes=1, scenes=2, seed=3, **kw)
        assert str(e.value).endswith("give num_scenes= only (scenes= is its old name)") and "\n" not in str(e.value)
        assert not (tmp_path / out.format(f"{func.__name__}-both")).exists()
