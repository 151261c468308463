# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""L5Kit's CSV rows parsed in place (GIL released): see :mod:`l5dask.evaluation.csvfiles`.

What this beats, and by how much: pyarrow's CSV reader, the fastest maintained parser of these
files (28x L5Kit's rows per second on 2 cores): ``l5dask evaluate`` of 500,000 rows takes 0.28x the
time pyarrow takes to parse both files into numpy arrays with all cores
(``python benchmarks/evaluation_benchmark.py --part evaluate``; docs/design/csv-reader.md). Numbers
are Python's ``float()`` bit for bit (Clinger's exact case, else the C library's ``strtod`` in the
"C" locale; ``tests/test_properties.py``); ranges with anything else in them go to pyarrow. Delete
it when pyarrow's parse of these files comes within 10% of it there.
"""

import numpy as np

from libc.stdint cimport int64_t, uint8_t, uint64_t

cdef extern from "_cnumber.h":
    int l5_c_numeric_init() nogil
    int l5_strtod_c(const char* s, char** end, double* out) nogil

l5_c_numeric_init()

cdef double[23] POW10 = [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                         1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22]
cdef uint64_t TWO53 = 9007199254740992ULL


cdef inline bint _end_of_cell(const uint8_t* p, const uint8_t* end) noexcept nogil:
    return p == end or p[0] == 44 or p[0] == 13 or p[0] == 10


cdef inline const uint8_t* _digits(const uint8_t* p, const uint8_t* end, uint64_t* acc) noexcept nogil:
    """Decimal digits from ``p`` on, accumulated into ``acc`` (wrapping past 19 of them); returns
    where they end."""
    cdef unsigned int d
    while p < end:
        d = p[0] - 48
        if d >= 10:
            break
        acc[0] = acc[0] * 10 + d
        p += 1
    return p


cdef inline const uint8_t* _parse_int(const uint8_t* p, const uint8_t* end, int64_t* out) noexcept nogil:
    """A decimal int64 (an optional ``-`` and 1-19 digits) ending at a cell's end; NULL otherwise."""
    cdef bint neg = False
    cdef uint64_t v = 0
    cdef const uint8_t* s
    if p < end and p[0] == 45:
        neg = True
        p += 1
    s = p
    p = _digits(s, end, &v)
    if p == s or p - s > 19 or not _end_of_cell(p, end) or \
            v > (9223372036854775808ULL if neg else 9223372036854775807ULL):
        return NULL
    out[0] = -<int64_t>v if neg else <int64_t>v
    return p


cdef inline const uint8_t* _parse_double(const uint8_t* p, const uint8_t* end, double* out) noexcept nogil:
    """A decimal number (``-``? digits ``.`` digits, an exponent ``e[+-]digits``), correctly rounded:
    Clinger's exact case (at most 19 digits, a mantissa up to 2**53 and a power of ten up to 1e22:
    one IEEE operation) or ``strtod`` in the C locale (glibc's is correctly rounded, as Python's
    ``float`` and Arrow's parser; the process's ``LC_NUMERIC`` plays no part). NULL for anything else (``nan``, ``inf``, a ``+``, spaces, a bad cell): the
    general parser decides."""
    cdef const uint8_t* start = p
    cdef const uint8_t* s
    cdef bint neg = False
    cdef uint64_t m = 0, ev = 0
    cdef Py_ssize_t digits, nfrac = 0
    cdef int e = 0, es = 1
    cdef double v
    cdef char tmp[64]
    cdef char* stop
    cdef Py_ssize_t k
    if p < end and p[0] == 45:
        neg = True
        p += 1
    s = p
    p = _digits(p, end, &m)  # wraps past 19 digits: then strtod decides
    digits = p - s
    if p < end and p[0] == 46:
        s = p + 1
        p = _digits(s, end, &m)
        nfrac = p - s
        digits += nfrac
    if digits == 0:
        return NULL
    if p < end and (p[0] | 32) == 101:  # e or E
        p += 1
        if p < end and (p[0] == 45 or p[0] == 43):
            es = -1 if p[0] == 45 else 1
            p += 1
        s = p
        p = _digits(s, end, &ev)
        if p == s:
            return NULL
        e = es * <int>(ev if p - s <= 6 else 10000000)  # past 1e999999: strtod's inf or 0
    if not _end_of_cell(p, end):
        return NULL
    e -= <int>nfrac
    if digits <= 19 and m <= TWO53 and -22 <= e <= 22:
        v = <double>m / POW10[-e] if e < 0 else <double>m * POW10[e]
        out[0] = -v if neg else v
        return p
    if p - start >= 63:
        return NULL
    for k in range(p - start):
        tmp[k] = <char>start[k]
    tmp[p - start] = 0
    if not l5_strtod_c(tmp, &stop, &v) or stop != tmp + (p - start):  # (all of it, in the C locale)
        return NULL
    if v - v != 0:  # inf (an overflow) or NaN: the general parser, then the finiteness check, say so
        return NULL
    out[0] = v
    return p


