"""Reads of a local disk around the page cache (l5dask.core.diskread): the same bytes as a slice
of the file, cold or cached; the page cache left as it was; a filesystem that refuses O_DIRECT read
as before; a dataset larger than memory read this way, with the same results and errors."""

from __future__ import annotations

import errno
import fcntl
import os
import pickle
import shutil
import time

import dask
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import l5dask
from l5dask.core import diskread
from l5dask.core.outputs import public
from l5dask.core.store import Store
from l5dask.errors import ChunkError
from l5dask.prediction.report import compute_report

pytestmark = pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="O_DIRECT is Linux's")


def evict(path: str) -> None:
    """Drop a file's clean pages from the page cache (no root needed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def is_resident(path: str) -> bool | None:
    fd = os.open(path, os.O_RDONLY)
    try:
        return diskread.resident(fd, 0, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def cold_works(path: str) -> bool:
    """Whether this filesystem lets a test make a file cold (not tmpfs, where all is resident)."""
    evict(path)
    return is_resident(path) is False


@pytest.fixture(scope="module")
def blob(tmp_path_factory) -> tuple[str, bytes]:
    data = np.random.default_rng(5).integers(0, 256, 3 * 4096 + 1234, dtype=np.uint8).tobytes()
    path = str(tmp_path_factory.mktemp("disk") / "blob")
    with open(path, "wb") as f:
        f.write(data)
    os.sync()
    if not cold_works(path):
        pytest.skip("this filesystem keeps every file in memory")
    return path, data


def sliced(data: bytes, start: int | None, end: int | None) -> bytes:
    return data[start:end]


SIZE = 3 * 4096 + 1234
edges = st.sampled_from([0, 1, 4095, 4096, 4097, 8192, SIZE - 1, SIZE, SIZE + 1, SIZE + 5000])
offsets = st.one_of(st.none(), edges, st.integers(-SIZE - 10, SIZE + 10))


def cold_or_cached(path: str, cold: bool) -> None:
    """``path`` out of the page cache (``cold``), or read whole into it."""
    if cold:
        evict(path)
    else:
        with open(path, "rb") as f:
            f.read()


@settings(max_examples=150, deadline=None)
@given(start=offsets, end=offsets, cold=st.booleans())
def test_a_read_is_the_slice_cold_or_cached(blob, start, end, cold):
    path, data = blob
    cold_or_cached(path, cold)
    assert diskread.read(path, start, end, direct=True) == sliced(data, start, end)
    assert diskread.read(path, start, end, direct=False) == sliced(data, start, end)


@settings(max_examples=100, deadline=None)
@given(spans=st.lists(st.tuples(offsets, offsets), min_size=1, max_size=4), cold=st.booleans(), direct=st.booleans())
def test_reads_through_one_open_file_are_the_slices(blob, spans, cold, direct):
    path, data = blob
    cold_or_cached(path, cold)
    with diskread.File(path, direct) as f:
        for start, end in spans:
            assert f.read(start, end) == sliced(data, start, end)
    assert f.fd == -1  # (closed)


def test_a_cold_read_is_one_compiled_call(blob, monkeypatch):
    """Around the page cache, a read is one compiled call (``l5dask.core._pread``: the look in the
    cache, ``O_DIRECT`` and the reads, the GIL let go once), not Python's calls (``resident``'s
    ``ctypes``, ``fstat``, ``fcntl``, ``preadv``), each of which let go of the GIL and took it back:
    with those refusing, the same bytes, cold and cached."""

    def refused(*a, **k):
        raise AssertionError("a Python call of the read")

    for name in ("resident", "_read_direct"):
        monkeypatch.setattr(diskread, name, refused)
    path, data = blob
    for cold in (True, False):
        cold_or_cached(path, cold)
        monkeypatch.setattr(diskread.os, "preadv", refused)
        monkeypatch.setattr(diskread.os, "pread", refused)
        with diskread.File(path, True) as f:
            assert f.read(5, 9000) == data[5:9000] and f.read(-3) == data[-3:]
        assert diskread.read(path, 4096, None, direct=True) == data[4096:]
        monkeypatch.undo()
        for name in ("resident", "_read_direct"):
            monkeypatch.setattr(diskread, name, refused)


def test_a_cached_range_after_a_cold_one_through_one_file(blob):
    """Through one open file, a range read around the cache (``O_DIRECT`` set on the file) and then
    one in the cache (read through it, at any offset: ``O_DIRECT`` cleared), then one around it again."""
    path, data = blob
    evict(path)
    with diskread.File(path, True) as f:
        assert f.read(0, 100) == data[:100]
        with open(path, "rb") as g:  # (the rest put in the page cache by another reader)
            g.read()
        assert f.read(4101, 4150) == data[4101:4150]
        evict(path)
        assert f.read(7, 20) == data[7:20]


def test_a_file_read_through_the_cache_in_part_reads_nothing_ahead(blob):
    path, data = blob
    evict(path)
    with diskread.File(path, direct=False) as f:
        assert f.read(10, 300) == data[10:300]
    fd = os.open(path, os.O_RDONLY)
    try:
        assert diskread.resident(fd, 0, 4096) is True
        assert diskread.resident(fd, 4096, 8192) is False  # (POSIX_FADV_RANDOM: no page read ahead)
    finally:
        os.close(fd)


def test_a_stores_open_file_reads_counts_and_names_a_missing_object(blob, tmp_path):
    from l5dask.core.store import read_counts

    path, data = blob
    store = Store(os.path.dirname(path))
    before = read_counts()["bytes"]
    with store.open_file("blob") as f:
        assert f.read(0, 17) == data[:17] and f.read(-5) == data[-5:] and f.read(4095, 4097) == data[4095:4097]
    assert read_counts()["bytes"] - before == 17 + 5 + 2
    with pytest.raises(ChunkError, match="'nothing' is missing"):
        store.open_file("nothing", what="array 'agents', chunk '0'")


def test_a_cold_read_leaves_the_page_cache_as_it_was(blob):
    path, data = blob
    evict(path)
    assert diskread.read(path, direct=True) == data
    assert is_resident(path) is False  # read around the cache (a buffered read caches the file)
    assert diskread.read(path, direct=False) == data
    assert is_resident(path) is True
    assert diskread.read(path, 100, 5000, direct=True) == data[100:5000]  # (cached: through it)


def test_residency_by_cachestat_and_by_mincore_agree(blob, monkeypatch):
    path, _ = blob
    for warm in (False, True):
        evict(path)
        if warm:
            diskread.read(path, direct=False)
        fd = os.open(path, os.O_RDONLY)
        try:
            first = diskread.resident(fd, 10, 9000)
            monkeypatch.setattr(diskread, "_CACHESTAT", None)
            assert diskread.resident(fd, 10, 9000) is first is warm
            monkeypatch.undo()
        finally:
            os.close(fd)


def test_a_filesystem_that_refuses_o_direct_is_read_through_the_cache(blob, monkeypatch):
    path, data = blob
    evict(path)
    real = os.preadv

    def refusing(fd, buffers, offset, *flags):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, buffers, offset, *flags)

    monkeypatch.setattr(diskread.os, "preadv", refusing)
    monkeypatch.setattr(diskread, "_REFUSED", set())
    monkeypatch.setattr(diskread, "_PREAD", None)  # (the reads of Python's calls, whose preadv refuses here)
    assert diskread.read(path, 7, None, direct=True) == data[7:]
    assert os.stat(path).st_dev in diskread._REFUSED
    assert diskread.read(path, direct=True) == data  # (from then on: through the cache at once)


@pytest.fixture(scope="module")
def cold_ds(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("cold") / "ds.zarr")
    l5dask.synthesize(
        path, num_scenes=6, seed=11, chunk_rows={"scenes": 2, "frames": 300, "agents": 2000, "traffic_light_faces": 500}
    )
    os.sync()
    return path


def chunk_files(path: str) -> list[str]:
    return [os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs if not f.startswith(".")]


def test_a_dataset_read_around_the_page_cache_gives_the_same_report(cold_ds):
    files = chunk_files(cold_ds)
    if not cold_works(files[0]):
        pytest.skip("this filesystem keeps every file in memory")
    with dask.config.set({"l5dask.direct-reads": False}):
        want = compute_report(cold_ds, chunks_per_task=3)
    for f in files:
        evict(f)
    with dask.config.set({"l5dask.direct-reads": True}):
        got = compute_report(cold_ds, chunks_per_task=3)
    assert public(got) == public(want)
    assert not any(is_resident(f) for f in files)  # every chunk was read around the cache


def test_large_is_decided_by_the_dataset_size_and_travels_with_the_store(cold_ds, monkeypatch):
    assert l5dask.open_dataset(cold_ds).store.large is False  # (a few MB: read through the cache)
    monkeypatch.setattr("l5dask.prediction.dataset.memory_bytes", lambda: 1000)
    store = l5dask.open_dataset(cold_ds).store
    assert store.large is True
    assert pickle.loads(pickle.dumps(store)).large is True
    with dask.config.set({"l5dask.direct-reads": "auto"}):
        assert diskread.wanted(True) and not diskread.wanted(False)
    with dask.config.set({"l5dask.direct-reads": "false"}):
        assert not diskread.wanted(True)
    with dask.config.set({"l5dask.direct-reads": True}):
        assert diskread.wanted(False)


def test_a_missing_chunk_read_around_the_cache_is_named(cold_ds, tmp_path):
    ds = str(tmp_path / "ds.zarr")
    shutil.copytree(cold_ds, ds)
    os.remove(os.path.join(ds, "agents", "3"))
    with dask.config.set({"l5dask.direct-reads": True}):
        with pytest.raises(ChunkError, match=r"object 'agents/3' is missing"):
            compute_report(ds)
        store = Store(ds)
        assert list(store.iter_many(["agents/0", "agents/1"])) == [
            open(os.path.join(ds, "agents", k), "rb").read() for k in ("0", "1")
        ]


def test_hints_start_reads_that_the_reader_then_takes(cold_ds, tmp_path):
    ds = str(tmp_path / "ds.zarr")  # (paths no reader asked for yet)
    shutil.copytree(cold_ds, ds)
    os.sync()
    store = Store(ds)
    keys = [f"agents/{i}" for i in range(6)]
    want = [open(os.path.join(ds, k), "rb").read() for k in keys]
    for k in keys:
        evict(os.path.join(ds, k))
    before = diskread.hinted()
    with dask.config.set({"l5dask.direct-reads": True}):
        store.will_need(keys)  # (at most HINTED_READS of them started)
        assert diskread.hinted() == before + 4
        assert list(store.iter_many(keys)) == want
        assert diskread.hinted() == before  # each taken by its reader, once
        store.will_need(keys[:2])  # asked for lately: nothing starts again
        assert diskread.hinted() == before
    for i in range(diskread.HINTED + 5):  # never more than HINTED wait for a reader
        diskread.hint(os.path.join(ds, "agents", str(i % 8)), i, i + 10)
    assert diskread.hinted() == diskread.HINTED


def test_hints_through_the_cache_are_asked_only_for_what_is_not_in_it(cold_ds, tmp_path, monkeypatch):
    ds = str(tmp_path / "ds.zarr")
    shutil.copytree(cold_ds, ds)
    os.sync()
    paths = [os.path.join(ds, "agents", str(i)) for i in range(6)]
    keys = [f"agents/{i}" for i in range(6)]
    want = [open(p, "rb").read() for p in paths]  # (now in the page cache)
    if not cold_works(paths[0]):
        pytest.skip("this filesystem keeps every file in memory")
    asked: list[int] = []
    fadvise = os.posix_fadvise

    def counted(fd: int, a: int, n: int, how: int) -> None:
        asked.extend([how] if how == os.POSIX_FADV_WILLNEED else [])  # (not evict's DONTNEED)
        fadvise(fd, a, n, how)

    monkeypatch.setattr(os, "posix_fadvise", counted)
    store = Store(ds)
    with dask.config.set({"l5dask.direct-reads": False}):
        for p in paths[1:]:
            open(p, "rb").read()
        assert store.will_need(keys[1:]) is False and asked == []  # cached: nothing asked
        assert list(store.iter_many(keys)) == want and asked == []
        for p in paths:
            evict(p)
        assert store.will_need(keys[1:]) is True  # cold: the kernel reads them ahead
        assert asked == [os.POSIX_FADV_WILLNEED] * 5
        for _ in range(100):  # (the kernel reads them in the background)
            if all(is_resident(p) for p in paths[1:]):
                break
            time.sleep(0.05)
        assert all(is_resident(p) for p in paths[1:]) and is_resident(paths[0]) is False
        assert [open(p, "rb").read() for p in paths] == want  # (and waits for the reads to end:
        # pages still being read are not dropped by the evictions below)
        asked.clear()
        evict(paths[3])  # the first in the cache stands for the rest: a later one cold is not asked
        assert store.will_need(keys[1:]) is False and asked == []
        for p in paths:
            evict(p)
        assert list(store.iter_many(keys, depth=3)) == want  # cold: each read asks for one ahead
        assert len(asked) == 5


def test_worker_processes_read_a_large_dataset_around_the_page_cache(dask_cluster, cold_ds, tmp_path, monkeypatch):
    """The decision travels with the store to the workers (their config is their own: ``auto``)."""
    from distributed import Client

    ds = str(tmp_path / "ds.zarr")
    shutil.copytree(cold_ds, ds)
    os.sync()
    with dask.config.set({"l5dask.direct-reads": False}):
        want = compute_report(ds, chunks_per_task=3, scheduler="sync")
    files = chunk_files(ds)
    if not cold_works(files[0]):
        pytest.skip("this filesystem keeps every file in memory")
    for f in files:
        evict(f)
    monkeypatch.setattr("l5dask.prediction.dataset.memory_bytes", lambda: 1000)
    dataset = l5dask.open_dataset(ds)
    assert dataset.store.large
    with Client(dask_cluster.address, set_as_default=False) as client:
        got = compute_report(dataset, chunks_per_task=3, scheduler=client)
    assert public(got) | {"dataset": None} == public(want) | {"dataset": None}
    cached = [f for f in files if "/agents/" in f and is_resident(f)]
    assert not cached, cached  # read by the workers, around the cache


class Refused(Exception):
    """What a read of the tests below raises for the item it was told to refuse."""


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(0, 25),
    depth=st.integers(1, 10),
    fails=st.one_of(st.none(), st.integers(0, 24)),
    taken=st.one_of(st.none(), st.integers(0, 24)),
)
def test_reads_ahead_are_the_reads_in_turn(blob, n, depth, fails, taken):
    """``Store.read_ahead``: each item's result in order, as reading them in turn gives; a failed
    item's error where it comes (those before it given); each item read once, none more than
    ``depth`` past the one taken; a caller that stops early starts nothing more."""
    import threading

    path, data = blob
    store = Store(os.path.dirname(path))
    items = [(i, (i * 997) % len(data), (i * 997) % len(data) + 1 + i * 31) for i in range(n)]
    started: list[int] = []
    lock = threading.Lock()

    ended: list[int] = []

    def read(item: tuple[int, int, int]) -> bytes:
        with lock:
            started.append(item[0])
        try:
            if item[0] == fails:
                raise Refused(item[0])
            with store.open_file("blob") as f:
                return f.read(item[1], item[2])
        finally:
            ended.append(item[0])

    want = [data[a:b] for _, a, b in items]
    got: list[bytes] = []
    stop = n if taken is None else min(taken, n)
    it = store.read_ahead(read, items, depth)
    try:
        for i in range(stop):
            if i == fails:
                with pytest.raises(Refused):
                    next(it)
                break
            got.append(next(it))
            assert max(started) <= i + depth  # (never more than depth ahead of the caller)
    finally:
        it.close()
    assert got == want[: len(got)]
    assert len(got) == min(stop, n if fails is None else fails)
    for _ in range(200):  # (those started when the caller stopped end; none starts after)
        if len(ended) == len(started):
            break
        time.sleep(0.01)
    assert sorted(ended) == sorted(started)
    assert sorted(started) == sorted(set(started))  # each read once
    assert set(range(len(got))) <= set(started) and max(started, default=-1) < len(got) + depth + 1


def test_reads_ahead_are_in_flight_together(blob, tmp_path):
    """The first ``depth`` items' reads run at once (each waits for the others here: read in
    turn, the first would wait for ever); on an object store, or with ``depth`` 1, each in turn."""
    import threading

    path, data = blob
    store = Store(os.path.dirname(path))
    threads = int(dask.config.get("l5dask.direct-read-threads"))
    together = threading.Barrier(min(4, threads), timeout=10)

    def read(i: int) -> bytes:
        if i < together.parties:
            together.wait()  # (BrokenBarrierError after 10 s if they were read one at a time)
        return diskread.read(path, i, i + 100)

    assert list(store.read_ahead(read, list(range(9)), 4)) == [data[i : i + 100] for i in range(9)]
    order: list[int] = []

    def in_turn(i: int) -> int:
        order.append(i)
        return i

    it = store.read_ahead(in_turn, list(range(5)), 1)
    assert order == [] and list(it) == list(range(5)) and order == list(range(5))


def test_the_compiled_read_in_part_refuses_what_its_caller_gets_wrong(tmp_path):
    """``l5dask.core._pread.read_part`` (a chunk read in part, its reads at once): arguments that
    would send a read outside its buffer or the chunk are refused before anything is read; a
    buffer too small for the planned reads keeps only the header (``SMALL``: the rest read as
    before); a missing file is its ``errno``."""
    from numcodecs import Blosc

    from l5dask.core.lazy import compiled

    pread = compiled("l5dask.core._pread")
    rec = np.random.default_rng(1).integers(0, 4, 40000, dtype=np.uint8)
    raw = Blosc("lz4", 5, Blosc.SHUFFLE, 4096).encode(rec)
    path = tmp_path / "0"
    path.write_bytes(raw)
    buf = diskread._buffer(1 << 20)
    args = (os.fsencode(path), False, -1, diskread.ALIGN, diskread.PAGE)
    for cuts in ([-1, 5], [0, 40001], [9, 3], [0, 5, 7]):
        with pytest.raises(ValueError, match="read_part: "):
            pread.read_part(*args, buf, 272, 40000, np.array(cuts, np.int64))
    with pytest.raises(ValueError, match="aligned"):
        pread.read_part(*args, np.frombuffer(buf, np.uint8)[1:], 272, 40000, np.array([0, 5], np.int64))
    status, size, _, pieces = pread.read_part(*args, buf, 272, 40000, np.array([20000, 20001], np.int64))
    assert status == pread.OK and size == len(raw) and len(pieces) == 2 and pieces[0] == (0, raw[:272])
    small = np.frombuffer(buf, np.uint8)[: 3 * diskread.ALIGN]
    status, _, _, pieces = pread.read_part(*args, small, 272, 40000, np.array([20000, 20001], np.int64))
    assert status == pread.SMALL and pieces == [(0, raw[:272])]
    missing = (os.fsencode(tmp_path / "missing"), *args[1:])
    status, size, _, pieces = pread.read_part(*missing, buf, 272, 40000, np.zeros(0, np.int64))
    assert (status, size, pieces) == (errno.ENOENT, -1, [])
