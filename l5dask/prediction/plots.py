"""The figures of a dataset's statistics, for notebooks and the HTML report alike.

Report figures take the dict of :func:`l5dask.prediction.report.compute_report` (no second pass over
the data); scene figures read one scene's slice of a dataset.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from l5dask.prediction import format as fmt


def _ax(ax, size=(7, 3.6)):
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=size, layout="constrained")[1]


def _short(label: str) -> str:
    return label.replace("PERCEPTION_LABEL_", "").replace("AVRESEARCH_LABEL_", "AVR_")


def label_mix(report: dict[str, Any], ax=None):
    """Agents by most probable label (log scale, share in %)."""
    ax = _ax(ax)
    items = [(k, v) for k, v in report["agents"]["label_counts"].items() if v]
    items.sort(key=lambda kv: kv[1])
    total = max(sum(v for _, v in items), 1)
    names = [_short(k) for k, _ in items]
    values = [v for _, v in items]
    bars = ax.barh(names, values, color="#3b6ea8")
    ax.set_xscale("log")
    for bar, v in zip(bars, values):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {100 * v / total:.2f} %", va="center",
                fontsize=8)
    ax.set_xlabel("agents (log scale)")
    ax.set_title("Label mix (most probable label)")
    return ax


def _histogram(ax, hist: dict, xlabel: str, title: str, color: str, log: bool = False):
    edges = np.asarray(hist["edges"], float)
    counts = np.asarray(hist["counts"])
    width = edges[1] - edges[0]
    ax.bar(edges[:-1], counts[:-1], width=width, align="edge", color=color)
    ax.bar([edges[-1]], [counts[-1]], width=width, align="edge", color="#999999", label=f">= {edges[-1]:g}")
    ax.set_xlabel(xlabel)
    if log and counts.any():
        ax.set_yscale("log")
        ax.set_ylabel("agents (log scale)")
    else:
        ax.set_ylabel("agents")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize=8)
    return ax


def speed_histogram(report: dict[str, Any], ax=None):
    """Agents' speed |v| in m/s (last bar: overflow), log counts: most agents are parked, and on a
    linear axis their bar at 0 hides every other."""
    hist = report["agents"]["speed_mps"]["histogram"]
    total = max(sum(hist["counts"]), 1)
    parked = 100 * hist["counts"][0] / total
    return _histogram(_ax(ax), hist, "speed (m/s)", f"Agent speed ({parked:.0f} % below {hist['edges'][1]:g} m/s)",
                      "#4c9a5d", log=True)


def distance_histogram(report: dict[str, Any], ax=None):
    """Agents' distance to the ego in m (last bar: overflow)."""
    return _histogram(_ax(ax), report["agents"]["distance_to_ego_m"]["histogram"], "distance to ego (m)",
                      "Distance to the ego", "#b5643c")


def agents_per_frame(report: dict[str, Any], ax=None):
    """Agents per frame over time, for the few scenes the report samples."""
    ax = _ax(ax)
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
    ax = _ax(ax)
    d = np.asarray(report["_scene_table"]["duration_s"], float)
    ax.hist(d, bins=min(40, max(len(d), 1)), color="#7a5aa6")
    ax.set_xlabel("scene duration (s)")
    ax.set_ylabel("scenes")
    ax.set_title("Scene durations")
    return ax


def scene_map(report: dict[str, Any], ax=None):
    """Where the scenes are: ego paths in world x/y (one point every 2.5 s)."""
    ax = _ax(ax, (6.5, 6.5))
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
    scenes = ds[fmt.SCENES].to_dask(fields=["frame_index_interval"])[index: index + 1].compute()
    f0, f1 = (int(v) for v in scenes["frame_index_interval"][0])
    frames = ds[fmt.FRAMES].to_dask()[f0:f1].compute()
    return f0, f1, frames


