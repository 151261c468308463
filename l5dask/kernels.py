"""Compiled per-chunk kernels (numba, GIL released): one pass over a chunk's rows.

The kernels read the decoded records in place (numba compiles field access to fixed
offsets from each row), so no field is copied out of a chunk. The numpy formulation of
the same maths made many passes over each chunk (argmax over the 17 labels, speed, two
histograms, frame lookup, a sort per scene for distinct tracks); fused here it costs a
fraction, and it releases the GIL so threads scale. Definitions are exactly those of
``shared/spec/statistics-report.md``; ``tests/test_stats.py`` checks them against numpy.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

#: No more than this many distinct-id slots are allocated per row of a run (else: sort).
_DENSE_SPAN = 8


@njit(nogil=True, cache=True, inline="always")
def uniform_bin(value: float, width: float, inv_width: float, nbins: int) -> int:
    """Bin ``i`` with ``i * width <= value < (i + 1) * width``; the last bin takes the rest (and NaN).

    The product with ``inv_width`` only guesses ``i``; exact comparisons at the edges decide.
    """
    if not value < (nbins - 1) * width:  # overflow (also inf) and NaN; the last edge is exact
        return nbins - 1
    if value < 0.0:
        return -1
    i = int(value * inv_width)
    if i * width > value:
        i -= 1
    elif (i + 1) * width <= value:
        i += 1
    return i


@njit(nogil=True, cache=True)
def uniform_histogram(values, width, out):
    """Add the bins of ``values`` (see :func:`uniform_bin`) to ``out``."""
    inv = 1.0 / width
    for v in values:
        b = uniform_bin(v, width, inv, out.shape[0])
        if b >= 0:
            out[b] += 1


@njit(nogil=True, cache=True)
def agent_chunk(rec, frame_starts, ego_xy, lo, speed_width, dist_width,
                label_counts, speed_hist, dist_hist, frame_pos):
    """Fill the label counts and both histograms, and each row's frame position; return the speed sum.

    ``rec`` are agent records (fields ``label_probabilities``, ``velocity``, ``centroid``),
    the first being agent ``lo``; ``frame_starts``/``ego_xy`` are the agent starts and ego
    x/y of the frames overlapping the chunk; ``frame_pos[i]`` gets the position (in those
    frames) of row ``i``'s frame.
    """
    n = rec.shape[0]
    m = frame_starts.shape[0]
    nlabels = label_counts.shape[0]
    ns, nd = speed_hist.shape[0], dist_hist.shape[0]
    s_inv, d_inv = 1.0 / speed_width, 1.0 / dist_width
    big = np.int64(1) << 62
    j = 0
    while j + 1 < m and frame_starts[j + 1] <= lo:
        j += 1
    nxt = frame_starts[j + 1] if j + 1 < m else big
    speed_sum = 0.0
    for i in range(n):
        r = rec[i]
        lp = r.label_probabilities
        best, arg = lp[0], 0
        for k in range(1, nlabels):
            v = lp[k]
            if v > best:
                best = v
                arg = k
        label_counts[arg] += 1
        vx, vy = np.float64(r.velocity[0]), np.float64(r.velocity[1])
        speed = math.sqrt(vx * vx + vy * vy)
        speed_sum += speed
        b = uniform_bin(speed, speed_width, s_inv, ns)
        if b >= 0:
            speed_hist[b] += 1
        while lo + i >= nxt:
            j += 1
            nxt = frame_starts[j + 1] if j + 1 < m else big
        frame_pos[i] = j
        dx = np.float64(r.centroid[0]) - ego_xy[j, 0]
        dy = np.float64(r.centroid[1]) - ego_xy[j, 1]
        b = uniform_bin(math.sqrt(dx * dx + dy * dy), dist_width, d_inv, nd)
        if b >= 0:
            dist_hist[b] += 1
    return speed_sum


@njit(nogil=True, cache=True)
def _distinct_ids(rec, a, b):
    """The sorted distinct ``track_id`` of rows ``a..b-1``: a mark per id when ids are dense, else a sort."""
    lo = np.uint64(rec[a].track_id)
    hi = lo
    for i in range(a + 1, b):
        t = np.uint64(rec[i].track_id)
        lo = min(lo, t)
        hi = max(hi, t)
    if hi - lo < np.uint64(_DENSE_SPAN * (b - a) + 1024):
        span = np.int64(hi - lo) + 1
        seen = np.zeros(span, np.bool_)
        for i in range(a, b):
            seen[np.int64(np.uint64(rec[i].track_id) - lo)] = True
        out = np.empty(np.int64(seen.sum()), np.uint64)
        k = 0
        for v in range(span):
            if seen[v]:
                out[k] = lo + np.uint64(v)
                k += 1
        return out
    ids = np.empty(b - a, np.uint64)
    for i in range(a, b):
        ids[i - a] = rec[i].track_id
    return np.unique(ids)


@njit(nogil=True, cache=True)
def track_runs(rec, frame_pos, frame_scene):
    """Distinct tracks per run of rows of one scene (agents are ordered by scene).

    Returns ``(scenes, counts, first_ids, last_ids)``: each run's scene and number of
    distinct ``track_id``, and the sorted distinct ids of the first and the last run
    (those runs may continue in the neighbouring chunks).
    """
    n = rec.shape[0]
    nruns = 1
    for i in range(1, n):
        if frame_scene[frame_pos[i]] != frame_scene[frame_pos[i - 1]]:
            nruns += 1
    cuts = np.empty(nruns + 1, np.int64)
    cuts[0], cuts[nruns] = 0, n
    r = 1
    for i in range(1, n):
        if frame_scene[frame_pos[i]] != frame_scene[frame_pos[i - 1]]:
            cuts[r] = i
            r += 1
    # (one pass for the cuts, then one per run: a single fused loop ran 4x slower)
    scenes = np.empty(nruns, np.int64)
    counts = np.empty(nruns, np.int64)
    first_ids = _distinct_ids(rec, cuts[0], cuts[1])
    last_ids = first_ids if nruns == 1 else _distinct_ids(rec, cuts[nruns - 1], cuts[nruns])
    for k in range(nruns):
        scenes[k] = frame_scene[frame_pos[cuts[k]]]
        if k == 0:
            counts[k] = first_ids.shape[0]
        elif k == nruns - 1:
            counts[k] = last_ids.shape[0]
        else:
            counts[k] = _distinct_ids(rec, cuts[k], cuts[k + 1]).shape[0]
    return scenes, counts, first_ids, last_ids


@njit(nogil=True, cache=True)
def distinct_rows(words, c0, c1):
    """Indices of the first occurrence of each distinct row of ``words[:, c0:c1]``.

    An open-addressing hash table of row indices; rows that hash alike are compared word by
    word, so the result is exact whatever the hash does.
    """
    n = words.shape[0]
    size = 16
    while size < 2 * n:
        size *= 2
    table = np.full(size, -1, np.int64)
    out = np.empty(n, np.int64)
    k = 0
    for i in range(n):
        h = np.uint64(14695981039346656037)
        for c in range(c0, c1):
            h = (h ^ np.uint64(words[i, c])) * np.uint64(1099511628211)
        slot = np.int64(h >> np.uint64(33)) & (size - 1)
        while True:
            t = table[slot]
            if t < 0:
                table[slot] = i
                out[k] = i
                k += 1
                break
            same = True
            for c in range(c0, c1):
                if words[t, c] != words[i, c]:
                    same = False
                    break
            if same:
                break
            slot = (slot + 1) & (size - 1)
    return out[:k]


@njit(nogil=True, cache=True)
def argmax_counts(values, counts):
    """Add one to ``counts[argmax(row)]`` for each row of ``values`` (first maximum, as numpy)."""
    for i in range(values.shape[0]):
        best, arg = values[i, 0], 0
        for k in range(1, values.shape[1]):
            if values[i, k] > best:
                best, arg = values[i, k], k
        if arg < counts.shape[0]:
            counts[arg] += 1


@njit(nogil=True, cache=True)
def union_sorted(a, b):
    """The union of two sorted arrays of distinct values, sorted (a merge: ``np.union1d`` sorts)."""
    out = np.empty(a.shape[0] + b.shape[0], a.dtype)
    i = j = k = 0
    while i < a.shape[0] and j < b.shape[0]:
        if a[i] < b[j]:
            out[k] = a[i]
            i += 1
        elif b[j] < a[i]:
            out[k] = b[j]
            j += 1
        else:
            out[k] = a[i]
            i += 1
            j += 1
        k += 1
    while i < a.shape[0]:
        out[k] = a[i]
        i += 1
        k += 1
    while j < b.shape[0]:
        out[k] = b[j]
        j += 1
        k += 1
    return out[:k]
