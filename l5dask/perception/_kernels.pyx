# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The perception tables' compiled loops (GIL released): token lookups and chain walks, see
:mod:`l5dask.perception.links`.

Strings are Arrow's layout read in place: ``int32`` offsets into a bytes buffer, and a validity
byte per row (an empty ``valid`` means no nulls).

The box geometry's pairs (``box_pairs``, for :mod:`l5dask.perception.geometry`) against the SDK's
``Box3D.get_iou`` loop and shapely 2's vectorised ``shapely.intersection`` (benchmarks/
geometry_benchmark.py, 2026-11-27, a shared 2-core machine at load 23, best of 3 interleaved
rounds): all pairs of 100 x 100 boxes 774x the SDK's pairs per second and 29x shapely's; 1 M
element-wise overlapping pairs 87x the SDK's and 210x shapely's. Delete it if shapely's vectorised
overlay comes within 2x of it.
"""

import numpy as np

from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.math cimport INFINITY, fabs, ldexp, sqrt
from libc.string cimport memchr, memcmp, memcpy

cdef extern from *:
    void __builtin_prefetch(const void* p) nogil

cdef enum:
    BLOCK = 32  # lookups in flight: their slots and strings are fetched from memory together


cdef inline uint64_t _hash(const uint8_t* p, Py_ssize_t n) noexcept nogil:
    """A 64-bit hash of ``n`` bytes, eight at a time (tokens are 32 or 64 hex characters)."""
    cdef uint64_t h = 0x9E3779B97F4A7C15ULL ^ <uint64_t>n, w
    while n >= 8:
        memcpy(&w, p, 8)
        h = (h ^ w) * 0xFF51AFD7ED558CCDULL
        h ^= h >> 32
        p += 8
        n -= 8
    if n:
        w = 0
        memcpy(&w, p, n)
        h = (h ^ w) * 0xC4CEB9FE1A85EC53ULL
    h ^= h >> 29
    h *= 0x94D049BB133111EBULL
    return h ^ (h >> 32)


cdef struct Slot:
    uint64_t hash
    int64_t row  # -1: empty
    const uint8_t* ptr  # the string's bytes, in its Arrow buffer
    int64_t length


cdef class StringIndex:
    """A hash table of a string column's values -> the first row holding each: ``pc.index_in`` for
    tables of long random tokens, several times faster. A slot holds the hash, the row and where the
    string's bytes are (no offsets looked up); the bytes are compared only when the hashes agree; a
    block of lookups fetches its slots and strings from memory at once (prefetch)."""

    cdef Slot* slots
    cdef uint64_t mask
    cdef object keep  # the buffers the slots point into
    cdef readonly Py_ssize_t size
    cdef readonly int64_t dup_first, dup_row

    def __cinit__(self, list chunks):
        """``chunks``: the column's chunks in row order, each ``(offsets, data)``."""
        cdef Py_ssize_t n = sum(len(off) - 1 for off, _ in chunks), i, base = 0, m, b, k
        cdef uint64_t hs[BLOCK]
        cdef uint64_t cap = 16, h, s
        cdef int64_t j, length
        cdef const int32_t[::1] off
        cdef const uint8_t[::1] data
        cdef const uint8_t* p
        self.size = n
        self.dup_first = self.dup_row = -1
        while cap < <uint64_t>(2 * n):
            cap <<= 1
        self.mask = cap - 1
        self.slots = <Slot*>malloc(cap * sizeof(Slot))
        if self.slots == NULL:
            raise MemoryError()
        self.keep = chunks
        with nogil:
            for s in range(cap):
                self.slots[s].row = -1
                self.slots[s].ptr = NULL
        for off, data in chunks:
            m = off.shape[0] - 1
            with nogil:
                b = 0
                while b < m:
                    k = min(<Py_ssize_t>BLOCK, m - b)
                    for i in range(k):  # hash the block, fetch its slots
                        hs[i] = _hash(&data[0] + off[b + i], off[b + i + 1] - off[b + i])
                        __builtin_prefetch(&self.slots[hs[i] & self.mask])
                    for i in range(k):
                        p = &data[0] + off[b + i]
                        length = off[b + i + 1] - off[b + i]
                        h = hs[i]
                        s = h & self.mask
                        while True:
                            j = self.slots[s].row
                            if j < 0:
                                self.slots[s].row = base + b + i
                                self.slots[s].hash = h
                                self.slots[s].ptr = p
                                self.slots[s].length = length
                                break
                            if self.slots[s].hash == h and self.slots[s].length == length and \
                                    memcmp(self.slots[s].ptr, p, length) == 0:
                                if self.dup_row < 0:  # the first repeat, in row order
                                    self.dup_first, self.dup_row = j, base + b + i
                                break
                            s = (s + 1) & self.mask
                    b += k
            base += m

    def __dealloc__(self):
        free(self.slots)

    def lookup(self, const int32_t[::1] offsets, const uint8_t[::1] data, const uint8_t[::1] valid,
               int64_t empty=-1):
        """Per row of the queried strings, the first row of the table holding it, or -1 (a value
        not in the table), or ``empty`` (a null, or ``""`` when not in the table)."""
        cdef Py_ssize_t n = offsets.shape[0] - 1, i, k, b, length
        result = np.empty(n, np.int64)
        cdef int64_t[::1] out = result
        cdef const int32_t* qoff = &offsets[0]
        cdef const uint8_t* q = &data[0]
        cdef bint all_valid = valid.shape[0] == 0
        cdef uint64_t hs[BLOCK]
        cdef uint64_t h, s
        cdef Slot* slot
        with nogil:
            b = 0
            while b < n:
                k = min(<Py_ssize_t>BLOCK, n - b)
                for i in range(k):  # hash the block, fetch its first slots
                    hs[i] = _hash(q + qoff[b + i], qoff[b + i + 1] - qoff[b + i])
                    __builtin_prefetch(&self.slots[hs[i] & self.mask])
                for i in range(k):  # fetch the strings of those slots
                    __builtin_prefetch(self.slots[hs[i] & self.mask].ptr)
                for i in range(k):
                    out[b + i] = -1
                    if not all_valid and not valid[b + i]:
                        out[b + i] = empty
                        continue
                    h = hs[i]
                    length = qoff[b + i + 1] - qoff[b + i]
                    s = h & self.mask
                    while True:
                        slot = &self.slots[s]
                        if slot.row < 0:
                            break
                        if slot.hash == h and slot.length == length and memcmp(slot.ptr, q + qoff[b + i], length) == 0:
                            out[b + i] = slot.row
                            break
                        s = (s + 1) & self.mask
                    if length == 0 and out[b + i] < 0:
                        out[b + i] = empty
                b += k
        return result


