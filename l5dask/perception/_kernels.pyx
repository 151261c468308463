# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The perception tables' compiled loops (GIL released): token lookups and chain walks, see
:mod:`l5dask.perception.links`.

Strings are Arrow's layout read in place: ``int32`` offsets into a bytes buffer, and a validity
byte per row (an empty ``valid`` means no nulls).
"""

import numpy as np

from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcmp, memcpy

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


def count_in_boxes(const float[:, ::1] points, const double[:, ::1] frames, int64_t[::1] out, double band):
    """Per box, the points (3, n) inside it by the SDK's ``points_in_box`` test (``0 <= v.i <= i.i``
    and the same for j and k, ``v`` from the first corner). A point that is within ``band`` times
    an edge's squared length of a face (and not clearly outside on another edge) is not decided
    here: its (box, point) pairs are returned for the exact test in numpy, so that the count does
    not depend on how the dot products are rounded.

    The boxes' bounds are binned on a grid in x, y of at most ``GRID`` x ``GRID`` cells: a
    point meets only the boxes of its cell (most points meet none). A box with an edge of length
    0 passes whole slabs (the SDK's test, ``0 <= 0 <= 0`` on that edge): its bounds are infinite,
    and then every point meets every box."""
    cdef Py_ssize_t n = points.shape[1], nb = frames.shape[0], p, b, e, c, k, cx, cy, nx, ny, x0, x1, y0, y1
    cdef double x, y, z, v0, v1, v2, d, ee, lim, gx, gy, cell
    cdef const double* f
    cdef bint unsure, outside
    cdef list undecided = []
    cdef int64_t* start = NULL
    cdef int64_t* members = NULL
    cdef int64_t* fill = NULL
    if n == 0 or nb == 0:
        return undecided
    gx, gy = frames[0, LO], frames[0, LO + 1]
    cdef double hx = frames[0, HI], hy = frames[0, HI + 1]
    for b in range(nb):
        gx, gy = min(gx, frames[b, LO]), min(gy, frames[b, LO + 1])
        hx, hy = max(hx, frames[b, HI]), max(hy, frames[b, HI + 1])
    cdef bint single = not (hx - gx < 1e9 and hy - gy < 1e9)  # unbounded (flat) or NaN boxes: one cell
    cell = 1.0 if single else max((hx - gx) / GRID, (hy - gy) / GRID, 0.25)
    nx = 1 if single else min(<Py_ssize_t>((hx - gx) / cell) + 1, GRID + 1)
    ny = 1 if single else min(<Py_ssize_t>((hy - gy) / cell) + 1, GRID + 1)
    cdef double inv = 1.0 / cell
    start = <int64_t*>calloc(nx * ny + 1, sizeof(int64_t))
    fill = <int64_t*>calloc(nx * ny, sizeof(int64_t))
    try:
        if start == NULL or fill == NULL:
            raise MemoryError()
        for b in range(nb):  # boxes per cell, as CSR
            _cells(&frames[b, 0], gx, gy, inv, nx, ny, &x0, &x1, &y0, &y1)
            for cy in range(y0, y1 + 1):
                for cx in range(x0, x1 + 1):
                    start[cy * nx + cx + 1] += 1
        for c in range(nx * ny):
            start[c + 1] += start[c]
        members = <int64_t*>malloc(max(start[nx * ny], 1) * sizeof(int64_t))
        if members == NULL:
            raise MemoryError()
        for b in range(nb):
            _cells(&frames[b, 0], gx, gy, inv, nx, ny, &x0, &x1, &y0, &y1)
            for cy in range(y0, y1 + 1):
                for cx in range(x0, x1 + 1):
                    c = cy * nx + cx
                    members[start[c] + fill[c]] = b
                    fill[c] += 1
        with nogil:
            for p in range(n):
                x = points[0, p]
                y = points[1, p]
                if single:
                    c = 0
                else:
                    if not (x >= gx and x <= hx and y >= gy and y <= hy):
                        continue
                    cx = min(<Py_ssize_t>((x - gx) * inv), nx - 1)
                    cy = min(<Py_ssize_t>((y - gy) * inv), ny - 1)
                    c = cy * nx + cx
                z = points[2, p]
                for k in range(start[c], start[c + 1]):
                    b = members[k]
                    f = &frames[b, 0]
                    if x < f[LO] or x > f[HI] or y < f[LO + 1] or y > f[HI + 1] or z < f[LO + 2] or z > f[HI + 2]:
                        continue
                    v0 = x - f[P1]
                    v1 = y - f[P1 + 1]
                    v2 = z - f[P1 + 2]
                    unsure = False
                    outside = False
                    for e in range(3):
                        d = f[EI + 3 * e] * v0 + f[EI + 3 * e + 1] * v1 + f[EI + 3 * e + 2] * v2
                        ee = f[II + e]
                        lim = band * ee
                        if d < -lim or d > ee + lim:
                            if ee > 0.0:  # (a flat box: only the exact test can say)
                                outside = True
                                break
                        if d <= lim or d >= ee - lim:
                            unsure = True
                    if outside:
                        continue
                    if unsure:
                        with gil:
                            undecided.append((b, p))
                    else:
                        out[b] += 1
    finally:
        free(start)
        free(fill)
        free(members)
    return undecided


cdef inline void _cells(const double* f, double gx, double gy, double inv, Py_ssize_t nx, Py_ssize_t ny,
                        Py_ssize_t* x0, Py_ssize_t* x1, Py_ssize_t* y0, Py_ssize_t* y1) noexcept nogil:
    """The grid cells a box's bounds cover (a NaN box: all of them), by the points' own formula
    (monotonic: a point within the bounds falls in one of these cells)."""
    x0[0], x1[0], y0[0], y1[0] = 0, nx - 1, 0, ny - 1
    if nx == 1 and ny == 1:
        return
    if f[LO] >= gx and f[HI] >= gx:
        x0[0] = min(<Py_ssize_t>((f[LO] - gx) * inv), nx - 1)
        x1[0] = min(<Py_ssize_t>((f[HI] - gx) * inv), nx - 1)
    if f[LO + 1] >= gy and f[HI + 1] >= gy:
        y0[0] = min(<Py_ssize_t>((f[LO + 1] - gy) * inv), ny - 1)
        y1[0] = min(<Py_ssize_t>((f[HI + 1] - gy) * inv), ny - 1)
