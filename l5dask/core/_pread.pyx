# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""A read of a range of a local file, compiled to C, the GIL released for all of it: whether the
range is in the page cache (``cachestat``), ``O_DIRECT`` set or cleared on the file as the read
wants, and the ``pread`` calls into the thread's kept buffer. Wrapped by
:mod:`l5dask.core.diskread` (``open_file``, ``read_range``), which says what each read does.

What it beats, and by how much: the same read made of Python's calls (``os.fstat``, ``ctypes``'
``cachestat``, two ``fcntl``, ``os.preadv``), each of which let go of the GIL and took it back (15
times a chunk read in part, with its ``open`` and ``fstat``): the threads that read ahead waited
for the GIL behind the dask threads' work between their reads. At 1.03 G agents, 5% of the scenes
spread, cold (``python -P benchmarks/scenes_benchmark.py --path /work/datasets/big/big.zarr --evict
--repeat 2 --runs full,spread --before CHECKOUT``, 2 interleaved rounds): 4.39-5.00 s wall and
4.89-5.93 CPU-s against 5.49 s and 5.74-6.81 CPU-s, the same 2.14 GB from the disk; the full
report 40.6-43.3 CPU-s against 42.1-45.6. When to delete it: when that benchmark shows Python's
calls within 10% of it (an interpreter without the GIL).

``read_part`` (a blosc chunk read in part: open, header, the blocks it plans from the header,
last byte and close in one call, the GIL let go once, ``O_DIRECT`` changed only when it must),
against the same reads made by ``l5dask.prediction.reading``'s Python one at a time through
``read_range`` and ``open_file`` (three to four GIL hand-overs a chunk): ``l5dask stats --scenes
"scene_index % 20 == 0"`` on 121 M agents, warm (synth-6800, 1,343 chunks read in part), 16,858
``futex`` calls against 57,735 (``strace -c -f``; the same 4,039 ``pread64``), 0.946x and 0.906x
the CPU time (medians of 8 and 10 interleaved rounds of whole processes, load 9-13); at 1 G agents
under load, 160 k ``futex`` against 406 k and ``fcntl`` 25 k against 46 k. When to delete it: with
``read_range``, or when the Python reader's reads one at a time are within 5% of its CPU there.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.errno cimport EINTR, EINVAL, ENOSYS, EPERM, errno
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc


cdef extern from "<fcntl.h>" nogil:
    int O_RDONLY
    int O_CLOEXEC
    int O_DIRECT
    int F_GETFL
    int F_SETFL
    int POSIX_FADV_RANDOM
    int c_open "open"(const char* path, int flags)
    int fcntl(int fd, int cmd, ...)
    int posix_fadvise(int fd, long offset, long length, int advice)

cdef extern from "<unistd.h>" nogil:
    ssize_t pread(int fd, void* buf, size_t count, long offset)
    long syscall(long number, ...)
    int c_close "close"(int fd)

cdef extern from "<sys/stat.h>" nogil:
    cdef struct stat:
        long st_size
        unsigned long st_dev
    int fstat(int fd, stat* st)


cdef struct cachestat_range:
    uint64_t off
    uint64_t len


cdef struct cachestat_t:
    uint64_t nr_cache
    uint64_t nr_dirty
    uint64_t nr_writeback
    uint64_t nr_evicted
    uint64_t nr_recently_evicted


cdef enum:
    _OK = 0
    _UNKNOWN = -1
    _REFUSED = -2
    _SMALL = -3

#: What ``read_range`` says besides a count of bytes (its first value).
OK = _OK
#: The kernel cannot say whether the range is in the page cache (no ``cachestat``): ask otherwise.
UNKNOWN = _UNKNOWN
#: The file's filesystem refuses ``O_DIRECT`` (or wants other alignments): read through the cache.
REFUSED = _REFUSED


def open_file(bytes path, bint random):
    """``(fd, size, device)`` of the local file ``path`` opened to read (``random``: the kernel
    told the reads are random, ``POSIX_FADV_RANDOM``, no read ahead), or ``(-errno, 0, 0)``."""
    cdef const char* p = path
    cdef int fd
    cdef int err = 0
    cdef stat st
    st.st_size = 0
    st.st_dev = 0
    with nogil:
        fd = c_open(p, O_RDONLY | O_CLOEXEC)
        if fd < 0:
            err = errno
        elif fstat(fd, &st) != 0:
            err = errno
            c_close(fd)
            fd = -1
        elif random:
            posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM)
    if fd < 0:
        return -err, 0, 0
    return fd, st.st_size, st.st_dev