def walk_chains(const int64_t[::1] prev, const int64_t[::1] nxt, int64_t[::1] head, int64_t[::1] position):
    """From every row without ``prev`` follow ``next`` to the chain's end: each row's head row and
    position (0 at the head). Rows no walk reaches keep ``head`` -1 (they are on loops). The chains
    must be consistent (``next`` of a is b exactly when ``prev`` of b is a: checked before).
    ``BLOCK`` chains are walked together, a step of each in turn, so that their rows are fetched
    from memory at once (one chain's steps wait on each other)."""
    cdef Py_ssize_t n = prev.shape[0], i, c, active = 0, start = 0
    cdef int64_t cur[BLOCK]
    cdef int64_t hd[BLOCK]
    cdef int64_t pos[BLOCK]
    cdef int64_t r
    with nogil:
        for i in range(n):
            head[i] = -1
        while True:
            while active < BLOCK and start < n:  # start the next chains
                if prev[start] < 0:
                    cur[active] = start
                    hd[active] = start
                    pos[active] = 0
                    active += 1
                start += 1
            if active == 0:
                break
            c = 0
            while c < active:
                r = cur[c]
                if r < 0 or head[r] >= 0:  # the chain's end (or a row seen: only if inconsistent)
                    active -= 1
                    cur[c], hd[c], pos[c] = cur[active], hd[active], pos[active]
                    continue
                head[r] = hd[c]
                position[r] = pos[c]
                pos[c] += 1
                r = nxt[r]
                cur[c] = r
                if r >= 0:
                    __builtin_prefetch(&nxt[r])
                    __builtin_prefetch(&head[r])
                    __builtin_prefetch(&position[r])
                c += 1


cdef double ULP16 = 2.0 ** -49  # 16 units of 2**-53


cdef enum:
    # a box's row in ``frames``: p1 (its first corner), the edge vectors i, j, k from it, their
    # squared lengths, and the box's bounding cube (lo, hi)
    P1 = 0
    EI = 3
    EJ = 6
    EK = 9
    II = 12
    LO = 15
    HI = 18
    FRAME = 21
    GRID = 64
    BATCH = 256  # points a sweep's pass handles at a time (its loops over them compiled to vector code)


def count_in_boxes(const float[:, ::1] points, const double[:, ::1] frames, int64_t[::1] out, double band):
    """Per box, the points (3, n) inside it by the SDK's ``points_in_box`` test (``0 <= v.i <= i.i``
    and the same for j and k, ``v`` from the first corner). A point that is within ``band`` times
    an edge's squared length of a face (and not clearly outside on another edge), or NaN, is not
    decided here: its (box, point) pairs are returned for the exact test in numpy, so that the
    count does not depend on how the dot products are rounded.

    The boxes' bounds are binned on a grid in x, y of at most ``GRID`` x ``GRID`` cells: a
    point meets only the boxes of its cell (most points meet none). A box with an edge of length
    0 passes whole slabs (the SDK's test, ``0 <= 0 <= 0`` on that edge): its bounds are infinite,
    and then every point meets every box."""
    cdef list undecided = []
    cdef Grid g
    cdef Py_ssize_t n = points.shape[1], p, k, c
    cdef double x, y, z
    cdef int r
    if points.shape[0] != 3 or frames.shape[1] != FRAME or out.shape[0] != frames.shape[0]:
        raise ValueError("count_in_boxes: points (3, n), frames (boxes, 21) and out (boxes,) expected")
    if n == 0 or frames.shape[0] == 0:
        return undecided
    cdef const float* q = &points[0, 0]
    cdef const double* f = &frames[0, 0]
    _grid(&g, f, frames.shape[0], 0.0)
    try:
        with nogil:
            for p in range(n):
                x = q[p]
                y = q[n + p]
                c = _cell(&g, x, y)
                if c < 0:
                    continue
                z = q[2 * n + p]
                for k in range(g.start[c], g.start[c + 1]):
                    r = _test(&f[g.members[k] * FRAME], x, y, z, band)
                    out[g.members[k]] += r & 1
                    if r & 2:
                        with gil:
                            undecided.append((g.members[k], p))
    finally:
        _free_grid(&g)
    return undecided


