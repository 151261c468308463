"""The ``.l5`` accessor of xarray objects: grouping by the join coordinates of
:meth:`L5Dataset.joined <l5dask.prediction.dataset.L5Dataset.joined>` without ceremony
(coordinates that know their values: no ``labels`` to pass), quantiles by the sketch of
:mod:`l5dask.prediction.groupby`. Registered when l5dask's prediction data is opened."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from typing import Any

import dask.array as da
import numpy as np
import xarray as xr
from xarray.groupers import EncodedGroups, UniqueGrouper

from l5dask.core.engine import Reduction
from l5dask.core.policy import ComputedLocally
from l5dask.errors import UnknownNameError, UsageError
from l5dask.prediction import format as fmt
from l5dask.prediction.groupby import (
    AGGREGATIONS,
    QUANTILE_BITS,
    Aggregation,
    GroupPart,
    checked_bits,
    checked_probabilities,
    combine_parts,
    empty_part,
    group_part,
    quantile,
    reduce_parts,
    stats_of,
)
from l5dask.prediction.kernels import int_range, range_codes

#: The coordinates :func:`~l5dask.prediction.views.joined_dataset` adds (of agents, tl_faces or frames).
JOIN_COORDS = ("frame_index", "scene_index", "timestamp", "hour", "host", "label", "status")
#: The array of a view's row dimension (the views' ``ROW_DIMS``, which import this module).
_ARRAY_OF_ROW_DIM = {"agent": fmt.AGENTS, "tl_face": fmt.TL_FACES, "frame": fmt.FRAMES}


def groupers(obj, names: Sequence[str]) -> dict:
    """xarray groupers for coordinates that know their values (see :func:`joined_dataset`)."""
    out = {}
    for n in names:
        if n not in obj.coords:
            hint = ""
            if n in JOIN_COORDS:  # a view of the stored fields (xr.open_dataset(..., engine="l5kit"), ds.agents)
                array = next((a for d, a in _ARRAY_OF_ROW_DIM.items() if d in obj.dims), fmt.AGENTS)
                hint = (
                    f"; {n!r} is a join coordinate: l5dask.open_dataset(path).joined({array!r}) adds it "
                    '(xr.open_dataset(path, engine="l5kit") and ds.agents hold the stored fields only)'
                )
            raise UnknownNameError(
                f"no coordinate {n!r} to group by; the coordinates are: {', '.join(map(str, obj.coords)) or 'none'}"
                + hint
            )
        attrs = obj.coords[n].attrs
        if "flag_values" in attrs:
            labels = np.asarray(attrs["flag_values"])
        elif "valid_range" in attrs:
            lo, hi = (int(v) for v in attrs["valid_range"])
            labels = np.arange(lo, hi + 1)
        else:
            raise UsageError(
                f"{n!r} does not know its values (no flag_values or valid_range): group by it with "
                f"obj.groupby({n}=UniqueGrouper(labels=...))"
            )
        out[n] = (RangeGrouper if _is_range(labels) else UniqueGrouper)(labels=labels)
    return out


def _is_range(labels: np.ndarray) -> bool:
    return (
        labels.dtype.kind in "iu"
        and len(labels) > 0
        and np.array_equal(labels, np.arange(labels[0], labels[0] + len(labels)))
    )


class RangeGrouper(UniqueGrouper):
    """A ``UniqueGrouper`` whose labels are the integers ``lo .. lo + n - 1`` (the codes of a
    category, an index's valid range): a value's group code is ``value - lo`` (-1 outside), one
    compiled pass a block, where ``UniqueGrouper`` sorts and searches the labels for each value
    (a search, an ``isin`` and masks: most of a groupby's time over 30 M rows)."""

    def factorize(self, group) -> EncodedGroups:
        import pandas as pd

        if group.dtype.kind not in "iu":
            return super().factorize(group)
        self.group = group
        labels = np.asarray(self.labels)
        lo, n = int(labels[0]), len(labels)
        codes = xr.apply_ufunc(
            range_codes,
            group,
            kwargs={"lo": lo, "n": n},
            dask="parallelized",
            output_dtypes=[np.int64],
            keep_attrs=True,
        )
        return EncodedGroups(
            codes=codes,
            full_index=pd.Index(self.labels),
            unique_coord=xr.Variable(dims=codes.name, data=self.labels, attrs=group.attrs),
        )


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


def label_codes(k: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each value's position in ``labels`` (int64), -1 for a value that is none of them: one
    compiled pass for labels ``lo .. lo + n - 1`` (:func:`~l5dask.prediction.kernels.range_codes`),
    else a search of the sorted labels."""
    if _is_range(labels) and k.dtype.kind in "iu":
        return range_codes(k, int(labels[0]), len(labels))
    order = np.argsort(labels, kind="stable")
    pos = np.minimum(np.searchsorted(labels, k, sorter=order), len(labels) - 1)
    return np.where(labels[order[pos]] == k, order[pos], -1).astype(np.int64)


def _block_part(
    labels: tuple[np.ndarray, ...], needs: frozenset[str], bits: int, blocks: list[np.ndarray], i: int, parent
) -> GroupPart:
    """The partial of one block of a 1-D variable (``blocks``: its values, then each grouping
    coordinate's block), per group of the coordinates' values, keyed by their positions in each
    coordinate's ``labels``; rows whose key is none of its labels left out (as xarray's groupers
    leave them)."""
    values, *keys = blocks
    if len(values) and all(_zero_based(k, lab) for k, lab in zip(keys, labels)):
        # (labels 0 .. n - 1 and keys of them: each key is its own code, none made or left out;
        # two int64 columns and four passes a block fewer)
        ranges = [int_range(k) for k in keys]
        if all(lo >= 0 and hi < len(lab) for (lo, hi), lab in zip(ranges, labels)):
            return group_part(list(keys), {"v": values}, {"v": set(needs)}, bits, ranges=ranges)
    codes = [label_codes(k, lab) for k, lab in zip(keys, labels)]
    keep = None
    if len(values) and min(int(c.min()) for c in codes) < 0:
        keep = np.logical_and.reduce([c >= 0 for c in codes])
    return group_part(codes, {"v": values}, {"v": set(needs)}, bits, keep)


def _zero_based(k: np.ndarray, labels: np.ndarray) -> bool:
    """Whether ``labels`` are ``0 .. n - 1`` and ``k`` integers the compiled group loops read as
    they are (any width but uint64)."""
    return k.ndim == 1 and k.dtype.kind in "iu" and k.dtype != np.uint64 and _is_range(labels) and int(labels[0]) == 0


def _grid(
    aggs: tuple[Aggregation, ...],
    labels: tuple[np.ndarray, ...],
    bits: int,
    squeeze: bool,
    dtype: np.dtype,
    column: str,
    part: GroupPart,
) -> np.ndarray:
    """The aggregations of each group of a merged partial (keyed by positions in the ``labels``)
    on the grid of the groups' labels (the last axis: one per aggregation, none with ``squeeze``
    and one aggregation; a group without values, no rows or only NaN ones, holds the
    aggregation's fill value, as in xarray's results). ``dtype``, ``column``: the variable's (an
    integer one's quantiles exact or refused)."""
    out = np.empty((*[len(x) for x in labels], len(aggs)))
    stats = stats_of(part, "v", bits, column, dtype)
    for i, agg in enumerate(aggs):
        out[..., i] = agg.fill_value
        values = agg.finalize(stats)
        where: tuple[Any, ...] = (*part.keys.T, i)
        out[where] = values if stats.n is None else np.where(stats.n > 0, values, agg.fill_value)
    return out[..., 0] if squeeze else out


class LocalArray(ComputedLocally, da.Array):
    """The dask array of a result of the accessor's declared reductions: dask's own, computed as
    the package's collections are (:class:`~l5dask.core.policy.ComputedLocally`): its
    ``.values``, ``.to_series()`` or ``np.asarray`` on local threads without importing
    ``distributed`` where no client can exist (dask imports it to look for one: 0.15-0.2 s of CPU
    of the mean speed per scene and label over 30 M agents through the xarray view)."""


def group_reduce_lazily(
    obj: xr.DataArray,
    names: Sequence[str],
    labels: dict[str, np.ndarray],
    aggs: Sequence[Aggregation],
    quantile_bits: int = QUANTILE_BITS,
    dim: str = "aggregation",
    dim_coord: np.ndarray | None = None,
    squeeze: bool = False,
) -> xr.DataArray:
    """Declared aggregations of a dask-backed 1-D DataArray per group of the coordinates
    ``names`` (``labels``: each one's values), in one pass: a partial per block
    (:func:`~l5dask.prediction.groupby.group_part`), merged by the engine's ordered tree
    (:func:`~l5dask.prediction.groupby.reduce_parts`), laid on the grid of the labels; lazy until
    computed (a :class:`LocalArray`). Dims: ``names``, then ``dim``: one per aggregation (its
    coordinate ``dim_coord``); with ``squeeze`` and one aggregation, ``names`` alone (as
    xarray's ``squeeze(dim)``: ``dim_coord``'s one value a scalar coordinate)."""
    from dask.base import tokenize

    data = obj.data
    keys = [
        k.rechunk(data.chunks) if isinstance(k, da.Array) else da.from_array(np.asarray(k), chunks=data.chunks)
        for k in (obj.coords[n].data for n in names)
    ]
    aggs = tuple(aggs)
    grid = tuple(np.asarray(labels[n]) for n in names)
    needs = frozenset(s for a in aggs for s in a.needs)
    token = tokenize(data, *keys, aggs, grid, quantile_bits)
    red = Reduction(
        f"l5-groupby-{token}",
        functools.partial(_block_part, grid, needs, quantile_bits),
        combine_parts,
        functools.partial(empty_part, len(names), {"v": set(needs)}),
        functools.partial(_grid, aggs, grid, quantile_bits, squeeze, obj.dtype, str(obj.name or "the variable")),
    )
    blocks = [a.__dask_keys__() for a in (data, *keys)]
    root = reduce_parts(list(zip(*blocks)), red, red.name, [data, *keys])
    shape = tuple(len(x) for x in grid) + (() if squeeze else (len(aggs),))
    out = da.from_delayed(root, shape=shape, dtype=np.float64)
    out = LocalArray(out.dask, out.name, out.chunks, dtype=np.float64, meta=np.empty((0,) * len(shape)))
    coords: dict[str, Any] = {n: (n, labels[n], obj.coords[n].attrs) for n in names}
    if dim_coord is not None:
        coords[dim] = ((), np.asarray(dim_coord)[0]) if squeeze else dim_coord
    # (a Variable: given a dask array and no name, xarray names the DataArray after the array's
    # graph key, "from-value-<token>", where xarray's own groupby of an unnamed variable gives none)
    data = xr.Variable((*names,) if squeeze else (*names, dim), out)
    return xr.DataArray(data, coords=coords, name=obj.name)


def sketch_quantile(
    obj: xr.DataArray, names: Sequence[str], labels: dict[str, np.ndarray], q, quantile_bits: int | None = None
) -> xr.DataArray:
    """Quantiles of a dask-backed 1-D DataArray per group of the coordinates ``names``, in one
    pass: the sketch of :mod:`l5dask.prediction.groupby` (its error bound) per chunk, merged in a tree."""
    bits = checked_bits(quantile_bits)
    if obj.ndim != 1:
        raise UsageError(f"quantiles per group of a 1-D variable: select one element first (dims {obj.dims})")
    qs = checked_probabilities(q)
    aggs = [quantile(float(qq)) for qq in qs]
    result = group_reduce_lazily(obj, names, labels, aggs, bits, "quantile", qs, squeeze=not np.ndim(q))
    result.attrs["l5dask_quantile_bits"] = bits
    return result


#: The reductions of ``.l5.groupby(...)`` made by the declared aggregations (one pass, the
#: engine's tree) for a dask-backed 1-D float64 or bool DataArray called without arguments, as
#: xarray makes them: a float64 result, ``sum`` 0 and the others NaN for a group without rows.
#: The others, and any call with arguments, are xarray's (flox).
DECLARED = ("count", "sum", "mean", "min", "max")


class _Grouped:
    """An xarray GroupBy whose results name their categories (``label`` names, not codes);
    ``quantile`` is computed in one pass with a sketch (flox's needs a group in one chunk)."""

    def __init__(self, grouped, obj=None, names: Sequence[str] = (), labels: dict | None = None) -> None:
        # (``grouped``: xarray's GroupBy, or a function that makes it when first needed: the
        # declared reductions never need it, and making it builds the index of every combination
        # of the groups' labels, 0.02-0.07 s for scenes x labels)
        self._make, self._obj, self._names, self._labels = grouped, obj, tuple(names), labels or {}

    @functools.cached_property
    def _grouped(self):
        return self._make() if callable(self._make) else self._make

    def __getitem__(self, key):
        return _Grouped(
            self._grouped[key], self._obj[key] if self._obj is not None else None, self._names, self._labels
        )

    def quantile(self, q, quantile_bits: int | None = None, **kwargs):
        """Quantiles per group (numpy's "linear" method) of a dask-backed 1-D DataArray, within
        the error bound of :mod:`l5dask.prediction.groupby` (``quantile_bits=52``: exact); else xarray's."""
        obj = self._obj
        if isinstance(obj, xr.DataArray) and hasattr(obj.data, "dask") and obj.ndim == 1 and not kwargs:
            return name_categories(sketch_quantile(obj, self._names, self._labels, q, quantile_bits))
        return name_categories(self._grouped.quantile(q, **kwargs))

    def median(self, quantile_bits: int | None = None, **kwargs):
        """The median per group of a dask-backed 1-D DataArray: :meth:`quantile` of 0.5, the same
        definition (xarray's median of a dask array goes through flox, which needs each group in
        one chunk: a TypeError); else xarray's."""
        obj = self._obj
        if isinstance(obj, xr.DataArray) and hasattr(obj.data, "dask") and obj.ndim == 1 and not kwargs:
            return self.quantile(0.5, quantile_bits).drop_vars("quantile", errors="ignore")
        return name_categories(self._grouped.median(**kwargs))

    def _declared(self, name: str):
        obj = self._obj
        if not (
            name in DECLARED
            and isinstance(obj, xr.DataArray)
            and hasattr(obj.data, "dask")
            and obj.ndim == 1
            and (obj.dtype == np.float64 or obj.dtype == bool)
            and not (name in ("min", "max") and obj.dtype == bool)
        ):
            return None
        agg = AGGREGATIONS[name]

        def call(*args, **kwargs):
            if args or kwargs:
                return name_categories(getattr(self._grouped, name)(*args, **kwargs))
            return name_categories(group_reduce_lazily(obj, self._names, self._labels, [agg], squeeze=True))

        return call

    def __getattr__(self, attr):
        if attr in ("_make", "_grouped"):  # (an AttributeError raised while making it: not a name of it)
            raise AttributeError(attr)
        declared = self._declared(attr)
        if declared is not None:
            return declared
        obj = self._obj
        if attr in ("min", "max", "sum") and isinstance(obj, xr.DataArray) and obj.dtype.kind in "iu":
            if obj.dtype.itemsize == 8:  # (int32 and less: exact in float64)
                warnings.warn(
                    f"{obj.name or 'the variable'}: .l5.groupby(...).{attr}() of {obj.dtype} is xarray's, in "
                    "float64 (NaN for a group without values): exact to 2**53 only (a timestamp in ns is rounded "
                    f"to up to 128 ns); l5dask.aggregate and l5dask agg keep {obj.dtype}, exact",
                    RuntimeWarning,
                    stacklevel=2,
                )
        value = getattr(self._grouped, attr)
        if not callable(value):
            return value

        def call(*args, **kwargs):
            return name_categories(value(*args, **kwargs))

        return call

    def __repr__(self) -> str:
        return repr(self._grouped)


def category_codes(obj, names) -> list[int]:
    """The codes of the category ``names`` (a name or names) of a variable of category codes (CF
    ``flag_values``/``flag_meanings``, as ``label``, ``host`` and ``status``), or one
    ``UsageError`` line: a name that is none of its categories, a variable without categories."""
    if not isinstance(obj, xr.DataArray):
        raise UsageError("a Dataset holds no categories: compare one of its variables (ds.label.l5 == ...)")
    what = "variable" if obj.name is None else str(obj.name)
    attrs = obj.attrs
    if "flag_values" not in attrs or "flag_meanings" not in attrs:
        raise UsageError(
            f"{what!r} holds no categories (no CF flag_values/flag_meanings): compare it with its values, "
            "not with names"
        )
    meanings = str(attrs["flag_meanings"]).split(" ")
    values = np.asarray(attrs["flag_values"]).tolist()
    if len(meanings) != len(values):
        raise UsageError(f"{what!r}: its {len(values)} flag_values have {len(meanings)} flag_meanings")
    codes = dict(zip(meanings, values))
    out = []
    for n in [names] if isinstance(names, str) else list(names):
        if not isinstance(n, str) or n not in codes:
            raise UsageError(f"{n!r} is not a {what}; they are: {', '.join(meanings)}")
        out.append(codes[n])
    return out


class L5Accessor:
    """``obj.l5``: grouping by join coordinates without ceremony, categories compared by name.

    ``speed.l5.groupby("scene_index", "label").mean()`` groups a dask-backed variable by lazy
    coordinates that know their values (no ``labels`` to pass, no codes computed first), with
    flox: one pass, each chunk decoded once. Results name their categories.

    ``joined.label.l5 == "PERCEPTION_LABEL_CAR"`` (``!=``, ``.l5.isin([...])``) compares a
    variable of category codes with category names, lazily, as cf_xarray's ``.cf ==`` does; a
    name that is not one of them is refused in one line. (``joined.label == "PERCEPTION_LABEL_CAR"``
    compares the integer codes with a string: False everywhere, which xarray cannot catch.)
    """

    __hash__ = None  # type: ignore[assignment]  # (== compares categories)

    def __init__(self, obj) -> None:
        self._obj = obj

    def __eq__(self, name):  # type: ignore[override]
        return self._obj == category_codes(self._obj, name)[0] if isinstance(name, str) else self._refuse(name)

    def __ne__(self, name):  # type: ignore[override]
        return self._obj != category_codes(self._obj, name)[0] if isinstance(name, str) else self._refuse(name)

    def isin(self, names: Sequence[str]):
        """Whether each value is one of the categories ``names``."""
        if isinstance(names, str):
            raise UsageError("isin takes a list of category names; compare one name with ==")
        return self._obj.isin(category_codes(self._obj, names))

    def _refuse(self, value):
        raise UsageError(f"compare a category with its name (a string), not {value!r}")

    def groupers(self, *names: str) -> dict:
        return groupers(self._obj, names)

    def groupby(self, *names: str, **kwargs):
        found = groupers(self._obj, names)
        obj = self._obj
        # (xarray's GroupBy made at once when given keywords, which it checks)
        grouped = functools.partial(obj.groupby, found, **kwargs) if not kwargs else obj.groupby(found, **kwargs)
        return _Grouped(grouped, obj, names, {n: np.asarray(g.labels) for n, g in found.items()})


xr.register_dataset_accessor("l5")(L5Accessor)
xr.register_dataarray_accessor("l5")(L5Accessor)
