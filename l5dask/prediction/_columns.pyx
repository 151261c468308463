# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The aggregate's per-row loops, compiled to C, the GIL released: derived columns
(``norm2_f32``: speeds; ``distance_to_parent``: distances to the ego of each row's frame;
``distance_to_runs``: the same of rows in runs, one per frame), group
codes (``range_codes``), the per-group count, sum, minimum and maximum
(``group_reduce``; ``keyed_reduce`` without the codes made whole) and the quantile sketch's counts
per (group, bucket) (``sketch_range``, ``sketch_counts``; ``Sketch`` where their table would be too
large, ``merge_sketches`` of two partials'). Wrapped by
:mod:`l5dask.prediction.kernels`; used by ``aggregate``, the dataframes' columns and the xarray
accessor.

What it beats, and by how much: the numpy a user writes for the same values, on 200,000 rows, one
thread (``python benchmarks/prediction_kernels.py``, best of 30 interleaved rounds, the results
checked equal; 2026-11-27, at load 8): ``group_reduce`` 4.6x (``np.bincount``, ``np.minimum.at``,
``np.maximum.at``), ``range_codes`` 4.5x (``np.where``), ``distance_to_parent``
9.0x (the parent's columns taken per row), ``norm2_f32`` 10.6x (casts and the formula). On
160,000 rows (a task's block of agents; same benchmark, 2026-11-27, load 3-6): the sketch
(``groupby._sketch``: numpy's minimum and maximum, then ``sketch_counts``, the groups' rows counted
in the same pass) 2.57x the numpy it replaced (0.98 against 2.53 ms: ``np.bincount`` of the rows,
the float64 bits shifted, their range, ``np.bincount`` of group and bucket); ``keyed_reduce`` (the
count, sum and rows of two keys' groups, their codes made 2,048 rows at a time) 2.18x numpy's codes
and ``np.bincount`` (0.40 against 0.88 ms), 1.1x the codes made whole then
``group_reduce`` (0.37 against 0.41 ms). ``distance_to_parent`` with its roots in a loop of their own
(a vector loop): 0.31 against 0.36 ms, 7.8-8.1x numpy. ``distance_to_runs`` (the rows in runs, one per
frame: a block's agents, ``Rows.runs``; 160,000 rows, 2026-11-28): 0.234 ms against numpy's repeats of
the parent's columns and the formula, 0.455 ms (1.94x), and against ``distance_to_parent``'s 0.307 ms
with the rows' positions (0.16 ms a block) not made. (The ``(min, max)`` loop of an integer key that was here
ran at 0.11x numpy's ``min()`` and ``max()``: deleted; ``mix_codes``, ``codes += (k - lo) * stride``, ran at
1.02-1.13x numpy's: deleted.) When to delete a loop: when numpy's formulation runs within 10% of it in that benchmark.
The quantile sketch's table of the (group, exponent) pairs that occur (``Sketch``, ``sketch_add``,
counted in ``keyed_reduce``'s pass too) and ``merge_sketches`` (same benchmark, 160,000 rows,
2026-11-28, load 11-14): speeds whose buckets span 4.2 million a group (0 among values of 1 to 30,
past ``sketch_counts``' table) 3.01 ms against the ``np.unique`` sort of group and bucket it
replaced, 6.96 ms (2.31x); two such sketches merged 0.39 ms against ``combine_parts``' ``np.lexsort``,
4.89 ms (12.5x). Speeds spread over so many exponents that the table would hold more cells than
rows: it gives up at once and the sort runs (8.1-10.3 against 8.1-8.8 ms before, within noise).
In ``keyed_reduce`` (``keyed_reduce + sketch``: a label's speeds, their count, sum, maximum and
sketch; 200,000 rows, 2026-11-29, load 1): 2.54-2.55 ms against numpy's 5.49-5.51 (2.16x); the
sketch's cells found in one loop and counted in a second, where one loop did both, 2.85-2.95 ms
before (1.13x; the sketch's part of ``aggregate``'s speeds of synth-1700's 188 blocks, their
arrays as the pass makes them: 0.31-0.33 s against 0.37-0.38 s). Zeros put apart (counted per
group, the other values kept in order for the sums and the cells; 2026-11-30): synth-1700's
first 3 M speeds by label, their count, sum, maximum and sketch, 13.7-14.9 ms against 19.2-19.5 ms
the loop before (best of 15 interleaved rounds, the same bits; the same loop without a sketch
8.6-8.9 ms either way); ``benchmarks/prediction_kernels.py``'s ``keyed_reduce + sketch`` 2.05 ms
against numpy's 10.81 ms (5.3x). The rows' loop made for its case (a sketch, every row kept, no
minimum: one row's work, ``_keyed_row``, inlined with that case's flags as constants, so that no
test of the other cases stays in the loop): 12.7-13.0 ms against 14.1-14.5 ms (same benchmark; the
loop written out twice, 12.1-12.3 ms, was not kept: two places for one row's work; a loop made
for a mean alone gained nothing, 12.5 ms either way).
"""

from libc.math cimport signbit, sqrt
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy, memset
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

import numpy as np

cdef extern from *:
    int __builtin_ctzll(unsigned long long) nogil

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


def distance_to_parent(const double[::1] x, const double[::1] y, const double[:, ::1] parent_xy,
                       const int64_t[::1] pos, double[::1] out):
    """``sqrt(dx * dx + dy * dy)``, ``dx = x[i] - parent_xy[pos[i], 0]`` (``dy`` likewise with column
    1), in float64 as numpy computes it from the parent's columns taken per row, in one pass."""
    cdef Py_ssize_t i, n = x.shape[0], m = parent_xy.shape[0], bad = -1
    cdef double dx, dy
    cdef int64_t p
    if y.shape[0] != n or pos.shape[0] != n or out.shape[0] != n or parent_xy.shape[1] < 2:
        raise ValueError("distance_to_parent: x, y, pos and out of one length, parent rows (m, >= 2)")
    with nogil:
        # (the squares' sums, then their roots in a loop of their own: a vector loop, where the
        # roots among the parent's lookups were one at a time; the same values)
        for i in range(n):
            p = pos[i]
            if p < 0 or p >= m:
                bad = i
                break
            dx = x[i] - parent_xy[p, 0]
            dy = y[i] - parent_xy[p, 1]
            out[i] = dx * dx + dy * dy
        if bad < 0:
            for i in range(n):
                out[i] = sqrt(out[i])
    if bad >= 0:
        raise IndexError(f"distance_to_parent: row {bad} has parent position {pos[bad]}, not in [0, {m})")


def distance_to_runs(const double[::1] x, const double[::1] y, const double[:, ::1] parent_xy,
                     const int64_t[::1] counts, double[::1] out):
    """:func:`distance_to_parent` of rows that come in runs, one per parent row: the first
    ``counts[0]`` rows are parent 0's, the next ``counts[1]`` parent 1's... (a chunk's rows and
    the frames that overlap it), each parent's position read once, no position per row made or
    read. The same values."""
    cdef Py_ssize_t i = 0, p, k, end, n = x.shape[0], m = parent_xy.shape[0]
    cdef int64_t total = 0
    cdef double dx, dy, ex, ey
    if y.shape[0] != n or out.shape[0] != n or parent_xy.shape[1] < 2 or counts.shape[0] > m:
        raise ValueError("distance_to_runs: x, y and out of one length, parent rows (m, >= 2), at most m counts")
    for p in range(counts.shape[0]):
        if counts[p] < 0:
            raise ValueError(f"distance_to_runs: parent {p} has {counts[p]} rows")
        total += counts[p]
    if total != n:
        raise ValueError(f"distance_to_runs: the counts hold {total} rows, not {n}")
    with nogil:
        for p in range(counts.shape[0]):
            ex, ey = parent_xy[p, 0], parent_xy[p, 1]
            end = i + counts[p]
            for k in range(i, end):
                dx = x[k] - ex
                dy = y[k] - ey
                out[k] = dx * dx + dy * dy
            i = end
        for k in range(n):  # (the roots in a vector loop of their own, as distance_to_parent)
            out[k] = sqrt(out[k])


ctypedef fused int_t:
    int8_t
    int16_t
    int32_t
    int64_t
    uint8_t
    uint16_t
    uint32_t


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


cdef inline void _take(int64_t g, double v, int64_t* count, double* total, double* lo, double* hi, bint want_sum,
                       bint want_min, bint want_max) noexcept nogil:
    """A value that is not NaN taken into group ``g``'s count, sum, minimum and maximum (those
    wanted; the arrays' data, unchecked: ``g`` is checked by the caller)."""
    count[g] += 1
    if want_sum:
        total[g] += v
    if want_min and not v >= lo[g]:
        lo[g] = v
    if want_max and not v <= hi[g]:
        hi[g] = v


def group_reduce(const int64_t[::1] codes, const double[::1] values, int64_t[::1] count, double[::1] total,
                 double[::1] lo, double[::1] hi, int64_t[::1] rows, bint want_sum, bint want_min, bint want_max,
                 bint want_rows):
    """Per group ``codes[i]``: add each row to ``rows`` (if asked), each value that is not NaN to
    ``count`` (and ``total``), and take it into ``lo``/``hi`` (minimum, maximum): one pass over the
    rows, in place. Returns -1, or the first row whose code is not a group of ``count`` (nothing
    added from it on)."""
    cdef Py_ssize_t i, n = codes.shape[0], bad = -1
    cdef int64_t g, ngroups = count.shape[0]
    cdef double v
    with nogil:
        for i in range(n):
            g = codes[i]
            if g < 0 or g >= ngroups:
                bad = i
                break
            if want_rows:
                rows[g] += 1
            v = values[i]
            if v != v:
                continue
            _take(g, v, &count[0], &total[0], &lo[0], &hi[0], want_sum, want_min, want_max)
    return bad


ctypedef fused real_t:
    float
    double


cdef inline int64_t _bucket(double v, int64_t shift) noexcept nogil:
    """The sketch's bucket of a value that is not NaN: its float64 bits (of ``v + 0.0``: -0.0 is
    0.0) ordered as the values, all but ``52 - shift`` bits of the mantissa dropped
    (``l5dask.prediction.groupby.buckets``)."""
    cdef double w = v + 0.0
    cdef int64_t raw
    memcpy(&raw, &w, 8)
    raw = raw ^ ((raw >> 63) & <int64_t>0x7FFFFFFFFFFFFFFF)
    return raw >> shift


def sketch_range(const int64_t[::1] codes, const real_t[::1] values, int64_t shift, int64_t[::1] rows,
                 bint want_rows, int64_t[::1] out):
    """The first pass of a sketch: over the rows whose value is not NaN, ``out[:]`` = (their
    number, lowest bucket, highest bucket, highest code + 1); each row added to ``rows[codes[i]]``
    (if asked). Returns -1, or the first row whose code is not in
    ``[0, len(rows))`` (``out`` then undefined)."""
    cdef Py_ssize_t i, n = codes.shape[0], bad = -1
    cdef int64_t g, b, ngroups = rows.shape[0], count = 0, lo = 0, hi = 0, g_hi = 0
    cdef double v
    if values.shape[0] != n or out.shape[0] != 4:
        raise ValueError("sketch_range: a value per code and an out of 4 are needed")
    with nogil:
        for i in range(n):
            g = codes[i]
            if g < 0 or g >= ngroups:
                bad = i
                break
            if want_rows:
                rows[g] += 1
            v = values[i]
            if v != v:
                continue
            b = _bucket(v, shift)
            if count == 0:
                lo = b
                hi = b
            elif b < lo:
                lo = b
            elif b > hi:
                hi = b
            if g >= g_hi:
                g_hi = g + 1
            count += 1
    out[0] = count
    out[1] = lo
    out[2] = hi
    out[3] = g_hi
    return bad


def sketch_counts(const int64_t[::1] codes, const real_t[::1] values, int64_t shift, int64_t lo,
                  int64_t span, int32_t[::1] counts, int64_t[::1] rows, bint want_rows):
    """The second pass of a sketch: each row whose value is not NaN counted in ``counts[code * span + bucket - lo]`` (int32: a block's rows; the codes and buckets
    within the table: checked, as the codes within ``rows``), each row added to ``rows[code]`` (if
    asked). Returns -1, or the first row out of the table (nothing added from it on)."""
    cdef Py_ssize_t i, n = codes.shape[0], size = counts.shape[0], bad = -1
    cdef int64_t g, at, ngroups = rows.shape[0]
    cdef double v
    if values.shape[0] != n:
        raise ValueError("sketch_counts: a value per code is needed")
    with nogil:
        for i in range(n):
            g = codes[i]
            if want_rows:
                if g < 0 or g >= ngroups:
                    bad = i
                    break
                rows[g] += 1
            v = values[i]
            if v != v:
                continue
            at = g * span + _bucket(v, shift) - lo
            if at < 0 or at >= size:
                bad = i
                break
            counts[at] += 1
    return bad


cdef inline void _mix_typed(const int_t* k, Py_ssize_t m, int64_t lo, int64_t stride, int64_t* buf,
                            bint first) noexcept nogil:
    """``buf[:m] (+)= (k[:m] - lo) * stride`` (``=`` for the ``first`` key): a loop per key type
    (the fused type's), which the compiler makes a vector loop."""
    cdef Py_ssize_t i
    if first:
        for i in range(m):
            buf[i] = (<int64_t>k[i] - lo) * stride
    else:
        for i in range(m):
            buf[i] += (<int64_t>k[i] - lo) * stride


cdef inline void _mix_block(const char* p, int32_t kind, Py_ssize_t a, Py_ssize_t m, int64_t lo, int64_t stride,
                            int64_t* buf, bint first) noexcept nogil:
    """:func:`_mix_typed` of rows ``a .. a + m - 1`` of an integer key at ``p`` whose type is
    ``kind`` (``KEY_KINDS``' order)."""
    if kind == 0:
        _mix_typed((<const int8_t*>p) + a, m, lo, stride, buf, first)
    elif kind == 1:
        _mix_typed((<const int16_t*>p) + a, m, lo, stride, buf, first)
    elif kind == 2:
        _mix_typed((<const int32_t*>p) + a, m, lo, stride, buf, first)
    elif kind == 3:
        _mix_typed((<const int64_t*>p) + a, m, lo, stride, buf, first)
    elif kind == 4:
        _mix_typed((<const uint8_t*>p) + a, m, lo, stride, buf, first)
    elif kind == 5:
        _mix_typed((<const uint16_t*>p) + a, m, lo, stride, buf, first)
    else:
        _mix_typed((<const uint32_t*>p) + a, m, lo, stride, buf, first)


#: Rows whose group codes ``keyed_reduce`` makes at a time (16 kB of codes: they stay in the L1
#: cache between their making and their use).
DEF KEYED_ROWS = 2048


def keyed_reduce(const int64_t[::1] addrs, const int32_t[::1] kinds, const int64_t[::1] los,
                 const int64_t[::1] strides, Py_ssize_t n, const real_t[::1] values, bint has_values,
                 int64_t[::1] count,
                 double[::1] total, double[::1] lo, double[::1] hi, int64_t[::1] rows, bint want_sum,
                 bint want_min, bint want_max, bint want_rows, Sketch sketch=None,
                 const uint8_t[::1] keep=None):
    """``group_reduce`` of ``n`` rows whose group codes are made ``KEYED_ROWS`` rows at a time,
    never stored whole: a row's code is ``sum((key_j[i] - los[j]) * strides[j])`` over its keys
    (``addrs``: the keys' data, ``kinds``: their integer types); its value (if ``has_values``; NaN
    skipped) added to ``count`` (and ``total``, ``lo``, ``hi``), the row to ``rows`` (if
    ``want_rows``); with a ``sketch`` (of ``count``'s groups), each value that is not NaN counted
    in it too (:class:`Sketch`), in the same pass; with ``keep`` (a byte per row), the rows where
    it is 0 left out (neither counted nor added: as if they were taken out first). The caller
    keeps the keys alive and gives ``n`` rows of each. Returns -1, or the first row whose code is
    not a group of ``count``, or whose bucket is not in the sketch's range, or -2 when the
    sketch's table is full (the outputs then partly added to, and unfit for use).

    Zeros apart, with a sketch: a zero adds nothing to a sum that is not -0.0 (a sum from +0.0
    never is) and falls in its group's zero bucket, so each group's zeros are counted as the rows
    go (no branch: a select) and only the other values are kept, in order, for the sums and the
    sketch's cells: the same bits (every group's values added in row order), where a chain of
    loads, adds and stores through the sum of a group of many zeros (a still agent's speed: ~70%
    of synth-1700's) and a cell per zero set the pace. Not where a sum is -0.0 (a +0.0 would make
    it +0.0), nor where the sketch's exponents leave the zeros out (the first such row is then
    named). Without a sketch the sums are made in the rows' loop (the values kept cost more than
    the chains they spare)."""
    cdef Py_ssize_t a, i, j, m, nz, nk = addrs.shape[0], bad = -1
    cdef int64_t g, c, isz, ngroups = count.shape[0]
    cdef int64_t buf[KEYED_ROWS]
    cdef int64_t cells[KEYED_ROWS]
    cdef double nzv[KEYED_ROWS]  # (the values that are not zero, of groups nzg, in row order)
    cdef int64_t nzg[KEYED_ROWS]
    cdef Py_ssize_t ncells
    cdef double v
    cdef SketchTable* sk = NULL
    cdef const uint8_t* kp = NULL
    cdef int status = 0
    cdef int64_t apart = 1  # (zeros apart: 1, else 0)
    cdef bint kept = False  # (values kept, in order, for the sums and the sketch)
    cdef bint fast = False  # (the rows' loop with no case it does not need: the compiler left them in)
    cdef int64_t* zeros = NULL
    cdef int64_t zb
    cdef double* tp = NULL
    cdef double* lp = NULL
    cdef double* hp = NULL
    cdef int64_t* rp = NULL
    if kinds.shape[0] != nk or los.shape[0] != nk or strides.shape[0] != nk:
        raise ValueError("keyed_reduce: a type, a lowest value and a stride per key are needed")
    if has_values and values.shape[0] != n:
        raise ValueError("keyed_reduce: a value per row is needed")
    if want_rows and rows.shape[0] != ngroups:
        raise ValueError("keyed_reduce: rows of every group are needed")
    if sketch is not None:
        if sketch.t.ngroups != ngroups or not has_values:
            raise ValueError("keyed_reduce: a sketch of every group, and values, are needed")
        sk = &sketch.t
        zb = (_bucket(0.0, sk.shift) >> sk.bits) - sk.hlo
        if zb < 0 or zb >= sk.hspan:
            apart = 0
    if want_sum:
        for g in range(ngroups):
            if total[g] == 0.0 and signbit(total[g]):
                apart = 0
    if keep is not None:
        if keep.shape[0] != n:
            raise ValueError("keyed_reduce: a byte of keep per row is needed")
        if n:
            kp = &keep[0]
    kept = has_values and sk != NULL  # (without a sketch, the sums made in the rows' loop: faster)
    if ngroups:
        tp = &total[0] if want_sum else NULL
        lp = &lo[0] if want_min else NULL
        hp = &hi[0] if want_max else NULL
        rp = &rows[0] if want_rows else NULL
    fast = kept and kp == NULL and not want_min and has_values
    if sk != NULL and apart:
        zeros = <int64_t*>calloc(max(ngroups, 1), sizeof(int64_t))
        if zeros == NULL:
            raise MemoryError("keyed_reduce: the zeros' counts")
    with nogil:
        for a in range(0, n, KEYED_ROWS):
            m = min(KEYED_ROWS, n - a)
            if nk == 0:
                for i in range(m):
                    buf[i] = 0
            for j in range(nk):
                _mix_block(<const char*><Py_ssize_t>addrs[j], kinds[j], a, m, los[j], strides[j], buf, j == 0)
            nz = 0
            if fast:  # (the same row's work, inlined with the flags of its case: no test of the others)
                for i in range(m):
                    nz = _keyed_row(a, i, &buf[0], NULL, &values[0], True, ngroups, &count[0], tp, NULL, hp, rp,
                                    False, False, want_max, want_rows, True, apart, zeros, nzv, nzg, nz)
                    if nz < 0:
                        break
            else:
                for i in range(m):
                    nz = _keyed_row(a, i, &buf[0], kp, &values[0], has_values, ngroups, &count[0], tp, lp, hp, rp,
                                    want_sum, want_min, want_max, want_rows, kept, apart, zeros, nzv, nzg, nz)
                    if nz < 0:
                        break
            if nz < 0:  # (a row out of the groups: a failure, the outputs unfit for use)
                bad = a + i
                nz = 0
            if kept and want_sum:
                for j in range(nz):
                    total[nzg[j]] += nzv[j]
            if bad >= 0:
                break
            if sk != NULL:  # (the sketch's counts in loops of their own: faster than one loop)
                # each value's cell found first, then the cells counted: the counts (a few MB: a
                # group's cells for each exponent its values take) are read from the caches beyond
                # L2, and a loop of increments alone has many of those reads under way at once
                ncells = nz
                for j in range(nz):
                    c = _sketch_cell(sk, nzg[j], nzv[j])
                    cells[j] = c
                    if c < 0:
                        status = <int>(-c)
                        ncells = j
                        bad = _kept_row(a, m, j, kp, &values[0], &buf[0], apart)
                        break
                for j in range(ncells):
                    sk.counts[cells[j]] += 1
                if bad >= 0:
                    break
        if zeros != NULL and bad < 0:  # (each group's zeros into its zero bucket's cell)
            for g in range(ngroups):
                if zeros[g]:
                    c = _sketch_cell(sk, g, 0.0)
                    if c < 0:
                        status = <int>(-c)
                        break
                    sk.counts[c] += <int32_t>zeros[g]
    free(zeros)
    if status == 2:
        raise MemoryError("keyed_reduce: the sketch's table")
    return -2 if status == 3 else bad


cdef inline Py_ssize_t _keyed_row(Py_ssize_t a, Py_ssize_t i, const int64_t* buf, const uint8_t* kp, const real_t* values,
                            bint has_values, int64_t ngroups, int64_t* count, double* total, double* lo, double* hi,
                            int64_t* rows, bint want_sum, bint want_min, bint want_max, bint want_rows, bint kept,
                            int64_t apart, int64_t* zeros, double* nzv, int64_t* nzg, Py_ssize_t nz) noexcept nogil:
    """Row ``a + i`` of :func:`keyed_reduce` (its group ``buf[i]``) added to the outputs: the values
    kept so far (``nz``, and this one), or -1 when its group is not one of ``ngroups`` (nothing
    added). Inlined where it is called, so that a call with a case's flags as constants is a loop
    with no test of the other cases (a sketch's rows, all kept, no minimum: see the module's notes)."""
    cdef int64_t g
    cdef int64_t isz
    cdef double v
    if kp != NULL and kp[a + i] == 0:
        return nz
    g = buf[i]
    if g < 0 or g >= ngroups:
        return -1
    if want_rows:
        rows[g] += 1
    if not has_values:
        return nz
    v = values[a + i]
    if v != v:
        return nz
    count[g] += 1
    if want_min and not v >= lo[g]:
        lo[g] = v
    if want_max and not v <= hi[g]:
        hi[g] = v
    if kept:
        isz = (v == 0.0) & apart
        if zeros != NULL:
            zeros[g] += isz
        nzv[nz] = v
        nzg[nz] = g
        return nz + 1 - isz
    if want_sum:
        total[g] += v
    return nz


cdef Py_ssize_t _kept_row(Py_ssize_t a, Py_ssize_t m, Py_ssize_t j, const uint8_t* kp, const real_t* values,
                          const int64_t* buf, int64_t apart) noexcept nogil:
    """The row of the ``j``-th value :func:`keyed_reduce` kept of rows ``a .. a + m - 1`` (those
    left in, not NaN, and not zeros put apart): the row a failure names."""
    cdef Py_ssize_t i, k = 0
    cdef double v
    for i in range(m):
        if kp != NULL and kp[a + i] == 0:
            continue
        v = values[a + i]
        if v != v or (apart and v == 0.0):
            continue
        if k == j:
            return a + i
        k += 1
    return a + m - 1


# --- the quantile sketch's counts in a table of its occupied exponents ----------------------
cdef struct SketchTable:
    int64_t shift  # 52 - bits: a value's bucket is its ordered float64 bits >> shift
    int64_t bits  # the mantissa bits kept: each (group, sign and exponent) pair has 2 ** bits cells
    int64_t cells  # 2 ** bits
    int64_t hlo, hspan  # the lowest sign and exponent (a bucket >> bits), their number
    int64_t ngroups
    int64_t limit  # the most cells the table may hold
    int32_t* pairs  # (group, exponent - hlo) -> its pair's number, -1: none yet
    int32_t* counts  # each pair's cells
    int64_t npairs, cap


cdef int32_t* _sketch_pair(SketchTable* s, int64_t at) noexcept nogil:
    """A pair of cells for ``pairs[at]``, zeroed: the counts' address, or NULL when the table holds
    ``cap`` pairs already (its ``limit`` of cells: ``cap`` then 0). The table is allocated whole
    when the sketch is made (its pages are touched as its pairs are made): grown by doubling, its
    copies and new pages were 1.7% of the CPU of a run of five analyses (``perf``, 2026-11-30)."""
    if s.npairs == s.cap:
        s.cap = 0
        return NULL
    memset(s.counts + s.npairs * s.cells, 0, s.cells * sizeof(int32_t))
    s.pairs[at] = <int32_t>s.npairs
    s.npairs += 1
    return s.counts


cdef inline int64_t _sketch_cell(SketchTable* s, int64_t g, double v) noexcept nogil:
    """The cell of ``s.counts`` where a value that is not NaN is counted in group ``g``'s bucket
    (``g`` checked by the caller; its pair made when new), or -1 (its exponent out of the table's
    range), -2 (no memory), -3 (the table full)."""
    cdef int64_t b = _bucket(v, s.shift)
    cdef int64_t at = (b >> s.bits) - s.hlo
    cdef int64_t p
    if at < 0 or at >= s.hspan:
        return -1
    at += g * s.hspan
    p = s.pairs[at]
    if p < 0:
        if _sketch_pair(s, at) == NULL:
            return -2 if s.cap < 0 else -3
        p = s.npairs - 1
    return p * s.cells + (b & (s.cells - 1))


cdef inline int _sketch_add(SketchTable* s, int64_t g, double v) noexcept nogil:
    """A value that is not NaN counted in group ``g``'s bucket (``g`` checked by the caller): 0,
    or 1 (its exponent out of the table's range), 2 (no memory), 3 (the table full)."""
    cdef int64_t b = _bucket(v, s.shift)
    cdef int64_t at = (b >> s.bits) - s.hlo
    cdef int64_t p
    if at < 0 or at >= s.hspan:
        return 1
    at += g * s.hspan
    p = s.pairs[at]
    if p < 0:
        if _sketch_pair(s, at) == NULL:
            return 2 if s.cap < 0 else 3
        p = s.npairs - 1
    s.counts[p * s.cells + (b & (s.cells - 1))] += 1
    return 0


cdef class Sketch:
    """The quantile sketch's counts per (group, bucket) of ``ngroups`` groups (the buckets of
    ``l5dask.prediction.groupby.buckets``, ``bits`` of the mantissa kept, at most 16), in a table
    of the (group, sign and exponent) pairs that occur, each ``2 ** bits`` cells: rows are counted
    by :func:`sketch_add` or :func:`keyed_reduce`, and :meth:`result` lists the cells counted in
    (group, bucket) order, no sort. The exponents ``hlo .. hlo + hspan - 1`` (a bucket ``>>
    bits``) are those of the values counted; the table holds at most ``limit`` cells (past them,
    the counting stops and says so)."""

    cdef SketchTable t

    def __cinit__(self, int64_t ngroups, int64_t bits, int64_t hlo, int64_t hspan, int64_t limit):
        if not 0 <= bits <= 16 or ngroups < 0 or not 1 <= hspan <= 4096 or limit < (1 << bits):
            raise ValueError("Sketch: bits from 0 to 16, groups, an exponent range of 1 to 4096, room for a pair")
        self.t.shift = 52 - bits
        self.t.bits = bits
        self.t.cells = (<int64_t>1) << bits
        self.t.hlo = hlo
        self.t.hspan = hspan
        self.t.ngroups = ngroups
        self.t.limit = limit
        self.t.npairs = 0
        self.t.cap = limit // self.t.cells  # (every pair the limit allows: allocated, not touched)
        self.t.pairs = <int32_t*>malloc(max(ngroups * hspan, 1) * sizeof(int32_t))
        self.t.counts = <int32_t*>malloc(self.t.cap * self.t.cells * sizeof(int32_t))
        if self.t.pairs == NULL or self.t.counts == NULL:
            raise MemoryError("Sketch: its table")
        memset(self.t.pairs, 0xFF, ngroups * hspan * sizeof(int32_t))  # (-1: no pair)

    def __dealloc__(self):
        free(self.t.pairs)
        free(self.t.counts)

    def result(self):
        """``(group, bucket, count)`` (int64) of the cells counted, sorted by group then bucket."""
        cdef Py_ssize_t k = 0
        cdef int64_t d, p, low, grp, high, n = 0, cells = self.t.cells
        cdef int32_t c
        cdef SketchTable* s = &self.t
        with nogil:
            for d in range(s.npairs * cells):
                n += s.counts[d] != 0
        g_out = np.empty(n, np.int64)
        b_out = np.empty(n, np.int64)
        c_out = np.empty(n, np.int64)
        cdef int64_t[::1] go = g_out, bo = b_out, co = c_out
        with nogil:
            for d in range(s.ngroups * s.hspan):
                p = s.pairs[d]
                if p < 0:
                    continue
                grp = d // s.hspan
                high = d % s.hspan + s.hlo
                for low in range(cells):
                    c = s.counts[p * cells + low]
                    if c:
                        go[k] = grp
                        bo[k] = high * cells + low
                        co[k] = c
                        k += 1
        return g_out, b_out, c_out


def sketch_add(const int64_t[::1] codes, const real_t[::1] values, Sketch sketch not None, int64_t[::1] rows,
               bint want_rows):
    """Each row whose value is not NaN counted in ``sketch`` (codes in its groups; checked), each
    row added to ``rows[code]`` (if asked), in one pass. Returns -1, or the first row whose code is
    not a group of the sketch or whose value's exponent is out of its range (nothing added from it
    on), or -2 when the sketch's table is full (``rows`` then partly added to)."""
    cdef Py_ssize_t i, n = codes.shape[0], bad = -1
    cdef int64_t g, ngroups = sketch.t.ngroups
    cdef double v
    cdef int status = 0
    cdef SketchTable* sk = &sketch.t
    if values.shape[0] != n or (want_rows and rows.shape[0] != ngroups):
        raise ValueError("sketch_add: a value per code, and rows of every group, are needed")
    with nogil:
        for i in range(n):
            g = codes[i]
            v = values[i]
            if v != v and not want_rows:
                # (a NaN is not counted: its group may lie beyond the sketch's, which are the
                # groups of the values that are not NaN, sketch_range's)
                continue
            if g < 0 or g >= ngroups:
                bad = i
                break
            if want_rows:
                rows[g] += 1
            if v != v:
                continue
            status = _sketch_add(sk, g, v)
            if status:
                bad = i
                break
    if status == 2:
        raise MemoryError("sketch_add: the sketch's table")
    return -2 if status == 3 else bad


def merge_sketches(const int64_t[::1] ga, const int64_t[::1] ba, const int64_t[::1] ca, const int64_t[::1] gb,
                   const int64_t[::1] bb, const int64_t[::1] cb, int64_t[::1] go, int64_t[::1] bo, int64_t[::1] co):
    """Two sketches' ``(group, bucket, count)``, each sorted by (group, bucket) without repeats,
    merged into ``go``, ``bo``, ``co`` (room for both): one pass, the counts of a cell in both
    added. Returns the cells written, or -1 when an input is not so sorted (the outputs then
    undefined)."""
    cdef Py_ssize_t i = 0, j = 0, k = 0, na = ga.shape[0], nb = gb.shape[0]
    cdef bint ordered = True
    if ba.shape[0] != na or ca.shape[0] != na or bb.shape[0] != nb or cb.shape[0] != nb:
        raise ValueError("merge_sketches: a bucket and a count per group code are needed")
    if go.shape[0] < na + nb or bo.shape[0] < na + nb or co.shape[0] < na + nb:
        raise ValueError("merge_sketches: room for both sketches is needed")
    with nogil:
        for i in range(1, na):
            if ga[i] < ga[i - 1] or (ga[i] == ga[i - 1] and ba[i] <= ba[i - 1]):
                ordered = False
                break
        for j in range(1, nb):
            if gb[j] < gb[j - 1] or (gb[j] == gb[j - 1] and bb[j] <= bb[j - 1]):
                ordered = False
                break
        i = 0
        j = 0
        while ordered and i < na and j < nb:
            if ga[i] < gb[j] or (ga[i] == gb[j] and ba[i] < bb[j]):
                go[k] = ga[i]
                bo[k] = ba[i]
                co[k] = ca[i]
                i += 1
            elif ga[i] == gb[j] and ba[i] == bb[j]:
                go[k] = ga[i]
                bo[k] = ba[i]
                co[k] = ca[i] + cb[j]
                i += 1
                j += 1
            else:
                go[k] = gb[j]
                bo[k] = bb[j]
                co[k] = cb[j]
                j += 1
            k += 1
        while ordered and i < na:
            go[k] = ga[i]
            bo[k] = ba[i]
            co[k] = ca[i]
            i += 1
            k += 1
        while ordered and j < nb:
            go[k] = gb[j]
            bo[k] = bb[j]
            co[k] = cb[j]
            j += 1
            k += 1
    return k if ordered else -1
