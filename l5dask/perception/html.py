"""The HTML page of a perception report: its tables, categories and figures."""

from __future__ import annotations

import datetime as dt
import html
from typing import Any

from l5dask import __version__
from l5dask.core.page import MAX_TABLE_ROWS, figures_html, page, table_html
from l5dask.perception.plots import PERCEPTION_FIGURES


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
    body = (
        f"<h2>Tables</h2>{counts}<h2>Categories</h2>{cats}<h2>Figures</h2>"
        f'<div class="figures">{figures_html(PERCEPTION_FIGURES, report)}</div>'
    )
    lid = report.get("lidar")
    if lid and lid["missing_files"]:
        shown = lid["missing_files"][:MAX_TABLE_ROWS]
        body += f"<h2>Missing lidar files ({len(lid['missing_files']):,})</h2>" + table_html(
            ["file"], [[html.escape(n)] for n in shown]
        )
    return page("l5dask perception report", identity, body)
