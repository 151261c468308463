"""Figures drawn with matplotlib (imported when a figure is drawn): the axes to draw on, a
histogram of the reports' shape (``{"bin_width", "counts"}``), and a figure as PNG bytes. Each
system's own figures (``plots.py`` of prediction, evaluation, perception) draw with these."""

from __future__ import annotations

import io
from typing import Any

import numpy as np


def axes(ax, size=(7, 3.6)):
    """``ax``, or new axes of a figure of ``size`` inches."""
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=size, layout="constrained")[1]


def histogram(ax, hist: dict, xlabel: str, title: str, color: str, log: bool = False):
    edges = np.asarray(hist["edges"], float)
    counts = np.asarray(hist["counts"])
    width = edges[1] - edges[0]
    ax.bar(edges[:-1], counts[:-1], width=width, align="edge", color=color)
    ax.bar([edges[-1]], [counts[-1]], width=width, align="edge", color="#999999", label=f">= {edges[-1]:g}")
    ax.set_xlabel(xlabel)
    if log and counts.any():
        ax.set_yscale("log")
        ax.set_ylabel("agents (log scale)")
    else:
        ax.set_ylabel("agents")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize=8)
    return ax


#: The margins of a figure drawn with ``fixed_margins``, in inches: left, bottom, right, top.
MARGIN = (0.8, 0.55, 0.35, 0.35)


def figure(draw, report: dict[str, Any], size=(7, 3.6)):
    """One report figure drawn off-screen (a matplotlib ``Figure``): square for a map (a ``draw``
    with a true ``square`` attribute); margins of :data:`MARGIN` for a ``draw`` with a true
    ``fixed_margins`` attribute, else matplotlib's constrained layout."""
    from matplotlib.figure import Figure

    w, h = (6.5, 6.5) if getattr(draw, "square", False) else size
    if getattr(draw, "fixed_margins", False):
        # margins fixed in inches, not a layout engine: matplotlib's constrained layout measures
        # every text twice (a catalog page's 25 histograms: 1.85-2.34 against 1.23-1.37 CPU-s);
        # for figures whose labels are numbers and short names
        fig = Figure(figsize=(w, h))
        ax = fig.add_subplot()
        left, bottom, right, top = MARGIN
        ax.set_position((left / w, bottom / h, 1 - (left + right) / w, 1 - (bottom + top) / h))
    else:
        fig = Figure(figsize=(w, h), layout="constrained")
        ax = fig.add_subplot()
    draw(report, ax=ax)
    return fig


def png(draw, report: dict[str, Any], size=(7, 3.6)) -> bytes:
    """:func:`figure` as PNG bytes."""
    buf = io.BytesIO()
    figure(draw, report, size).savefig(buf, format="png", dpi=96)
    return buf.getvalue()
