"""A self-contained HTML report: the standard statistics, figures inlined as PNG, no network."""

from __future__ import annotations

import datetime as dt
import html
from typing import Any

import numpy as np

from l5dask import __version__
from l5dask.core.page import MAX_TABLE_ROWS, figures_html, page, write_page
from l5dask.prediction.plots import REPORT_FIGURES, short_label
from l5dask.prediction.report import summary_rows


def render(report: dict[str, Any], elapsed_s: float | None = None) -> str:
    """The HTML page of a report (as returned by ``compute_report``)."""
    c = report["counts"]
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    figures = figures_html(REPORT_FIGURES, report)
    table = report["_scene_table"]
    cols = list(table)
    n = len(table["scene_index"])
    rows = []
    for i in range(min(n, MAX_TABLE_ROWS)):
        cells = []
        for col in cols:
            v = table[col][i]
            if col in ("start_time", "end_time"):
                text = dt.datetime.fromtimestamp(int(v) / 1e9, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
            else:
                text = f"{v:.2f}" if isinstance(v, (float, np.floating)) else str(v)
            cells.append(f"<td>{html.escape(text)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    more = (
        f"<p>First {MAX_TABLE_ROWS} of {n:,} scenes (the whole table: <code>--scenes-table</code>).</p>"
        if n > MAX_TABLE_ROWS
        else ""
    )
    took = f", computed in {elapsed_s:.1f} s" if elapsed_s is not None else ""
    head, values, labels, extra = summary_rows(report)
    summary = (
        '<table class="summary"><thead><tr>'
        + "".join(f"<th>{html.escape(h)}</th>" for h in head)
        + "</tr></thead><tbody><tr>"
        + "".join(f"<td>{html.escape(v)}</td>" for v in values)
        + "</tr></tbody></table>"
        + '<div class="labels">'
        + "".join(f"<div>{html.escape(short_label(name))}: {n:,} ({share:.2f} %)</div>" for name, n, share in labels)
        + "</div>"
        + f"<p>{html.escape(extra)}</p>"
    )
    identity = (
        f"{c['scenes']:,} scenes, {c['frames']:,} frames, {c['agents']:,} agents, "
        f"{c['tl_faces']:,} traffic-light faces &middot; computed {now}{took} &middot; l5dask {__version__}"
    )
    body = f"""<h2>Summary</h2>
{summary}
<h2>Figures</h2>
<div class="figures">{figures}</div>
<h2>Scenes</h2>
{more}<div class="scroll"><table><thead><tr>{"".join(f"<th>{html.escape(col)}</th>" for col in cols)}</tr></thead>
<tbody>{"".join(rows)}</tbody></table></div>"""
    return page(f"l5dask report: {report.get('dataset', 'dataset')}", identity, body)


def write_html(
    report: dict[str, Any], path: str, elapsed_s: float | None = None, storage_options: dict | None = None
) -> None:
    """Write the page atomically (a failed run leaves no partial file)."""
    write_page(render(report, elapsed_s), path, storage_options)
