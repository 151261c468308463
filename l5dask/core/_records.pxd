# cython: language_level=3
"""Loads of one field of a record read in place from its bytes (rows of 116 bytes leave most
doubles unaligned, so every load goes through ``memcpy``). Shared by the compiled modules.
It beats nothing by itself: the loops that use it say what they beat, and it goes with them."""

from libc.math cimport fma, sqrt
from libc.stdint cimport uint8_t, uint64_t
from libc.string cimport memcpy


cdef inline double _f8(const uint8_t* p) noexcept nogil:
    cdef double v
    memcpy(&v, p, 8)
    return v


cdef inline float _f4(const uint8_t* p) noexcept nogil:
    cdef float v
    memcpy(&v, p, 4)
    return v


cdef inline uint64_t _u8(const uint8_t* p) noexcept nogil:
    cdef uint64_t v
    memcpy(&v, p, 8)
    return v


cdef inline double _norm2(double x, double y) noexcept nogil:
    """``np.linalg.norm`` of ``(x, y)`` as numpy computes it: its ``dot`` is OpenBLAS's ddot,
    which fuses the multiply-add on FMA hardware."""
    return sqrt(fma(y, y, x * x))
