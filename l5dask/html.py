"""A self-contained HTML report: the standard statistics, figures inlined as PNG, no network."""

from __future__ import annotations

import base64
import datetime as dt
import html
from typing import Any

import numpy as np

from . import __version__
from .plot import REPORT_FIGURES, _short, png
from .outputs import atomic_write
from .report import summary_rows

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


def render(report: dict[str, Any], elapsed_s: float | None = None) -> str:
    """The HTML page of a report (as returned by ``compute_report``)."""
    c = report["counts"]
    name = html.escape(str(report.get("dataset", "dataset")))
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    figures = []
    for caption, draw in REPORT_FIGURES:
        data = base64.b64encode(png(draw, report)).decode()
        figures.append(f'<figure><img alt="{caption}" src="data:image/png;base64,{data}">'
                       f"<figcaption>{caption}</figcaption></figure>")
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
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>l5dask report: {name}</title>
<style>{_CSS}</style></head>
<body>
<h1>l5dask report: {name}</h1>
<p class="identity">{c['scenes']:,} scenes, {c['frames']:,} frames, {c['agents']:,} agents,
{c['tl_faces']:,} traffic-light faces &middot; computed {now}{took} &middot; l5dask {__version__}</p>
<h2>Summary</h2>
{summary}
<h2>Figures</h2>
<div class="figures">{''.join(figures)}</div>
<h2>Scenes</h2>
{more}<div class="scroll"><table><thead><tr>{''.join(f'<th>{html.escape(col)}</th>' for col in cols)}</tr></thead>
<tbody>{''.join(rows)}</tbody></table></div>
<script>{_SCRIPT}</script>
</body></html>
"""


def write_html(report: dict[str, Any], path: str, elapsed_s: float | None = None,
               storage_options: dict | None = None) -> None:
    """Write the page atomically (a failed run leaves no partial file)."""
    page = render(report, elapsed_s)

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(page)

    atomic_write(path, write, storage_options)
