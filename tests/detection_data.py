"""Generated 3D-detection data (the SDK's dicts): ground truth per sample with the real class mix and
noisy predictions (found once, twice, missed, wrong class, false positives near the boxes), plus the
edge cases the matching rules turn on, and the competition's CSV of the same boxes."""

from __future__ import annotations

import json
import math

import numpy as np

CLASSES = ["car", "pedestrian", "bicycle", "truck", "bus", "other_vehicle", "motorcycle", "emergency_vehicle", "animal"]
SIZES = {
    "car": (1.9, 4.7, 1.7),
    "pedestrian": (0.7, 0.8, 1.8),
    "bicycle": (0.6, 1.8, 1.4),
    "truck": (2.8, 10.0, 3.4),
    "bus": (2.9, 12.0, 3.4),
    "other_vehicle": (2.6, 8.0, 3.0),
    "motorcycle": (0.9, 2.3, 1.5),
    "emergency_vehicle": (2.4, 6.5, 2.5),
    "animal": (0.4, 0.8, 0.6),
}
MIX = np.array([60, 15, 5, 5, 2, 8, 2, 1, 2], float) / 100


def yaw_rotation(yaw: float) -> list[float]:
    """As the SDK's kaggle2nuscenes makes it: ``Quaternion(axis=[0, 0, 1], angle=yaw).elements``."""
    from pyquaternion import Quaternion

    return Quaternion(axis=[0, 0, 1], angle=yaw).elements.tolist()


def generate(samples: int, gt_per: int = 30, fp_per: int = 20, seed: int = 0, yaws: bool = False):
    """``(gt, pred)``: lists of the SDK's dicts (with ``yaws``, each box also keeps its ``_yaw``)."""
    rng = np.random.default_rng(seed)
    gt, pred = [], []
    for s in range(samples):
        tok = f"{int(rng.integers(2**62)):016x}{s:06x}"
        ox, oy = rng.uniform(-2000, 2000, 2)
        n = int(rng.poisson(gt_per))
        cls = rng.choice(len(CLASSES), n, p=MIX)
        xy = rng.uniform(-50, 50, (n, 2)) + (ox, oy)
        yaw = rng.uniform(-math.pi, math.pi, n)
        for i in range(n):
            c = CLASSES[cls[i]]
            size = (np.array(SIZES[c]) * rng.uniform(0.85, 1.15, 3)).tolist()
            z = float(rng.normal(-20, 0.5))
            box = {"sample_token": tok, "translation": [float(xy[i, 0]), float(xy[i, 1]), z], "size": size, "name": c}
            box["rotation"], box["_yaw"] = yaw_rotation(float(yaw[i])), float(yaw[i])
            gt.append(box)
            for _ in range(int(rng.choice([0, 1, 1, 1, 2]))):
                jit = rng.normal(0, [0.15, 0.15, 0.08])
                y = float(yaw[i] + rng.normal(0, 0.05))
                pred.append(
                    {
                        "sample_token": tok,
                        "translation": [float(xy[i, 0] + jit[0]), float(xy[i, 1] + jit[1]), z + float(jit[2])],
                        "size": (np.array(size) * rng.normal(1, 0.05, 3)).clip(0.1).tolist(),
                        "rotation": yaw_rotation(y),
                        "_yaw": y,
                        "name": c if rng.random() > 0.05 else CLASSES[int(rng.integers(len(CLASSES)))],
                        "score": round(float(rng.uniform(0.2, 1)), 3),  # rounded: ties in score
                    }
                )
        for _ in range(fp_per):
            c = CLASSES[int(rng.choice(len(CLASSES), p=MIX))]
            base = xy[int(rng.integers(n))] if n and rng.random() < 0.6 else rng.uniform(-50, 50, 2) + (ox, oy)
            pos = base + rng.normal(0, 1.5, 2)
            y = float(rng.uniform(-math.pi, math.pi))
            pred.append(
                {
                    "sample_token": tok,
                    "translation": [float(pos[0]), float(pos[1]), float(rng.normal(-20, 0.5))],
                    "size": (np.array(SIZES[c]) * rng.uniform(0.8, 1.2, 3)).tolist(),
                    "rotation": yaw_rotation(y),
                    "_yaw": y,
                    "name": c,
                    "score": round(float(rng.uniform(0, 0.7)), 3),
                }
            )
    if not yaws:
        for b in gt + pred:
            b.pop("_yaw")
    return gt, pred


