"""The xarray face: one Dataset per stored array, a DataTree for the whole dataset.

Variables are made from one dask array of records per stored array, so computing
several variables together decodes each chunk once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import xarray as xr
from xarray.backends import BackendArray, BackendEntrypoint
from xarray.core import indexing

from . import format as fmt

#: The row dimension of each array.
ROW_DIMS = {fmt.SCENES: "scene", fmt.FRAMES: "frame", fmt.AGENTS: "agent", fmt.TL_FACES: "tl_face"}


def _field_dims(field: str, shape: tuple[int, ...]) -> tuple[tuple[str, ...], dict[str, Sequence[str]]]:
    """Named extra dimensions (and their coordinates) for a subarray field."""
    known = fmt.FIELD_DIMS.get(field)
    if known and len(known[0]) == len(shape):
        dims, labels = known
        coords = {d: list(c) for d, c, n in zip(dims, labels, shape) if c is not None and len(c) == n}
        return dims, coords
    return tuple(f"{field}_dim_{i}" for i in range(len(shape))), {}


def array_to_dataset(
    ds, name: str, fields: Sequence[str] | None = None, chunks_per_task: int = 1
) -> xr.Dataset:
    """An ``xarray.Dataset`` of one stored array, a variable per field, lazily backed."""
    array = ds[name]
    records = array.to_dask(fields=fields, chunks_per_task=chunks_per_task)
    row = ROW_DIMS[name]
    variables = {}
    coords: dict[str, object] = {}
    for field in records.dtype.names:
        sub = records.dtype.fields[field][0]
        data = records[field]
        dims, field_coords = _field_dims(field, sub.shape)
        if name == fmt.AGENTS and field == "label_probabilities":
            field_coords = {"label": list(ds.labels)}
        variables[field] = ((row, *dims), data)
        coords.update(field_coords)
    out = xr.Dataset(variables, coords=coords)
    out.attrs.update({"l5kit_array": name, "source": ds.url, "chunk_rows": array.meta.chunk_rows})
    if name == fmt.AGENTS:
        out.attrs["labels"] = list(ds.labels)
    return out


def joined_dataset(ds, name: str) -> xr.Dataset:
    """:func:`array_to_dataset` plus lazy coordinates from the interval joins.

    frames: ``scene_index``; agents and tl_faces: ``frame_index``, ``scene_index``,
    ``timestamp`` (of their frame); agents also ``ego_translation`` (of their frame).
    Building the view reads nothing; computing its coordinates together decodes each scene
    and frame chunk once (see :mod:`l5dask.joins`).
    """
    from .joins import Joins

    j = Joins(ds)
    out = array_to_dataset(ds, name)
    row = ROW_DIMS[name]
    if name == fmt.FRAMES:
        return out.assign_coords(scene_index=(row, j.frame_scene()))
    if name in (fmt.AGENTS, fmt.TL_FACES):
        coords = {"frame_index": (row, j.column(name, "index")),
                  "scene_index": (row, j.column(name, "scene")),
                  "timestamp": (row, j.column(name, "timestamp"))}
        if name == fmt.AGENTS:
            coords["ego_translation"] = ((row, "xyz"), j.column(name, "ego_translation"))
            return out.assign_coords(coords).assign_coords(xyz=["x", "y", "z"])
        return out.assign_coords(coords)
    return out


def dataset_to_datatree(ds) -> xr.DataTree:
    """The whole dataset as a DataTree with one child node per stored array."""
    children = {fmt.SHORT_NAMES[n]: array_to_dataset(ds, n) for n in fmt.ARRAY_NAMES if ds.has(n)}
    root = xr.Dataset(attrs=_root_attrs(ds))
    return xr.DataTree.from_dict({"/": root, **children})


class ChunkCache:
    """Decoded chunks shared by all variables of an array, within one process.

    A chunk requested by several variables at once is decoded by the first and
    waited for by the others (single flight); least recently used chunks are
    dropped past ``max_bytes``.
    """

    def __init__(self, max_bytes: int = 512 * 2**20) -> None:
        self.max_bytes = max_bytes
        self._data: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self._locks: dict[tuple, threading.Lock] = {}
        self._lock = threading.Lock()
        self._bytes = 0

    def get(self, key: tuple, load) -> np.ndarray:
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            with self._lock:
                if key in self._data:
                    return self._data[key]
            value = load()
            with self._lock:
                self._data[key] = value
                self._bytes += value.nbytes
                self._locks.pop(key, None)
                while self._bytes > self.max_bytes and len(self._data) > 1:
                    _, old = self._data.popitem(last=False)
                    self._bytes -= old.nbytes
            return value


_CACHE = ChunkCache()


class L5BackendArray(BackendArray):
    """One field of a stored array, for xarray's lazy indexing; chunks come from :data:`_CACHE`."""

    def __init__(self, array, field: str) -> None:
        self.array, self.field = array, field
        sub = array.dtype.fields[field][0]
        self.shape = (len(array), *sub.shape)
        self.dtype = sub.base

    def __getitem__(self, key):
        return indexing.explicit_indexing_adapter(
            key, self.shape, indexing.IndexingSupport.BASIC, self._getitem
        )

    def _chunk(self, index: int) -> np.ndarray:
        a = self.array
        cache_key = (a.store.url, a.store.root, a.name, index)
        return _CACHE.get(cache_key, lambda: a.read_chunk(index))

    def _getitem(self, key: tuple) -> np.ndarray:
        rows, rest = key[0], key[1:]
        n, size = self.shape[0], self.array.meta.chunk_rows
        if isinstance(rows, (int, np.integer)):
            rows = int(rows) + (n if rows < 0 else 0)
            return self._chunk(rows // size)[rows % size][self.field][rest]
        start, stop, step = rows.indices(n)
        if start >= stop:
            return np.empty((0, *self.shape[1:]), dtype=self.dtype)[(slice(None), *rest)]
        parts = []
        for c in range(start // size, (stop - 1) // size + 1):
            lo, hi = max(start, c * size), min(stop, (c + 1) * size)
            parts.append(self._chunk(c)[lo - c * size : hi - c * size][self.field])
        out = np.concatenate(parts) if len(parts) > 1 else parts[0]
        return out[(slice(None, None, step), *rest)]


def _lazy_dataset(ds, name: str, fields) -> xr.Dataset:
    """The same Dataset as :func:`array_to_dataset`, over lazily indexed backend arrays."""
    array = ds[name]
    template = array_to_dataset(ds, name, fields=fields)
    variables = {}
    for field, var in template.data_vars.items():
        data = indexing.LazilyIndexedArray(L5BackendArray(array, field))
        encoding = {"preferred_chunks": {ROW_DIMS[name]: array.meta.chunk_rows}}
        variables[field] = xr.Variable(var.dims, data, encoding=encoding)
    return xr.Dataset(variables, coords=template.coords, attrs=template.attrs)


class L5KitBackendEntrypoint(BackendEntrypoint):
    """xarray's ``engine="l5kit"``: ``xr.open_dataset(url, engine="l5kit", group="agents")``,
    ``xr.open_datatree(url, engine="l5kit")``.

    Variables are lazily indexed; ``chunks={}`` gives the stored chunks. For one
    decode per chunk across a whole cluster, use ``l5dask.open_dataset(url).agents``
    (a single dask layer of records) instead.
    """

    description = "Open Lyft Level 5 (L5Kit) zarr datasets lazily, chunk for chunk"
    url = "https://github.com/l5dask/l5dask"
    open_dataset_parameters = ("filename_or_obj", "drop_variables", "group", "storage_options")

    def open_dataset(  # type: ignore[override]
        self,
        filename_or_obj,
        *,
        drop_variables=None,
        group: str | None = None,
        storage_options: dict | None = None,
    ) -> xr.Dataset:
        from .reading import open_dataset

        ds = open_dataset(filename_or_obj, storage_options=storage_options)
        name = _group_name(group or "agents")
        fields = None
        if drop_variables:
            drop = {drop_variables} if isinstance(drop_variables, str) else set(drop_variables)
            fields = [f for f in ds[name].dtype.names if f not in drop]
        return _lazy_dataset(ds, name, fields)

    def open_groups_as_dict(self, filename_or_obj, *, storage_options: dict | None = None, **kwargs):
        from .reading import open_dataset

        ds = open_dataset(filename_or_obj, storage_options=storage_options)
        root = xr.Dataset(attrs=_root_attrs(ds))
        groups = {"/": root}
        for n in fmt.ARRAY_NAMES:
            if ds.has(n):
                groups[f"/{fmt.SHORT_NAMES[n]}"] = _lazy_dataset(ds, n, None)
        return groups

    def open_datatree(self, filename_or_obj, *, storage_options: dict | None = None, **kwargs) -> xr.DataTree:
        groups = self.open_groups_as_dict(filename_or_obj, storage_options=storage_options)
        return xr.DataTree.from_dict(groups)

    def guess_can_open(self, filename_or_obj) -> bool:
        return False


def _root_attrs(ds) -> dict:
    return {k: v for k, v in ds.attrs.items() if isinstance(v, (int, str))} | {"source": ds.url}


def _group_name(group: str) -> str:
    group = group.strip("/")
    long = {v: k for k, v in fmt.SHORT_NAMES.items()}
    return long.get(group, group)
