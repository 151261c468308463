"""The perception dataset in L5Kit's format (``docs/perception.md``, "Into L5Kit's format"):
a scene per row of scene.json, a frame per sample in chain order, an agent per annotation; written
by l5dask's writer, so that L5Kit's ``ChunkedDataset`` and every l5dask command read it."""

from __future__ import annotations

import numpy as np

from l5dask.perception import joins
from l5dask.perception.lidar import quaternion_matrices
from l5dask.prediction import format as fmt
from l5dask.prediction.writing import write_dataset

#: Perception category -> L5Kit label; any other category is PERCEPTION_LABEL_UNKNOWN.
CATEGORY_LABELS = {
    "car": "PERCEPTION_LABEL_CAR",
    "truck": "PERCEPTION_LABEL_TRUCK",
    "bus": "PERCEPTION_LABEL_BUS",
    "emergency_vehicle": "PERCEPTION_LABEL_EMERGENCY_VEHICLE",
    "other_vehicle": "PERCEPTION_LABEL_OTHER_VEHICLE",
    "motorcycle": "PERCEPTION_LABEL_MOTORCYCLE",
    "bicycle": "PERCEPTION_LABEL_BICYCLE",
    "pedestrian": "PERCEPTION_LABEL_PEDESTRIAN",
    "animal": "PERCEPTION_LABEL_ANIMAL",
}


def label_of_categories(names: np.ndarray) -> np.ndarray:
    """L5Kit label index of each category name."""
    unknown = fmt.LABELS.index("PERCEPTION_LABEL_UNKNOWN")
    return np.array(
        [fmt.LABELS.index(CATEGORY_LABELS[n]) if n in CATEGORY_LABELS else unknown for n in names], np.int64
    )


def to_ns(us: np.ndarray) -> np.ndarray:
    """Microseconds (JSON floats) to L5Kit's integer nanoseconds: the whole microseconds times 1000
    in integers, exactly, plus their fraction's nanoseconds rounded (half to even, from its float64
    product: a fraction within a rounding of a half nanosecond may go either way). The product
    whole in float64, 1.6e18, is a multiple of 256: 1557861643224377 us made ...377088 ns."""
    us = np.asarray(us, np.float64)
    whole = np.floor(us)  # (us - whole is exact: whole is a float as close as us)
    return whole.astype(np.int64) * 1000 + np.round((us - whole) * 1000).astype(np.int64)


