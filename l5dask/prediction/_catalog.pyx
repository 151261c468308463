# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The scene catalog's per-chunk loops (:mod:`l5dask.prediction.catalog`), compiled to C, the GIL
released: each agent's mask of kinds and each scene's run its least distances and low-probability
rows (``catalog_agents``), the distinct (track, kinds) of each run of a scene (``key_runs``) and
codes of values compared as bytes (``byte_codes``, ``_distinct.h``'s hash), and the tree's joins of
open scenes (``union_masks``, ``mask_counts``). Wrapped by
:mod:`l5dask.prediction.kernels`.

What it beats, and by how much: the catalog's numpy formulation (one sort of packed (scene, kind,
track) keys, face ids decoded and sorted), these loops with the gather's maxima and codes
(``_gather.pyx``): ``l5dask catalog`` on 30 M agents, the whole process, 1.6-1.7 s of CPU against
5.6 s (``python benchmarks/catalog_benchmark.py``, 2026-11-27). ``face_runs`` (the faces' frames,
scenes, id codes and masks in one pass, where they were made whole and counted by two ``key_runs``):
the catalog's faces of 30 M agents (5.4 M faces, 270 calls) 0.059-0.072 CPU-s against 0.108 s,
their gathers apart (the report and the catalog in one ``l5dask.analyze``, one thread, mean of 3
runs; 2026-11-29). ``catalog_agents`` given the keys counts each
run's distinct keys as the run ends (its masks still in the core's cache), where ``key_runs`` read
the chunk's masks back whole: the catalog's agents member of a run of five analyses at 30 M agents,
0.111-0.115 CPU-s against 0.120-0.131 s (4 interleaved pairs of processes, 2026-11-30). When to
delete a loop: when a numpy or flox formulation of it runs within 10% of it in that benchmark.
"""

import numpy as np

from libc.math cimport sqrt
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, qsort
from libc.string cimport memcmp, memset

cdef enum:
    # ids of a run are marked in a table when they span at most this many slots per row (else sorted)
    DENSE_SPAN = 8


cdef extern from "_distinct.h":
    uint64_t l5_hash_bytes(const uint8_t* v, int64_t width) noexcept nogil


cdef extern from "_agents.h":
    void l5_dists(const double* cx, const double* cy, double ex, double ey, double* out, Py_ssize_t n) noexcept nogil


cdef extern from *:
    int __builtin_ctzll(unsigned long long) nogil


cdef int _cmp_key(const void* x, const void* y) noexcept nogil:
    cdef uint64_t a = (<const uint64_t*>x)[0], b = (<const uint64_t*>y)[0]
    return (a > b) - (a < b)


cdef Py_ssize_t _mask_run(const uint64_t* keys, const uint64_t* masks, Py_ssize_t a, Py_ssize_t b,
                          int64_t* counts, uint64_t* out) noexcept nogil:
    """The distinct keys of rows ``a..b-1`` (``a < b``), each with the OR of its rows' masks (keys
    whose masks are all 0 are left out): ``counts[bit]`` gains one per key whose mask has that bit,
    and with ``out``, the keys and masks are written there (key, mask: two words a key, sorted
    by key). A table of masks per key when the keys are dense (``DENSE_SPAN``), else a sort of
    (key, mask) pairs. Returns how many keys, -1 out of memory."""
    cdef Py_ssize_t i, k = 0
    cdef uint64_t lo = keys[a], hi = keys[a], v, span, m
    cdef uint64_t* table
    cdef uint64_t* tmp
    for i in range(a, b):
        if keys[i] < lo:
            lo = keys[i]
        if keys[i] > hi:
            hi = keys[i]
    if hi - lo < <uint64_t>(DENSE_SPAN * (b - a) + 1024):
        span = hi - lo + 1
        table = <uint64_t*>calloc(span, sizeof(uint64_t))
        if table == NULL:
            return -1
        for i in range(a, b):
            table[keys[i] - lo] |= masks[i]
        for v in range(span):
            m = table[v]
            if m == 0:
                continue
            if out != NULL:
                out[2 * k], out[2 * k + 1] = lo + v, m
            k += 1
            while m:
                counts[__builtin_ctzll(m)] += 1
                m &= m - 1
        free(table)
        return k
    tmp = <uint64_t*>malloc((b - a) * 2 * sizeof(uint64_t))
    if tmp == NULL:
        return -1
    for i in range(a, b):
        tmp[2 * (i - a)], tmp[2 * (i - a) + 1] = keys[i], masks[i]
    qsort(tmp, b - a, 2 * sizeof(uint64_t), _cmp_key)
    i = 0
    while i < b - a:
        v, m = tmp[2 * i], tmp[2 * i + 1]
        i += 1
        while i < b - a and tmp[2 * i] == v:
            m |= tmp[2 * i + 1]
            i += 1
        if m == 0:
            continue
        if out != NULL:
            out[2 * k], out[2 * k + 1] = v, m
        k += 1
        while m:
            counts[__builtin_ctzll(m)] += 1
            m &= m - 1
    free(tmp)
    return k


def key_runs(const uint64_t[::1] keys, const uint64_t[::1] masks, const int64_t[::1] cuts, Py_ssize_t nbits):
    """Per run of rows (``cuts[r] .. cuts[r + 1] - 1``, ``cuts`` increasing from 0 to the rows),
    the distinct keys, each with the OR of its rows' masks (bits ``0 .. nbits - 1``): ``(counts,
    nkeys, first, last)``, ``counts[r, bit]`` the keys of run ``r`` whose mask has that bit,
    ``nkeys[r]`` its keys, ``first`` and ``last`` the ``(keys, masks)`` of the first and the last
    run (sorted by key: those runs may go on in the neighbouring chunks). Keys whose masks are all
    0 count nowhere. (The first and last runs' keys are written where their rows' room is
    allocated, not a table of every row's: new pages each call.) The catalog's chunks take this
    from :func:`catalog_agents` given their keys (the same ``_mask_run`` of each run as it ends);
    this is the pass over masks made whole, which its tests and ``face_runs``' check them against."""
    cdef Py_ssize_t r, k, n = keys.shape[0], nruns = cuts.shape[0] - 1, nfirst = 0, nlast = 0
    cdef int problem = 0
    cdef uint64_t every = 0
    cdef uint64_t* first = NULL
    cdef uint64_t* last = NULL
    if masks.shape[0] != n or nruns < 1 or cuts[0] != 0 or cuts[nruns] != n or not 0 < nbits <= 64:
        raise ValueError("key_runs: a mask per key, runs from 0 to the rows, 1 to 64 bits expected")
    counts = np.zeros((nruns, nbits), np.int64)
    nkeys = np.empty(nruns, np.int64)
    cdef int64_t[:, ::1] counts_v = counts
    cdef int64_t[::1] nkeys_v = nkeys
    with nogil:
        for r in range(nruns):
            if cuts[r + 1] <= cuts[r]:
                problem = 1
                break
        for r in range(n):
            every |= masks[r]
        if nbits < 64 and every >> nbits:
            problem = 1
        if not problem and n:
            first = <uint64_t*>malloc(2 * (cuts[1] - cuts[0]) * sizeof(uint64_t))
            last = <uint64_t*>malloc(2 * (cuts[nruns] - cuts[nruns - 1]) * sizeof(uint64_t))
            if first == NULL or last == NULL:
                problem = 2
        if not problem and n:
            for r in range(nruns):
                if r == 0:
                    k = nfirst = _mask_run(&keys[0], &masks[0], cuts[r], cuts[r + 1], &counts_v[r, 0], first)
                elif r == nruns - 1:
                    k = nlast = _mask_run(&keys[0], &masks[0], cuts[r], cuts[r + 1], &counts_v[r, 0], last)
                else:
                    k = _mask_run(&keys[0], &masks[0], cuts[r], cuts[r + 1], &counts_v[r, 0], NULL)
                if k < 0:
                    problem = 2
                    break
                nkeys_v[r] = k
    try:
        if problem == 1:
            raise ValueError("key_runs: runs of at least a row, masks within the bits, expected")
        if problem == 2:
            raise MemoryError()
        head = _pairs(first, nfirst)
        tail = head if nruns == 1 else _pairs(last, nlast)
    finally:
        free(first)
        free(last)
    return counts, nkeys, head, tail


cdef tuple _pairs(const uint64_t* pairs, Py_ssize_t k):
    """``(keys, masks)`` of ``k`` (key, mask) pairs, two words each."""
    keys, masks = np.empty(k, np.uint64), np.empty(k, np.uint64)
    cdef uint64_t[::1] kv = keys, mv = masks
    cdef Py_ssize_t i
    for i in range(k):
        kv[i], mv[i] = pairs[2 * i], pairs[2 * i + 1]
    return keys, masks


def face_runs(const int32_t[::1] found, const int64_t[::1] inverse, int64_t nids, const int8_t[::1] status,
              const int64_t[::1] tl_start, const int64_t[::1] frame_scene, int64_t offset, int64_t lo):
    """The catalog's per-face work, one pass over a chunk of faces (rows ``lo .. lo + n - 1``,
    ordered by frame), where it made each face's frame, scene, id code and mask whole and counted
    them with two ``key_runs``: each face's id code ``inverse[found[i]]`` (in ``0 .. nids - 1``),
    its frame the last of ``tl_start`` (the first face row of each frame overlapping them; the first
    of them is frame ``offset``) at or before its row, its frame's scene ``frame_scene``, its
    status ``status[i]`` (0, 1, 2). Per run of faces of one scene: ``(scenes, counts, first_codes,
    last_codes, first_frames, first_masks, last_frames, last_masks)``: each run's scene; its
    distinct id codes (``counts[:, 0]``) and its distinct frames with a face of each status
    (``counts[:, 1 + status]``); the first and last runs' distinct id codes (in the order met: the
    caller sorts them) and their frames (increasing) with the OR of their faces' status bits (those
    runs may go on in the neighbouring chunks). The same counts as ``key_runs`` of the codes and of
    the frames with ``1 << status``, in one pass: faces come in runs of one frame, a frame's in one
    scene, and a code is met again in a run when its stamp says so (no table cleared a run)."""
    cdef Py_ssize_t i, n = status.shape[0], m = tl_start.shape[0], nfound = inverse.shape[0]
    cdef Py_ssize_t r = -1, f = 0, nfc = 0, ncc = 0, nff = 0, ncf = 0, b
    cdef int64_t c, k, row, cur_frame = -1, scene = 0
    cdef uint64_t mask = 0
    cdef int problem = 0
    if n == 0 or m == 0 or frame_scene.shape[0] != m or found.shape[0] != n or nids < 1 or tl_start[0] > lo:
        raise ValueError("face_runs: a status and a code per face, and the frames of every face, expected")
    stamp_a = np.full(nids, -1, np.int64)
    scenes_a, counts_a = np.empty(n, np.int64), np.zeros((n, 4), np.int64)
    fc_a, cc_a = np.empty(n, np.uint64), np.empty(n, np.uint64)
    ff_a, fm_a, cf_a, cm_a = np.empty(n, np.uint64), np.empty(n, np.uint64), np.empty(n, np.uint64), np.empty(n, np.uint64)
    cdef int64_t[::1] stamp = stamp_a, scenes = scenes_a
    cdef int64_t[:, ::1] counts = counts_a
    cdef uint64_t[::1] fc = fc_a, cc = cc_a, ff = ff_a, fm = fm_a, cf = cf_a, cm = cm_a
    with nogil:
        for i in range(n):
            row = lo + i
            while f + 1 < m and tl_start[f + 1] <= row:
                f += 1
            if f != cur_frame:
                if cur_frame >= 0:  # (the frame before, whole: its bits counted in its run)
                    for b in range(3):
                        if (mask >> b) & 1:
                            counts[r, 1 + b] += 1
                    cf[ncf], cm[ncf] = <uint64_t>(offset + cur_frame), mask
                    ncf += 1
                if cur_frame < 0 or frame_scene[f] != scene:  # (a new run: the run before kept if first)
                    if r == 0:
                        nfc, nff = ncc, ncf
                        fc[:nfc] = cc[:ncc]
                        ff[:nff] = cf[:ncf]
                        fm[:nff] = cm[:ncf]
                    r += 1
                    scene = frame_scene[f]
                    scenes[r] = scene
                    ncc = ncf = 0
                cur_frame, mask = f, 0
            k = found[i]
            if k < 0 or k >= nfound or status[i] < 0 or status[i] > 2:
                problem = 1
                break
            c = inverse[k]
            if c < 0 or c >= nids:
                problem = 1
                break
            if stamp[c] != r:
                stamp[c] = r
                counts[r, 0] += 1
                cc[ncc] = <uint64_t>c
                ncc += 1
            mask |= (<uint64_t>1) << status[i]
        if not problem:
            for b in range(3):
                if (mask >> b) & 1:
                    counts[r, 1 + b] += 1
            cf[ncf], cm[ncf] = <uint64_t>(offset + cur_frame), mask
            ncf += 1
            if r == 0:
                nfc, nff = ncc, ncf
                fc[:nfc] = cc[:ncc]
                ff[:nff] = cf[:ncf]
                fm[:nff] = cm[:ncf]
    if problem:
        raise ValueError("face_runs: each face's code among the ids, its status 0, 1 or 2, expected")
    nruns = r + 1
    return (scenes_a[:nruns].copy(), counts_a[:nruns].copy(), fc_a[:nfc].copy(), cc_a[:ncc].copy(),
            ff_a[:nff].copy(), fm_a[:nff].copy(), cf_a[:ncf].copy(), cm_a[:ncf].copy())


cdef enum:
    # rows whose distances are made at once (an array on the stack, in L1)
    AGENT_BLOCK = 4096


def catalog_agents(const int8_t[::1] label, const float[::1] top, const double[::1] cx, const double[::1] cy,
                   const int64_t[::1] frame_starts, const double[:, ::1] ego_xy, const int64_t[::1] frame_scene,
                   int64_t lo, const int8_t[::1] groups, double near0, double near1, float low,
                   uint64_t[::1] masks, const double[::1] dist=None, const uint64_t[::1] keys=None):
    """The catalog's per-agent work, one pass over a chunk of agents (first row ``lo``, ordered by
    frame; ``frame_starts``, ``ego_xy``, ``frame_scene``: the agent start, ego x/y and scene of the
    frames overlapping them): each row's mask (bit ``label``; bit ``L + g`` when its label's group
    ``g = groups[label]`` (0, 1, 2; -1 none) is within ``near0`` of the ego, ``L + 3 + g`` within
    ``near1``, ``L`` the number of labels: distances ``sqrt(dx * dx + dy * dy)``, as numpy's), and
    per run of rows of one scene: ``(cuts, scenes, mins, lows)``, the runs' bounds and scenes, the
    least distance of group 1 and of group 2 (inf: none) and the rows whose ``top`` (the label's
    probability) is under ``low``. With ``dist`` (a distance per row, made by the report's loop
    of the same rows in a fused pass: the same bits), the distances are taken from it, and ``cx``,
    ``cy`` and ``ego_xy`` are not read.

    A frame's run of rows at a time: its distances a vector loop (``_agents.h``, the report's;
    or taken from ``dist``), then each row's mask made without branches on its label (bits looked
    up per label): 2.1 ns a row, 1.7 ns with ``dist``, against 2.6 ns for the loop that branched
    on each row's group and made its distance there (the first 40 calls of a catalog of
    ``benchmarks/analyze_benchmark.py``'s dataset, 40,000 agents each, one thread, best of 9,
    the outputs checked equal; 2026-11-28, at load 10).

    With ``keys`` (a track id per row), each run's distinct keys and their masks OR'd as
    :func:`key_runs` makes them of the masks (``_mask_run``), each run as soon as its last row's
    mask is made, while its rows' masks are still in the core's cache (where ``key_runs`` read the
    whole chunk's back from memory): ``(cuts, scenes, mins, lows, counts, nkeys, first, last)``,
    the last four ``key_runs``' of ``nl + 6`` bits."""
    cdef Py_ssize_t i, q, end, j = 0, r = 0, n = label.shape[0], m = frame_starts.shape[0], nl = groups.shape[0]
    cdef int problem = 0
    cdef int8_t l, g, lmin = 0, lmax = 0
    cdef int64_t scene, nlow
    cdef double dd
    cdef double buf[AGENT_BLOCK]
    cdef const double* d
    cdef uint64_t one[64]
    cdef uint64_t bit0[64]
    cdef uint64_t bit1[64]
    cdef int8_t closest[64]
    if n == 0 or m == 0 or ego_xy.shape[0] != m or frame_scene.shape[0] != m or masks.shape[0] < n or \
            top.shape[0] != n or cx.shape[0] != n or cy.shape[0] != n or nl + 6 > 64 or frame_starts[0] > lo or \
            (dist is not None and dist.shape[0] != n):
        raise ValueError("catalog_agents: columns of the rows, their frames, at most 58 labels and a mask a row expected")
    for l in range(nl):  # (each label's bits: its own, its group's within each distance, its least distance's slot)
        g = groups[l]
        one[l] = (<uint64_t>1) << l
        bit0[l] = ((<uint64_t>1) << (nl + g)) if g >= 0 else 0
        bit1[l] = ((<uint64_t>1) << (nl + 3 + g)) if g >= 0 else 0
        closest[l] = g - 1 if g == 1 or g == 2 else -1
    # (the runs are at most the scenes the frames span, increasing: tens, where the rows are tens
    # of thousands; outputs sized by the rows cost a fill of 0.6 MB a chunk)
    cdef Py_ssize_t cap = min(n, max(1, frame_scene[m - 1] - frame_scene[0] + 1))
    cuts, scenes = np.empty(cap + 1, np.int64), np.empty(cap, np.int64)
    mins, lows = np.full((cap, 2), np.inf), np.zeros(cap, np.int64)
    cdef int64_t[::1] cuts_v = cuts, scenes_v = scenes, lows_v = lows
    cdef double[:, ::1] mins_v = mins
    cdef const double* dp = &dist[0] if dist is not None else NULL
    # (with keys: each run's distinct keys, made when the run ends; the first and the last run's
    # keys and masks written out)
    cdef Py_ssize_t nbits = nl + 6, k, nfirst = 0, nlast = 0
    cdef uint64_t* first = NULL
    cdef uint64_t* last = NULL
    cdef const uint64_t* kp = NULL
    counts = nkeys = None
    cdef int64_t[:, ::1] counts_v
    cdef int64_t[::1] nkeys_v
    if keys is not None:
        if keys.shape[0] != n:
            raise ValueError("catalog_agents: a key a row expected")
        kp = &keys[0]
        counts, nkeys = np.zeros((cap, nbits), np.int64), np.zeros(cap, np.int64)
        counts_v, nkeys_v = counts, nkeys
        first = <uint64_t*>malloc(2 * n * sizeof(uint64_t))
        last = <uint64_t*>malloc(2 * n * sizeof(uint64_t))
        if first == NULL or last == NULL:
            free(first)
            free(last)
            raise MemoryError("catalog_agents: the runs' keys")
    with nogil:
        for i in range(n):  # (every label one of the labels: checked before any is looked up)
            lmin = min(lmin, label[i])
            lmax = max(lmax, label[i])
        if lmin < 0 or lmax >= nl:
            problem = 1
        i = 0
        while i < n and not problem:  # a frame's run of rows at a time
            while j + 1 < m and frame_starts[j + 1] <= lo + i:
                j += 1
            end = n if j + 1 >= m else min(n, <Py_ssize_t>(frame_starts[j + 1] - lo))
            end = min(end, i + AGENT_BLOCK)
            scene = frame_scene[j]
            if i == 0 or scene != scenes_v[r - 1]:
                if r == cap:  # (scenes not increasing over the frames)
                    problem = 2
                    break
                cuts_v[r], scenes_v[r] = i, scene
                r += 1
                if kp != NULL and r >= 2:  # (the run before this one is whole: its keys)
                    k = _mask_run(kp, &masks[0], cuts_v[r - 2], i, &counts_v[r - 2, 0], first if r == 2 else last)
                    if k < 0:
                        problem = 3
                        break
                    nkeys_v[r - 2] = k
                    if r == 2:
                        nfirst = k
                    else:
                        nlast = k
            if dp != NULL:
                d = dp + i
            else:
                l5_dists(&cx[i], &cy[i], ego_xy[j, 0], ego_xy[j, 1], buf, end - i)
                d = buf
            nlow = 0
            for q in range(i, end):
                l = label[q]
                dd = d[q - i]
                # (a NaN distance is within neither: no bit, as the comparisons are false)
                masks[q] = one[l] | (bit0[l] & (0 - <uint64_t>(dd <= near0))) | (bit1[l] & (0 - <uint64_t>(dd <= near1)))
                nlow += top[q] < low
                g = closest[l]
                if g >= 0 and dd < mins_v[r - 1, g]:
                    mins_v[r - 1, g] = dd
            lows_v[r - 1] += nlow
            i = end
        cuts_v[r] = n
        if kp != NULL and not problem and n:  # (the last run)
            k = _mask_run(kp, &masks[0], cuts_v[r - 1], n, &counts_v[r - 1, 0], first if r == 1 else last)
            if k < 0:
                problem = 3
            else:
                nkeys_v[r - 1] = k
                if r == 1:
                    nfirst = k
                else:
                    nlast = k
    try:
        if problem == 3:
            raise MemoryError("catalog_agents: a run's keys")
        if problem == 2:
            raise ValueError("catalog_agents: the frames' scenes increasing expected")
        if problem:
            raise ValueError(f"catalog_agents: labels from 0 to {nl - 1} expected")
        out = (cuts, scenes, mins, lows) if r == cap else (cuts[: r + 1].copy(), scenes[:r].copy(), mins[:r].copy(), lows[:r].copy())
        if kp == NULL:
            return out
        head = _pairs(first, nfirst)
        tail = head if r == 1 else _pairs(last, nlast)
        if r < cap:
            counts, nkeys = counts[:r].copy(), nkeys[:r].copy()
        return (*out, counts, nkeys, head, tail)
    finally:
        free(first)
        free(last)


def byte_codes(const uint8_t[:, ::1] values):
    """Codes of values compared as bytes (a row each): ``(codes, first)``, each row's code (its
    value's rank of first appearance) and the first row of each value. An open-addressing table
    whose values that hash alike are compared byte for byte: exact whatever the hash does."""
    cdef Py_ssize_t i, s, n = values.shape[0], w = values.shape[1], k = 0
    cdef int64_t cap = 16, mask, j
    cdef int64_t* table
    codes, first = np.empty(n, np.int64), np.empty(n, np.int64)
    cdef int64_t[::1] codes_v = codes, first_v = first
    if n == 0:
        return codes, first[:0]
    while cap < 2 * n:
        cap <<= 1
    mask = cap - 1
    table = <int64_t*>malloc(cap * sizeof(int64_t))
    if table == NULL:
        raise MemoryError()
    with nogil:
        memset(table, 0xff, cap * sizeof(int64_t))
        for i in range(n):
            s = <Py_ssize_t>(l5_hash_bytes(&values[i, 0], w) & <uint64_t>mask) if w else 0
            while True:
                j = table[s]
                if j < 0:
                    table[s] = k
                    first_v[k] = i
                    codes_v[i] = k
                    k += 1
                    break
                if w == 0 or memcmp(&values[first_v[j], 0], &values[i, 0], w) == 0:
                    codes_v[i] = j
                    break
                s = (s + 1) & mask
    free(table)
    return codes, first[:k].copy()


def union_masks(const uint64_t[::1] a, const uint64_t[::1] am, const uint64_t[::1] b, const uint64_t[::1] bm):
    """The union of two sorted arrays of distinct keys, each with its mask (a key in both: the OR
    of its masks): ``(keys, masks)``, sorted (a merge, as :func:`union_sorted`)."""
    if am.shape[0] != a.shape[0] or bm.shape[0] != b.shape[0]:
        raise ValueError("union_masks: a mask per key expected")
    keys, masks = np.empty(a.shape[0] + b.shape[0], np.uint64), np.empty(a.shape[0] + b.shape[0], np.uint64)
    cdef uint64_t[::1] ko = keys, mo = masks
    cdef Py_ssize_t i = 0, j = 0, k = 0
    with nogil:
        while i < a.shape[0] and j < b.shape[0]:
            if a[i] < b[j]:
                ko[k], mo[k] = a[i], am[i]
                i += 1
            elif b[j] < a[i]:
                ko[k], mo[k] = b[j], bm[j]
                j += 1
            else:
                ko[k], mo[k] = a[i], am[i] | bm[j]
                i += 1
                j += 1
            k += 1
        while i < a.shape[0]:
            ko[k], mo[k] = a[i], am[i]
            i += 1
            k += 1
        while j < b.shape[0]:
            ko[k], mo[k] = b[j], bm[j]
            j += 1
            k += 1
    return keys[:k], masks[:k]


def mask_counts(const uint64_t[::1] masks, Py_ssize_t nbits):
    """How many masks have each of bits ``0 .. nbits - 1`` (int64)."""
    if not 0 < nbits <= 64:
        raise ValueError("mask_counts: 1 to 64 bits expected")
    counts = np.zeros(64, np.int64)
    cdef int64_t[::1] c = counts
    cdef Py_ssize_t i
    cdef uint64_t m
    with nogil:
        for i in range(masks.shape[0]):
            m = masks[i]
            while m:
                c[__builtin_ctzll(m)] += 1
                m &= m - 1
    if counts[nbits:].any():
        raise ValueError("mask_counts: masks beyond the bits")
    return counts[:nbits].copy()
