"""A generated perception dataset, edited to reach the report's edge cases."""

from __future__ import annotations

import json
import os
import shutil

from l5dask.perception.synth import generate


def load(root: str, table: str) -> list[dict]:
    with open(os.path.join(root, "data", f"{table}.json")) as f:
        return json.load(f)


def save(root: str, table: str, rows: list[dict]) -> None:
    with open(os.path.join(root, "data", f"{table}.json"), "w") as f:
        json.dump(rows, f, indent=1)


def edge_perception(root: str, scenes: int = 3, seed: int = 7, lidar_points: int = 400) -> dict:
    """Generate, then: a category no instance has and one outside the 9 (with an instance of it); a
    sample whose LIDAR_TOP sweep is not a key frame (no ego pose: no distances, a break in the ego
    path); a sample with two key-frame LIDAR_TOP sweeps (the last in file order counts); a missing
    lidar file and an empty one; an annotation listing an attribute twice. Returns what was edited."""
    generate(root, num_scenes=scenes, seed=seed, lidar_points=lidar_points, images=True)
    cat = load(root, "category")
    cat += [
        {"description": "", "token": "c" * 64, "name": "tricycle"},
        {"description": "", "token": "d" * 64, "name": "empty_category"},
    ]
    save(root, "category", cat)
    inst = load(root, "instance")
    inst[0]["category_token"] = "c" * 64
    save(root, "instance", inst)

    samples = load(root, "sample")
    sd = load(root, "sample_data")
    poses = load(root, "ego_pose")
    lidar_top = [r for r in sd if r["channel"] == "LIDAR_TOP" and r["is_key_frame"]]
    no_ego = lidar_top[5]
    no_ego["is_key_frame"] = False
    twice = lidar_top[9]
    pose = next(p for p in poses if p["token"] == twice["ego_pose_token"])
    new_pose = dict(
        pose,
        token="e" * 64,
        translation=[pose["translation"][0] + 3.0, pose["translation"][1] - 1.0, pose["translation"][2]],
    )
    poses.append(new_pose)
    extra = dict(
        twice,
        token="f" * 64,
        ego_pose_token="e" * 64,
        prev="",
        next="",
        filename=twice["filename"].replace(".bin", "_b.bin"),
    )
    shutil.copy(os.path.join(root, twice["filename"]), os.path.join(root, extra["filename"]))
    sd.append(extra)
    lidars = [
        r
        for r in sd
        if r["sensor_modality"] == "lidar" and r["token"] not in (no_ego["token"], extra["token"], twice["token"])
    ]
    missing, empty = lidars[20], lidars[31]
    os.remove(os.path.join(root, missing["filename"]))
    open(os.path.join(root, empty["filename"]), "wb").close()
    save(root, "sample_data", sd)
    save(root, "ego_pose", poses)

    anns = load(root, "sample_annotation")
    twice_att = next(a for a in anns if a["attribute_tokens"])
    twice_att["attribute_tokens"] = [twice_att["attribute_tokens"][0]] * 2
    save(root, "sample_annotation", anns)
    return {
        "no_ego_sample": no_ego["sample_token"],
        "two_key_frames": twice["sample_token"],
        "missing": missing["filename"],
        "empty": empty["filename"],
        "samples": len(samples),
    }
