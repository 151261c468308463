"""The HTML page of a perception report: its tables, categories and figures."""

from __future__ import annotations

import datetime as dt
import html
from typing import Any

from l5dask.core.page import MAX_TABLE_ROWS, figures_html, page, table_html
from l5dask.core.version import __version__
from l5dask.perception.plots import DETECTION_FIGURES, PERCEPTION_FIGURES


def render_perception(report: dict[str, Any], data: str, elapsed_s: float | None = None) -> str:
    """The page of a perception report (as returned by :func:`l5dask.perception.perception_report`)."""
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    took = f", computed in {elapsed_s:.1f} s" if elapsed_s is not None else ""
    c = report["counts"]
    identity = (
        f"{html.escape(data)}: {c['scene']:,} scenes, {c['sample']:,} samples, "
        f"{c['sample_annotation']:,} annotations &middot; computed {now}{took} &middot; l5dask {__version__}"
    )
    counts = table_html(["table", "rows"], [[k, f"{v:,}"] for k, v in c.items()])
    cats = table_html(
        ["category", "annotations", "instances", "mean width", "mean length", "mean height"],
        [
            [k, f"{v:,}", f"{report['instances']['per_category'].get(k, 0):,}"]
            + [f"{x:.2f}" for x in report["annotations"]["size_m"]["mean"][k]]
            for k, v in report["annotations"]["per_category"].items()
        ],
    )
    body = f"<h2>Tables</h2>{counts}<h2>Categories</h2>{cats}"
    lid = report.get("lidar")
    inside = (lid or {}).get("points_in_box")
    if inside:  # (--points-in-boxes)
        body += (
            f"<h2>Lidar points in boxes</h2><p>Annotations by the lidar points inside their box (the "
            f"key-frame sweeps, {inside['total']:,} points in all).</p>"
            + table_html(
                ["category", *point_bins(inside["edges"])],
                [[k, *(f"{n:,}" for n in v)] for k, v in inside["per_category"].items()],
            )
        )
    body += f'<h2>Figures</h2><div class="figures">{figures_html(PERCEPTION_FIGURES, report)}</div>'
    if lid and lid["missing_files"]:
        shown = lid["missing_files"][:MAX_TABLE_ROWS]
        body += f"<h2>Missing lidar files ({len(lid['missing_files']):,})</h2>" + table_html(
            ["file"], [[html.escape(n)] for n in shown]
        )
    return page("l5dask perception report", identity, body)


def point_bins(edges: list[float]) -> list[str]:
    """The column heads of a points-in-box histogram: counts are whole, so ``[2, 5)`` is "2-4"; the
    last bin holds its edge and more."""
    out = [f"{lo:g}" if hi - lo == 1 else f"{lo:g}-{hi - 1:g}" for lo, hi in zip(edges[:-1], edges[1:])]
    return [*out, f"{edges[-1]:g}+"]


#: How the page names each box geometry (l5dask.perception.geometry).
GEOMETRY_NOTE = {
    "corrected": "corrected (the SDK's source since its PR #64)",
    "sdk-0.0.8": "sdk-0.0.8 (the SDK's PyPI release: yaws mirrored)",
}


def render_detection(result: dict[str, Any], pred: str, elapsed_s: float | None = None) -> str:
    """The page of a detection evaluation (:func:`l5dask.perception.detection.evaluate`)."""
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    took = f", computed in {elapsed_s:.1f} s" if elapsed_s is not None else ""
    n_pred, n_gt = sum(result["predictions"].values()), sum(result["gt_boxes"].values())
    geometry = result.get("geometry", "corrected")
    identity = (
        f"{html.escape(pred)}: {n_pred:,} predictions against {n_gt:,} ground-truth boxes, "
        f"mAP {result['mean_map']:.4f} &middot; box geometry {html.escape(GEOMETRY_NOTE[geometry])} "
        f"&middot; computed {now}{took} &middot; l5dask {__version__}"
    )
    t = result["thresholds"]
    aps = table_html(
        ["class", "ground truth", "predictions", *[f"AP@{x:g}" for x in t]],
        [
            [html.escape(c), f"{result['gt_boxes'][c]:,}", f"{result['predictions'][c]:,}"]
            + [f"{a:.4f}" for a in result["ap"][c]]
            for c in result["classes"]
        ]
        + [["mAP", "", ""] + [f"{m:.4f}" for m in result["map"]]],
    )
    body = f'<h2>Average precision</h2>{aps}<h2>Figures</h2><div class="figures">{figures_html(DETECTION_FIGURES, result)}</div>'
    return page("l5dask detection evaluation", identity, body)
