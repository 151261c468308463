"""Compiled per-chunk kernels (numba, GIL released): one pass over a chunk's rows.

The numpy formulation of the same maths made many passes over each chunk (argmax over the
17 labels, speed, two histograms, frame lookup); fused here it costs a fraction, and it
releases the GIL so threads scale. Definitions are exactly those of
``shared/spec/statistics-report.md``; ``tests/test_stats.py`` checks them against numpy.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def uniform_bin(value: float, width: float, nbins: int) -> int:
    """Bin ``i`` with ``i * width <= value < (i + 1) * width``; the last bin takes the rest (and NaN)."""
    if value != value:  # NaN
        return nbins - 1
    if value < 0.0:
        return -1
    if value >= (nbins - 1) * width:  # overflow (also inf); the last edge is exact
        return nbins - 1
    i = math.floor(value / width)
    if i * width > value:  # correct the division's rounding with exact comparisons at the edges
        i -= 1
    if (i + 1) * width <= value:
        i += 1
    return int(min(i, nbins - 1))


@njit(nogil=True, cache=True)
def uniform_histogram(values, width, out):
    """Add the bins of ``values`` (see :func:`uniform_bin`) to ``out``."""
    for v in values:
        b = uniform_bin(v, width, out.shape[0])
        if b >= 0:
            out[b] += 1


@njit(nogil=True, cache=True)
def agent_chunk(labels, velocity, centroid, frame_starts, ego_xy, lo, speed_width, dist_width,
                label_counts, speed_hist, dist_hist, frame_pos):
    """Fill the label counts and both histograms, and each row's frame position; return the speed sum.

    ``frame_starts``/``ego_xy`` are the agent starts and ego x/y of the frames overlapping
    the chunk, whose first row is agent ``lo``; ``frame_pos[i]`` gets the position (in
    those frames) of row ``i``'s frame.
    """
    n, nlabels = labels.shape
    m = frame_starts.shape[0]
    j = 0
    while j + 1 < m and frame_starts[j + 1] <= lo:
        j += 1
    speed_sum = 0.0
    for i in range(n):
        best, arg = labels[i, 0], 0
        for k in range(1, nlabels):
            if labels[i, k] > best:
                best, arg = labels[i, k], k
        label_counts[arg] += 1
        vx, vy = np.float64(velocity[i, 0]), np.float64(velocity[i, 1])
        speed = math.sqrt(vx * vx + vy * vy)
        speed_sum += speed
        b = uniform_bin(speed, speed_width, speed_hist.shape[0])
        if b >= 0:
            speed_hist[b] += 1
        while j + 1 < m and frame_starts[j + 1] <= lo + i:
            j += 1
        frame_pos[i] = j
        dx, dy = centroid[i, 0] - ego_xy[j, 0], centroid[i, 1] - ego_xy[j, 1]
        b = uniform_bin(math.sqrt(dx * dx + dy * dy), dist_width, dist_hist.shape[0])
        if b >= 0:
            dist_hist[b] += 1
    return speed_sum
