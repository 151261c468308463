"""Reads of files on a local disk: what is in the page cache read through it, what is not read
around it (``O_DIRECT``, into a buffer that is reused), by a few threads that read ahead.

What this beats, and by how much (this 2-core machine with a virtio disk, 8.47 GB of agent chunks
read cold by 8 threads; see docs/scale.md): buffered reads took 11.8 s and 9.0 s of system time;
``O_DIRECT`` reads into buffers that are reused took 9.2 s and 1.2 s of system time. A cold
buffered read costs the kernel the page cache's pages, not the copy: each is a fresh page to
allocate, fill and later reclaim. Read with ``O_DIRECT`` into a fresh buffer each time, the same
files cost as much (9.7 s of system time), so the buffer a thread reads into is kept.

- ``read()``: the bytes of a range of a file. With ``direct``, whether they are all in the page
  cache is asked of the kernel first (``cachestat``, or ``mincore`` of a mapping of the range;
  nothing is read or cached by asking). If they are, the read goes through the cache as any read;
  if not, with ``O_DIRECT``, and the page cache is left as it was. A filesystem that refuses
  ``O_DIRECT`` (some network filesystems) is read through the cache.
- ``submit()``: the same read in a small pool of threads (``l5dask.direct-read-threads``, 4),
  for a reader that keeps several in flight (``Store.iter_ranges``); ``hint()`` starts one for
  a reader that comes soon (``Store.will_need``: the next tasks' chunks), in a pool of half as
  many threads of its own.
- ``wanted()``: whether a dataset is read this way. ``l5dask.direct-reads`` (dask config):
  ``auto`` (the default) for a dataset larger than this machine's memory, whose pass evicts its
  own bytes before they could be read again from the cache; ``true`` for every dataset; ``false``
  for none.

Every read returns the same bytes as the slice of the whole file (``tests/core/test_diskread.py``
compares them on ranges drawn at random, cold and in the page cache).

Measured by ``python benchmarks/direct_reads.py --copies 10 --threads 8`` (as root: it drops the
page cache) and, for whole commands, ``python benchmarks/scale_benchmark.py run --sizes 34
--direct-floor``: ``l5dask stats`` on 1.02 G agents cold took 46.4-47.7 s reading this way against
60.1-70.4 s reading through the page cache (docs/scale.md). When to delete it: when a plain
buffered read of a dataset larger than memory is within 10% of it there (kernels whose page cache
costs less per page), or when no user reads a local dataset larger than memory.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from l5dask.core import config
from l5dask.core.lazy import compiled

#: The compiled reads (``None``: the same reads made of Python's calls, as where the kernel cannot
#: say what is in the page cache; ``...``: not imported yet, see :func:`_pread`).
_PREAD: Any = ...


def _pread() -> Any:
    """The compiled reads, imported on first use (not with this module: a broken install's commands
    still start and say in one line which compiled module is missing)."""
    global _PREAD
    if _PREAD is ...:
        _PREAD = compiled("l5dask.core._pread")
    return _PREAD


#: ``O_DIRECT`` wants the file offset, the length and the buffer aligned to the device's logical
#: block (512 bytes or 4 KB): 4 KB suits both.
ALIGN = 4096
PAGE = mmap.PAGESIZE
_LOW_BIT = bytes(b & 1 for b in range(256))
T = TypeVar("T")


def wanted(large: bool) -> bool:
    """Whether reads of a dataset go around the page cache when they miss it: by the dask config's
    ``l5dask.direct-reads`` (``true``, ``false``, or ``auto``, the default: ``large``, a dataset
    larger than this machine's memory, ``memory_bytes()``)."""
    if not getattr(os, "O_DIRECT", 0):
        return False
    setting = config.get("direct-reads")
    text = str(setting).strip().lower()
    if text == "auto":
        return large
    return text not in ("false", "0", "no", "off", "none", "")


def memory_bytes() -> int:
    """This machine's memory: a pass over more stored bytes than this cannot find them in the
    page cache the next time (its own reads evicted them), so reading them into it only costs."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def span(start: int | None, end: int | None, size: int) -> tuple[int, int]:
    """The byte range ``[a, b)`` of a file of ``size`` bytes that the slice ``data[start:end]`` of
    its bytes ``data`` is (``None``: its start, its end; negative: counted from the end)."""
    a = 0 if start is None else (min(start, size) if start >= 0 else max(0, size + start))
    b = size if end is None else (min(end, size) if end >= 0 else max(0, size + end))
    return a, max(a, b)


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _CacheStat(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("cache", "dirty", "writeback", "evicted", "recently_evicted")]


#: ``cachestat(2)`` (Linux 6.5): pages of a range in the page cache, one call (6 us from here,
#: against 18 us for a mapping, ``mincore`` and its unmapping); it is not there before.
_CACHESTAT = {"x86_64": 451, "aarch64": 451}.get(os.uname().machine) if hasattr(os, "uname") else None
_libc = None


def _lib():
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
        lib.syscall.restype = ctypes.c_long
        _libc = lib
    return _libc


def resident(fd: int, a: int, b: int) -> bool | None:
    """Whether bytes ``[a, b)`` of the open file ``fd`` are all in the page cache (``None``: the
    kernel cannot say). Asking reads nothing and caches nothing."""
    global _CACHESTAT
    if b <= a:
        return True
    try:
        lib = _lib()
    except (OSError, AttributeError):
        return None
    lo = a - a % PAGE
    n = b - lo
    pages = (n + PAGE - 1) // PAGE
    if _CACHESTAT is not None:
        rng, stat = _Range(lo, n), _CacheStat()
        if lib.syscall(_CACHESTAT, fd, ctypes.byref(rng), ctypes.byref(stat), 0) == 0:
            return bool(stat.cache >= pages)
        if ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):
            _CACHESTAT = None  # (an older kernel, or a sandbox that refuses it: mincore from now on)
    addr = lib.mmap(None, n, mmap.PROT_READ, mmap.MAP_SHARED, fd, lo)
    if addr is None or addr == ctypes.c_void_p(-1).value:
        return None
    try:
        vec = (ctypes.c_ubyte * pages)()
        if lib.mincore(addr, n, vec) != 0:
            return None
        return b"\x00" not in bytes(vec).translate(_LOW_BIT)
    finally:
        lib.munmap(addr, n)


#: Devices that refused ``O_DIRECT``: read through the page cache from then on.
_REFUSED: set[int] = set()
config.on_reset(_REFUSED.clear)
_local = threading.local()


def _buffer(n: int) -> mmap.mmap:
    """This thread's aligned buffer of at least ``n`` bytes (kept: a fresh one costs the kernel as
    much as the page cache does)."""
    buf = getattr(_local, "buffer", None)
    if buf is None or len(buf) < n:
        if buf is not None:
            buf.close()
        buf = _local.buffer = mmap.mmap(-1, max(n + (-n) % ALIGN, 1 << 20))
    return buf


def _read_direct(fd: int, a: int, b: int) -> bytes | None:
    """Bytes ``[a, b)`` of ``fd`` read around the page cache, ``None`` if the file's filesystem
    refuses ``O_DIRECT``."""
    import fcntl

    st_dev = os.fstat(fd).st_dev
    if st_dev in _REFUSED:
        return None
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT)
    except OSError:
        _REFUSED.add(st_dev)
        return None
    lo, hi = a - a % ALIGN, b + (-b) % ALIGN
    buf = _buffer(hi - lo)
    got = 0
    with memoryview(buf) as view:
        try:
            while lo + got < b:
                n = os.preadv(fd, [view[got : hi - lo]], lo + got)
                got += n
                if n == 0 or n % ALIGN:  # the end of the file (a short read is only that)
                    break
        except OSError as exc:
            if exc.errno != errno.EINVAL or got:  # (EINVAL: its O_DIRECT wants other alignments)
                raise
            _REFUSED.add(st_dev)
            fcntl.fcntl(fd, fcntl.F_SETFL, flags)
            return None
        return bytes(view[a - lo : max(a, min(b, lo + got)) - lo])


def _read_cached(fd: int, a: int, b: int) -> bytes:
    parts = []
    while a < b:
        part = os.pread(fd, b - a, a)
        if not part:
            break
        parts.append(part)
        a += len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def read(path: str, start: int | None = None, end: int | None = None, direct: bool = True) -> bytes:
    """Bytes ``[start, end)`` of a local file (``None``: from its start, to its end; a negative
    ``start`` counts from the end; see ``span()``): with ``direct``, read around the page cache
    when they are not all in it."""
    with File(path, direct, random=False) as f:
        return f.read(start, end)


def _read_fd(fd: int, a: int, b: int, direct: bool, dev: int | None = None) -> bytes:
    """Bytes ``[a, b)`` of ``fd``: with ``direct``, around the page cache when they are not all in
    it. Around it, one compiled call (``l5dask.core._pread``: the look in the cache, ``O_DIRECT``
    and the reads, the GIL let go once) where Python's calls let go of it and took it back at each
    step; through the cache, ``os.pread`` (one step already; no copy more)."""
    pread = _pread() if direct else None
    if pread is not None and dev not in _REFUSED:
        buf = _buffer(b - a + 2 * ALIGN)
        status, at, n = pread.read_range(fd, a, b, buf, True, _CACHESTAT or -1, ALIGN, PAGE)
        if status == 0:
            return buf[at : at + n]
        if status == pread.REFUSED:
            _REFUSED.add(os.fstat(fd).st_dev if dev is None else dev)
            return _read_cached(fd, a, b)
        if status != pread.UNKNOWN:
            raise OSError(status, os.strerror(status))
    if direct and resident(fd, a, b) is False:
        data = _read_direct(fd, a, b)
        if data is not None:
            return data
    return _read_cached(fd, a, b)


class File:
    """A local file opened once for several reads of ranges of it (a chunk read in part: its
    header, then its blocks and its last byte): one ``open`` and ``fstat`` for them all, where
    ``read()`` makes them for each. Each :meth:`read` returns what ``read()`` would (around the page
    cache with ``direct`` when the range is not in it). Read through the page cache, the kernel is
    told the reads are random (``POSIX_FADV_RANDOM``, on this open file only): it reads no bytes
    ahead of them, which a chunk read in part does not want. Through one file, a partial read of
    a chunk of 121 M agents' dataset (one to three ranges of blocks) took 47 us of CPU in the page
    cache against 89 us through ``Store.get`` and ``Store.iter_ranges``.

    Opened with ``part`` (a blosc chunk read in part), all of its reads are made as it is opened,
    in one compiled call that opens and closes the file too (:meth:`_read_part`); :meth:`read`
    then returns them, the same bytes, and reads (the file opened again) only what they do not
    hold: where the header wants more (more than 64 blocks) or is damaged, the reader that checks
    it reads on its own and refuses it as before."""

    __slots__ = ("fd", "size", "direct", "dev", "path", "pieces")

    def __init__(self, path: str, direct: bool, random: bool = True, part: tuple[Any, int, int] | None = None) -> None:
        self.direct, self.path = direct, path
        self.pieces: list[tuple[int, bytes]] = []
        if part is not None and random and self._read_part(*part):
            return
        self._open(random)

    def _open(self, random: bool) -> None:
        pread = _pread()
        if pread is not None:  # (open, its size and the hint: one compiled call, the GIL let go once)
            self.fd, self.size, self.dev = pread.open_file(
                os.fsencode(self.path), random and not self.direct and _FADVISE
            )
            if self.fd < 0:
                raise OSError(-self.fd, os.strerror(-self.fd), self.path)
            return
        self.fd = os.open(self.path, os.O_RDONLY)
        try:
            st = os.fstat(self.fd)
            self.size, self.dev = st.st_size, st.st_dev
            if random and not self.direct and _FADVISE:
                os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)
        except BaseException:
            os.close(self.fd)
            raise

    def _read_part(self, cuts: Any, nbytes: int, head: int) -> bool:
        """A blosc chunk read in part (``part``: the decoded bytes wanted, pairs ``[lo, hi)`` in an
        int64 array, its decoded size and how much of its header to read): its header, the ranges
        of blocks that it says hold them and its last byte read in one compiled call that opens and
        closes the file too (``l5dask.core._pread.read_part``, the GIL let go once, where each read,
        the ``open`` and the ``close`` let go of it and took it back), kept for :meth:`read`. Whether
        it was (not: where the kernel cannot say what is in the page cache, or a device refused
        ``O_DIRECT``; the file is then opened as any)."""
        pread = _pread()
        if pread is None or _REFUSED or (self.direct and not _CACHESTAT):
            return False
        buf = _buffer(nbytes + head + (len(cuts) // 2 + 70) * 3 * ALIGN)
        status, size, dev, pieces = pread.read_part(
            os.fsencode(self.path), self.direct, _CACHESTAT or -1, ALIGN, PAGE, buf, head, nbytes, cuts
        )
        if size < 0:
            raise OSError(status, os.strerror(status), self.path)
        if status in (pread.OK, pread.SMALL):
            self.fd, self.size, self.dev, self.pieces = _REOPEN, size, dev, pieces
            return True
        if status == pread.REFUSED:
            _REFUSED.add(dev)
        elif status != pread.UNKNOWN:
            raise OSError(status, os.strerror(status))
        return False

    def read(self, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of the file (as ``read()``: ``None``, negative ``start``): from a
        chunk's reads made at once (``part``) when one holds them, else read now."""
        a, b = span(start, end, self.size)
        for at, data in self.pieces:
            if at <= a and b <= at + len(data):
                return data if a == at and b - a == len(data) else data[a - at : b - at]
        if self.fd == _REOPEN:  # (closed after the reads made at once: opened again for this one)
            self._open(True)
        return _read_fd(self.fd, a, b, self.direct, self.dev)

    def close(self) -> None:
        self.pieces = []
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = -1

    def __enter__(self) -> File:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: ``File.fd`` of a file closed after a chunk's reads made at once (``part``): opened again by a read
