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


def png(draw, report: dict[str, Any], size=(7, 3.6)) -> bytes:
    """Draw one report figure off-screen and return it as PNG bytes (square for a map: a ``draw``
    with a true ``square`` attribute)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.5, 6.5) if getattr(draw, "square", False) else size, layout="constrained")
    draw(report, ax=fig.add_subplot())
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96)
    return buf.getvalue()
