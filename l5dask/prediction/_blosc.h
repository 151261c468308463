/* Number columns straight out of blosc-compressed chunks of records, for _gather.pyx.

   A chunk of L5Kit's records is blosc 1.x (format version 2) with LZ4 and byte shuffle by the
   record size: each block of the chunk is a whole number of records, compressed after its bytes
   were transposed, so that byte j of every record of the block lies in one stream (stream j,
   `ne` bytes long, `ne` records in the block). numcodecs decodes a chunk by decompressing each
   block and transposing it back (the unshuffle), and a reader then copies the fields it needs out
   of the records: the chunk goes through memory twice, whole, whatever the reader needs.

   Here each block is decompressed (LZ4, the same library blosc bundles) into a block-sized
   scratch buffer that stays in cache, and the wanted numbers are assembled from their byte
   streams straight into the output columns: the records are never made, and the streams of the
   fields nobody asked for are never read. The layout is exactly blosc's (blosc_d in c-blosc's
   blosc.c): header, per-block starts, per block `nsplits` streams of a 4-byte compressed size
   and its bytes (stored raw when that size is the stream's), splits only when the type size is
   at most 16 bytes.

   l5_blosc_gather_ranges returns 0 when done, 1 when the chunk is not of this kind (another codec, bit
   shuffle, a type size that is not the record size, blocks that are not whole records...) and
   -1 when it is corrupt; on anything but 0 the caller decodes the chunk with numcodecs instead
   (which then says what is wrong), so every chunk numcodecs reads is read, the same. Every
   check c-blosc makes is made here too (its header checks, each block's start and streams'
   sizes, LZ4's own, and every block decompressed, padding included): 0 only for a chunk c-blosc
   decodes, -1 only for one it refuses (tests/test_properties.py). The caller first applies
   l5dask.codec's header rule, which every path shares.

   What it beats, and by how much: numcodecs' blosc decode of the chunk followed by the gather of
   the same columns, 1.97-2.11x (the four column sets of `python benchmarks/compressed_gather.py
   --scenes 400 --chunks 60`, one thread, 2026-11-27; 0.62-0.84x the decode alone). It needs LZ4's
   block decompressor, which numcodecs does not expose to C (its blosc decodes and unshuffles whole
   chunks): LZ4 1.9.4 is vendored in _vendor/lz4 for it. When to delete both: when blosc or
   numcodecs give the decompressed byte streams of a block without the unshuffle, or when that
   benchmark shows the gather after numcodecs' decode within 10% of this. */
#ifndef L5_BLOSC_H
#define L5_BLOSC_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "_argmax.h"
#include "_distinct.h"
#include "lz4.h"

typedef struct {
    ptrdiff_t n;              /* number columns: */
    const int64_t* offsets;   /*   byte offset of the number in the record */
    const int64_t* sizes;     /*   its size in bytes */
    const int64_t* dests;     /*   the address of its output (row 0) */
    ptrdiff_t m;              /* argmax columns (numpy's argmax of a float32[k] field, int8): */
    const int64_t* aoffsets;  /*   byte offset of the field */
    const int64_t* acols;     /*   k */
    const int64_t* adests;    /*   the address of its output (row 0) */
    const int64_t* vdests;    /*   NULL, or the address of a float32 output (row 0) for its maximum
                                   (0: none): numpy's max of the row (NaN if it holds one) */
} l5_columns;

#define L5_TILE 256
/* blosc.h's BLOSC_MAX_BLOCKSIZE */
#define L5_BLOSC_MAX_BLOCKSIZE ((INT32_MAX - 255 * 4) / 3)

/* the stream loops built twice, for AVX2 and for any x86-64 (picked once, when loaded) */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define L5_CLONES __attribute__((target_clones("avx2", "default")))
#define L5_AVX2 1
#include <immintrin.h>
#else
#define L5_CLONES
#define L5_AVX2 0
#endif

