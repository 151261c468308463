"""The per-chunk kernels: compiled loops over records in place, one module a job (``_report.pyx``: the
report's; ``_gather.pyx``: the compressed gather; ``_columns.pyx``: the aggregate's columns and
group codes), each saying at its top what it beats and by how much.

Each kernel makes one pass over a decoded chunk's rows, reading the fields it needs at
their byte offsets, so nothing is copied out of the chunk; the loops release the GIL, so
threads scale. The numpy formulation of the same maths made many passes over each chunk
(argmax over the 17 labels, speed, two histograms, frame lookup, a sort per scene for the
distinct tracks). Definitions are exactly those of ``docs/statistics-report.md``;
``tests/prediction/test_kernels.py`` and ``tests/prediction/test_stats.py`` check them against numpy.

:class:`Gather` makes the columns of named numbers and argmaxes in one pass, from decoded records
or straight from a blosc-compressed chunk (``l5dask/_blosc.h``: no records are made;
``tests/prediction/test_encoded.py`` checks it against numcodecs' decode).

Compiled with Cython when the package is installed: the module loads in a millisecond,
where numba (used before) cost 0.75 s per process to import and load its cache.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from l5dask.core import config
from l5dask.core.lazy import compiled
from l5dask.prediction.format import fields_of

#: One compiled module a job: the report's loops, the compressed gather, the aggregate's columns,
#: the scene catalog's loops.
_report = compiled("l5dask.prediction._report")
_gather = compiled("l5dask.prediction._gather")
_columns = compiled("l5dask.prediction._columns")
_catalog = compiled("l5dask.prediction._catalog")
byte_codes = _catalog.byte_codes
catalog_agents = _catalog.catalog_agents
face_runs = _catalog.face_runs
key_runs = _catalog.key_runs
#: The result the report's :func:`track_runs` and the catalog's :func:`key_runs` both make of a
#: block of agents, ``(scenes, distinct tracks, first run's ids, last run's ids)`` of each run of
#: a scene's rows: left by the catalog in a fused pass's block for the report.
SCENE_TRACKS = "scene_tracks"
mask_counts = _catalog.mask_counts
union_masks = _catalog.union_masks
_agent_columns = _report.agent_columns
_argmax_counts = _report.argmax_counts
_track_runs = _report.track_runs
uniform_histogram = _report.uniform_histogram
union_sorted = _report.union_sorted
_argmax_rows = _gather.argmax_rows
_blosc_blocksize = _gather.blosc_blocksize
_distinct_rows = _gather.distinct_rows
_gather_blosc = _gather.gather_blosc
_gather_fields = _gather.gather_fields
_distance_to_parent = _columns.distance_to_parent
_distance_to_runs = _columns.distance_to_runs
_group_reduce = _columns.group_reduce
_norm2_f32 = _columns.norm2_f32
_range_codes = _columns.range_codes
_sketch_range = _columns.sketch_range
_sketch_counts = _columns.sketch_counts
_keyed_reduce = _columns.keyed_reduce
_sketch_add = _columns.sketch_add
_merge_sketches = _columns.merge_sketches
#: The quantile sketch's counts in a table of the (group, exponent) pairs that occur
#: (``_columns.pyx``): filled by :func:`sketch_add` or :func:`keyed_reduce`.
Sketch = _columns.Sketch

__all__ = [
    "agent_chunk",
    "agent_columns",
    "argmax_counts",
    "argmax_rows",
    "gather",
    "Gather",
    "group_reduce",
    "int_range",
    "keyed_reduce",
    "distinct_values",
    "track_runs",
    "union_sorted",
    "uniform_histogram",
]

#: The field types the compiled loops read (native byte order).
AGENT_TYPES: dict[str, np.dtype] = {
    "label_probabilities": np.dtype(np.float32),
    "velocity": np.dtype(np.float32),
    "centroid": np.dtype(np.float64),
    "track_id": np.dtype(np.uint64),
}


def layout(records: np.ndarray, types: dict[str, np.dtype]) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """``(records, bytes, offsets)``: the records' bytes and the offset of each field in ``types``.

    Records whose fields already have those base types (native byte order) and that are
    contiguous are used in place; others are first converted (a copy of those fields).
    """
    fields = fields_of(records.dtype)
    if not (records.flags.c_contiguous and all(fields[f][0].base == t for f, t in types.items())):
        packed = np.empty(len(records), np.dtype([(f, t, fields[f][0].shape) for f, t in types.items()]))
        for f in types:
            packed[f] = records[f]
        records, fields = packed, fields_of(packed.dtype)
    return records, records.view(np.uint8).reshape(-1), {f: fields[f][1] for f in types}


def _no_frames(n: int, frame_starts: np.ndarray, ego_xy: np.ndarray, frame_pos: np.ndarray) -> bool:
    """Whether the frames of ``n`` agent rows (their starts and ego x/y) or a slot per row are missing."""
    return not len(frame_starts) or len(ego_xy) != len(frame_starts) or len(frame_pos) < n


def agent_chunk(
    records: np.ndarray,
    frame_starts: np.ndarray,
    ego_xy: np.ndarray,
    lo: int,
    speed_width: float,
    dist_width: float,
    label_counts: np.ndarray,
    speed_hist: np.ndarray,
    dist_hist: np.ndarray,
    frame_pos: np.ndarray,
    track_ids: np.ndarray,
) -> float:
    """Add the agents ``records`` (first row: agent ``lo``) to the label counts and both histograms;
    fill ``frame_pos`` with each row's position in ``frame_starts`` and ``track_ids`` (uint64) with
    its track id; return the sum of speeds.

    ``frame_starts``/``ego_xy`` are the agent starts and ego x/y of the frames overlapping the chunk.
    """
    if not len(records):
        return 0.0
    if _no_frames(len(records), frame_starts, ego_xy, frame_pos) or len(track_ids) < len(records):
        raise ValueError("agent_chunk: the frames of the rows, and an output slot per row, are needed")
    nlabels = fields_of(records.dtype)["label_probabilities"][0].shape[0]
    if len(label_counts) != nlabels:
        raise ValueError(f"agent_chunk: {nlabels} label probabilities a row, but {len(label_counts)} label counts")
    records = layout(records, AGENT_TYPES)[0]  # (fields of other types or byte orders converted)
    columns, (label,) = gather(records, list(AGENT_ELEMENTS), ["label_probabilities"])
    track_ids[: len(records)] = columns[4]
    return agent_columns(
        label,
        columns,
        frame_starts,
        ego_xy,
        lo,
        speed_width,
        dist_width,
        label_counts,
        speed_hist,
        dist_hist,
        frame_pos,
    )


#: What :func:`agent_columns` takes of an agent, gathered from the stored bytes (``Gather``).
AGENT_ELEMENTS = (("velocity", (0,)), ("velocity", (1,)), ("centroid", (0,)), ("centroid", (1,)), ("track_id", ()))


def agent_columns(
    label: np.ndarray,
    columns: Sequence[np.ndarray],
    frame_starts: np.ndarray,
    ego_xy: np.ndarray,
    lo: int,
    speed_width: float,
    dist_width: float,
    label_counts: np.ndarray,
    speed_hist: np.ndarray,
    dist_hist: np.ndarray,
    frame_pos: np.ndarray,
    speed_out: np.ndarray | None = None,
    dist_out: np.ndarray | None = None,
) -> float:
    """:func:`agent_chunk` on gathered columns: ``label`` (int8, the label's argmax) and
    :data:`AGENT_ELEMENTS` but the track id (velocity x, y as float32, centroid x, y as float64),
    the same sums in the same order. Used where the chunk's bytes are gathered, never decoded
    into records (a chunk and its report: 0.71 ms of CPU against 0.82 ms decoded, 2026-11-26).
    With ``speed_out``/``dist_out`` (float64, a slot per row), each row's speed and distance to
    its frame's ego are written there: the bits of :func:`norm2` of the velocities and of
    :func:`distance_to_parent` of the centroid to its frame's ego."""
    vx, vy, cx, cy = columns[:4]
    n = len(label)
    if not n:
        return 0.0
    if (
        _no_frames(n, frame_starts, ego_xy, frame_pos)
        or any(len(c) != n for c in (vx, vy, cx, cy))
        or (vx.dtype, vy.dtype, cx.dtype, cy.dtype) != (np.float32, np.float32, np.float64, np.float64)
    ):
        raise ValueError("agent_columns: float32 velocities and float64 centroids a row, its frames, and slots")
    if label.dtype != np.int8:  # (their range is checked by the compiled loop)
        raise ValueError(f"agent_columns: labels from 0 to {len(label_counts) - 1} expected")
    return _agent_columns(
        label,
        vx,
        vy,
        cx,
        cy,
        np.ascontiguousarray(frame_starts, np.int64),
        np.ascontiguousarray(ego_xy, np.float64),
        lo,
        speed_width,
        dist_width,
        label_counts,
        speed_hist,
        dist_hist,
        frame_pos,
        speed_out,
        dist_out,
    )


def track_runs(track_ids: np.ndarray, frame_pos: np.ndarray, frame_scene: np.ndarray):
    """Distinct tracks per run of rows of one scene: ``(scenes, counts, first_ids, last_ids)``.

    Row ``i`` has track ``track_ids[i]`` and scene ``frame_scene[frame_pos[i]]``;
    ``first_ids``/``last_ids`` are the sorted distinct ids of the first and last run (they may
    go on in the neighbouring chunks). Ids are marked in a table when dense, else sorted.
    """
    if not len(track_ids) or len(frame_pos) != len(track_ids):  # (each position is checked there)
        raise ValueError("track_runs: a frame position per row, each within frame_scene, is needed")
    return _track_runs(
        np.ascontiguousarray(track_ids, np.uint64),
        np.ascontiguousarray(frame_pos, np.int64),
        np.ascontiguousarray(frame_scene, np.int64),
    )


def distinct_values(records: np.ndarray, field: str) -> np.ndarray:
    """Indices of the first row of each distinct value of ``field`` (compared as bytes), in order."""
    if not len(records):
        return np.zeros(0, np.int64)
    if not records.flags.c_contiguous:
        records = np.ascontiguousarray(records)
    sub, offset = fields_of(records.dtype)[field][:2]
    return _distinct_rows(
        records.view(np.uint8).reshape(-1), len(records), records.dtype.itemsize, offset, sub.itemsize
    )


def argmax_counts(records: np.ndarray, field: str, counts: np.ndarray) -> None:
    """Add one to ``counts[argmax]`` of each row's ``field`` (float32 values; first maximum, as numpy)."""
    if not len(records):
        return
    ncols = fields_of(records.dtype)[field][0].shape[0]
    if len(counts) != ncols:
        raise ValueError(f"argmax_counts: {field} has {ncols} columns, but there are {len(counts)} counts")
    records, buf, off = layout(records, {field: np.dtype(np.float32)})
    _argmax_counts(buf, len(records), records.dtype.itemsize, off[field], ncols, counts)


def argmax_rows(records: np.ndarray, field: str) -> np.ndarray:
    """The argmax of each row's ``field`` (float32 values; first maximum, as numpy), as int8."""
    ncols = fields_of(records.dtype)[field][0].shape[0]
    if not 0 < ncols <= 127:
        raise ValueError(f"argmax_rows: {field} has {ncols} columns (1 to 127 are supported)")
    out = np.empty(len(records), np.int8)
    if len(records):
        records, buf, off = layout(records, {field: np.dtype(np.float32)})
        _argmax_rows(buf, len(records), records.dtype.itemsize, off[field], ncols, out)
    return out


def group_reduce(
    codes: np.ndarray,
    values: np.ndarray,
    ngroups: int,
    sums: bool = True,
    mins: bool = False,
    maxs: bool = False,
    rows: np.ndarray | None = None,
    out: tuple[np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None] | None = None,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """Per group ``0 .. ngroups - 1`` of the rows' ``codes``: the number of values that are not
    NaN, their sum, minimum and maximum (``None`` when not asked; NaN-free groups: inf/-inf); with
    ``rows`` (``ngroups`` int64), each group's rows (NaN or not) are added to it, in the same pass.
    ``out``: the ``(count, sum, min, max)`` of rows before (a call's result), added to in place
    and returned (the rows of a long array grouped a slice at a time, as one call would)."""
    codes = np.ascontiguousarray(codes, np.int64)
    values = np.ascontiguousarray(values, np.float64)
    if len(codes) != len(values):
        raise ValueError("group_reduce: a code per value is needed")
    if rows is not None:
        _check_out(rows, np.int64, ngroups, "rows")
    if out is None:
        count = np.zeros(ngroups, np.int64)
        total = np.zeros(ngroups if sums else 1, np.float64)
        lo = np.full(ngroups if mins else 1, np.inf)
        hi = np.full(ngroups if maxs else 1, -np.inf)
    else:
        count, total_, lo_, hi_ = out
        _check_out(count, np.int64, ngroups, "out's count")
        for arr, want, what in ((total_, sums, "sum"), (lo_, mins, "min"), (hi_, maxs, "max")):
            if want:
                _check_out(arr, np.float64, ngroups, f"out's {what}")
        dummy = np.zeros(1)
        total = total_ if sums and total_ is not None else dummy
        lo = lo_ if mins and lo_ is not None else dummy
        hi = hi_ if maxs and hi_ is not None else dummy
    # (the codes are checked in the loop: two passes of numpy's min() and max() cost more than it)
    bad = _group_reduce(
        codes, values, count, total, lo, hi, rows if rows is not None else count[:0], sums, mins, maxs, rows is not None
    )
    if bad >= 0:
        raise ValueError(f"group_reduce: codes must lie in [0, {ngroups}) (row {bad} has {codes[bad]})")
    return count, total if sums else None, lo if mins else None, hi if maxs else None


def _check_out(arr: Any, dtype: type, n: int, what: str, func: str = "group_reduce") -> None:
    """An output a kernel adds to in place: a writeable contiguous array of ``n`` ``dtype``."""
    if not (
        isinstance(arr, np.ndarray)
        and arr.dtype == dtype
        and arr.shape == (n,)
        and arr.flags.c_contiguous
        and arr.flags.writeable
    ):
        raise ValueError(f"{func}: {what} must be a contiguous {np.dtype(dtype).name} array of {n} groups")


#: Integer key types the compiled loops read as they are (others are widened to int64 first).
_KEY_TYPES = tuple(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32))


def _key(k: np.ndarray) -> np.ndarray:
    return (
        k if k.dtype in _KEY_TYPES and k.dtype.isnative and k.flags.c_contiguous else np.ascontiguousarray(k, np.int64)
    )


def int_range(k: np.ndarray) -> tuple[int, int]:
    """``(min, max)`` of a non-empty integer (or bool) column: numpy's ``min()`` and ``max()``, two
    vector passes, 9x faster than the one compiled loop that was here
    (``benchmarks/prediction_kernels.py``)."""
    if not len(k):
        raise ValueError("int_range of no values")
    return int(k.min()), int(k.max())


def keyed_reduce(
    keys: Sequence[np.ndarray],
    los: Sequence[int],
    strides: Sequence[int],
    n: int,
    out: tuple[np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None],
    values: np.ndarray | None = None,
    rows: np.ndarray | None = None,
    sketch: Any = None,
    keep: np.ndarray | None = None,
) -> bool:
    """:func:`group_reduce` of ``n`` rows keyed by ``keys`` (integer columns of ``n`` rows) without
    their group codes made whole: a row's group is ``sum((keys[j] - los[j]) * strides[j])``
    (mixed-radix, as ``groupby.encode`` makes them). ``out``: the ``(count, sum, min, max)`` of
    each group (int64, then float64 or ``None`` where not asked), added to in place, as the values
    that are not NaN (numbers, read as float64; none: the rows are only counted); ``rows`` (int64)
    adds each row, NaN or not. ``sketch``: a :class:`Sketch` of the groups, each value that is not
    NaN counted in it in the same pass (``False`` returned when its table is full: the outputs
    then partly added to; else ``True``); ``keep`` (bool, a row each): the rows where it is False
    left out, as if taken out first."""
    count, total, lo, hi = out
    ngroups = len(count) if isinstance(count, np.ndarray) else -1
    _check_out(count, np.int64, ngroups, "out's count", "keyed_reduce")
    for arr, what in ((total, "sum"), (lo, "min"), (hi, "max")):
        if arr is not None:
            _check_out(arr, np.float64, ngroups, f"out's {what}", "keyed_reduce")
    if rows is not None:
        _check_out(rows, np.int64, ngroups, "rows", "keyed_reduce")
    held = [_key(k) for k in keys]  # (alive through the call: the loop reads their addresses)
    if any(len(k) != n or k.ndim != 1 for k in held) or (values is not None and len(values) != n):
        raise ValueError(f"keyed_reduce: keys and values of {n} rows are needed")
    if values is not None and values.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        values = values.astype(np.float64)
    if keep is not None:
        if keep.dtype != np.dtype(bool) or keep.shape != (n,):
            raise ValueError(f"keyed_reduce: keep must be a bool of {n} rows")
        keep = np.ascontiguousarray(keep).view(np.uint8)
    dummy = np.zeros(1)
    bad = _keyed_reduce(
        np.array([k.ctypes.data for k in held], np.int64),
        np.array([_KEY_TYPES.index(k.dtype) for k in held], np.int32),
        np.array(los, np.int64),
        np.array(strides, np.int64),
        int(n),
        np.ascontiguousarray(values) if values is not None else dummy,
        values is not None,
        count,
        total if total is not None else dummy,
        lo if lo is not None else dummy,
        hi if hi is not None else dummy,
        rows if rows is not None else count[:0],
        total is not None,
        lo is not None,
        hi is not None,
        rows is not None,
        sketch,
        keep,
    )
    if bad >= 0:
        if sketch is not None:
            raise ValueError(
                f"keyed_reduce: row {bad}'s group is not in [0, {ngroups}), or its bucket not in the sketch's"
            )
        raise ValueError(f"keyed_reduce: row {bad}'s group is not in [0, {ngroups})")
    return bad != -2


def range_codes(k: np.ndarray, lo: int, n: int) -> np.ndarray:
    """``k - lo`` (int64) where it is in ``[0, n)``, else -1: the group codes of integer labels
    ``lo .. lo + n - 1``, in one compiled pass for any integer ``k``."""
    flat = np.ascontiguousarray(k).reshape(-1)
    out = np.empty(flat.shape, np.int64)
    if flat.dtype == np.uint64:  # (no fused type: values past int64 are out of any range)
        wide = flat.astype(np.int64)
        wide[flat > np.iinfo(np.int64).max] = -1 if lo >= 0 else lo - 1
        flat = wide
    _range_codes(_key(flat), int(lo), int(n), out)
    return out.reshape(np.shape(k))


def distance_to_parent(x: np.ndarray, y: np.ndarray, parent_xyz: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Per row, ``sqrt(dx * dx + dy * dy)`` in float64 from ``(x, y)`` to the first two columns of
    its parent's row ``pos`` in ``parent_xyz`` (an ego translation): numpy's formula on the parent
    columns taken per row, in one compiled pass without the takes."""
    return _distance(_distance_to_parent, x, y, parent_xyz, pos)


def distance_to_runs(x: np.ndarray, y: np.ndarray, parent_xyz: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """:func:`distance_to_parent` of rows in runs, one per parent row: the first ``counts[0]`` rows
    are the first parent's, and so on (``Rows.runs``: a chunk's rows and the frames that overlap
    it); the same values, each parent's position read once, no position per row made (one block
    of 160,000 agents: 0.21 against 0.25 ms, and the positions' 0.16 ms not made)."""
    return _distance(_distance_to_runs, x, y, parent_xyz, counts)


def _distance(kernel: Any, x: np.ndarray, y: np.ndarray, parent_xyz: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``kernel`` (``_columns.distance_to_parent`` or ``distance_to_runs``) on its arguments in the
    layouts it takes, into a new float64 array."""
    out = np.empty(len(x), np.float64)
    kernel(
        np.ascontiguousarray(x, np.float64),
        np.ascontiguousarray(y, np.float64),
        np.ascontiguousarray(parent_xyz, np.float64),
        np.ascontiguousarray(index, np.int64),
        out,
    )
    return out


def sketch_range(
    codes: np.ndarray, values: np.ndarray, bits: int, ngroups: int, rows: np.ndarray | None = None
) -> tuple[int, int, int, int]:
    """The first pass of a quantile sketch (``l5dask.prediction.groupby``): over the rows whose
    value (float32 or float64; their codes int64, in ``[0, ngroups)``) is not NaN, ``(their number, lowest bucket, highest bucket, highest code + 1)``, a bucket being the
    value's float64 bits ordered as the values with all but ``bits`` of the mantissa dropped
    (``groupby.buckets``); each row (NaN or not) added to ``rows[code]`` if given, in
    the same pass."""
    codes = np.ascontiguousarray(codes, np.int64)
    values = np.ascontiguousarray(values)
    if rows is not None:
        _check_out(rows, np.int64, ngroups, "rows", "sketch_range")
    out = np.zeros(4, np.int64)
    bad = _sketch_range(
        codes,
        values,
        52 - int(bits),
        rows if rows is not None else np.zeros(ngroups, np.int64),
        rows is not None,
        out,
    )
    if bad >= 0:
        raise ValueError(f"sketch_range: codes must lie in [0, {ngroups}) (row {bad} has code {codes[bad]})")
    n, lo, hi, g_hi = (int(v) for v in out)
    return n, lo, hi, g_hi


def sketch_counts(
    codes: np.ndarray,
    values: np.ndarray,
    bits: int,
    lo: int,
    span: int,
    counts: np.ndarray,
    rows: np.ndarray | None = None,
) -> None:
    """The second pass: each row whose value is not NaN added to
    ``counts[code * span + bucket - lo]`` (int32, in place; buckets from ``lo`` to ``lo + span -
    1``, as :func:`sketch_range` finds them), each row to ``rows[code]`` if given."""
    codes = np.ascontiguousarray(codes, np.int64)
    _check_out(counts, np.int32, len(counts) if isinstance(counts, np.ndarray) else -1, "counts", "sketch_counts")
    ngroups = len(rows) if isinstance(rows, np.ndarray) else -1
    if rows is not None:
        _check_out(rows, np.int64, ngroups, "rows", "sketch_counts")
    bad = _sketch_counts(
        codes,
        np.ascontiguousarray(values),
        52 - int(bits),
        int(lo),
        int(span),
        counts,
        rows if rows is not None else np.zeros(0, np.int64),
        rows is not None,
    )
    if bad >= 0:
        raise ValueError(
            f"sketch_counts: codes must lie in [0, {len(counts) // max(int(span), 1)}) and buckets in "
            f"[{lo}, {lo + span}) (row {bad} has code {codes[bad]})"
        )


def sketch_add(codes: np.ndarray, values: np.ndarray, sketch: Any, rows: np.ndarray | None = None) -> bool:
    """Each row whose value (float32 or float64) is not NaN counted in ``sketch`` (a
    :class:`Sketch`; the rows' ``codes``, int64, among its groups), each row (NaN or not) added to
    ``rows[code]`` if given, in one pass: ``True``, or ``False`` when the sketch's table is full
    (``rows`` then partly added to)."""
    codes = np.ascontiguousarray(codes, np.int64)
    values = np.ascontiguousarray(values)
    if values.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        values = values.astype(np.float64)
    if rows is not None:
        _check_out(rows, np.int64, len(rows) if isinstance(rows, np.ndarray) else -1, "rows", "sketch_add")
    bad = _sketch_add(codes, values, sketch, rows if rows is not None else np.zeros(0, np.int64), rows is not None)
    if bad >= 0:
        raise ValueError(
            f"sketch_add: row {bad} (code {codes[bad]}, value {values[bad]}) is out of the sketch's groups or exponents"
        )
    return bad != -2


def merge_sketches(
    a: tuple[np.ndarray, np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Two sketches' ``(group, bucket, count)`` (int64), each sorted by group then bucket without
    repeats, merged in one pass (a cell in both: its counts added), or ``None`` when one is not
    so sorted."""
    a = tuple(np.ascontiguousarray(x, np.int64) for x in a)  # type: ignore[assignment]
    b = tuple(np.ascontiguousarray(x, np.int64) for x in b)  # type: ignore[assignment]
    size = len(a[0]) + len(b[0])
    out = np.empty(size, np.int64), np.empty(size, np.int64), np.empty(size, np.int64)
    k = _merge_sketches(*a, *b, *out)
    if k < 0:
        return None
    return out[0][:k], out[1][:k], out[2][:k]


def norm2(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``sqrt(x * x + y * y)`` in float64, as numpy computes it from the arrays cast to float64; one
    compiled pass for float32 arrays (no casts, no temporaries)."""
    if x.dtype == np.float32 and y.dtype == np.float32 and len(x) == len(y):
        out = np.empty(len(x), np.float64)
        _norm2_f32(np.ascontiguousarray(x), np.ascontiguousarray(y), out)
        return out
    a, b = x.astype(np.float64), y.astype(np.float64)
    return np.sqrt(a * a + b * b)


def field_of_columns(parts: Sequence[np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    """A field of ``shape`` per row from the columns of its elements (``parts``, in the order of
    ``np.ndindex(shape)``): their transpose, no copy, where they are the rows of one array in
    that order (as :meth:`Gather.outputs` makes them), else stacked (a copy). The mean speed per
    scene and label through the xarray view: a velocity column pair stacked for each of 47 blocks
    (30 M agents: 0.24 GB copied, 10% of the process's page faults) is not."""
    base = parts[0].base if parts else None
    if (
        isinstance(base, np.ndarray)
        and base.ndim == 2
        and base.shape[0] == len(parts)
        and base.flags.c_contiguous
        and all(
            p.base is base and p.shape == base.shape[1:] and p.ctypes.data == base.ctypes.data + i * base.strides[0]
            for i, p in enumerate(parts)
        )
    ):
        return base.T.reshape(-1, *shape)
    return np.stack(parts, axis=1).reshape(-1, *shape)


class Gather:
    """A gather's plan for records of one dtype: number elements of fields (``(field, index)``;
    ``()`` for a scalar field) as contiguous arrays of their base dtype, the argmax (int8;
    first maximum, as numpy) of float32 fields, and the distinct values of one field
    (``distinct``: any fixed-size field, compared as bytes); made by the compiled loops when
    ``native``. The distinct values of the rows a call reads are appended to its ``found`` list
    (an array of the field's dtype, in no promised order)."""

    def __init__(
        self,
        dtype: np.dtype,
        elements: Sequence[tuple[str, tuple[int, ...]]],
        argmax: Sequence[str] = (),
        distinct: str | None = None,
    ) -> None:
        fields = fields_of(dtype)
        self.dtype, self.elements, self.argmax, self.distinct = dtype, list(elements), list(argmax), distinct
        if distinct is not None and fields[distinct][0].hasobject:
            raise ValueError(f"gather: the distinct values of {distinct!r}, a field of objects, are not supported")
        self.distinct_offset = fields[distinct][1] if distinct is not None else 0
        self.distinct_dtype = fields[distinct][0] if distinct is not None else None
        self.dtypes = [fields[f][0].base for f, _ in self.elements]
        # (fixed-size strings and bytes are copied as they are stored: a face id's 64 bytes)
        self.native = all(dt.isnative and dt.kind in "biufSUV" and not dt.hasobject for dt in self.dtypes) and all(
            fields[f][0].base == np.dtype(np.float32) and 0 < fields[f][0].shape[0] <= 127 for f in self.argmax
        )
        offsets = []
        for (f, idx), dt in zip(self.elements, self.dtypes):
            sub, off = fields[f][:2]
            offsets.append(off + (int(np.ravel_multi_index(idx, sub.shape)) if idx else 0) * dt.itemsize)
        self.offsets = np.array(offsets, np.int64)
        self.sizes = np.array([dt.itemsize for dt in self.dtypes], np.int64)
        self.argmax_offsets = np.array([fields[f][1] for f in self.argmax], np.int64)
        self.argmax_ncols = np.array([fields[f][0].shape[0] for f in self.argmax], np.int64)

    @staticmethod
    def of(
        dtype: np.dtype,
        elements: Sequence[tuple[str, tuple[int, ...]]],
        argmax: Sequence[str] = (),
        distinct: str | None = None,
    ) -> Gather:
        """The plan for these records and numbers, made once per process (a plan is never changed:
        threads share it; making one costs 30 us, a chunk's gather 400 us)."""
        return _plan(dtype, tuple((f, tuple(i)) for f, i in elements), tuple(argmax), distinct)

    def outputs(self, n: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Empty outputs of ``n`` rows: an element's column each (contiguous), those of one field's
        consecutive elements the rows of one ``(elements, n)`` array, so that the field is their
        transpose without a copy (``field_of_columns``)."""
        outs: list[np.ndarray] = []
        i = 0
        while i < len(self.elements):
            j = i + 1
            while j < len(self.elements) and self.elements[j][0] == self.elements[i][0]:
                j += 1
            outs.extend(np.empty((j - i, n), self.dtypes[i]) if j - i > 1 else [np.empty(n, self.dtypes[i])])
            i = j
        return outs, [np.empty(n, np.int8) for _ in self.argmax]

    def _addresses(self, outs: list[np.ndarray], maxes: list[np.ndarray], end: int) -> tuple[np.ndarray, np.ndarray]:
        """The outputs' addresses for the compiled loops, which write rows up to ``end``: checked
        to be contiguous arrays of the plan's types that hold them."""
        if (
            len(outs) != len(self.dtypes)
            or len(maxes) != len(self.argmax)
            or not all(
                isinstance(o, np.ndarray) and o.dtype == dt and o.flags.c_contiguous and len(o) >= end
                for o, dt in zip([*outs, *maxes], [*self.dtypes, *[np.dtype(np.int8)] * len(maxes)])
            )
        ):
            raise ValueError(f"gather: an output per column, contiguous, of its type and at least {end} rows expected")
        return np.array([o.ctypes.data for o in outs], np.int64), np.array([o.ctypes.data for o in maxes], np.int64)

    def addresses(
        self, outs: list[np.ndarray], maxes: list[np.ndarray], values: list[np.ndarray] | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
        """The outputs' addresses for the compiled gather (:meth:`blosc_ranges`), checked to be
        contiguous arrays of the plan's types (``values``: a float32 one per argmax), and the rows
        all of them hold (-1: no output)."""
        n = min((len(o) for o in [*outs, *maxes, *(values or ())]), default=-1)
        dests, adests = self._addresses(outs, maxes, max(n, 0))
        return dests, adests, self._value_addresses(values, 0, max(n, 0)), n

    def records(
        self,
        records: np.ndarray,
        outs: list[np.ndarray],
        maxes: list[np.ndarray],
        row0: int = 0,
        found: list[np.ndarray] | None = None,
        values: list[np.ndarray] | None = None,
        codes: np.ndarray | None = None,
    ) -> None:
        """From decoded records, into rows ``row0 ..`` of the outputs (and ``found``; and with
        ``values``, a float32 output per argmax field, each row's maximum: numpy's ``max``, NaN
        where the row holds one; and with ``codes``, an int32 output, each row's distinct value as
        its index among those this call adds to ``found``)."""
        n = len(records)
        if not n:
            return
        if self.distinct is not None:
            if codes is None:
                self._found(found).append(records[self.distinct][distinct_values(records, self.distinct)])
            else:
                field = np.ascontiguousarray(records[self.distinct])
                local, first = byte_codes(field.view(np.uint8).reshape(n, -1))
                self._found(found).append(field[first])
                codes[row0 : row0 + n] = local
        if not self.native or not records.flags.c_contiguous:
            for out, (f, idx) in zip(outs, self.elements):
                out[row0 : row0 + n] = records[f][(slice(None), *idx)]  # type: ignore[arg-type]
            for out, f in zip(maxes, self.argmax):
                out[row0 : row0 + n] = argmax_rows(records, f)
            for out, f in zip(values or (), self.argmax):
                out[row0 : row0 + n] = records[f].max(axis=1)
            return
        dests, adests = self._addresses([o[row0:] for o in outs], [o[row0:] for o in maxes], n)
        _gather_fields(
            records.view(np.uint8).reshape(-1),
            n,
            records.dtype.itemsize,
            self.offsets,
            self.sizes,
            dests,
            self.argmax_offsets,
            self.argmax_ncols,
            adests,
            self._value_addresses(values, row0, row0 + n),
        )

    def value_outputs(self, n: int) -> list[np.ndarray]:
        """A float32 output per argmax field, for its rows' maxima (``values`` of the gathers)."""
        return [np.empty(n, np.float32) for _ in self.argmax]

    def _value_addresses(self, values: list[np.ndarray] | None, start: int, end: int) -> np.ndarray | None:
        """The addresses of the maxima's outputs from row ``start`` on, which the compiled loops
        write up to row ``end``: checked as :meth:`_addresses` checks the others."""
        if values is None:
            return None
        if len(values) != len(self.argmax) or not all(
            isinstance(v, np.ndarray) and v.dtype == np.float32 and v.flags.c_contiguous and len(v) >= end
            for v in values
        ):
            raise ValueError(f"gather: a contiguous float32 output of at least {end} rows per argmax expected")
        return np.array([v[start:].ctypes.data for v in values], np.int64)

    def blosc(
        self,
        raw,
        chunk_rows: int,
        rows: int,
        outs: list[np.ndarray],
        maxes: list[np.ndarray],
        row0: int,
        scratch: np.ndarray,
        found: list[np.ndarray] | None = None,
        values: list[np.ndarray] | None = None,
        codes: np.ndarray | None = None,
    ) -> tuple[bool, np.ndarray]:
        """Straight from one blosc-compressed chunk of ``chunk_rows`` records: its first ``rows``
        into rows ``row0 ..`` of the outputs (and ``found``), without decoding the records
        (``_blosc.h``). ``(done, scratch)``: not done for a chunk of another kind, or corrupt
        (decode it instead; nothing was added to ``found``); ``scratch`` (a block of bytes, grown
        to the chunk's blocks) is handed back for the next."""
        status, scratch = self.blosc_status(raw, chunk_rows, rows, outs, maxes, row0, scratch, found, values, codes)
        return status == 0, scratch

    def blosc_status(
        self,
        raw,
        chunk_rows: int,
        rows: int,
        outs: list[np.ndarray],
        maxes: list[np.ndarray],
        row0: int,
        scratch: np.ndarray,
        found: list[np.ndarray] | None = None,
        values: list[np.ndarray] | None = None,
        codes: np.ndarray | None = None,
    ) -> tuple[int, np.ndarray]:
        """As :meth:`blosc`, with the compiled reader's status: 0 done, 1 a chunk of another kind,
        -1 corrupt (one c-blosc refuses too: ``tests/test_properties.py``)."""
        if row0 < 0 or not 0 <= rows <= chunk_rows:
            raise ValueError("gather: rows of the chunk out of range")
        one = np.array([0], np.int64), np.array([rows], np.int64), np.array([row0], np.int64)
        return self.blosc_ranges(raw, chunk_rows, *one, outs, maxes, scratch, found, values, codes)

    def blosc_ranges(
        self,
        raw,
        chunk_rows: int,
        lo: np.ndarray,
        hi: np.ndarray,
        dst: np.ndarray,
        outs: list[np.ndarray],
        maxes: list[np.ndarray],
        scratch: np.ndarray,
        found: list[np.ndarray] | None = None,
        values: list[np.ndarray] | None = None,
        codes: np.ndarray | None = None,
        addresses: tuple | None = None,
    ) -> tuple[int, np.ndarray]:
        """As :meth:`blosc_status` for the rows ``[lo[i], hi[i])`` (int64: sorted, disjoint,
        within the chunk) of one chunk, into rows ``dst[i] ..`` of the outputs (and ``codes``), the
        distinct values of all of them appended to ``found`` as one array: the blocks that hold
        none of them are decompressed and checked too, not gathered. ``(status, scratch)``.
        ``addresses``: :meth:`addresses` of these outputs, made once for many calls into them."""
        if self.distinct is not None:
            self._found(found)
        if not self.native or sys.byteorder != "little":
            return 1, scratch
        buf = np.frombuffer(raw, np.uint8)
        size = _blosc_blocksize(buf)
        if not 0 < size <= chunk_rows * self.dtype.itemsize:  # (a corrupt header: no scratch sized by it)
            return 1, scratch
        if size > len(scratch):
            scratch = np.empty(size, np.uint8)
        dests, adests, vaddr, out_rows = self.addresses(outs, maxes, values) if addresses is None else addresses
        width = self.distinct_dtype.itemsize if self.distinct_dtype is not None else 0
        seen = np.empty(max(0, int((hi - lo).sum())) * width, np.uint8) if width else None
        status, nfound = _gather_blosc(  # (the ranges, and that the outputs hold their rows: checked there)
            buf,
            self.dtype.itemsize,
            chunk_rows,
            lo,
            hi,
            dst,
            scratch,
            self.offsets,
            self.sizes,
            dests,
            self.argmax_offsets,
            self.argmax_ncols,
            adests,
            self.distinct_offset,
            width,
            seen,
            vaddr,
            codes if width else None,
            out_rows,
        )
        dt = self.distinct_dtype
        if status == 0 and seen is not None and found is not None and dt is not None:
            # (a copy: the buffer has room for every row, the values found are few)
            found.append(seen[: nfound * width].view(dt.base).reshape(nfound, *dt.shape).copy())
        return status, scratch

    def _found(self, found: list[np.ndarray] | None) -> list[np.ndarray]:
        if found is None:
            raise ValueError(f"gather: the distinct values of {self.distinct!r} need a list to go in (found)")
        return found


@functools.lru_cache(maxsize=256)
def _plan(dtype: np.dtype, elements: tuple, argmax: tuple, distinct: str | None) -> Gather:
    return Gather(dtype, elements, argmax, distinct)


config.on_reset(_plan.cache_clear)


def gather(
    records: np.ndarray,
    elements: list[tuple[str, tuple[int, ...]]],
    argmax: Sequence[str] = (),
    distinct: str | None = None,
    found: list[np.ndarray] | None = None,
    values: list[np.ndarray] | None = None,
    codes: list[np.ndarray] | None = None,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """In one pass over the records: elements of fields of each row (``(field, index)``; ``()``
    for a scalar field) as contiguous arrays of their base dtype, the argmax (int8; first
    maximum, as numpy) of each float32 field in ``argmax``, and the distinct values of the field
    ``distinct``, appended to ``found`` (see :class:`Gather`); with a list ``values``, the maximum
    (float32, NaN where the row holds one) of each ``argmax`` field appended to it; with a list
    ``codes`` (and ``distinct``), each row's distinct value as an index into the concatenation of
    the arrays this call appends to ``found`` (int32), appended to it."""
    plan = Gather.of(records.dtype, elements, argmax, distinct)
    outs, maxes = plan.outputs(len(records))
    vals = plan.value_outputs(len(records)) if values is not None else None
    out_codes = np.empty(len(records), np.int32) if codes is not None and distinct is not None else None
    plan.records(records, outs, maxes, 0, found, vals, out_codes)
    if codes is not None and out_codes is not None:
        codes.append(out_codes)
    if values is not None and vals is not None:
        values.extend(vals)
    return outs, maxes