def count_sweep(const float[:, ::1] scan, const double[:, ::1] r1, const double[::1] t1, const double[:, ::1] r2,
                const double[::1] t2, bint wide_add, float[:, ::1] points, const double[:, ::1] frames,
                int64_t[::1] out, double band):
    """A sweep's (n, >= 3) sensor points counted in the boxes, as :func:`count_in_boxes` counts
    them once :func:`sweep_to_world` has moved them, in one pass: the undecided (box, point)
    pairs, or None (nothing counted) when the move of a point near a box is not decided here.

    Only points near a box need the move as the SDK rounds it: each point is first moved in one
    float64 affine map (the two composed), and the boxes are binned with their bounds widened by
    ``2**-20 (D + |t1| + |t2|)``, D the farthest a point of the boxes' bounds is from the ego (t2):
    for a point whose move as the SDK rounds it lands in a box, the vectors of the four roundings
    (rotation, translation, twice) are at most D + |t1| + |t2| long (rotations keep lengths), so
    each rounding moves it by at most sqrt(3) 2**-24 of that, and the map lands within the widened
    bounds. So a point whose cell is empty is in no box. The others are moved as the SDK rounds
    them, into ``points`` (3, n) (the rest of it left as it was), and tested."""
    cdef Py_ssize_t n = scan.shape[0], m = scan.shape[1], p, k, c, i, j
    cdef Move mv
    cdef Grid g
    cdef double a[9]
    cdef double at[3]
    cdef double far = 0.0, reach, x, y, z, lo, hi
    cdef int r, same = 1
    cdef list undecided = []
    cdef int64_t* got = NULL
    cdef Py_ssize_t p0, p1, near
    cdef Py_ssize_t idx[BATCH]
    cdef Py_ssize_t cells[BATCH]
    cdef double bx[BATCH]
    cdef double by[BATCH]
    cdef double bz[BATCH]
    if m < 3 or points.shape[0] != 3 or points.shape[1] != n or frames.shape[1] != FRAME \
            or out.shape[0] != frames.shape[0]:
        raise ValueError("count_sweep: scan (n, >= 3), points (3, n), frames (boxes, 21), out (boxes,) expected")
    _move_of(&mv, r1, t1, r2, t2, wide_add)
    if n == 0 or frames.shape[0] == 0:
        return undecided
    for i in range(3):  # the composed map: r2 (r1 x + t1) + t2
        at[i] = mv.t2[i]
        for j in range(3):
            a[3 * i + j] = (mv.r2[3 * i] * mv.r1[j] + mv.r2[3 * i + 1] * mv.r1[3 + j]
                            + mv.r2[3 * i + 2] * mv.r1[6 + j])
            at[i] += mv.r2[3 * i + j] * mv.t1[j]
    cdef const float* q = &scan[0, 0]
    cdef float* o = &points[0, 0]
    cdef const double* f = &frames[0, 0]
    for k in range(3):  # the farthest a point in a box can be from the ego (t2), per axis
        lo, hi = f[LO + k], f[HI + k]
        for j in range(1, frames.shape[0]):
            lo, hi = min(lo, f[j * FRAME + LO + k]), max(hi, f[j * FRAME + HI + k])
        far += max(fabs(lo - mv.t2[k]), fabs(hi - mv.t2[k])) ** 2
    reach = ldexp(sqrt(far) + fabs(mv.t1[0]) + fabs(mv.t1[1]) + fabs(mv.t1[2]) + fabs(mv.t2[0]) + fabs(mv.t2[1])
                  + fabs(mv.t2[2]), -20)
    if not (reach < 1e9):
        reach = INFINITY
    _grid(&g, f, frames.shape[0], reach)
    got = <int64_t*>calloc(frames.shape[0], sizeof(int64_t))  # added to out only if all is decided
    try:
        if got == NULL:
            raise MemoryError()
        with nogil:
            p0 = 0
            while p0 < n:
                p1 = min(p0 + BATCH, n)
                near = 0
                for p in range(p0, p1):  # the points near a box (in a cell with boxes)
                    x = q[p * m]
                    y = q[p * m + 1]
                    z = q[p * m + 2]
                    c = _cell(&g, a[0] * x + a[1] * y + a[2] * z + at[0], a[3] * x + a[4] * y + a[5] * z + at[1])
                    idx[near] = p
                    cells[near] = c
                    near += (c >= 0) & (g.start[c if c >= 0 else 0] != g.start[c + 1 if c >= 0 else 0])
                for j in range(near):
                    p = idx[j]
                    bx[j] = q[p * m]
                    by[j] = q[p * m + 1]
                    bz[j] = q[p * m + 2]
                same &= _move_many(&mv, bx, by, bz, near)
                if not same:
                    break
                for j in range(near):
                    p = idx[j]
                    c = cells[j]
                    o[p] = <float>bx[j]
                    o[n + p] = <float>by[j]
                    o[2 * n + p] = <float>bz[j]
                    for k in range(g.start[c], g.start[c + 1]):
                        r = _test(&f[g.members[k] * FRAME], bx[j], by[j], bz[j], band)
                        got[g.members[k]] += r & 1
                        if r & 2:
                            with gil:
                                undecided.append((g.members[k], p))
                p0 = p1
        if not same:  # the caller counts this sweep another way
            return None
        for k in range(frames.shape[0]):
            out[k] += got[k]
    finally:
        _free_grid(&g)
        free(got)
    return undecided


cdef inline int _test(const double* f, double x, double y, double z, double band) noexcept nogil:
    """1: the point is in the box, 0: out, 2: undecided (within ``band`` of a face, or NaN)."""
    cdef double v0 = x - f[P1], v1 = y - f[P1 + 1], v2 = z - f[P1 + 2], d, ee, lim
    cdef int inside = 1, outside = 0, e
    for e in range(3):
        d = f[EI + 3 * e] * v0 + f[EI + 3 * e + 1] * v1 + f[EI + 3 * e + 2] * v2
        ee = f[II + e]
        lim = band * ee
        # (a flat box, ee == 0: only the exact test can say; a NaN: neither)
        outside |= ((d < -lim) | (d > ee + lim)) & (ee > 0.0)
        inside &= (d > lim) & (d < ee - lim)
    return inside | ((1 - (inside | outside)) << 1)


cdef struct Grid:
    # the boxes meeting each cell of a grid over their bounds (widened by a margin), as CSR
    Py_ssize_t nx, ny
    double gx, gy, hx, hy, inv
    bint single
    int64_t* start
    int64_t* members


cdef int _grid(Grid* g, const double* frames, Py_ssize_t nb, double margin) except -1:
    cdef Py_ssize_t b, c, cx, cy, x0, x1, y0, y1
    cdef double cell, lo[2]
    cdef double hi[2]
    cdef int64_t* fill = NULL
    g.start = NULL
    g.members = NULL
    g.gx, g.gy, g.hx, g.hy = frames[LO] - margin, frames[LO + 1] - margin, frames[HI] + margin, frames[HI + 1] + margin
    for b in range(nb):
        g.gx, g.gy = min(g.gx, frames[b * FRAME + LO] - margin), min(g.gy, frames[b * FRAME + LO + 1] - margin)
        g.hx, g.hy = max(g.hx, frames[b * FRAME + HI] + margin), max(g.hy, frames[b * FRAME + HI + 1] + margin)
    g.single = not (g.hx - g.gx < 1e9 and g.hy - g.gy < 1e9)  # unbounded (flat) or NaN boxes: one cell
    cell = 1.0 if g.single else max((g.hx - g.gx) / GRID, (g.hy - g.gy) / GRID, 0.25)
    g.nx = 1 if g.single else min(<Py_ssize_t>((g.hx - g.gx) / cell) + 1, GRID + 1)
    g.ny = 1 if g.single else min(<Py_ssize_t>((g.hy - g.gy) / cell) + 1, GRID + 1)
    g.inv = 1.0 / cell
    g.start = <int64_t*>calloc(g.nx * g.ny + 1, sizeof(int64_t))
    fill = <int64_t*>calloc(g.nx * g.ny, sizeof(int64_t))
    try:
        if g.start == NULL or fill == NULL:
            raise MemoryError()
        for b in range(nb):
            _cells(g, &frames[b * FRAME], margin, &x0, &x1, &y0, &y1)
            for cy in range(y0, y1 + 1):
                for cx in range(x0, x1 + 1):
                    g.start[cy * g.nx + cx + 1] += 1
        for c in range(g.nx * g.ny):
            g.start[c + 1] += g.start[c]
        g.members = <int64_t*>malloc(max(g.start[g.nx * g.ny], 1) * sizeof(int64_t))
        if g.members == NULL:
            raise MemoryError()
        for b in range(nb):
            _cells(g, &frames[b * FRAME], margin, &x0, &x1, &y0, &y1)
            for cy in range(y0, y1 + 1):
                for cx in range(x0, x1 + 1):
                    c = cy * g.nx + cx
                    g.members[g.start[c] + fill[c]] = b
                    fill[c] += 1
    except BaseException:
        _free_grid(g)
        raise
    finally:
        free(fill)
    return 0


