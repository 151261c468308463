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


# --- detection evaluation (the dict of l5dask.perception.detection.evaluate) ---------------------
def precision_recall(result: dict[str, Any], ax=None, threshold: int = 0):
    """Each class's precision-recall curve at one IoU threshold (index ``threshold``: the first,
    0.5, by default); needs ``curves``."""
    ax = axes(ax)
    thr = result["thresholds"][threshold]
    for c in result["classes"]:
        curve = result.get("curves", {}).get(c)
        if curve:
            ap = result["ap"][c][threshold]
            r, p = curve[threshold]["recall"], curve[threshold]["precision"]
            ax.plot(r, p, lw=1.2, marker="o" if len(r) == 1 else None, label=f"{c} (AP {ap:.3f})")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("recall")
    ax.set_ylabel("precision")
    ax.set_title(f"Precision-recall at IoU > {thr:g}")
    if result.get("curves"):
        ax.legend(fontsize=7, loc="lower left")
    return ax


def ap_by_threshold(result: dict[str, Any], ax=None):
    """AP of each class and the mAP, by IoU threshold."""
    ax = axes(ax)
    t = result["thresholds"]
    for c in result["classes"]:
        ax.plot(t, result["ap"][c], lw=1, alpha=0.7, label=c)
    ax.plot(t, result["map"], lw=2.5, color="black", label=f"mAP (mean {result['mean_map']:.3f})")
    ax.set_xlabel("IoU threshold")
    ax.set_ylabel("average precision")
    ax.set_ylim(0, 1.02)
    ax.set_title("AP by IoU threshold")
    ax.legend(fontsize=7)
    return ax


def ap_by_distance(result: dict[str, Any], ax=None):
    """The mAP of the boxes in each distance-to-ego band (with a dataset's ground truth)."""
    ax = axes(ax)
    bands = result.get("by_distance", [])
    labels = [f"{lo:g} m +" if hi is None else f"{lo:g}-{hi:g} m" for lo, hi in (b["band"] for b in bands)]
    ax.bar(np.arange(len(bands)), [b["mean_map"] for b in bands], color="#3b6ea8")
    ax.set_xticks(np.arange(len(bands)), labels)
    ax.set_ylabel("mAP (mean over thresholds)")
    ax.set_title("mAP by distance to the ego" + ("" if bands else ": needs a dataset's ground truth"))
    return ax


DETECTION_FIGURES = (
    ("precision-recall", precision_recall),
    ("AP by IoU threshold", ap_by_threshold),
    ("mAP by distance", ap_by_distance),
)
