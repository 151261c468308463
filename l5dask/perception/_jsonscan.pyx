# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Scans of JSON bytes (GIL released): the JSON types of a table's declared columns (``json_types``,
``_jsontypes.h``, for :mod:`l5dask.perception.tables`) and the seams of detection files read in
blocks (``json_seams``, ``json_key_spans``, for :mod:`l5dask.perception.boxes`).

What it beats, and by how much: the type check, DuckDB checking the declared columns' types
itself: 0.195 against 1.68 s on 286 MB of tables (``python benchmarks/json_types.py``, 2026-11-25);
the seams, reading detection files whole (one parse of each file): ``l5dask perception evaluate`` of
20,000 samples in 4.30 against 6.04 s and a peak RSS of 0.53 against 1.07 GB (``python
benchmarks/detection_benchmark.py``, 2026-11-26). Delete either when the library's own way comes
within 10% of it.
"""

import numpy as np

from libc.stdint cimport int64_t, uint8_t
from libc.string cimport memchr, memcmp

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
