"""A self-contained HTML report: the standard statistics, figures inlined as PNG, no network."""

from __future__ import annotations

import datetime as dt
import html
from typing import Any

import numpy as np

from l5dask.core.page import MAX_TABLE_ROWS, figures_html, page, utc_text, write_page
from l5dask.core.version import __version__
from l5dask.prediction.plots import REPORT_FIGURES, catalog_figures, short_label
from l5dask.prediction.report import summary_rows


def render(report: dict[str, Any], elapsed_s: float | None = None, catalog: Any = None) -> str:
    """The HTML page of a report (as returned by ``compute_report``), with the scene catalog's
    section when ``catalog`` (:func:`l5dask.catalog`'s table) is given."""
    c = report["counts"]
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    figures = figures_html(REPORT_FIGURES, report)
    table = report["_scene_table"]
    cols = list(table)
    n = len(table["scene_index"])
    rows = []
    m = min(n, MAX_TABLE_ROWS)
    times = {c: utc_text(table[c][:m], "ms") for c in ("start_time", "end_time") if c in table}  # (UTC, said)
    for i in range(m):
        cells = []
        for col in cols:
            v = table[col][i]
            if col in times:
                text = times[col][i]
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
    if catalog is not None:
        body += catalog_section(catalog)
    return page(f"l5dask report: {report.get('dataset', 'dataset')}", identity, body)


def write_html(
    report: dict[str, Any],
    path: str,
    elapsed_s: float | None = None,
    storage_options: dict | None = None,
    catalog: Any = None,
) -> None:
    """Write the page atomically (a failed run leaves no partial file)."""
    write_page(render(report, elapsed_s, catalog), path, storage_options)


# --- the scene catalog's page (and the report's section) -----------------------------------
#: The catalog's columns in the page's table of scenes (every column is in the Parquet file).
PAGE_COLUMNS = (
    "scene_index",
    "host",
    "start_time",
    "local_hour",
    "local_weekday",
    "num_frames",
    "duration_s",
    "path_length_m",
    "max_speed_mps",
    "stops",
    "time_stopped_s",
    "turn",
    "turn_unwrapped",
    "vehicles_within_30m",
    "pedestrians_within_10m",
    "pedestrians_within_30m",
    "cyclists_within_30m",
    "closest_pedestrian_m",
    "tl_active_share",
    "low_confidence_agents",
)
#: Scenes whose rows the page embeds (about 120 bytes a scene: 2.4 MB), the first ones; the table
#: shows the first :data:`ROWS_SHOWN` of those that match, in the order chosen.
MAX_PAGE_SCENES = 20_000
ROWS_SHOWN = 200

_CATALOG_SCRIPT = """
(function () {
  var data = JSON.parse(document.getElementById('catalog-data').textContent);
  var cols = data.columns, kinds = data.kinds, rows = data.rows, shown = data.shown;
  var table = document.getElementById('catalog-table');
  var body = table.tBodies[0], status = document.getElementById('catalog-status');
  var sortCol = -1, sortDir = 1, tests = [];
  // a filter: numbers '>= 5', '< 3', '= 2', '!= 2', '2..10' (inclusive) or '7'; text: a part of
  // it (any case), '=text' the whole of it, '!text' not containing it
  function test(text, kind) {
    text = text.trim();
    if (!text) { return null; }
    if (kind === 'number') {
      var m = text.match(/^(-?[0-9.eE+-]+)\\s*\\.\\.\\s*(-?[0-9.eE+-]+)$/);
      if (m) { var a = parseFloat(m[1]), b = parseFloat(m[2]); return function (v) { return v !== null && v >= a && v <= b; }; }
      m = text.match(/^(>=|<=|!=|>|<|=)?\\s*(-?[0-9.eE+-]+)$/);
      if (!m) { return function () { return false; }; }
      var x = parseFloat(m[2]), op = m[1] || '=';
      return function (v) {
        if (v === null) { return op === '!='; }
        return op === '>=' ? v >= x : op === '<=' ? v <= x : op === '>' ? v > x : op === '<' ? v < x : op === '!=' ? v !== x : v === x;
      };
    }
    var low = text.toLowerCase();
    if (low[0] === '=') { low = low.slice(1); return function (v) { return v !== null && String(v).toLowerCase() === low; }; }
    if (low[0] === '!') { low = low.slice(1); return function (v) { return v === null || String(v).toLowerCase().indexOf(low) < 0; }; }
    return function (v) { return v !== null && String(v).toLowerCase().indexOf(low) >= 0; };
  }
  function cell(v, kind) {
    if (v === null) { return ''; }
    return kind === 'number' && Math.round(v) !== v ? v.toFixed(2) : String(v);
  }
  function render() {
    var keep = rows.filter(function (r) {
      for (var j = 0; j < cols.length; j++) { if (tests[j] && !tests[j](r[j])) { return false; } }
      return true;
    });
    if (sortCol >= 0) {
      var j = sortCol;
      keep.sort(function (a, b) {  // (missing values last, whatever the direction; ties by scene)
        var x = a[j], y = b[j];
        if (x === null || y === null) { return x === y ? a[0] - b[0] : x === null ? 1 : -1; }
        return x < y ? -sortDir : x > y ? sortDir : a[0] - b[0];
      });
    }
    var html = [];
    for (var i = 0; i < Math.min(keep.length, shown); i++) {
      html.push('<tr>' + keep[i].map(function (v, k) {
        return '<td>' + cell(v, kinds[k]).replace(/&/g, '&amp;').replace(/</g, '&lt;') + '</td>';
      }).join('') + '</tr>');
    }
    body.innerHTML = html.join('');
    status.textContent = keep.length.toLocaleString('en') + ' of ' + rows.length.toLocaleString('en') +
      ' scenes match' + (keep.length > shown ? ' (the first ' + shown + ' shown)' : '');
    table.setAttribute('data-matching', String(keep.length));
  }
  table.querySelectorAll('th.sort').forEach(function (th, j) {
    th.addEventListener('click', function () {
      sortDir = sortCol === j ? -sortDir : 1;
      sortCol = j;
      table.querySelectorAll('th.sort').forEach(function (h) { h.removeAttribute('data-dir'); });
      th.setAttribute('data-dir', sortDir > 0 ? 'ascending' : 'descending');
      render();
    });
  });
  table.querySelectorAll('input.filter').forEach(function (input, j) {
    input.addEventListener('input', function () { tests[j] = test(input.value, kinds[j]); render(); });
  });
  render();
})();
"""

