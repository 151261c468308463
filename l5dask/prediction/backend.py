"""xarray's ``engine="l5kit"``: a thin translator from xarray's backend interface to
:func:`l5dask.open_dataset <l5dask.prediction.dataset.open_dataset>` (as rioxarray's plugin is to rasterio), with lazily indexed variables
(``L5BackendArray``) whose decoded chunks are cached per opened array."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Any

import numpy as np
import xarray as xr
from xarray.backends import BackendArray, BackendEntrypoint
from xarray.core import indexing

from l5dask.prediction import format as fmt
from l5dask.prediction.dataset import open_dataset
from l5dask.prediction.views import ROW_DIMS, array_to_dataset, root_attrs


class ChunkCache:
    """Decoded chunks shared by all variables of one array of one opened dataset (held by the
    dataset's variables: a dataset rewritten in place and opened again reads its new chunks).

    A chunk requested by several variables at once is decoded by the first and
    waited for by the others (single flight); least recently used chunks are
    dropped past ``max_bytes``.
    """

    def __init__(self, max_bytes: int = 256 * 2**20) -> None:
        self.max_bytes = max_bytes
        self._data: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self._locks: dict[tuple, threading.Lock] = {}
        self._lock = threading.Lock()
        self._bytes = 0

    def get(self, key: Any, load) -> np.ndarray:
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


class L5BackendArray(BackendArray):
    """One field of a stored array, for xarray's lazy indexing; decoded chunks come from the cache
    of the opened dataset's array (shared by its fields: one decode per chunk).

    The array is kept as ``_array``, with ``__slots__``, as xarray's own backend arrays do: callers
    evaluate anything that has an ``array`` attribute."""

    __slots__ = ("_array", "_cache", "field", "shape", "dtype")

    def __init__(self, array, field: str, cache: ChunkCache) -> None:
        self._array, self._cache, self.field = array, cache, field
        sub = fmt.fields_of(array.dtype)[field][0]
        self.shape = (len(array), *sub.shape)
        self.dtype = sub.base

    def __getitem__(self, key):
        return indexing.explicit_indexing_adapter(key, self.shape, indexing.IndexingSupport.BASIC, self._getitem)

    def _chunk(self, index: int) -> np.ndarray:
        return self._cache.get(index, lambda: self._array.read_chunk(index))

    def _getitem(self, key: tuple) -> np.ndarray:
        rows, rest = key[0], key[1:]
        n, size = self.shape[0], self._array.meta.chunk_rows
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
    """The same Dataset as ``array_to_dataset``, over lazily indexed backend arrays."""
    array = ds[name]
    template = array_to_dataset(ds, name, fields=fields)
    variables = {}
    cache = ChunkCache()
    for field, var in template.data_vars.items():
        data = indexing.LazilyIndexedArray(L5BackendArray(array, str(field), cache))
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
    supports_groups = True
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
        ds = open_dataset(filename_or_obj, storage_options=storage_options)
        name = _group_name(group or "agents")
        fields = None
        if drop_variables:
            drop = {drop_variables} if isinstance(drop_variables, str) else set(drop_variables)
            fields = [f for f in fmt.names_of(ds[name].dtype) if f not in drop]
        return _lazy_dataset(ds, name, fields)

    def open_groups_as_dict(self, filename_or_obj, *, storage_options: dict | None = None, **kwargs):
        ds = open_dataset(filename_or_obj, storage_options=storage_options)
        root = xr.Dataset(attrs=root_attrs(ds))
        groups = {"/": root}
        for n in fmt.ARRAY_NAMES:
            if ds.has(n):
                groups[f"/{fmt.SHORT_NAMES[n]}"] = _lazy_dataset(ds, n, None)
        return groups

    def open_datatree(self, filename_or_obj, *, storage_options: dict | None = None, **kwargs) -> xr.DataTree:
        groups = self.open_groups_as_dict(filename_or_obj, storage_options=storage_options)
        return xr.DataTree.from_dict(groups)

    def guess_can_open(self, filename_or_obj) -> bool:
        """A local folder that holds L5Kit's four arrays (two file checks, nothing read); any
        other location is opened by naming the engine."""
        if not isinstance(filename_or_obj, (str, os.PathLike)):
            return False
        path = os.fspath(filename_or_obj)
        return (
            "://" not in path
            and os.path.isfile(os.path.join(path, ".zgroup"))
            and os.path.isfile(os.path.join(path, fmt.AGENTS, ".zarray"))
        )


def _group_name(group: str) -> str:
    group = group.strip("/")
    long = {v: k for k, v in fmt.SHORT_NAMES.items()}
    return long.get(group, group)