cdef void _free_grid(Grid* g) noexcept:
    free(g.start)
    free(g.members)
    g.start = NULL
    g.members = NULL


cdef inline Py_ssize_t _cell(const Grid* g, double x, double y) noexcept nogil:
    """The cell of a point, -1 outside the grid."""
    if g.single:
        return 0
    if not (x >= g.gx and x <= g.hx and y >= g.gy and y <= g.hy):
        return -1
    return min(<Py_ssize_t>((y - g.gy) * g.inv), g.ny - 1) * g.nx + min(<Py_ssize_t>((x - g.gx) * g.inv), g.nx - 1)


cdef inline void _cells(const Grid* g, const double* f, double margin, Py_ssize_t* x0, Py_ssize_t* x1,
                        Py_ssize_t* y0, Py_ssize_t* y1) noexcept nogil:
    """The grid cells a box's bounds (widened by ``margin``) cover (a NaN box: all of them), by
    the points' own formula (monotonic: a point within the bounds falls in one of these cells)."""
    x0[0], x1[0], y0[0], y1[0] = 0, g.nx - 1, 0, g.ny - 1
    if g.nx == 1 and g.ny == 1:
        return
    if f[LO] - margin >= g.gx and f[HI] + margin >= g.gx:
        x0[0] = min(<Py_ssize_t>((f[LO] - margin - g.gx) * g.inv), g.nx - 1)
        x1[0] = min(<Py_ssize_t>((f[HI] + margin - g.gx) * g.inv), g.nx - 1)
    if f[LO + 1] - margin >= g.gy and f[HI + 1] + margin >= g.gy:
        y0[0] = min(<Py_ssize_t>((f[LO + 1] - margin - g.gy) * g.inv), g.ny - 1)
        y1[0] = min(<Py_ssize_t>((f[HI + 1] + margin - g.gy) * g.inv), g.ny - 1)


cdef struct Move:
    # a sweep's two steps (calibrated sensor, then ego pose): rotations and the translations as added
    double r1[9]
    double t1[3]
    double r2[9]
    double t2[3]


cdef int _move_of(Move* mv, const double[:, ::1] r1, const double[::1] t1, const double[:, ::1] r2,
                  const double[::1] t2, bint wide_add) except -1:
    cdef int i, j
    if r1.shape[0] != 3 or r1.shape[1] != 3 or r2.shape[0] != 3 or r2.shape[1] != 3 or t1.shape[0] != 3 \
            or t2.shape[0] != 3:
        raise ValueError("3 x 3 rotations and 3-vectors expected")
    for i in range(3):
        for j in range(3):
            mv.r1[3 * i + j] = r1[i, j]
            mv.r2[3 * i + j] = r2[i, j]
        mv.t1[i] = t1[i] if wide_add else <double>(<float>t1[i])
        mv.t2[i] = t2[i] if wide_add else <double>(<float>t2[i])
    return 0


cdef int _move_many(const Move* mv, double* x, double* y, double* z, Py_ssize_t n) noexcept nogil:
    """n sensor points moved to the world frame in place as the SDK rounds them (see
    :func:`sweep_to_world`; the float32 results stored as doubles), in loops without branches or
    calls (vector code): 0 if a row's sum within 16 units of 2**-53 of its terms' magnitude of ours
    could round to another float32 (rounding is monotonic: the ends decide)."""
    cdef Py_ssize_t j
    cdef int same = 1
    cdef double p0, p1, p2, a0, a1, a2, e0, e1, e2, u, v, w, t0, t1, t2
    cdef const double* r
    cdef int step
    for step in range(2):
        r = &mv.r1[0] if step == 0 else &mv.r2[0]
        t0, t1, t2 = (mv.t1[0], mv.t1[1], mv.t1[2]) if step == 0 else (mv.t2[0], mv.t2[1], mv.t2[2])
        for j in range(n):
            u = x[j]
            v = y[j]
            w = z[j]
            p0 = r[0] * u
            p1 = r[1] * v
            p2 = r[2] * w
            a0 = p0 + p1 + p2
            e0 = (fabs(p0) + fabs(p1) + fabs(p2)) * ULP16
            p0 = r[3] * u
            p1 = r[4] * v
            p2 = r[5] * w
            a1 = p0 + p1 + p2
            e1 = (fabs(p0) + fabs(p1) + fabs(p2)) * ULP16
            p0 = r[6] * u
            p1 = r[7] * v
            p2 = r[8] * w
            a2 = p0 + p1 + p2
            e2 = (fabs(p0) + fabs(p1) + fabs(p2)) * ULP16
            same &= ((<float>(a0 - e0)) == (<float>(a0 + e0))) & ((<float>(a1 - e1)) == (<float>(a1 + e1))) \
                & ((<float>(a2 - e2)) == (<float>(a2 + e2)))
            x[j] = <float>(<double>(<float>a0) + t0)
            y[j] = <float>(<double>(<float>a1) + t1)
            z[j] = <float>(<double>(<float>a2) + t2)
    return same


