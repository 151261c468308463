"""Where a dataset lives: local folders, zips, S3 and any fsspec URL.

A :class:`Store` is a small picklable handle (filesystem + root path) that dask tasks
carry to the workers, so that workers read chunks straight from the store.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import errno
import logging
import os
import posixpath
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ContextManager, TypeVar

from l5dask.core import config, diskread, objects, prefetch
from l5dask.core.lazy import compiled
from l5dask.errors import ChunkError, L5DaskError, NotADatasetError, StoreError, UsageError

T = TypeVar("T")
R = TypeVar("R")
#: Errors of a store that may pass (throttling, 5xx, dropped connections): retried this many times;
#: reads that time out, fewer (each waited ``l5dask.read-timeout`` already).
_RETRIES = 8
_TIMEOUT_RETRIES = 2
#: ... and an endpoint that refuses the connection (nothing listens there, or no such host), this
#: many: it is most often a wrong endpoint, and 8 retries made 21 s of silence before the error.
_REFUSED_RETRIES = 2
#: OS threads that stat a local folder's files for the cache's keys (``Store.identities``), each a
#: run of them in inode order: read cold, the inodes' reads overlap (a scratch ext4 remounted cold,
#: 71,142 files: best wall 0.35 s with 4 threads, 0.63 s with one; the same CPU seconds).
STAT_THREADS = prefetch.STAT_THREADS
#: Each retried read is said here as it happens (a warning: on stderr; ``-q`` silences it).
log = logging.getLogger("l5dask.store")
#: Connections per process to S3 (botocore's pool; its default is 10), and requests a task keeps in
#: flight while it decodes what came (``l5dask.requests-in-flight``, l5dask.core.config).
S3_CONNECTIONS = 64
#: Reads in flight per reader of a local disk read around the page cache (l5dask.core.diskread).
LOCAL_READS_IN_FLIGHT = 8
#: ... of which a hint (``will_need``: the next task's chunks) starts this many ahead of their reader.
HINTED_READS = 4
#: Readers of several ranges of a local object each (a chunk read in part: its header, then its
#: blocks) that a task keeps in flight (:meth:`Store.read_ahead`).
READERS_IN_FLIGHT = 8
#: Set when the caller is interrupted (Ctrl-C): reads from object stores in flight stop at once
#: (``cancel_reads``), so that the tasks end and the caller cleans up without waiting a timeout.
CANCELLED = threading.Event()


def cancel_reads() -> None:
    CANCELLED.set()


#: What a reader does while it waits for a read of an object store that has not come: ``None``,
#: or a function that returns a context manager to wait in (see :func:`while_waiting`).
_WAIT_HOOK: contextvars.ContextVar[Callable[[], ContextManager[Any]] | None] = contextvars.ContextVar(
    "l5dask_waiting", default=None
)


@contextlib.contextmanager
def while_waiting(hook: Callable[[], ContextManager[Any]] | None) -> Iterator[None]:
    """Within this block (this thread and context), each wait for a read of an object store whose
    bytes have not come yet happens inside ``hook()``; a read already done is not waited for. The
    engine gives a dask.distributed worker's thread back this way while its task waits
    (``l5dask.core.policy.secede_while_waiting``). ``None``: plain waits."""
    token = _WAIT_HOOK.set(hook)
    try:
        yield
    finally:
        _WAIT_HOOK.reset(token)


def _wait(fut: Any, path: str) -> Any:
    """A read's result, waited for a quarter second at a time: cancelled reads end at once."""
    import concurrent.futures

    while True:
        try:
            return fut.result(timeout=0.25)
        except concurrent.futures.TimeoutError:
            if CANCELLED.is_set():
                fut.cancel()
                raise StoreError(f"{path}: the read was cancelled") from None


async def _cat_parts(fs: Any, path: str, start: int | None, end: int | None) -> bytes:
    """Bytes ``[start, end)`` of an object of an asynchronous filesystem: a range longer than
    ``l5dask.part-bytes`` as its parts, fetched at once and joined."""
    import asyncio

    part = int(config.get("part-bytes"))
    if start is None or end is None or start < 0 or end - start <= part + part // 2:
        return await objects.cat(fs, path, start, end)
    cuts = list(range(start, end, part)) + [end]
    if cuts[-1] - cuts[-2] < part // 2:  # (no short last part)
        del cuts[-2]
    parts = await asyncio.gather(*(objects.cat(fs, path, a, b) for a, b in zip(cuts[:-1], cuts[1:])))
    return b"".join(parts)


#: Reads inside an archive go one at a time: fsspec's tar filesystem seeks and reads one shared file
#: object without a lock (threads reading at once got each other's bytes: found by a test).
_ARCHIVE_READS = threading.Lock()

#: What this process read through stores: objects (or ranges of them) and bytes, the metadata's
#: (:meth:`Store.get_metadata`) apart, and the objects and bytes by the first part of their key
#: (a dataset's array). A run record sums it over the processes that read.
_READS: dict[str, Any] = {"objects": 0, "bytes": 0, "metadata_objects": 0, "metadata_bytes": 0, "by_folder": {}}
_READS_LOCK = threading.Lock()


def _counted(data: Any, key: str, metadata: bool = False) -> Any:
    n = len(data) if data is not None else 0
    with _READS_LOCK:
        _READS["metadata_objects" if metadata else "objects"] += 1
        _READS["metadata_bytes" if metadata else "bytes"] += n
        if not metadata:
            folder = _READS["by_folder"].setdefault(key.split("/", 1)[0] if "/" in key else "", [0, 0])
            folder[0] += 1
            folder[1] += n
    return data


