"""The HTML page of an evaluation: its metrics, figures and breakdowns."""

from __future__ import annotations

import datetime as dt
import html
from typing import Any

from l5dask.core.page import MAX_TABLE_ROWS, figures_html, page, table_html
from l5dask.core.version import __version__
from l5dask.evaluation.metrics import METRICS
from l5dask.evaluation.plots import EVALUATION_FIGURES
from l5dask.prediction.plots import short_label


def render_evaluation(result: dict[str, Any], gt: str, pred: str, elapsed_s: float | None = None) -> str:
    """The page of an evaluation (as returned by :func:`l5dask.evaluation.evaluate`)."""
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    took = f", computed in {elapsed_s:.1f} s" if elapsed_s is not None else ""
    identity = (
        f"{html.escape(gt)} against {html.escape(pred)}: {result['rows']:,} rows, T = {result['future_len']}, "
        f"M = {result['max_modes']} &middot; computed {now}{took} &middot; l5dask {__version__}"
    )
    scalar = [k for k in METRICS if not isinstance(result[k], list)]
    summary = table_html(
        ["metric", "mean"],
        [[k, "" if result[k] is None else f"{result[k]:.6g}"] for k in scalar]
        + [["prob_true_mode", ", ".join(f"{v:.4f}" for v in result["prob_true_mode"] or [])]],
    )
    body = f'<h2>Metrics</h2>{summary}<h2>Figures</h2><div class="figures">{figures_html(EVALUATION_FIGURES, result)}</div>'
    for key, what in (("by_label", "label"), ("by_scene", "scene")):
        groups = result.get(key)
        if not groups:
            continue
        shown = groups[:MAX_TABLE_ROWS]
        more = (
            f"<p>First {MAX_TABLE_ROWS} of {len(groups):,} (the whole table is in the JSON).</p>"
            if len(groups) > MAX_TABLE_ROWS
            else ""
        )
        body += f"<h2>By {what}</h2>{more}" + table_html(
            [what, "rows"] + scalar,
            [
                [short_label(str(g["name"])), f"{g['rows']:,}"]
                + ["" if g[k] is None else f"{g[k]:.4g}" for k in scalar]
                for g in shown
            ],
        )
    return page("l5dask evaluation", identity, body)
