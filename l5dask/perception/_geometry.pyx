# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Box geometry's pairs (GIL released): see :mod:`l5dask.perception.geometry`.

``box_pairs``: the height intersection, ground intersection area, volume intersection or IoU of
pairs of boxes, element-wise (their rows made a chunk at a time) or all pairs (the second side's
rows made once). A pair's ground intersection is taken in the first box's own axes, each scaled by
its length (the first box is ``|x| <= |U|^2, |y| <= |V|^2``): the sum, over the second box's four
edges, of the integral along x (within the first's x range) of the edge's y clamped to the first's
y range (``_edge``: no polygon clipped, no branch, two divisions an edge). Boxes apart, one inside
the other and a box against its own rectangle are settled before. Within 1e-12 of GEOS's (the
SDK's shapely) relative to the smaller box's area (``tests/test_geometry.py``, on boxes built to
put edges on edges, boxes inside boxes and boxes touching).

What it beats, and by how much (``python benchmarks/geometry_benchmark.py --rounds 5``, 2026-11-27,
a shared 2-core machine at load 17, rounds interleaved): 1 M element-wise overlapping pairs 250x the
SDK's ``Box3D.get_iou`` loop's pairs per second and 225x shapely 2's vectorised ``shapely.intersection``
(whose overlay of overlapping pairs is slower than the SDK's loop); all pairs of 100 x 100 boxes
2,618x the SDK's loop and 130x shapely's. Against the Sutherland-Hodgman clip it replaced (two
passes of two sides each, ``6afa34c``): 1 M pairs in 63 against 131 ms of one thread's CPU. Delete
it if shapely's vectorised overlay comes within 2x of it.
"""

from libc.stdint cimport uint8_t
from libc.stdlib cimport free, malloc
from libc.math cimport INFINITY, fabs, sqrt

cdef enum:
    # a box's row in the geometry functions' tables (l5dask.perception.geometry): its ground centre,
    # its half-length axis U and half-width axis V (its corners are the centre +- U +- V), their
    # squared lengths, z min, z max, volume, ground area, the corners' radius
    GX = 0
    GY = 1
    UX = 2
    UY = 3
    VX = 4
    VY = 5
    GUU = 6
    GVV = 7
    GZLO = 8
    GZHI = 9
    GVOL = 10
    GAREA = 11
    GRAD = 12
    GBOX = 13
    CHUNK = 64  # element-wise pairs whose boxes' rows are made at a time


cdef inline int _slab(const double* x, const double* y, int n, double* ox, double* oy, double lim) noexcept nogil:
    """The polygon ``(x, y)`` of ``n`` vertices clipped to ``-lim <= x <= lim`` (both sides of a
    slab in one Sutherland-Hodgman pass) into ``(ox, oy)``; the number of vertices kept. Without
    branches: each vertex and both crossings of each edge are written, and counted when they are
    kept (in the order the edge meets them); a crossing is at ``x = +-lim`` exactly, its other
    coordinate from the edge's slope (one division an edge). A convex polygon gains at most one
    vertex a side: ``n + 2``, written in room for ``n + 3``."""
    cdef int m = 0, j, k, e_lo, e_hi, right
    cdef double xs, ys, xu, yu, slope, ylo, yhi
    for j in range(n):
        k = j + 1 if j + 1 < n else 0
        xs = x[j]
        ys = y[j]
        xu = x[k]
        yu = y[k]
        ox[m] = xs
        oy[m] = ys
        m += (xs >= -lim) & (xs <= lim)
        slope = (yu - ys) / (xu - xs)
        ylo = ys + (-lim - xs) * slope
        yhi = ys + (lim - xs) * slope
        e_lo = (xs < -lim) != (xu < -lim)
        e_hi = (xs > lim) != (xu > lim)
        right = xs < xu
        ox[m] = -lim if right else lim
        oy[m] = ylo if right else yhi
        m += e_lo if right else e_hi
        ox[m] = lim if right else -lim
        oy[m] = yhi if right else ylo
        m += e_hi if right else e_lo
    return m


cdef inline double _rect_area(const double* a, const double* b) noexcept nogil:
    """Area of the intersection of the ground rectangles of boxes ``a`` and ``b`` (their rows).
    ``b``'s corners are taken into ``a``'s own axes, each scaled by that axis's length, so that
    ``a`` is the box ``|x| <= |U|^2, |y| <= |V|^2``: when one rectangle holds the other, the
    other's area; else two slab clips by comparisons (Sutherland-Hodgman), the shoelace's area
    divided by ``|U| |V|``. A box against its own rectangle: the shoelace of its corners."""
    cdef double x0[16]
    cdef double y0[16]
    cdef double x1[16]
    cdef double y1[16]
    cdef double uu = a[GUU], vv = a[GVV], uub = b[GUU], vvb = b[GVV], area = 0.0
    cdef double dx = b[GX] - a[GX], dy = b[GY] - a[GY]
    cdef double px, py, qx, qy, lu, lv, wu, wv
    cdef int n, i, j
    if uu == 0.0 or vv == 0.0 or uub == 0.0 or vvb == 0.0:
        return 0.0
    if dx == 0.0 and dy == 0.0 and a[UX] == b[UX] and a[UY] == b[UY] and a[VX] == b[VX] and a[VY] == b[VY]:
        x0[0], y0[0] = a[UX] - a[VX], a[UY] - a[VY]
        x0[1], y0[1] = a[UX] + a[VX], a[UY] + a[VY]
        x0[2], y0[2] = -a[UX] + a[VX], -a[UY] + a[VY]
        x0[3], y0[3] = -a[UX] - a[VX], -a[UY] - a[VY]
        for i in range(4):
            j = i + 1 if i < 3 else 0
            area += x0[i] * y0[j] - y0[i] * x0[j]
        return fabs(area) * 0.5
    # b's centre and axes in a's scaled axes (x: along U, y: along V), and a's in b's
    px = dx * a[UX] + dy * a[UY]
    py = dx * a[VX] + dy * a[VY]
    qx = -(dx * b[UX] + dy * b[UY])
    qy = -(dx * b[VX] + dy * b[VY])
    lu = a[UX] * b[UX] + a[UY] * b[UY]  # U_a . U_b
    lv = a[VX] * b[UX] + a[VY] * b[UY]  # V_a . U_b
    wu = a[UX] * b[VX] + a[UY] * b[VY]  # U_a . V_b
    wv = a[VX] * b[VX] + a[VY] * b[VY]  # V_a . V_b
    # b inside a: b's corners centre +- U_b +- V_b, in a's axes
    if fabs(px) + fabs(lu) + fabs(wu) <= uu and fabs(py) + fabs(lv) + fabs(wv) <= vv:
        return b[GAREA]
    # a inside b: a's corners in b's axes
    if fabs(qx) + fabs(lu) + fabs(lv) <= uub and fabs(qy) + fabs(wu) + fabs(wv) <= vvb:
        return a[GAREA]
    # separated along one of a's or b's axes: nothing in common
    if fabs(px) - fabs(lu) - fabs(wu) > uu or fabs(py) - fabs(lv) - fabs(wv) > vv \
            or fabs(qx) - fabs(lu) - fabs(lv) > uub or fabs(qy) - fabs(wu) - fabs(wv) > vvb:
        return 0.0
    area = _edge(px + lu - wu, py + lv - wv, px + lu + wu, py + lv + wv, uu, vv) \
        + _edge(px + lu + wu, py + lv + wv, px - lu + wu, py - lv + wv, uu, vv) \
        + _edge(px - lu + wu, py - lv + wv, px - lu - wu, py - lv - wv, uu, vv) \
        + _edge(px - lu - wu, py - lv - wv, px + lu - wu, py + lv - wv, uu, vv)
    area = fabs(area) / sqrt(uu * vv)
    # boxes that touch (an edge on an edge, a corner on an edge) leave a rounding's crumb, ~1e-15 of
    # their areas: 0, as the SDK's GEOS says (an area this small is 0 within the 1e-12 promised)
    return area if area > 1e-13 * min(a[GAREA], b[GAREA]) else 0.0


cdef extern from *:
    """
    /* IEEE minimum and maximum as one instruction each, without a branch (minsd/maxsd: "a < b ? a : b",
       the second operand when either is NaN) */
    #if defined(__SSE2__)
    #include <emmintrin.h>
    static inline double l5_min(double a, double b) { return _mm_cvtsd_f64(_mm_min_sd(_mm_set_sd(a), _mm_set_sd(b))); }
    static inline double l5_max(double a, double b) { return _mm_cvtsd_f64(_mm_max_sd(_mm_set_sd(a), _mm_set_sd(b))); }
    #else
    static inline double l5_min(double a, double b) { return a < b ? a : b; }
    static inline double l5_max(double a, double b) { return a > b ? a : b; }
    #endif
    """
    double l5_min(double a, double b) noexcept nogil
    double l5_max(double a, double b) noexcept nogil


cdef inline double _edge(double xa, double ya, double xb, double yb, double u, double v) noexcept nogil:
    """The integral along x of ``clamp(y, -v, v)`` over the part of the edge from ``(xa, ya)`` to
    ``(xb, yb)`` within ``-u <= x <= u`` (signed by the edge's direction): summed over a convex
    polygon's edges, minus its area within the rectangle ``|x| <= u, |y| <= v`` (counter-clockwise).
    Without branches, two divisions."""
    # (a vertical edge, dx 0: its slope, infinite or NaN, is held to 1e100: a width of 0 times finite numbers)
    cdef double slope = l5_min(l5_max((yb - ya) / (xb - xa), -1e100), 1e100)
    cdef double ca = l5_min(l5_max(xa, -u), u), cb = l5_min(l5_max(xb, -u), u)
    cdef double ya2 = ya + (ca - xa) * slope, yb2 = ya + (cb - xa) * slope
    cdef double lo = l5_min(ya2, yb2), hi = l5_max(ya2, yb2)
    cdef double inv = 1.0 / (hi - lo)  # (infinite for a level edge: the shares below are 0 or 1)
    cdef double fb = l5_min(l5_max((-v - lo) * inv, 0.0), 1.0)  # the share of the edge below -v (NaN: 0)
    cdef double fa = l5_min(l5_max((hi - v) * inv, 0.0), 1.0)  # above v
    return (cb - ca) * ((fa - fb) * v + (1.0 - fb - fa) * 0.5 * (l5_min(l5_max(ya2, -v), v) + l5_min(l5_max(yb2, -v), v)))


cdef inline double _pair(const double* a, const double* b, int what) noexcept nogil:
    """One pair's height intersection (``what`` 0), ground intersection area (1), volume
    intersection (2) or IoU (3)."""
    cdef double dx = b[GX] - a[GX], dy = b[GY] - a[GY], r = a[GRAD] + b[GRAD], h, area, inter, union
    h = max(0.0, min(a[GZHI], b[GZHI]) - max(a[GZLO], b[GZLO]))
    if what == 0:
        return h
    if what >= 2 and h <= 0.0:
        return 0.0
    area = 0.0
    if dx * dx + dy * dy <= r * r * 1.0000001:
        area = _rect_area(a, b)
    if what == 1:
        return area
    inter = h * area
    if what == 2:
        return inter
    union = a[GVOL] + b[GVOL] - inter
    return min(max(inter / union if union > 0 else 0.0, 0.0), 1.0)


cdef inline bint _box_row(const double* t, const double* sz, const double* r, bint corrected, double* o,
                          bint radius) noexcept nogil:
    """A box's ``GBOX`` numbers into ``o``; False when a number is not finite, a size not positive
    or the rotation's norm 0 (``o`` filled all the same). Without ``radius``, the corners' radius is
    infinite: no pair is passed over before its clip (element-wise pairs, mostly near each other,
    save a square root a box; a clip of boxes apart is 0 all the same)."""
    cdef double big = 1.7976931348623157e308
    cdef double w = r[0], x = r[1], y = r[2], z = r[3], wid = sz[0], length = sz[1], height = sz[2]
    cdef double n2 = w * w + x * x + y * y + z * z, c, s, k, hl, hw
    cdef bint ok = (fabs(t[0]) <= big) & (fabs(t[1]) <= big) & (fabs(t[2]) <= big)  # (NaN fails)
    ok &= (wid <= big) & (length <= big) & (height <= big) & (fabs(w) <= big) & (fabs(x) <= big)
    ok &= (fabs(y) <= big) & (fabs(z) <= big) & (wid > 0) & (length > 0) & (height > 0) & (n2 > 0)
    # the normalised quaternion's R[0, 0] and R[1, 0] (corrected) or R[0, 1]
    k = 2.0 / n2
    c = 1.0 - k * (y * y + z * z)
    s = k * (x * y + w * z) if corrected else k * (x * y - w * z)
    hl, hw = length * 0.5, wid * 0.5
    o[GX], o[GY] = t[0], t[1]
    o[UX], o[UY] = hl * c, hl * s
    o[VX], o[VY] = -(hw * s), hw * c
    o[GUU] = o[UX] * o[UX] + o[UY] * o[UY]
    o[GVV] = o[VX] * o[VX] + o[VY] * o[VY]
    o[GZLO] = t[2] - height / 2
    o[GZHI] = t[2] + height / 2
    o[GVOL] = wid * length * height
    o[GAREA] = 4.0 * (o[UX] * o[VY] - o[UY] * o[VX])
    o[GRAD] = sqrt(wid * wid + length * length) / 2 * max(1.0, sqrt(c * c + s * s)) if radius else INFINITY
    return ok


def _boxes_ok(xyz, size, rotation):
    if xyz.shape[1] != 3 or size.shape[1] != 3 or rotation.shape[1] != 4 or size.shape[0] != xyz.shape[0] \
            or rotation.shape[0] != xyz.shape[0]:
        raise ValueError("boxes: translation (n, 3), size (n, 3), rotation (n, 4)")


cdef inline bint _rows(const double[:, ::1] xyz, const double[:, ::1] size, const double[:, ::1] rot,
                       Py_ssize_t lo, Py_ssize_t hi, bint corrected, double* out, bint radius) noexcept nogil:
    """Rows of boxes ``lo`` to ``hi`` into ``out``; False if one of them is bad."""
    cdef Py_ssize_t i
    cdef bint ok = True
    for i in range(lo, hi):
        ok &= _box_row(&xyz[i, 0], &size[i, 0], &rot[i, 0], corrected, &out[(i - lo) * GBOX], radius)
    return ok


cdef Py_ssize_t _first_bad(const double[:, ::1] xyz, const double[:, ::1] size, const double[:, ::1] rot,
                           Py_ssize_t lo, Py_ssize_t hi, bint corrected) noexcept nogil:
    cdef Py_ssize_t i
    cdef double row[GBOX]
    for i in range(lo, hi):
        if not _box_row(&xyz[i, 0], &size[i, 0], &rot[i, 0], corrected, row, False):
            return i
    return -1


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
    finite, not of positive size or of rotation norm 0, stops the pass: the caller names it; a
    bad box of ``a`` is reported before one of ``b``)."""
    _boxes_ok(xyz_a, size_a, rot_a)
    _boxes_ok(xyz_b, size_b, rot_b)
    cdef Py_ssize_t na = xyz_a.shape[0], nb = xyz_b.shape[0], n, i, j, k, t, nt = thresholds.shape[0], count = 0
    cdef Py_ssize_t bad_a = -1, bad_b = -1, k0, k1, la, lb
    cdef double v, lo, hi
    cdef double* rows = NULL
    cdef double* ra
    cdef double* rb
    if not (0 <= what <= 3):
        raise ValueError("box_pairs: what in 0..3")
    n = na * nb if outer else max(na, nb)
    if out.shape[0] != n or (not outer and na != nb and min(na, nb) != 1) or (near.shape[0] and near.shape[0] != n):
        raise ValueError("box_pairs: out (and near) has a value per pair; pairs of equal lengths (or one box)")
    # rows: all of b's and one of a's (all pairs), or a chunk of each side's (element-wise)
    la = 1 if outer or na == 1 else CHUNK
    lb = nb if outer else (1 if nb == 1 else CHUNK)
    rows = <double*>malloc((la + lb) * GBOX * sizeof(double))
    if rows == NULL:
        raise MemoryError()
    ra, rb = rows, rows + la * GBOX
    try:
        with nogil:
            bad_a = _first_bad(xyz_a, size_a, rot_a, 0, na, corrected) if outer or na == 1 else -1
            if bad_a < 0 and (outer or nb == 1):
                if not _rows(xyz_b, size_b, rot_b, 0, nb, corrected, rb, outer):
                    bad_b = _first_bad(xyz_b, size_b, rot_b, 0, nb, corrected)
            if bad_a < 0 and bad_b < 0 and n:
                if outer:
                    for i in range(na):
                        _rows(xyz_a, size_a, rot_a, i, i + 1, corrected, ra, True)
                        for j in range(nb):
                            out[i * nb + j] = _pair(ra, &rb[j * GBOX], what)
                else:
                    if na == 1:
                        _rows(xyz_a, size_a, rot_a, 0, 1, corrected, ra, False)
                    k0 = 0
                    while k0 < n:
                        k1 = min(k0 + CHUNK, n)
                        if na > 1 and not _rows(xyz_a, size_a, rot_a, k0, k1, corrected, ra, False):
                            bad_a = _first_bad(xyz_a, size_a, rot_a, k0, k1, corrected)
                            break
                        if nb > 1 and not _rows(xyz_b, size_b, rot_b, k0, k1, corrected, rb, False):
                            bad_b = _first_bad(xyz_b, size_b, rot_b, k0, k1, corrected)
                            break
                        for k in range(k1 - k0):
                            out[k0 + k] = _pair(ra if na == 1 else &ra[k * GBOX], rb if nb == 1 else &rb[k * GBOX],
                                                what)
                        k0 = k1
            if bad_b >= 0 and bad_a < 0:  # (a's bad box is named first: all of a checked)
                bad_a = _first_bad(xyz_a, size_a, rot_a, 0, na, corrected)
            if bad_a < 0 and bad_b < 0 and n:
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
        free(rows)
    return count, bad_a, bad_b
