# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The perception tables' token lookups and chain walks (GIL released): see
:mod:`l5dask.perception.links`.

Strings are Arrow's layout read in place: ``int32`` offsets into a bytes buffer, and a validity
byte per row (an empty ``valid`` means no nulls).

What it beats, and by how much: pyarrow's ``pc.index_in``, the maintained lookup of strings in
a table of strings: 700,000 token lookups in a table of 700,000 in 94 against 202 ms of one
thread's CPU, 2.14x (``python benchmarks/handwritten_layers.py --part tokens --rows 700000``,
2026-11-27). ``walk_chains`` has no library equivalent (numpy would double pointers, a pass per
doubling of the longest chain). Delete the index when ``pc.index_in`` comes within 10% of it.
"""

import numpy as np

from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t
from libc.stdlib cimport free, malloc
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

