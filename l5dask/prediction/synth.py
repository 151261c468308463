"""A realistic generator of L5Kit datasets, for tests, benchmarks and demos.

Its shape follows the real Lyft Level 5 data (L5Kit's format: ``l5dask/prediction/format.py``):
10 Hz frames, 248-249 frames per scene, about 71 agents per frame that persist as
tracks and move smoothly, the real label mix, traffic-light faces whose status follows
a light cycle, an ego that drives. Every scene is generated from ``(seed, scene index)``,
vectorized in numpy, and streamed to chunk writers: memory does not grow with the size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from l5dask.core.policy import renamed_keyword, thread_pool
from l5dask.prediction import format as fmt
from l5dask.prediction.writing import ArrayWriter, finish, prepare_target

HOSTS = ("host-a004", "host-a007", "host-a011", "host-a013", "host-a101", "host-a102")
BASE_TIME_NS = 1_546_300_800 * 10**9  # 2019-01-01, about when the real data was logged
FRAME_NS = 100_000_000  # 10 Hz

# Label mix of the real sample (most probable label): UNKNOWN 70 %, CAR 27 %,
# PEDESTRIAN 2.3 %, CYCLIST 0.35 %, the rest spread over the other agent-like labels.
_LABEL_P = np.zeros(17)
_LABEL_P[[1, 3, 14, 12]] = [0.70, 0.27, 0.023, 0.0035]
_LABEL_P[[4, 6, 7, 10, 11, 13, 9]] = (1 - _LABEL_P.sum()) / 7
#: Per label: (mean speed m/s when moving, fraction moving, length, width, height).
_KINEMATICS = {
    1: (1.5, 0.2, 1.0, 0.8, 1.0),
    3: (9.0, 0.55, 4.6, 1.9, 1.6),
    4: (8.0, 0.5, 5.2, 2.0, 2.2),
    6: (7.0, 0.6, 12.0, 2.6, 3.2),
    7: (7.0, 0.5, 8.0, 2.5, 3.3),
    9: (6.0, 0.4, 4.0, 1.8, 1.6),
    10: (4.0, 0.3, 1.8, 0.6, 1.1),
    11: (8.0, 0.6, 2.1, 0.8, 1.4),
    12: (4.5, 0.9, 1.8, 0.6, 1.7),
    13: (8.0, 0.9, 2.1, 0.8, 1.6),
    14: (1.3, 0.7, 0.6, 0.6, 1.7),
}


@dataclass
class SceneData:
    scene: np.ndarray
    frames: np.ndarray
    agents: np.ndarray
    tl_faces: np.ndarray


def _face_table(seed: int, n_lights: int = 4000) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A deterministic 'semantic map': light ids, three face ids per light, light positions."""
    rng = np.random.default_rng([seed, 2**31 - 1])
    alphabet = np.array(list("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz/+"))
    codes = rng.choice(len(alphabet), size=(n_lights * 5, 4))
    words = np.array(["".join(alphabet[c]) for c in codes])
    words = np.unique(words)[: n_lights * 4]
    rng.shuffle(words)
    lights = words[:n_lights]
    faces = words[n_lights : n_lights * 4].reshape(n_lights, 3)
    return lights, faces, rng.uniform(-2500, 2500, size=(n_lights, 2))