static inline uint32_t l5_rd32(const uint8_t* p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* the float32 of record i whose first byte's stream starts at q (streams ne bytes apart) */
static inline float l5_f32_streams(const uint8_t* q, ptrdiff_t ne, ptrdiff_t i) {
    uint32_t u = (uint32_t)q[i] | ((uint32_t)q[i + ne] << 8) | ((uint32_t)q[i + 2 * ne] << 16) |
                 ((uint32_t)q[i + 3 * ne] << 24);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#if defined(__SSE2__)
/* the float32 of records i .. i + 15 (four vectors), their first bytes' stream at q: the four byte
   streams interleaved by two rounds of unpacks (as the unshuffle does, for these bytes only) */
static inline void l5_load16(const uint8_t* q, ptrdiff_t ne, __m128 out[4]) {
    __m128i b0 = _mm_loadu_si128((const __m128i*)q), b1 = _mm_loadu_si128((const __m128i*)(q + ne));
    __m128i b2 = _mm_loadu_si128((const __m128i*)(q + 2 * ne)), b3 = _mm_loadu_si128((const __m128i*)(q + 3 * ne));
    __m128i lo01 = _mm_unpacklo_epi8(b0, b1), hi01 = _mm_unpackhi_epi8(b0, b1);
    __m128i lo23 = _mm_unpacklo_epi8(b2, b3), hi23 = _mm_unpackhi_epi8(b2, b3);
    out[0] = _mm_castsi128_ps(_mm_unpacklo_epi16(lo01, lo23));
    out[1] = _mm_castsi128_ps(_mm_unpackhi_epi16(lo01, lo23));
    out[2] = _mm_castsi128_ps(_mm_unpacklo_epi16(hi01, hi23));
    out[3] = _mm_castsi128_ps(_mm_unpackhi_epi16(hi01, hi23));
}
#endif

#if L5_AVX2
/* the float32 of records i .. i + 31 (four vectors: records 0-3 and 16-19, 4-7 and 20-23, 8-11
   and 24-27, 12-15 and 28-31, as AVX2's unpacks work in 128-bit halves; packing the results back
   with its packs puts them in order again), their first bytes' stream at q */
__attribute__((target("avx2"))) static inline void l5_load32(const uint8_t* q, ptrdiff_t ne, __m256 out[4]) {
    __m256i b0 = _mm256_loadu_si256((const __m256i*)q), b1 = _mm256_loadu_si256((const __m256i*)(q + ne));
    __m256i b2 = _mm256_loadu_si256((const __m256i*)(q + 2 * ne));
    __m256i b3 = _mm256_loadu_si256((const __m256i*)(q + 3 * ne));
    __m256i lo01 = _mm256_unpacklo_epi8(b0, b1), hi01 = _mm256_unpackhi_epi8(b0, b1);
    __m256i lo23 = _mm256_unpacklo_epi8(b2, b3), hi23 = _mm256_unpackhi_epi8(b2, b3);
    out[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(lo01, lo23));
    out[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(lo01, lo23));
    out[2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(hi01, hi23));
    out[3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(hi01, hi23));
}

/* l5_argmax_streams' first records, 32 at a time (AVX2): the first strict maximum of each, and
   whether any of their values is a NaN (then the caller does those 32 again, NaN-aware).
   Returns the records done. It adds 2.0 ns an agent (17 values) to the agents' gather, against
   5.1 ns by the SSE2 loop, which is NaN-aware at every step (12 M agents, 2026-11-26). */
__attribute__((target("avx2"))) static ptrdiff_t l5_argmax32(const uint8_t* base, ptrdiff_t ne, ptrdiff_t rows,
                                                            ptrdiff_t k, int8_t* out, float* vout, ptrdiff_t* nan_at) {
    ptrdiff_t start = 0;
    *nan_at = -1;
    for (; start + 32 <= rows; start += 32) {
        __m256 b[4], v[4], nan[4];
        __m256i a[4];
        l5_load32(base + start, ne, b);
        for (int t = 0; t < 4; t++) {
            a[t] = _mm256_setzero_si256();
            nan[t] = _mm256_cmp_ps(b[t], b[t], _CMP_UNORD_Q);
        }
        for (ptrdiff_t j = 1; j < k; j++) {
            l5_load32(base + 4 * j * ne + start, ne, v);
            __m256i jj = _mm256_set1_epi32((int)j);
            for (int t = 0; t < 4; t++) {
                __m256 take = _mm256_cmp_ps(v[t], b[t], _CMP_GT_OQ);
                nan[t] = _mm256_or_ps(nan[t], _mm256_cmp_ps(v[t], v[t], _CMP_UNORD_Q));
                b[t] = _mm256_blendv_ps(b[t], v[t], take);
                a[t] = _mm256_blendv_epi8(a[t], jj, _mm256_castps_si256(take));
            }
        }
        if (_mm256_movemask_ps(_mm256_or_ps(_mm256_or_ps(nan[0], nan[1]), _mm256_or_ps(nan[2], nan[3])))) {
            *nan_at = start;  /* (these 32 are done again by the caller) */
            return start;
        }
        __m256i lo = _mm256_packs_epi32(a[0], a[1]), hi = _mm256_packs_epi32(a[2], a[3]);
        _mm256_storeu_si256((__m256i*)(out + start), _mm256_packs_epi16(lo, hi));
        if (vout) {  /* the maxima back in record order (see l5_load32) */
            _mm256_storeu_ps(vout + start, _mm256_permute2f128_ps(b[0], b[1], 0x20));
            _mm256_storeu_ps(vout + start + 8, _mm256_permute2f128_ps(b[2], b[3], 0x20));
            _mm256_storeu_ps(vout + start + 16, _mm256_permute2f128_ps(b[0], b[1], 0x31));
            _mm256_storeu_ps(vout + start + 24, _mm256_permute2f128_ps(b[2], b[3], 0x31));
        }
    }
    return start;
}
#endif

/* the SSE2 loop (every x86-64) of l5_argmax_streams: 16 records at a time, NaN-aware at every
   step; returns the records done */
static ptrdiff_t l5_argmax16(const uint8_t* base, ptrdiff_t ne, ptrdiff_t rows, ptrdiff_t k, int8_t* out,
                             float* vout) {
    ptrdiff_t start = 0;
#if defined(__SSE2__)
    for (; start + 16 <= rows; start += 16) {
        __m128 b[4], v[4];
        __m128i a[4];
        l5_load16(base + start, ne, b);
        for (int t = 0; t < 4; t++) a[t] = _mm_setzero_si128();
        for (ptrdiff_t j = 1; j < k; j++) {
            l5_load16(base + 4 * j * ne + start, ne, v);
            __m128i jj = _mm_set1_epi32((int)j);
            for (int t = 0; t < 4; t++) {
                /* v > b, or v is NaN and b is not */
                __m128 take = _mm_or_ps(_mm_cmpgt_ps(v[t], b[t]),
                                        _mm_andnot_ps(_mm_cmpord_ps(v[t], v[t]), _mm_cmpord_ps(b[t], b[t])));
                __m128i ti = _mm_castps_si128(take);
                b[t] = _mm_or_ps(_mm_and_ps(take, v[t]), _mm_andnot_ps(take, b[t]));
                a[t] = _mm_or_si128(_mm_and_si128(ti, jj), _mm_andnot_si128(ti, a[t]));
            }
        }
        _mm_storeu_si128((__m128i*)(out + start),
                         _mm_packs_epi16(_mm_packs_epi32(a[0], a[1]), _mm_packs_epi32(a[2], a[3])));
        if (vout)
            for (int t = 0; t < 4; t++) _mm_storeu_ps(vout + start + 4 * t, b[t]);
    }
#endif
    return start;
}

/* numpy's argmax (first maximum; the first NaN, if any) of k float32 per record, from streams:
   32 records at a time on AVX2 (where a NaN is met, those 32 again by the SSE2 loop), then 16
   (SSE2), their k values compared in registers; the rest, and other CPUs, a tile of records at
   a time, one element of all of them per step */
static void l5_argmax_streams(const uint8_t* base, ptrdiff_t ne, ptrdiff_t rows, ptrdiff_t k, int8_t* out,
                              float* vout) {
    float best[L5_TILE];
    int32_t arg[L5_TILE];
    ptrdiff_t start = 0;
#if L5_AVX2
    if (__builtin_cpu_supports("avx2")) {
        ptrdiff_t nan_at;
        while (start + 32 <= rows) {
            start += l5_argmax32(base + start, ne, rows - start, k, out + start, vout ? vout + start : NULL, &nan_at);
            if (nan_at < 0) break;
            start += l5_argmax16(base + start, ne, 32, k, out + start, vout ? vout + start : NULL);
        }
    }
#endif
    start += l5_argmax16(base + start, ne, rows - start, k, out + start, vout ? vout + start : NULL);
    for (ptrdiff_t t0 = start; t0 < rows; t0 += L5_TILE) {
        ptrdiff_t tl = rows - t0 < L5_TILE ? rows - t0 : L5_TILE;
        const uint8_t* p = base + t0;
        for (ptrdiff_t i = 0; i < tl; i++) {
            best[i] = l5_f32_streams(p, ne, i);
            arg[i] = 0;
        }
        for (ptrdiff_t j = 1; j < k; j++) {
            const uint8_t* q = p + 4 * j * ne;
            for (ptrdiff_t i = 0; i < tl; i++) {
                float v = l5_f32_streams(q, ne, i), b = best[i];
                int take = (v > b) | ((v != v) & (b == b));
                best[i] = take ? v : b;
                arg[i] = take ? (int32_t)j : arg[i];
            }
        }
        for (ptrdiff_t i = 0; i < tl; i++) out[t0 + i] = (int8_t)arg[i];
        if (vout)
            for (ptrdiff_t i = 0; i < tl; i++) vout[t0 + i] = best[i];
    }
}

/* the columns of `rows` shuffled records (streams `ne` bytes long) into rows row0.. of the outputs */
L5_CLONES static void l5_gather_streams(const uint8_t* __restrict tmp, ptrdiff_t ne, ptrdiff_t rows, ptrdiff_t row0, const l5_columns* c) {
    for (ptrdiff_t j = 0; j < c->n; j++) {
        const uint8_t* p = tmp + c->offsets[j] * ne;
        uint8_t* dest = (uint8_t*)(uintptr_t)c->dests[j];
        ptrdiff_t s = c->sizes[j];
        if (s == 4) {
            uint32_t* __restrict o = (uint32_t*)dest + row0;
            for (ptrdiff_t i = 0; i < rows; i++)
                o[i] = (uint32_t)p[i] | ((uint32_t)p[i + ne] << 8) | ((uint32_t)p[i + 2 * ne] << 16) |
                       ((uint32_t)p[i + 3 * ne] << 24);
        } else if (s == 8) {
            uint64_t* __restrict o = (uint64_t*)dest + row0;
            for (ptrdiff_t i = 0; i < rows; i++) {
                uint64_t lo = (uint32_t)p[i] | ((uint32_t)p[i + ne] << 8) | ((uint32_t)p[i + 2 * ne] << 16) |
                              ((uint32_t)p[i + 3 * ne] << 24);
                uint64_t hi = (uint32_t)p[i + 4 * ne] | ((uint32_t)p[i + 5 * ne] << 8) |
                              ((uint32_t)p[i + 6 * ne] << 16) | ((uint32_t)p[i + 7 * ne] << 24);
                o[i] = lo | (hi << 32);
            }
        } else if (s == 1) {
            memcpy(dest + row0, p, (size_t)rows);
        } else {
            for (ptrdiff_t b = 0; b < s; b++)
                for (ptrdiff_t i = 0; i < rows; i++) dest[(row0 + i) * s + b] = p[b * ne + i];
        }
    }
    for (ptrdiff_t j = 0; j < c->m; j++)
        l5_argmax_streams(tmp + c->aoffsets[j] * ne, ne, rows, c->acols[j], (int8_t*)(uintptr_t)c->adests[j] + row0,
                          c->vdests && c->vdests[j] ? (float*)(uintptr_t)c->vdests[j] + row0 : NULL);
}

/* the columns of `rows` records (`stride` bytes apart) into rows row0.. of the outputs (also
   kernels.gather's loop over decoded records) */
static void l5_gather_records(const uint8_t* buf, ptrdiff_t rows, ptrdiff_t stride, ptrdiff_t row0, const l5_columns* c) {
    for (ptrdiff_t i = 0; i < rows; i++) {
        const uint8_t* row = buf + i * stride;
        for (ptrdiff_t j = 0; j < c->n; j++) {
            uint8_t* out = (uint8_t*)(uintptr_t)c->dests[j];
            ptrdiff_t s = c->sizes[j];
            if (s == 8)
                memcpy(out + (row0 + i) * 8, row + c->offsets[j], 8);
            else if (s == 4)
                memcpy(out + (row0 + i) * 4, row + c->offsets[j], 4);
            else
                memcpy(out + (row0 + i) * s, row + c->offsets[j], (size_t)s);
        }
        for (ptrdiff_t j = 0; j < c->m; j++) {
            ptrdiff_t arg = l5_argmax_f32(row + c->aoffsets[j], c->acols[j]);
            ((int8_t*)(uintptr_t)c->adests[j])[row0 + i] = (int8_t)arg;
            if (c->vdests && c->vdests[j])
                memcpy((float*)(uintptr_t)c->vdests[j] + row0 + i, row + c->aoffsets[j] + 4 * arg, 4);
        }
    }
}

/* The columns of the rows [lo[r], hi[r]) (r < nranges: sorted, disjoint, within the chunk) of one
   chunk of `chunk_rows` records of `itemsize` bytes, compressed in `src` (`srclen` bytes), into
   rows dst[r].. of the outputs, and (`found`, if not NULL: l5_found_init'ed for as many rows, in
   blocks of at most tmpsize / itemsize) the distinct values of a field of those rows, with each
   row's code at its output row. Every block is decompressed and checked, those that hold none of
   the rows too (a chunk c-blosc refuses is refused whatever rows are asked for); `tmp` holds
   `tmpsize` bytes (a block: see l5_blosc_blocksize). Rows [0, rows) into rows row0..: one range. */
static int l5_blosc_gather_ranges(const uint8_t* src, int64_t srclen, int64_t itemsize, int64_t chunk_rows,
                                  int64_t nranges, const int64_t* lo, const int64_t* hi, const int64_t* dst,
                                  uint8_t* tmp, int64_t tmpsize, const l5_columns* c, l5_found* found) {
    if (srclen < 16) return -1;
    int version = src[0], flags = src[2], typesize = src[3];
    int64_t nbytes = (int32_t)l5_rd32(src + 4), blocksize = (int32_t)l5_rd32(src + 8);
    int64_t cbytes = (int32_t)l5_rd32(src + 12);
    if (version != 2 || (flags & 0x08)) return 1;  /* another format version, flags from the future */
    if (cbytes > srclen || cbytes < 16) return -1;
    if (nbytes != chunk_rows * itemsize) return 1;
    for (int64_t r = 0; r < nranges; r++)  /* (the caller's promise, kept here too) */
        if (lo[r] < (r ? hi[r - 1] : 0) || hi[r] < lo[r] || hi[r] > chunk_rows || dst[r] < 0) return 1;
    if (nbytes == 0) return 0;
    /* c-blosc's checks before any block (blosc_run_decompression_with_context): a chunk it refuses
       is refused here too, so that both readers agree on every chunk */
    if (typesize == 0 || blocksize <= 0 || blocksize > nbytes || blocksize > L5_BLOSC_MAX_BLOCKSIZE) return -1;
    if (flags & 0x02) {  /* stored (memcpyed): the records themselves, after the header */
        if (cbytes != nbytes + 16) return -1;
        for (int64_t r = 0; r < nranges; r++) {
            l5_gather_records(src + 16 + lo[r] * itemsize, hi[r] - lo[r], itemsize, dst[r], c);
            if (found) l5_found_records(found, src + 16 + lo[r] * itemsize, hi[r] - lo[r], itemsize, dst[r]);
        }
        return 0;
    }
    if (((flags & 0xe0) >> 5) != 1) return 1;  /* not LZ4 */
    if (src[1] != 1) return -1;                  /* an LZ4 format version c-blosc refuses */
    int doshuffle = (flags & 0x01) && typesize > 1;
    if ((flags & 0x04) && blocksize >= typesize) return 1;  /* bit shuffle */
    if (doshuffle && typesize != itemsize) return 1;
    if (blocksize <= 0 || blocksize > tmpsize || blocksize % itemsize) return 1;
    int64_t nblocks = nbytes / blocksize, leftover = nbytes % blocksize;
    if (leftover % itemsize) return 1;
    nblocks += leftover > 0;
    if (nblocks > (cbytes - 16) / 4) return -1;
    int dont_split = (flags & 0x10) >> 4;
    int64_t r = 0;  /* the first range that may still hold rows of this block or the next */
    for (int64_t b = 0; b < nblocks; b++) {
        int last = b == nblocks - 1 && leftover > 0;
        int64_t bsize = last ? leftover : blocksize;
        int64_t first = b * (blocksize / itemsize), ne = bsize / itemsize;
        /* padding rows past the array's end, and rows not asked for, are decompressed too (not
           gathered): a corrupt block is refused here as c-blosc refuses it */
        int64_t nsplits = (!dont_split && typesize <= 16 && bsize / typesize >= 128 && !last) ? typesize : 1;
        int64_t neblock = bsize / nsplits, off = (int32_t)l5_rd32(src + 16 + 4 * b);
        if (neblock * nsplits != bsize) return 1;
        uint8_t* out = tmp;
        for (int64_t j = 0; j < nsplits; j++) {
            if (off < 0 || off > cbytes - 4) return -1;
            int64_t cb = (int32_t)l5_rd32(src + off);
            off += 4;
            if (cb < 0 || cb > cbytes - off) return -1;
            if (cb == neblock) {
                memcpy(out, src + off, (size_t)neblock);
            } else if (LZ4_decompress_safe((const char*)src + off, (char*)out, (int)cb, (int)neblock) != neblock) {
                return -1;
            }
            off += cb;
            out += neblock;
        }
        for (int64_t q = r; q < nranges && lo[q] < first + ne; q++) {
            int64_t a = lo[q] > first ? lo[q] : first, z = hi[q] < first + ne ? hi[q] : first + ne;
            if (z <= a) continue;
            int64_t k = a - first, at = dst[q] + (a - lo[q]);
            if (doshuffle) {  /* (the streams of rows k.. start k bytes into each stream) */
                l5_gather_streams(tmp + k, ne, z - a, at, c);
                if (found) l5_found_streams(found, tmp + k, ne, z - a, at);
            } else {
                l5_gather_records(tmp + k * itemsize, z - a, itemsize, at, c);
                if (found) l5_found_records(found, tmp + k * itemsize, z - a, itemsize, at);
            }
        }
        while (r < nranges && hi[r] <= first + ne) r++;
    }
    return 0;
}

/* The block size of a blosc chunk (its header's), 0 if it has none. */
static int64_t l5_blosc_blocksize(const uint8_t* src, int64_t srclen) {
    if (srclen < 16) return 0;
    int64_t bs = (int32_t)l5_rd32(src + 8);
    return bs > 0 ? bs : 0;
}
#endif
