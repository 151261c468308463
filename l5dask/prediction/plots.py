"""The figures of a dataset's statistics, for notebooks and the HTML report alike.

Report figures take the dict of :func:`l5dask.prediction.report.compute_report` (no second pass over
the data); scene figures read one scene's slice of a dataset.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from l5dask.core.figures import axes, histogram, png  # noqa: F401 - png: the pages draw with it
from l5dask.prediction import format as fmt


def short_label(label: str) -> str:
    """A label without its ``PERCEPTION_LABEL_`` prefix (``AVRESEARCH_LABEL_`` becomes ``AVR_``)."""
    return label.replace("PERCEPTION_LABEL_", "").replace("AVRESEARCH_LABEL_", "AVR_")


def label_mix(report: dict[str, Any], ax=None):
    """Agents by most probable label (log scale, share in %)."""
    ax = axes(ax)
    items = [(k, v) for k, v in report["agents"]["label_counts"].items() if v]
    items.sort(key=lambda kv: kv[1])
    total = max(sum(v for _, v in items), 1)
    names = [short_label(k) for k, _ in items]
    values = [v for _, v in items]
    bars = ax.barh(names, values, color="#3b6ea8")
    ax.set_xscale("log")
    for bar, v in zip(bars, values):
        ax.text(
            bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {100 * v / total:.2f} %", va="center", fontsize=8
        )
    ax.set_xlabel("agents (log scale)")
    ax.set_title("Label mix (most probable label)")
    return ax


def speed_histogram(report: dict[str, Any], ax=None):
    """Agents' speed ``|v|`` in m/s (last bar: overflow), log counts: most agents are parked, and on a
    linear axis their bar at 0 hides every other."""
    hist = report["agents"]["speed_mps"]["histogram"]
    total = max(sum(hist["counts"]), 1)
    parked = 100 * hist["counts"][0] / total
    return histogram(
        axes(ax),
        hist,
        "speed (m/s)",
        f"Agent speed ({parked:.0f} % below {hist['edges'][1]:g} m/s)",
        "#4c9a5d",
        log=True,
    )


def distance_histogram(report: dict[str, Any], ax=None):
    """Agents' distance to the ego in m (last bar: overflow)."""
    return histogram(
        axes(ax),
        report["agents"]["distance_to_ego_m"]["histogram"],
        "distance to ego (m)",
        "Distance to the ego",
        "#b5643c",
    )


def agents_per_frame(report: dict[str, Any], ax=None):
    """Agents per frame over time, for the few scenes the report samples."""
    ax = axes(ax)
    samples = report["_plots"]["samples"]
    for scene in np.unique(samples["scene"]):
        s = samples[samples["scene"] == scene]
        ax.plot((s["timestamp"] - s["timestamp"][0]) / 1e9, s["agents"], label=f"scene {scene}", lw=1.2)
    ax.set_xlabel("time in scene (s)")
    ax.set_ylabel("agents in frame")
    ax.set_title("Agents per frame")
    if len(samples):
        ax.legend(fontsize=8)
    return ax


def scene_durations(report: dict[str, Any], ax=None):
    """Histogram of scene durations (last frame minus first, in s)."""
    ax = axes(ax)
    d = np.asarray(report["_scene_table"]["duration_s"], float)
    ax.hist(d, bins=min(40, max(len(d), 1)), color="#7a5aa6")
    ax.set_xlabel("scene duration (s)")
    ax.set_ylabel("scenes")
    ax.set_title("Scene durations")
    return ax


def scene_map(report: dict[str, Any], ax=None):
    """Where the scenes are: ego paths in world x/y (one point every 2.5 s)."""
    ax = axes(ax, (6.5, 6.5))
    path = report["_plots"]["path"]
    for scene in np.unique(path["scene"]):
        p = path[path["scene"] == scene]
        ax.plot(p["x"], p["y"], lw=1, alpha=0.8)
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    ax.set_title(f"Ego paths of {len(np.unique(path['scene']))} scenes")
    return ax


def _scene_slices(ds, index: int):
    scenes = ds[fmt.SCENES].to_dask(fields=["frame_index_interval"])[index : index + 1].compute()
    f0, f1 = (int(v) for v in scenes["frame_index_interval"][0])
    frames = ds[fmt.FRAMES].to_dask()[f0:f1].compute()
    return f0, f1, frames


