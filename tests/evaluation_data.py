"""Datasets and CSV pairs built to reach the evaluation's edge cases (shared by its tests)."""

from __future__ import annotations

import numpy as np

import l5dask
from l5dask.prediction import format as fmt

from .conftest import read_all

#: Small chunks: scenes, frames, agents and masks straddle chunk boundaries.
EDGE_CHUNKS = {fmt.SCENES: 2, fmt.FRAMES: 40, fmt.AGENTS: 700, fmt.TL_FACES: 500}


def edge_dataset(src: str, dest: str, seed: int = 0) -> str:
    """``src`` (a generated dataset) with the cases L5Kit's rules turn on: yaw and extent jumps,
    tiny extents, holes in tracks, a track twice in a frame, agents at the 50 m edge and label
    probabilities at the threshold."""
    a = read_all(src)
    rng = np.random.default_rng(seed)
    ag, fr = a["agents"].copy(), a["frames"]
    n = len(ag)
    iv = fr["agent_index_interval"]
    frame_of = np.repeat(np.arange(len(fr)), iv[:, 1] - iv[:, 0])
    ego = fr["ego_translation"][frame_of, :2]
    pick = lambda k: rng.choice(n, k, replace=False)  # noqa: E731
    i = pick(n // 40)
    ag["yaw"][i] += rng.choice([0.4, -0.6, 3.0, 6.2], len(i)).astype(np.float32)  # yaw jumps (some wrap)
    i = pick(n // 40)
    ag["extent"][i, :2] *= rng.choice([1.05, 1.2, 0.8], len(i))[:, None].astype(np.float32)
    i = pick(n // 200)
    ag["extent"][i, :2] = np.float32(0.05)  # areas under 0.01 m^2
    i = pick(n // 40)
    ag["track_id"][i] = ag["track_id"][i] + 100_000  # a new track: holes in the old one
    i = pick(n // 100)
    j = np.clip(i + 1, 0, n - 1)
    same = frame_of[i] == frame_of[j]
    ag["track_id"][j[same]] = ag["track_id"][i[same]]  # a track twice in a frame
    i = pick(n // 30)
    ang = rng.random(len(i)) * 2 * np.pi
    r = rng.choice([50.0, 49.99999, 50.00001, np.nextafter(50.0, 0)], len(i))
    ag["centroid"][i] = ego[i] + r[:, None] * np.stack([np.cos(ang), np.sin(ang)], 1)
    i = pick(n // 200)
    ag["centroid"][i] = ego[i] + np.array([30.0, 40.0])  # exactly 50 m
    i = pick(n // 50)
    lp = np.zeros((len(i), len(fmt.LABELS)), np.float32)
    lp[:, fmt.LABELS.index("PERCEPTION_LABEL_CAR")] = 0.25
    lp[:, fmt.LABELS.index("PERCEPTION_LABEL_PEDESTRIAN")] = 0.25
    lp[:, fmt.LABELS.index("PERCEPTION_LABEL_UNKNOWN")] = 0.5
    ag["label_probabilities"][i] = lp  # 0.25 + 0.25 == 0.5: not above 0.5
    arrays = dict(a)
    arrays["agents"] = ag
    l5dask.write_dataset(dest, arrays, chunk_rows=EDGE_CHUNKS, overwrite=True)
    return dest
