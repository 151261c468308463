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
from xarray.groupers import EncodedGroups, UniqueGrouper

from l5dask.prediction import format as fmt
from l5dask.errors import UnknownNameError, UsageError

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


def _argmax_block(records: np.ndarray, field: str) -> np.ndarray:
    from l5dask.prediction.kernels import argmax_rows

    return argmax_rows(records, field)


def _hour_block(timestamp: np.ndarray) -> np.ndarray:
    from l5dask.prediction.columns import hour_of_day

    return hour_of_day(timestamp)


def categorical_attrs(names: Sequence[str]) -> dict:
    """CF attributes of a coordinate of category codes: its values and their names."""
    return {"flag_values": np.arange(len(names), dtype=np.int64), "flag_meanings": " ".join(names)}


def range_attrs(n: int) -> dict:
    """CF attributes of a coordinate of indices ``0 .. n - 1``: the values it can take."""
    return {"valid_range": np.array([0, max(n - 1, 0)], dtype=np.int64)}


def joined_dataset(ds, name: str, chunks_per_task: int | None = None) -> xr.Dataset:
    """:func:`array_to_dataset` plus lazy coordinates from the interval joins.

    frames: ``scene_index``, ``host``; agents and tl_faces: ``frame_index``, ``scene_index``,
    ``timestamp``, ``hour`` (UTC hour of day), ``host`` of their frame; agents also ``label``
    (the argmax of ``label_probabilities``, whose dimension is then ``label_name``) and the
    variable ``ego_translation`` (of their frame); tl_faces ``status`` (its probabilities' dimension
    ``status_name``). Coordinates of categories (``label``, ``host``, ``status``) hold codes
    with CF ``flag_values``/``flag_meanings``; index coordinates a CF ``valid_range``: so they
    know their values, and ``.l5.groupby(...)`` groups by them without being computed first.

    Building the view reads only the scenes' host names (one small chunk); computing its
    coordinates together decodes each scene and frame chunk once (see :mod:`l5dask.prediction.joins`), and
    ``label`` comes from the same decoded agent chunks as the variables.
    """
    import dask.array as da

    from l5dask.prediction.columns import Table
    from l5dask.prediction.joins import Joins

    from l5dask.core.engine import collection_chunks_per_task

    per_task = chunks_per_task or collection_chunks_per_task(ds[name].nchunks)
    j = Joins(ds, chunks_per_task=per_task)
    hosts = Table(ds, name).host_names() if name != fmt.SCENES else None
    out = array_to_dataset(ds, name, chunks_per_task=per_task)
    row = ROW_DIMS[name]
    n_scenes, n_frames = len(ds[fmt.SCENES]), len(ds[fmt.FRAMES])
    if name == fmt.SCENES:
        return out
    if name == fmt.FRAMES:
        j._frames.hosts = hosts
        return out.assign_coords(
            scene_index=(row, j.frame_scene(), range_attrs(n_scenes)),
            host=(row, j.column(name, "host"), categorical_attrs(hosts)))
    j._frames.hosts = hosts
    coords = {"frame_index": (row, j.column(name, "index"), range_attrs(n_frames)),
              "scene_index": (row, j.column(name, "scene"), range_attrs(n_scenes)),
              "timestamp": (row, j.column(name, "timestamp")),
              "host": (row, j.column(name, "host"), categorical_attrs(hosts))}
    coords["hour"] = (row, da.map_blocks(_hour_block, coords["timestamp"][1], dtype=np.int8), range_attrs(24))
    records = ds[name].to_dask(chunks_per_task=per_task)
    if name == fmt.AGENTS:
        # the argmax is the coordinate "label": the probabilities' dimension becomes "label_name"
        out = out.rename({"label": "label_name"})
        coords["label"] = (row, da.map_blocks(_argmax_block, records, "label_probabilities", dtype=np.int8),
                           categorical_attrs(ds.labels))
        # a variable, not a coordinate: a coordinate travels into every result, and where two
        # operands hold different slices of it (x and y) xarray computes both to compare them
        out = out.assign(ego_translation=((row, "xyz"), j.column(name, "ego_translation")))
        return out.assign_coords(coords).assign_coords(xyz=["x", "y", "z"])
    out = out.rename({"status": "status_name"})
    coords["status"] = (row, da.map_blocks(_argmax_block, records, "traffic_light_face_status", dtype=np.int8),
                        categorical_attrs(fmt.TL_FACE_STATUSES))
    return out.assign_coords(coords)


