"""The figures of an evaluation (the dict of :func:`l5dask.evaluation.evaluate`), for notebooks and
its HTML page alike."""

from __future__ import annotations

from typing import Any

import numpy as np

from l5dask.core.figures import axes
from l5dask.prediction.plots import short_label


def displacement_by_horizon(result: dict[str, Any], ax=None):
    """Expected displacement (``time_displace``) against the prediction horizon."""
    ax = axes(ax)
    td = np.asarray(result["time_displace"], float)
    ax.plot(np.arange(1, len(td) + 1), td, marker=".", color="#3b6ea8")
    ax.set_xlabel("future step")
    ax.set_ylabel("displacement (m)")
    ax.set_title(f"time_displace over {result['rows']:,} rows", fontsize=9)
    return ax


def nll_distribution(result: dict[str, Any], ax=None):
    """Rows by negative multi-log-likelihood (log-spaced bins)."""
    ax = axes(ax)
    h = result["nll_histogram"]
    edges, counts = np.asarray(h["edges"]), np.asarray(h["counts"])
    ax.bar(edges[:-1], counts, width=np.diff(edges), align="edge", color="#8e44ad")
    ax.set_xscale("symlog", linthresh=1e-3)
    ax.set_xlabel("neg_multi_log_likelihood")
    ax.set_ylabel("rows")
    ax.set_title("NLL distribution", fontsize=9)
    return ax


def metrics_by_label(result: dict[str, Any], ax=None):
    """ADE and FDE (oracle) per label, with the rows of each label."""
    ax = axes(ax)
    rows = result.get("by_label") or []
    names = [f"{short_label(r['name'])}\n({r['rows']:,})" for r in rows]
    x = np.arange(len(rows))
    for k, (key, colour) in enumerate(
        (("average_displacement_error_oracle", "#27ae60"), ("final_displacement_error_oracle", "#c0392b"))
    ):
        ax.bar(
            x + (k - 0.5) * 0.4,
            [r[key] or 0 for r in rows],
            width=0.4,
            color=colour,
            label=key.replace("_displacement_error_", " ").replace("average", "ADE").replace("final", "FDE"),
        )
    ax.set_xticks(x, names, fontsize=7)
    ax.set_ylabel("m")
    ax.set_title("by label (rows)" if rows else "by label: give --dataset", fontsize=9)
    ax.legend(fontsize=8)
    return ax


EVALUATION_FIGURES = (
    ("displacement against horizon", displacement_by_horizon),
    ("NLL distribution", nll_distribution),
    ("ADE / FDE by label", metrics_by_label),
)
