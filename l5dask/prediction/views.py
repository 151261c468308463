"""The xarray face: one Dataset per stored array, a DataTree for the whole dataset.

Variables are made from one dask layer of stored chunks per array, fetched but not decoded
(``Block``): computing several variables together reads each chunk once, and their numbers
(and the label argmax of a joined view) are gathered straight from the compressed bytes in one
pass (:meth:`l5dask.prediction.reading.Encoded.gather`), the records never made.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import xarray as xr

import l5dask.prediction.accessor  # noqa: F401 - registers the .l5 accessor of the views
from l5dask.core.policy import collection_chunks_per_task
from l5dask.errors import UsageError
from l5dask.prediction import format as fmt
from l5dask.prediction.columns import Table
from l5dask.prediction.joins import Joins
from l5dask.prediction.kernels import field_of_columns, gather

#: The row dimension of each array.
ROW_DIMS = {fmt.SCENES: "scene", fmt.FRAMES: "frame", fmt.AGENTS: "agent", fmt.TL_FACES: "tl_face"}


def _field_dims(field: str, shape: tuple[int, ...]) -> tuple[tuple[str, ...], dict[str, Sequence[str]]]:
    """Named extra dimensions (and their coordinates) for a subarray field."""
    known = fmt.FIELD_DIMS.get(field)
    if known and len(known[0]) == len(shape):
        dims, labels = known
        coords: dict[str, Sequence[str]] = {
            d: list(c) for d, c, n in zip(dims, labels, shape) if c is not None and len(c) == n
        }
        return dims, coords
    return tuple(f"{field}_dim_{i}" for i in range(len(shape))), {}


#: The field of each array whose argmax is a coordinate of its joined view.
ARGMAX = {fmt.AGENTS: "label_probabilities", fmt.TL_FACES: "traffic_light_face_status"}


class Block:
    """One task's stored chunks of an array, fetched but not decoded (``data``: an
    :class:`~l5dask.prediction.reading.Encoded`, or records for a layout that reads them so), and
    the view's variables made from them, their numbers (and the argmax of the ``argmax`` fields)
    gathered straight from the compressed bytes, the records never made (q1 of
    ``benchmarks/aggregate_benchmark.py`` through the xarray view: 3.5 s of CPU with the records
    decoded, 1.4 s of it decoding 3.5 GB of them; see the CHANGELOG for the figures after).

    A query asks for a field or two: the first pass gathers the field asked for and the argmaxes,
    the second the next field asked for, the third every number of ``fields`` still missing (a
    pass costs its decompression, each column a little more). Any other field comes from the
    records (decoded once). Threads share a block: a lock makes each column once."""

    def __init__(self, data, fields: tuple[str, ...], argmax: tuple[str, ...]) -> None:
        self.data, self.fields, self.argmax = data, fields, argmax
        self._lock = threading.Lock()
        self._columns: dict[str, list[np.ndarray]] = {}
        self._passes = 0

    def __reduce__(self):  # (to another worker: the bytes, not the lock or the columns)
        return Block, (self.data, self.fields, self.argmax)

    def _numbers(self) -> list[str]:
        fields = fmt.fields_of(self.data.dtype)
        return [
            f
            for f in self.fields
            if f not in self.argmax and fields[f][0].base.kind in "biuf" and fields[f][0].base.isnative
        ]

    def _column(self, key: str) -> list[np.ndarray]:
        """The gathered parts of ``key`` (a number field's elements, or ``argmax:<field>``)."""
        with self._lock:
            if key not in self._columns:
                fields = fmt.fields_of(self.data.dtype)
                missing = [f for f in self._numbers() if f not in self._columns]
                numbers = missing if self._passes >= 2 else [key] if key in missing else []
                argmax = [f for f in self.argmax if f in fields and f"argmax:{f}" not in self._columns]
                if self._passes == 1 and not key.startswith("argmax:"):
                    argmax = []
                elements = [(f, tuple(int(i) for i in idx)) for f in numbers for idx in np.ndindex(fields[f][0].shape)]
                data = self.data
                outs, maxes = (
                    gather(data, elements, argmax) if isinstance(data, np.ndarray) else data.gather(elements, argmax)
                )
                at = 0
                for f in numbers:
                    k = int(np.prod(fields[f][0].shape, dtype=np.int64))
                    self._columns[f], at = outs[at : at + k], at + k
                self._columns.update({f"argmax:{f}": [m] for f, m in zip(argmax, maxes)})
                self._passes += 1
            return self._columns[key]

    def field(self, name: str) -> np.ndarray:
        """The values of the field ``name`` (rows, then the field's own shape)."""
        if name in self._numbers():
            shape = fmt.fields_of(self.data.dtype)[name][0].shape
            parts = self._column(name)
            return parts[0] if not shape else field_of_columns(parts, shape)
        with self._lock:
            records = self.data if isinstance(self.data, np.ndarray) else self.data.records()
        return records[name]

    def argmax_of(self, name: str) -> np.ndarray:
        """The argmax of each row's ``name`` (int8; first maximum, as numpy)."""
        return self._column(f"argmax:{name}")[0]


def _read_block(array, chunks_per_task: int, fields: tuple[str, ...], argmax: tuple[str, ...], block_id=None) -> Block:
    first = block_id[0] * chunks_per_task
    return Block(array.read_encoded(first, min(chunks_per_task, array.meta.nchunks - first)), fields, argmax)


def _field_block(block: Block, name: str) -> np.ndarray:
    return block.field(name)


def _argmax_of_block(block: Block, name: str) -> np.ndarray:
    return block.argmax_of(name)


def field_names(array, fields: Sequence[str] | str | None) -> tuple[str, ...]:
    """``fields`` (checked: one ``UsageError`` line for a field the array has not), or all of them."""
    if fields is None:
        return fmt.names_of(array.dtype)
    names = (fields,) if isinstance(fields, str) else tuple(fields)
    array.select(names)
    return names


def blocks(array, fields: Sequence[str] | None, chunks_per_task: int, argmax: Sequence[str] = ()):
    """The stored chunks of ``array``, ``chunks_per_task`` a block, as a dask array of
    ``Block`` (one task each, its rows as its chunk: never computed itself, only through
    :func:`field_array` and :func:`argmax_array`)."""
    import dask.array as da
    from dask.base import tokenize

    names = field_names(array, fields)
    argmax = tuple(argmax)
    if chunks_per_task < 1:
        raise UsageError("chunks_per_task must be >= 1")
    meta = array.meta
    firsts = list(range(0, meta.nchunks, chunks_per_task))
    chunks = tuple(
        meta.chunk_bounds(min(f + chunks_per_task, meta.nchunks) - 1)[1] - meta.chunk_bounds(f)[0] for f in firsts
    )
    token = tokenize(array, names, argmax, chunks_per_task)
    return da.map_blocks(
        _read_block,
        array.select(names),
        chunks_per_task,
        names,
        argmax,
        chunks=(chunks or (0,),),
        dtype=object,
        meta=np.empty(0, dtype=object),
        name=f"l5-chunks-{meta.name}-{token}",
    )


def field_array(array, chunked, name: str):
    """The field ``name`` of ``array`` as a dask array over the blocks ``chunked`` (:func:`blocks`)."""
    import dask.array as da

    sub = fmt.fields_of(array.dtype)[name][0]
    if not chunked.npartitions or not len(array):
        return da.from_array(np.empty((0, *sub.shape), sub.base), chunks=(0, *sub.shape))
    extra = tuple(range(1, 1 + len(sub.shape)))
    return da.map_blocks(
        _field_block,
        chunked,
        name,
        chunks=(chunked.chunks[0], *[(n,) for n in sub.shape]),
        new_axis=list(extra) or None,
        dtype=sub.base,
        meta=np.empty((0,) * (1 + len(sub.shape)), sub.base),
    )


def argmax_array(array, chunked, name: str):
    """The argmax of each row's field ``name`` of ``array`` (int8) over the blocks ``chunked``."""
    import dask.array as da

    if not chunked.npartitions or not len(array):
        return da.from_array(np.empty(0, np.int8), chunks=(0,))
    return da.map_blocks(_argmax_of_block, chunked, name, dtype=np.int8, meta=np.empty(0, np.int8))


def array_to_dataset(
    ds, name: str, fields: Sequence[str] | None = None, chunks_per_task: int = 1, argmax: Sequence[str] = ()
) -> xr.Dataset:
    """An ``xarray.Dataset`` of one stored array, a variable per field, lazily backed (``argmax``:
    fields whose argmax is also gathered, for :func:`argmax_array` over the same blocks)."""
    array = ds[name]
    chunked = blocks(array, fields, chunks_per_task, argmax)
    row = ROW_DIMS[name]
    variables = {}
    coords: dict[str, object] = {}
    for field in field_names(array, fields):
        sub = fmt.fields_of(array.dtype)[field][0]
        data = field_array(array, chunked, field)
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


def categorical_attrs(names: Sequence[str]) -> dict:
    """CF attributes of a coordinate of category codes: its values and their names."""
    return {"flag_values": np.arange(len(names), dtype=np.int64), "flag_meanings": " ".join(names)}


def range_attrs(n: int) -> dict:
    """CF attributes of a coordinate of indices ``0 .. n - 1``: the values it can take."""
    return {"valid_range": np.array([0, max(n - 1, 0)], dtype=np.int64)}


def joined_dataset(ds, name: str, chunks_per_task: int | None = None) -> xr.Dataset:
    """``array_to_dataset`` plus lazy coordinates from the interval joins.

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

    per_task = chunks_per_task or collection_chunks_per_task(ds[name].nchunks)
    j = Joins(ds, chunks_per_task=per_task)
    argmax = (ARGMAX[name],) if name in ARGMAX else ()
    out = array_to_dataset(ds, name, chunks_per_task=per_task, argmax=argmax)
    row = ROW_DIMS[name]
    n_scenes, n_frames = len(ds[fmt.SCENES]), len(ds[fmt.FRAMES])
    if name == fmt.SCENES:
        return out
    hosts = Table(ds, name).host_names()
    j._frames.hosts = hosts
    if name == fmt.FRAMES:
        j.declare(name, ["index", "host"])
        return out.assign_coords(
            scene_index=(row, j.frame_scene(), range_attrs(n_scenes)),
            host=(row, j.column(name, "host"), categorical_attrs(hosts)),
        )
    j.declare(
        name, ["index", "scene", "timestamp", "hour", "host"] + (["ego_translation"] if name == fmt.AGENTS else [])
    )
    coords = {
        "frame_index": (row, j.column(name, "index"), range_attrs(n_frames)),
        "scene_index": (row, j.column(name, "scene"), range_attrs(n_scenes)),
        "timestamp": (row, j.column(name, "timestamp")),
        "host": (row, j.column(name, "host"), categorical_attrs(hosts)),
    }
    # (the frame's hour spread over its rows: 30 M agents' hours from their spread timestamps took 0.26 CPU-s)
    coords["hour"] = (row, j.column(name, "hour"), range_attrs(24))
    chunked = blocks(ds[name], None, per_task, argmax)  # (the variables' own layer: each chunk read once)
    if name == fmt.AGENTS:
        # the argmax is the coordinate "label": the probabilities' dimension becomes "label_name"
        out = out.rename({"label": "label_name"})
        coords["label"] = (
            row,
            argmax_array(ds[name], chunked, "label_probabilities"),
            categorical_attrs(ds.labels),
        )
        # a variable, not a coordinate: a coordinate travels into every result, and where two
        # operands hold different slices of it (x and y) xarray computes both to compare them
        out = out.assign(ego_translation=((row, "xyz"), j.column(name, "ego_translation")))
        return out.assign_coords(coords).assign_coords(xyz=["x", "y", "z"])
    out = out.rename({"status": "status_name"})
    coords["status"] = (
        row,
        argmax_array(ds[name], chunked, "traffic_light_face_status"),
        categorical_attrs(fmt.TL_FACE_STATUSES),
    )
    return out.assign_coords(coords)


def dataset_to_datatree(ds) -> xr.DataTree:
    """The whole dataset as a DataTree with one child node per stored array."""
    children = {fmt.SHORT_NAMES[n]: array_to_dataset(ds, n) for n in fmt.ARRAY_NAMES if ds.has(n)}
    root = xr.Dataset(attrs=root_attrs(ds))
    return xr.DataTree.from_dict({"/": root, **children})


def root_attrs(ds) -> dict:
    return {k: v for k, v in ds.attrs.items() if isinstance(v, (int, str))} | {"source": ds.url}
