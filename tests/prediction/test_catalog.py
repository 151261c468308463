"""The scene catalog: each column against a plain numpy computation of its definition, the turn
tag against L5Kit's own ``identify_turn``, on a dataset built to reach the edges (scenes shorter
than 50 frames, yaws across +-pi, a frame without agents, faces never active, timestamp gaps,
agents near the ego and under the confidence threshold), with scenes straddling chunks and tasks.

``identify_turn`` lives in L5Kit's ``scripts/categorize_scenes.py``, which the installed package
does not ship (and which imports ``l5kit.data``'s ``__init__``, torch's stack, and sets the
environment at import): :func:`identify_turn` below is its function, verbatim (L5Kit 1.5.0),
run on L5Kit's own ``ChunkedDataset`` with L5Kit's own ``rotation33_as_yaw`` (loaded from its
installed ``geometry/transform.py``, as conftest loads its other modules without torch).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

import l5dask
from l5dask.errors import UsageError
from l5dask.prediction import format as fmt
from l5dask.prediction.catalog import GROUPS, catalog, label_column, local_clock, write_catalog
from tests.conftest import l5kit_data, read_all, require

CHUNKS = {fmt.SCENES: 2, fmt.FRAMES: 40, fmt.AGENTS: 700, fmt.TL_FACES: 300}


def _yaw_rotation(yaw: np.ndarray) -> np.ndarray:
    c, s = np.cos(yaw), np.sin(yaw)
    r = np.zeros((len(yaw), 3, 3))
    r[:, 0, 0], r[:, 0, 1], r[:, 1, 0], r[:, 1, 1], r[:, 2, 2] = c, -s, s, c, 1
    return r


@pytest.fixture(scope="module")
def edge_ds(tmp_path_factory) -> str:
    tmp = tmp_path_factory.mktemp("catalog")
    src = str(tmp / "src.zarr")
    l5dask.synthesize(src, num_scenes=6, seed=11, label_ties=0.05)
    a = read_all(src)
    scenes, frames, agents, faces = (a[k].copy() for k in fmt.ARRAY_NAMES)
    rng = np.random.default_rng(5)
    # scenes shorter than 50 frames: scene 0 split into 1, 30, 49, 50 frames and the rest
    s0, e0 = scenes["frame_index_interval"][0]
    cuts = [s0, s0 + 1, s0 + 31, s0 + 80, s0 + 130, e0]
    head = np.repeat(scenes[:1], len(cuts) - 1)
    head["frame_index_interval"] = np.stack([cuts[:-1], cuts[1:]], 1)
    scenes = np.concatenate([head, scenes[1:]])
    iv = scenes["frame_index_interval"]
    # the ego only speeding up in scene 2, only slowing down in scene 3: no fall, no rise (0: the
    # largest fall was the smallest rise, negative)
    for k, (v0, acc) in ((2, (2.0, 1.0)), (3, (10.0, -1.0))):
        a, b = iv[k]
        t = (frames["timestamp"][a:b] - frames["timestamp"][a]) / 1e9
        frames["ego_translation"][a:b, 0] = frames["ego_translation"][a, 0] + v0 * t + 0.5 * acc * t**2
        frames["ego_translation"][a:b, 1] = frames["ego_translation"][a, 1]
    # yaws: scene 5 turns left across +pi (wraps), scene 6 turns right across -pi, scene 7 left by 1.2 rad
    for k, yaw0, rate in ((5, np.pi - 0.6, 0.03), (6, -np.pi + 0.6, -0.03), (7, 0.2, 0.025)):
        a0, b0 = iv[k]
        yaw = yaw0 + rate * np.arange(b0 - a0)
        frames["ego_rotation"][a0:b0] = _yaw_rotation((yaw + np.pi) % (2 * np.pi) - np.pi)
    # scene 4 drives straight along +-pi (L5Kit's tag: a right turn), scene 9 turns right by 1.2 rad
    a4, b4 = iv[4]
    frames["ego_rotation"][a4:b4] = _yaw_rotation(np.where(np.arange(b4 - a4) < 60, np.pi - 0.01, -np.pi + 0.01))
    a9, b9 = iv[9]
    frames["ego_rotation"][a9:b9] = _yaw_rotation(0.5 - 0.02 * np.arange(b9 - a9))
    # timestamp gaps in scene 8 (a longer step, a repeated timestamp), a 0 step
    a8 = iv[8][0]
    frames["timestamp"][a8 + 10 :] += 100_000_000  # a frame missing
    frames["timestamp"][a8 + 20] = frames["timestamp"][a8 + 19]
    # the ego stopped for a while in scene 7 (a stop of 2 s, one of 0.5 s)
    a7 = iv[7][0]
    frames["ego_translation"][a7 + 5 : a7 + 26] = frames["ego_translation"][a7 + 5]
    frames["ego_translation"][a7 + 40 : a7 + 46] = frames["ego_translation"][a7 + 40]
    # a frame without agents (and its neighbour too), the agent intervals rebuilt
    ai = frames["agent_index_interval"]
    keep = np.ones(len(agents), bool)
    for f in (iv[3][0] + 7, iv[3][0] + 8):
        keep[ai[f, 0] : ai[f, 1]] = False
    per = np.array([np.count_nonzero(keep[x:y]) for x, y in ai])
    agents = agents[keep]
    end = np.cumsum(per)
    frames["agent_index_interval"] = np.stack([end - per, end], 1)
    ai = frames["agent_index_interval"]
    frame_of = np.repeat(np.arange(len(frames)), per)
    ego = frames["ego_translation"][frame_of, :2]
    n = len(agents)
    # agents at the 10 and 30 m edges, pedestrians and cyclists near the ego
    i = rng.choice(n, n // 20, replace=False)
    ang = rng.random(len(i)) * 2 * np.pi
    r = rng.choice([1.5, 10.0, np.nextafter(10.0, 11), 30.0, np.nextafter(30.0, 31), 5.0], len(i))
    agents["centroid"][i] = ego[i] + r[:, None] * np.stack([np.cos(ang), np.sin(ang)], 1)
    lp = np.zeros((len(i), len(fmt.LABELS)), np.float32)
    lp[np.arange(len(i)), rng.choice([fmt.LABELS.index(x) for x in sum(GROUPS.values(), ())], len(i))] = 1
    agents["label_probabilities"][i] = lp
    # agents under the confidence threshold, and at it (0.5 is not under)
    j = rng.choice(n, n // 30, replace=False)
    lp = np.zeros((len(j), len(fmt.LABELS)), np.float32)
    lp[:, 3], lp[:, 14], lp[:, 1] = 0.3, 0.3, 0.4
    lp[::2, 3], lp[::2, 14], lp[::2, 1] = 0.25, 0.25, 0.5
    agents["label_probabilities"][j] = lp
    # faces never active in scene 4; none at all in scene 2
    tl = frames["traffic_light_faces_index_interval"]
    f0, f1 = tl[iv[4][0], 0], tl[iv[4][1] - 1, 1]
    faces["traffic_light_face_status"][f0:f1] = [0.1, 0.8, 0.1]
    keep = np.ones(len(faces), bool)
    keep[tl[iv[2][0], 0] : tl[iv[2][1] - 1, 1]] = False
    per = np.array([np.count_nonzero(keep[x:y]) for x, y in tl])
    faces = faces[keep]
    end = np.cumsum(per)
    frames["traffic_light_faces_index_interval"] = np.stack([end - per, end], 1)
    dest = str(tmp / "edge.zarr")
    l5dask.write_dataset(
        dest, {"scenes": scenes, "frames": frames, "agents": agents, "traffic_light_faces": faces}, chunk_rows=CHUNKS
    )
    return dest


# --- the reference: each column's definition, computed plainly per scene -------------------
def _yaw(rot: np.ndarray) -> float:
    m = np.asarray(rot, np.float64)
    cy = np.hypot(m[0, 0], m[1, 0])
    return float(np.arctan2(m[1, 0], m[0, 0])) if cy > np.finfo(float).eps * 4 else 0.0


def _tag(yaws: np.ndarray):
    if len(yaws) < 50:
        return None
    d = yaws[50:] - yaws[:-50]
    return "left" if (d >= 1.0).any() else "right" if (d <= -1.0).any() else "straight"


def reference(path: str) -> pd.DataFrame:
    a = read_all(path)
    scenes, frames, agents, faces = (a[k] for k in fmt.ARRAY_NAMES)
    groups = {g: [fmt.LABELS.index(x) for x in names] for g, names in GROUPS.items()}
    rows = []
    for s, (f0, f1) in enumerate(scenes["frame_index_interval"]):
        fr = frames[f0:f1]
        ts = fr["timestamp"].astype(np.int64)
        xy = fr["ego_translation"][:, :2].astype(np.float64)
        yaw = np.array([_yaw(r) for r in fr["ego_rotation"]])
        row = {"scene_index": s, "num_frames": f1 - f0}
        speeds, dts, yaw_rates = [], [], []
        path = 0.0
        for k in range(1, len(fr)):
            dt = (ts[k] - ts[k - 1]) / 1e9
            step = float(np.sqrt(((xy[k] - xy[k - 1]) ** 2).sum()))
            path += step
            dts.append(dt)
            speeds.append(step / dt if dt > 0 else np.nan)
            d = (yaw[k] - yaw[k - 1] + np.pi) % (2 * np.pi) - np.pi
            yaw_rates.append(abs(d) / dt if dt > 0 else np.nan)
        acc = [(speeds[k] - speeds[k - 1]) / ((dts[k] + dts[k - 1]) / 2) for k in range(1, len(speeds))]
        fin = lambda v: [x for x in v if not np.isnan(x)]  # noqa: E731
        duration = (ts[-1] - ts[0]) / 1e9 if len(ts) else 0.0
        stopped = [not np.isnan(v) and v < 0.5 for v in speeds]
        stops, run = 0, 0  # (a stop's length in ns, from the timestamps: exact)
        for st, dt in zip(stopped + [False], list(np.diff(ts)) + [0]):
            if st:
                run += int(dt)
            else:
                stops += run >= 1_000_000_000
                run = 0
        row.update(
            duration_s=duration,
            timestamp_gaps=int(sum(abs(int(t) - 100_000_000) > 50_000_000 for t in np.diff(ts))),
            path_length_m=path,
            mean_speed_mps=path / duration if duration > 0 else np.nan,
            max_speed_mps=max(fin(speeds), default=np.nan),
            max_accel_mps2=max(0.0, *fin(acc)) if fin(acc) else np.nan,
            max_decel_mps2=max(0.0, *(-x for x in fin(acc))) if fin(acc) else np.nan,
            max_abs_yaw_rate_rps=max(fin(yaw_rates), default=np.nan),
            time_stopped_s=sum(dt for st, dt in zip(stopped, dts) if st),
            stops=stops,
            max_agents_in_frame=int(max((y - x for x, y in fr["agent_index_interval"]), default=0)),
            turn=_tag(yaw),
            turn_unwrapped=_tag(np.unwrap(yaw)),
        )
        tracks = {name: set() for name in fmt.LABELS}
        near = {(g, r): set() for g in GROUPS for r in (10, 30)}
        closest = {"pedestrians": np.inf, "cyclists": np.inf}
        low = 0
        tl_ids, tl_frames = set(), {k: set() for k in range(3)}
        for f, frame in zip(range(f0, f1), fr):
            ego = frame["ego_translation"][:2].astype(np.float64)
            for ag in agents[slice(*frame["agent_index_interval"])]:
                label = int(np.argmax(ag["label_probabilities"]))
                tracks[fmt.LABELS[label]].add(int(ag["track_id"]))
                low += ag["label_probabilities"].max() < 0.5
                c = ag["centroid"].astype(np.float64)
                dist = float(np.sqrt((c[0] - ego[0]) ** 2 + (c[1] - ego[1]) ** 2))
                for g, members in groups.items():
                    if label in members:
                        for r in (10, 30):
                            if dist <= r:
                                near[g, r].add(int(ag["track_id"]))
                        if g in closest:
                            closest[g] = min(closest[g], dist)
            for face in faces[slice(*frame["traffic_light_faces_index_interval"])]:
                tl_ids.add(str(face["face_id"]))
                tl_frames[int(np.argmax(face["traffic_light_face_status"]))].add(f)
        row.update({label_column(name): len(v) for name, v in tracks.items()})
        row.update({f"{g}_within_{r}m": len(v) for (g, r), v in near.items()})
        row["closest_pedestrian_m"] = closest["pedestrians"] if closest["pedestrians"] < np.inf else np.nan
        row["closest_cyclist_m"] = closest["cyclists"] if closest["cyclists"] < np.inf else np.nan
        row["tl_faces_seen"] = len(tl_ids)
        for k, status in enumerate(fmt.TL_FACE_STATUSES):
            row[f"tl_{status.lower()}_share"] = len(tl_frames[k]) / (f1 - f0) if f1 > f0 else np.nan
        row["low_confidence_agents"] = low
        rows.append(row)
    return pd.DataFrame(rows)


def _compare(got: pd.DataFrame, want: pd.DataFrame) -> None:
    for name in want.columns:
        g, w = got[name].to_numpy(), want[name].to_numpy()
        if name.startswith("turn"):
            assert [None if pd.isna(x) else x for x in g] == [None if pd.isna(x) else x for x in w], name
        elif np.asarray(w).dtype.kind == "f" or np.asarray(g).dtype.kind == "f":
            np.testing.assert_allclose(g.astype(float), w.astype(float), rtol=1e-12, atol=1e-9, err_msg=name)
        else:
            np.testing.assert_array_equal(g, w.astype(g.dtype), err_msg=name)


@pytest.fixture(scope="module")
def want(edge_ds) -> pd.DataFrame:
    return reference(edge_ds)


@pytest.mark.parametrize("chunks_per_task", [1, 3, 1000])
def test_columns_match_their_definitions(edge_ds, want, chunks_per_task):
    got = catalog(edge_ds, chunks_per_task=chunks_per_task)
    assert len(got) == len(want) and list(got["scene_index"]) == list(range(len(want)))
    _compare(got, want)
    # the edges were reached
    assert (want["num_frames"] < 50).sum() >= 3 and want["turn"].isna().sum() >= 3
    assert want["timestamp_gaps"].max() >= 2 and want["stops"].max() >= 1
    assert (want["tl_active_share"] == 0).any() and (want["tl_faces_seen"] == 0).any()
    assert (want["turn"] != want["turn_unwrapped"]).any()  # the yaw wrapped somewhere
    assert (want["low_confidence_agents"] > 0).all() and want["pedestrians_within_10m"].max() > 0


def test_identity_columns(edge_ds):
    got = catalog(edge_ds, tz="Europe/London")
    scenes = read_all(edge_ds)["scenes"]
    start = pd.to_datetime(scenes["start_time"].astype(np.int64), unit="ns", utc=True)
    assert list(got["host"]) == [str(h) for h in scenes["host"]]
    assert (got["start_time"] == start).all()
    assert (got["end_time"] == pd.to_datetime(scenes["end_time"].astype(np.int64), unit="ns", utc=True)).all()
    london = start.tz_convert("Europe/London")
    assert list(got["local_hour"]) == list(london.hour) and list(got["local_weekday"]) == list(london.day_of_week)
    pa = catalog(edge_ds)["local_hour"]
    assert list(pa) == list(start.tz_convert("America/Los_Angeles").hour)


@settings(max_examples=60, deadline=None)
@given(
    tz=hs.sampled_from(["America/Los_Angeles", "Europe/London", "Australia/Lord_Howe", "Asia/Kathmandu", "UTC"]),
    centre=hs.integers(-(2**62), 2**62),
    offsets=hs.lists(hs.integers(-(10**15), 10**15), min_size=1, max_size=40),
)
def test_local_clock_is_pyarrows_hour_and_weekday(tz, centre, offsets):
    """The hour and weekday in a time zone, made with ``zoneinfo``, are pyarrow's (which made them
    before): instants anywhere in int64 nanoseconds (before 1970 too), and packed about the DST
    changes of a zone (Lord Howe's half hour, Kathmandu's 5:45) and the nanoseconds about an hour's
    start."""
    import pyarrow as pa
    import pyarrow.compute as pc

    zone_changes = np.array([1_711_846_800, 1_730_595_600, 1_712_412_000, 1_728_136_800]) * 10**9  # (2024)
    ns = np.clip(np.array([centre + o for o in offsets], dtype=object), -(2**63) + 10**12, 2**63 - 10**12)
    ns = np.concatenate(
        [ns.astype(np.int64), zone_changes + np.array(offsets[:1] * 4) % 7_200_000_000_000 - 3_600_000_000_000]
    )
    ns = np.concatenate([ns, zone_changes - 1, zone_changes, zone_changes + 1])
    local = pa.array(ns, pa.int64()).cast(pa.timestamp("ns", tz="UTC")).cast(pa.timestamp("ns", tz=tz))
    hour, weekday = local_clock(ns, tz)
    assert hour.tolist() == pc.hour(local).to_pylist() and weekday.tolist() == pc.day_of_week(local).to_pylist()


def _identify_turn():
    """L5Kit 1.5.0's ``identify_turn`` (scripts/categorize_scenes.py), verbatim, with L5Kit's own
    ``rotation33_as_yaw`` (its ``geometry/transform.py``, loaded alone)."""
    l5kit_data()
    for name in ("transforms3d", "pymap3d"):  # (what L5Kit's geometry/transform.py imports)
        require(importlib.util.find_spec(name) is not None, f"{name} (the test extra)")
    root = list(sys.modules["l5kit"].__path__)[0]
    spec = importlib.util.spec_from_file_location(
        "l5kit_geometry_transform", os.path.join(root, "geometry/transform.py")
    )
    transform = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(transform)
    rotation33_as_yaw = transform.rotation33_as_yaw
    from typing import Dict, Optional

    TURN_THRESH = 1.0
    TIME_DURATION_TURN = 50

    def identify_turn(zarr_dataset, max_frame_id: Optional[int] = None, max_num_scenes: Optional[int] = None) -> Dict[int, str]:  # fmt: skip  # noqa: E501
        num_scenes = max_num_scenes or len(zarr_dataset.scenes)
        scenes = zarr_dataset.scenes[:num_scenes]

        turn_dict: Dict[int, str] = {}
        # Loop Over Scenes
        for scene_id, scene_data in enumerate(scenes):
            frame_ids = scene_data["frame_index_interval"]
            start_frame, end_scene_frame = frame_ids[0], frame_ids[1]
            num_frames_in_scene = end_scene_frame - start_frame
            num_frames_to_categorize = max_frame_id or num_frames_in_scene
            end_frame = start_frame + num_frames_to_categorize
            if TIME_DURATION_TURN > num_frames_to_categorize:
                raise ValueError(
                    "Numbers of frames for categorization should be greater than \
                                 or equal to TIME_DURATION_TURN"
                )
            frames = zarr_dataset.frames[start_frame:end_frame]

            yaws = np.zeros(
                len(frames),
            )
            # iterate over frames
            for idx, frame in enumerate(frames):
                yaws[idx] = rotation33_as_yaw(frame["ego_rotation"])

            # Determine Turn
            turn_type = "straight"
            yaw_diff = yaws[TIME_DURATION_TURN:] - yaws[:-TIME_DURATION_TURN]
            if np.sum(yaw_diff >= TURN_THRESH):
                turn_type = "left"
            elif np.sum(yaw_diff <= -TURN_THRESH):
                turn_type = "right"

            # Update dict
            turn_dict[scene_id] = turn_type
        return turn_dict

    return identify_turn


class _Scenes:
    """L5Kit's dataset with only some of its scenes (``identify_turn`` walks ``.scenes``)."""

    def __init__(self, z, keep) -> None:
        self.scenes, self.frames = z.scenes[:][keep], z.frames