#: that they do not hold.
_REOPEN = -2
_FADVISE = hasattr(os, "posix_fadvise") and hasattr(os, "POSIX_FADV_RANDOM")


def submit(path: str, start: int | None = None, end: int | None = None) -> Future:
    """Start ``read()`` of ``[start, end)`` of a local file (around the page cache if it is not
    in it) in the pool of threads that read ahead; its future. A read ``hint()`` started for
    this range is taken instead (once)."""
    key = (path, start, end)
    with _LOCK:
        fut = _HINTED.pop(key, None)
        _ASKED[key] = None
        if len(_ASKED) > REMEMBERED:
            for old in list(_ASKED)[: REMEMBERED // 2]:
                del _ASKED[old]
    return fut if fut is not None else _pool().submit(read, path, start, end, True)


def hint(path: str, start: int | None = None, end: int | None = None) -> bool:
    """Start reading ``[start, end)`` of a local file now, for a reader that asks for it soon
    (``submit()``): the next task's first chunks, while this task decodes its own. At most
    ``HINTED`` such reads wait for their reader; past that the oldest is let go (its reader ran
    in another process, or failed). A range a reader asked for lately, or hinted already, starts
    nothing (``False``)."""
    key = (path, start, end)
    with _LOCK:
        if key in _HINTED or key in _ASKED:
            return False
        while len(_HINTED) >= HINTED:
            _HINTED.pop(next(iter(_HINTED))).cancel()
        _HINTED[key] = _pool("hints").submit(read, path, start, end, True)
    return True


def call(fn: Callable[..., T], *args: Any) -> Future[T]:
    """Run ``fn(*args)``, a reader's several reads of a local file one after the other (a chunk
    read in part: its header, then its blocks' ranges), in the threads that run such readers
    (``l5dask.direct-read-threads`` of them, a pool of their own: ``fn`` may ``submit()`` reads
    and wait for them). Started for the next few readers at once (``Store.read_ahead``), their
    reads are in flight together, where a task made them one at a time."""
    return _pool("calls").submit(fn, *args)


def hinted() -> int:
    """Reads started by ``hint()`` that no reader took yet, in this process."""
    return len(_HINTED)


#: Reads started by hint() that wait for their reader, at most; ranges that readers asked for, as
#: many as are remembered (a hint that comes after its reader starts nothing).
HINTED = 16
REMEMBERED = 4096
_HINTED: dict[tuple, Future] = {}
_ASKED: dict[tuple, None] = {}
_LOCK = threading.Lock()
_POOLS: dict[str, ThreadPoolExecutor] = {}


def _pool(kind: str = "reads") -> ThreadPoolExecutor:
    """The threads that read for readers (``"reads"``), those that read what hints name
    (``"hints"``: their own, a reader's reads never wait behind hinted ones), or those that run
    readers of several ranges (``"calls"``: their own, so that one that waits for a read of the
    others never holds the thread that would make it)."""
    pool = _POOLS.get(kind)
    if pool is None:
        threads = int(config.get("direct-read-threads"))
        threads = max(1, threads // 2) if kind == "hints" else threads
        pool = _POOLS.setdefault(kind, ThreadPoolExecutor(threads, thread_name_prefix=f"l5dask-{kind}"))
    return pool


def _forget() -> None:
    global _LOCK
    _LOCK = threading.Lock()  # (a forked child: the pools' threads are not there)
    _POOLS.clear()
    _HINTED.clear()
    _ASKED.clear()


@config.on_reset
def _forget_hints() -> None:
    with _LOCK:
        _HINTED.clear()
        _ASKED.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)