def sweep_to_world(const float[:, ::1] scan, const double[:, ::1] r1, const double[::1] t1,
                   const double[:, ::1] r2, const double[::1] t2, float[:, ::1] out, bint wide_add):
    """The (n, >= 3) float32 sensor points of a sweep (x, y, z first) to the world frame into the
    (3, n) float32 ``out``, as the SDK's ``rotate`` then ``translate`` (calibrated sensor, then ego
    pose) compute them with numpy: each rotation a float64 product stored back into float32, each
    translation a float64 sum (``wide_add``: numpy 2's promotion) or a float32 one (numpy 1's)
    stored into float32.

    The one step whose rounding numpy does not fix is a rotation's 3-term dot product (BLAS may
    sum in another order, or fuse). Its result and ours are each within 3 units in the last place
    (2**-53) of the row's terms' magnitude ``|r_k0 x| + |r_k1 y| + |r_k2 z|`` from the exact sum. A
    point whose float32 could change within 16 units of that is not decided here: the function
    returns False (the caller moves the sweep with numpy)."""
    cdef Py_ssize_t n = scan.shape[0], m = scan.shape[1], p, p0, p1
    cdef Move mv
    cdef int same = 1
    cdef double bx[BATCH]
    cdef double by[BATCH]
    cdef double bz[BATCH]
    if m < 3 or out.shape[0] != 3 or out.shape[1] != n:
        raise ValueError("sweep_to_world: scan (n, >= 3) and out (3, n) expected")
    _move_of(&mv, r1, t1, r2, t2, wide_add)
    if n == 0:
        return True
    cdef const float* q = &scan[0, 0]
    cdef float* o = &out[0, 0]
    with nogil:
        p0 = 0
        while p0 < n and same:
            p1 = min(p0 + BATCH, n)
            for p in range(p0, p1):
                bx[p - p0] = q[p * m]
                by[p - p0] = q[p * m + 1]
                bz[p - p0] = q[p * m + 2]
            same &= _move_many(&mv, bx, by, bz, p1 - p0)
            for p in range(p0, p1):
                o[p] = <float>bx[p - p0]
                o[n + p] = <float>by[p - p0]
                o[2 * n + p] = <float>bz[p - p0]
            p0 = p1
    return same != 0


# --- the JSON types of a table's declared columns (_jsontypes.h) -----------------------------------
cdef extern from "_jsontypes.h":
    ctypedef struct l5_json_fault:
        int64_t row
        int64_t key
        int64_t element
        int64_t found
        int64_t offset
    int l5_json_types(const uint8_t* start, const uint8_t* end, const uint8_t* const* keys, const int64_t* lens,
                      const int64_t* kinds, int64_t nkeys, l5_json_fault* fault) nogil


def json_types(const uint8_t[::1] data, list keys, const int64_t[::1] kinds):
    """Check the JSON type of each declared key's value in every row of the table ``data`` (a JSON
    array of objects): ``(status, row, key index, element, found type, byte offset)``; status 0
    (all fit), 1 (a mismatch), 2 (cannot vouch: check another way), 3 (nested too deeply), 4 (a
    declared key twice in one object)."""
    cdef Py_ssize_t n = len(keys), i
    cdef l5_json_fault fault
    cdef int status
    if kinds.shape[0] != n or n > 64:
        raise ValueError("json_types: a kind per key, at most 64 keys")
    cdef const uint8_t* ptrs[64]
    cdef int64_t lens[64]
    cdef list held = [bytes(k) for k in keys]
    for i in range(n):
        ptrs[i] = <const uint8_t*><char*>held[i]
        lens[i] = len(held[i])
    if data.shape[0] == 0:
        return 2, -1, -1, -1, -1, 0
    with nogil:
        status = l5_json_types(&data[0], &data[0] + data.shape[0], ptrs, lens, &kinds[0] if n else NULL, n, &fault)
    return status, fault.row, fault.key, fault.element, fault.found, fault.offset


# --- 3D detection matching (l5dask.perception.detection) ---------------------------------------
cdef inline double _cross(double ax, double ay, double bx, double by) noexcept nogil:
    return ax * by - ay * bx


cdef double _clip_area(const double* p, const double* q) noexcept nogil:
    """Area of the intersection of two convex quadrilaterals ``p`` and ``q`` (x, y of 4 corners each,
    either orientation): ``p`` clipped by each edge of ``q`` (Sutherland-Hodgman), then the shoelace.
    Each vertex's side of an edge is computed once, and no index is taken modulo (the arithmetic of
    the plain loop, the same bits)."""
    cdef double a[32]
    cdef double b[32]
    cdef double d[16]
    cdef double* src = a
    cdef double* dst = b
    cdef double* t
    cdef int n = 4, m, i, j, k
    cdef double ex, ey, fx, fy, sx, sy, ux, uy, su, sv, w, orient = 0.0, area = 0.0
    for i in range(8):
        a[i] = p[i]
    for i in range(4):
        j = i + 1 if i < 3 else 0
        orient += _cross(q[2 * i], q[2 * i + 1], q[2 * j], q[2 * j + 1])
    if orient == 0.0:
        return 0.0
    for i in range(4):
        ex, ey = q[2 * i], q[2 * i + 1]
        j = i + 1 if i < 3 else 0
        fx, fy = q[2 * j] - ex, q[2 * j + 1] - ey
        for j in range(n):
            d[j] = _cross(fx, fy, src[2 * j] - ex, src[2 * j + 1] - ey) * orient
        m = 0
        for j in range(n):
            k = j + 1 if j + 1 < n else 0
            sx, sy = src[2 * j], src[2 * j + 1]
            su, sv = d[j], d[k]
            if su >= 0:
                dst[2 * m], dst[2 * m + 1] = sx, sy
                m += 1
            if (su >= 0) != (sv >= 0) and m < 15:
                ux, uy = src[2 * k], src[2 * k + 1]
                w = su / (su - sv)
                dst[2 * m], dst[2 * m + 1] = sx + w * (ux - sx), sy + w * (uy - sy)
                m += 1
        n = m
        t = src
        src = dst
        dst = t
        if n < 3:
            return 0.0
    for i in range(n):
        j = i + 1 if i + 1 < n else 0
        area += _cross(src[2 * i], src[2 * i + 1], src[2 * j], src[2 * j + 1])
    return fabs(area) * 0.5