def test_turn_tag_is_l5kits(edge_ds):
    identify_turn = _identify_turn()
    from l5kit.data.zarr_dataset import ChunkedDataset

    z = ChunkedDataset(edge_ds)
    z.open()
    got = catalog(edge_ds, chunks_per_task=2)
    long = np.flatnonzero(got["num_frames"].to_numpy() >= 50)
    tags = identify_turn(_Scenes(z, long))
    assert [got["turn"][i] for i in long] == [tags[k] for k in range(len(long))]
    assert set(tags.values()) == {"left", "right", "straight"}
    assert (got["turn"] != got["turn_unwrapped"]).sum() >= 2  # where the yaw wraps, L5Kit's tag is kept
    for i in np.flatnonzero(got["num_frames"].to_numpy() < 50):  # L5Kit refuses these: the tag is null
        with pytest.raises(ValueError, match="TIME_DURATION_TURN"):
            identify_turn(_Scenes(z, [i]))
        assert pd.isna(got["turn"][i])


def test_bad_time_zone_is_one_line(edge_ds, tmp_path):
    with pytest.raises(UsageError, match="unknown time zone 'Mars/Olympus'"):
        catalog(edge_ds, tz="Mars/Olympus")
    out = tmp_path / "c.parquet"
    r = subprocess.run(
        [sys.executable, "-m", "l5dask.cli", "catalog", edge_ds, "-o", str(out), "--tz", "Mars/Olympus", "-q"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "unknown time zone" in r.stderr
    assert not out.exists()
    # a trial's findings: a name in the wrong case is pointed to its spelling; a zone that is no
    # name is one line too (it was a TypeError from os.path)
    with pytest.raises(UsageError, match="unknown time zone 'utc'; did you mean 'UTC'"):
        catalog(edge_ds, tz="utc")
    with pytest.raises(UsageError, match="unknown time zone 'europe/london'; did you mean 'Europe/London'"):
        catalog(edge_ds, tz="europe/london")
    with pytest.raises(UsageError, match="a time zone is a name of the IANA database .*, not 5"):
        catalog(edge_ds, tz=5)


def test_command_writes_parquet_with_fingerprint(edge_ds, want, tmp_path):
    out = tmp_path / "c.parquet"
    r = subprocess.run(
        [sys.executable, "-m", "l5dask.cli", "catalog", edge_ds, "-o", str(out), "-q"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    _compare(pd.read_parquet(out), want)
    meta = json.loads(pq.read_schema(out).metadata[b"l5dask.catalog"])
    a = read_all(edge_ds)
    assert meta["dataset"].endswith("edge.zarr")
    for name in fmt.ARRAY_NAMES:
        assert meta["arrays"][name]["length"] == len(a[name])
        assert meta["arrays"][name]["chunk_rows"] == CHUNKS[name]
    again = subprocess.run(
        [sys.executable, "-m", "l5dask.cli", "catalog", edge_ds, "-o", str(out), "-q"],
        capture_output=True,
        text=True,
    )
    assert again.returncode == 2 and "exists" in again.stderr and again.stderr.count("\n") == 1
    write_catalog(catalog(edge_ds), str(tmp_path / "api.parquet"))
    assert (
        pq.read_schema(tmp_path / "api.parquet").metadata[b"l5dask.catalog"]
        == pq.read_schema(out).metadata[b"l5dask.catalog"]
    )


def test_on_a_cluster_and_from_s3(dask_cluster, s3, s3_small, small_ds, edge_ds, want, tmp_path):
    """Worker processes of a real scheduler (partials pickled, combined on the workers), and the
    dataset read from S3 (moto) and written back there: the same catalog."""
    from distributed import Client

    with Client(dask_cluster.address, set_as_default=False) as client:
        _compare(catalog(edge_ds, scheduler=client, chunks_per_task=2), want)
    local = catalog(small_ds)
    remote = catalog(s3_small, storage_options=s3.storage_options())
    pd.testing.assert_frame_equal(remote, local)
    url = s3_small.rstrip("/").rsplit("/", 1)[0] + "/catalog.parquet"
    write_catalog(remote, url, s3.storage_options())
    with s3.s3fs().open(url) as f:
        pd.testing.assert_frame_equal(pd.read_parquet(f), local)
