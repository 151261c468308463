/* numpy's argmax of n float32 at p (the first maximum; a NaN counts as the maximum), for _report.pyx and _gather.pyx.
   SSE2 (every x86-64): the maximum four lanes at a time, then the first lane equal to it; rows
   holding a NaN, and other CPUs, take the scalar loop. What it beats, and by how much: numpy's
   argmax(axis=1) of the 17 labels, 2.64x on the records' field and 2.28x on a contiguous copy
   (12.6 against 33.1 and 28.6 ns an agent: `python benchmarks/handwritten_layers.py --part
   argmax`, one thread, 2026-11-27). Delete it when numpy's argmax of short rows comes within 10%
   of it there. */
#ifndef L5_ARGMAX_H
#define L5_ARGMAX_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

static inline ptrdiff_t l5_argmax_scalar(const unsigned char* p, ptrdiff_t n) {
    float best, v;
    ptrdiff_t k, arg = 0;
    memcpy(&best, p, 4);
    if (best != best) return 0;
    for (k = 1; k < n; k++) {
        memcpy(&v, p + 4 * k, 4);
        if (v > best) { best = v; arg = k; }
        else if (v != v) return k;
    }
    return arg;
}

static inline ptrdiff_t l5_argmax_f32(const unsigned char* p, ptrdiff_t n) {
#if defined(__SSE2__)
    if (n >= 4) {
        __m128 m = _mm_loadu_ps((const float*)p);
        __m128 nan = _mm_cmpunord_ps(m, m);
        ptrdiff_t k;
        float mx, v;
        for (k = 4; k + 4 <= n; k += 4) {
            __m128 x = _mm_loadu_ps((const float*)(p + 4 * k));
            m = _mm_max_ps(m, x);
            nan = _mm_or_ps(nan, _mm_cmpunord_ps(x, x));
        }
        if (_mm_movemask_ps(nan)) return l5_argmax_scalar(p, n);
        m = _mm_max_ps(m, _mm_shuffle_ps(m, m, _MM_SHUFFLE(1, 0, 3, 2)));
        m = _mm_max_ps(m, _mm_shuffle_ps(m, m, _MM_SHUFFLE(2, 3, 0, 1)));
        mx = _mm_cvtss_f32(m);
        for (ptrdiff_t t = k; t < n; t++) {
            memcpy(&v, p + 4 * t, 4);
            if (v != v) return l5_argmax_scalar(p, n);
            if (v > mx) mx = v;
        }
        __m128 b = _mm_set1_ps(mx);
        for (k = 0; k + 4 <= n; k += 4) {
            int mask = _mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps((const float*)(p + 4 * k)), b));
            if (mask) return k + __builtin_ctz(mask);
        }
        for (; k < n; k++) {
            memcpy(&v, p + 4 * k, 4);
            if (v == mx) return k;
        }
    }
#endif
    return l5_argmax_scalar(p, n);
}
#endif