def scene(ds, index: int, ax=None, max_tracks: int = 200):
    """One scene: the ego path and the agents' tracks (by label), in world x/y."""
    ax = axes(ax, (6.5, 6.5))
    f0, f1, frames = _scene_slices(ds, index)
    a0, a1 = int(frames["agent_index_interval"][0, 0]), int(frames["agent_index_interval"][-1, 1])
    agents = ds[fmt.AGENTS].to_dask(fields=["centroid", "track_id", "label_probabilities"])[a0:a1].compute()
    labels = agents["label_probabilities"].argmax(1)
    colours = {3: "#3b6ea8", 14: "#c0392b", 12: "#27ae60", 1: "#bbbbbb"}
    for tid in np.unique(agents["track_id"])[:max_tracks]:
        m = agents["track_id"] == tid
        lbl = int(np.bincount(labels[m]).argmax())
        ax.plot(agents["centroid"][m, 0], agents["centroid"][m, 1], lw=0.8, color=colours.get(lbl, "#e67e22"))
    ego = frames["ego_translation"]
    ax.plot(ego[:, 0], ego[:, 1], color="black", lw=2.5, label="ego")
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_title(
        f"Scene {index}: ego and agent tracks (blue car, red pedestrian, green cyclist, grey unknown)", fontsize=9
    )
    ax.legend(fontsize=8)
    return ax


def traffic_lights(ds, index: int, ax=None):
    """One scene's traffic-light faces over time: ACTIVE (green), INACTIVE (grey), UNKNOWN (orange)."""
    ax = axes(ax, (7, 4))
    f0, f1, frames = _scene_slices(ds, index)
    tiv = frames["traffic_light_faces_index_interval"]
    t0, t1 = int(tiv[0, 0]), int(tiv[-1, 1])
    faces = ds[fmt.TL_FACES].to_dask()[t0:t1].compute()
    frame_of = np.repeat(np.arange(len(frames)), tiv[:, 1] - tiv[:, 0])
    ids, row = np.unique(faces["face_id"], return_inverse=True)
    img = np.full((len(ids), len(frames)), np.nan)
    img[row, frame_of] = faces["traffic_light_face_status"].argmax(1)
    from matplotlib.colors import ListedColormap

    seconds = (frames["timestamp"][-1] - frames["timestamp"][0]) / 1e9
    ax.imshow(
        img,
        aspect="auto",
        interpolation="nearest",
        cmap=ListedColormap(["#2ecc71", "#7f8c8d", "#f39c12"]),
        vmin=0,
        vmax=2,
        extent=(0, seconds, len(ids) - 0.5, -0.5),
    )
    ax.set_yticks(range(len(ids)), ids, fontsize=6)
    ax.set_xlabel("time in scene (s)")
    ax.set_title(f"Scene {index}: traffic-light faces (green ACTIVE, grey INACTIVE, orange UNKNOWN)", fontsize=9)
    return ax


scene_map.square = True  # type: ignore[attr-defined]

REPORT_FIGURES = (
    ("label mix", label_mix),
    ("speed histogram", speed_histogram),
    ("distance to ego histogram", distance_histogram),
    ("agents per frame", agents_per_frame),
    ("scene durations", scene_durations),
    ("scene map", scene_map),
)


# --- the scene catalog's figures: the distribution of each column over the scenes ------------
def catalog_tags(columns: dict[str, np.ndarray], ax=None):
    """Scenes by turn tag: L5Kit's (``turn``) and the corrected one (``turn_unwrapped``)."""
    ax = axes(ax)
    names = ["left", "straight", "right", "none"]
    width = 0.4
    for k, col in enumerate(("turn", "turn_unwrapped")):
        tags = [t if isinstance(t, str) else "none" for t in columns[col]]
        counts = [tags.count(n) for n in names]
        ax.bar(np.arange(4) + (k - 0.5) * width, counts, width=width, label=col, color=("#3b6ea8", "#e08a3c")[k])
    ax.set_xticks(np.arange(4), names)
    ax.set_ylabel("scenes")
    ax.set_title("Turn tags (none: under 50 frames)")
    ax.legend(fontsize=8)
    return ax


