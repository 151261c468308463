"""Joined columns of the perception tables, each a vectorized take over resolved row indices.

``ds.frame("sample_annotation", ["category", "scene", "distance_to_ego", "velocity_x"])`` is a
pandas DataFrame; the columns each table offers are in :data:`COLUMNS` (stored columns too).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from l5dask.errors import UnknownNameError
from l5dask.perception import tables

LIDAR_TOP = "LIDAR_TOP"


def _take(values: np.ndarray, idx: np.ndarray, fill: Any) -> np.ndarray:
    """``values[idx]`` with ``fill`` where ``idx`` is -1."""
    if len(values) == 0:
        return np.full(len(idx), fill, dtype=values.dtype if fill is None or values.dtype != object else object)
    out = values[np.maximum(idx, 0)]
    if (idx < 0).any():
        out = out.astype(np.result_type(out.dtype, np.asarray(fill).dtype)) if out.dtype != object else out.copy()
        out[idx < 0] = fill
    return out


def _memo(func):
    """A join computed once per dataset (several columns, and the report, take parts of it)."""
    import functools

    @functools.wraps(func)
    def wrapper(ds, *args):
        memo = ds.__dict__.setdefault("_joins", {})
        key = (func.__name__, args)
        if key not in memo:
            memo[key] = func(ds, *args)
        return memo[key]

    return wrapper


# -- shared joins (the report uses them too) ---------------------------------------------------
@_memo
def sensor_of_sample_data(ds) -> np.ndarray:
    sd, cs = ds.table("sample_data"), ds.table("calibrated_sensor")
    return cs.links["sensor_token"][sd.links["calibrated_sensor_token"]]


def channel_of_sample_data(ds) -> np.ndarray:
    return (
        ds.table("sensor").strings("channel")[sensor_of_sample_data(ds)]
        if len(ds.table("sample_data"))
        else np.zeros(0, object)
    )


def modality_of_sample_data(ds) -> np.ndarray:
    return (
        ds.table("sensor").strings("modality")[sensor_of_sample_data(ds)]
        if len(ds.table("sample_data"))
        else np.zeros(0, object)
    )


@_memo
def key_frame_of_samples(ds, channel: str = LIDAR_TOP) -> np.ndarray:
    """Per sample, its key-frame sample_data row of ``channel`` (-1 none; the last in file order if
    several, as the SDK's ``sample["data"]``)."""
    sd = ds.table("sample_data")
    out = np.full(len(ds.table("sample")), -1, np.int64)
    rows = np.flatnonzero(sd.numbers("is_key_frame", bool) & (channel_of_sample_data(ds) == channel))
    np.maximum.at(out, sd.links["sample_token"][rows], rows)
    return out


@_memo
def ego_of_samples(ds) -> tuple[np.ndarray, np.ndarray]:
    """Per sample: its LIDAR_TOP ego pose row (-1 none) and that pose's translation (NaN none)."""
    sd, ep = ds.table("sample_data"), ds.table("ego_pose")
    key = key_frame_of_samples(ds)
    pose = np.where(key >= 0, sd.links["ego_pose_token"][np.maximum(key, 0)] if len(sd) else -1, -1)
    xyz = np.full((len(key), 3), np.nan)
    has = pose >= 0
    xyz[has] = ep.vectors("translation")[pose[has]]
    return pose, xyz


@_memo
def category_of_annotations(ds) -> np.ndarray:
    ann, inst = ds.table("sample_annotation"), ds.table("instance")
    return inst.links["category_token"][ann.links["instance_token"]] if len(ann) else np.zeros(0, np.int64)


@_memo
def scene_of_annotations(ds) -> np.ndarray:
    return ds.table("sample").links["scene_token"][ds.table("sample_annotation").links["sample_token"]]


@_memo
def box_velocity(ds, max_time_diff: float = 1.5) -> np.ndarray:
    """The SDK's ``box_velocity`` of every annotation, vectorized (same operations, same order):
    centred difference over the neighbours in the instance's chain, NaN when the annotation is
    alone or the neighbours are further apart in time than ``max_time_diff`` (x2 when centred)."""
    ann, smp = ds.table("sample_annotation"), ds.table("sample")
    rows = np.arange(len(ann))
    prev, nxt = ann.links["prev"], ann.links["next"]
    has_prev, has_next = prev >= 0, nxt >= 0
    first = np.where(has_prev, prev, rows)
    last = np.where(has_next, nxt, rows)
    pos = ann.vectors("translation")
    diff = pos[last] - pos[first]
    stamp = smp.numbers("timestamp")
    sample = ann.links["sample_token"]
    time_diff = 1e-6 * stamp[sample[last]] - 1e-6 * stamp[sample[first]]
    limit = np.where(has_prev & has_next, max_time_diff * 2, max_time_diff)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = diff / time_diff[:, None]
    out[(~has_prev & ~has_next) | (time_diff > limit)] = np.nan
    return out


def yaw_of(q: np.ndarray) -> np.ndarray:
    """Heading about z of quaternions (w, x, y, z): atan2(2(wz + xy), 1 - 2(y^2 + z^2))."""
    w, x, y, z = q[:, 0], q[:, 1], q[:, 2], q[:, 3]
    return np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))