def match_boxes(const double[:, ::1] pred, const int64_t[::1] pred_group, const double[:, ::1] gt,
                const int64_t[::1] gt_start, const double[::1] thresholds, double eps,
                uint8_t[:, ::1] tp, uint8_t[::1] unsure):
    """The SDK's greedy matching of every threshold at once.

    ``pred`` and ``gt`` rows: 8 corner coordinates (x, y of the 4 ground corners, relative to a
    point of their sample), z min, z max, volume, and the radius of the corners' circle. Predictions
    are in matching order (their group, then descending score, ties in input order); group ``g``'s
    ground truth is ``gt[gt_start[g]:gt_start[g + 1]]``. ``tp[i, k]`` is set when prediction ``i``
    matches at threshold ``k``. A group where a decision depends on IoUs closer than ``eps`` to a
    threshold or to each other is marked in ``unsure`` (decide it exactly), its flags left unset.
    """
    cdef Py_ssize_t n = pred.shape[0], nk = thresholds.shape[0], i, j, k, g, g0, g1, best, start = 0
    cdef Py_ssize_t ng = gt_start.shape[0] - 1
    cdef double dx, dy, r, inter, h, union, iou, top, runner
    cdef double* ious = NULL
    cdef uint8_t* taken = NULL
    cdef double thr
    if pred.shape[1] != 12 or gt.shape[1] != 12 or tp.shape[0] != n or tp.shape[1] != nk or unsure.shape[0] != ng:
        raise ValueError("match_boxes: 12 numbers a box, a flag per prediction and threshold, one per group")
    cdef Py_ssize_t most = 1
    for g in range(ng):
        most = max(most, gt_start[g + 1] - gt_start[g])
    ious = <double*>malloc(most * sizeof(double))
    taken = <uint8_t*>calloc(most * nk, 1)
    if ious == NULL or taken == NULL:
        free(ious)
        free(taken)
        raise MemoryError()
    try:
        with nogil:
            i = 0
            while i < n:
                g = pred_group[i]
                g0, g1 = gt_start[g], gt_start[g + 1]
                for j in range((g1 - g0) * nk):
                    taken[j] = 0
                start = i
                while i < n and pred_group[i] == g:
                    best = -1
                    top = -INFINITY
                    runner = -INFINITY
                    for j in range(g0, g1):
                        iou = 0.0
                        r = pred[i, 11] + gt[j, 11]
                        dx = (gt[j, 0] + gt[j, 4]) * 0.5 - (pred[i, 0] + pred[i, 4]) * 0.5
                        dy = (gt[j, 1] + gt[j, 5]) * 0.5 - (pred[i, 1] + pred[i, 5]) * 0.5
                        if dx * dx + dy * dy <= r * r * 1.0000001:
                            h = min(pred[i, 9], gt[j, 9]) - max(pred[i, 8], gt[j, 8])
                            if h > 0:
                                inter = h * _clip_area(&pred[i, 0], &gt[j, 0])
                                union = pred[i, 10] + gt[j, 10] - inter
                                iou = inter / union if union > 0 else 0.0
                                iou = min(max(iou, 0.0), 1.0)
                        ious[j - g0] = iou
                        if iou > top:
                            runner = top
                            top = iou
                            best = j - g0
                        elif iou > runner:
                            runner = iou
                    for k in range(nk):
                        thr = thresholds[k]
                        if best < 0 or top <= thr - eps:
                            continue  # a false positive, surely
                        if fabs(top - thr) <= eps or top - runner <= eps and runner > thr - eps:
                            unsure[g] = 1  # the threshold or the choice of ground truth is too close to call
                            continue
                        if not taken[best * nk + k]:
                            taken[best * nk + k] = 1
                            tp[i, k] = 1
                    i += 1
                if unsure[g]:
                    for j in range(start, i):
                        for k in range(nk):
                            tp[j, k] = 0
    finally:
        free(ious)
        free(taken)


cdef enum:
    # a box's row in the geometry functions' tables (l5dask.perception.geometry): its ground centre,
    # its 4 ground corners relative to that centre (x, y each), z min, z max, volume, corners' radius
    GX = 0
    GY = 1
    GC = 2
    GZLO = 10
    GZHI = 11
    GVOL = 12
    GRAD = 13
    GBOX = 14


cdef inline int _clip_side(const double* src, int n, double* dst, int k, double lim, double sgn) noexcept nogil:
    """``src``'s ``n`` vertices clipped to ``sgn * coordinate k <= lim`` into ``dst`` (Sutherland-Hodgman);
    their number. Without branches: each vertex and each crossing is written, and counted when it
    is kept (a convex polygon clipped by a line gains at most one vertex: 9 at most, in room for 12;
    a crossing's division where there is none is written over, never counted)."""
    cdef int m = 0, j
    cdef double su = lim - sgn * src[k], sv, w, s0 = su, ux, uy, sx, sy
    for j in range(n):
        sx = src[2 * j]
        sy = src[2 * j + 1]
        if j + 1 < n:
            sv = lim - sgn * src[2 * j + 2 + k]
            ux = src[2 * j + 2]
            uy = src[2 * j + 3]
        else:
            sv = s0
            ux = src[0]
            uy = src[1]
        dst[2 * m] = sx
        dst[2 * m + 1] = sy
        m += su >= 0
        w = su / (su - sv)
        dst[2 * m] = sx + w * (ux - sx)
        dst[2 * m + 1] = sy + w * (uy - sy)
        m += (su >= 0) != (sv >= 0)
        su = sv
    return m


cdef double _rect_clip_area(const double* a, const double* q) noexcept nogil:
    """Area of the intersection of box ``a``'s ground rectangle (its row: corners relative to its
    centre) and the convex quadrilateral ``q`` (4 corners relative to ``a``'s centre). ``q`` is
    taken into ``a``'s own axes, each scaled by that axis's length, so that ``a`` is the box
    ``|x| <= |u|^2, |y| <= |v|^2``: four clips by comparisons (Sutherland-Hodgman), no cross
    product; the shoelace's area divided by ``|u| |v|``. The same area as ``_clip_area`` to a few
    units of the last place (``tests/test_geometry.py`` holds both to the SDK's), in two thirds of its
    time; a box's own rectangle has ``_clip_area``'s bits (an IoU of a box and itself is the SDK's)."""
    cdef double a0[24]
    cdef double b0[24]
    cdef double* src = a0
    cdef double ux = (a[GC] + a[GC + 2]) * 0.5, uy = (a[GC + 1] + a[GC + 3]) * 0.5
    cdef double vx = (a[GC + 2] - a[GC]) * 0.5, vy = (a[GC + 3] - a[GC + 1]) * 0.5
    cdef double uu = ux * ux + uy * uy, vv = vx * vx + vy * vy, area = 0.0
    cdef int n, i, j
    if uu == 0.0 or vv == 0.0:
        return 0.0
    for i in range(8):
        if q[i] != a[GC + i]:
            break
    else:  # the same ground rectangle (a box and itself): its own area, as _clip_area makes it
        for i in range(4):
            j = i + 1 if i < 3 else 0
            area += _cross(q[2 * i], q[2 * i + 1], q[2 * j], q[2 * j + 1])
        return fabs(area) * 0.5
    for i in range(4):
        src[2 * i] = q[2 * i] * ux + q[2 * i + 1] * uy
        src[2 * i + 1] = q[2 * i] * vx + q[2 * i + 1] * vy
    # the kept side of each edge of a: x <= uu, -x <= uu, y <= vv, -y <= vv
    n = _clip_side(a0, 4, b0, 0, uu, 1.0)
    if n < 3:
        return 0.0
    n = _clip_side(b0, n, a0, 0, uu, -1.0)
    if n < 3:
        return 0.0
    n = _clip_side(a0, n, b0, 1, vv, 1.0)
    if n < 3:
        return 0.0
    n = _clip_side(b0, n, a0, 1, vv, -1.0)
    if n < 3:
        return 0.0
    for i in range(n):
        j = i + 1 if i + 1 < n else 0
        area += src[2 * i] * src[2 * j + 1] - src[2 * i + 1] * src[2 * j]
    return fabs(area) * 0.5 / sqrt(uu * vv)


