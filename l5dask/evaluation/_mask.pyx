# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The agents mask's compiled pass (GIL released): see :mod:`l5dask.evaluation.agents`.

Agents are read in place from the bytes of decoded chunks (a row every ``stride`` bytes, each
field at its byte offset), in row order, which is frame order within a scene. A track's last
occurrence in the current scene lives in a small hash table (its slots emptied for the next
scene by a generation count); each agent's past count comes from it, its future count from a
backward pass over "next in run" links at the end.

The float32 steps are numpy's (L5Kit's): the same operations on the same types, in the same
order, without contraction into FMA (the build does not target FMA hardware). The one sum whose
order numpy chooses (the label filter's, pairwise) is computed in float64 and left to numpy
within a band around the threshold.

What it beats, and by how much: L5Kit's own ``get_valid_agents`` (per scene, numpy per frame):
``l5dask select-agents`` 98-149x its rows per second (``python benchmarks/evaluation_benchmark.py
--part dataset``, docs/benchmarks.md). No maintained library computes the mask; a numpy form of it
needs a sort of every agent by track (the past and future counts), which this pass avoids with
its hash table. When to delete it: when a numpy or flox formulation comes within 10% of it there.
"""

import numpy as np

from libc.math cimport INFINITY, copysignf, exp, fabs, fabsf, fmodf, log, sqrt
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free

from l5dask.core._records cimport _f4, _f8, _norm2, _u8

cdef float PI_F = <float>3.141592653589793
cdef float TWO_PI_F = <float>6.283185307179586
#: a float32 sum of 13 probabilities in [0, 1] is within 1e-6 of the exact one: outside this band
#: around the threshold the float64 sum decides as numpy's would
cdef double LABEL_BAND = 1e-5

#: reasons (L5Kit's report keys, by code)
cdef enum:
    R_LABEL = 1
    R_DISTANCE = 2
    R_HOLE = 3
    R_YAW = 4
    R_EXTENT = 5


cdef inline bint _yaw_ok(float cur, float prev, float th) noexcept nogil:
    """``abs(angular_distance(cur, prev)) * 180 / pi < th`` in float32, as numpy:
    ``(cur - prev + pi) % (2 pi) - pi`` with numpy's float remainder (Python's sign rule)."""
    cdef float a = (cur - prev) + PI_F
    cdef float mod = fmodf(a, TWO_PI_F)
    if mod != 0:
        if (mod < 0) != (TWO_PI_F < 0):
            mod = mod + TWO_PI_F
    else:
        mod = copysignf(0, TWO_PI_F)
    cdef float ad = mod - PI_F
    cdef float deg = (fabsf(ad) * <float>180) / PI_F
    return deg < th


cdef inline bint _extent_ok(float area_prev, float area_cur, float th) noexcept nogil:
    """L5Kit's extent check on the two areas (float32): both at least 0.01 m^2, ratio under ``th``."""
    cdef float ratio = area_prev / area_cur if area_prev > area_cur else area_cur / area_prev
    return area_prev >= <float>0.01 and area_cur >= <float>0.01 and ratio < th


def pair_checks(const float[::1] yaw_cur, const float[::1] yaw_prev, const float[::1] area_prev,
                const float[::1] area_cur, float yaw_th, float extent_th, uint8_t[::1] yaw_out,
                uint8_t[::1] extent_out):
    """The yaw and extent checks of pairs (for tests: the same inline functions the pass uses)."""
    cdef Py_ssize_t i
    with nogil:
        for i in range(yaw_cur.shape[0]):
            yaw_out[i] = _yaw_ok(yaw_cur[i], yaw_prev[i], yaw_th)
            extent_out[i] = _extent_ok(area_prev[i], area_cur[i], extent_th)