def arrays(ds) -> dict[str, np.ndarray]:
    """The scenes, frames, agents and (empty) traffic_light_faces arrays."""
    scene, smp, ann, log = ds.table("scene"), ds.table("sample"), ds.table("sample_annotation"), ds.table("log")
    n_scenes, n_samples = len(scene), len(smp)
    scene_of = smp.links["scene_token"]
    order = np.lexsort((smp.position, scene_of))  # frames: scene by scene, each in chain order
    frame_of_sample = np.empty(n_samples, np.int64)
    frame_of_sample[order] = np.arange(n_samples)
    per_scene = np.bincount(scene_of, minlength=n_scenes)
    starts = np.concatenate([[0], np.cumsum(per_scene)])

    scenes = np.zeros(n_scenes, fmt.SCENE_DTYPE)
    scenes["frame_index_interval"] = np.stack([starts[:-1], starts[1:]], 1)
    hosts = np.array(["host-" + v for v in log.strings("vehicle")], dtype=object)
    scenes["host"] = hosts[scene.links["log_token"]] if n_scenes else []
    stamp = to_ns(smp.numbers("timestamp"))
    scenes["start_time"] = stamp[scene.links["first_sample_token"]] if n_scenes else []
    scenes["end_time"] = stamp[scene.links["last_sample_token"]] if n_scenes else []

    # agents, frame by frame (each frame's annotations by track id)
    ann_frame = frame_of_sample[ann.links["sample_token"]] if len(ann) else np.zeros(0, np.int64)
    track = _track_ids(ds)
    agent_order = np.lexsort((track, ann_frame))
    agents = np.zeros(len(ann), fmt.AGENT_DTYPE)
    t = ann.vectors("translation")[agent_order]
    size = ann.vectors("size")[agent_order]
    agents["centroid"] = t[:, :2]
    agents["extent"] = size[:, [1, 0, 2]]
    agents["yaw"] = joins.yaw_of(ann.vectors("rotation")[agent_order])
    vel = joins.box_velocity(ds)[agent_order, :2]
    agents["velocity"] = np.where(np.isnan(vel), 0.0, vel)
    agents["track_id"] = track[agent_order]
    labels = label_of_categories(ds.table("category").strings("name"))[joins.category_of_annotations(ds)]
    agents["label_probabilities"][np.arange(len(ann)), labels[agent_order]] = 1.0

    frames = np.zeros(n_samples, fmt.FRAME_DTYPE)
    frames["timestamp"] = stamp[order]
    counts = np.bincount(ann_frame, minlength=n_samples)
    bounds = np.concatenate([[0], np.cumsum(counts)])
    frames["agent_index_interval"] = np.stack([bounds[:-1], bounds[1:]], 1)
    pose = _frame_poses(ds)[order]
    ep = ds.table("ego_pose")
    has = pose >= 0
    frames["ego_rotation"] = np.eye(3)
    if has.any():
        frames["ego_translation"][has] = ep.vectors("translation")[pose[has]]
        frames["ego_rotation"][has] = quaternion_matrices(ep.vectors("rotation")[pose[has]])
    return {"scenes": scenes, "frames": frames, "agents": agents, "traffic_light_faces": np.zeros(0, fmt.TL_FACE_DTYPE)}


def _frame_poses(ds) -> np.ndarray:
    """Per sample, the ego pose of its key-frame LIDAR_TOP sample_data; failing that, of any of its
    key-frame sample_data (the last in file order); -1 when it has none."""
    sd = ds.table("sample_data")
    pose = joins.ego_of_samples(ds)[0].copy()  # filled in below: not the shared join
    missing = pose < 0
    if missing.any() and len(sd):
        any_key = np.full(len(pose), -1, np.int64)
        rows = np.flatnonzero(sd.numbers("is_key_frame", bool))
        np.maximum.at(any_key, sd.links["sample_token"][rows], rows)
        fill = missing & (any_key >= 0)
        pose[fill] = sd.links["ego_pose_token"][any_key[fill]]
    return pose


def _track_ids(ds) -> np.ndarray:
    """Per annotation, its instance's number in its scene: 1, 2, ... by first appearance (then row)."""
    ann, smp = ds.table("sample_annotation"), ds.table("sample")
    if not len(ann):
        return np.zeros(0, np.uint64)
    inst = ann.links["instance_token"]
    scene = smp.links["scene_token"][ann.links["sample_token"]]
    first_pos = smp.position[ann.links["sample_token"]]
    # each (scene, instance) pair: the first sample position it appears at
    key = scene * (inst.max() + 1) + inst
    uniq, where = np.unique(key, return_inverse=True)
    start = np.full(len(uniq), np.iinfo(np.int64).max)
    np.minimum.at(start, where, first_pos)
    u_scene = uniq // (inst.max() + 1)
    rank_order = np.lexsort((uniq, start, u_scene))
    number = np.empty(len(uniq), np.int64)
    counts = np.bincount(u_scene, minlength=int(u_scene.max()) + 1)
    begins = np.concatenate([[0], np.cumsum(counts)])[u_scene[rank_order]]
    number[rank_order] = np.arange(len(uniq)) - begins + 1
    return number[where].astype(np.uint64)


def to_l5kit(ds, out: str, storage_options: dict | None = None, overwrite: bool = False) -> dict[str, int]:
    """Write ``ds`` as an L5Kit dataset at ``out``; return the rows written per array."""

    data = arrays(ds)
    write_dataset(out, data, storage_options=storage_options, overwrite=overwrite)
    return {k: len(v) for k, v in data.items()}
