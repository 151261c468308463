# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The statistics report's per-chunk loops (``l5dask stats``), compiled to C, the GIL released: the
agents' label counts, speed and distance histograms (``agent_columns``, ``_agents.h``), the
distinct tracks per run of a scene (``track_runs``, ``union_sorted``), the label argmax counts
(``argmax_counts``, ``_argmax.h``) and histograms of one column (``uniform_histogram``). Wrapped
by :mod:`l5dask.prediction.kernels`.

What it beats, and by how much: the same definitions in plain numpy (``benchmarks/numpy_reference.py``,
which copies each field out, joins with ``np.repeat`` and sorts for the distinct tracks):
``l5dask stats`` on 30 M agents 2.18 s against 58.9 s, with the columns gathered by ``_gather.pyx``
(``python benchmarks/stats_benchmark.py``); the label argmax read in place from the records
(``_argmax.h``) against numpy's ``argmax(axis=1)`` of the records' field
(``python benchmarks/handwritten_layers.py --part argmax``); ``agent_columns`` 6.3-6.5 ns an agent
(its docstring). When to delete a loop: when a numpy or flox formulation of it runs within 10%
of it in those benchmarks.
"""

import numpy as np

from libc.stdint cimport int8_t, int64_t, uint8_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, qsort
from libc.string cimport memcpy

cdef extern from "_argmax.h":
    Py_ssize_t l5_argmax_f32(const uint8_t* p, Py_ssize_t n) noexcept nogil


cdef extern from "_agents.h":
    void l5_speeds(const float* vx, const float* vy, double* out, Py_ssize_t n) noexcept nogil
    void l5_dists(const double* cx, const double* cy, double ex, double ey, double* out, Py_ssize_t n) noexcept nogil


cdef enum:
    # ids of a run are marked in a table when they span at most this many slots per row (else sorted)
    DENSE_SPAN = 8


cdef inline int64_t _bin(double value, double width, double inv_width, int64_t nbins) noexcept nogil:
    """Bin ``i`` with ``i * width <= value < (i + 1) * width``; the last bin takes the rest (inf
    too); -1 (no bin) for NaN and below 0.

    The product with ``inv_width`` only guesses ``i``; exact comparisons at the edges decide.
    """
    if value >= (nbins - 1) * width:  # overflow (also inf); the last edge is exact
        return nbins - 1
    if not value >= 0.0:  # (below 0, and NaN: no bin)
        return -1
    cdef int64_t i = <int64_t>(value * inv_width)
    if i * width > value:
        i -= 1
    elif (i + 1) * width <= value:
        i += 1
    return i


def uniform_histogram(const double[::1] values, double width, int64_t[::1] out):
    """Add the bins of ``values`` (see ``_bin``) to ``out``."""
    cdef Py_ssize_t i
    cdef int64_t b, nbins = out.shape[0]
    cdef double inv = 1.0 / width
    with nogil:
        for i in range(values.shape[0]):
            b = _bin(values[i], width, inv, nbins)
            if b >= 0:
                out[b] += 1


cdef enum:
    # rows whose speeds and distances are made at once (two arrays on the stack, in L1)
    AGENT_BLOCK = 4096


def agent_columns(const int8_t[::1] label, const float[::1] vx, const float[::1] vy, const double[::1] cx,
                  const double[::1] cy, const int64_t[::1] frame_starts, const double[:, ::1] ego_xy, int64_t lo,
                  double speed_width, double dist_width,
                  int64_t[::1] label_counts, int64_t[::1] speed_hist, int64_t[::1] dist_hist,
                  int64_t[::1] frame_pos, double[::1] speed_out=None, double[::1] dist_out=None):
    """Add one chunk of agents (first row: agent ``lo``), as columns (the label already its argmax),
    to the label counts and both histograms; fill each row's frame position in ``frame_starts``
    (the agent starts of the frames overlapping the chunk: a row's frame is the last that starts
    at or before it); return the sum of the speeds, added in row order. With ``speed_out`` and
    ``dist_out`` (a slot per row), each row's speed and distance to its ego are written there too
    (the columns ``speed`` and ``distance_to_ego`` other analyses of the same pass take: made
    there, not copied there from the stack).

    A block of rows at a time: speeds and distances to the ego are vector loops (``_agents.h``;
    per frame, its ego fixed), then one loop adds them up and counts them: 6.3-6.5 ns an agent against
    8.0 ns for one loop doing it all per agent (interleaved medians over 8 M agents; counting into
    4 copies of each count, to spare a counter its last store's wait, took 6.9 ns). The same
    numbers (``tests/test_kernels.py``: against numpy's definitions)."""
    cdef Py_ssize_t i, k, q, end, stop, j = 0, n = label.shape[0], m = frame_starts.shape[0]
    cdef Py_ssize_t ns = speed_hist.shape[0], nd = dist_hist.shape[0]
    cdef double total = 0.0, s_inv = 1.0 / speed_width, d_inv = 1.0 / dist_width, value
    cdef double speed[AGENT_BLOCK]
    cdef double dist[AGENT_BLOCK]
    cdef int64_t b
    cdef int8_t lmin = 0, lmax = 0
    cdef double* sp = NULL
    cdef double* dp = NULL
    cdef double* sb
    cdef double* db
    if n == 0:
        return 0.0
    if speed_out is not None:
        if speed_out.shape[0] < n:
            raise ValueError("agent_columns: a speed slot per row expected")
        sp = &speed_out[0]
    if dist_out is not None:
        if dist_out.shape[0] < n:
            raise ValueError("agent_columns: a distance slot per row expected")
        dp = &dist_out[0]
    with nogil:
        for i in range(n):  # (every label a slot of the counts: checked here, not by numpy's min and max)
            lmin = min(lmin, label[i])
            lmax = max(lmax, label[i])
        if lmin >= 0 and lmax < label_counts.shape[0]:
            k = 0
            while k < n:
                stop = min(n, k + AGENT_BLOCK)
                # (made where the other analyses take them, when they do: no copy)
                sb = sp + k if sp != NULL else speed
                db = dp + k if dp != NULL else dist
                i = k
                while i < stop:  # a frame's run of rows at a time
                    while j + 1 < m and frame_starts[j + 1] <= lo + i:
                        j += 1
                    end = stop if j + 1 >= m else min(stop, <Py_ssize_t>(frame_starts[j + 1] - lo))
                    for q in range(i, end):
                        frame_pos[q] = j
                    l5_dists(&cx[i], &cy[i], ego_xy[j, 0], ego_xy[j, 1], db + (i - k), end - i)
                    i = end
                l5_speeds(&vx[k], &vy[k], sb, stop - k)
                for i in range(k, stop):
                    value = sb[i - k]
                    total += value
                    label_counts[label[i]] += 1
                    b = _bin(value, speed_width, s_inv, ns)
                    if b >= 0:
                        speed_hist[b] += 1
                    b = _bin(db[i - k], dist_width, d_inv, nd)
                    if b >= 0:
                        dist_hist[b] += 1
                k = stop
    if lmin < 0 or lmax >= label_counts.shape[0]:
        raise ValueError(f"agent_columns: labels from 0 to {label_counts.shape[0] - 1} expected")
    return total


cdef int _cmp_u64(const void* x, const void* y) noexcept nogil:
    cdef uint64_t a = (<const uint64_t*>x)[0], b = (<const uint64_t*>y)[0]
    return (a > b) - (a < b)


cdef Py_ssize_t _distinct_ids(const uint64_t* ids, Py_ssize_t a, Py_ssize_t b, uint64_t lo, uint64_t hi,
                              uint64_t* out) noexcept nogil:
    """The number of distinct ids of rows ``a..b-1`` (``a < b``; the least ``lo``, the greatest ``hi``),
    and with ``out`` the ids themselves there, sorted: a mark per id when they are dense, else a
    sort. -1: no memory."""
    cdef Py_ssize_t i, k = 0
    cdef uint64_t t, v, span
    cdef uint8_t* seen
    cdef uint64_t* tmp
    if hi - lo < <uint64_t>(DENSE_SPAN * (b - a) + 1024):
        span = hi - lo + 1
        seen = <uint8_t*>calloc(span, 1)
        if seen == NULL:
            return -1
        for i in range(a, b):  # (stores only: the count is the table's sum, at most 8 bytes a row)
            seen[ids[i] - lo] = 1
        if out != NULL:
            for v in range(span):
                if seen[v]:
                    out[k] = lo + v
                    k += 1
        else:
            for v in range(span):
                k += seen[v]
        free(seen)
        return k
    tmp = out if out != NULL else <uint64_t*>malloc((b - a) * sizeof(uint64_t))
    if tmp == NULL:
        return -1
    memcpy(tmp, ids + a, (b - a) * sizeof(uint64_t))
    qsort(tmp, b - a, sizeof(uint64_t), _cmp_u64)
    k = 1
    for i in range(1, b - a):
        if tmp[i] != tmp[k - 1]:
            tmp[k] = tmp[i]
            k += 1
    if out == NULL:
        free(tmp)
    return k


def track_runs(const uint64_t[::1] track_ids, const int64_t[::1] frame_pos, const int64_t[::1] frame_scene):
    """Distinct tracks per run of rows of one scene (agents are ordered by scene).

    Row ``i``'s scene is ``frame_scene[frame_pos[i]]``.
    Returns ``(scenes, counts, first_ids, last_ids)``: each run's scene and number of
    distinct ids, and the sorted distinct ids of the first and the last run (those runs
    may go on in the neighbouring chunks).

    One section without the GIL for the whole chunk: a section a run (three, before 2026-11-26)
    cost two threads a wake-up of the other each time they took turns. The outputs are sized by
    the scenes the frames span and by the first and last runs, not by the rows: six arrays of a
    task's rows (35 MB for 640,000) cost each call new pages, 1.7% of the CPU of a run of five
    analyses (``perf``, 2026-11-30).
    """
    cdef Py_ssize_t i, r, nruns = 1, n = track_ids.shape[0], m = frame_scene.shape[0], k = 0
    cdef Py_ssize_t nfirst = 0, nlast = 0, cap
    cdef int problem = 0
    cdef uint64_t t, lo, hi
    cdef uint64_t* first = NULL
    cdef uint64_t* last = NULL
    if n == 0 or frame_pos.shape[0] != n or m == 0:
        raise ValueError("track_runs: a frame position per row, each within frame_scene, is needed")
    # (the runs are at most the scenes the frames span: tens, where the rows are many thousands)
    cap = min(n, max(1, frame_scene[m - 1] - frame_scene[0] + 1))
    cuts, scenes, counts = np.empty(cap + 1, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64)
    bounds = np.empty((cap, 2), np.uint64)
    cdef int64_t[::1] cuts_v = cuts, scenes_v = scenes, counts_v = counts
    cdef uint64_t[:, ::1] bounds_v = bounds
    cdef const uint64_t* ids = &track_ids[0]
    with nogil:
        for i in range(n):
            if frame_pos[i] < 0 or frame_pos[i] >= m:
                problem = 1
                break
        if not problem:
            # the runs, and each run's least and greatest id, in one pass (a row's scene is looked
            # up only where its frame changes)
            cuts_v[0] = 0
            lo = hi = ids[0]
            for i in range(1, n):
                t = ids[i]
                if frame_pos[i] != frame_pos[i - 1] and frame_scene[frame_pos[i]] != frame_scene[frame_pos[i - 1]]:
                    if nruns == cap:  # (more runs than the scenes the frames span: not ordered by scene)
                        problem = 3
                        break
                    bounds_v[nruns - 1, 0], bounds_v[nruns - 1, 1] = lo, hi
                    cuts_v[nruns] = i
                    nruns += 1
                    lo = hi = t
                if t < lo:
                    lo = t
                if t > hi:
                    hi = t
        if not problem:
            bounds_v[nruns - 1, 0], bounds_v[nruns - 1, 1] = lo, hi
            cuts_v[nruns] = n
            first = <uint64_t*>malloc(max(1, cuts_v[1]) * sizeof(uint64_t))
            last = <uint64_t*>malloc(max(1, n - cuts_v[nruns - 1]) * sizeof(uint64_t))
            if first == NULL or last == NULL:
                problem = 2
        if not problem:
            for r in range(nruns):
                scenes_v[r] = frame_scene[frame_pos[cuts_v[r]]]
                lo, hi = bounds_v[r, 0], bounds_v[r, 1]
                if r == 0:
                    k = nfirst = _distinct_ids(ids, cuts_v[r], cuts_v[r + 1], lo, hi, first)
                elif r == nruns - 1:
                    k = nlast = _distinct_ids(ids, cuts_v[r], cuts_v[r + 1], lo, hi, last)
                else:
                    k = _distinct_ids(ids, cuts_v[r], cuts_v[r + 1], lo, hi, NULL)
                if k < 0:
                    problem = 2
                    break
                counts_v[r] = k
    try:
        if problem == 1:
            raise ValueError("track_runs: a frame position per row, each within frame_scene, is needed")
        if problem == 3:
            raise ValueError("track_runs: the frames' scenes increasing expected")
        if problem == 2:
            raise MemoryError()
        first_ids = np.empty(nfirst, np.uint64)
        if nfirst:
            memcpy(<void*><Py_ssize_t>first_ids.ctypes.data, first, nfirst * sizeof(uint64_t))
        if nruns == 1:
            last_ids = first_ids
        else:
            last_ids = np.empty(nlast, np.uint64)
            if nlast:
                memcpy(<void*><Py_ssize_t>last_ids.ctypes.data, last, nlast * sizeof(uint64_t))
    finally:
        free(first)
        free(last)
    return scenes[:nruns].copy(), counts[:nruns].copy(), first_ids, last_ids


def argmax_counts(const uint8_t[::1] buf, Py_ssize_t n, Py_ssize_t stride, Py_ssize_t off, Py_ssize_t ncols,
                  int64_t[::1] counts):
    """Add one to ``counts[argmax(row)]`` for each row of the ``float32[ncols]`` at ``off`` (first maximum, as numpy)."""
    cdef Py_ssize_t i, arg
    if n == 0:
        return
    with nogil:
        for i in range(n):
            arg = l5_argmax_f32(&buf[0] + i * stride + off, ncols)
            if arg < counts.shape[0]:
                counts[arg] += 1


def union_sorted(const uint64_t[::1] a, const uint64_t[::1] b):
    """The union of two sorted arrays of distinct uint64, sorted (a merge: ``np.union1d`` sorts)."""
    result = np.empty(a.shape[0] + b.shape[0], np.uint64)
    cdef uint64_t[::1] out = result
    cdef Py_ssize_t i = 0, j = 0, k = 0
    with nogil:
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
    return result[:k]