def read_range(int fd, int64_t a, int64_t b, uint8_t[::1] buf, bint direct, long cachestat_nr, int64_t align,
               int64_t page):
    """Bytes ``[a, b)`` of the open file ``fd`` (opened by :func:`open_file` or with ``O_RDONLY``
    alone) read into ``buf`` (aligned to ``align``, at least ``b - a`` bytes plus twice ``align``):
    ``(status, at, n)``, the bytes at ``buf[at:at + n]`` (fewer than asked at the end of the file).
    With ``direct``, whether the range is all in the page cache is asked first (``cachestat``,
    system call ``cachestat_nr``): if it is, or not ``direct``, the read goes through the cache
    (``O_DIRECT`` cleared), else around it (``O_DIRECT`` set, the range widened to ``align``);
    ``page``: the size of the cache's pages. ``status``: ``OK``; ``UNKNOWN`` (no ``cachestat``:
    nothing read); ``REFUSED`` (``O_DIRECT`` refused: nothing read, ``fd`` left without it); or
    ``errno`` of a failed read. :func:`_read_into` with the file's flags asked first."""
    cdef int status = _OK
    cdef int flags
    cdef bint is_direct = False
    cdef int64_t at = 0, n = 0
    cdef uint8_t* p = &buf[0]
    if b <= a:
        return _OK, 0, 0
    if b - a + 2 * align > buf.shape[0]:
        raise ValueError("read_range: the buffer is too small")
    with nogil:
        flags = fcntl(fd, F_GETFL)
        if flags < 0:
            status = errno
        else:
            is_direct = (flags & O_DIRECT) != 0
            status = _read_into(fd, a, b, p, direct, &is_direct, cachestat_nr, align, page, &at, &n)
            if status == _REFUSED and is_direct:
                fcntl(fd, F_SETFL, 0)
    if status != _OK:
        return status, 0, 0
    return _OK, at, n


cdef int _read_into(int fd, int64_t a, int64_t b, uint8_t* p, bint direct, bint* is_direct, long cachestat_nr,
                    int64_t align, int64_t page, int64_t* at, int64_t* n) noexcept nogil:
    """Bytes ``[a, b)`` of ``fd`` read into ``p`` (aligned to ``align``, room for ``b - a`` plus twice
    ``align``), as :func:`read_range` reads them: around the page cache (``O_DIRECT``) with
    ``direct`` when they are not all in it, else through it. ``is_direct``: whether ``O_DIRECT`` is
    set on ``fd`` now (known, so it is set or cleared only when it changes: no ``F_GETFL``). The
    bytes at ``p[at:at + n]``; returns ``_OK``, ``_UNKNOWN``, ``_REFUSED`` or ``errno``."""
    cdef int64_t lo, hi, got = 0, pages
    cdef ssize_t r
    cdef bint around = False
    cdef cachestat_range rng
    cdef cachestat_t cs
    at[0] = 0
    n[0] = 0
    if b <= a:
        return _OK
    if direct:
        lo = a - a % page
        rng.off = lo
        rng.len = b - lo
        pages = (b - lo + page - 1) // page
        if syscall(cachestat_nr, fd, &rng, &cs, 0) == 0:
            around = cs.nr_cache < <uint64_t>pages
        elif errno == ENOSYS or errno == EPERM:
            return _UNKNOWN
        else:
            return errno
    if around != is_direct[0]:  # (``fd`` opened with no status flag: ``O_DIRECT`` is all it has or not)
        if fcntl(fd, F_SETFL, O_DIRECT if around else 0) != 0:
            return _REFUSED if around else errno
        is_direct[0] = around
    if around:
        lo = a - a % align
        hi = b + (align - b % align) % align
        while lo + got < b:
            r = pread(fd, p + got, hi - lo - got, lo + got)
            if r < 0:
                if errno == EINTR:
                    continue
                return _REFUSED if got == 0 and errno == EINVAL else errno  # (other alignments)
            got += r
            if r == 0 or r % align:  # (the end of the file: a short read is only that)
                break
        at[0] = a - lo
        got = got - (a - lo)
        n[0] = 0 if got < 0 else (b - a if got > b - a else got)
        return _OK
    while a + got < b:
        r = pread(fd, p + got, b - a - got, a + got)
        if r < 0:
            if errno == EINTR:
                continue
            return errno
        if r == 0:
            break
        got += r
    n[0] = got
    return _OK


cdef inline int64_t _le32(const uint8_t* p) noexcept nogil:
    return <int32_t>(<uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24))