# -- the column catalogue ----------------------------------------------------------------------
def _names(ds, table: str, col: str, idx: np.ndarray) -> np.ndarray:
    return _take(ds.table(table).strings(col), idx, "")


def _ann(ds):
    return ds.table("sample_annotation")


def _attributes(ds) -> np.ndarray:
    off, idx = _ann(ds).lists["attribute_tokens"]
    names = ds.table("attribute").strings("name")
    flat = names[idx] if len(idx) else np.zeros(0, object)
    return np.array([list(flat[a:b]) for a, b in zip(off[:-1], off[1:])] + [None], dtype=object)[:-1]


def _ann_ego(ds) -> np.ndarray:
    _, xyz = ego_of_samples(ds)
    return xyz[_ann(ds).links["sample_token"]]


def _sd_ego(ds) -> np.ndarray:
    sd = ds.table("sample_data")
    return ds.table("ego_pose").vectors("translation")[sd.links["ego_pose_token"]] if len(sd) else np.zeros((0, 3))


ANNOTATION: dict[str, Callable] = {
    "sample": lambda ds: _ann(ds).links["sample_token"],
    "instance": lambda ds: _ann(ds).links["instance_token"],
    "category": lambda ds: category_of_annotations(ds),
    "category_name": lambda ds: _names(ds, "category", "name", category_of_annotations(ds)),
    "visibility": lambda ds: _names(ds, "visibility", "level", _ann(ds).links["visibility_token"]),
    "attributes": _attributes,
    "x": lambda ds: _ann(ds).vectors("translation")[:, 0],
    "y": lambda ds: _ann(ds).vectors("translation")[:, 1],
    "z": lambda ds: _ann(ds).vectors("translation")[:, 2],
    "width": lambda ds: _ann(ds).vectors("size")[:, 0],
    "length": lambda ds: _ann(ds).vectors("size")[:, 1],
    "height": lambda ds: _ann(ds).vectors("size")[:, 2],
    "yaw": lambda ds: yaw_of(_ann(ds).vectors("rotation")),
    "scene": scene_of_annotations,
    "scene_name": lambda ds: _names(ds, "scene", "name", scene_of_annotations(ds)),
    "timestamp": lambda ds: ds.table("sample").numbers("timestamp")[_ann(ds).links["sample_token"]],
    "position": lambda ds: _ann(ds).position,
    "sample_position": lambda ds: ds.table("sample").position[_ann(ds).links["sample_token"]],
    "ego_x": lambda ds: _ann_ego(ds)[:, 0],
    "ego_y": lambda ds: _ann_ego(ds)[:, 1],
    "distance_to_ego": lambda ds: np.hypot(*(_ann(ds).vectors("translation")[:, :2] - _ann_ego(ds)[:, :2]).T),
    "velocity_x": lambda ds: box_velocity(ds)[:, 0],
    "velocity_y": lambda ds: box_velocity(ds)[:, 1],
    "velocity_z": lambda ds: box_velocity(ds)[:, 2],
    "log": lambda ds: ds.table("scene").links["log_token"][scene_of_annotations(ds)],
    "vehicle": lambda ds: ds.table("log").strings("vehicle")[
        ds.table("scene").links["log_token"][scene_of_annotations(ds)]
    ],
}