cdef inline double _pair(const double* a, const double* b, int what) noexcept nogil:
    """One pair's height intersection (``what`` 0), ground intersection area (1), volume
    intersection (2) or IoU (3), with ``b``'s corners placed relative to ``a``'s centre."""
    cdef double q[8]
    cdef double dx = b[GX] - a[GX], dy = b[GY] - a[GY], r = a[GRAD] + b[GRAD], h, area, inter, union
    cdef int k
    h = max(0.0, min(a[GZHI], b[GZHI]) - max(a[GZLO], b[GZLO]))
    if what == 0:
        return h
    if what >= 2 and h <= 0.0:
        return 0.0
    area = 0.0
    if dx * dx + dy * dy <= r * r * 1.0000001:
        for k in range(4):
            q[2 * k] = dx + b[GC + 2 * k]
            q[2 * k + 1] = dy + b[GC + 2 * k + 1]
        area = _rect_clip_area(a, q)
    if what == 1:
        return area
    inter = h * area
    if what == 2:
        return inter
    union = a[GVOL] + b[GVOL] - inter
    return min(max(inter / union if union > 0 else 0.0, 0.0), 1.0)


cdef inline bint _box_row(const double* t, const double* sz, const double* r, bint corrected, double* o,
                          bint radius=True) noexcept nogil:
    """A box's ``GBOX`` numbers (as ``geometry.table`` makes them, the corners relative to its
    centre) into ``o``; False (``o`` not filled) when a number is not finite, a size not positive or
    the rotation's norm 0. Without ``radius``, the corners' radius is infinite: no pair is passed
    over before its clip (element-wise pairs, mostly near each other, save two square roots a box;
    a clip of boxes apart is 0 all the same)."""
    cdef double big = 1.7976931348623157e308
    cdef double w = r[0], x = r[1], y = r[2], z = r[3], wid = sz[0], length = sz[1], height = sz[2]
    cdef double nrm = sqrt(w * w + x * x + y * y + z * z), c, s, lc, ls, wc, ws
    cdef bint ok = (fabs(t[0]) <= big) & (fabs(t[1]) <= big) & (fabs(t[2]) <= big)  # (NaN fails)
    ok &= (wid <= big) & (length <= big) & (height <= big) & (fabs(w) <= big) & (fabs(x) <= big)
    ok &= (fabs(y) <= big) & (fabs(z) <= big) & (wid > 0) & (length > 0) & (height > 0) & (nrm > 0)
    if not ok:
        return False
    w, x, y, z = w / nrm, x / nrm, y / nrm, z / nrm
    c = 1.0 - 2.0 * (y * y + z * z)
    s = 2.0 * (x * y + w * z) if corrected else 2.0 * (x * y - w * z)
    lc, ls, wc, ws = length / 2 * c, length / 2 * s, wid / 2 * c, wid / 2 * s
    o[GX], o[GY] = t[0], t[1]
    o[GC], o[GC + 1] = lc + ws, ls - wc
    o[GC + 2], o[GC + 3] = lc - ws, ls + wc
    o[GC + 4], o[GC + 5] = -lc - ws, -ls + wc
    o[GC + 6], o[GC + 7] = -lc + ws, -ls - wc
    o[GZLO] = t[2] - height / 2
    o[GZHI] = t[2] + height / 2
    o[GVOL] = wid * length * height
    o[GRAD] = sqrt(wid * wid + length * length) / 2 * max(1.0, sqrt(c * c + s * s)) if radius else INFINITY
    return True


def _boxes_ok(xyz, size, rotation):
    if xyz.shape[1] != 3 or size.shape[1] != 3 or rotation.shape[1] != 4 or size.shape[0] != xyz.shape[0] \
            or rotation.shape[0] != xyz.shape[0]:
        raise ValueError("boxes: translation (n, 3), size (n, 3), rotation (n, 4)")


def box_pairs(const double[:, ::1] xyz_a, const double[:, ::1] size_a, const double[:, ::1] rot_a,
              const double[:, ::1] xyz_b, const double[:, ::1] size_b, const double[:, ::1] rot_b,
              bint corrected, int what, bint outer, double[::1] out, const double[::1] thresholds, double eps,
              uint8_t[::1] near):
    """The height intersection, ground intersection area, volume intersection or IoU (``what`` 0 to
    3) of boxes ``a`` and ``b`` (translation, size, rotation each): of every pair ``(a[i], b[j])``
    into ``out[i * len(b) + j]`` (``outer``), else of ``(a[k], b[k])`` into ``out[k]`` (one side
    may be a single box, paired with each of the other's). ``near[k]`` (when ``near`` is not empty)
    is set where ``out[k]`` is within ``eps`` of one of ``thresholds``.

    Returns ``(near count, first bad box of a, first bad box of b)`` (-1: none; a bad box, not
    finite, not of positive size or of rotation norm 0, stops the pass: the caller names it)."""
    _boxes_ok(xyz_a, size_a, rot_a)
    _boxes_ok(xyz_b, size_b, rot_b)
    cdef Py_ssize_t na = xyz_a.shape[0], nb = xyz_b.shape[0], n, i, j, k, t, nt = thresholds.shape[0], count = 0
    cdef Py_ssize_t bad_a = -1, bad_b = -1, ia, ib
    cdef double v, lo, hi
    cdef double ra[GBOX]
    cdef double rb[GBOX]
    cdef double* tb = NULL
    if not (0 <= what <= 3):
        raise ValueError("box_pairs: what in 0..3")
    n = na * nb if outer else max(na, nb)
    if out.shape[0] != n or (not outer and na != nb and min(na, nb) != 1) or (near.shape[0] and near.shape[0] != n):
        raise ValueError("box_pairs: out (and near) has a value per pair; pairs of equal lengths (or one box)")
    for i in range(na):  # (every box checked, even with no pair)
        if not _box_row(&xyz_a[i, 0], &size_a[i, 0], &rot_a[i, 0], corrected, ra):
            return 0, i, -1
    if outer and nb:
        tb = <double*>malloc(nb * GBOX * sizeof(double))
        if tb == NULL:
            raise MemoryError()
    try:
        with nogil:
            for j in range(nb):
                if not _box_row(&xyz_b[j, 0], &size_b[j, 0], &rot_b[j, 0], corrected, &tb[j * GBOX] if outer else rb):
                    bad_b = j
                    break
            if bad_b < 0 and n:
                if outer:
                    for i in range(na):
                        _box_row(&xyz_a[i, 0], &size_a[i, 0], &rot_a[i, 0], corrected, ra)
                        for j in range(nb):
                            out[i * nb + j] = _pair(ra, &tb[j * GBOX], what)
                else:
                    for k in range(n):
                        ia = k if na > 1 else 0
                        ib = k if nb > 1 else 0
                        _box_row(&xyz_a[ia, 0], &size_a[ia, 0], &rot_a[ia, 0], corrected, ra, False)
                        _box_row(&xyz_b[ib, 0], &size_b[ib, 0], &rot_b[ib, 0], corrected, rb, False)
                        out[k] = _pair(ra, rb, what)
                if near.shape[0]:
                    lo, hi = INFINITY, -INFINITY
                    for t in range(nt):
                        lo, hi = min(lo, thresholds[t] - eps), max(hi, thresholds[t] + eps)
                    for k in range(n):
                        v = out[k]
                        near[k] = 0
                        if v < lo or v > hi:
                            continue
                        for t in range(nt):
                            if fabs(v - thresholds[t]) <= eps:
                                near[k] = 1
                                count += 1
                                break
    finally:
        free(tb)
    return count, bad_a, bad_b