def scene(ds, index: int, ax=None, max_tracks: int = 200):
    """One scene: the ego path and the agents' tracks (by label), in world x/y."""
    ax = _ax(ax, (6.5, 6.5))
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
    ax.set_title(f"Scene {index}: ego and agent tracks (blue car, red pedestrian, green cyclist, grey unknown)",
                 fontsize=9)
    ax.legend(fontsize=8)
    return ax


def traffic_lights(ds, index: int, ax=None):
    """One scene's traffic-light faces over time: ACTIVE (green), INACTIVE (grey), UNKNOWN (orange)."""
    ax = _ax(ax, (7, 4))
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
    ax.imshow(img, aspect="auto", interpolation="nearest", cmap=ListedColormap(["#2ecc71", "#7f8c8d", "#f39c12"]),
              vmin=0, vmax=2, extent=(0, seconds, len(ids) - 0.5, -0.5))
    ax.set_yticks(range(len(ids)), ids, fontsize=6)
    ax.set_xlabel("time in scene (s)")
    ax.set_title(f"Scene {index}: traffic-light faces (green ACTIVE, grey INACTIVE, orange UNKNOWN)", fontsize=9)
    return ax


REPORT_FIGURES = (
    ("label mix", label_mix),
    ("speed histogram", speed_histogram),
    ("distance to ego histogram", distance_histogram),
    ("agents per frame", agents_per_frame),
    ("scene durations", scene_durations),
    ("scene map", scene_map),
)


# --- an evaluation's figures (the dict of l5dask.evaluation.evaluate) ----------------------------
def displacement_by_horizon(result: dict[str, Any], ax=None):
    """Expected displacement (``time_displace``) against the prediction horizon."""
    ax = _ax(ax)
    td = np.asarray(result["time_displace"], float)
    ax.plot(np.arange(1, len(td) + 1), td, marker=".", color="#3b6ea8")
    ax.set_xlabel("future step")
    ax.set_ylabel("displacement (m)")
    ax.set_title(f"time_displace over {result['rows']:,} rows", fontsize=9)
    return ax


def nll_distribution(result: dict[str, Any], ax=None):
    """Rows by negative multi-log-likelihood (log-spaced bins)."""
    ax = _ax(ax)
    h = result["nll_histogram"]
    edges, counts = np.asarray(h["edges"]), np.asarray(h["counts"])
    ax.bar(edges[:-1], counts, width=np.diff(edges), align="edge", color="#8e44ad")
    ax.set_xscale("symlog", linthresh=1e-3)
    ax.set_xlabel("neg_multi_log_likelihood")
    ax.set_ylabel("rows")
    ax.set_title("NLL distribution", fontsize=9)
    return ax


def metrics_by_label(result: dict[str, Any], ax=None):
    """ADE and FDE (oracle) per label, with the rows of each label."""
    ax = _ax(ax)
    rows = result.get("by_label") or []
    names = [f"{_short(r['name'])}\n({r['rows']:,})" for r in rows]
    x = np.arange(len(rows))
    for k, (key, colour) in enumerate((("average_displacement_error_oracle", "#27ae60"),
                                       ("final_displacement_error_oracle", "#c0392b"))):
        ax.bar(x + (k - 0.5) * 0.4, [r[key] or 0 for r in rows], width=0.4, color=colour,
               label=key.replace("_displacement_error_", " ").replace("average", "ADE").replace("final", "FDE"))
    ax.set_xticks(x, names, fontsize=7)
    ax.set_ylabel("m")
    ax.set_title("by label (rows)" if rows else "by label: give --dataset", fontsize=9)
    ax.legend(fontsize=8)
    return ax


EVALUATION_FIGURES = (
    ("displacement against horizon", displacement_by_horizon),
    ("NLL distribution", nll_distribution),
    ("ADE / FDE by label", metrics_by_label),
)