_CATALOG_CSS = """<style>
th.sort{cursor:pointer;user-select:none} th.sort[data-dir=ascending]::after{content:' \\25B2'}
th.sort[data-dir=descending]::after{content:' \\25BC'} input.filter{width:100%;box-sizing:border-box;font-size:.75rem}
#catalog-table td{white-space:nowrap}
</style>"""


def catalog_columns(table: Any) -> dict[str, np.ndarray]:
    """The catalog (a pyarrow Table or a pandas DataFrame) as numpy columns (strings as objects,
    None where missing; times as int64 ns)."""
    import pyarrow as pa

    if not isinstance(table, pa.Table):
        table = pa.Table.from_pandas(table, preserve_index=False)
    out: dict[str, np.ndarray] = {}
    for name in table.column_names:
        col = table.column(name)
        if pa.types.is_timestamp(col.type):
            out[name] = np.asarray(col.cast(pa.int64()).to_numpy(zero_copy_only=False), np.int64)
        elif pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            out[name] = np.array(col.to_pylist(), object)
        else:
            out[name] = col.to_numpy(zero_copy_only=False)
    return out


def _json_value(v: Any, kind: str) -> Any:
    if v is None:
        return None
    if kind == "number":
        f = float(v)
        return None if not np.isfinite(f) else int(f) if f == int(f) else round(f, 3)
    return str(v)


def catalog_section(table: Any, heading: str = "h2") -> str:
    """The catalog's part of a page: the distribution of each column (figures) and a table of the
    scenes that sorts (click a column's name) and filters (a box under each name) in the browser,
    with no server: the page embeds the rows of its first :data:`MAX_PAGE_SCENES` scenes."""
    import json

    columns = catalog_columns(table)
    n = len(columns["scene_index"])
    names = [c for c in PAGE_COLUMNS if c in columns]
    kinds = ["text" if columns[c].dtype == object else "number" for c in names]
    m = min(n, MAX_PAGE_SCENES)
    cells = []
    for c, kind in zip(names, kinds):
        values = columns[c][:m]
        if c in ("start_time", "end_time"):  # (in UTC, said: local_hour beside it is the dataset's zone's)
            values = np.array(utc_text(values), object)
            kinds[names.index(c)] = "text"
            kind = "text"
        cells.append([_json_value(v, kind) for v in values.tolist()])
    rows = [list(r) for r in zip(*cells)] if cells else []
    payload = json.dumps({"columns": names, "kinds": kinds, "rows": rows, "shown": ROWS_SHOWN}, separators=(",", ":"))
    payload = payload.replace("<", "\\u003c")  # (nothing in it can close the script element)
    more = (
        f" The page holds the first {MAX_PAGE_SCENES:,} of {n:,} scenes; every scene and column is in the"
        " catalog's Parquet file (<code>l5dask catalog -o</code>)."
        if n > MAX_PAGE_SCENES
        else ""
    )
    head = "".join(f'<th class="sort" title="sort by {html.escape(c)}">{html.escape(c)}</th>' for c in names)
    filters = "".join(
        f'<th><input class="filter" aria-label="filter {html.escape(c)}" placeholder="{"&gt;= 5" if k == "number" else "text"}"></th>'
        for c, k in zip(names, kinds)
    )
    figures = figures_html(catalog_figures(columns), columns)
    return f"""<{heading}>Scene catalog</{heading}>
<p>A row per scene ({n:,} scenes; the columns and their thresholds: the guide's
<em>The scene catalog</em>; <code>start_time</code> in UTC, <code>local_hour</code> and
<code>local_weekday</code> in the dataset's time zone). Click a column's name to sort by it (again: the other way); type in the box
under it to filter: numbers <code>&gt;= 5</code>, <code>&lt; 3</code>, <code>= 2</code>, <code>!= 2</code>,
<code>2..10</code>; text a part of it, <code>=left</code> the whole of it, <code>!left</code> not it.{more}</p>
{_CATALOG_CSS}
<p id="catalog-status"></p>
<div class="scroll"><table id="catalog-table"><thead><tr>{head}</tr><tr>{filters}</tr></thead><tbody></tbody></table></div>
<script type="application/json" id="catalog-data">{payload}</script>
<script>{_CATALOG_SCRIPT}</script>
<div class="figures">{figures}</div>"""


def render_catalog(table: Any, dataset: str, elapsed_s: float | None = None) -> str:
    """The catalog's own page (``l5dask catalog --html``)."""
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    took = f", computed in {elapsed_s:.1f} s" if elapsed_s is not None else ""
    n = len(table)
    identity = f"{n:,} scenes &middot; computed {now}{took} &middot; l5dask {__version__}"
    return page(f"l5dask catalog: {dataset}", identity, catalog_section(table))


def write_catalog_html(
    table: Any, path: str, dataset: str, elapsed_s: float | None = None, storage_options: dict | None = None
) -> None:
    """Write the catalog's page atomically."""
    write_page(render_catalog(table, dataset, elapsed_s), path, storage_options)