cdef Py_ssize_t _parse_rows(const uint8_t* p, const uint8_t* end, int64_t* ts, int64_t* tid, double* values,
                            Py_ssize_t n, Py_ssize_t nv) noexcept nogil:
    cdef Py_ssize_t r, c
    for r in range(n):
        p = _parse_int(p, end, &ts[r])
        if p == NULL or p == end or p[0] != 44:
            return r
        p = _parse_int(p + 1, end, &tid[r])
        if p == NULL:
            return r
        for c in range(nv):
            if p == end or p[0] != 44:
                return r
            p = _parse_double(p + 1, end, &values[r * nv + c])
            if p == NULL:
                return r
        if p < end and p[0] == 13:
            p += 1
        if p < end:
            if p[0] != 10:
                return r
            p += 1
    if p != end:
        return n - 1 if n else 0
    return n


def parse_csv_rows(const uint8_t[::1] data, int64_t[::1] ts, int64_t[::1] tid, double[:, ::1] values):
    """Rows of L5Kit's GT/PRED layout (two int64 keys, then ``values.shape[1]`` numbers a row,
    comma-separated, ``\r\n`` or ``\n`` line ends) into ``ts``, ``tid`` and ``values``. Returns the
    number of rows parsed: fewer than ``len(ts)`` where a row is not in that plain form or holds a
    number that is not finite (the caller leaves the range to the general parser, which says what
    is wrong) or the data holds more. All values parsed are finite."""
    cdef Py_ssize_t n = ts.shape[0], got
    if n == 0 or values.shape[1] == 0:
        return 0 if data.shape[0] else n
    with nogil:
        got = _parse_rows(&data[0] if data.shape[0] else NULL, (&data[0] if data.shape[0] else NULL) + data.shape[0],
                          &ts[0], &tid[0], &values[0, 0], n, values.shape[1])
    return got


def parse_numbers(tokens: list, double[::1] out):
    """:func:`_parse_double` of each bytes token (for tests); NaN where it declines."""
    cdef Py_ssize_t i
    cdef const uint8_t* p
    cdef bytes t
    for i in range(len(tokens)):
        t = tokens[i]
        p = <const uint8_t*><char*>t
        if _parse_double(p, p + len(t), &out[i]) == NULL:
            out[i] = float("nan")


cdef extern from "string.h":
    const void* memchr(const void* s, int c, size_t n) nogil


def scan_keys(const uint8_t[::1] buf, Py_ssize_t limit):
    """The rows starting after a newline in ``buf[:limit]``: their offsets in ``buf`` and their two
    leading integer keys. Returns ``None`` when any of them is not plainly ``digits,digits,`` (a
    blank line, a sign, a bad key): the general scan decides those."""
    cdef Py_ssize_t n = 0, i = 0, size = buf.shape[0]
    cdef const uint8_t* base = &buf[0] if size else NULL
    cdef const uint8_t* p
    cdef const uint8_t* q
    cdef const uint8_t* end = base + size
    limit = min(limit, size)
    with nogil:
        p = base
        while p < base + limit:
            q = <const uint8_t*>memchr(p, 10, limit - (p - base))
            if q == NULL:
                break
            n += 1
            p = q + 1
    starts_arr = np.empty(n, np.int64)
    ts_arr = np.empty(n, np.int64)
    tid_arr = np.empty(n, np.int64)
    cdef int64_t[::1] starts = starts_arr, ts = ts_arr, tid = tid_arr
    cdef bint plain = True
    with nogil:
        p = base
        for i in range(n):
            q = <const uint8_t*>memchr(p, 10, limit - (p - base)) + 1
            starts[i] = q - base
            p = _parse_int(q, end, &ts[i])
            if p == NULL or p == end or p[0] != 44:
                plain = False
                break
            p = _parse_int(p + 1, end, &tid[i])
            if p == NULL or p == end or p[0] != 44:
                plain = False
                break
            p = q
    return (starts_arr, ts_arr, tid_arr) if plain else None
