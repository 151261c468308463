"""The perception report's quantities computed through the Lyft SDK (``LyftDataset``): its records,
its reverse indexes (``sample["data"]``, ``sample["anns"]``, ``category_name``), its point clouds and
``points_in_box``, with plain Python loops over them, as a user of the SDK would write them."""

from __future__ import annotations

import math
import os

import numpy as np

EDGES = [5.0 * k for k in range(41)]


def lyft(root: str):
    from lyft_dataset_sdk.lyftdataset import LyftDataset

    return LyftDataset(root, os.path.join(root, "data"), verbose=False)


def _hist(values, edges):
    counts = [0] * len(edges)
    for v in values:
        if v < edges[0]:
            continue
        k = len(edges) - 1
        for i in range(len(edges) - 1):
            if v < edges[i + 1]:
                k = i
                break
        counts[k] += 1
    return counts


def _stats(values):
    return (
        {"min": min(values), "max": max(values), "mean": sum(values) / len(values)}
        if values
        else {"min": 0, "max": 0, "mean": 0.0}
    )


def reference_report(l, root: str) -> dict:
    tables = [
        "attribute",
        "calibrated_sensor",
        "category",
        "ego_pose",
        "instance",
        "log",
        "map",
        "sample",
        "sample_annotation",
        "sample_data",
        "scene",
        "sensor",
        "visibility",
    ]
    r = {"counts": {t: len(getattr(l, t)) for t in tables}}
    per_cat = {c["name"]: 0 for c in l.category}
    for ann in l.sample_annotation:
        per_cat[ann["category_name"]] += 1
    inst_cat = {c["name"]: 0 for c in l.category}
    for inst in l.instance:
        inst_cat[l.get("category", inst["category_token"])["name"]] += 1
    per_att = {a["name"]: 0 for a in l.attribute}
    for ann in l.sample_annotation:
        for tok in set(ann["attribute_tokens"]):
            per_att[l.get("attribute", tok)["name"]] += 1
    sizes = {c["name"]: [] for c in l.category}
    for ann in l.sample_annotation:
        sizes[ann["category_name"]].append(ann["size"])
    size_mean = {k: (np.mean(np.array(v, float), axis=0).tolist() if v else [0.0, 0.0, 0.0]) for k, v in sizes.items()}
    per_sample = [len(s["anns"]) for s in l.sample]

    def ego(sample):
        tok = sample["data"].get("LIDAR_TOP")
        return None if tok is None else l.get("ego_pose", l.get("sample_data", tok)["ego_pose_token"])["translation"]

    dists = []
    for ann in l.sample_annotation:
        e = ego(l.get("sample", ann["sample_token"]))
        if e is not None:
            dists.append(math.hypot(ann["translation"][0] - e[0], ann["translation"][1] - e[1]))
    length = {}
    for ann in l.sample_annotation:
        length[ann["instance_token"]] = length.get(ann["instance_token"], 0) + 1
    inst_len = [length.get(i["token"], 0) for i in l.instance]
    num_samples, num_anns, total = [], [], 0.0
    for scene in l.scene:
        tok, n, a, prev = scene["first_sample_token"], 0, 0, None
        while tok:
            s = l.get("sample", tok)
            n += 1
            a += len(s["anns"])
            e = ego(s)
            if e is not None and prev is not None:
                total += math.hypot(e[0] - prev[0], e[1] - prev[1])
            prev = e
            tok = s["next"]
        num_samples.append(n)
        num_anns.append(a)
    per_channel = {s["channel"]: 0 for s in l.sensor}
    for sd in l.sample_data:
        per_channel[sd["channel"]] += 1
    r["annotations"] = {
        "per_category": per_cat,
        "per_attribute": per_att,
        "size_m": {"mean": size_mean},
        "per_sample": _stats(per_sample),
        "distance_to_ego_m": {"histogram": {"edges": EDGES, "counts": _hist(dists, EDGES)}},
    }
    r["instances"] = {"per_category": inst_cat, "length": _stats(inst_len)}
    r["scenes"] = {"num_samples": num_samples, "num_annotations": num_anns}
    r["sample_data"] = {"per_channel": per_channel, "key_frames": sum(bool(sd["is_key_frame"]) for sd in l.sample_data)}
    r["ego"] = {"total_distance_km": total / 1000}
    points, missing = [], set()
    for sd in l.sample_data:
        if sd["sensor_modality"] != "lidar":
            continue
        path = l.get_sample_data_path(sd["token"])
        if not path.exists():
            missing.add(sd["filename"])
            continue
        points.append(os.path.getsize(path) // 20)
    r["lidar"] = {
        "sweeps": len(points),
        "points": sum(points),
        "points_per_sweep": _stats(points),
        "missing_files": sorted(missing),
    }
    return r


def reference_points_in_boxes(l, tokens=None) -> dict:
    """Per annotation token: lidar points in its box, from its sample's key-frame sweeps (every lidar
    channel of ``sample["data"]``) moved to the world frame, with the SDK's ``points_in_box``."""
    from lyft_dataset_sdk.utils.data_classes import LidarPointCloud
    from lyft_dataset_sdk.utils.geometry_utils import points_in_box
    from pyquaternion import Quaternion

    clouds = {}

    def world(sd_token):
        if sd_token not in clouds:
            sd = l.get("sample_data", sd_token)
            path = l.get_sample_data_path(sd_token)
            if not path.exists():
                clouds[sd_token] = None
                return None
            pc = LidarPointCloud.from_file(path)
            cs = l.get("calibrated_sensor", sd["calibrated_sensor_token"])
            pose = l.get("ego_pose", sd["ego_pose_token"])
            pc.rotate(Quaternion(cs["rotation"]).rotation_matrix)
            pc.translate(np.array(cs["translation"]))
            pc.rotate(Quaternion(pose["rotation"]).rotation_matrix)
            pc.translate(np.array(pose["translation"]))
            clouds[sd_token] = pc.points[:3, :]
        return clouds[sd_token]

    out = {}
    for ann in l.sample_annotation:
        if tokens is not None and ann["token"] not in tokens:
            continue
        sample = l.get("sample", ann["sample_token"])
        box = l.get_box(ann["token"])
        n = 0
        for _channel, sd_token in sample["data"].items():
            if l.get("sample_data", sd_token)["sensor_modality"] != "lidar":
                continue
            pts = world(sd_token)
            if pts is not None:
                n += int(points_in_box(box, pts).sum())
        out[ann["token"]] = n
    return out


#: The one line of lyft/nuscenes-devkit PR #64 (commit 80fc3ed, 2019-11-03) that changes the
#: arithmetic of ``lyft_dataset_sdk/eval/detection/mAP_evaluation.py`` after the SDK's last PyPI
#: release (0.0.8): a box's ground polygon takes ``R[1, 0]`` as the sine of its yaw, not ``R[0, 1]``.
PR64 = ("        sin_angle = rotation_matrix[0, 1]\n", "        sin_angle = rotation_matrix[1, 0]\n")
_MAPS: dict = {}


def sdk_map(geometry: str = "corrected"):
    """The SDK's ``mAP_evaluation`` module: as installed (0.0.8) for ``"sdk-0.0.8"``; for
    ``"corrected"``, the installed source with PR #64's line applied (the repository's source)."""
    import types

    from lyft_dataset_sdk.eval.detection import mAP_evaluation

    if geometry == "sdk-0.0.8":
        return mAP_evaluation
    if geometry not in _MAPS:
        source = open(mAP_evaluation.__file__).read()
        assert source.count(PR64[0]) == 1, "the installed SDK is not 0.0.8"
        mod = types.ModuleType("mAP_evaluation_pr64")
        exec(compile(source.replace(PR64[0], PR64[1]), "mAP_evaluation_pr64.py", "exec"), mod.__dict__)
        _MAPS[geometry] = mod
    return _MAPS[geometry]