cdef int64_t _plan_blocks(const uint8_t* head, int64_t got, int64_t nbytes, const int64_t* cuts, int64_t ncuts,
                          int64_t size, int64_t* spans, int64_t room) noexcept nogil:
    """The byte ranges of a blosc chunk (``head``: its first ``got`` bytes, read) that a chunk read in
    part reads after its header, as ``l5dask.prediction.reading``'s ``_read_part`` works them out:
    the wanted blocks' bytes (those that touch merged), or each cut's bytes (a chunk stored as it
    is, blosc's memcpyed flag), then the chunk's last byte; or the whole file (the last, short
    block alone: ``[0, size)``, one range). Written to ``spans`` (pairs, at most ``room``); their
    count, or -1 where the header wants anything else of it (too few bytes of it read, values out
    of bounds: that reader then reads on its own and says what is wrong)."""
    cdef int64_t flags, bs, cbytes, nblocks, i, j, w, k, a, b, lo_b, hi_b, nwanted = 0, last = -1, m = 0
    cdef int64_t first, end, x
    cdef int64_t* st
    cdef uint8_t* want
    if got < 16:
        return -1
    flags = head[2]
    bs = _le32(head + 8)
    cbytes = _le32(head + 12)
    if cbytes <= 0 or cbytes > size:
        return -1
    if flags & 0x02:
        if ncuts + 1 > room:
            return -1
        for i in range(ncuts):
            spans[2 * m] = 16 + cuts[2 * i]
            spans[2 * m + 1] = 16 + cuts[2 * i + 1]
            m += 1
        spans[2 * m] = cbytes - 1
        spans[2 * m + 1] = cbytes
        return m + 1
    if bs <= 0 or nbytes <= 0:
        return -1
    nblocks = (nbytes + bs - 1) // bs
    if 16 + 4 * nblocks > got or nblocks + 1 > room:
        return -1
    st = <int64_t*>malloc((nblocks + 1) * sizeof(int64_t))
    want = <uint8_t*>malloc(nblocks)
    if st == NULL or want == NULL:
        free(st)
        free(want)
        return -1
    for i in range(nblocks):
        want[i] = 0
        st[i] = _le32(head + 16 + 4 * i)
        if st[i] < 16 + 4 * nblocks or st[i] >= cbytes:
            free(st)
            free(want)
            return -1
    for i in range(ncuts):
        lo_b = cuts[2 * i] // bs
        hi_b = (cuts[2 * i + 1] - 1) // bs
        if lo_b < 0 or hi_b >= nblocks or cuts[2 * i + 1] <= cuts[2 * i]:
            free(st)
            free(want)
            return -1
        for j in range(lo_b, hi_b + 1):
            want[j] = 1
    for i in range(nblocks):
        if want[i]:
            nwanted += 1
            last = i
    if nwanted == 0:
        free(st)
        free(want)
        return -1
    if last == nblocks - 1 and nbytes % bs and nwanted == 1:  # (the last, short block alone: all of it)
        free(st)
        free(want)
        spans[0] = 0
        spans[1] = size
        return 1
    # each wanted block ends where the next stored one starts (in any order), or at cbytes; the
    # ranges in the order of their starts, those that touch merged (as sorted(zip(firsts, ends)))
    for i in range(nblocks):  # (the wanted blocks' starts, ends after them: pairs in spans)
        if not want[i]:
            continue
        first = st[i]
        end = cbytes
        for j in range(nblocks):
            if st[j] > first and st[j] < end:
                end = st[j]
        # insert (first, end) in order
        k = m
        while k > 0 and (spans[2 * (k - 1)] > first or (spans[2 * (k - 1)] == first and spans[2 * (k - 1) + 1] > end)):
            spans[2 * k] = spans[2 * (k - 1)]
            spans[2 * k + 1] = spans[2 * (k - 1) + 1]
            k -= 1
        spans[2 * k] = first
        spans[2 * k + 1] = end
        m += 1
    free(st)
    free(want)
    k = 0  # (merged in place)
    for i in range(m):
        a = spans[2 * i]
        b = spans[2 * i + 1]
        if k and a <= spans[2 * (k - 1) + 1]:
            x = spans[2 * (k - 1) + 1]
            spans[2 * (k - 1) + 1] = b if b > x else x
        else:
            spans[2 * k] = a
            spans[2 * k + 1] = b
            k += 1
    spans[2 * k] = cbytes - 1
    spans[2 * k + 1] = cbytes
    return k + 1