def groupers(obj, names: Sequence[str]) -> dict:
    """xarray groupers for coordinates that know their values (see :func:`joined_dataset`)."""
    out = {}
    for n in names:
        if n not in obj.coords:
            raise UnknownNameError(f"no coordinate {n!r} to group by; the coordinates are: {', '.join(map(str, obj.coords))}")
        attrs = obj.coords[n].attrs
        if "flag_values" in attrs:
            labels = np.asarray(attrs["flag_values"])
        elif "valid_range" in attrs:
            lo, hi = (int(v) for v in attrs["valid_range"])
            labels = np.arange(lo, hi + 1)
        else:
            raise UsageError(f"{n!r} does not know its values (no flag_values or valid_range): group by it with "
                             f"obj.groupby({n}=UniqueGrouper(labels=...))")
        out[n] = (RangeGrouper if _is_range(labels) else UniqueGrouper)(labels=labels)
    return out


def _is_range(labels: np.ndarray) -> bool:
    return labels.dtype.kind in "iu" and len(labels) > 0 and np.array_equal(labels, np.arange(labels[0], labels[0] + len(labels)))


class RangeGrouper(UniqueGrouper):
    """A ``UniqueGrouper`` whose labels are the integers ``lo .. lo + n - 1`` (the codes of a
    category, an index's valid range): a value's group code is ``value - lo`` (-1 outside), one
    compiled pass a block, where ``UniqueGrouper`` sorts and searches the labels for each value
    (a search, an ``isin`` and masks: most of a groupby's time over 30 M rows)."""

    def factorize(self, group) -> EncodedGroups:
        import pandas as pd

        from l5dask.prediction.kernels import range_codes

        if group.dtype.kind not in "iu":
            return super().factorize(group)
        self.group = group
        lo, n = int(self.labels[0]), len(self.labels)
        codes = xr.apply_ufunc(range_codes, group, kwargs={"lo": lo, "n": n}, dask="parallelized",
                               output_dtypes=[np.int64], keep_attrs=True)
        return EncodedGroups(codes=codes, full_index=pd.Index(self.labels),
                             unique_coord=xr.Variable(dims=codes.name, data=self.labels, attrs=group.attrs))


def name_categories(result):
    """Replace the codes of categorical coordinates (CF ``flag_meanings``) by their names."""
    if not hasattr(result, "coords"):
        return result
    for n, coord in list(result.coords.items()):
        meanings = coord.attrs.get("flag_meanings")
        if meanings and coord.ndim == 1 and n in result.dims:
            names = np.asarray(meanings.split(" "))
            result = result.assign_coords({n: (n, names[np.asarray(coord.values, dtype=np.int64)])})
    return result


