"""Writing datasets in exactly L5Kit's on-disk format (zarr v2, blosc lz4, byte shuffle).

Chunks are written in parallel (a dask task per chunk) or streamed (:class:`ArrayWriter`).
The group metadata (``.zgroup``) is written last, so an interrupted write never leaves
something that opens as a complete dataset.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
from dask.base import tokenize

from l5dask.core.engine import Job
from l5dask.core.outputs import probe_folder
from l5dask.core.store import Store, archive_kind, output_folder, some_names
from l5dask.errors import OutputError, UsageError
from l5dask.prediction import format as fmt


@functools.cache
def _blosc() -> Any:
    """L5Kit's compressor (numcodecs imported when first a chunk is written: see ``codec._decoder``)."""
    from numcodecs import Blosc

    return Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE, blocksize=0)


def encode_chunk(records: np.ndarray, chunk_rows: int, flat: bool = False) -> bytes:
    """Pad ``records`` with the all-zero fill record to ``chunk_rows`` and blosc-encode them
    (``flat``: records of an N-D number array, encoded as its numbers, as zarr-python 2 does)."""
    if len(records) > chunk_rows:
        raise ValueError(f"a chunk holds at most {chunk_rows} rows, got {len(records)}")
    if len(records) < chunk_rows:
        full = np.zeros(chunk_rows, dtype=records.dtype)
        full[: len(records)] = records
        records = full
    records = np.ascontiguousarray(records)
    return _blosc().encode(records.view(fmt.fields_of(records.dtype)["value"][0].base) if flat else records)


def put(store: Store, key: str, data: bytes) -> None:
    path = store.path(key)
    if _is_local(store):
        # A plain file write (fsspec's costs as much again per chunk), the folder made when missing.
        # An existing file is overwritten in place and then cut to length, not truncated first:
        # truncating frees its blocks only for the write to allocate them again (on this ext4 with
        # discard, 3,000 small files rewritten took 0.5-0.7 s of kernel time truncated, 0.04 s in place).
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            view, done = memoryview(data).cast("B"), 0
            while done < len(view):
                done += os.write(fd, view[done:])
            os.ftruncate(fd, done)
        finally:
            os.close(fd)
        return
    store.fs.pipe_file(path, data)


def _is_local(store: Store) -> bool:
    proto = store.fs.protocol
    return "file" in (proto if isinstance(proto, (tuple, list)) else (proto,))


def write_block(store: Store, name: str, index: int, records: np.ndarray, chunk_rows: int) -> int:
    """Encode and store chunk ``index`` of array ``name``; returns the rows written."""
    put(store, f"{name}/{index}", encode_chunk(records, chunk_rows))
    return len(records)