def edge_cases() -> tuple[list, list]:
    """Boxes on which the rules turn: IoUs exactly at thresholds (axis-aligned boxes whose overlap is
    a third, a half... of their union), two identical ground-truth boxes (a tie for the largest IoU),
    equal scores (input order), a sample without ground truth, non-unit and tilted quaternions,
    integers where the SDK sees ints."""
    tok = "e" * 64
    other = "f" * 64
    ident = [1.0, 0.0, 0.0, 0.0]
    gt = [
        {
            "sample_token": tok,
            "translation": [100.0, 200.0, 1.0],
            "size": [2.0, 4.0, 2.0],
            "rotation": ident,
            "name": "car",
        },
        {
            "sample_token": tok,
            "translation": [100.0, 200.0, 1.0],
            "size": [2.0, 4.0, 2.0],
            "rotation": ident,
            "name": "car",
        },
        {"sample_token": tok, "translation": [130, 200, 1], "size": [2, 4, 2], "rotation": [1, 0, 0, 0], "name": "car"},
        {
            "sample_token": tok,
            "translation": [160.0, 200.0, 1.0],
            "size": [1.0, 1.0, 2.0],
            "rotation": ident,
            "name": "pedestrian",
        },
        {
            "sample_token": tok,
            "translation": [190.0, 200.0, 1.0],
            "size": [2.0, 4.0, 2.0],
            "rotation": [2.0, 0.0, 0.0, 0.0],
            "name": "truck",
        },
    ]
    # along x (the SDK's length axis for this rotation), a shift d gives IoU (4 - d) / (4 + d):
    # d = 4/3 -> 0.5, d = 4/7 -> 0.75, d = 4/19 -> 0.9, exactly in reals
    pred = [
        {
            "sample_token": tok,
            "translation": [100.0 + 4 / 3, 200.0, 1.0],
            "size": [2.0, 4.0, 2.0],
            "rotation": ident,
            "name": "car",
            "score": 0.9,
        },
        {
            "sample_token": tok,
            "translation": [100.0 + 4 / 7, 200.0, 1.0],
            "size": [2.0, 4.0, 2.0],
            "rotation": ident,
            "name": "car",
            "score": 0.9,
        },
        {
            "sample_token": tok,
            "translation": [100.0, 200.0, 1.0],
            "size": [2.0, 4.0, 2.0],
            "rotation": ident,
            "name": "car",
            "score": 0.8,
        },
        {
            "sample_token": tok,
            "translation": [130 + 4 / 19, 200, 1],
            "size": [2, 4, 2],
            "rotation": [1, 0, 0, 0],
            "name": "car",
            "score": 0.5,
        },
        {
            "sample_token": tok,
            "translation": [130.0, 200.0, 1.0],
            "size": [2.0, 4.0, 2.0],
            "rotation": [0.99, 0.1, 0.05, 0.0],
            "name": "car",
            "score": 0.4,
        },
        {
            "sample_token": tok,
            "translation": [160.0, 200.5, 1.0],
            "size": [1.0, 1.0, 2.0],
            "rotation": ident,
            "name": "pedestrian",
            "score": 0.7,
        },
        {
            "sample_token": tok,
            "translation": [190.0, 200.0, 1.0],
            "size": [2.0, 4.0, 2.0],
            "rotation": [0.5, 0.0, 0.0, 0.0],
            "name": "truck",
            "score": 0.6,
        },
        {
            "sample_token": other,
            "translation": [0.0, 0.0, 0.0],
            "size": [2.0, 4.0, 2.0],
            "rotation": ident,
            "name": "car",
            "score": 0.95,
        },
    ]
    return gt, pred


def write_json(boxes: list, path) -> None:
    with open(path, "w") as f:
        json.dump([{k: v for k, v in b.items() if not k.startswith("_")} for b in boxes], f)


def write_csv(boxes: list, path, pred: bool) -> list:
    """The competition's CSV of boxes that keep their ``_yaw``; returns the SDK's dicts of what the
    CSV says (kaggle2nuscenes: floats as parsed, the rotation from the yaw), in the CSV's order."""
    by_sample: dict[str, list] = {}
    for b in boxes:
        by_sample.setdefault(b["sample_token"], []).append(b)
    out = []
    with open(path, "w") as f:
        f.write("Id,PredictionString\n")
        for tok, bs in by_sample.items():
            parts = []
            for b in bs:
                nums = ([b["score"]] if pred else []) + [*b["translation"], *b["size"], b["_yaw"]]
                parts.append(" ".join(repr(float(x)) for x in nums) + " " + b["name"])
                d = {
                    "sample_token": tok,
                    "translation": [float(x) for x in b["translation"]],
                    "size": [float(x) for x in b["size"]],
                    "rotation": yaw_rotation(float(b["_yaw"])),
                    "name": b["name"],
                }
                if pred:
                    d["score"] = float(b["score"])
                out.append(d)
            f.write(f"{tok},{' '.join(parts)}\n")
    return out