def read_counts() -> dict[str, Any]:
    """What this process has read through stores so far: ``objects`` and ``bytes`` (chunks, tables,
    files), ``metadata_objects`` and ``metadata_bytes`` (metadata objects), and ``by_folder``: the
    objects and bytes (not metadata) by the first folder of their key (``{"agents": [3, 8046]}``)."""
    with _READS_LOCK:
        return {**_READS, "by_folder": {k: list(v) for k, v in _READS["by_folder"].items()}}


#: errno values of store errors that may pass: s3fs maps 503 ServiceUnavailable and SlowDown to
#: EBUSY and 500 InternalError to EREMOTEIO (their messages need not say the status code).
_TRANSIENT_ERRNOS = {
    errno.EBUSY,
    errno.EAGAIN,
    errno.ETIMEDOUT,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    getattr(errno, "EREMOTEIO", 121),
}


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return True
    name = type(exc).__name__
    text = str(exc)
    return name in {
        "ServerDisconnectedError",
        "ClientOSError",
        "ClientPayloadError",
        "ReadTimeoutError",
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ResponseStreamingError",
    } or any(code in text for code in ("500", "502", "503", "504", "SlowDown", "InternalError", " - HTTP error: "))


def _is_refused(exc: BaseException) -> bool:
    """Whether the endpoint refused the connection or could not be reached at all (botocore's
    ``EndpointConnectionError``, aiohttp's connector errors, a ``ConnectionRefusedError``), by the
    error or what it was raised from."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, ConnectionRefusedError) or (isinstance(exc, OSError) and exc.errno == errno.ECONNREFUSED):
            return True
        name, text = type(exc).__name__, str(exc)
        if name in {"EndpointConnectionError", "ClientConnectorError"} or "Connection refused" in text:
            return True
        if " - HTTP error: " in text and "kind: Connect," in text:  # (obstore's: no connection made)
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1  # type: ignore[assignment]
    return False


def _is_timeout(exc: BaseException) -> bool:
    return (
        isinstance(exc, TimeoutError)
        or type(exc).__name__ in {"ReadTimeoutError", "ConnectTimeoutError"}
        or "kind: Timeout," in str(exc)  # (obstore's: reqwest's read timeout)
    )


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return re.sub(r" in [0-9.]+(?:ns|µs|ms|s) - ", " - ", text)[:300]  # (obstore's: without its timing)


#: What an S3 client says when it found no credentials and asked the instance metadata service
#: (IMDS, on a machine outside EC2: refused, or no answer) for them.
_NO_CREDENTIALS = re.compile(r"169\.254\.169\.254|instance metadata|NoCredentialsError|Unable to locate credentials")


def _denied(url: str, exc: BaseException, key: str | None = None) -> StoreError:
    """The one line of an access refused: "access denied", or, where the client found no
    credentials at all (it then asks the instance metadata service, whose refusal it reports as
    the access denied), what to give instead."""
    reading = f" reading {key!r}" if key is not None else ""
    if _NO_CREDENTIALS.search(str(exc)) or type(exc).__name__ == "NoCredentialsError":
        return StoreError(
            f"{url}: no credentials found{reading}: give them in the storage options (-s key=... -s secret=...), "
            "as AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile; anon=true for a public bucket"
        )
    return StoreError(f"{url}: access denied{reading} ({_describe(exc)})")


class Store:
    """A dataset root on some filesystem.

    Parameters
    ----------
    url : str
        Local path, ``file://``, ``s3://`` or any fsspec URL; a path ending in ``.zip``
        is opened as a zip of the dataset folder.
    storage_options : dict, optional
        Passed to the fsspec filesystem (for S3: ``key``, ``secret``,
        ``client_kwargs={"endpoint_url": ...}``, ``anon``...). For a zip, they go to
        the filesystem that holds the zip.
    """

    #: A dataset larger than this machine's memory (set by its opener): on a local disk, what
    #: is not in the page cache is read around it (:mod:`l5dask.core.diskread`).
    large = False
    #: The file's own name as given, for a store of one file (``file_store``): its errors name it.
    file: str | None = None

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.url = str(url)
        options = resolved_options(self.url, storage_options)
        kind = archive_kind(self.url)
        folder = None if kind else local_folder(self.url, options)
        if folder is not None:  # (its filesystem is made when asked for: see fs)
            self._fs, self.root = None, folder.rstrip("/")
            return
        from fsspec.core import url_to_fs

        try:
            if kind:
                target_fs, zpath = url_to_fs(self.url, **options)
                if not target_fs.exists(zpath):
                    raise NotADatasetError(f"{self.url}: no such file")
                self._fs = _archive_fs(self.url, kind, zpath, target_fs, options)
                self.root = self._archive_root()
            else:
                self._fs, root = url_to_fs(self.url, **options)
                self.root = root.rstrip("/")
                _own_retries(self._fs)
        except (NotADatasetError, StoreError):
            raise
        except (ValueError, ImportError) as exc:
            raise StoreError(f"{self.url}: cannot open this location: {_describe(exc)}") from exc
        except PermissionError as exc:
            raise _denied(self.url, exc) from exc
        except OSError as exc:
            raise StoreError(f"{self.url}: {_describe(exc)}") from exc

    def _archive_root(self) -> str:
        """An archive holds the dataset at its root, or inside one top-level folder (an L5Kit
        dataset has ``.zgroup``, a perception dataset ``data/scene.json``)."""
        markers = (".zgroup", "data/scene.json")
        if any(self.fs.exists(m) for m in markers):
            return ""
        tops = [p for p in self.fs.ls("", detail=False)]
        for top in tops:
            top = top.rstrip("/")
            if any(self.fs.exists(posixpath.join(top, m)) for m in markers):
                return top
        return ""

    @property
    def fs(self) -> Any:
        """The store's fsspec filesystem. A plain local folder's is made when first asked for:
        its reads, sizes and lookups go through ``os`` and :mod:`l5dask.core.diskread`, and
        importing fsspec took 10 ms of every command on one (the report on 30 M agents takes 0.7 s)."""
        if self._fs is None:
            from fsspec.implementations.local import LocalFileSystem

            self._fs = LocalFileSystem()
        return self._fs

    @property
    def local(self) -> bool:
        """Whether keys are plain files on this machine's filesystem."""
        return self._fs is None or _protocol(self._fs) == "file"

    @property
    def location(self) -> str:
        """Where the store is, one spelling for one place (the cache's keys and folders): a local
        folder's absolute path, a local archive's absolute path, else the URL as given.
        (``d.zarr``, ``./d.zarr/`` and ``/abs/d.zarr`` are one dataset to the cache.)"""
        if self._fs is None:
            return self.root
        folder = local_folder(self.url, {})
        return folder.rstrip("/") if folder is not None else self.url

    @property
    def remote(self) -> bool:
        """Whether every read is a request to a server (an object store, HTTP)."""
        return self._fs is not None and bool(getattr(self._fs, "async_impl", False))

    def path(self, key: str) -> str:
        return posixpath.join(self.root, key) if self.root else key

    def get(
        self,
        key: str,
        *,
        what: str | None = None,
        start: int | None = None,
        end: int | None = None,
        tried: int = 0,
        failed: BaseException | None = None,
        metadata: bool = False,
    ) -> bytes:
        """Read one object (or its bytes ``[start, end)``; a negative ``start`` counts from the
        end), retrying transient store errors; map failures to clear errors. ``tried``: attempts
        already made elsewhere (a batch fetch whose error was ``failed``): they count."""
        path = self.path(key)

        def read() -> bytes:
            if self.local:  # (fsspec's local opener costs 70 us a call)
                return diskread.read(path, start, end, diskread.wanted(self.large))
            if _protocol(self.fs) in ("tar", "zip"):
                with _ARCHIVE_READS:
                    return self.fs.cat_file(path, start=start, end=end)
            if self.remote and getattr(self.fs, "loop", None) is not None:
                import asyncio

                coro = _cat_parts(self.fs, path, start, end)
                return _wait(asyncio.run_coroutine_threadsafe(coro, self.fs.loop), path)
            return self.fs.cat_file(path, start=start, end=end)

        return _counted(self._retrying(read, key, what, tried, failed), key, metadata)

    def _retrying(
        self, op: Any, key: str, what: str | None = None, tried: int = 0, failed: BaseException | None = None
    ) -> Any:
        """``op()``, its transient store errors retried with backoff (``tried`` attempts already
        made elsewhere count), the others mapped to one-line errors naming the object.

        A store that sheds load (503, SlowDown, a dropped connection) is retried up to
        ``_RETRIES`` times, waiting 0.2 s, then twice as long each time up to 5 s; a read that
        timed out (no byte within ``l5dask.read-timeout``) up to ``_TIMEOUT_RETRIES`` times; an
        endpoint that refuses the connection up to ``_REFUSED_RETRIES`` times. Each retry is said
        as it happens (a warning of the ``l5dask.store`` logger: on stderr unless ``-q``)."""
        delay = 0.2
        attempt = tried
        timeouts = int(failed is not None and _is_timeout(failed))

        def give_up(exc: BaseException) -> StoreError | None:
            refused = _is_refused(exc)
            if (
                (refused or _is_transient(exc))
                and attempt <= (_REFUSED_RETRIES if refused else _RETRIES)
                and timeouts <= _TIMEOUT_RETRIES
            ):
                return None
            why = "no byte within the read timeout" if _is_timeout(exc) else _describe(exc)
            return StoreError(f"{self._named(key)}failed after {attempt} attempt(s): {why}")

        def retry(exc: BaseException) -> None:
            why = "no byte within the read timeout" if _is_timeout(exc) else _describe(exc)
            log.warning(
                "l5dask: %s: reading %r failed (%s); attempt %d in %.1f s", self.url, key, why, attempt + 1, delay
            )

        if failed is not None:
            if (err := give_up(failed)) is not None:
                raise err from failed  # (the attempts made elsewhere used up the retries)
            retry(failed)
        while True:
            if attempt:
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
            attempt += 1
            try:
                return op()
            except (FileNotFoundError, PermissionError, IsADirectoryError) as exc:
                raise self.read_error(key, what, exc) from exc
            except Exception as exc:  # noqa: BLE001 - store libraries raise many kinds
                timeouts += _is_timeout(exc)
                if (err := give_up(exc)) is not None:
                    raise err from exc
                retry(exc)

    def get_into(self, key: str, buffer: memoryview, *, what: str | None = None) -> int:
        """Read one object into ``buffer`` (at most its length; the bytes read are returned): on a
        local disk straight into it, one copy fewer than :meth:`get`; elsewhere through it."""
        if not self.local:
            data = self.get(key, what=what)
            n = min(len(data), len(buffer))
            buffer[:n] = data[:n]
            return n
        try:
            with open(self.path(key), "rb", buffering=0) as f:
                n = 0
                while n < len(buffer):
                    got = f.readinto(buffer[n:])
                    if not got:
                        break
                    n += got
                _counted(memoryview(buffer)[:n], key)
                return n
        except OSError as exc:
            raise self.read_error(key, what, exc) from exc

    def read_error(self, key: str, what: str | None, exc: OSError) -> L5DaskError:
        """The one-line error of a failed read of object ``key``: missing (a
        :class:`~l5dask.errors.ChunkError`), access denied, or failed (a :class:`~l5dask.errors.StoreError`)."""
        if self.file is not None and key == self.file.rstrip("/").rpartition("/")[2]:
            if isinstance(exc, FileNotFoundError):
                return ChunkError(f"{self.file}: no such file")
            if isinstance(exc, IsADirectoryError):
                return StoreError(f"{self.file}: a folder, not a file")
        if isinstance(exc, FileNotFoundError):
            return ChunkError(f"{self.url}: {what or key}: object {key!r} is missing")
        if isinstance(exc, PermissionError):
            return _denied(self.url, exc, key)
        return StoreError(f"{self._named(key)}failed: {_describe(exc)}")

    def _named(self, key: str) -> str:
        """The start of a failed read's message: the store and the object, or a file store's file."""
        if self.file is not None and key == self.file.rstrip("/").rpartition("/")[2]:
            return f"{self.file}: reading "
        return f"{self.url}: reading {key!r} "

    def open_file(self, key: str, *, what: str | None = None, part: tuple[Any, int, int] | None = None) -> LocalFile:
        """On a local disk, object ``key`` opened once for several ranged reads (a chunk read in
        part: ``l5dask.prediction.reading.read_chunk_part``), each as :meth:`get` of the range
        reads it (around the page cache for a large dataset, counted), with no hint to the kernel
        to read ahead (``l5dask.core.diskread.File``); errors as :meth:`get`'s. Close it
        (it is a context manager). Only for a :attr:`local` store. ``part``: the object is a blosc
        chunk read in part (its decoded bytes wanted, its decoded size, how much of its header to
        read: ``l5dask.core.diskread.File``), its reads made at once as it is opened."""
        if not self.local:
            raise ValueError("Store.open_file: only for a store on a local disk")
        try:
            return LocalFile(self, key, what, diskread.File(self.path(key), diskread.wanted(self.large), part=part))
        except OSError as exc:
            raise self.read_error(key, what, exc) from exc

    def will_need(self, keys: list[str], ranges: list[tuple[int | None, int | None]] | None = None) -> bool:
        """A hint that these objects (or these ``(start, end)`` ranges of them) are read next: on a
        local disk, what is not in the page cache is read ahead around it (:mod:`l5dask.core.diskread`),
        or the kernel starts reading it in the background (``posix_fadvise``); elsewhere nothing.
        Whether anything was started.

        Through the page cache, the first range is looked up first (``diskread.resident``, which
        reads nothing): when it is in the cache, the others are taken to be too (the next chunks of
        one array) and nothing is asked. A hint to the kernel for each cached chunk cost more than
        an open and a look: 0.19 CPU-s of the report's 1.70 on 30 M agents in memory, ~4 a chunk."""
        if not self.local:
            return False
        if diskread.wanted(self.large):  # (no hint to the kernel: it would read into the page cache)
            started = 0  # (the first keys not asked for yet: the tasks just after this one may be running)
            for i, key in enumerate(keys):
                if started == HINTED_READS:
                    break
                started += diskread.hint(self.path(key), *(ranges[i] if ranges is not None else (None, None)))
            return started > 0
        if not hasattr(os, "posix_fadvise"):
            return False
        hinted = False
        for i, key in enumerate(keys):
            start, end = ranges[i] if ranges is not None else (None, None)
            if (start is not None and start < 0) or (end is not None and end < 0):
                continue
            try:
                fd = os.open(self.path(key), os.O_RDONLY)
            except OSError:
                continue  # a missing file is said when it is read
            try:
                a = start or 0
                if not hinted:
                    lo, hi = diskread.span(start, end, os.fstat(fd).st_size)
                    if hi > lo and diskread.resident(fd, lo, hi):
                        return False
                os.posix_fadvise(fd, a, 0 if end is None else max(0, end - a), os.POSIX_FADV_WILLNEED)
                hinted = True
            finally:
                os.close(fd)
        return hinted

    def get_many(self, keys: list[str], what: dict[str, str] | None = None) -> list[bytes]:
        """Read several objects at once (concurrently on object stores: :meth:`iter_many`, all
        asked for at once); failures retried one by one.

        On a local disk one by one (the kernel reads the next ones while the first is read):
        ``fs.cat`` of a list costs ~4 ms of path expansion per call, more than reading.
        """
        what = what or {}
        if self.local and len(keys) > 1 and diskread.wanted(self.large):
            return list(self.iter_many(keys, what, depth=len(keys)))
        if len(keys) == 1 or not self.remote or getattr(self.fs, "loop", None) is None:
            self.will_need(keys[1:])
            return [self.get(k, what=what.get(k)) for k in keys]
        return list(self.iter_many(keys, what, depth=len(keys)))

    def iter_many(self, keys: list[str], what: dict[str, str] | None = None, depth: int | None = None):
        """The objects' bytes one by one in the order given, the later ones being fetched while
        the caller works on the earlier (on object stores: ``depth`` requests at a time, by default
        ``l5dask.requests-in-flight``, 32); failures retried one by one, as :meth:`get_many`."""
        return self.iter_ranges([(k, None, None) for k in keys], what, depth)

    def iter_ranges(
        self,
        ranges: Sequence[tuple[str, int | None, int | None]],
        what: dict[str, str] | None = None,
        depth: int | None = None,
    ):
        """As :meth:`iter_many`, for ``(key, start, end)`` ranges of objects (``None``: from the
        start, to the end): the bytes of each, the later ones fetched while the caller works. The
        first ``depth`` are asked for at once, when this is called (so that a caller may start
        several before it waits for any)."""

        what = what or {}
        depth = max(1, int(depth or config.get("requests-in-flight")))
        if len(ranges) and self.local and diskread.wanted(self.large):
            # a local disk, a dataset larger than memory: read around the page cache, by a few
            # threads, ``depth`` (at most ``LOCAL_READS_IN_FLIGHT``) at a time
            depth = min(depth, LOCAL_READS_IN_FLIGHT)

            def read(k: str, start: int | None, end: int | None):
                return diskread.submit(self.path(k), start, end)

            return self._fetched(ranges, what, depth, read, [read(*r) for r in ranges[:depth]])
        if len(ranges) == 0 or not self.remote or getattr(self.fs, "loop", None) is None:
            # a local disk: the kernel reads the next ones in the background (cold, each task
            # waited for each of its reads: the report took 96 s at 1 G agents, 76 s with this)
            keys, spans = [k for k, _, _ in ranges], [(a, b) for _, a, b in ranges]
            cold = self.will_need(keys[1:depth], spans[1:depth])
            return self._read_each(ranges, what, depth if cold else 0, keys, spans)
        import asyncio

        fs = self.fs

        def submit(k: str, start: int | None, end: int | None):
            return asyncio.run_coroutine_threadsafe(_cat_parts(fs, self.path(k), start, end), fs.loop)

        return self._fetched(ranges, what, depth, submit, [submit(*r) for r in ranges[:depth]])

    def read_ahead(self, read: Callable[[T], R], items: Sequence[T], depth: int | None = None) -> Iterator[R]:
        """``read(item)`` of each of ``items`` in turn, where ``read`` reads this store (a chunk read
        in part: its header, then its blocks' ranges, each waiting for the one before): the results
        in order, an error raised where its item comes. On a local disk the first ``depth``
        (``READERS_IN_FLIGHT`` by default) are
        started at once, when this is called, and one more as each is taken, in threads of their
        own (``diskread.call``): their reads are in flight together, where each
        waited for the one before (cold, a task had one read in flight). Elsewhere each is run
        when its turn comes (an object store's reads of one item are asked for at once by it).
        The same reads are made, of the same bytes; a caller that stops early cancels those not
        started."""
        depth = READERS_IN_FLIGHT if depth is None else depth
        if not self.local or depth <= 1 or len(items) <= 1:
            return (read(item) for item in items)
        pending = collections.deque(diskread.call(read, item) for item in items[:depth])
        return self._taken(read, items, depth, pending)

    def _taken(self, read: Callable, items: Sequence, depth: int, pending: collections.deque) -> Iterator:
        try:
            for i in range(len(items)):
                fut = pending.popleft()
                if i + depth < len(items):
                    pending.append(diskread.call(read, items[i + depth]))
                hook = None if fut.done() else _WAIT_HOOK.get()
                if hook is None:
                    yield _wait(fut, self.url)
                else:
                    with hook():
                        got = _wait(fut, self.url)
                    yield got
        finally:
            for fut in pending:  # (a caller that stops early: nothing left running for it)
                fut.cancel()

    def _read_each(self, ranges: Sequence, what: dict, depth: int, keys: list[str], spans: list):
        """Each range read in turn, the one ``depth`` ahead hinted (``depth`` 0: no hints, the
        ranges are in the page cache)."""
        for i, (k, start, end) in enumerate(ranges):
            if depth:
                self.will_need(keys[i + depth : i + depth + 1], spans[i + depth : i + depth + 1])
            yield self.get(k, what=what.get(k), start=start, end=end)

    def _fetched(self, ranges: Sequence, what: dict, depth: int, submit: Callable, pending: list):
        try:
            for i, (k, start, end) in enumerate(ranges):
                if i + depth < len(ranges):
                    pending.append(submit(*ranges[i + depth]))
                fut = pending[i]
                pending[i] = None  # type: ignore[call-overload]
                try:
                    hook = None if fut.done() else _WAIT_HOOK.get()
                    if hook is None:
                        got = _wait(fut, self.path(k))
                    else:
                        with hook():
                            got = _wait(fut, self.path(k))
                except StoreError:
                    raise
                except (FileNotFoundError, PermissionError):
                    yield self.get(k, what=what.get(k), start=start, end=end)  # (says which object, in one line)
                    continue
                except Exception as exc:  # noqa: BLE001 - retried, or named, by get
                    transient = _is_transient(exc)
                    yield self.get(
                        k,
                        what=what.get(k),
                        start=start,
                        end=end,
                        tried=int(transient),
                        failed=exc if transient else None,
                    )
                    continue
                yield _counted(got, k)
        finally:
            for fut in pending:  # (a caller that stops early: nothing left running for it)
                if fut is not None:
                    fut.cancel()

    def get_metadata(self, key: str) -> bytes | None:
        """Read a metadata object, ``None`` when absent."""
        try:
            return self.get(key, metadata=True)
        except ChunkError:
            return None

    def size(self, key: str) -> int:
        """The size of object ``key`` in bytes (``ChunkError`` if it is missing), with the retries
        of :meth:`get`."""
        path = self.path(key)

        def size() -> int:
            if self.local:
                return os.path.getsize(path)
            if objects.usable(self.fs):
                import asyncio

                return _wait(asyncio.run_coroutine_threadsafe(objects.size(self.fs, path), self.fs.loop), path)
            self.fs.invalidate_cache(path)  # (s3fs answers sizes from listings it cached)
            return int(self.fs.size(path))

        return self._retrying(size, key)

    def sizes(self, folder: str) -> dict[str, int]:
        """The size of each object directly in ``folder`` (a key prefix), by name: one listing (a
        request per 1,000 objects on S3), with the retries of :meth:`get`."""
        path = self.path(folder)

        def listing() -> dict[str, int]:
            if self.local:
                with os.scandir(path) as entries:
                    return {e.name: e.stat().st_size for e in entries if e.is_file()}
            self.fs.invalidate_cache(path)
            return {
                posixpath.basename(d["name"].rstrip("/")): int(d["size"])
                for d in self.fs.ls(path, detail=True)
                if d.get("type") == "file"
            }

        return self._retrying(listing, folder)

    def identities(self, folder: str) -> dict[str, str]:
        """What identifies each object directly in ``folder`` (a key prefix), by name, from one
        listing, for the cache of partials (:mod:`l5dask.core.cache`): its size and what the store
        says changes with its bytes: on a local disk its mtime, ctime and inode (nanoseconds), on
        an object store its ETag (else its last-modified time), in a zip its CRC; as one string
        (``kind:size:...``: a rerun's keys are made of 1,500 of them an array, made here without
        a tuple's ``repr`` each). An object the listing says none of this about is left out (its
        reader hashes its bytes instead)."""
        path = self.path(folder)

        def listing() -> dict[str, str]:
            if self.local:  # (one listing and a stat a file, without the GIL, in inode order: l5dask/core/_stat.pyx)
                got = prefetch.take(path)  # (made while the command's imports ran: l5dask.core.prefetch)
                return got if got is not None else compiled("l5dask.core._stat").identities(path, STAT_THREADS)
            self.fs.invalidate_cache(path)
            out: dict[str, str] = {}
            for d in self.fs.ls(path, detail=True):
                if d.get("type") != "file":
                    continue
                name = posixpath.basename(d["name"].rstrip("/"))
                for field in ("ETag", "etag", "md5Hash", "crc32c", "CRC", "LastModified", "last_modified", "mtime"):
                    value = d.get(field)
                    if value not in (None, ""):
                        out[name] = f"{field}:{int(d['size'])}:{value}"
                        break
            return out

        return self._retrying(listing, folder)

    def files(self) -> list[str]:
        """Every file under this store's root folder (or key prefix), as a path relative to it with
        ``/`` between names, sorted; none when it is not there or is a file (one walk of the tree,
        or one recursive listing; a zip is read as it is). A link is listed, not followed."""
        root = self.root
        if not root or (self.local and archive_kind(self.url) is not None):
            return []
        if self.local:
            if not os.path.isdir(root):
                return []
            out = []
            for folder, dirs, names in os.walk(root):
                rel = os.path.relpath(folder, root).replace(os.sep, "/")
                links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
                for n in (*names, *links):
                    out.append(n if rel == "." else f"{rel}/{n}")
            return sorted(out)
        try:
            self.fs.invalidate_cache(root)
            listed = self.fs.find(root)
        except FileNotFoundError:
            return []
        except PermissionError as exc:
            raise _denied(self.url, exc) from exc
        except OSError as exc:
            raise StoreError(f"{self.url}: {_describe(exc)}") from exc
        top = root.rstrip("/") + "/"
        # (an object whose key is the prefix itself is the prefix's "file", not an entry in it)
        return sorted({str(n)[len(top) :] for n in listed if str(n).startswith(top) and len(str(n)) > len(top)})

    def with_root(self, root: str) -> Store:
        """This store's filesystem (and URL) at another root path: a folder inside it."""
        return _rebuild_store(self.url, self._fs, root)

    def exists(self, key: str) -> bool:
        """Whether object ``key`` is stored (a stat on a local disk, one request elsewhere)."""
        try:
            if self.local:
                return os.path.isfile(self.path(key))
            if _protocol(self.fs) in ("tar", "zip"):
                with _ARCHIVE_READS:
                    return bool(self.fs.isfile(self.path(key)))
            return bool(self.fs.isfile(self.path(key)))
        except PermissionError as exc:
            raise _denied(self.url, exc) from exc
        except OSError as exc:
            raise StoreError(f"{self.url}: {_describe(exc)}") from exc

    def exists_root(self) -> bool:
        try:
            if self.local and self.root:
                return os.path.exists(self.root)
            return bool(self.fs.exists(self.root or "/")) if self.root else True
        except PermissionError as exc:
            raise _denied(self.url, exc) from exc
        except OSError as exc:
            raise StoreError(f"{self.url}: {_describe(exc)}") from exc

    def __dask_tokenize__(self):
        return ("l5dask.Store", self.location, self.root, "file" if self._fs is None else _protocol(self._fs))

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    def __reduce__(self):
        # Rebuild from the filesystem (fsspec filesystems pickle to their init arguments).
        return (_rebuild_store, (self.url, self._fs, self.root, self.large, self.file))


