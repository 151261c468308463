"""A realistic generator of Lyft perception datasets, in exactly the published schema.

The shape follows the real train split (``docs/perception.md``): a log per scene, 126
samples a scene at 5 Hz chained by ``prev``/``next``, about 100 instances a scene that move
smoothly over runs of samples (about 28 annotations a sample), the 9 categories in the real
mix, 3 lidars and 7 cameras with their calibrations, a sample_data and an ego pose per sensor
and sample (and, every ``nonkey_every`` samples, a non-key LIDAR_TOP sweep between two
samples), lidar sweeps whose points fall partly inside the boxes, tiny JPEG images and a map
PNG. Tokens are 64-digit hex; rows of every table are shuffled (time order is in the chains).
The Lyft SDK's ``LyftDataset`` loads it.
"""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np

from l5dask.core.outputs import json_text
from l5dask.core.policy import renamed_keyword
from l5dask.core.store import Store, some_names
from l5dask.errors import OutputError

#: Real train split: annotations per category (the generator draws instances in this mix).
CATEGORY_MIX = {
    "car": 534_911,
    "pedestrian": 24_935,
    "animal": 186,
    "other_vehicle": 33_376,
    "bus": 8_729,
    "motorcycle": 818,
    "truck": 14_164,
    "emergency_vehicle": 132,
    "bicycle": 20_928,
}
#: Per category: (mean speed m/s, width, length, height).
_SHAPES = {
    "car": (6.0, 1.9, 4.7, 1.7),
    "pedestrian": (1.3, 0.7, 0.8, 1.75),
    "animal": (1.0, 0.4, 0.9, 0.6),
    "other_vehicle": (4.0, 2.4, 7.0, 2.6),
    "bus": (6.0, 2.9, 12.5, 3.3),
    "motorcycle": (7.0, 0.9, 2.2, 1.5),
    "truck": (6.0, 2.7, 9.0, 3.4),
    "emergency_vehicle": (7.0, 2.2, 6.0, 2.5),
    "bicycle": (4.0, 0.7, 1.8, 1.7),
}
ATTRIBUTES = (
    "object_action_driving_straight_forward",
    "object_action_stopped",
    "object_action_parked",
    "object_action_lane_change_left",
    "object_action_lane_change_right",
    "object_action_left_turn",
    "object_action_right_turn",
    "object_action_gliding_on_wheels",
    "object_action_walking",
    "object_action_running",
    "object_action_standing",
    "object_action_sitting",
    "object_action_reversing",
    "object_action_u_turn",
    "object_action_abnormal_or_traffic_violation",
    "object_action_loss_of_control",
    "object_action_other_motion",
    "is_stationary",
)
VISIBILITY = (
    ("3", "v60-80", "visibility of whole object is between 60 and 80%"),
    ("1", "v0-40", "visibility of whole object is between 0 and 40%"),
    ("2", "v40-60", "visibility of whole object is between 40 and 60%"),
    ("4", "v80-100", "visibility of whole object is between 80 and 100%"),
)
#: (channel, modality, file-name sensor, mount translation in the car, yaw of the mount in degrees)
SENSORS = (
    ("CAM_FRONT", "camera", "cam0", (1.6, 0.0, 1.6), 0),
    ("CAM_FRONT_RIGHT", "camera", "cam1", (1.5, -0.5, 1.6), -55),
    ("CAM_BACK_RIGHT", "camera", "cam2", (0.0, -0.8, 1.6), -110),
    ("CAM_BACK", "camera", "cam3", (-1.0, 0.0, 1.6), 180),
    ("CAM_BACK_LEFT", "camera", "cam4", (0.0, 0.8, 1.6), 110),
    ("CAM_FRONT_LEFT", "camera", "cam5", (1.5, 0.5, 1.6), 55),
    ("CAM_FRONT_ZOOMED", "camera", "cam6", (1.6, 0.0, 1.7), 0),
    ("LIDAR_TOP", "lidar", "lidar0", (1.0, 0.0, 1.85), 0),
    ("LIDAR_FRONT_RIGHT", "lidar", "lidar1", (2.1, -0.7, 0.8), -45),
    ("LIDAR_FRONT_LEFT", "lidar", "lidar2", (2.1, 0.7, 0.8), 45),
)
VEHICLES = ("a101", "a102", "a004", "a006", "a007", "a008", "a009", "a011", "a012", "a015")
SAMPLE_US = 200_000  # 5 Hz
BASE_US = 1_557_858_039_302_414.8


