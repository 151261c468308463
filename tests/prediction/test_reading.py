"""The reader: exact values, one task per stored chunk, one decode per chunk, laziness."""

from __future__ import annotations

import hashlib
import os
import shutil
import zipfile
from pathlib import Path

import dask
import numpy as np
import pytest

import l5dask
import l5dask.prediction.reading as reading
from l5dask.core.store import Store
from l5dask.prediction import format as fmt
from tests.conftest import SMALL_CHUNKS, read_all


@pytest.fixture
def decode_log(monkeypatch):
    """Records every chunk decode as (array, chunk key)."""
    calls: list[tuple[str, str]] = []
    original = reading.decode_chunk

    def counting(raw, meta, compressed, key, out=None):
        calls.append((meta.name, key))
        return original(raw, meta, compressed, key, out=out)

    monkeypatch.setattr(reading, "decode_chunk", counting)
    return calls


@pytest.fixture
def get_log(monkeypatch):
    """Records every object read from any store."""
    keys: list[str] = []
    original = Store.get

    def logging_get(self, key, **kw):
        keys.append(key if (kw.get("start"), kw.get("end")) == (None, None) else (key, kw.get("start"), kw.get("end")))
        return original(self, key, **kw)

    monkeypatch.setattr(Store, "get", logging_get)
    return keys


def test_all_arrays_equal_l5kit_reference(small_ds):
    ref = read_all(small_ds)
    ds = l5dask.open_dataset(small_ds)
    for name, expected in ref.items():
        got = ds[name].to_dask().compute()
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)


def test_dask_chunks_are_stored_chunks(small_ds):
    ds = l5dask.open_dataset(small_ds)
    for name, arr in ds.arrays.items():
        x = arr.to_dask()
        n, rows = len(arr), SMALL_CHUNKS[name]
        expected = tuple(min(rows, n - i) for i in range(0, n, rows))
        assert x.chunks == (expected,)
        assert len(x.__dask_graph__()) == arr.meta.nchunks