SAMPLE: dict[str, Callable] = {
    "scene": lambda ds: ds.table("sample").links["scene_token"],
    "scene_name": lambda ds: ds.table("scene").strings("name")[ds.table("sample").links["scene_token"]],
    "position": lambda ds: ds.table("sample").position,
    "ego_pose": lambda ds: ego_of_samples(ds)[0],
    "ego_x": lambda ds: ego_of_samples(ds)[1][:, 0],
    "ego_y": lambda ds: ego_of_samples(ds)[1][:, 1],
    "ego_z": lambda ds: ego_of_samples(ds)[1][:, 2],
    "num_annotations": lambda ds: np.bincount(_ann(ds).links["sample_token"], minlength=len(ds.table("sample"))),
}

SAMPLE_DATA: dict[str, Callable] = {
    "sample": lambda ds: ds.table("sample_data").links["sample_token"],
    "sensor": sensor_of_sample_data,
    "channel": channel_of_sample_data,
    "modality": modality_of_sample_data,
    "scene": lambda ds: ds.table("sample").links["scene_token"][ds.table("sample_data").links["sample_token"]],
    "ego_x": lambda ds: _sd_ego(ds)[:, 0],
    "ego_y": lambda ds: _sd_ego(ds)[:, 1],
    "ego_z": lambda ds: _sd_ego(ds)[:, 2],
}

INSTANCE: dict[str, Callable] = {
    "category": lambda ds: ds.table("instance").links["category_token"],
    "category_name": lambda ds: _names(ds, "category", "name", ds.table("instance").links["category_token"]),
    "num_annotations": lambda ds: np.bincount(_ann(ds).links["instance_token"], minlength=len(ds.table("instance"))),
}

SCENE: dict[str, Callable] = {
    "log": lambda ds: ds.table("scene").links["log_token"],
    "vehicle": lambda ds: ds.table("log").strings("vehicle")[ds.table("scene").links["log_token"]],
    "num_samples": lambda ds: np.bincount(ds.table("sample").links["scene_token"], minlength=len(ds.table("scene"))),
}

#: Joined columns per table (stored columns are always available by name; links give row indices).
COLUMNS = {
    "sample_annotation": ANNOTATION,
    "sample": SAMPLE,
    "sample_data": SAMPLE_DATA,
    "instance": INSTANCE,
    "scene": SCENE,
}


def stored(ds, name: str, col: str) -> np.ndarray:
    t = ds.table(name)
    if col in t.links:
        return t.links[col]
    if col in t.lists:
        off, idx = t.lists[col]
        return np.array([list(idx[a:b]) for a, b in zip(off[:-1], off[1:])] + [None], dtype=object)[:-1]
    kind = tables.SCHEMA[name][col]
    if kind == "VARCHAR":
        return t.strings(col)
    if kind == tables.VEC:
        return list(t.vectors(col))  # type: ignore[return-value]  # (a list of vectors, as the SDK's rows)
    return t.numbers(col, bool if kind == "BOOLEAN" else np.float64)


def frame(ds, name: str, columns: list[str] | None = None) -> Any:
    import pandas as pd

    table = ds.table(name)
    joined = COLUMNS.get(name, {})
    columns = list(columns) if columns is not None else list(tables.SCHEMA[name])
    data = {}
    for col in columns:
        if col in joined:
            data[col] = joined[col](ds)
        elif col in tables.SCHEMA[name]:
            data[col] = stored(ds, name, col)
        else:
            offered = sorted(set(tables.SCHEMA[name]) | set(joined))
            raise UnknownNameError(f"{name} has no column {col!r}; it offers {', '.join(offered)}")
    return pd.DataFrame(data, index=pd.RangeIndex(len(table), name="row"))
