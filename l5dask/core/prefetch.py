"""What a command given a cache (``--cache``) over a local dataset reads first, read while its
imports run: the identity of each stored chunk (a ``stat`` of every chunk file, the cache's keys:
:meth:`~l5dask.core.store.Store.identities`) and the cache's folders and whole-pass entries.

A rerun over unchanged data is its start (the interpreter and the imports, read from the disk
when the page cache is cold), then the stat of every chunk file (71,142 at 1.03 G agents, cold:
the inodes read from the disk), then the listing of the cache's folders and its few entries: one
disk wait after another. Started first thing (``l5dask.cli``, before click, numpy and dask are
imported), a thread stats the chunk files of each local dataset on the command line (the compiled
listing, ``l5dask.core._stat``, without the GIL) and asks the disk for the cache's folders and its
``pass-`` and ``read.`` entries (what a rerun reads), while the main thread imports: the disk
serves both at once. The identities are taken once by the first :meth:`Store.identities` of their folder (the
same call, made earlier: what a run keys its tasks by is what its folders held when it started),
and only while the folder is as it was (its own mtime and ctime, which a chunk written through a
rename, as zarr and l5dask write them, changes); else, and for anything else, the listing is made
again. Light: the standard library only.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Sequence
from typing import Any

#: Threads of each folder's stat (``l5dask.core._stat``): inode tables read in parallel.
STAT_THREADS = 4

_LOCK = threading.Lock()
#: Folder (absolute path) -> [done, identities or None, the folder's (inode, mtime_ns, ctime_ns)
#: then, state: 0 waiting, 1 being listed, 2 left to the caller].
_FOLDERS: dict[str, list] = {}
#: Set once the prefetch started knows its folders (a :func:`take` before it waits for it).
_REGISTERED = threading.Event()
_STARTED = False


def _folder_stamp(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


def _dir_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _arrays(dataset: str) -> list[str]:
    """The array folders of a local zarr group (its ``.zarray`` folders one level down)."""
    try:
        with os.scandir(dataset) as it:
            return sorted(e.path for e in it if e.is_dir() and os.path.exists(os.path.join(e.path, ".zarray")))
    except OSError:
        return []


def _will_need(path: str) -> None:
    """Ask the disk for a file's bytes ahead (no wait, no copy)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except (OSError, AttributeError):
        pass
    finally:
        os.close(fd)


def _cache_folders(root: str) -> None:
    """List each folder of a local cache and ask for its whole-pass entries (what a rerun reads)."""
    try:
        with os.scandir(root) as it:
            formats = [e.path for e in it if e.name.startswith("l5dask-cache-v") and e.is_dir()]
        for fmt in formats:
            with os.scandir(fmt) as it:
                sources = [e.path for e in it if e.is_dir()]
            for src in sources:
                for name in os.listdir(src):
                    if name.startswith(("pass-", "read.")) or name == "source.json":
                        _will_need(os.path.join(src, name))
    except OSError:
        return


def _work(datasets: list[str], caches: list[str]) -> None:
    try:
        _read_ahead(datasets, caches)
    finally:
        _REGISTERED.set()
        with _LOCK:
            for job in _FOLDERS.values():
                job[0].set()


def _read_ahead(datasets: list[str], caches: list[str]) -> None:
    for dataset in datasets:
        for name in (".zgroup", ".zattrs"):
            _will_need(os.path.join(dataset, name))
    for dataset in datasets:
        for array in _arrays(dataset):
            for name in (".zarray", ".zattrs"):
                _will_need(os.path.join(array, name))
    # (the largest folder first, by its own size, which grows with its entries: the main thread
    # lists a folder not begun itself, the small ones it asks for first)
    folders = sorted((a for d in datasets for a in _arrays(d)), key=_dir_size, reverse=True)
    with _LOCK:
        for f in folders:
            _FOLDERS.setdefault(f, [threading.Event(), None, _folder_stamp(f), 0])
    _REGISTERED.set()
    for root in caches:
        _cache_folders(root)
    try:
        stat: Any = importlib.import_module("l5dask.core._stat")
    except ImportError:
        stat = None
    for f in folders:
        with _LOCK:
            job = _FOLDERS.get(f)
            if job is None or job[3] == 2:
                continue
            job[3] = 1
        try:
            if stat is not None and job[2] is not None:
                job[1] = stat.identities(f, STAT_THREADS)
        except Exception:  # noqa: BLE001 - made again by the caller, who says what is wrong
            job[1] = None
        finally:
            job[0].set()


def start(argv: Sequence[str]) -> threading.Thread | None:
    """Read ahead for a command line given ``--cache DIR`` (a local folder): each local zarr group
    among its arguments (its chunk files' identities, kept for :func:`take`) and the cache's
    folders. ``None`` (nothing started) for any other command line."""
    args = list(argv)
    caches: list[str] = []
    for i, a in enumerate(args):
        if a == "--cache" and i + 1 < len(args):
            caches.append(args[i + 1])
        elif a.startswith("--cache="):
            caches.append(a.split("=", 1)[1])
    caches = [os.path.abspath(c.removeprefix("file://")) for c in caches if "://" not in c or c.startswith("file://")]
    if not caches:
        return None
    datasets = []
    for a in args:
        if a.startswith("-") or "://" in a or not a:
            continue
        path = os.path.abspath(a)
        if os.path.isfile(os.path.join(path, ".zgroup")):
            datasets.append(path)
    global _STARTED
    _STARTED = True
    thread = threading.Thread(target=_work, args=(datasets, caches), name="l5dask-prefetch", daemon=True)
    thread.start()
    return thread


def take(path: str) -> dict[str, str] | None:
    """The identities the prefetch made of folder ``path`` (``_stat.identities``' answer), once;
    ``None`` when it made none, or the folder changed since (then they are made again)."""
    if not _STARTED:
        return None
    _REGISTERED.wait()
    key = os.path.abspath(path)
    with _LOCK:
        job = _FOLDERS.pop(key, None)
        if job is None:
            return None
        if job[3] == 0:  # (not begun: listed by the caller now, rather than waited for)
            job[3] = 2
            return None
    job[0].wait()
    if job[1] is None or _folder_stamp(key) != job[2]:
        return None
    return job[1]
