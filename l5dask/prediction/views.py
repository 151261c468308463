"""The xarray face: one Dataset per stored array, a DataTree for the whole dataset.

Variables are made from one dask array of records per stored array, so computing
several variables together decodes each chunk once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xarray as xr

import l5dask.prediction.accessor  # noqa: F401 - registers the .l5 accessor of the views
from l5dask.core.policy import collection_chunks_per_task
from l5dask.prediction import format as fmt
from l5dask.prediction.columns import Table, hour_of_day
from l5dask.prediction.joins import Joins
from l5dask.prediction.kernels import argmax_rows

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


def array_to_dataset(ds, name: str, fields: Sequence[str] | None = None, chunks_per_task: int = 1) -> xr.Dataset:
    """An ``xarray.Dataset`` of one stored array, a variable per field, lazily backed."""
    array = ds[name]
    records = array.to_dask(fields=fields, chunks_per_task=chunks_per_task)
    row = ROW_DIMS[name]
    variables = {}
    coords: dict[str, object] = {}
    for field in fmt.names_of(records.dtype):
        sub = fmt.fields_of(records.dtype)[field][0]
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

    return argmax_rows(records, field)


def _hour_block(timestamp: np.ndarray) -> np.ndarray:

    return hour_of_day(timestamp)


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
    import dask.array as da

    per_task = chunks_per_task or collection_chunks_per_task(ds[name].nchunks)
    j = Joins(ds, chunks_per_task=per_task)
    out = array_to_dataset(ds, name, chunks_per_task=per_task)
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
    j.declare(name, ["index", "scene", "timestamp", "host"] + (["ego_translation"] if name == fmt.AGENTS else []))
    coords = {
        "frame_index": (row, j.column(name, "index"), range_attrs(n_frames)),
        "scene_index": (row, j.column(name, "scene"), range_attrs(n_scenes)),
        "timestamp": (row, j.column(name, "timestamp")),
        "host": (row, j.column(name, "host"), categorical_attrs(hosts)),
    }
    coords["hour"] = (row, da.map_blocks(_hour_block, coords["timestamp"][1], dtype=np.int8), range_attrs(24))
    records = ds[name].to_dask(chunks_per_task=per_task)
    if name == fmt.AGENTS:
        # the argmax is the coordinate "label": the probabilities' dimension becomes "label_name"
        out = out.rename({"label": "label_name"})
        coords["label"] = (
            row,
            da.map_blocks(_argmax_block, records, "label_probabilities", dtype=np.int8),
            categorical_attrs(ds.labels),
        )
        # a variable, not a coordinate: a coordinate travels into every result, and where two
        # operands hold different slices of it (x and y) xarray computes both to compare them
        out = out.assign(ego_translation=((row, "xyz"), j.column(name, "ego_translation")))
        return out.assign_coords(coords).assign_coords(xyz=["x", "y", "z"])
    out = out.rename({"status": "status_name"})
    coords["status"] = (
        row,
        da.map_blocks(_argmax_block, records, "traffic_light_face_status", dtype=np.int8),
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
