# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Lidar points in boxes (GIL released): see :mod:`l5dask.perception.lidar`.

A sweep's points moved to the world frame as the SDK rounds them, and counted in the boxes by the
SDK's ``points_in_box`` test, the boxes binned on a grid so that a point meets only the boxes near it.

What it beats, and by how much: the SDK's ``points_in_box`` per box, on the points its
``LidarPointCloud`` moves: points in boxes 76-90x the SDK's per-box loop (``python
benchmarks/perception_benchmark.py --part lidar``, 2026-11-24, docs/benchmarks.md). Delete it when
a numpy form of the same test (which moves every point and tests every box) comes within 10% of it.
"""

from libc.stdint cimport int64_t
from libc.stdlib cimport calloc, free, malloc
from libc.math cimport INFINITY, fabs, ldexp, sqrt

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

