# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The report's per-chunk loops, compiled to C (GIL released): see :mod:`l5dask.prediction.kernels`.

Records are read in place from their bytes (``buf``), a row every ``stride`` bytes with
each field at a byte offset, so no field is copied out of a decoded chunk. Loads go
through ``memcpy`` (rows of 116 bytes leave most doubles unaligned).

What it beats, and by how much: the same definitions in plain numpy (``benchmarks/numpy_reference.py``,
which copies each field out, joins with ``np.repeat`` and sorts for the distinct tracks):
``l5dask stats`` on 30 M agents 2.18 s against 58.9 s (``python benchmarks/stats_benchmark.py``);
the compressed gather (``_blosc.h``) 1.97-2.11x numcodecs' decode and a gather
(``python benchmarks/compressed_gather.py``); the catalog's loops (``catalog_agents``, ``key_runs``,
``byte_codes``, with the gather's maxima and codes) against its numpy formulation (one sort of packed
(scene, kind, track) keys, face ids decoded and sorted): ``l5dask catalog`` on 30 M agents, the whole
process, 1.6-1.7 s of CPU against 5.6 s (``python benchmarks/catalog_benchmark.py``, 2026-11-27).
When to delete a loop: when a numpy or flox formulation of it runs within 10% of it in those benchmarks.
"""

import numpy as np

from libc.math cimport sqrt
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, qsort
from libc.string cimport memcmp, memcpy, memset

from l5dask.core._records cimport _f4, _f8, _norm2

cdef extern from "_argmax.h":
    Py_ssize_t l5_argmax_f32(const uint8_t* p, Py_ssize_t n) noexcept nogil

cdef extern from "_agents.h":
    void l5_speeds(const float* vx, const float* vy, double* out, Py_ssize_t n) noexcept nogil
    void l5_dists(const double* cx, const double* cy, double ex, double ey, double* out, Py_ssize_t n) noexcept nogil

cdef extern from "_blosc.h":
    ctypedef struct l5_columns:
        Py_ssize_t n
        const int64_t* offsets
        const int64_t* sizes
        const int64_t* dests
        Py_ssize_t m
        const int64_t* aoffsets
        const int64_t* acols
        const int64_t* adests
        const int64_t* vdests
    void l5_gather_records(const uint8_t* buf, Py_ssize_t rows, Py_ssize_t stride, Py_ssize_t row0,
                           const l5_columns* c) noexcept nogil
    ctypedef struct l5_found:
        int64_t off
        int64_t width
        uint8_t* out
        int64_t n
        int32_t* codes
    int l5_found_init(l5_found* f, int64_t rows, int64_t block_rows) noexcept nogil
    void l5_found_free(l5_found* f) noexcept nogil
    int l5_found_add(l5_found* f, const uint8_t* v) noexcept nogil
    int l5_blosc_gather(const uint8_t* src, int64_t srclen, int64_t itemsize, int64_t chunk_rows, int64_t rows,
                        int64_t row0, uint8_t* tmp, int64_t tmpsize, const l5_columns* c,
                        l5_found* found) noexcept nogil
    int64_t l5_blosc_blocksize(const uint8_t* src, int64_t srclen) noexcept nogil

cdef enum:
    # ids of a run are marked in a table when they span at most this many slots per row (else sorted)
    DENSE_SPAN = 8

cdef int64_t FAR = 4611686018427387904  # 2**62: past any row index


cdef inline int64_t _bin(double value, double width, double inv_width, int64_t nbins) noexcept nogil:
    """Bin ``i`` with ``i * width <= value < (i + 1) * width``; the last bin takes the rest (and NaN).

    The product with ``inv_width`` only guesses ``i``; exact comparisons at the edges decide.
    """
    if not value < (nbins - 1) * width:  # overflow (also inf) and NaN; the last edge is exact
        return nbins - 1
    if value < 0.0:
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
                  int64_t[::1] frame_pos):
    """Add one chunk of agents (first row: agent ``lo``), as columns (the label already its argmax),
    to the label counts and both histograms; fill each row's frame position in ``frame_starts``
    (the agent starts of the frames overlapping the chunk: a row's frame is the last that starts
    at or before it); return the sum of the speeds, added in row order.

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
    if n == 0:
        return 0.0
    with nogil:
        for i in range(n):  # (every label a slot of the counts: checked here, not by numpy's min and max)
            lmin = min(lmin, label[i])
            lmax = max(lmax, label[i])
        if lmin >= 0 and lmax < label_counts.shape[0]:
            k = 0
            while k < n:
                stop = min(n, k + AGENT_BLOCK)
                i = k
                while i < stop:  # a frame's run of rows at a time
                    while j + 1 < m and frame_starts[j + 1] <= lo + i:
                        j += 1
                    end = stop if j + 1 >= m else min(stop, <Py_ssize_t>(frame_starts[j + 1] - lo))
                    for q in range(i, end):
                        frame_pos[q] = j
                    l5_dists(&cx[i], &cy[i], ego_xy[j, 0], ego_xy[j, 1], dist + (i - k), end - i)
                    i = end
                l5_speeds(&vx[k], &vy[k], speed, stop - k)
                for i in range(k, stop):
                    value = speed[i - k]
                    total += value
                    label_counts[label[i]] += 1
                    b = _bin(value, speed_width, s_inv, ns)
                    if b >= 0:
                        speed_hist[b] += 1
                    b = _bin(dist[i - k], dist_width, d_inv, nd)
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
    cost two threads a wake-up of the other each time they took turns.
    """
    cdef Py_ssize_t i, r, nruns = 1, n = track_ids.shape[0], m = frame_scene.shape[0], k = 0
    cdef Py_ssize_t nfirst = 0, nlast = 0
    cdef int problem = 0
    cdef uint64_t t, lo, hi
    if n == 0 or frame_pos.shape[0] != n:
        raise ValueError("track_runs: a frame position per row, each within frame_scene, is needed")
    cuts, scenes, counts = np.empty(n + 1, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    first, last, bounds = np.empty(n, np.uint64), np.empty(n, np.uint64), np.empty((n, 2), np.uint64)
    cdef int64_t[::1] cuts_v = cuts, scenes_v = scenes, counts_v = counts
    cdef uint64_t[::1] first_v = first, last_v = last
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
                    bounds_v[nruns - 1, 0], bounds_v[nruns - 1, 1] = lo, hi
                    cuts_v[nruns] = i
                    nruns += 1
                    lo = hi = t
                if t < lo:
                    lo = t
                if t > hi:
                    hi = t
            bounds_v[nruns - 1, 0], bounds_v[nruns - 1, 1] = lo, hi
            cuts_v[nruns] = n
            for r in range(nruns):
                scenes_v[r] = frame_scene[frame_pos[cuts_v[r]]]
                lo, hi = bounds_v[r, 0], bounds_v[r, 1]
                if r == 0:
                    k = nfirst = _distinct_ids(ids, cuts_v[r], cuts_v[r + 1], lo, hi, &first_v[0])
                elif r == nruns - 1:
                    k = nlast = _distinct_ids(ids, cuts_v[r], cuts_v[r + 1], lo, hi, &last_v[0])
                else:
                    k = _distinct_ids(ids, cuts_v[r], cuts_v[r + 1], lo, hi, NULL)
                if k < 0:
                    problem = 2
                    break
                counts_v[r] = k
    if problem == 1:
        raise ValueError("track_runs: a frame position per row, each within frame_scene, is needed")
    if problem == 2:
        raise MemoryError()
    first_ids = first[:nfirst].copy()
    last_ids = first_ids if nruns == 1 else last[:nlast].copy()
    return scenes[:nruns].copy(), counts[:nruns].copy(), first_ids, last_ids


def distinct_rows(const uint8_t[::1] buf, Py_ssize_t n, Py_ssize_t stride, Py_ssize_t off, Py_ssize_t width):
    """Indices of the first occurrence of each distinct value of the ``width`` bytes at ``off``.

    The set of ``_distinct.h`` (the compressed gather's): an open-addressing hash table whose
    values that hash alike are compared byte for byte, so the result is exact whatever the hash does.
    """
    cdef l5_found f
    cdef Py_ssize_t i, k = 0
    result = np.empty(n, np.int64)
    cdef int64_t[::1] out = result
    if n == 0:
        return result
    if width == 0:  # (one value, empty)
        out[0] = 0
        return result[:1]
    if width < 0 or off < 0 or buf.shape[0] < (n - 1) * stride + off + width:
        raise ValueError("distinct_rows: a field within each row expected")
    memset(&f, 0, sizeof(f))
    f.off, f.width = off, width
    f.out = <uint8_t*>malloc(n * width)
    if f.out == NULL or l5_found_init(&f, n, 0) != 0:
        free(f.out)
        raise MemoryError()
    with nogil:
        for i in range(n):
            if l5_found_add(&f, &buf[0] + i * stride + off):
                out[k] = i
                k += 1
    l5_found_free(&f)
    free(f.out)
    return result[:k]


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


def argmax_rows(const uint8_t[::1] buf, Py_ssize_t n, Py_ssize_t stride, Py_ssize_t off, Py_ssize_t ncols,
                int8_t[::1] out):
    """``out[i] = argmax(row i)`` of the ``float32[ncols]`` at ``off`` (first maximum, as numpy; ncols <= 127)."""
    cdef Py_ssize_t i
    if n == 0:
        return
    with nogil:
        for i in range(n):
            out[i] = <int8_t>l5_argmax_f32(&buf[0] + i * stride + off, ncols)


def group_reduce(const int64_t[::1] codes, const double[::1] values, int64_t[::1] count, double[::1] total,
                 double[::1] lo, double[::1] hi, bint want_sum, bint want_min, bint want_max):
    """Per group ``codes[i]``: add each value that is not NaN to ``count`` (and ``total``), and
    take it into ``lo``/``hi`` (minimum, maximum): one pass over the rows, in place."""
    cdef Py_ssize_t i, n = codes.shape[0]
    cdef int64_t g
    cdef double v
    with nogil:
        for i in range(n):
            v = values[i]
            if v != v:
                continue
            g = codes[i]
            count[g] += 1
            if want_sum:
                total[g] += v
            if want_min and not v >= lo[g]:
                lo[g] = v
            if want_max and not v <= hi[g]:
                hi[g] = v


ctypedef fused int_t:
    int8_t
    int16_t
    int32_t
    int64_t
    uint8_t
    uint16_t
    uint32_t


def int_range(const int_t[::1] k):
    """``(min, max)`` of a non-empty integer column, in one pass."""
    cdef Py_ssize_t i, n = k.shape[0]
    if n == 0:
        raise ValueError("int_range of no values")
    cdef int_t lo = k[0], hi = k[0], v
    with nogil:
        for i in range(1, n):
            v = k[i]
            if v < lo:
                lo = v
            elif v > hi:
                hi = v
    return int(lo), int(hi)


def mix_codes(int64_t[::1] codes, const int_t[::1] k, int64_t lo, int64_t stride):
    """``codes += (k - lo) * stride`` in one pass, without widening ``k`` first (mixed-radix group
    codes, a key at a time)."""
    cdef Py_ssize_t i, n = codes.shape[0]
    if k.shape[0] != n:
        raise ValueError("mix_codes: a key per code is needed")
    with nogil:
        for i in range(n):
            codes[i] += (<int64_t>k[i] - lo) * stride


cdef l5_columns _columns(const int64_t[::1] offsets, const int64_t[::1] sizes, const int64_t[::1] dests,
                        const int64_t[::1] argmax_offsets, const int64_t[::1] argmax_ncols,
                        const int64_t[::1] argmax_dests, const int64_t[::1] argmax_values):
    cdef l5_columns c
    if sizes.shape[0] != offsets.shape[0] or dests.shape[0] != offsets.shape[0] or \
            argmax_ncols.shape[0] != argmax_offsets.shape[0] or argmax_dests.shape[0] != argmax_offsets.shape[0] or \
            (argmax_values is not None and argmax_values.shape[0] != argmax_offsets.shape[0]):
        raise ValueError("gather: one offset, size and output per column expected")
    c.n, c.m = offsets.shape[0], argmax_offsets.shape[0]
    c.offsets = &offsets[0] if c.n else NULL
    c.sizes = &sizes[0] if c.n else NULL
    c.dests = &dests[0] if c.n else NULL
    c.aoffsets = &argmax_offsets[0] if c.m else NULL
    c.acols = &argmax_ncols[0] if c.m else NULL
    c.adests = &argmax_dests[0] if c.m else NULL
    c.vdests = &argmax_values[0] if c.m and argmax_values is not None else NULL
    return c


def gather_fields(const uint8_t[::1] buf, Py_ssize_t n, Py_ssize_t stride, const int64_t[::1] offsets,
                  const int64_t[::1] sizes, const int64_t[::1] dests, const int64_t[::1] argmax_offsets,
                  const int64_t[::1] argmax_ncols, const int64_t[::1] argmax_dests,
                  const int64_t[::1] argmax_values=None):
    """In one pass over the rows: copy the ``sizes[j]`` bytes at ``offsets[j]`` of each row to
    row ``i`` of the contiguous output at address ``dests[j]``, and write the argmax (int8) of the
    ``float32[argmax_ncols[j]]`` at ``argmax_offsets[j]`` to the output at ``argmax_dests[j]``
    (and its maximum, float32, to the output at ``argmax_values[j]`` where that is not 0)."""
    cdef l5_columns c = _columns(offsets, sizes, dests, argmax_offsets, argmax_ncols, argmax_dests, argmax_values)
    if n == 0:
        return
    if buf.shape[0] < n * stride:
        raise ValueError("gather_fields: the buffer holds fewer rows than asked")
    with nogil:
        l5_gather_records(&buf[0], n, stride, 0, &c)


def blosc_blocksize(const uint8_t[::1] raw):
    """The block size in the header of a blosc chunk (0: none)."""
    return l5_blosc_blocksize(&raw[0], raw.shape[0]) if raw.shape[0] else 0


def gather_blosc(const uint8_t[::1] raw, Py_ssize_t itemsize, Py_ssize_t chunk_rows, Py_ssize_t rows,
                 Py_ssize_t row0, uint8_t[::1] scratch, const int64_t[::1] offsets, const int64_t[::1] sizes,
                 const int64_t[::1] dests, const int64_t[::1] argmax_offsets, const int64_t[::1] argmax_ncols,
                 const int64_t[::1] argmax_dests, Py_ssize_t distinct_offset=0, Py_ssize_t distinct_width=0,
                 uint8_t[::1] found=None, const int64_t[::1] argmax_values=None, int32_t[::1] codes=None):
    """As :func:`gather_fields` for the first ``rows`` records of one blosc-compressed chunk of
    ``chunk_rows`` records, into rows ``row0 ..`` of the outputs, straight from the compressed
    bytes (``_blosc.h``; ``scratch``: a block), and (``distinct_width`` > 0) the distinct values
    of the field of that many bytes at ``distinct_offset`` of those rows into ``found`` (room for
    ``rows`` of them; ``_distinct.h``), and with ``codes`` (room for ``row0 + rows``), each row's
    value's index among them. ``(status, values found)``; status 0: done; 1: not a chunk
    of this kind; -1: corrupt (then nothing is promised of the outputs: the caller decodes the
    chunk with numcodecs)."""
    cdef l5_columns c = _columns(offsets, sizes, dests, argmax_offsets, argmax_ncols, argmax_dests, argmax_values)
    cdef l5_found f
    cdef l5_found* fp = NULL
    cdef int status
    if raw.shape[0] == 0:
        return -1, 0
    if distinct_width > 0:
        if distinct_offset < 0 or distinct_offset + distinct_width > itemsize or found is None or \
                found.shape[0] < rows * distinct_width or rows < 0:
            raise ValueError("gather_blosc: a field within the record, and room for a value per row, expected")
        memset(&f, 0, sizeof(f))
        f.off, f.width, f.out = distinct_offset, distinct_width, &found[0] if found.shape[0] else NULL
        if codes is not None:
            if codes.shape[0] < row0 + rows:
                raise ValueError("gather_blosc: room for a code per row expected")
            f.codes = &codes[0]
        if l5_found_init(&f, rows, scratch.shape[0] // itemsize if itemsize > 0 else 0) != 0:
            raise MemoryError()
        fp = &f
    with nogil:
        status = l5_blosc_gather(&raw[0], raw.shape[0], itemsize, chunk_rows, rows, row0,
                                 &scratch[0] if scratch.shape[0] else NULL, scratch.shape[0], &c, fp)
    if fp != NULL:
        l5_found_free(fp)
        return status, f.n
    return status, 0


def norm2_fma(const double[::1] x, const double[::1] y, double[::1] out):
    """``sqrt(fma(y, y, x * x))`` per element: ``np.linalg.norm`` of a 2-vector as numpy computes
    it (its ``dot`` is OpenBLAS's ddot, which fuses the multiply-add on FMA hardware)."""
    cdef Py_ssize_t i, n = x.shape[0]
    with nogil:
        for i in range(n):
            out[i] = _norm2(x[i], y[i])


def norm2_f32(const float[::1] x, const float[::1] y, double[::1] out):
    """``sqrt(x * x + y * y)`` in float64 of float32 pairs, as numpy computes it from the arrays
    cast to float64 (multiply, multiply, add, sqrt: built with ``-ffp-contract=off``), in one pass."""
    cdef Py_ssize_t i, n = x.shape[0]
    cdef double a, b
    if y.shape[0] != n or out.shape[0] != n:
        raise ValueError("norm2_f32: arrays of one length expected")
    with nogil:
        for i in range(n):
            a = x[i]
            b = y[i]
            out[i] = sqrt(a * a + b * b)


def range_codes(const int_t[::1] k, int64_t lo, int64_t n, int64_t[::1] out):
    """``k - lo`` where it is in ``[0, n)``, else -1, as int64, in one pass (a group code of
    integer labels ``lo .. lo + n - 1``)."""
    cdef Py_ssize_t i, m = k.shape[0]
    cdef int64_t v
    if out.shape[0] != m:
        raise ValueError("range_codes: a code per value is needed")
    with nogil:
        for i in range(m):
            v = <int64_t>k[i] - lo
            out[i] = v if 0 <= v < n else -1


def distance_to_parent(const double[::1] x, const double[::1] y, const double[:, ::1] parent_xy,
                       const int64_t[::1] pos, double[::1] out):
    """``sqrt(dx * dx + dy * dy)``, ``dx = x[i] - parent_xy[pos[i], 0]`` (``dy`` likewise with column
    1), in float64 as numpy computes it from the parent's columns taken per row, in one pass."""
    cdef Py_ssize_t i, n = x.shape[0], m = parent_xy.shape[0]
    cdef double dx, dy
    cdef int64_t p
    if y.shape[0] != n or pos.shape[0] != n or out.shape[0] != n or parent_xy.shape[1] < 2:
        raise ValueError("distance_to_parent: x, y, pos and out of one length, parent rows (m, >= 2)")
    for i in range(n):
        if not 0 <= pos[i] < m:
            raise IndexError(f"distance_to_parent: row {i} has parent position {pos[i]}, not in [0, {m})")
    with nogil:
        for i in range(n):
            p = pos[i]
            dx = x[i] - parent_xy[p, 0]
            dy = y[i] - parent_xy[p, 1]
            out[i] = sqrt(dx * dx + dy * dy)



# --- the scene catalog (l5dask.prediction.catalog) ----------------------------------------
cdef extern from "_distinct.h":
    uint64_t l5_hash_bytes(const uint8_t* v, int64_t width) noexcept nogil

cdef extern from *:
    int __builtin_ctzll(unsigned long long) nogil


cdef int _cmp_key(const void* x, const void* y) noexcept nogil:
    cdef uint64_t a = (<const uint64_t*>x)[0], b = (<const uint64_t*>y)[0]
    return (a > b) - (a < b)


cdef Py_ssize_t _mask_run(const uint64_t* keys, const uint64_t* masks, Py_ssize_t a, Py_ssize_t b,
                          int64_t* counts, uint64_t* out) noexcept nogil:
    """The distinct keys of rows ``a..b-1`` (``a < b``), each with the OR of its rows' masks (keys
    whose masks are all 0 are left out): ``counts[bit]`` gains one per key whose mask has that bit,
    and with ``out``, the keys and masks are written there (key, mask: two words a key, sorted
    by key). A table of masks per key when the keys are dense (``DENSE_SPAN``), else a sort of
    (key, mask) pairs. Returns how many keys, -1 out of memory."""
    cdef Py_ssize_t i, k = 0
    cdef uint64_t lo = keys[a], hi = keys[a], v, span, m
    cdef uint64_t* table
    cdef uint64_t* tmp
    for i in range(a, b):
        if keys[i] < lo:
            lo = keys[i]
        if keys[i] > hi:
            hi = keys[i]
    if hi - lo < <uint64_t>(DENSE_SPAN * (b - a) + 1024):
        span = hi - lo + 1
        table = <uint64_t*>calloc(span, sizeof(uint64_t))
        if table == NULL:
            return -1
        for i in range(a, b):
            table[keys[i] - lo] |= masks[i]
        for v in range(span):
            m = table[v]
            if m == 0:
                continue
            if out != NULL:
                out[2 * k], out[2 * k + 1] = lo + v, m
            k += 1
            while m:
                counts[__builtin_ctzll(m)] += 1
                m &= m - 1
        free(table)
        return k
    tmp = <uint64_t*>malloc((b - a) * 2 * sizeof(uint64_t))
    if tmp == NULL:
        return -1
    for i in range(a, b):
        tmp[2 * (i - a)], tmp[2 * (i - a) + 1] = keys[i], masks[i]
    qsort(tmp, b - a, 2 * sizeof(uint64_t), _cmp_key)
    i = 0
    while i < b - a:
        v, m = tmp[2 * i], tmp[2 * i + 1]
        i += 1
        while i < b - a and tmp[2 * i] == v:
            m |= tmp[2 * i + 1]
            i += 1
        if m == 0:
            continue
        if out != NULL:
            out[2 * k], out[2 * k + 1] = v, m
        k += 1
        while m:
            counts[__builtin_ctzll(m)] += 1
            m &= m - 1
    free(tmp)
    return k


def key_runs(const uint64_t[::1] keys, const uint64_t[::1] masks, const int64_t[::1] cuts, Py_ssize_t nbits):
    """Per run of rows (``cuts[r] .. cuts[r + 1] - 1``, ``cuts`` increasing from 0 to the rows),
    the distinct keys, each with the OR of its rows' masks (bits ``0 .. nbits - 1``): ``(counts,
    first, last)``, ``counts[r, bit]`` the keys of run ``r`` whose mask has that bit, ``first`` and
    ``last`` the ``(keys, masks)`` of the first and the last run (sorted by key: those runs may go
    on in the neighbouring chunks). Keys whose masks are all 0 count nowhere."""
    cdef Py_ssize_t r, k, n = keys.shape[0], nruns = cuts.shape[0] - 1, nfirst = 0, nlast = 0
    cdef int problem = 0
    cdef uint64_t every = 0
    if masks.shape[0] != n or nruns < 1 or cuts[0] != 0 or cuts[nruns] != n or not 0 < nbits <= 64:
        raise ValueError("key_runs: a mask per key, runs from 0 to the rows, 1 to 64 bits expected")
    counts = np.zeros((nruns, nbits), np.int64)
    first, last = np.empty((n, 2), np.uint64), np.empty((n, 2), np.uint64)
    cdef int64_t[:, ::1] counts_v = counts
    cdef uint64_t[:, ::1] first_v = first, last_v = last
    with nogil:
        for r in range(nruns):
            if cuts[r + 1] <= cuts[r]:
                problem = 1
                break
        for r in range(n):
            every |= masks[r]
        if nbits < 64 and every >> nbits:
            problem = 1
        if not problem and n:
            for r in range(nruns):
                if r == 0:
                    k = nfirst = _mask_run(&keys[0], &masks[0], cuts[r], cuts[r + 1], &counts_v[r, 0], &first_v[0, 0])
                elif r == nruns - 1:
                    k = nlast = _mask_run(&keys[0], &masks[0], cuts[r], cuts[r + 1], &counts_v[r, 0], &last_v[0, 0])
                else:
                    k = _mask_run(&keys[0], &masks[0], cuts[r], cuts[r + 1], &counts_v[r, 0], NULL)
                if k < 0:
                    problem = 2
                    break
    if problem == 1:
        raise ValueError("key_runs: runs of at least a row, masks within the bits, expected")
    if problem == 2:
        raise MemoryError()
    head = (first[:nfirst, 0].copy(), first[:nfirst, 1].copy())
    tail = head if nruns == 1 else (last[:nlast, 0].copy(), last[:nlast, 1].copy())
    return counts, head, tail


def catalog_agents(const int8_t[::1] label, const float[::1] top, const double[::1] cx, const double[::1] cy,
                   const int64_t[::1] frame_starts, const double[:, ::1] ego_xy, const int64_t[::1] frame_scene,
                   int64_t lo, const int8_t[::1] groups, double near0, double near1, float low,
                   uint64_t[::1] masks):
    """The catalog's per-agent work, one pass over a chunk of agents (first row ``lo``, ordered by
    frame; ``frame_starts``, ``ego_xy``, ``frame_scene``: the agent start, ego x/y and scene of the
    frames overlapping them): each row's mask (bit ``label``; bit ``L + g`` when its label's group
    ``g = groups[label]`` (0, 1, 2; -1 none) is within ``near0`` of the ego, ``L + 3 + g`` within
    ``near1``, ``L`` the number of labels: distances ``sqrt(dx * dx + dy * dy)``, as numpy's), and
    per run of rows of one scene: ``(cuts, scenes, mins, lows)``, the runs' bounds and scenes, the
    least distance of group 1 and of group 2 (inf: none) and the rows whose ``top`` (the label's
    probability) is under ``low``."""
    cdef Py_ssize_t i, j = 0, r = 0, n = label.shape[0], m = frame_starts.shape[0], nl = groups.shape[0]
    cdef int problem = 0
    cdef int8_t l, g
    cdef int64_t scene
    cdef double d, dx, dy
    cdef uint64_t mk
    if n == 0 or m == 0 or ego_xy.shape[0] != m or frame_scene.shape[0] != m or masks.shape[0] < n or \
            top.shape[0] != n or cx.shape[0] != n or cy.shape[0] != n or nl + 6 > 64 or frame_starts[0] > lo:
        raise ValueError("catalog_agents: columns of the rows, their frames, at most 58 labels and a mask a row expected")
    cuts, scenes = np.empty(n + 1, np.int64), np.empty(n, np.int64)
    mins, lows = np.full((n, 2), np.inf), np.zeros(n, np.int64)
    cdef int64_t[::1] cuts_v = cuts, scenes_v = scenes, lows_v = lows
    cdef double[:, ::1] mins_v = mins
    with nogil:
        for i in range(n):
            while j + 1 < m and frame_starts[j + 1] <= lo + i:
                j += 1
            scene = frame_scene[j]
            if i == 0 or scene != scenes_v[r - 1]:
                cuts_v[r], scenes_v[r] = i, scene
                r += 1
            l = label[i]
            if l < 0 or l >= nl:
                problem = 1
                break
            mk = (<uint64_t>1) << l
            g = groups[l]
            if g >= 0:
                dx, dy = cx[i] - ego_xy[j, 0], cy[i] - ego_xy[j, 1]
                d = sqrt(dx * dx + dy * dy)
                if d <= near0:
                    mk |= (<uint64_t>1) << (nl + g)
                if d <= near1:
                    mk |= (<uint64_t>1) << (nl + 3 + g)
                if (g == 1 or g == 2) and d < mins_v[r - 1, g - 1]:
                    mins_v[r - 1, g - 1] = d
            masks[i] = mk
            if top[i] < low:
                lows_v[r - 1] += 1
        cuts_v[r] = n
    if problem:
        raise ValueError(f"catalog_agents: labels from 0 to {nl - 1} expected")
    return cuts[: r + 1].copy(), scenes[:r].copy(), mins[:r].copy(), lows[:r].copy()


def byte_codes(const uint8_t[:, ::1] values):
    """Codes of values compared as bytes (a row each): ``(codes, first)``, each row's code (its
    value's rank of first appearance) and the first row of each value. An open-addressing table
    whose values that hash alike are compared byte for byte: exact whatever the hash does."""
    cdef Py_ssize_t i, s, n = values.shape[0], w = values.shape[1], k = 0
    cdef int64_t cap = 16, mask, j
    cdef int64_t* table
    codes, first = np.empty(n, np.int64), np.empty(n, np.int64)
    cdef int64_t[::1] codes_v = codes, first_v = first
    if n == 0:
        return codes, first[:0]
    while cap < 2 * n:
        cap <<= 1
    mask = cap - 1
    table = <int64_t*>malloc(cap * sizeof(int64_t))
    if table == NULL:
        raise MemoryError()
    with nogil:
        memset(table, 0xff, cap * sizeof(int64_t))
        for i in range(n):
            s = <Py_ssize_t>(l5_hash_bytes(&values[i, 0], w) & <uint64_t>mask) if w else 0
            while True:
                j = table[s]
                if j < 0:
                    table[s] = k
                    first_v[k] = i
                    codes_v[i] = k
                    k += 1
                    break
                if w == 0 or memcmp(&values[first_v[j], 0], &values[i, 0], w) == 0:
                    codes_v[i] = j
                    break
                s = (s + 1) & mask
    free(table)
    return codes, first[:k].copy()


def union_masks(const uint64_t[::1] a, const uint64_t[::1] am, const uint64_t[::1] b, const uint64_t[::1] bm):
    """The union of two sorted arrays of distinct keys, each with its mask (a key in both: the OR
    of its masks): ``(keys, masks)``, sorted (a merge, as :func:`union_sorted`)."""
    if am.shape[0] != a.shape[0] or bm.shape[0] != b.shape[0]:
        raise ValueError("union_masks: a mask per key expected")
    keys, masks = np.empty(a.shape[0] + b.shape[0], np.uint64), np.empty(a.shape[0] + b.shape[0], np.uint64)
    cdef uint64_t[::1] ko = keys, mo = masks
    cdef Py_ssize_t i = 0, j = 0, k = 0
    with nogil:
        while i < a.shape[0] and j < b.shape[0]:
            if a[i] < b[j]:
                ko[k], mo[k] = a[i], am[i]
                i += 1
            elif b[j] < a[i]:
                ko[k], mo[k] = b[j], bm[j]
                j += 1
            else:
                ko[k], mo[k] = a[i], am[i] | bm[j]
                i += 1
                j += 1
            k += 1
        while i < a.shape[0]:
            ko[k], mo[k] = a[i], am[i]
            i += 1
            k += 1
        while j < b.shape[0]:
            ko[k], mo[k] = b[j], bm[j]
            j += 1
            k += 1
    return keys[:k], masks[:k]


def mask_counts(const uint64_t[::1] masks, Py_ssize_t nbits):
    """How many masks have each of bits ``0 .. nbits - 1`` (int64)."""
    if not 0 < nbits <= 64:
        raise ValueError("mask_counts: 1 to 64 bits expected")
    counts = np.zeros(64, np.int64)
    cdef int64_t[::1] c = counts
    cdef Py_ssize_t i
    cdef uint64_t m
    with nogil:
        for i in range(masks.shape[0]):
            m = masks[i]
            while m:
                c[__builtin_ctzll(m)] += 1
                m &= m - 1
    if counts[nbits:].any():
        raise ValueError("mask_counts: masks beyond the bits")
    return counts[:nbits].copy()