def write_chunks(store: Store, meta: fmt.ArrayMeta, first: int, records: np.ndarray) -> int:
    """Encode and store ``records`` as the stored chunks ``first, first + 1, ...`` of ``meta``."""
    rows = meta.chunk_rows
    for i in range(0, len(records), rows):
        put(store, meta.key(first + i // rows), encode_chunk(records[i : i + rows], rows, bool(meta.tail)))
    return len(records)


def prepare_target(url: Any, storage_options: dict | None, overwrite: bool, remove: bool = True) -> Store:
    """Open a location for writing a dataset; refuse (one line) a folder that holds anything a
    dataset does not (:func:`~l5dask.prediction.format.dataset_key`: a user's files, at any depth,
    are never deleted), and one that holds a dataset (or part of one) unless ``overwrite``.
    ``remove=False``: check only (the caller writes beside it and replaces it whole,
    :func:`~l5dask.core.outputs.atomic_output`)."""
    store = Store(output_folder(url, "a dataset"), storage_options)
    if (
        store.local and store.root and archive_kind(store.url) is None
    ):  # (a folder no file can be made in: one line now)
        folder = os.path.abspath(store.root)
        while not os.path.exists(folder):
            folder = os.path.dirname(folder)
        if not os.path.isdir(folder):
            raise OutputError(f"{store.url}: {folder} is a file, not a folder")
        probe_folder(folder, store.url)
    try:
        files = store.files()
    except PermissionError as exc:
        raise OutputError(f"{store.url}: access denied ({exc})") from exc
    other = [k for k in files if not fmt.dataset_key(k)]
    if other and any(fmt.export_key(k) for k in files) and all(fmt.export_key(k) or fmt.dataset_key(k) for k in files):
        raise OutputError(f"{store.url}: is an export, not a dataset; write elsewhere (only a dataset is replaced)")
    if other:  # (overwrite replaced a whole folder: `subset DS -o FOLDER_OF_DS --overwrite` deleted DS)
        raise OutputError(
            f"{store.url}: the folder holds {some_names(other)}, which is not a dataset's; write to a new or "
            "empty folder (only a dataset is replaced)"
        )
    exists = ".zgroup" in files
    if files and not overwrite:
        raise OutputError(
            f"{store.url}: a dataset already exists there (pass overwrite=True / --overwrite)"
            if exists
            else f"{store.url}: part of a dataset is there (a run stopped part way?); pass overwrite=True / "
            "--overwrite to replace it"
        )
    if remove and overwrite and files:
        # Remove the group metadata first: from here on the old dataset no longer looks complete.
        if exists:
            store.fs.rm(store.path(".zgroup"))
        store.fs.rm(store.root, recursive=True)
    return store


def finish(store: Store, metas: Mapping[str, tuple[np.dtype, int, int] | fmt.ArrayMeta], labels=fmt.LABELS) -> None:
    """Write each array's ``.zarray`` (and the ``.zgroup`` of a subgroup such as ``agents_mask``),
    then ``.zattrs``, then the dataset's ``.zgroup`` last."""
    groups: set[str] = set()
    for name, meta in metas.items():
        dtype, length, chunk_rows, tail = (
            (meta.dtype, meta.length, meta.chunk_rows, meta.tail) if isinstance(meta, fmt.ArrayMeta) else (*meta, ())
        )
        put(store, f"{name}/.zarray", fmt.zarray_json(dtype, length, chunk_rows, tail))
        parts = name.split("/")
        groups.update("/".join(parts[:i]) for i in range(1, len(parts)))
    for group in sorted(groups):
        put(store, f"{group}/.zgroup", fmt.ZGROUP_JSON)
    put(store, ".zattrs", fmt.zattrs_json(tuple(labels)))
    put(store, ".zgroup", fmt.ZGROUP_JSON)


def _validate(name: str, array: Any) -> np.dtype:
    dtype = np.dtype(array.dtype)
    if getattr(array, "ndim", 1) != 1:
        raise UsageError(f"array {name!r} must be 1-D, got {array.ndim} dimensions")
    fmt.check_fields(name, dtype, f"array {name!r}")
    if any(dtype.fields[f][0].base.kind == "O" for f in dtype.names):
        raise UsageError(f"array {name!r} has object fields, which L5Kit's format cannot hold")
    return dtype


def write_dataset(
    url: Any,
    arrays: Mapping[str, Any],
    *,
    storage_options: dict | None = None,
    labels: tuple[str, ...] = fmt.LABELS,
    overwrite: bool = False,
    chunk_rows: Mapping[str, int] | None = None,
    scheduler: Any = None,
) -> Store:
    """Write structured arrays as an L5Kit dataset, a dask task per stored chunk.

    Parameters
    ----------
    url : str or path
        Destination folder or fsspec URL (``s3://bucket/prefix``...).
    arrays : mapping
        ``{"scenes": ..., "frames": ..., "agents": ..., "traffic_light_faces": ...}``:
        numpy or dask structured arrays (``traffic_light_faces`` may be left out for
        the older format). Short name ``tl_faces`` is accepted too.
    chunk_rows : mapping, optional
        Rows per stored chunk, by array; L5Kit's sizes by default.
    scheduler : optional
        Where the tasks run (a ``distributed.Client`` or its address, ``"threads"``...; default:
        the active client, else local threads), as every function of the package takes it.
    """
    import dask.array as da

    long = {v: k for k, v in fmt.SHORT_NAMES.items()}
    arrays = {long.get(k, k): v for k, v in arrays.items()}
    missing = [n for n in (fmt.SCENES, fmt.FRAMES, fmt.AGENTS) if n not in arrays]
    if missing:
        raise UsageError(f"cannot write a dataset without the array(s) {', '.join(missing)}")
    dtypes = {name: _validate(name, a) for name, a in arrays.items()}
    store = prepare_target(url, storage_options, overwrite)
    rows = {n: (chunk_rows or {}).get(n, fmt.CHUNK_ROWS.get(n, 10_000)) for n in arrays}
    calls: list[tuple] = []
    for name, array in arrays.items():
        if not isinstance(array, da.Array):
            array = da.from_array(np.asarray(array), chunks=rows[name], name=f"l5-src-{tokenize(array)}")
        array = array.rechunk(rows[name])
        blocks = array.to_delayed().ravel()
        calls += [(store, name, i, b, rows[name]) for i, b in enumerate(blocks)]
    Job.of(scheduler).map(write_block, calls, "l5-write")
    finish(store, {n: (dtypes[n], len(arrays[n]), rows[n]) for n in arrays}, labels)
    return store


class ArrayWriter:
    """Append records to one array; full chunks are encoded and stored in background threads."""

    def __init__(self, store: Store, name: str, dtype: np.dtype, chunk_rows: int, pool: ThreadPoolExecutor) -> None:
        self.store, self.name, self.dtype, self.chunk_rows, self.pool = store, name, dtype, chunk_rows, pool
        self.buffer = np.empty(chunk_rows, dtype=dtype)
        self.filled = 0
        self.length = 0
        self.next_chunk = 0
        self.pending: list[Future] = []

    def append(self, records: np.ndarray) -> None:
        pos = 0
        while pos < len(records):
            take = min(self.chunk_rows - self.filled, len(records) - pos)
            self.buffer[self.filled : self.filled + take] = records[pos : pos + take]
            self.filled += take
            pos += take
            if self.filled == self.chunk_rows:
                self._flush()
        self.length += len(records)

    def _flush(self) -> None:
        block, self.buffer = self.buffer[: self.filled], np.empty(self.chunk_rows, dtype=self.dtype)
        self.pending.append(
            self.pool.submit(write_block, self.store, self.name, self.next_chunk, block, self.chunk_rows)
        )
        self.next_chunk += 1
        self.filled = 0
        if len(self.pending) > 8:  # bound the memory held by chunks not yet written
            done, self.pending = self.pending[:-8], self.pending[-8:]
            for f in done:
                f.result()

    def close(self) -> tuple[np.dtype, int, int]:
        if self.filled:
            self._flush()
        for f in self.pending:
            f.result()
        self.pending = []
        return self.dtype, self.length, self.chunk_rows