def _tokens(rng: np.random.Generator, n: int) -> list[str]:
    raw = rng.bytes(32 * n).hex()
    return [raw[64 * i : 64 * (i + 1)] for i in range(n)]


def _quat_z(yaw: np.ndarray) -> np.ndarray:
    """Quaternions (w, x, y, z) of rotations by ``yaw`` about z."""
    return np.stack([np.cos(yaw / 2), np.zeros_like(yaw), np.zeros_like(yaw), np.sin(yaw / 2)], axis=-1)


def _rot_z(yaw: float) -> np.ndarray:
    c, s = np.cos(yaw), np.sin(yaw)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def _jpeg() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), 90, np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def _png(size: int = 64) -> bytes:
    from PIL import Image

    yy, xx = np.mgrid[:size, :size]
    img = (((xx // 8) + (yy // 8)) % 2 * 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    return buf.getvalue()


def _dump(rows: list[dict], path: str, rng: np.random.Generator) -> None:
    order = rng.permutation(len(rows))
    with open(path, "w") as f:
        f.write(json_text([rows[i] for i in order], indent=2))


#: The folders of a perception dataset and the one kind of file each holds.
_FOLDER_FILES = {"data": ".json", "lidar": ".bin", "images": ".jpeg", "maps": ".png"}


def dataset_key(key: str) -> bool:
    """Whether ``key`` (a file's path in a perception dataset's folder, ``/`` between names) is
    one the dataset holds: ``data/*.json``, ``lidar/*.bin``, ``images/*.jpeg``, ``maps/*.png``."""
    parts = key.split("/")
    return len(parts) == 2 and not parts[1].startswith(".") and parts[1].endswith(_FOLDER_FILES.get(parts[0], "/"))


def check_output(out: str, overwrite: bool) -> None:
    """Refuse (one line) an output folder that is a file, holds anything a perception dataset does
    not (at any depth: replacing the folder would delete it), or holds a dataset unless ``overwrite``."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise OutputError(f"{out}: is a file, not a folder")
    files = Store(os.fspath(out)).files()
    other = [k for k in files if not dataset_key(k)]
    if other:
        raise OutputError(
            f"{out}: the folder holds {some_names(other)}, which is not a perception dataset's; write to a new "
            "or empty folder (only a dataset is replaced)"
        )
    if files and not overwrite:
        raise OutputError(f"{out}: a dataset already exists there (pass --overwrite)")


@renamed_keyword("scenes", "num_scenes")
def generate(
    out: str | os.PathLike,
    num_scenes: int = 2,
    seed: int = 0,
    samples_per_scene: int = 126,
    instances_per_scene: int = 100,
    lidar_points: int = 2000,
    images: bool = True,
    nonkey_every: int = 25,
) -> dict[str, int]:
    """Write a perception dataset into the folder ``out`` (created); return the rows of each table.

    ``num_scenes``: scenes to generate (``scenes=`` is its old name, until the next release, with a
    ``FutureWarning``); ``lidar_points``: points of each sweep (0 writes no lidar files); ``images``: write the
    camera files (8x8 JPEGs); ``nonkey_every``: a non-key LIDAR_TOP sweep every so many samples.
    """
    out = os.fspath(out)
    rng = np.random.default_rng(seed)
    for sub in ("data", "lidar", "images", "maps"):
        os.makedirs(os.path.join(out, sub), exist_ok=True)
    t: dict[str, list[dict[str, Any]]] = {
        name: []
        for name in (
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
        )
    }

    cat_names = list(CATEGORY_MIX)
    cat_tokens = _tokens(rng, len(cat_names))
    t["category"] = [{"description": "", "token": tok, "name": n} for tok, n in zip(cat_tokens, cat_names)]
    weights = np.array([CATEGORY_MIX[n] for n in cat_names], float)
    weights /= weights.sum()
    att_tokens = _tokens(rng, len(ATTRIBUTES))
    t["attribute"] = [{"description": "", "token": tok, "name": n} for tok, n in zip(att_tokens, ATTRIBUTES)]
    t["visibility"] = [{"level": lv, "description": d, "token": tok} for tok, lv, d in VISIBILITY]
    sensor_tokens = _tokens(rng, len(SENSORS))
    t["sensor"] = [{"modality": m, "channel": c, "token": tok} for tok, (c, m, *_) in zip(sensor_tokens, SENSORS)]
    map_token = rng.bytes(16).hex()
    jpeg = _jpeg() if images else b""
    with open(os.path.join(out, "maps", "map_raster_palo_alto.png"), "wb") as f:
        f.write(_png())
    log_tokens = _tokens(rng, num_scenes)

    for s in range(num_scenes):
        srng = np.random.default_rng([seed, s])
        vehicle = VEHICLES[s % len(VEHICLES)]
        host = f"host-{vehicle}"
        log_token = log_tokens[s]
        t0_us = BASE_US + s * 3_600_000_000.0 + float(srng.integers(0, 10**6))
        t["log"].append(
            {
                "date_captured": "2019-05-14",
                "location": "Palo Alto",
                "token": log_token,
                "vehicle": vehicle,
                "logfile": "",
                "map_token": map_token,
            }
        )
        # calibrations of this log's car
        cal_tokens = _tokens(srng, len(SENSORS))
        cal_r, cal_t = [], []
        for k, (_channel, modality, _, mount, yaw_deg) in enumerate(SENSORS):
            jitter = srng.normal(0, 0.01, 3)
            trans = np.array(mount) + jitter
            q = _quat_z(np.radians(yaw_deg + srng.normal(0, 0.3)))
            rec = {
                "sensor_token": sensor_tokens[k],
                "rotation": q.tolist(),
                "translation": trans.tolist(),
                "token": cal_tokens[k],
            }
            rec["camera_intrinsic"] = (
                [[1112.8, 0, 958.5], [0, 1112.8, 539.5], [0, 0, 1]] if modality == "camera" else []
            )
            t["calibrated_sensor"].append(rec)
            cal_r.append(_quat_rot(q))
            cal_t.append(trans)

        # the ego: a smooth drive
        n = samples_per_scene
        sample_us = t0_us + np.arange(n) * SAMPLE_US + srng.normal(0, 300, n)
        sample_us[0] = t0_us
        speed = np.clip(srng.normal(8, 3), 0, 15)
        yaw_rate = srng.normal(0, 0.05)
        tt = (sample_us - sample_us[0]) / 1e6
        ego_yaw0 = srng.uniform(-np.pi, np.pi)
        origin = srng.uniform(-2000, 2000, 2)

        def ego_at(times_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            yaw = ego_yaw0 + yaw_rate * times_s
            if abs(yaw_rate) < 1e-6:
                x = origin[0] + speed * times_s * np.cos(ego_yaw0)
                y = origin[1] + speed * times_s * np.sin(ego_yaw0)
            else:
                x = origin[0] + speed / yaw_rate * (np.sin(yaw) - np.sin(ego_yaw0))
                y = origin[1] - speed / yaw_rate * (np.cos(yaw) - np.cos(ego_yaw0))
            return np.stack([x, y, np.full_like(x, -24.5)], -1), yaw

        ego_xyz, _ = ego_at(tt)
        sample_tokens = _tokens(srng, n)
        scene_token = rng.bytes(32).hex()
        for i in range(n):
            t["sample"].append(
                {
                    "next": sample_tokens[i + 1] if i + 1 < n else "",
                    "prev": sample_tokens[i - 1] if i else "",
                    "token": sample_tokens[i],
                    "timestamp": float(sample_us[i]),
                    "scene_token": scene_token,
                }
            )
        t["scene"].append(
            {
                "log_token": log_token,
                "first_sample_token": sample_tokens[0],
                "name": f"{host}-lidar0-{int(t0_us * 1000)}-{int(sample_us[-1] * 1000)}",
                "description": "",
                "last_sample_token": sample_tokens[-1],
                "nbr_samples": n,
                "token": scene_token,
            }
        )

        # instances: runs of samples, smooth motion near the ego's path
        k = instances_per_scene
        cats = srng.choice(len(cat_names), size=k, p=weights)
        length = np.clip(srng.geometric(1 / 40, k), 1, n)
        start = srng.integers(0, n - length + 1)
        inst_tokens = _tokens(srng, k)
        along = srng.uniform(0, max(tt[-1], 1) * max(speed, 1), k)
        base_xy, _ = ego_at(np.minimum(along / max(speed, 1e-3), tt[-1]))
        offset = srng.normal(0, 15, (k, 2))
        heading = srng.uniform(-np.pi, np.pi, k)
        boxes_by_sample: list[list[tuple[np.ndarray, np.ndarray, float]]] = [[] for _ in range(n)]
        for j in range(k):
            name = cat_names[cats[j]]
            mean_speed, w, ln, h = _SHAPES[name]
            size = np.array([w, ln, h]) * srng.uniform(0.9, 1.1, 3)
            v = abs(srng.normal(mean_speed, mean_speed / 3)) * (srng.random() < 0.6)
            turn = srng.normal(0, 0.05)
            idx = np.arange(start[j], start[j] + length[j])
            ts = (sample_us[idx] - sample_us[start[j]]) / 1e6
            yaw = heading[j] + turn * ts
            xy = (
                base_xy[j, :2]
                + offset[j]
                + np.cumsum(np.stack([v * np.cos(yaw), v * np.sin(yaw)], -1) * np.diff(ts, prepend=ts[0])[:, None], 0)
            )
            z = -24.5 + h / 2 + srng.normal(0, 0.02, len(idx))
            q = _quat_z(yaw)
            ann_tokens = _tokens(srng, len(idx))
            for m, i in enumerate(idx):
                n_att = int(srng.integers(0, 3))
                translation = [float(xy[m, 0]), float(xy[m, 1]), float(z[m])]
                t["sample_annotation"].append(
                    {
                        "token": ann_tokens[m],
                        "num_lidar_pts": -1,
                        "size": size.tolist(),
                        "sample_token": sample_tokens[i],
                        "rotation": q[m].tolist(),
                        "prev": ann_tokens[m - 1] if m else "",
                        "translation": translation,
                        "num_radar_pts": 0,
                        "attribute_tokens": [att_tokens[a] for a in srng.choice(len(ATTRIBUTES), n_att, replace=False)],
                        "next": ann_tokens[m + 1] if m + 1 < len(idx) else "",
                        "instance_token": inst_tokens[j],
                        "visibility_token": "" if srng.random() < 0.7 else VISIBILITY[int(srng.integers(0, 4))][0],
                        "category_name": name,
                    }
                )
                boxes_by_sample[i].append((np.array(translation), size, float(yaw[m])))
            t["instance"].append(
                {
                    "last_annotation_token": ann_tokens[-1],
                    "category_token": cat_tokens[cats[j]],
                    "token": inst_tokens[j],
                    "first_annotation_token": ann_tokens[0],
                    "nbr_annotations": int(len(idx)),
                }
            )

        # sensors: a key-frame sample_data per sample and sensor, non-key LIDAR_TOP sweeps between
        for c, (channel, modality, short, _, _) in enumerate(SENSORS):
            frames = []  # (time us, sample index, key frame)
            for i in range(n):
                frames.append((sample_us[i] - 100_000 + 15_000 * c if modality == "camera" else sample_us[i], i, True))
                if channel == "LIDAR_TOP" and nonkey_every and i % nonkey_every == nonkey_every - 1 and i + 1 < n:
                    frames.append(((sample_us[i] + sample_us[i + 1]) / 2, i + 1, False))
            sd_tokens = _tokens(srng, len(frames))
            pose_tokens = _tokens(srng, len(frames))
            for m, (us, i, key) in enumerate(frames):
                us = float(round(us))
                pose_xyz, pose_yaw = ego_at(np.array([(us - sample_us[0]) / 1e6]))
                q = _quat_z(pose_yaw)[0]
                t["ego_pose"].append(
                    {
                        "rotation": q.tolist(),
                        "translation": pose_xyz[0].tolist(),
                        "token": pose_tokens[m],
                        "timestamp": us,
                    }
                )
                stamp = int(us * 1000) + m
                ext = "jpeg" if modality == "camera" else "bin"
                folder = "images" if modality == "camera" else "lidar"
                filename = f"{folder}/{host}_{short}_{stamp}.{ext}"
                rec = {
                    "width": 1920 if modality == "camera" else 0,
                    "height": 1080 if modality == "camera" else 0,
                    "calibrated_sensor_token": cal_tokens[c],
                    "token": sd_tokens[m],
                    "sample_token": sample_tokens[i],
                    "is_key_frame": key,
                    "prev": sd_tokens[m - 1] if m else "",
                    "fileformat": ext,
                    "ego_pose_token": pose_tokens[m],
                    "timestamp": us,
                    "next": sd_tokens[m + 1] if m + 1 < len(frames) else "",
                    "filename": filename,
                    "sensor_modality": modality,
                    "channel": channel,
                }
                t["sample_data"].append(rec)
                path = os.path.join(out, filename)
                if modality == "camera":
                    if images:
                        with open(path, "wb") as f:
                            f.write(jpeg)
                elif lidar_points:
                    pts = _sweep(srng, lidar_points, boxes_by_sample[i], pose_xyz[0], _quat_rot(q), cal_t[c], cal_r[c])
                    pts.tofile(path)
    t["map"] = [
        {
            "log_tokens": log_tokens,
            "token": map_token,
            "filename": "maps/map_raster_palo_alto.png",
            "category": "semantic_prior",
        }
    ]
    for name, rows in t.items():
        _dump(rows, os.path.join(out, "data", f"{name}.json"), rng)
    return {name: len(rows) for name, rows in t.items()}


def _quat_rot(q: np.ndarray) -> np.ndarray:
    """The rotation matrix of a unit quaternion (w, x, y, z)."""
    w, x, y, z = q
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
    )


def _sweep(rng: np.random.Generator, n: int, boxes, ego_t, ego_r, cal_t, cal_r) -> np.ndarray:
    """``n`` points (x, y, z, intensity, ring) in the sensor's frame: about half inside or around the
    boxes of the sample, the rest on the ground around the car."""
    world = np.empty((n, 3))
    n_box = n // 2 if boxes else 0
    if n_box:
        which = rng.integers(0, len(boxes), n_box)
        centers = np.array([b[0] for b in boxes])[which]
        sizes = np.array([b[1] for b in boxes])[which]
        yaws = np.array([b[2] for b in boxes])[which]
        local = rng.uniform(-0.6, 0.6, (n_box, 3)) * sizes[:, [1, 0, 2]]  # slightly beyond the box too
        c, s = np.cos(yaws), np.sin(yaws)
        world[:n_box, 0] = centers[:, 0] + c * local[:, 0] - s * local[:, 1]
        world[:n_box, 1] = centers[:, 1] + s * local[:, 0] + c * local[:, 1]
        world[:n_box, 2] = centers[:, 2] + local[:, 2]
    r = rng.uniform(2, 60, n - n_box)
    a = rng.uniform(-np.pi, np.pi, n - n_box)
    world[n_box:, 0] = ego_t[0] + r * np.cos(a)
    world[n_box:, 1] = ego_t[1] + r * np.sin(a)
    world[n_box:, 2] = ego_t[2] + rng.normal(0, 0.05, n - n_box)
    car = (world - ego_t) @ ego_r  # R^T (p - t)
    sensor = (car - cal_t) @ cal_r
    out = np.empty((n, 5), np.float32)
    out[:, :3] = sensor
    out[:, 3] = rng.uniform(0, 100, n)
    out[:, 4] = rng.integers(0, 32, n)
    return out
