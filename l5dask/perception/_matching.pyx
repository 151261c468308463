# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""3D detection's matching (GIL released): see :mod:`l5dask.perception.detection`.

``match_boxes``: the SDK's greedy matching of predictions to ground truth, every IoU threshold at
once, the ground rectangles clipped in float64 (Sutherland-Hodgman), the groups whose decisions
turn on IoUs too close to call marked for the SDK's own arithmetic.

What it beats, and by how much: the SDK's ``get_average_precisions`` (a ``Box3D.get_iou`` loop
with shapely's polygons): ``l5dask perception evaluate`` of 20,000 samples (2 M predictions) at
1,373x the SDK's predictions per second (``python benchmarks/detection_benchmark.py``, 2026-11-26,
docs/benchmarks.md); shapely 2's vectorised overlay of overlapping boxes is slower than the SDK's
loop (``benchmarks/geometry_benchmark.py``). Delete it if shapely's vectorised overlay comes within
2x of it.
"""

from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport calloc, free, malloc
from libc.math cimport INFINITY, fabs

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

