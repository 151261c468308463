# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compressed gather, compiled to C, the GIL released: columns of named numbers and argmaxes
(and the argmaxes' maxima) taken out of records in one pass (``gather_fields``, ``argmax_rows``), or straight from a
blosc-compressed chunk without making its records (``gather_blosc``, ``blosc_blocksize``:
``_blosc.h`` over the vendored LZ4), and the distinct values of one field with each row's code
among them (``distinct_rows``, ``gather_blosc``'s ``codes``: ``_distinct.h``). Wrapped by :class:`l5dask.prediction.kernels.Gather` and
:mod:`l5dask.prediction.kernels`; read by ``aggregate``, the report and the catalog
(``docs/design/compressed-gather.md``).

What it beats, and by how much: numcodecs' blosc decode followed by numpy's gather of the same
fields, 1.97-2.11x (``python benchmarks/compressed_gather.py``, which checks the columns equal);
the label argmax read in place (``_argmax.h``) against numpy's ``argmax(axis=1)``
(``python benchmarks/handwritten_layers.py --part argmax``). When to delete it: when numcodecs'
decode and a numpy gather run within 10% of it in that benchmark (or zarr-python 3 reads the
fields of structured chunks as columns).
"""

import numpy as np

from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

cdef extern from "_argmax.h":
    Py_ssize_t l5_argmax_f32(const uint8_t* p, Py_ssize_t n) noexcept nogil


cdef extern from "_blosc.h":
    ctypedef struct l5_columns:
        Py_ssize_t n
        const int64_t* offsets
        const int64_t* sizes
        const int64_t* dests
        Py_ssize_t m
        const int64_t* aoffsets
        const int64_t* acols
        const int64_t* adests
        const int64_t* vdests
    void l5_gather_records(const uint8_t* buf, Py_ssize_t rows, Py_ssize_t stride, Py_ssize_t row0,
                           const l5_columns* c) noexcept nogil
    ctypedef struct l5_found:
        int64_t off
        int64_t width
        uint8_t* out
        int64_t n
        int32_t* codes
    int l5_found_init(l5_found* f, int64_t rows, int64_t block_rows) noexcept nogil
    void l5_found_free(l5_found* f) noexcept nogil
    int l5_found_add(l5_found* f, const uint8_t* v) noexcept nogil
    int l5_blosc_gather_ranges(const uint8_t* src, int64_t srclen, int64_t itemsize, int64_t chunk_rows,
                               int64_t nranges, const int64_t* lo, const int64_t* hi, const int64_t* dst,
                               uint8_t* tmp, int64_t tmpsize, const l5_columns* c, l5_found* found) noexcept nogil
    int64_t l5_blosc_blocksize(const uint8_t* src, int64_t srclen) noexcept nogil


def distinct_rows(const uint8_t[::1] buf, Py_ssize_t n, Py_ssize_t stride, Py_ssize_t off, Py_ssize_t width):
    """Indices of the first occurrence of each distinct value of the ``width`` bytes at ``off``.

    The set of ``_distinct.h`` (the compressed gather's): an open-addressing hash table whose
    values that hash alike are compared byte for byte, so the result is exact whatever the hash does.
    """
    cdef l5_found f
    cdef Py_ssize_t i, k = 0
    result = np.empty(n, np.int64)
    cdef int64_t[::1] out = result
    if n == 0:
        return result
    if width == 0:  # (one value, empty)
        out[0] = 0
        return result[:1]
    if width < 0 or off < 0 or buf.shape[0] < (n - 1) * stride + off + width:
        raise ValueError("distinct_rows: a field within each row expected")
    memset(&f, 0, sizeof(f))
    f.off, f.width = off, width
    f.out = <uint8_t*>malloc(n * width)
    if f.out == NULL or l5_found_init(&f, n, 0) != 0:
        free(f.out)
        raise MemoryError()
    with nogil:
        for i in range(n):
            if l5_found_add(&f, &buf[0] + i * stride + off):
                out[k] = i
                k += 1
    l5_found_free(&f)
    free(f.out)
    return result[:k]


def argmax_rows(const uint8_t[::1] buf, Py_ssize_t n, Py_ssize_t stride, Py_ssize_t off, Py_ssize_t ncols,
                int8_t[::1] out):
    """``out[i] = argmax(row i)`` of the ``float32[ncols]`` at ``off`` (first maximum, as numpy; ncols <= 127)."""
    cdef Py_ssize_t i
    if n == 0:
        return
    with nogil:
        for i in range(n):
            out[i] = <int8_t>l5_argmax_f32(&buf[0] + i * stride + off, ncols)


cdef l5_columns _columns(const int64_t[::1] offsets, const int64_t[::1] sizes, const int64_t[::1] dests,
                        const int64_t[::1] argmax_offsets, const int64_t[::1] argmax_ncols,
                        const int64_t[::1] argmax_dests, const int64_t[::1] argmax_values):
    cdef l5_columns c
    if sizes.shape[0] != offsets.shape[0] or dests.shape[0] != offsets.shape[0] or \
            argmax_ncols.shape[0] != argmax_offsets.shape[0] or argmax_dests.shape[0] != argmax_offsets.shape[0] or \
            (argmax_values is not None and argmax_values.shape[0] != argmax_offsets.shape[0]):
        raise ValueError("gather: one offset, size and output per column expected")
    c.n, c.m = offsets.shape[0], argmax_offsets.shape[0]
    c.offsets = &offsets[0] if c.n else NULL
    c.sizes = &sizes[0] if c.n else NULL
    c.dests = &dests[0] if c.n else NULL
    c.aoffsets = &argmax_offsets[0] if c.m else NULL
    c.acols = &argmax_ncols[0] if c.m else NULL
    c.adests = &argmax_dests[0] if c.m else NULL
    c.vdests = &argmax_values[0] if c.m and argmax_values is not None else NULL
    return c


def gather_fields(const uint8_t[::1] buf, Py_ssize_t n, Py_ssize_t stride, const int64_t[::1] offsets,
                  const int64_t[::1] sizes, const int64_t[::1] dests, const int64_t[::1] argmax_offsets,
                  const int64_t[::1] argmax_ncols, const int64_t[::1] argmax_dests,
                  const int64_t[::1] argmax_values=None):
    """In one pass over the rows: copy the ``sizes[j]`` bytes at ``offsets[j]`` of each row to
    row ``i`` of the contiguous output at address ``dests[j]``, and write the argmax (int8) of the
    ``float32[argmax_ncols[j]]`` at ``argmax_offsets[j]`` to the output at ``argmax_dests[j]``
    (and its maximum, float32, to the output at ``argmax_values[j]`` where that is not 0)."""
    cdef l5_columns c = _columns(offsets, sizes, dests, argmax_offsets, argmax_ncols, argmax_dests, argmax_values)
    if n == 0:
        return
    if buf.shape[0] < n * stride:
        raise ValueError("gather_fields: the buffer holds fewer rows than asked")
    with nogil:
        l5_gather_records(&buf[0], n, stride, 0, &c)


def blosc_blocksize(const uint8_t[::1] raw):
    """The block size in the header of a blosc chunk (0: none)."""
    return l5_blosc_blocksize(&raw[0], raw.shape[0]) if raw.shape[0] else 0


def gather_blosc(const uint8_t[::1] raw, Py_ssize_t itemsize, Py_ssize_t chunk_rows, const int64_t[::1] lo,
                 const int64_t[::1] hi, const int64_t[::1] dst, uint8_t[::1] scratch, const int64_t[::1] offsets,
                 const int64_t[::1] sizes, const int64_t[::1] dests, const int64_t[::1] argmax_offsets,
                 const int64_t[::1] argmax_ncols, const int64_t[::1] argmax_dests, Py_ssize_t distinct_offset=0,
                 Py_ssize_t distinct_width=0, uint8_t[::1] found=None, const int64_t[::1] argmax_values=None,
                 int32_t[::1] codes=None, Py_ssize_t out_rows=-1):
    """As :func:`gather_fields` for the rows ``[lo[r], hi[r])`` (sorted, disjoint) of one
    blosc-compressed chunk of ``chunk_rows`` records, into rows ``dst[r] ..`` of the outputs,
    straight from the compressed bytes (``_blosc.h``; ``scratch``: a block), and
    (``distinct_width`` > 0) the distinct values of the field of that many bytes at
    ``distinct_offset`` of those rows into ``found`` (room for a value a row; ``_distinct.h``),
    and with ``codes`` (room for every output row), each row's value's index among them;
    ``out_rows`` (>= 0): the rows every output holds, checked to hold those written.
    ``(status, values found)``; status 0: done; 1: not a chunk of this kind; -1: corrupt (then
    nothing is promised of the outputs: the caller decodes the chunk with numcodecs)."""
    cdef l5_columns c = _columns(offsets, sizes, dests, argmax_offsets, argmax_ncols, argmax_dests, argmax_values)
    cdef l5_found f
    cdef l5_found* fp = NULL
    cdef int status
    cdef Py_ssize_t r, rows = 0, end = 0, n = lo.shape[0]
    if hi.shape[0] != n or dst.shape[0] != n:
        raise ValueError("gather_blosc: a start, an end and an output row per range expected")
    for r in range(n):
        if lo[r] < (hi[r - 1] if r else 0) or hi[r] < lo[r] or hi[r] > chunk_rows or dst[r] < 0:
            raise ValueError("gather_blosc: sorted, disjoint ranges of rows within the chunk expected")
        rows += hi[r] - lo[r]
        end = max(end, dst[r] + hi[r] - lo[r])
    if out_rows >= 0 and end > out_rows:
        raise ValueError(f"gather: an output per column, contiguous, of its type and at least {end} rows expected")
    if raw.shape[0] == 0:
        return -1, 0
    if distinct_width > 0:
        if distinct_offset < 0 or distinct_offset + distinct_width > itemsize or found is None or \
                found.shape[0] < rows * distinct_width:
            raise ValueError("gather_blosc: a field within the record, and room for a value per row, expected")
        memset(&f, 0, sizeof(f))
        f.off, f.width, f.out = distinct_offset, distinct_width, &found[0] if found.shape[0] else NULL
        if codes is not None:
            if codes.shape[0] < end:
                raise ValueError("gather_blosc: room for a code per row expected")
            f.codes = &codes[0] if codes.shape[0] else NULL
        if l5_found_init(&f, rows, scratch.shape[0] // itemsize if itemsize > 0 else 0) != 0:
            raise MemoryError()
        fp = &f
    with nogil:
        status = l5_blosc_gather_ranges(&raw[0], raw.shape[0], itemsize, chunk_rows, n,
                                        &lo[0] if n else NULL, &hi[0] if n else NULL, &dst[0] if n else NULL,
                                        &scratch[0] if scratch.shape[0] else NULL, scratch.shape[0], &c, fp)
    if fp != NULL:
        l5_found_free(fp)
        return status, f.n
    return status, 0
