"""The figures of a perception report (the dict of :func:`l5dask.perception.perception_report`), for
notebooks and its HTML page alike."""

from __future__ import annotations

from typing import Any

import numpy as np

from l5dask.core.figures import axes, histogram


def category_mix(report: dict[str, Any], ax=None):
    """Annotations and instances by category (log scale)."""
    ax = axes(ax)
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
    ax = axes(ax)
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
    ax = histogram(
        axes(ax),
        report["annotations"]["distance_to_ego_m"]["histogram"],
        "distance to ego (m)",
        "Annotations by distance to the ego (LIDAR_TOP pose)",
        "#16a085",
    )
    ax.set_ylabel("annotations")
    return ax


def annotations_per_sample(report: dict[str, Any], ax=None):
    ax = axes(ax)
    counts = np.asarray(report.get("_per_sample", []))
    ax.hist(counts, bins=min(50, max(int(counts.max()) + 1, 1)) if len(counts) else 1, color="#8e44ad")
    ax.set_xlabel("annotations in the sample")
    ax.set_ylabel("samples")
    ax.set_title(f"Annotations per sample (mean {report['annotations']['per_sample']['mean']:.1f})")
    return ax


def ego_paths(report: dict[str, Any], ax=None):
    """Every scene's ego path (LIDAR_TOP poses), world x/y."""
    ax = axes(ax)
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
    ax = axes(ax)
    pts = np.asarray(report.get("_points_per_sweep", []))
    if len(pts):
        ax.hist(pts, bins=50, color="#2c3e50")
    lid = report.get("lidar")
    ax.set_xlabel("points in the sweep")
    ax.set_ylabel("sweeps")
    ax.set_title("Points per lidar sweep" + (f" ({lid['sweeps']:,} sweeps)" if lid else ": not computed (--no-lidar)"))
    return ax


ego_paths.square = True  # type: ignore[attr-defined]

PERCEPTION_FIGURES = (
    ("category mix", category_mix),
    ("box sizes by category", box_sizes),
    ("distance to ego", annotation_distance),
    ("annotations per sample", annotations_per_sample),
    ("ego paths", ego_paths),
    ("points per sweep", points_per_sweep),
)