cdef inline int _label(const uint8_t* p, double threshold) noexcept nogil:
    """Whether the 13 kept label probabilities (float32, L5Kit's agent-like labels are 13 consecutive
    ones, the first at ``p``) sum above ``threshold``: 1 or 0, or 2 where the float64 sum is within
    the band of the threshold (or NaN): numpy's float32 sum decides those. The float64 sum runs in
    four chains with fixed offsets (its order does not matter at the band's scale; the compiler pairs
    the loads and adds), not one chain of dependent adds."""
    cdef double s0 = _f4(p), s1 = _f4(p + 4), s2 = _f4(p + 8), s3 = _f4(p + 12)
    s0 += _f4(p + 16)
    s1 += _f4(p + 20)
    s2 += _f4(p + 24)
    s3 += _f4(p + 28)
    s0 += _f4(p + 32)
    s1 += _f4(p + 36)
    s2 += _f4(p + 40)
    s3 += _f4(p + 44)
    s0 += _f4(p + 48)
    cdef double s = (s0 + s1) + (s2 + s3)
    if fabs(s - threshold) > LABEL_BAND:
        return s > threshold
    return 2


def label_pass(const uint8_t[::1] buf, Py_ssize_t n, Py_ssize_t stride, Py_ssize_t keep, double threshold,
               uint8_t[::1] out):
    """:func:`_label` of each of ``n`` rows (``keep``: the first kept probability's byte offset in a row); returns how many
    rows are undecided (2)."""
    cdef Py_ssize_t i, undecided = 0
    with nogil:
        for i in range(n):
            out[i] = _label(&buf[i * stride + keep], threshold)
            undecided += out[i] == 2
    return undecided


cdef struct Slot:
    # a track's last occurrence in the current scene (a slot of another generation is empty)
    uint64_t key
    uint32_t gen
    int32_t row
    int32_t frame
    float yaw
    float area
    uint32_t past
    uint8_t valid


cdef inline Py_ssize_t _slot(const Slot* table, Py_ssize_t cap, int shift, uint32_t gen, uint64_t key) noexcept nogil:
    """The slot of ``key`` among the slots of generation ``gen`` (the current scene), or the empty
    slot where it goes (open addressing, Fibonacci hashing into ``cap = 2 ** (64 - shift)`` slots)."""
    cdef Py_ssize_t s = <Py_ssize_t>((key * 0x9E3779B97F4A7C15ULL) >> shift)
    while table[s].gen == gen and table[s].key != key:
        s = (s + 1) & (cap - 1)
    return s