# --- detection files in blocks (l5dask.perception.boxes) ----------------------------------------
cdef inline bint _is_ws(uint8_t c) noexcept nogil:
    return c == 32 or c == 10 or c == 13 or c == 9


cdef inline Py_ssize_t _past_ws(const uint8_t* d, Py_ssize_t n, Py_ssize_t j, uint8_t want) noexcept nogil:
    """From ``j``, past whitespace: the index of ``want`` there; -1 if another byte is; -2 if the
    bytes end first."""
    while j < n and _is_ws(d[j]):
        j += 1
    if j >= n:
        return -2
    return j if d[j] == want else -1


cdef Py_ssize_t _seam_at(const uint8_t* d, Py_ssize_t n, Py_ssize_t i) noexcept nogil:
    """Where ``}`` at ``i`` is followed by whitespace, a comma, whitespace and ``{``: that ``{``'s
    index; -1 if it is not; -2 if the bytes end before that is decided."""
    cdef Py_ssize_t j = _past_ws(d, n, i + 1, 44)
    return j if j < 0 else _past_ws(d, n, j + 1, 123)


cdef Py_ssize_t _seams(const uint8_t* d, Py_ssize_t n, Py_ssize_t first, int64_t* e, int64_t* s,
                       Py_ssize_t* undecided) noexcept nogil:
    """Count the seams from ``first`` on, writing their ends and starts when ``e`` is not NULL."""
    cdef Py_ssize_t i = first, j, count = 0
    cdef const void* hit
    undecided[0] = -1
    while i < n:
        hit = memchr(d + i, 125, n - i)
        if hit == NULL:
            break
        i = <const uint8_t*>hit - d
        j = _seam_at(d, n, i)
        if j >= 0:
            if e != NULL:
                e[count] = i + 1
                s[count] = j
            count += 1
        elif j == -2:
            undecided[0] = i
            break
        i += 1
    return count


def json_seams(const uint8_t[::1] data, Py_ssize_t first=0):
    """The seams of a JSON array of objects: for every ``}`` (at ``first`` or after) followed by
    whitespace, a comma, whitespace and ``{``, the index just past that ``}`` and the index of that
    ``{`` (two int64 arrays); and the index of the ``}`` after the last seam whose bytes end before
    it is decided (-1: none). A guess, not a parse: a seam may lie inside a string; the blocks cut
    there are parsed strictly, and a wrong cut fails that parse."""
    cdef Py_ssize_t n = data.shape[0], count, undecided = -1
    if n == 0 or first >= n:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), -1
    with nogil:
        count = _seams(&data[0], n, first, NULL, NULL, &undecided)
    ends = np.empty(count, np.int64)
    starts = np.empty(count, np.int64)
    cdef int64_t[::1] e = ends, s = starts
    if count:
        with nogil:
            _seams(&data[0], n, first, &e[0], &s[0], &undecided)
    return ends, starts, undecided


def json_key_spans(const uint8_t[::1] data, const int64_t[::1] starts, const int64_t[::1] ends, bytes key):
    """In each segment ``[starts[i], ends[i])`` of ``data``, the string value of the one ``"key"``
    followed by a colon: its bytes' span (two int64 arrays) and the first segment where there is
    not exactly one, or the value holds an escape or does not end (-1: none). A guess, as the
    seams are: the blocks' strict parse checks it."""
    cdef Py_ssize_t n = starts.shape[0], i, p, q, lo, hi, klen = len(key), found
    cdef Py_ssize_t size = data.shape[0]
    cdef const uint8_t* d = &data[0] if size else NULL
    cdef const uint8_t* kp = <const uint8_t*><char*>key
    cdef const void* hit
    cdef Py_ssize_t bad = -1
    vs = np.zeros(n, np.int64)
    ve = np.zeros(n, np.int64)
    cdef int64_t[::1] a = vs, b = ve
    with nogil:
        for i in range(n):
            lo, hi = starts[i], ends[i]
            if lo < 0 or hi > size or lo > hi:
                bad = i
                break
            found = 0
            p = lo
            while p < hi:
                hit = memchr(d + p, 34, hi - p)
                if hit == NULL:
                    break
                p = <const uint8_t*>hit - d
                if p + klen + 2 <= hi and d[p + klen + 1] == 34 and memcmp(d + p + 1, kp, klen) == 0:
                    q = p + klen + 2
                    while q < hi and _is_ws(d[q]):
                        q += 1
                    if q < hi and d[q] == 58:
                        q += 1
                        while q < hi and _is_ws(d[q]):
                            q += 1
                        if q >= hi or d[q] != 34:
                            found = 2
                            break
                        q += 1
                        a[i] = q
                        while q < hi and d[q] != 34 and d[q] != 92:
                            q += 1
                        if q >= hi or d[q] != 34:
                            found = 2
                            break
                        b[i] = q
                        found += 1
                        p = q + 1
                        continue
                p += 1
            if found != 1:
                bad = i
                break
    return vs, ve, bad
