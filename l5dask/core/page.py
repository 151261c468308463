"""Self-contained HTML pages (figures inlined as PNG, no network), for each system's report page:
the style, the browser test's hooks, tables and figures, written atomically."""

from __future__ import annotations

import base64
import html
from typing import Any, Literal

from l5dask.core.figures import png
from l5dask.core.outputs import atomic_write

MAX_TABLE_ROWS = 500


def utc_text(ns: Any, unit: Literal["m", "s", "ms"] = "m") -> list[str]:
    """Times given as integer nanoseconds since the epoch (the datasets' timestamps) as text that
    says its zone, ``"2019-05-17 01:23 UTC"``: cut (not rounded) to ``unit`` (numpy's: ``"m"``,
    ``"s"``, ``"ms"``) by integer arithmetic (through a float rounded to the microsecond, a time
    less than 0.5 us before a minute or a millisecond showed the next one)."""
    import numpy as np

    times = np.asarray(ns, np.int64).astype("datetime64[ns]").astype(f"datetime64[{unit}]")  # (floor)
    text = np.datetime_as_string(times, unit=unit, timezone="UTC")
    return [t.replace("T", " ").replace("Z", " UTC") for t in np.atleast_1d(text).tolist()]


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
        out.append(
            f'<figure><img alt="{caption}" src="data:image/png;base64,{img}">'
            f"<figcaption>{caption}</figcaption></figure>"
        )
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
    return (
        '<div class="scroll"><table><thead><tr>'
        + "".join(f"<th>{html.escape(h)}</th>" for h in head)
        + "</tr></thead><tbody>"
        + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
        + "</tbody></table></div>"
    )


def write_page(text: str, path: str, storage_options: dict | None = None) -> None:
    """Write a page atomically (a failed run leaves no partial file)."""

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    atomic_write(path, write, storage_options)
