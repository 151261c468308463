# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""What identifies each file of a local folder, for the cache's keys (``Store.identities``): one
listing of the folder and a ``stat`` of each file, without the GIL, in the order of the files'
inode numbers, relative to the folder's open descriptor, each file's identity made here as the
one string the keys take (``stat:size:mtime_ns:ctime_ns:inode``).

Why: a cache's rerun stats every stored chunk before it reads its entries (71,142 files at 1.03 G
agents). ``os.scandir`` and ``DirEntry.stat`` in Python make a ``DirEntry`` and a ``stat_result``
a file, resolve each file's whole path again, and stat in the listing's order, which on ext4 is its
names' hashes: all over the inode tables. Here one ``fstatat`` a file relative to the folder's
descriptor, files sorted by the inode number the listing gives (as gnulib's ``fts`` sorts large
folders for the same reason: the inode tables read in order), and no Python object but the
names and the identities.

What it beats, and by how much: the Python listing it replaced (``os.scandir`` and
``DirEntry.stat``, then an f-string a file) over the 71,142 chunk files of the 1.03 G-agent
dataset, in the page cache: 0.26-0.28 CPU-s against 0.09-0.11 (the syscalls' own system time
is most of what is left), and the identities of its four arrays (``L5Array.chunk_identities``)
0.33 CPU-s against 0.15-0.16. Read cold (a scratch ext4 remounted before each run: its dentries,
inodes and metadata blocks gone), both spend about 0.5 s of system time in the kernel (the name
lookups in the folders' blocks and making each inode); the Python loop adds its 0.1-0.15 s of
user time. ``python benchmarks/stat_benchmark.py`` measures both (``--folder`` for a cold one).
When to delete it: when ``os.scandir`` with a descriptor and a cheaper ``stat_result`` come within
10% of it.
"""

import os

from libc.errno cimport ENOENT, errno
from libc.stdint cimport int64_t, uint64_t
from libc.stdio cimport snprintf
from libc.stdlib cimport free, malloc, qsort, realloc
from libc.string cimport memcpy, strlen


cdef extern from "Python.h":
    object PyUnicode_DecodeFSDefaultAndSize(const char* s, Py_ssize_t size)
    object PyUnicode_FromStringAndSize(const char* s, Py_ssize_t size)

cdef extern from *:
    """
    #include <errno.h>
    static inline void l5_errno_reset(void) { errno = 0; }
    """
    void l5_errno_reset() nogil

cdef extern from "<dirent.h>" nogil:
    ctypedef struct DIR:
        pass
    struct dirent:
        unsigned long d_ino
        unsigned char d_type
        char d_name[256]
    DIR* fdopendir(int fd)
    dirent* readdir(DIR* d)
    int closedir(DIR* d)
    int DT_REG, DT_LNK, DT_UNKNOWN

cdef extern from "<fcntl.h>" nogil:
    int open(const char* path, int flags)
    int O_RDONLY, O_DIRECTORY, O_CLOEXEC

cdef extern from "<unistd.h>" nogil:
    int close(int fd)
    int dup(int fd)

cdef extern from "<sys/stat.h>" nogil:
    struct timespec:
        long tv_sec
        long tv_nsec
    struct stat:
        long st_size
        unsigned long st_ino
        unsigned int st_mode
        timespec st_mtim
        timespec st_ctim
    int fstatat(int dirfd, const char* path, stat* buf, int flags)
    bint S_ISREG(unsigned int mode)

cdef extern from "<pthread.h>" nogil:
    ctypedef unsigned long pthread_t
    int pthread_create(pthread_t* thread, void* attr, void* (*start)(void*) noexcept nogil, void* arg)
    int pthread_join(pthread_t thread, void** ret)


cdef struct Entry:
    size_t name       # offset of its name in the names' buffer
    size_t length     # the name's length
    uint64_t ino      # the listing's inode number (the order of the stats)
    unsigned char kind
    int err           # the stat's errno (0: stat below is the file's)
    bint regular
    int64_t size
    int64_t mtime_sec, mtime_nsec, ctime_sec, ctime_nsec
    uint64_t st_ino


cdef struct Slice:
    int fd
    char* names
    Entry* entries
    size_t* order
    size_t lo, hi


cdef int _by_inode(const void* a, const void* b) noexcept nogil:
    cdef const uint64_t* x = <const uint64_t*>a
    cdef const uint64_t* y = <const uint64_t*>b
    if x[0] != y[0]:
        return -1 if x[0] < y[0] else 1
    return -1 if x[1] < y[1] else (1 if x[1] > y[1] else 0)


cdef void* _stat_slice(void* arg) noexcept nogil:
    cdef Slice* s = <Slice*>arg
    cdef size_t k
    cdef Entry* e
    cdef stat st
    for k in range(s.lo, s.hi):
        e = &s.entries[s.order[k]]
        if fstatat(s.fd, s.names + e.name, &st, 0) != 0:
            e.err = errno
            continue
        e.err = 0
        e.regular = S_ISREG(st.st_mode)
        e.size = st.st_size
        e.st_ino = st.st_ino
        e.mtime_sec, e.mtime_nsec = st.st_mtim.tv_sec, st.st_mtim.tv_nsec
        e.ctime_sec, e.ctime_nsec = st.st_ctim.tv_sec, st.st_ctim.tv_nsec
    return NULL


#: Seconds whose nanoseconds fit an int64 with room (else the identity is made with Python's ints).
cdef int64_t SAFE_SEC = 9_000_000_000


def identities(path, int threads=1):
    """``{name: "stat:size:mtime_ns:ctime_ns:inode"}`` of each file in folder ``path`` (a regular file,
    or a link to one: what ``os.scandir``'s ``is_file()`` and ``stat()`` say, links followed), as
    the Python listing made it. The folder's errors are ``os.scandir``'s (``FileNotFoundError``,
    ``NotADirectoryError``, ``PermissionError``... naming ``path``); a file that cannot be stat-ed
    raises as ``DirEntry.stat()`` would, unless it is a link (or of unknown kind) that leads
    nowhere (left out, as ``is_file()`` leaves it). ``threads``: OS threads, each stat-ing a run of
    the files in inode order."""
    cdef bytes raw = os.fsencode(path)
    cdef const char* cpath = raw
    cdef int fd, dfd
    cdef DIR* d
    cdef dirent* de
    cdef char* names = NULL
    cdef char* grown
    cdef Entry* entries = NULL
    cdef Entry* more
    cdef size_t* order = NULL
    cdef uint64_t* keys = NULL
    cdef Slice* slices = NULL
    cdef pthread_t* ids = NULL
    cdef size_t n = 0, cap = 0, used = 0, room = 0, length, k, m = 0, t
    cdef int err = 0
    cdef int nthreads
    cdef Entry* e
    cdef char buf[128]
    cdef int wrote
    out = {}
    with nogil:
        fd = open(cpath, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if fd < 0:
            err = errno
    if fd < 0:
        raise OSError(err, os.strerror(err), path)
    try:
        with nogil:
            dfd = dup(fd)
            d = fdopendir(dfd) if dfd >= 0 else NULL
            if d == NULL:
                err = errno
                if dfd >= 0:
                    close(dfd)
            else:
                while True:
                    l5_errno_reset()
                    de = readdir(d)
                    if de == NULL:
                        err = errno
                        break
                    length = strlen(de.d_name)
                    if (length == 1 and de.d_name[0] == b".") or (
                        length == 2 and de.d_name[0] == b"." and de.d_name[1] == b"."
                    ):
                        continue
                    if de.d_type != DT_REG and de.d_type != DT_LNK and de.d_type != DT_UNKNOWN:
                        continue  # (a folder, a device...: no file, never stat-ed, as is_file())
                    if n == cap:
                        cap = 1024 if cap == 0 else cap * 2
                        more = <Entry*>realloc(entries, cap * sizeof(Entry))
                        if more == NULL:
                            err = -1
                            break
                        entries = more
                    if used + length + 1 > room:
                        room = 65536 if room == 0 else room * 2
                        while used + length + 1 > room:
                            room *= 2
                        grown = <char*>realloc(names, room)
                        if grown == NULL:
                            err = -1
                            break
                        names = grown
                    memcpy(names + used, de.d_name, length + 1)
                    e = &entries[n]
                    e.name, e.length, e.ino, e.kind, e.err, e.regular = used, length, de.d_ino, de.d_type, 0, False
                    used += length + 1
                    n += 1
                closedir(d)
        if err == -1:
            raise MemoryError()
        if err:
            raise OSError(err, os.strerror(err), path)
        if n == 0:
            return out
        # the stats in the order of the inode numbers (ties: the listing's order)
        keys = <uint64_t*>malloc(2 * n * sizeof(uint64_t))
        order = <size_t*>malloc(n * sizeof(size_t))
        nthreads = max(1, min(threads, 64, <int>((n + 255) // 256)))
        slices = <Slice*>malloc(nthreads * sizeof(Slice))
        ids = <pthread_t*>malloc(nthreads * sizeof(pthread_t))
        if keys == NULL or order == NULL or slices == NULL or ids == NULL:
            raise MemoryError()
        with nogil:
            for k in range(n):
                keys[2 * k], keys[2 * k + 1] = entries[k].ino, k
            qsort(keys, n, 2 * sizeof(uint64_t), _by_inode)
            for k in range(n):
                order[k] = keys[2 * k + 1]
            for t in range(<size_t>nthreads):
                slices[t].fd, slices[t].names, slices[t].entries, slices[t].order = fd, names, entries, order
                slices[t].lo, slices[t].hi = n * t // nthreads, n * (t + 1) // nthreads
            for t in range(1, <size_t>nthreads):
                if pthread_create(&ids[t], NULL, _stat_slice, &slices[t]) != 0:
                    ids[t] = 0
                    _stat_slice(&slices[t])  # (no thread: this one does it)
            _stat_slice(&slices[0])
            for t in range(1, <size_t>nthreads):
                if ids[t] != 0:
                    pthread_join(ids[t], NULL)
        for k in range(n):
            e = &entries[k]
            if e.err:
                if e.kind != DT_REG and e.err == ENOENT:
                    continue  # (a link to nothing: not a file, as is_file() says)
                failed = os.fsdecode(names[e.name : e.name + e.length])
                raise OSError(e.err, os.strerror(e.err), os.path.join(path, failed))
            if not e.regular:
                continue
            name = PyUnicode_DecodeFSDefaultAndSize(names + e.name, e.length)
            if -SAFE_SEC < e.mtime_sec < SAFE_SEC and -SAFE_SEC < e.ctime_sec < SAFE_SEC:
                wrote = snprintf(
                    buf, sizeof(buf), "stat:%lld:%lld:%lld:%llu", <long long>e.size,
                    <long long>(e.mtime_sec * 1_000_000_000 + e.mtime_nsec),
                    <long long>(e.ctime_sec * 1_000_000_000 + e.ctime_nsec), <unsigned long long>e.st_ino,
                )
                out[name] = PyUnicode_FromStringAndSize(buf, wrote)
            else:  # (times past the year 2255: Python's ints, as os.stat's st_mtime_ns)
                mtime = int(e.mtime_sec) * 1_000_000_000 + int(e.mtime_nsec)
                ctime = int(e.ctime_sec) * 1_000_000_000 + int(e.ctime_nsec)
                out[name] = f"stat:{e.size}:{mtime}:{ctime}:{e.st_ino}"
        return out
    finally:
        close(fd)
        free(names)
        free(entries)
        free(keys)
        free(order)
        free(slices)
        free(ids)
