"""The statistics report in plain single-process numpy, straight from the definitions.

This is what a user writes today with L5Kit: load the arrays, join with ``np.repeat``,
compute. It is the reference of the tests (``tests/prediction/test_stats.py``) and baseline (b) of
``benchmarks/stats_benchmark.py``. It needs every array in memory.
"""

from __future__ import annotations

import numpy as np

STATUSES = ("ACTIVE", "INACTIVE", "UNKNOWN")


def _hist(values: np.ndarray, edges: np.ndarray) -> list[int]:
    idx = (
        np.digitize(values[~np.isnan(values)], edges) - 1
    )  # edges[i] <= v < edges[i+1]; v >= last edge -> last bin; NaN none
    return np.bincount(idx, minlength=len(edges))[: len(edges)].tolist()


def reference_report(arrays: dict[str, np.ndarray], labels) -> dict:
    scenes, frames, agents = arrays["scenes"], arrays["frames"], arrays["agents"]
    tl = arrays.get("traffic_light_faces")
    S, F, A = len(scenes), len(frames), len(agents)
    T = 0 if tl is None else len(tl)
    siv = scenes["frame_index_interval"].reshape(-1, 2)
    fiv = frames["agent_index_interval"].reshape(-1, 2)
    scene_of_frame = np.repeat(np.arange(S), siv[:, 1] - siv[:, 0])
    frame_of_agent = np.repeat(np.arange(F), fiv[:, 1] - fiv[:, 0])
    scene_of_agent = scene_of_frame[frame_of_agent]
    ts = frames["timestamp"]
    same = scene_of_frame[1:] == scene_of_frame[:-1]
    dts = (ts[1:] - ts[:-1])[same]
    hz = 1e9 / np.median(dts) if len(dts) else 10.0
    xy = frames["ego_translation"][:, :2]
    step = np.linalg.norm(xy[1:] - xy[:-1], axis=1)[same]
    per_frame = fiv[:, 1] - fiv[:, 0]
    v = agents["velocity"].astype(np.float64)
    speed = np.sqrt(v[:, 0] ** 2 + v[:, 1] ** 2)
    d = agents["centroid"] - xy[frame_of_agent]
    dist = np.sqrt(d[:, 0] ** 2 + d[:, 1] ** 2)
    track = agents["track_id"]
    num_tracks = [len(np.unique(track[scene_of_agent == s])) for s in range(S)]
    num_agents = [int(fiv[e - 1, 1] - fiv[s, 0]) if e > s else 0 for s, e in siv]
    status = tl["traffic_light_face_status"].argmax(1) if T else np.zeros(0, int)
    mean = lambda x: float(np.mean(x)) if len(x) else 0.0  # noqa: E731
    return {
        "counts": {"scenes": S, "frames": F, "agents": A, "tl_faces": T},
        "summary": {
            "frame_frequency_hz": hz,
            "total_time_hours": F / hz / 3600,
            "avg_frames_per_scene": F / S if S else 0.0,
            "avg_agents_per_frame": A / F if F else 0.0,
            "avg_scene_time_s": (F / S if S else 0.0) / hz,
        },
        "agents": {
            "label_counts": dict(
                zip(labels, np.bincount(agents["label_probabilities"].argmax(1), minlength=17).tolist())
            )
            if A
            else {name: 0 for name in labels},
            "per_frame": {
                "min": int(per_frame.min()) if F else 0,
                "max": int(per_frame.max()) if F else 0,
                "mean": mean(per_frame),
            },
            "speed_mps": {
                "mean": mean(speed),
                "histogram": {
                    "edges": np.linspace(0, 50, 101).tolist(),
                    "counts": _hist(speed, np.linspace(0, 50, 101)),
                },
            },
            "distance_to_ego_m": {
                "histogram": {"edges": np.linspace(0, 200, 41).tolist(), "counts": _hist(dist, np.linspace(0, 200, 41))}
            },
        },
        "tracks": {"count": int(sum(num_tracks))},
        "tl_faces": {
            "status_counts": dict(zip(STATUSES, np.bincount(status, minlength=3).tolist())),
            "unique_faces": int(len(np.unique(tl["face_id"]))) if T else 0,
        },
        "ego": {"mean_speed_mps": mean(step / (dts / 1e9)), "total_distance_km": float(step.sum()) / 1000},
        "per_scene": {
            "num_agents": num_agents,
            "num_tracks": num_tracks,
            "ego_distance_m": np.bincount(scene_of_frame[1:][same], weights=step, minlength=S).tolist() if S else [],
        },
    }
