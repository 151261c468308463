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
"""

from libc.errno cimport EINTR, EINVAL, ENOSYS, EPERM, errno
from libc.stdint cimport int64_t, uint8_t, uint64_t


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


cdef int _set_direct(int fd, bint on) noexcept nogil:
    """``O_DIRECT`` set (or cleared) on ``fd``: 0, or -1 with ``errno``."""
    cdef int flags = fcntl(fd, F_GETFL)
    if flags < 0:
        return -1
    if ((flags & O_DIRECT) != 0) == on:
        return 0
    return fcntl(fd, F_SETFL, (flags | O_DIRECT) if on else (flags & ~O_DIRECT))


def read_range(int fd, int64_t a, int64_t b, uint8_t[::1] buf, bint direct, long cachestat_nr, int64_t align,
               int64_t page):
    """Bytes ``[a, b)`` of the open file ``fd`` read into ``buf`` (aligned to ``align``, at least
    ``b - a`` bytes plus twice ``align``): ``(status, at, n)``, the bytes at ``buf[at:at + n]`` (fewer
    than asked at the end of the file). With ``direct``, whether the range is all in the page
    cache is asked first (``cachestat``, system call ``cachestat_nr``): if it is, or not
    ``direct``, the read goes through the cache (``O_DIRECT`` cleared), else around it (``O_DIRECT``
    set, the range widened to ``align``); ``page``: the size of the cache's pages. ``status``: ``OK``; ``UNKNOWN`` (no ``cachestat``:
    nothing read); ``REFUSED`` (``O_DIRECT`` refused: nothing read); or ``errno`` of a failed read."""
    cdef int64_t lo, hi, got = 0, n, pages
    cdef ssize_t r
    cdef int status = _OK
    cdef bint around = False
    cdef cachestat_range rng
    cdef cachestat_t cs
    cdef uint8_t* p = &buf[0]
    cdef int64_t size = buf.shape[0]
    if b <= a:
        return _OK, 0, 0
    with nogil:
        if direct:
            lo = a - a % page
            rng.off = lo
            rng.len = b - lo
            pages = (b - lo + page - 1) // page
            if syscall(cachestat_nr, fd, &rng, &cs, 0) == 0:
                around = cs.nr_cache < <uint64_t>pages
            elif errno == ENOSYS or errno == EPERM:
                status = _UNKNOWN
            else:
                status = errno
        if status == _OK and around:
            lo = a - a % align
            hi = b + (align - b % align) % align
            if hi - lo > size:
                status = _SMALL
            elif _set_direct(fd, True) != 0:
                status = _REFUSED
            else:
                while lo + got < b:
                    r = pread(fd, p + got, hi - lo - got, lo + got)
                    if r < 0:
                        if errno == EINTR:
                            continue
                        status = _REFUSED if got == 0 and errno == EINVAL else errno  # (other alignments)
                        break
                    got += r
                    if r == 0 or r % align:  # (the end of the file: a short read is only that)
                        break
                if status == _REFUSED:
                    _set_direct(fd, False)
            if status == _OK:
                n = got - (a - lo)
                if n > b - a:
                    n = b - a
                if n < 0:
                    n = 0
                got = n
        elif status == _OK:
            if b - a > size:
                status = _SMALL
            elif _set_direct(fd, False) != 0:
                status = errno
            else:
                while a + got < b:
                    r = pread(fd, p + got, b - a - got, a + got)
                    if r < 0:
                        if errno == EINTR:
                            continue
                        status = errno
                        break
                    if r == 0:
                        break
                    got += r
    if status == _SMALL:
        raise ValueError("read_range: the buffer is too small")
    if status != _OK:
        return status, 0, 0
    if around:
        return _OK, a - (a - a % align), got
    return _OK, 0, got