def sketch_quantile(obj: xr.DataArray, names: Sequence[str], labels: dict[str, np.ndarray], q,
                    quantile_bits: int | None = None) -> xr.DataArray:
    """Quantiles of a dask-backed 1-D DataArray per group of the coordinates ``names``, in one
    pass: the sketch of :mod:`l5dask.prediction.aggregation` (its error bound) per chunk, merged in a tree."""
    from dask import delayed

    from l5dask.prediction.aggregation import QUANTILE_BITS, combine_delayed, group_part, sketch_quantiles

    bits = QUANTILE_BITS if quantile_bits is None else quantile_bits
    if obj.ndim != 1:
        raise UsageError(f"quantiles per group of a 1-D variable: select one element first (dims {obj.dims})")
    import dask.array as da

    data = obj.data
    keys = [k.rechunk(data.chunks) if isinstance(k, da.Array) else da.from_array(np.asarray(k), chunks=data.chunks)
            for k in (obj.coords[n].data for n in names)]
    blocks = [b.ravel() for b in [data.to_delayed(optimize_graph=False), *[k.to_delayed(optimize_graph=False)
                                                                          for k in keys]]]
    parts = [delayed(group_part)(list(ks), {"v": d}, {"v": {"sketch"}}, bits) for d, *ks in zip(*blocks)]
    part = combine_delayed(parts)
    qs = np.atleast_1d(np.asarray(q, dtype=np.float64))
    shape = [len(labels[n]) for n in names]
    out = np.full((*shape, len(qs)), np.nan)
    pos = tuple(np.searchsorted(labels[n], part.keys[:, j]) for j, n in enumerate(names))
    for i, qq in enumerate(qs):
        out[(*pos, i)] = sketch_quantiles(part.sketches["v"], len(part), float(qq), bits)
    coords = {n: (n, labels[n], obj.coords[n].attrs) for n in names}
    result = xr.DataArray(out, dims=(*names, "quantile"), coords={**coords, "quantile": qs}, name=obj.name,
                          attrs={"l5dask_quantile_bits": bits})
    return result if np.ndim(q) else result.squeeze("quantile", drop=False)


class _Grouped:
    """An xarray GroupBy whose results name their categories (``label`` names, not codes);
    ``quantile`` is computed in one pass with a sketch (flox's needs a group in one chunk)."""

    def __init__(self, grouped, obj=None, names: Sequence[str] = (), labels: dict | None = None) -> None:
        self._grouped, self._obj, self._names, self._labels = grouped, obj, tuple(names), labels or {}

    def __getitem__(self, key):
        return _Grouped(self._grouped[key], self._obj[key] if self._obj is not None else None, self._names,
                        self._labels)

    def quantile(self, q, quantile_bits: int | None = None, **kwargs):
        """Quantiles per group (numpy's "linear" method) of a dask-backed 1-D DataArray, within
        the error bound of :mod:`l5dask.prediction.aggregation` (``quantile_bits=52``: exact); else xarray's."""
        obj = self._obj
        if isinstance(obj, xr.DataArray) and hasattr(obj.data, "dask") and obj.ndim == 1 and not kwargs:
            return name_categories(sketch_quantile(obj, self._names, self._labels, q, quantile_bits))
        return name_categories(self._grouped.quantile(q, **kwargs))

    def __getattr__(self, attr):
        value = getattr(self._grouped, attr)
        if not callable(value):
            return value

        def call(*args, **kwargs):
            return name_categories(value(*args, **kwargs))

        return call

    def __repr__(self) -> str:
        return repr(self._grouped)


class L5Accessor:
    """``obj.l5``: grouping by join coordinates without ceremony.

    ``speed.l5.groupby("scene_index", "label").mean()`` groups a dask-backed variable by lazy
    coordinates that know their values (no ``labels`` to pass, no codes computed first), with
    flox: one pass, each chunk decoded once. Results name their categories.
    """

    def __init__(self, obj) -> None:
        self._obj = obj

    def groupers(self, *names: str) -> dict:
        return groupers(self._obj, names)

    def groupby(self, *names: str, **kwargs):
        found = groupers(self._obj, names)
        return _Grouped(self._obj.groupby(found, **kwargs), self._obj, names,
                        {n: np.asarray(g.labels) for n, g in found.items()})


xr.register_dataset_accessor("l5")(L5Accessor)
xr.register_dataarray_accessor("l5")(L5Accessor)


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
        from l5dask.prediction.reading import open_dataset

        ds = open_dataset(filename_or_obj, storage_options=storage_options)
        name = _group_name(group or "agents")
        fields = None
        if drop_variables:
            drop = {drop_variables} if isinstance(drop_variables, str) else set(drop_variables)
            fields = [f for f in ds[name].dtype.names if f not in drop]
        return _lazy_dataset(ds, name, fields)

    def open_groups_as_dict(self, filename_or_obj, *, storage_options: dict | None = None, **kwargs):
        from l5dask.prediction.reading import open_dataset

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