def _counts_of(column: str, values: range, xlabel: str, title: str):
    def draw(columns: dict[str, np.ndarray], ax=None):
        ax = axes(ax)
        v = np.asarray(columns[column], np.int64)
        ax.bar(list(values), [int(np.count_nonzero(v == k)) for k in values], color="#3b6ea8")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("scenes")
        ax.set_title(title)
        return ax

    return draw


def catalog_hosts(columns: dict[str, np.ndarray], ax=None):
    """Scenes by host (the car that recorded them)."""
    ax = axes(ax)
    hosts, counts = np.unique(np.asarray(columns["host"], str), return_counts=True)
    ax.barh(hosts, counts, color="#3b6ea8")
    ax.set_xlabel("scenes")
    ax.set_title("Hosts")
    return ax


def catalog_histogram(column: str):
    """The distribution of one numeric column over the scenes (NaN left out, counted in the title)."""

    def draw(columns: dict[str, np.ndarray], ax=None):
        ax = axes(ax)
        v = np.asarray(columns[column], float)
        finite = v[np.isfinite(v)]
        if len(finite):
            lo, hi = float(finite.min()), float(finite.max())
            integers = bool(np.all(finite == np.round(finite))) and hi - lo <= 60
            bins = np.arange(lo - 0.5, hi + 1.5) if integers else np.linspace(lo, hi if hi > lo else lo + 1, 31)
            ax.hist(finite, bins=bins, color="#3b6ea8")
        missing = len(v) - len(finite)
        ax.set_xlabel(column)
        ax.set_ylabel("scenes")
        ax.set_title(column + (f" ({missing:,} scenes without one)" if missing else ""))
        return ax

    draw.fixed_margins = True  # type: ignore[attr-defined]  # (its labels are numbers: core.figures.png)
    return draw


def catalog_tracks(columns: dict[str, np.ndarray], ax=None):
    """Distinct tracks per label, summed over the scenes (log scale)."""
    ax = axes(ax)
    items = [(c[len("tracks_") :], int(np.sum(columns[c]))) for c in columns if c.startswith("tracks_")]
    items = sorted((kv for kv in items if kv[1]), key=lambda kv: kv[1])
    if items:
        ax.barh([k for k, _ in items], [v for _, v in items], color="#3b6ea8")
        ax.set_xscale("log")
    ax.set_xlabel("tracks, summed over scenes (log scale)")
    ax.set_title("Distinct tracks per label")
    return ax


#: The catalog's numeric columns drawn as histograms, in the page's order.
CATALOG_HISTOGRAMS = (
    "num_frames",
    "duration_s",
    "timestamp_gaps",
    "path_length_m",
    "mean_speed_mps",
    "max_speed_mps",
    "max_accel_mps2",
    "max_decel_mps2",
    "max_abs_yaw_rate_rps",
    "time_stopped_s",
    "stops",
    "max_agents_in_frame",
    "vehicles_within_10m",
    "vehicles_within_30m",
    "pedestrians_within_10m",
    "pedestrians_within_30m",
    "cyclists_within_10m",
    "cyclists_within_30m",
    "closest_pedestrian_m",
    "closest_cyclist_m",
    "tl_faces_seen",
    "tl_active_share",
    "tl_inactive_share",
    "tl_unknown_share",
    "low_confidence_agents",
)


def catalog_figures(columns: dict[str, np.ndarray]) -> list:
    """``(caption, draw)`` of each figure of the catalog page: the tags, hour, weekday and hosts,
    the tracks per label, and a histogram of each numeric column the catalog has."""
    out = [
        ("turn tags", catalog_tags),
        ("local hour", _counts_of("local_hour", range(24), "local hour of the start", "Scenes by local hour")),
        ("weekday", _counts_of("local_weekday", range(7), "weekday (0 = Monday)", "Scenes by local weekday")),
        ("hosts", catalog_hosts),
        ("tracks per label", catalog_tracks),
    ]
    out += [(name, catalog_histogram(name)) for name in CATALOG_HISTOGRAMS if name in columns]
    return out
