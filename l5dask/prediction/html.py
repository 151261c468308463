"""A self-contained HTML report: the standard statistics, figures inlined as PNG, no network."""

from __future__ import annotations

import base64
import datetime as dt
import html
from typing import Any

import numpy as np

from l5dask import __version__
from l5dask.prediction.plots import REPORT_FIGURES, _short, png
from l5dask.core.outputs import atomic_write
from l5dask.prediction.report import summary_rows

MAX_TABLE_ROWS = 500

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;color:#222}
h1{font-size:1.6rem;margin-bottom:.2rem} h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #ddd}
.identity{color:#555;font-size:.9rem}
table.summary{width:100%;table-layout:fixed;margin-bottom:1rem} table.summary th{position:static;white-space:normal}
.labels{display:grid;grid-template-columns:repeat(auto-fit,minmax(320px,1fr));gap:.2rem 2rem;font-size:.85rem}
.figures{display:grid;grid-template-columns:repeat(auto-fit,minmax(480px,1fr));gap:1rem}
figure{margin:0} figure img{max-width:100%} figcaption{font-size:.8rem;color:#666}
table{border-collapse:collapse;font-size:.8rem} td,th{border:1px solid #ddd;padding:2px 6px;text-align:right}
th{background:#f0f0f0;position:sticky;top:0} .scroll{max-height:420px;overflow:auto}
"""

_SCRIPT = """
window.addEventListener('load', function () {
  var imgs = document.querySelectorAll('figure img');
  var ok = 0;
  imgs.forEach(function (img) { if (img.complete && img.naturalWidth > 0) { ok += 1; } });
  document.body.setAttribute('data-figures-loaded', String(ok));
  // for the browser test: does anything stick out of the window sideways?
  var wide = document.documentElement.scrollWidth > window.innerWidth;
  document.querySelectorAll('table.summary, .labels').forEach(function (el) {
    if (el.scrollWidth > el.clientWidth) { wide = true; }
  });
  document.body.setAttribute('data-overflow', String(wide));
});
"""


def figures_html(figures, data: dict[str, Any]) -> str:
    """The ``(caption, draw)`` figures of ``data`` as inlined PNGs."""
    out = []
    for caption, draw in figures:
        img = base64.b64encode(png(draw, data)).decode()
        out.append(f'<figure><img alt="{caption}" src="data:image/png;base64,{img}">'
                   f"<figcaption>{caption}</figcaption></figure>")
    return "".join(out)


def page(title: str, identity: str, body: str) -> str:
    """A self-contained page: the report's style and the browser test's hooks."""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>{_CSS}</style></head>
<body>
<h1>{html.escape(title)}</h1>
<p class="identity">{identity}</p>
{body}
<script>{_SCRIPT}</script>
</body></html>
"""


def table_html(head: list[str], rows: list[list[str]]) -> str:
    return ("<div class=\"scroll\"><table><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head)
            + "</tr></thead><tbody>" + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                                               for r in rows) + "</tbody></table></div>")


def write_page(text: str, path: str, storage_options: dict | None = None) -> None:
    """Write a page atomically (a failed run leaves no partial file)."""

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    atomic_write(path, write, storage_options)


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
    more = f"<p>First {MAX_TABLE_ROWS} of {n:,} scenes (the whole table: <code>--scenes-table</code>).</p>" \
        if n > MAX_TABLE_ROWS else ""
    took = f", computed in {elapsed_s:.1f} s" if elapsed_s is not None else ""
    head, values, labels, extra = summary_rows(report)
    summary = ("<table class=\"summary\"><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head)
               + "</tr></thead><tbody><tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in values)
               + "</tr></tbody></table>"
               + "<div class=\"labels\">" + "".join(f"<div>{html.escape(_short(name))}: {n:,} ({share:.2f} %)</div>"
                                                 for name, n, share in labels) + "</div>"
               + f"<p>{html.escape(extra)}</p>")
    identity = (f"{c['scenes']:,} scenes, {c['frames']:,} frames, {c['agents']:,} agents, "
                f"{c['tl_faces']:,} traffic-light faces &middot; computed {now}{took} &middot; l5dask {__version__}")
    body = f"""<h2>Summary</h2>
{summary}
<h2>Figures</h2>
<div class="figures">{figures}</div>
<h2>Scenes</h2>
{more}<div class="scroll"><table><thead><tr>{''.join(f'<th>{html.escape(col)}</th>' for col in cols)}</tr></thead>
<tbody>{''.join(rows)}</tbody></table></div>"""
    return page(f"l5dask report: {report.get('dataset', 'dataset')}", identity, body)


def write_html(report: dict[str, Any], path: str, elapsed_s: float | None = None,
               storage_options: dict | None = None) -> None:
    """Write the page atomically (a failed run leaves no partial file)."""
    write_page(render(report, elapsed_s), path, storage_options)


def render_evaluation(result: dict[str, Any], gt: str, pred: str, elapsed_s: float | None = None) -> str:
    """The page of an evaluation (as returned by :func:`l5dask.evaluation.evaluate`)."""
    from l5dask.evaluation.metrics import METRICS
    from l5dask.prediction.plots import EVALUATION_FIGURES

    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    took = f", computed in {elapsed_s:.1f} s" if elapsed_s is not None else ""
    identity = (f"{html.escape(gt)} against {html.escape(pred)}: {result['rows']:,} rows, T = {result['future_len']}, "
                f"M = {result['max_modes']} &middot; computed {now}{took} &middot; l5dask {__version__}")
    scalar = [k for k in METRICS if not isinstance(result[k], list)]
    summary = table_html(["metric", "mean"], [[k, "" if result[k] is None else f"{result[k]:.6g}"] for k in scalar]
                         + [["prob_true_mode", ", ".join(f"{v:.4f}" for v in result["prob_true_mode"] or [])]])
    body = f"<h2>Metrics</h2>{summary}<h2>Figures</h2><div class=\"figures\">{figures_html(EVALUATION_FIGURES, result)}</div>"
    for key, what in (("by_label", "label"), ("by_scene", "scene")):
        groups = result.get(key)
        if not groups:
            continue
        shown = groups[:MAX_TABLE_ROWS]
        more = f"<p>First {MAX_TABLE_ROWS} of {len(groups):,} (the whole table is in the JSON).</p>" \
            if len(groups) > MAX_TABLE_ROWS else ""
        body += (f"<h2>By {what}</h2>{more}" + table_html(
            [what, "rows"] + scalar, [[_short(str(g["name"])), f"{g['rows']:,}"]
                                      + ["" if g[k] is None else f"{g[k]:.4g}" for k in scalar] for g in shown]))
    return page("l5dask evaluation", identity, body)


def render_perception(report: dict[str, Any], data: str, elapsed_s: float | None = None) -> str:
    """The page of a perception report (as returned by :func:`l5dask.perception.perception_report`)."""
    from l5dask.prediction.plots import PERCEPTION_FIGURES

    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    took = f", computed in {elapsed_s:.1f} s" if elapsed_s is not None else ""
    c = report["counts"]
    identity = (f"{html.escape(data)}: {c['scene']:,} scenes, {c['sample']:,} samples, "
                f"{c['sample_annotation']:,} annotations &middot; computed {now}{took} &middot; l5dask {__version__}")
    counts = table_html(["table", "rows"], [[k, f"{v:,}"] for k, v in c.items()])
    cats = table_html(["category", "annotations", "instances", "mean width", "mean length", "mean height"],
                      [[k, f"{v:,}", f"{report['instances']['per_category'].get(k, 0):,}"]
                       + [f"{x:.2f}" for x in report["annotations"]["size_m"]["mean"][k]]
                       for k, v in report["annotations"]["per_category"].items()])
    body = (f"<h2>Tables</h2>{counts}<h2>Categories</h2>{cats}<h2>Figures</h2>"
            f"<div class=\"figures\">{figures_html(PERCEPTION_FIGURES, report)}</div>")
    lid = report.get("lidar")
    if lid and lid["missing_files"]:
        shown = lid["missing_files"][:MAX_TABLE_ROWS]
        body += f"<h2>Missing lidar files ({len(lid['missing_files']):,})</h2>" + table_html(["file"], [[html.escape(n)] for n in shown])
    return page("l5dask perception report", identity, body)