# --- the perception report's figures (the dict of l5dask.perception.perception_report) ----------
def category_mix(report: dict[str, Any], ax=None):
    """Annotations and instances by category (log scale)."""
    ax = _ax(ax)
    items = sorted(report["annotations"]["per_category"].items(), key=lambda kv: kv[1])
    inst = report["instances"]["per_category"]
    y = np.arange(len(items))
    ax.barh(y + 0.2, [max(v, 0) for _, v in items], height=0.4, color="#3b6ea8", label="annotations")
    ax.barh(y - 0.2, [inst.get(k, 0) for k, _ in items], height=0.4, color="#e67e22", label="instances")
    ax.set_yticks(y, [k for k, _ in items], fontsize=8)
    if any(v for _, v in items):
        ax.set_xscale("log")
    ax.set_xlabel("rows (log scale)")
    ax.set_title("Category mix")
    ax.legend(fontsize=8)
    return ax


def box_sizes(report: dict[str, Any], ax=None):
    """Mean box width, length and height by category."""
    ax = _ax(ax)
    means = report["annotations"]["size_m"]["mean"]
    names = list(means)
    x = np.arange(len(names))
    for k, (what, colour) in enumerate((("width", "#27ae60"), ("length", "#3b6ea8"), ("height", "#c0392b"))):
        ax.bar(x + (k - 1) * 0.27, [means[n][k] for n in names], width=0.27, color=colour, label=what)
    ax.set_xticks(x, [n.replace("_", "\n") for n in names], fontsize=7)
    ax.set_ylabel("m (mean)")
    ax.set_title("Box sizes by category")
    ax.legend(fontsize=8)
    return ax


def annotation_distance(report: dict[str, Any], ax=None):
    ax = _histogram(_ax(ax), report["annotations"]["distance_to_ego_m"]["histogram"], "distance to ego (m)",
                    "Annotations by distance to the ego (LIDAR_TOP pose)", "#16a085")
    ax.set_ylabel("annotations")
    return ax


def annotations_per_sample(report: dict[str, Any], ax=None):
    ax = _ax(ax)
    counts = np.asarray(report.get("_per_sample", []))
    ax.hist(counts, bins=min(50, max(int(counts.max()) + 1, 1)) if len(counts) else 1, color="#8e44ad")
    ax.set_xlabel("annotations in the sample")
    ax.set_ylabel("samples")
    ax.set_title(f"Annotations per sample (mean {report['annotations']['per_sample']['mean']:.1f})")
    return ax


def ego_paths(report: dict[str, Any], ax=None):
    """Every scene's ego path (LIDAR_TOP poses), world x/y."""
    ax = _ax(ax)
    for xy in report.get("_ego_paths", []):
        xy = np.asarray(xy)
        if len(xy):
            ax.plot(xy[:, 0], xy[:, 1], lw=1)
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    ax.set_title(f"Ego paths ({report['ego']['total_distance_km']:.1f} km)")
    return ax


def points_per_sweep(report: dict[str, Any], ax=None):
    ax = _ax(ax)
    pts = np.asarray(report.get("_points_per_sweep", []))
    if len(pts):
        ax.hist(pts, bins=50, color="#2c3e50")
    lid = report.get("lidar")
    ax.set_xlabel("points in the sweep")
    ax.set_ylabel("sweeps")
    ax.set_title("Points per lidar sweep" + (f" ({lid['sweeps']:,} sweeps)" if lid else ": not computed (--no-lidar)"))
    return ax


PERCEPTION_FIGURES = (
    ("category mix", category_mix),
    ("box sizes by category", box_sizes),
    ("distance to ego", annotation_distance),
    ("annotations per sample", annotations_per_sample),
    ("ego paths", ego_paths),
    ("points per sweep", points_per_sweep),
)


def png(draw, report: dict[str, Any], size=(7, 3.6)) -> bytes:
    """Draw one report figure off-screen and return it as PNG bytes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.5, 6.5) if draw in (scene_map, ego_paths) else size, layout="constrained")
    draw(report, ax=fig.add_subplot())
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96)
    return buf.getvalue()