cdef class MaskPass:
    """L5Kit's agents mask of the whole scenes of one span of rows, fed a chunk at a time.

    ``frame_end``: each frame's end row (relative to the span's first agent) in order;
    ``frame_scene``: each frame's scene (any id; a change starts a new scene); ``ego_x/ego_y``:
    each frame's ego position.
    """

    cdef int64_t[::1] frame_end, frame_scene
    cdef double[::1] ego_x, ego_y
    cdef Py_ssize_t n, fed, frame
    cdef int64_t scene
    cdef float yaw_th, extent_th
    cdef double distance_th
    # per agent: past count, next agent of its run (then its future count), why rejected
    cdef uint32_t[::1] past
    cdef int32_t[::1] nxt
    cdef int8_t[::1] reason
    cdef Slot* table
    cdef Py_ssize_t cap, used
    cdef uint32_t generation
    cdef int shift

    def __cinit__(self, int64_t[::1] frame_end, int64_t[::1] frame_scene, double[::1] ego_x, double[::1] ego_y,
                  Py_ssize_t n, float yaw_th, float extent_th, double distance_th, Py_ssize_t capacity=1024):
        if n >= 2 ** 31 - 1:
            raise ValueError("a span of more than 2**31 agents")
        self.frame_end, self.frame_scene, self.ego_x, self.ego_y = frame_end, frame_scene, ego_x, ego_y
        self.n, self.fed, self.frame = n, 0, 0
        self.scene = frame_scene[0] if frame_scene.shape[0] else 0
        self.yaw_th, self.extent_th, self.distance_th = yaw_th, extent_th, distance_th
        self.past = np.empty(n, np.uint32)
        self.nxt = np.empty(n, np.int32)
        self.reason = np.empty(n, np.int8)
        # the table starts with ``capacity`` slots (a power of two) and doubles at half full
        self.cap, self.shift, self.used, self.generation = 2, 63, 0, 1
        while self.cap < capacity:
            self.cap, self.shift = self.cap * 2, self.shift - 1
        self.table = <Slot*>calloc(self.cap, sizeof(Slot))
        if self.table == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.table)

    cdef int _grow(self) except -1:
        cdef Py_ssize_t old_cap = self.cap, i
        cdef Slot* old = self.table
        self.table = <Slot*>calloc(2 * old_cap, sizeof(Slot))
        if self.table == NULL:
            self.table = old
            raise MemoryError()
        self.cap *= 2
        self.shift -= 1
        for i in range(old_cap):
            if old[i].gen == self.generation:
                self.table[_slot(self.table, self.cap, self.shift, self.generation, old[i].key)] = old[i]
        free(old)
        return 0

    def feed(self, const uint8_t[::1] buf, Py_ssize_t n, Py_ssize_t stride, offsets, Py_ssize_t keep,
             double threshold, Py_ssize_t start=0, int forced=-1):
        """The next agents: rows ``start .. n - 1`` of ``buf``; ``offsets``: the byte offsets of
        centroid, extent, yaw and track_id; the label filter (:func:`_label`) from the 13 probabilities
        from the byte offset ``keep`` on. Stops at a row whose label sum is within the band of ``threshold``
        (numpy's float32 sum decides it) and returns its index, to be called again from there with
        ``forced`` set to that row's label filter (0 or 1); returns ``n`` when all are fed.

        The loop's state lives in locals (stores through the byte-typed arrays would otherwise make
        the compiler reload every attribute after each one) and goes back to ``self`` at the end."""
        cdef Py_ssize_t o_c = offsets[0], o_e = offsets[1], o_y = offsets[2], o_t = offsets[3]
        cdef Py_ssize_t i, r
        cdef int decided
        cdef const uint8_t* row
        cdef uint64_t track
        cdef bint ok
        cdef int8_t why
        cdef float yaw_c, area_c
        cdef uint32_t past
        cdef Slot* slot
        cdef Py_ssize_t nframes = self.frame_end.shape[0], frame = self.frame, fed = self.fed
        cdef const int64_t* frame_end = &self.frame_end[0] if nframes else NULL
        cdef const int64_t* frame_scene = &self.frame_scene[0] if nframes else NULL
        cdef const double* ego_x = &self.ego_x[0] if nframes else NULL
        cdef const double* ego_y = &self.ego_y[0] if nframes else NULL
        cdef double ex = ego_x[frame] if frame < nframes else 0, ey = ego_y[frame] if frame < nframes else 0
        cdef uint32_t* past_p = &self.past[0] if self.n else NULL
        cdef int32_t* nxt_p = &self.nxt[0] if self.n else NULL
        cdef int8_t* reason_p = &self.reason[0] if self.n else NULL
        cdef const uint8_t* base = &buf[0] if n > start else NULL
        cdef Slot* table = self.table
        cdef Py_ssize_t used = self.used, cap = self.cap
        cdef uint32_t gen = self.generation
        cdef int64_t scene = self.scene
        cdef int shift = self.shift
        cdef float yaw_th = self.yaw_th, extent_th = self.extent_th
        cdef double distance_th = self.distance_th
        if fed + n - start > self.n:
            raise ValueError(f"fed {fed + n - start} agents to a pass over {self.n}")
        i = start
        with nogil:
            while i < n:
                row = base + i * stride
                if i == start and forced >= 0:
                    ok = forced == 1
                else:
                    decided = _label(row + keep, threshold)
                    if decided == 2:
                        break
                    ok = decided == 1
                r = fed
                fed += 1
                if frame < nframes and frame_end[frame] <= r:
                    while frame < nframes and frame_end[frame] <= r:
                        frame += 1
                        if frame < nframes and frame_scene[frame] != scene:
                            scene = frame_scene[frame]
                            gen += 1
                            used = 0
                    if frame < nframes:
                        ex, ey = ego_x[frame], ego_y[frame]
                why = 0
                if not ok:
                    why = R_LABEL
                elif not (_norm2(ex - _f8(row + o_c), ey - _f8(row + o_c + 8)) < distance_th):
                    ok = False
                    why = R_DISTANCE
                yaw_c = _f4(row + o_y)
                area_c = _f4(row + o_e) * _f4(row + o_e + 4)
                track = _u8(row + o_t)
                slot = &table[_slot(table, cap, shift, gen, track)]
                past = 0
                if slot.gen == gen:
                    if ok and slot.valid:
                        if slot.frame + 1 != frame:
                            why = R_HOLE
                        elif not _yaw_ok(yaw_c, slot.yaw, yaw_th):
                            why = R_YAW
                        elif not _extent_ok(slot.area, area_c, extent_th):
                            why = R_EXTENT
                        else:
                            past = slot.past + 1
                            nxt_p[slot.row] = <int32_t>r
                else:
                    slot.key, slot.gen = track, gen
                    used += 1
                slot.row, slot.frame, slot.yaw, slot.area, slot.past, slot.valid = \
                    <int32_t>r, <int32_t>frame, yaw_c, area_c, past, ok
                past_p[r], nxt_p[r], reason_p[r] = past, -1, why
                i += 1
                if 2 * used > cap:
                    with gil:
                        self.generation, self.used = gen, used
                        self._grow()
                        table, cap, shift = self.table, self.cap, self.shift
        self.frame, self.fed, self.scene, self.generation, self.used = frame, fed, scene, gen, used
        return i

    def finish(self, Py_ssize_t lo, Py_ssize_t hi, const int64_t[::1] steps):
        """The mask of rows ``[lo, hi)`` (``(past, future)`` uint32), and their counts: rejections
        by reason (5) and the past/future table (``past >= steps[i] and future >= steps[j]``)."""
        if self.fed != self.n:
            raise ValueError(f"fed {self.fed} agents of {self.n}")
        cdef Py_ssize_t i, a, b, k = steps.shape[0]
        mask_arr = np.empty((hi - lo, 2), np.uint32)
        rejects_arr = np.zeros(6, np.int64)
        table_arr = np.zeros((k, k), np.int64)
        cdef uint32_t[:, ::1] mask = mask_arr
        cdef int64_t[::1] rejects = rejects_arr
        cdef int64_t[:, ::1] table = table_arr
        cdef int32_t* nxt = &self.nxt[0] if self.n else NULL
        cdef const uint32_t* past = &self.past[0] if self.n else NULL
        cdef const int8_t* reason = &self.reason[0] if self.n else NULL
        cdef uint32_t* out = &mask[0, 0] if hi > lo else NULL
        cdef int64_t* rej = &rejects[0]
        cdef int64_t zeros = 0
        cdef int64_t[8][8] counts
        cdef uint32_t pv, fv
        cdef int32_t j
        if k > 8:
            raise ValueError("at most 8 steps")
        # an agent with no past and no future counts at (0, 0) only
        cdef bint zero_first = k > 0 and steps[0] == 0 and (k == 1 or steps[1] > 0)
        with nogil:
            for a in range(8):
                for b in range(8):
                    counts[a][b] = 0
            # future counts, backwards: an agent's "next in run" link becomes its future count
            for i in range(self.n - 1, -1, -1):
                j = nxt[i]
                nxt[i] = nxt[j] + 1 if j >= 0 else 0
            for i in range(lo, hi):
                pv, fv = past[i], <uint32_t>nxt[i]
                out[2 * (i - lo)], out[2 * (i - lo) + 1] = pv, fv
                rej[reason[i]] += 1
                if pv == 0 and fv == 0 and zero_first:  # most agents (every rejected one)
                    zeros += 1
                    continue
                a = 0
                while a < k and pv >= steps[a]:
                    a += 1
                b = 0
                while b < k and fv >= steps[b]:
                    b += 1
                if a > 0 and b > 0:  # counted once, at the last steps it reaches: suffix sums below
                    counts[a - 1][b - 1] += 1
            counts[0][0] += zeros
            for a in range(k):
                for b in range(k):
                    table[a, b] = counts[a][b]
            # table[i, j] = agents with past >= steps[i] and future >= steps[j]
            for a in range(k - 2, -1, -1):
                for b in range(k):
                    table[a, b] += table[a + 1, b]
            for a in range(k):
                for b in range(k - 2, -1, -1):
                    table[a, b] += table[a, b + 1]
        return mask_arr, rejects_arr[1:], table_arr