def test_chunks_per_task_groups_whole_chunks(small_ds, decode_log):
    ds = l5dask.open_dataset(small_ds)
    agents = ds["agents"]
    x = agents.to_dask(fields=["track_id"], chunks_per_task=3)
    assert len(x.__dask_graph__()) == -(-agents.meta.nchunks // 3)
    assert all(c == 15_000 for c in x.chunks[0][:-1])
    np.testing.assert_array_equal(x.compute()["track_id"], read_all(small_ds)["agents"]["track_id"])
    assert sorted(decode_log) == sorted(("agents", str(i)) for i in range(agents.meta.nchunks))


def test_opening_reads_only_metadata(small_ds, get_log):
    """Metadata, and the 16-byte header of each array's last chunk (checked against the metadata
    before any graph is built); no chunk's data."""
    ds = l5dask.open_dataset(small_ds)
    _ = ds.agents, ds.frames, ds.to_datatree()
    headers = {(arr.meta.key(arr.meta.nchunks - 1), 0, 16) for arr in ds.arrays.values()}
    assert get_log and all(k in headers or k.startswith(".z") or k.endswith("/.zarray") for k in get_log)
    assert headers <= set(get_log)


def test_field_projection_decodes_each_chunk_once(small_ds, decode_log):
    ds = l5dask.open_dataset(small_ds)
    agents = ds["agents"]
    x = agents.to_dask(fields=["centroid", "velocity"])
    assert x.dtype.names == ("centroid", "velocity")
    c, v = dask.compute(x["centroid"], x["velocity"])
    ref = read_all(small_ds)["agents"]
    np.testing.assert_array_equal(c, ref["centroid"])
    np.testing.assert_array_equal(v, ref["velocity"])
    assert sorted(decode_log) == sorted(("agents", str(i)) for i in range(agents.meta.nchunks))


def test_xarray_variables_share_one_read(small_ds, decode_log, get_log):
    """Every variable of a view computed together: each stored chunk read once, and decoded at
    most once (its numbers are gathered from the compressed bytes: ``views.Block``)."""
    ds = l5dask.open_dataset(small_ds)
    get_log.clear()
    agents = ds.agents.compute()
    n = ds["agents"].meta.nchunks
    assert len(set(decode_log)) == len(decode_log) <= n
    chunks = [k for k in get_log if isinstance(k, str) and k.startswith("agents/") and not k.endswith("/.zarray")]
    assert sorted(chunks) == sorted(f"agents/{i}" for i in range(n))
    ref = read_all(small_ds)["agents"]
    for field in fmt.AGENT_DTYPE.names:
        np.testing.assert_array_equal(agents[field].values, ref[field])


def test_slicing_touches_only_overlapping_chunks(small_ds, decode_log):
    ds = l5dask.open_dataset(small_ds)
    x = ds["agents"].to_dask()
    part = x[9_990:10_020].compute()  # rows of chunks 1 and 2 only
    np.testing.assert_array_equal(part, read_all(small_ds)["agents"][9_990:10_020])
    assert sorted(decode_log) == [("agents", "1"), ("agents", "2")]


def test_read_chunk_padding_is_dropped(small_ds):
    ds = l5dask.open_dataset(small_ds)
    agents = ds["agents"]
    last = agents.meta.nchunks - 1
    tail = agents.read_chunk(last)
    assert len(tail) == len(agents) - last * agents.meta.chunk_rows


def _zip(src: str, dest: Path, inside_folder: bool) -> str:
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as zf:
        for f in Path(src).rglob("*"):
            if f.is_file():
                rel = f.relative_to(Path(src).parent if inside_folder else src)
                zf.write(f, rel.as_posix())
    return str(dest)


@pytest.mark.parametrize("inside_folder", [False, True])
def test_zip_of_folder(small_ds, tmp_path, inside_folder):
    path = _zip(small_ds, tmp_path / "small.zarr.zip", inside_folder)
    ds = l5dask.open_dataset(path)
    ref = read_all(small_ds)
    np.testing.assert_array_equal(ds["frames"].to_dask().compute(), ref["frames"])
    np.testing.assert_array_equal(ds.agents.track_id.values, ref["agents"]["track_id"])


def test_file_url(small_ds):
    ds = l5dask.open_dataset("file://" + small_ds)
    np.testing.assert_array_equal(ds["scenes"].to_dask().compute(), read_all(small_ds)["scenes"])


def test_a_local_folder_is_read_without_fsspec_until_its_filesystem_is_asked_for(small_ds, tmp_path, monkeypatch):
    """A plain path or ``file://`` URL is the folder fsspec's local filesystem names; its reads,
    and a report over it, never import fsspec (a child process); its filesystem, asked for, is
    fsspec's, and a store pickled and back reads the same."""
    import pickle
    import subprocess
    import sys

    from l5dask.core.store import local_folder

    monkeypatch.chdir(tmp_path)
    for url in ("rel/ds.zarr", "./rel/ds.zarr", "~/x.zarr", str(tmp_path) + "/", "file://" + small_ds):
        folder = local_folder(url, {})
        assert folder is not None and Store(url).root == folder.rstrip("/")
        from fsspec.core import url_to_fs

        assert Store(url).root == url_to_fs(url)[1].rstrip("/")
    assert local_folder("s3://bucket/ds", {}) is None and local_folder("zip::file://x.zip", {}) is None
    assert local_folder(small_ds, {"auto_mkdir": True}) is None  # (options: fsspec's)
    code = """
import sys
import l5dask
from l5dask.prediction.report import compute_report
ds = l5dask.open_dataset(sys.argv[1])
report = compute_report(sys.argv[1])
assert ds.store._fs is None
print(report["counts"]["agents"], "fsspec" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code, small_ds], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(len(read_all(small_ds)["agents"])), "False"]
    store = Store(small_ds)
    again = pickle.loads(pickle.dumps(store))
    assert again.root == store.root and again.local and not again.remote
    assert again.get(".zgroup") == Path(small_ds, ".zgroup").read_bytes()
    assert type(store.fs).__name__ == "LocalFileSystem" and store.fs.isfile(store.path(".zgroup"))
    assert store.local and dask.base.tokenize(store) == dask.base.tokenize(again)


def test_old_format_without_traffic_lights_warns(tmp_path):
    path = str(tmp_path / "old.zarr")
    l5dask.synthesize(path, num_scenes=1, seed=1, traffic_lights=False)
    with pytest.warns(RuntimeWarning, match="no traffic_light_faces array"):
        ds = l5dask.open_dataset(path)
    assert not ds.has(fmt.TL_FACES)
    assert "traffic_light_faces_index_interval" not in ds.frames
    assert ds.counts()["tl_faces"] == 0


def test_unknown_extra_arrays_are_ignored(small_ds, tmp_path):
    path = tmp_path / "extra.zarr"
    shutil.copytree(small_ds, path)
    (path / "agents_mask").mkdir()
    (path / "agents_mask" / ".zarray").write_text('{"zarr_format": 2, "dtype": "|O"}')
    (path / "agents_mask" / "0").write_bytes(b"\x80\x04junk")
    ds = l5dask.open_dataset(str(path))
    assert set(ds.arrays) == set(fmt.ARRAY_NAMES)
    assert len(ds["agents"].to_dask().compute()) == len(ds["agents"])


@pytest.mark.parametrize("kind", ["zip", "tar"])
def test_archive_reads_from_many_threads_get_their_own_bytes(tmp_path, kind):
    """Tasks read an archive from several threads at once (the tables, the lidar sweeps): each read
    returns its own file's bytes (fsspec's tar shares one file object without a lock)."""
    import tarfile
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(1)
    files = {f"d/f{i}.bin": rng.bytes(int(rng.integers(1, 300_000))) for i in range(64)}
    path = tmp_path / f"a.{kind}"
    if kind == "zip":
        with zipfile.ZipFile(path, "w") as z:
            for name, data in files.items():
                z.writestr(name, data)
    else:
        src = tmp_path / "src"
        with tarfile.open(path, "w") as t:
            for name, data in files.items():
                (src / name).parent.mkdir(parents=True, exist_ok=True)
                (src / name).write_bytes(data)
                t.add(src / name, arcname=name)
    store = Store(str(path))
    names = list(files) * 4
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda n: store.get(n), names))
    assert all(g == files[n] for n, g in zip(names, got))


def test_a_task_on_a_local_disk_hints_its_next_chunks_in_order(small_ds, monkeypatch):
    """Cold, a task would wait for each read: it tells the kernel (posix_fadvise) which chunks it
    reads next, its own after the first and then the tasks' next to it on both sides (dask may run
    them in either order), each named once, none past the array's ends, and reads the same bytes
    as without the hints."""
    from l5dask.core.store import Store

    hinted: list[str] = []
    will_need = Store.will_need
    monkeypatch.setattr(
        Store, "will_need", lambda self, keys, ranges=None: hinted.extend(keys) or will_need(self, keys, ranges)
    )
    agents = l5dask.open_dataset(small_ds)["agents"]
    n = agents.nchunks
    got = [rows.copy() for _, rows in agents.iter_chunks(n - 4, 3)]
    # its own, then the task's before it and after it
    assert hinted == [agents.meta.key(i) for i in (n - 3, n - 2, n - 7, n - 6, n - 5, n - 1)]
    hinted.clear()
    list(agents.iter_chunks(n - 2, 2))
    assert hinted == [agents.meta.key(i) for i in (n - 1, n - 4, n - 3)]  # nothing past the end
    hinted.clear()
    list(agents.iter_chunks(0, 2))
    assert hinted == [agents.meta.key(i) for i in (1, 2, 3)]  # nothing before the start
    want = agents.read(n - 4, 3)
    np.testing.assert_array_equal(np.concatenate(got).view(np.uint8), want.view(np.uint8))


def test_chunk_identities_name_each_chunk_its_rows_and_its_files_stat(tmp_path):
    # L5Array.chunk_identities, one string a chunk: the layout's digest, the chunk's path, its rows
    # and its file's identity (its stat); for a dataset's arrays and N-D arrays whose chunk keys
    # carry ".0" (in the array's folder) or "/0" (in a folder a chunk)
    def expected(arr: reading.L5Array) -> list[str]:
        meta = arr.meta
        layout = repr((meta.name, str(meta.dtype.descr), meta.chunk_rows, arr.compressed, arr.store.url))
        prefix = hashlib.blake2b(layout.encode(), digest_size=10).hexdigest()
        out = []
        for i in range(meta.nchunks):
            folder, _, name = meta.key(i).rpartition("/")
            st = os.stat(arr.store.path(meta.key(i)))
            a, b = meta.chunk_bounds(i)
            ident = f"stat:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"
            out.append(f"{prefix}|{arr.store.path(folder)}/{name}|{a}:{b}|{ident}")
        return out

    path = str(tmp_path / "d.zarr")
    l5dask.synthesize(path, num_scenes=3, seed=2, chunk_rows={"frames": 100, "agents": 1000})
    ds = l5dask.open_dataset(path)
    for name in ("frames", "agents"):
        assert len(ds[name].chunk_identities()) == ds[name].meta.nchunks > 1
        assert ds[name].chunk_identities() == expected(ds[name])
    store = Store(str(tmp_path))
    for separator in (".", "/"):
        dtype = np.dtype([("value", np.uint32, (2,))])
        meta = fmt.ArrayMeta(f"mask{separator == '/'}", dtype, 25, 10, (2,), separator)
        for i in range(meta.nchunks):
            os.makedirs(os.path.dirname(os.path.join(str(tmp_path), meta.key(i))), exist_ok=True)
            with open(os.path.join(str(tmp_path), meta.key(i)), "wb") as f:
                f.write(bytes(i + 1))
        arr = reading.L5Array(store, meta)
        assert arr.chunk_identities() == expected(arr)
        assert len(set(arr.chunk_identities())) == 3


def _edge_ranges(kind: str, rows: int, per_block: float, blocks: int) -> list[tuple[int, int]]:
    """Row ranges of a chunk of ``rows`` rows in ``blocks`` blosc blocks of ``per_block`` rows
    (sorted, disjoint; block numbers past the chunk's last block taken as its last)."""
    at = lambda b: min(rows, int(min(b, blocks - 1) * per_block))  # noqa: E731 - a block's first row
    ranges = {
        "the first row": [(0, 1)],
        "inside one block": [(at(2) + 3, at(2) + 9)],
        "the last full block and the short one": [(at(blocks - 2), rows)],
        "the short last block alone": [(rows - 5, rows)],
        "the first and the last block": [(0, 4), (rows - 2, rows)],
        "two neighbouring blocks": [(at(3) - 2, at(3) + 2)],
        "every block": [(0, rows)],
        "three runs": [(1, 2), (at(4), at(4) + 1), (at(blocks - 3), at(blocks - 1))],
    }[kind]
    out: list[list[int]] = []
    for lo, hi in sorted((max(0, lo), min(rows, hi)) for lo, hi in ranges):
        if hi <= lo:
            continue
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


@pytest.mark.parametrize(
    "codec",
    [
        dict(cname="lz4", clevel=5, shuffle=1, blocksize=16384),  # byte shuffle
        dict(cname="zstd", clevel=3, shuffle=2, blocksize=16384),  # bit shuffle
        dict(cname="blosclz", clevel=1, shuffle=0, blocksize=16384),  # no shuffle
        dict(cname="lz4", clevel=0, shuffle=1, blocksize=16384),  # stored as it is (memcpyed)
        dict(cname="lz4", clevel=5, shuffle=1, blocksize=2048),  # 114 blocks: starts past the header's 64
        dict(cname="lz4", clevel=5, shuffle=1, blocksize=0),  # blosc's own block size
    ],
    ids=["shuffle", "bitshuffle", "noshuffle", "memcpyed", "114-blocks", "auto-blocks"],
)
@pytest.mark.parametrize(
    "kind",
    [
        "the first row",
        "inside one block",
        "the last full block and the short one",
        "the short last block alone",
        "the first and the last block",
        "two neighbouring blocks",
        "every block",
        "three runs",
    ],
)
def test_the_compiled_reads_of_a_chunk_in_part_at_its_edges(codec, kind):
    """The compiled reader of a local chunk in part (``l5dask.core._pread.read_part``) against the
    Python path at the edges of its plan: the first and the last block, a range inside one block,
    the chunk's last, short block (alone: the whole chunk read), every block, runs of blocks far
    apart and touching; byte, bit and no shuffle, a chunk stored as it is, more block starts than
    the header read holds; through the page cache, and around it cold. The same reads, the same
    bytes, the rows those of the whole chunk decoded (``tests/partial_reference.py``)."""
    import struct

    from numcodecs import Blosc

    from tests.partial_reference import compiled_read_verdict

    dtype, chunk_rows, index = fmt.AGENT_DTYPE, 2000, 1
    rec = np.zeros(chunk_rows, dtype)
    rec.view(np.uint8)[:] = np.random.default_rng(3).integers(0, 5, rec.nbytes, dtype=np.uint8)
    raw = Blosc(**codec).encode(rec)
    flags, nbytes, blocksize = raw[2], *struct.unpack_from("<ii", raw, 4)
    assert nbytes % blocksize or flags & 0x02  # (a short last block)
    blocks = -(-nbytes // blocksize)
    start = index * chunk_rows
    ranges = [(start + a, start + b) for a, b in _edge_ranges(kind, chunk_rows, blocksize / dtype.itemsize, blocks)]
    meta = fmt.ArrayMeta("agents", dtype, 3 * chunk_rows, chunk_rows)
    for direct, cold in ((False, False), (True, True), (True, False)):
        got, how = compiled_read_verdict(raw, meta, index, ranges, direct, cold)
        assert not isinstance(got, str), got
        if flags & 0x02 or blocks <= 64:
            assert "as Python's" in how, how
        for (lo, hi), rows in zip(ranges, got.decode(meta, index, ranges)):
            assert rows.tobytes() == rec[lo - start : hi - start].tobytes()