class LocalFile:
    """What :meth:`Store.open_file` opens: :meth:`read` of ranges of one local object, counted as
    the store's reads; a context manager that closes the file."""

    __slots__ = ("store", "key", "what", "file")

    def __init__(self, store: Store, key: str, what: str | None, file: diskread.File) -> None:
        self.store, self.key, self.what, self.file = store, key, what, file

    def read(self, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of the object (as :meth:`Store.get`: ``None``, a negative ``start``)."""
        try:
            return _counted(self.file.read(start, end), self.key)
        except OSError as exc:
            raise self.store.read_error(self.key, self.what, exc) from exc

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> LocalFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()


def local_folder(url: str, storage_options: dict[str, Any]) -> str | None:
    """The absolute path that a plain local path (or ``file://`` URL) names, as fsspec's local
    filesystem makes it; ``None`` for any other URL, or with storage options (fsspec's then)."""
    if storage_options or "::" in url:
        return None
    if url.startswith("file://"):
        url = url[len("file://") :]
    elif "://" in url:
        return None
    return os.path.abspath(os.path.expanduser(url)) if url else None


def _archive_fs(url: str, kind: str, path: str, target_fs: Any, options: dict[str, Any]) -> Any:
    """fsspec's filesystem of the zip or tar at ``path`` of ``target_fs`` (its table of contents
    read); one that is not such an archive, or is cut short (a partial download), refused in one
    line: zipfile's and tarfile's own errors are no ``OSError``."""
    import tarfile
    import zipfile
    import zlib

    import fsspec

    try:
        # (fsspec's tar infers gzip, bz2, xz from the name)
        return fsspec.filesystem(kind, fo=path, target_protocol=_protocol(target_fs), target_options=options)
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error) as exc:
        raise NotADatasetError(
            f"{url}: not a {kind} that can be read ({_describe(exc)}): a damaged file, or one not written whole"
        ) from None
    except NotImplementedError as exc:  # (zipfile: "zip file version 9.0", a compression it lacks)
        raise NotADatasetError(f"{url}: a {kind} that Python's {kind}file cannot read ({exc})") from None
    except (LookupError, ValueError) as exc:  # (a compression that is not one, a bad header field)
        raise NotADatasetError(f"{url}: not a {kind} that can be read ({_describe(exc)})") from None


def archive_kind(url: str) -> str | None:
    """``"zip"`` or ``"tar"`` when ``url`` names an archive of a dataset folder (not a chained URL)."""
    if "::" in url:
        return None
    name = url.rstrip("/").lower()
    if name.endswith(".zip"):
        return "zip"
    if name.endswith((".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")):
        return "tar"
    return None


def some_names(names: Sequence[str], most: int = 3) -> str:
    """The first ``most`` of ``names`` for a one-line message, `` ...`` when there are more."""
    return ", ".join(names[:most]) + (" ..." if len(names) > most else "")


def output_folder(url: Any, what: str) -> str:
    """``url`` as the folder (or key prefix) an output of ``what`` (``"a dataset"``...) is written
    to, refused in one line if it names an archive: a folder is written whole, never a zip."""
    url = os.fspath(url)
    kind = archive_kind(url)
    if kind is not None:
        raise UsageError(
            f"{url}: {what} is written as a folder, not a {kind}; write it to a folder (then archive that "
            "folder: l5dask reads a zip or tar of it as it is)"
        )
    return url


def file_store(path: str, storage_options: dict[str, Any] | None = None) -> tuple[Store, str]:
    """A single file as ``(store of its folder, key)``: read through :meth:`Store.get` (ranges,
    retries of transient errors, one-line errors) as a dataset's chunks are."""
    url = str(path)
    folder, _, name = url.rstrip("/").rpartition("/")
    if not name:
        raise NotADatasetError(f"{url}: not a file")
    if not folder:
        folder = "." if "://" not in url else folder
    store = Store(folder or "/", storage_options)
    store.file = url  # (its errors name the file as given, not "." and a key)
    return store, name


def location(path: str) -> str:
    """The place a path or URL names, as one string, without touching it: two spellings of one
    file (``out/a.parquet``, ``./out/a.parquet``, its absolute path, ``out/x/../a.parquet``, a
    link to it) give the same. A local path: absolute, its links, ``.`` and ``..`` resolved
    (``file://`` too); a URL: its protocol in lower case, ``.`` and ``..`` of its path resolved,
    no ``/`` at its end."""
    text = str(path)
    if text.startswith("file://"):
        text = text[len("file://") :]
    if "://" not in text:
        return os.path.realpath(text)
    protocol, _, rest = text.partition("://")
    return f"{protocol.lower()}://{posixpath.normpath(rest) if rest else ''}"


def _where(s: Store) -> tuple[str, str]:
    if s._fs is None:  # (a plain local folder: its filesystem not made, fsspec not imported)
        return ("LocalFileSystem", os.path.realpath(s.root))
    root = os.path.realpath(s.root) if s.local else s.root.rstrip("/")
    return (type(s.fs).__name__, root)


def nesting(output: Store, source: Store) -> str | None:
    """How an output's location meets an input's: ``"is"`` (the same), ``"holds"`` (the input is
    inside the output's folder: replacing the output would delete it), ``"is inside"`` (the
    output is a folder within the input), or ``None`` (apart)."""
    (kind, out), (kind_in, src) = _where(output), _where(source)
    if kind != kind_in:
        return None
    if out == src:
        return "is"
    sep = os.sep if output.local else "/"
    if src.startswith(out.rstrip(sep) + sep) or (out in ("", sep) and src):
        return "holds"
    if out.startswith(src.rstrip(sep) + sep):
        return "is inside"
    return None


def _own_retries(fs: Any) -> None:
    """s3fs retries a timed-out read five times itself (a class attribute, not an option): each
    attempt of l5dask's would wait five read timeouts. Its retries of one attempt are l5dask's."""
    if _protocol(fs) in ("s3", "s3a") and hasattr(fs, "retries"):
        fs.retries = 1


def _rebuild_store(url: str, fs: Any, root: str, large: bool = False, file: str | None = None) -> Store:
    """A store of ``fs`` (``None``: a local folder's, made when asked for) at ``root``."""
    if fs is not None:
        _own_retries(fs)
    store = Store.__new__(Store)
    store.url, store._fs, store.root, store.large, store.file = url, fs, root, large, file
    return store


def resolved_options(url: str, storage_options: dict[str, Any] | None) -> dict[str, Any]:
    """The storage options of ``url`` as every reader and writer of l5dask uses them (for S3:
    :func:`resolve_s3_options`). What a task that opens the URL again elsewhere (a worker) must
    carry: the workers may not share this process's AWS environment."""
    options = dict(storage_options or {})
    if str(url).startswith(("s3://", "s3a://")):
        options = resolve_s3_options(options)
    return options


def resolve_s3_options(options: dict[str, Any]) -> dict[str, Any]:
    """Make S3 credentials and endpoint explicit, so that they reach the workers.

    Workers run elsewhere and may not share this process's AWS environment: credentials
    found here by botocore's usual chain (environment, profiles, instance roles) and
    ``AWS_ENDPOINT_URL`` are put into the options, which travel inside the tasks (they are
    never printed or logged). Explicit options, ``anon`` or a ``profile`` are left alone.
    """
    out = dict(options)
    # s3fs's default max_concurrency (10) makes it ask an object's size (a HEAD) before every whole
    # read: a second round trip per chunk; botocore keeps 10 connections per process. Through an
    # endpoint with 50 ms to the first byte (benchmarks/s3_latency_benchmark.py) these two cost
    # more than half the time. The user's own values win.
    out.setdefault("max_concurrency", 1)
    config_kwargs = dict(out.get("config_kwargs") or {})
    config_kwargs.setdefault("max_pool_connections", S3_CONNECTIONS)
    # a read that gets no byte for this long is a transient error: retried, then named in one line
    # (botocore waits 60 s, five times over; l5dask retries with its own backoff)

    timeout = float(config.get("read-timeout"))
    config_kwargs.setdefault("read_timeout", timeout)
    config_kwargs.setdefault("connect_timeout", timeout)
    # botocore's own retries off: one request per attempt of l5dask's (_retrying). (Its
    # ``max_attempts`` counts retries, not attempts: ``max_attempts: 1`` made two requests each.)
    config_kwargs.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
    out["config_kwargs"] = config_kwargs
    client_kwargs = dict(out.get("client_kwargs") or {})
    if "endpoint_url" not in client_kwargs and "endpoint_url" not in out and os.environ.get("AWS_ENDPOINT_URL"):
        client_kwargs["endpoint_url"] = os.environ["AWS_ENDPOINT_URL"]
    if client_kwargs:
        out["client_kwargs"] = client_kwargs
    if out.get("anon") or "profile" in out or "key" in out or "secret" in out or "token" in out:
        return out
    try:
        import botocore.session

        creds = botocore.session.get_session().get_credentials()
    except Exception:  # noqa: BLE001 - no credentials here: s3fs decides (anonymous, or its own chain)
        creds = None
    if creds is not None:
        frozen = creds.get_frozen_credentials()
        out["key"], out["secret"] = frozen.access_key, frozen.secret_key
        if frozen.token:
            out["token"] = frozen.token
    return out


def _protocol(fs: Any) -> str:
    proto = fs.protocol
    return proto[0] if isinstance(proto, (tuple, list)) else proto


#: Tables that make a folder a Lyft perception dataset (nuScenes-style JSON).
PERCEPTION_TABLES = ("scene.json", "sample.json", "sample_data.json", "ego_pose.json")


def what_is_there(store: Store) -> str:
    """Say what a location holds when it is not an L5Kit dataset (for the error message)."""
    fs, root = store.fs, store.root
    try:
        if root and fs.isfile(root):
            return "not an L5Kit dataset: it is a file (a dataset is a folder, or a .zip of one, holding .zgroup)"
        names = sorted(posixpath.basename(p.rstrip("/")) for p in fs.ls(root or "", detail=False))
    except (OSError, ValueError):
        return "not an L5Kit dataset (no zarr group metadata .zgroup)"
    if not names:
        return "not an L5Kit dataset: the folder is empty"
    if "zarr.json" in names:
        return (
            "not an L5Kit dataset: a zarr v3 store (L5Kit writes zarr v2: .zgroup and .zarray files); "
            "read it with zarr-python 3 or xarray's zarr engine"
        )
    sub = [n for n in names if fs.isdir(posixpath.join(root, n) if root else n)]
    nested = any(t in names for t in PERCEPTION_TABLES) or any(
        fs.exists(posixpath.join(root, d, "scene.json") if root else posixpath.join(d, "scene.json")) for d in sub[:8]
    )
    if nested:
        return (
            "not an L5Kit dataset: a Lyft perception dataset (nuScenes-style JSON tables such as "
            "scene.json); these commands read L5Kit prediction datasets (zarr)"
        )
    shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    return f"not an L5Kit dataset (no zarr group metadata .zgroup); it holds {shown}"


def open_store(url: str | os.PathLike, storage_options: dict[str, Any] | None = None) -> Store:
    """Open a dataset location, raising :class:`NotADatasetError` if it holds no dataset."""
    store = Store(os.fspath(url), storage_options)
    try:
        raw = store.get(".zgroup", metadata=True)
    except (ChunkError, StoreError) as exc:
        if isinstance(exc, StoreError) and not isinstance(exc.__cause__, (NotADirectoryError, IsADirectoryError)):
            raise
        if not store.exists_root():
            raise NotADatasetError(f"{store.url}: no such file, folder or bucket") from None
        raise NotADatasetError(f"{store.url}: {what_is_there(store)}") from None
    if b"zarr_format" not in raw:
        raise NotADatasetError(f"{store.url}: not an L5Kit dataset (.zgroup is not zarr v2 metadata)")
    return store