def make_scene(seed: int, index: int, faces_map=None, density: float = 1.0, label_ties: float = 0.0) -> SceneData:
    """Generate one scene (its intervals start at 0; the caller offsets them)."""
    rng = np.random.default_rng([seed, index])
    n = 248 + int(rng.random() < 0.3)
    # --- time and ego ------------------------------------------------------------------
    t0 = BASE_TIME_NS + index * 3_600 * 10**9 + int(rng.integers(0, 600)) * 10**9
    steps = FRAME_NS + rng.integers(-500, 501, size=n - 1) * 1_000  # microsecond jitter
    ts = t0 + np.concatenate([[0], np.cumsum(steps)])
    dt = np.diff(ts, prepend=ts[0] - FRAME_NS) / 1e9
    speed = np.clip(rng.uniform(0, 14) + np.cumsum(rng.normal(0, 0.12, n)), 0, 20)
    yaw_rate = np.convolve(rng.normal(0, 0.02, n), np.ones(25) / 25, mode="same")
    heading = rng.uniform(-np.pi, np.pi) + np.cumsum(yaw_rate * dt)
    origin = rng.uniform(-2500, 2500, size=2)
    ego_xy = origin + np.cumsum((speed * dt)[:, None] * np.c_[np.cos(heading), np.sin(heading)], axis=0)
    frames = np.zeros(n, dtype=fmt.FRAME_DTYPE)
    frames["timestamp"] = ts
    frames["ego_translation"][:, :2] = ego_xy
    frames["ego_translation"][:, 2] = -0.5 + rng.normal(0, 0.02, n)
    c, s = np.cos(heading), np.sin(heading)
    rot = np.zeros((n, 3, 3))
    rot[:, 0, 0], rot[:, 0, 1], rot[:, 1, 0], rot[:, 1, 1], rot[:, 2, 2] = c, -s, s, c, 1.0
    frames["ego_rotation"] = rot

    # --- agents: tracks with a birth and a lifetime, moving on gentle arcs ---------------
    mean_life = 80
    n_tracks = int(rng.poisson(344 * density * rng.uniform(0.6, 1.4)))
    life = np.minimum(rng.geometric(1 / mean_life, n_tracks), n)
    birth_raw = rng.integers(-life + 1, n)
    birth, death = np.maximum(birth_raw, 0), np.minimum(birth_raw + life, n)
    label = rng.choice(17, size=n_tracks, p=_LABEL_P)
    kin = np.array([_KINEMATICS.get(int(lbl), _KINEMATICS[1]) for lbl in range(17)])[label]
    moving = rng.random(n_tracks) < kin[:, 1]
    tspeed = np.where(moving, np.abs(rng.normal(kin[:, 0], kin[:, 0] * 0.3)), 0.0)
    theta = rng.uniform(0, 2 * np.pi, n_tracks)
    radius = np.where(rng.random(n_tracks) < 0.9, rng.uniform(3, 80, n_tracks), rng.uniform(80, 260, n_tracks))
    p0 = ego_xy[birth] + radius[:, None] * np.c_[np.cos(theta), np.sin(theta)]
    h0 = rng.uniform(-np.pi, np.pi, n_tracks)
    w = rng.normal(0, 0.05, n_tracks)
    w = np.where(np.abs(w) < 1e-3, 1e-3, w)
    extent = kin[:, 2:5] * rng.uniform(0.85, 1.15, size=(n_tracks, 3))
    track_id = rng.permutation(n_tracks).astype(np.uint64) + 1
    probs = np.zeros((n_tracks, 17), dtype=np.float32)
    probs[np.arange(n_tracks), label] = 1.0
    soft = rng.random(n_tracks) < 0.1
    main = rng.uniform(0.55, 0.95, n_tracks).astype(np.float32)
    probs[soft, label[soft]] = main[soft]
    probs[soft, 1] += 1 - main[soft]
    probs[soft & (label == 1), 1] = 1.0
    if label_ties:  # (drawn only when asked: datasets without ties stay the same for a seed)
        tie = np.flatnonzero(rng.random(n_tracks) < label_ties)
        kind = rng.integers(0, 3, len(tie))
        other = rng.integers(0, 17, len(tie))
        probs[tie] = 0.0
        two = tie[kind == 0]  # two labels at 0.5 (numpy's argmax: the lower index wins)
        probs[two, label[two]] = 0.5
        probs[two, other[kind == 0]] = 0.5
        probs[tie[kind == 1]] = 1 / 17  # all equal: label 0
        # kind 2: all zero, also label 0

    lengths = death - birth
    total = int(lengths.sum())
    track = np.repeat(np.arange(n_tracks), lengths)
    frame = birth[track] + (np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths))
    order = np.lexsort((track, frame))
    track, frame = track[order], frame[order]
    age = (ts[frame] - ts[birth[track]]) / 1e9
    hd = h0[track] + w[track] * age
    v = tspeed[track]
    arc = (v / w[track])[:, None] * np.c_[np.sin(hd) - np.sin(h0[track]), np.cos(h0[track]) - np.cos(hd)]
    agents = np.zeros(total, dtype=fmt.AGENT_DTYPE)
    agents["centroid"] = p0[track] + arc + rng.normal(0, 0.03, size=(total, 2))
    agents["extent"] = extent[track]
    agents["yaw"] = np.angle(np.exp(1j * hd))
    agents["velocity"] = (
        v[:, None] * np.c_[np.cos(hd), np.sin(hd)] + rng.normal(0, 0.05, size=(total, 2)) * (v > 0)[:, None]
    )
    agents["track_id"] = track_id[track]
    agents["label_probabilities"] = probs[track]
    per_frame = np.bincount(frame, minlength=n)
    ends = np.cumsum(per_frame)
    frames["agent_index_interval"] = np.c_[ends - per_frame, ends]

    # --- traffic lights near the ego, three faces each, cycling red/yellow/green ---------
    lights, face_ids, light_xy = faces_map
    near = np.argsort(((light_xy - ego_xy[n // 2]) ** 2).sum(1))[: int(rng.integers(6, 12))]
    nl = len(near)
    vis_a = rng.integers(0, n // 2, nl)
    vis_b = rng.integers(n // 2, n + 1, nl)
    period = rng.uniform(50, 90, nl)
    phase = rng.uniform(0, 1, nl)
    f_idx = np.arange(n)
    visible = (f_idx[None, :] >= vis_a[:, None]) & (f_idx[None, :] < vis_b[:, None])  # light x frame
    vis_frame, vis_light = np.nonzero(visible.T)  # ordered by frame, then light
    rows_frame = np.repeat(vis_frame, 3)
    rows_light = np.repeat(vis_light, 3)
    rows_face = np.tile(np.arange(3), len(vis_frame))
    cycle = ((ts[rows_frame] - t0) / 1e9 / period[rows_light] + phase[rows_light]) % 1.0
    colour = np.where(cycle < 0.5, 0, np.where(cycle < 0.56, 1, 2))  # red, yellow, green
    tl = np.zeros(len(rows_frame), dtype=fmt.TL_FACE_DTYPE)
    tl["face_id"] = face_ids[near[rows_light], rows_face]
    tl["traffic_light_id"] = lights[near[rows_light]]
    status = np.where(colour == rows_face, 0, 1)
    status = np.where(rng.random(len(tl)) < 0.03, 2, status)
    tl["traffic_light_face_status"][np.arange(len(tl)), status] = 1.0
    tl_count = np.bincount(rows_frame, minlength=n)
    tl_ends = np.cumsum(tl_count)
    frames["traffic_light_faces_index_interval"] = np.c_[tl_ends - tl_count, tl_ends]

    scene = np.zeros(1, dtype=fmt.SCENE_DTYPE)
    scene["frame_index_interval"] = [0, n]
    scene["host"] = HOSTS[int(rng.integers(len(HOSTS)))]
    scene["start_time"] = ts[0] - int(rng.integers(0, 50_000_000))
    scene["end_time"] = ts[-1] + int(rng.integers(0, 50_000_000))
    return SceneData(scene, frames, agents, tl)


@renamed_keyword("scenes", "num_scenes")
def synthesize(
    url: Any,
    num_scenes: int = 10,
    seed: int = 0,
    *,
    storage_options: dict | None = None,
    overwrite: bool = False,
    chunk_rows: dict[str, int] | None = None,
    traffic_lights: bool = True,
    density: float = 1.0,
    label_ties: float = 0.0,
    threads: int | None = None,
) -> dict[str, int]:
    """Write a generated dataset of ``num_scenes`` scenes to ``url``; returns the array lengths.

    Parameters
    ----------
    num_scenes : int
        Scenes to generate (``scenes=`` is its old name, until the next release, with a
        ``FutureWarning``: ``scenes=`` is the scene filter of the functions that read a dataset).
    chunk_rows : dict, optional
        Rows per stored chunk by array name (L5Kit's sizes by default); small values
        make many chunks, for tests.
    traffic_lights : bool
        Write the ``traffic_light_faces`` array (False makes the older format).
    density : float
        Scales the number of agents per frame (1.0 gives about 71, as the real sample).
    label_ties : float
        Fraction of tracks whose label probabilities tie (two labels at 0.5, all 17 equal, or all
        zero), to reach numpy's rule for ties (the first maximum) in tests. The real data has none.
    """
    store = prepare_target(url, storage_options, overwrite)
    rows = {n: (chunk_rows or {}).get(n, fmt.CHUNK_ROWS[n]) for n in fmt.ARRAY_NAMES}
    frame_dtype = fmt.FRAME_DTYPE if traffic_lights else fmt.FRAME_DTYPE_V1
    names = [fmt.SCENES, fmt.FRAMES, fmt.AGENTS] + ([fmt.TL_FACES] if traffic_lights else [])
    dtypes = {
        fmt.SCENES: fmt.SCENE_DTYPE,
        fmt.FRAMES: frame_dtype,
        fmt.AGENTS: fmt.AGENT_DTYPE,
        fmt.TL_FACES: fmt.TL_FACE_DTYPE,
    }
    faces_map = _face_table(seed)
    offsets = {"frames": 0, "agents": 0, "tl": 0}
    with thread_pool(threads or min(4, os.cpu_count() or 1), "l5dask-synth") as pool:
        writers = {n: ArrayWriter(store, n, dtypes[n], rows[n], pool) for n in names}
        for index in range(num_scenes):
            data = make_scene(seed, index, faces_map, density, label_ties)
            data.scene["frame_index_interval"] += offsets["frames"]
            data.frames["agent_index_interval"] += offsets["agents"]
            data.frames["traffic_light_faces_index_interval"] += offsets["tl"]
            offsets["frames"] += len(data.frames)
            offsets["agents"] += len(data.agents)
            offsets["tl"] += len(data.tl_faces)
            writers[fmt.SCENES].append(data.scene)
            if traffic_lights:
                writers[fmt.FRAMES].append(data.frames)
                writers[fmt.TL_FACES].append(data.tl_faces)
            else:
                old = np.zeros(len(data.frames), dtype=frame_dtype)
                for f in fmt.names_of(frame_dtype):
                    old[f] = data.frames[f]
                writers[fmt.FRAMES].append(old)
            writers[fmt.AGENTS].append(data.agents)
        metas = {n: w.close() for n, w in writers.items()}
    finish(store, metas)
    return {fmt.SHORT_NAMES[n]: m[1] for n, m in metas.items()}