def read_part(bytes path, bint direct, long cachestat_nr, int64_t align, int64_t page, uint8_t[::1] buf,
              int64_t head_bytes, int64_t nbytes, int64_t[::1] cuts):
    """A blosc chunk read in part, all its reads in one call, the GIL let go once: the local file
    ``path`` opened, its header read (its first ``head_bytes``), the ranges that a reader of decoded
    bytes ``cuts`` (pairs ``[lo, hi)``, in order) of its ``nbytes`` reads next worked out from it
    (:func:`_plan_blocks`), read (those less than ``align`` apart in one read, as
    ``l5dask.prediction.reading._coalesced``), and the file closed. Each read as
    :func:`read_range`'s (``direct``: around the page cache when not in it), into ``buf`` (aligned
    to ``align``), ``O_DIRECT`` set or cleared on the file only when that changes (one ``fcntl``,
    where a read through :func:`read_range` makes two each).

    Returns ``(status, size, dev, pieces)``: ``pieces``, ``(start, bytes)`` of each read (the header
    first; only it where the header wants another reader); ``status``: ``OK``, ``UNKNOWN`` and
    ``REFUSED`` (nothing kept: read otherwise), ``errno`` of a read (or of the ``open`` or ``fstat``:
    ``size`` -1), or ``SMALL`` (``buf`` too small for the reads: nothing more read than the header)."""
    cdef const char* c_path = path
    cdef int fd = -1, err = 0, status = _OK
    cdef stat sb
    cdef bint is_direct = False
    cdef int64_t ncuts = cuts.shape[0] // 2
    cdef int64_t room = ncuts + 70
    cdef int64_t* spans = NULL
    cdef int64_t* reads = NULL
    cdef int64_t nspans = -1, nreads = 0, used = 0, at = 0, n = 0, i, j, a, b, need, size = 0
    cdef int64_t cap = buf.shape[0]
    cdef uint8_t* p = &buf[0] if cap else NULL
    cdef const int64_t* c_cuts = &cuts[0] if ncuts else NULL
    # (the caller's arguments, not the file's bytes: refused, as a bug of the caller, before anything is read)
    if align <= 0 or align & (align - 1) or page <= 0 or cap == 0 or <uintptr_t>p % <uintptr_t>align:
        raise ValueError("read_part: align must be a power of two and buf a non-empty buffer aligned to it")
    if head_bytes < 16 or nbytes <= 0 or cuts.shape[0] % 2:
        raise ValueError("read_part: head_bytes of 16 at least, nbytes positive and cuts in pairs are needed")
    for i in range(ncuts):
        if not (0 <= c_cuts[2 * i] <= c_cuts[2 * i + 1] <= nbytes):
            raise ValueError("read_part: cuts must be ranges [lo, hi) within the decoded bytes")
    spans = <int64_t*>malloc(2 * (room + 1) * sizeof(int64_t))
    reads = <int64_t*>malloc(4 * (room + 1) * sizeof(int64_t))  # (start, at in buf, length, -)
    if spans == NULL or reads == NULL:
        free(spans)
        free(reads)
        raise MemoryError()
    sb.st_size = 0
    sb.st_dev = 0
    with nogil:
        fd = c_open(c_path, O_RDONLY | O_CLOEXEC)
        if fd < 0 or fstat(fd, &sb) != 0:
            err = errno
        else:
            size = sb.st_size
            if not direct:
                posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM)
            b = head_bytes if head_bytes < size else size
            if b + 2 * align > cap:
                status = _SMALL
            else:
                status = _read_into(fd, 0, b, p, direct, &is_direct, cachestat_nr, align, page, &at, &n)
            if status == _OK:
                reads[0] = 0
                reads[1] = at
                reads[2] = n
                nreads = 1
                used = (at + n + align - 1) // align * align + align
                nspans = _plan_blocks(p + at, n, nbytes, c_cuts, ncuts, size, spans, room)
            if status == _OK and nspans > 0:
                need = used  # (the room the reads want: each coalesced read, aligned)
                i = 0
                while i < nspans:
                    j = i
                    a = spans[2 * i]
                    b = spans[2 * i + 1]
                    while j + 1 < nspans and spans[2 * (j + 1)] - b < align:
                        j += 1
                        if spans[2 * j + 1] > b:
                            b = spans[2 * j + 1]
                    a = a if a < size else size
                    b = b if b < size else size
                    b = b if b > a else a
                    reads[4 * nreads] = a
                    reads[4 * nreads + 3] = b
                    need += (b - a + 3 * align - 1) // align * align + align
                    nreads += 1
                    i = j + 1
                if need > cap:
                    status = _SMALL
                    nreads = 1
                for i in range(1, nreads):
                    if status != _OK:
                        break
                    a = reads[4 * i]
                    b = reads[4 * i + 3]
                    status = _read_into(fd, a, b, p + used, direct, &is_direct, cachestat_nr, align, page, &at, &n)
                    reads[4 * i + 1] = used + at
                    reads[4 * i + 2] = n
                    used += (b - a + 3 * align - 1) // align * align + align
        if fd >= 0:
            c_close(fd)
    free(spans)
    if err:
        free(reads)
        return err, -1, 0, []
    pieces = []
    if status == _OK or status == _SMALL:
        for i in range(nreads):
            pieces.append((reads[4 * i], PyBytes_FromStringAndSize(<char*>p + reads[4 * i + 1], reads[4 * i + 2])))
    free(reads)
    return status, size, sb.st_dev, pieces


#: ``read_part``: ``buf`` is too small for its reads (only the header read).
SMALL = _SMALL
