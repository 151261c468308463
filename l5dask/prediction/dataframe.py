"""Each stored array as a dask DataFrame, with join columns: ``ds.to_dask_dataframe(...)``.

One partition per task of stored chunks (sized as the engine sizes a pass), known divisions
(the row index), the columns of :mod:`l5dask.prediction.columns`. Building the DataFrame reads nothing
(except the scenes' host names when a ``host`` column is asked for: they are its categories).
Building or inspecting its graph computes nothing: join columns come from the parent's rows, one
pass over the frames in the same graph (each chunk decoded once, held by one task; see
:meth:`l5dask.core.engine.Job.hold`); each partition decodes each of its stored chunks once and
copies out only the fields its columns need.

Its ``groupby(...)[column].mean()`` (``count``, ``sum``, ``min``, ``max``) of a float64 column by
integer or categorical columns (``observed=True`` for a categorical) is the declared aggregation
of :mod:`l5dask.prediction.groupby`, merged by the engine's one tree, as ``l5dask.aggregate`` and
the xarray view's ``.l5.groupby`` make it (pandas' groupby of each partition was 1.4 s of the
3.9 s of CPU of the mean speed per scene and label over 30 M agents); the same pandas Series as
dask's, lazy until computed. Any other grouping is dask's.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dask.dataframe as dd
import numpy as np
import pandas as pd
from dask.base import tokenize

from l5dask.core.engine import Block, Job, Pass, Reduction, Rows
from l5dask.core.policy import ComputedLocally, collection_chunks_per_task, compute
from l5dask.errors import UsageError
from l5dask.prediction import format as fmt
from l5dask.prediction.columns import INDEX, Selection, Table
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
from l5dask.prediction.joins import chunk_tasks


def category_dtype(names) -> pd.CategoricalDtype:
    """The dtype of a categorical column (its categories plain Python strings)."""
    return pd.CategoricalDtype(pd.Index(list(names), dtype=object))


def pandas_frame(selection: Selection, cols: dict[str, np.ndarray], lo: int, hi: int) -> pd.DataFrame:
    """A pandas DataFrame of made columns for rows ``lo .. hi - 1``: categoricals decoded, the
    row index a named ``RangeIndex`` (nothing materialized)."""
    data = {}
    for name in selection.names:
        col = selection.columns[name]
        values = cols[name]
        data[name] = (
            pd.Categorical.from_codes(values, dtype=category_dtype(col.categories), validate=False)
            if col.categorical
            else values
        )
    return pd.DataFrame(data, index=pd.RangeIndex(lo, hi, name=INDEX[selection.array]), copy=False)


def _partition(selection: Selection, first: int, n: int, rows: Rows | None, *blocks: Block) -> pd.DataFrame:
    """One partition: stored chunks ``first .. first + n - 1``, each decoded once, its columns
    made from the fields they need."""
    lo, hi, cols = selection.columns_of(first, n, rows, blocks)
    return pandas_frame(selection, cols, lo, hi)


def default_columns(table: Table) -> list[str]:
    """The stored fields' columns (no derived or join columns: those are asked for)."""
    return [n for n, c in table.columns.items() if c.kind == "stored"]


def to_dask_dataframe(
    ds,
    array: str = "agents",
    columns: Sequence[str] | None = None,
    joins: Sequence[str] = (),
    chunks_per_task: int | None = None,
):
    """A dask DataFrame of one array of ``ds``, its row index as the index (known divisions).

    Parameters
    ----------
    ds : L5Dataset
    array : str
        ``agents``, ``frames``, ``scenes`` or ``tl_faces``.
    columns : sequence of str, optional
        Any columns of :mod:`l5dask.prediction.columns` (stored, derived, join); default: the stored fields'.
    joins : sequence of str
        Join columns to add (``scene_index``, ``frame_index``, ``timestamp``, ``host``,
        ``ego_x``, ``ego_y``...); also accepted in ``columns``.
    chunks_per_task : int, optional
        Stored chunks per partition (default: :func:`l5dask.core.policy.collection_chunks_per_task`:
        about 100 MB of the partition's columns, at least 4 partitions a thread).
    """
    table = Table(ds, array)
    joins = list(joins)
    table.resolve(joins, "join")
    not_joins = [j for j in joins if not table.parent_columns([j])]
    if not_joins:
        join_names = [n for n in table.columns if table.parent_columns([n])]
        raise UsageError(
            f"not a join column of {fmt.SHORT_NAMES[table.array]}: {', '.join(not_joins)}; the join "
            f"columns are: {', '.join(join_names) or 'none (scenes have no parent)'}"
        )
    names = (list(columns) if columns is not None else default_columns(table)) + joins
    index = INDEX[table.array]
    names = [n for n in dict.fromkeys(names) if n != index]
    selection = table.select(names)
    source = selection.source
    row_bytes = sum(selection.columns[n].dtype.itemsize for n in selection.names)
    chunks_per_task = chunks_per_task or collection_chunks_per_task(
        source.nchunks, row_bytes=row_bytes, chunk_rows=source.chunk_bounds(0)[1] if source.nchunks else None
    )
    groups = Job(chunks_per_task=chunks_per_task).groups(Pass(source), guided=False)
    meta = pandas_frame(selection, selection.empty(), 0, 0)
    if not groups:
        return L5DataFrame(dd.from_pandas(meta, npartitions=1).expr)
    bounds = [source.chunk_bounds(f)[0] for f, _ in groups] + [
        source.chunk_bounds(groups[-1][0] + groups[-1][1] - 1)[1]
    ]
    divisions = tuple(bounds[:-1]) + (bounds[-1] - 1,)
    token = tokenize(selection, groups)
    name = f"l5-df-{fmt.SHORT_NAMES[table.array]}-{token}"
    keys = [(name, i) for i in range(len(groups))]

    graph = chunk_tasks(ds, selection, groups, keys, _partition)
    frame = L5DataFrame(dd.from_graph(graph, meta, divisions, keys, f"l5-df-{fmt.SHORT_NAMES[table.array]}").expr)
    return frame._made_of(Source(ds, table, tuple(groups)))


@dataclass(frozen=True)
class Source:
    """What the partitions of a frame of :func:`to_dask_dataframe` are made of: the table of
    ``ds``'s array whose columns they hold, and each partition's stored chunks."""

    ds: Any
    table: Table
    groups: tuple[tuple[int, int], ...]


#: The reductions of a grouped column made by the declared aggregations (see the module).
DECLARED = ("count", "sum", "mean", "min", "max")


class L5Series(ComputedLocally, dd.Series):
    """A dask Series of the declared aggregations of an :class:`L5DataFrame`'s groupby: dask's
    own, computed as the package's collections are (:class:`~l5dask.core.policy.ComputedLocally`)."""


class L5DataFrame(ComputedLocally, dd.DataFrame):
    """The dask DataFrame of :func:`to_dask_dataframe`: its ``groupby`` reduces a float64 column
    with the declared aggregations (see the module), and counts its groups' rows (``size()``);
    so does the frame of its rows a filter keeps (``df[df.distance_to_ego < 20]``) or of some of
    its columns. What else is derived from it is dask's own. Where no dask.distributed client
    can exist, it and its groupby's results compute on local threads without importing
    ``distributed`` (:func:`~l5dask.core.policy.collection_compute_kw`)."""

    def _made_of(self, source: Source | None) -> L5DataFrame:
        """This frame, its partitions known to be ``source``'s columns as made (``None``: not
        known) while its expression stays the one it has now (an assignment to a column
        changes it in place)."""
        object.__setattr__(self, "_l5_source", (source, self.__dask_tokenize__()) if source is not None else None)
        return self

    def _source(self) -> Source | None:
        """What its partitions are made of, if they are still the columns of
        :func:`to_dask_dataframe` as made (none was assigned, no row filtered out)."""
        made = getattr(self, "_l5_source", None)
        return made[0] if made is not None and made[1] == self.__dask_tokenize__() else None

    def __getitem__(self, key):
        out = super().__getitem__(key)
        # (dask makes its own DataFrame of the result: the rows or columns chosen are still this
        # frame's partitions; some of its columns are still made as this frame's)
        if type(out) is not dd.DataFrame:
            return out
        columns = isinstance(key, list) and all(isinstance(k, str) for k in key)
        return L5DataFrame(out.expr)._made_of(self._source() if columns else None)

    def groupby(self, by, group_keys=True, sort=None, observed=None, dropna=None, **kwargs):
        grouped = super().groupby(by, group_keys=group_keys, sort=sort, observed=observed, dropna=dropna, **kwargs)
        keys = [by] if isinstance(by, str) else list(by) if isinstance(by, (list, tuple)) else None
        dtypes = self.dtypes
        if (
            keys
            and not kwargs
            and sort in (None, True)
            and dropna in (None, True)
            and all(isinstance(k, str) and k in dtypes.index for k in keys)
            and len(set(keys)) == len(keys)
            and all(
                (isinstance(dtypes[k], pd.CategoricalDtype) and observed is True)
                or (not isinstance(dtypes[k], pd.CategoricalDtype) and np.dtype(dtypes[k]).kind in "iu")
                for k in keys
            )
        ):
            return _DeclaredGroupBy(self, grouped, keys, isinstance(by, str))
        return grouped


class _DeclaredGroupBy:
    """dask's GroupBy of an :class:`L5DataFrame`, whose float64 columns reduce by the declared
    aggregations."""

    def __init__(self, frame: L5DataFrame, grouped, keys: list[str], scalar: bool) -> None:
        self._frame, self._grouped, self._keys, self._scalar = frame, grouped, keys, scalar

    def __getitem__(self, key):
        inner = self._grouped[key]
        if isinstance(key, str) and key not in self._keys and self._frame.dtypes[key] == np.float64:
            return _DeclaredColumn(self, key, inner)
        return inner

    def size(self):
        """The rows of each group (pandas' ``size()``), counted by the declared partials."""
        g = self._grouped
        return declared_groupby(self._frame, self._keys, None, None, g.size()._meta)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if not hasattr(type(self._grouped), name) and name in self._frame.columns and name not in self._keys:
            return self[name]  # (as dask's: a method first, then a column)
        return getattr(self._grouped, name)


class _DeclaredColumn:
    """One float64 column of a :class:`_DeclaredGroupBy`: ``mean()`` and the others of
    ``DECLARED`` called without arguments are the declared aggregations; anything else dask's."""

    def __init__(self, group: _DeclaredGroupBy, column: str, inner) -> None:
        self._group, self._column, self._inner = group, column, inner

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        fallback = getattr(self._inner, name)
        if name not in DECLARED:
            return fallback

        def call(*args, **kwargs):
            if args or kwargs:
                return fallback(*args, **kwargs)
            g = self._group
            return declared_groupby(g._frame, g._keys, self._column, AGGREGATIONS[name], fallback()._meta)

        return call


def declared_groupby(df, by: list[str], column: str | None, agg: Aggregation | None, meta: pd.Series):
    """``df.groupby(by, observed=True)[column]`` reduced by ``agg`` (``None``, ``None``: the rows
    of each group, ``size()``), a lazy dask Series of one partition: a partial per partition
    (:func:`~l5dask.prediction.groupby.group_part`) merged by the engine's ordered tree
    (:func:`~l5dask.prediction.groupby.reduce_parts`), laid out as pandas lays out the groups
    (sorted, those with rows; ``meta``: dask's own result's)."""
    dtypes = df.dtypes
    needs = frozenset(agg.needs) if agg is not None else frozenset()
    names = by + ([column] if column is not None else [])
    source = df._source() if isinstance(df, L5DataFrame) else None
    if source is not None:
        # (the columns of each partition's stored chunks grouped a run of chunks at a time, as made:
        # no partition of them, no pandas frame)
        chunk = functools.partial(_group_chunks_part, by, column, QUANTILE_BITS, needs)
        parts = _chunk_parts(source, names, functools.partial(_group_chunks, by, column, QUANTILE_BITS, needs))
    else:
        chunk = functools.partial(_group_partition, by, column, QUANTILE_BITS, needs)
        parts = df[names].to_delayed()
    red = Reduction(
        f"l5-df-{agg.name if agg is not None else 'size'}-{tokenize(by, column, agg)}",
        chunk,
        combine_parts,
        functools.partial(empty_part, len(by), {"v": set(needs)} if column is not None else {}),
        functools.partial(_series, by, {b: dtypes[b] for b in by}, column, agg, meta),
    )
    root = reduce_parts([[p.key] for p in parts], red, f"{red.name}-{tokenize(parts)}", parts)
    return L5Series(dd.from_delayed([root], meta=meta, verify_meta=False).expr)


def _chunk_parts(source: Source, names: list[str], func) -> list:
    """A ``Delayed`` per partition of ``source``: ``func(selection, first, n, rows, *parent_blocks)``
    of its stored chunks, the selection of the columns ``names``."""
    from dask.delayed import Delayed
    from dask.highlevelgraph import HighLevelGraph

    selection = source.table.select(names)
    name = f"l5-df-chunks-{tokenize(selection, source.groups, func)}"
    keys = [(name, i) for i in range(len(source.groups))]
    graph = chunk_tasks(source.ds, selection, list(source.groups), keys, func)
    hlg = HighLevelGraph.from_collections(name, graph, dependencies=())
    return [Delayed(key, hlg, layer=name) for key in keys]


#: Stored chunks grouped at a time by a partition's task of a declared groupby: the mean speed
#: per scene and label over 30 M agents, the compute's CPU 0.88-0.92 s with 4, 0.97-1.09 s with
#: 16 (the partition's columns made whole: 1.08-1.14 s), 1.05-1.15 s with 1.
RUN = 4


def _group_chunks(
    by: list[str], column: str | None, bits: int, needs: frozenset[str], selection: Selection, first: int, n: int, *rest
) -> GroupPart:
    """The partial of one partition's stored chunks (``rest``: their parent rows, see
    :func:`~l5dask.prediction.joins.chunk_tasks`), grouped a run of chunks at a time
    (:meth:`~l5dask.prediction.columns.Selection.pieces`): the partial :func:`_group_partition`
    makes of the partition (its categorical columns' codes are the made columns)."""
    part = None
    for _, cols in selection.pieces(first, n, rest[0], tuple(rest[1:]), run=RUN):
        keys = [cols[b] for b in by]
        if column is None:
            p = group_part(keys, {}, {}, bits, None, n=len(keys[0]))
        else:
            p = group_part(keys, {"v": _values(cols[column])}, {"v": set(needs)}, bits)
        part = p if part is None else combine_parts(part, p)
    return part if part is not None else empty_part(len(by), {"v": set(needs)} if column is not None else {})


def _values(column: np.ndarray) -> np.ndarray:
    """A made column as the partial reduces it: integers and booleans as they are (exactly),
    the rest as float64."""
    return column if column.dtype.kind in "biu" else column.astype(np.float64, copy=False)


def _group_chunks_part(by, column, bits, needs, parts: list[GroupPart], i: int, parent) -> GroupPart:
    """A partition's partial made by its task (:func:`_group_chunks`), as the tree takes it."""
    (part,) = parts
    return part


def _series(
    by: list[str], dtypes: dict, column: str | None, agg: Aggregation | None, meta: pd.Series, part: GroupPart
) -> pd.Series:
    """The merged partial as pandas' groupby makes the result: a value per group with rows (its
    rows without ``agg``), indexed by the keys (categories by their dtype), sorted."""
    values = agg.finalize(stats_of(part, "v", QUANTILE_BITS)) if agg is not None else part.rows
    levels = []
    for j, b in enumerate(by):
        k = part.keys[:, j]
        if isinstance(dtypes[b], pd.CategoricalDtype):
            levels.append(pd.Categorical.from_codes(k, dtype=dtypes[b]))
        else:
            levels.append(k.astype(dtypes[b]))
    index = (
        pd.MultiIndex.from_arrays(levels, names=by).remove_unused_levels()
        if len(by) > 1
        else pd.Index(levels[0], name=by[0])
    )
    return pd.Series(np.asarray(values).astype(meta.dtype), index=index, name=meta.name)


def _group_partition(
    by: list[str], column: str | None, bits: int, needs: frozenset[str], frames: list[pd.DataFrame], i: int, parent
) -> GroupPart:
    """The statistics ``needs`` of ``column`` in one partition (``frames``: it alone), per group of
    ``by`` (categorical codes or integers; rows with a missing category left out); no ``column``:
    the rows of each group."""
    (frame,) = frames

    keys, keep = [], None
    for b in by:
        col = frame[b]
        if isinstance(col.dtype, pd.CategoricalDtype):
            codes = col.cat.codes.to_numpy()
            if (codes < 0).any():
                keep = (codes >= 0) if keep is None else keep & (codes >= 0)
            keys.append(codes)
        else:
            keys.append(col.to_numpy())
    if column is None:
        return group_part(keys, {}, {}, bits, keep, n=len(frame))
    col = frame[column]
    # (integers and booleans as they are, reduced exactly; the rest as float64, NA as NaN)
    values = (
        col.to_numpy()
        if isinstance(col.dtype, np.dtype) and col.dtype.kind in "biu"
        else col.to_numpy(dtype=np.float64, na_value=np.nan)
    )
    return group_part(keys, {"v": values}, {"v": set(needs)}, bits, keep)


def quantiles(
    df, by: Sequence[str] | str, column: str, q, quantile_bits: int | None = None, scheduler: Any = None
) -> pd.DataFrame:
    """Quantiles of ``column`` per group of ``by`` of a dask DataFrame, in one pass and no shuffle
    (dask's groupby has no quantile; ``groupby.apply`` moves every row to its group's partition).

    The sketch of :func:`l5dask.aggregate <l5dask.prediction.aggregation.aggregate>` per partition, merged in a tree: numpy's "linear"
    quantile within ``2 ** -(quantile_bits + 1)`` of the larger of the two order statistics it
    interpolates (1.2e-4 relative by default; ``quantile_bits=52``: exact). NaN values are skipped.

    Parameters
    ----------
    df : dask DataFrame
        Any, e.g. ``ds.to_dask_dataframe("agents", columns=["label", "extent_length"])``, filtered
        or extended as you like.
    by : str or sequence of str
        Categorical or integer columns.
    column : str
        A numeric column.
    q : float or sequence of float
        Probabilities in [0, 1].
    scheduler : optional
        Where the sketch runs (a ``distributed.Client`` or its address, ``"threads"``...; default:
        the active client, else local threads), as every function of the package takes it.

    Returns
    -------
    pandas.DataFrame
        A row per group that has values (indexed by the groups, categories by name, sorted), a
        column per probability.
    """
    bits = checked_bits(quantile_bits)
    by = [by] if isinstance(by, str) else list(by)
    missing = [c for c in by + [column] if c not in df.columns]
    if missing:
        raise UsageError(
            f"no column {', '.join(map(repr, missing))}; the columns are: {', '.join(map(str, df.columns))}"
        )
    dtypes = df.dtypes
    for b in by:
        if not (isinstance(dtypes[b], pd.CategoricalDtype) or np.dtype(dtypes[b]).kind in "biu"):
            raise UsageError(f"cannot group by {b!r} ({dtypes[b]}): group by integer or categorical columns")
    if isinstance(dtypes[column], pd.CategoricalDtype) or np.dtype(dtypes[column]).kind not in "biuf":
        raise UsageError(f"quantiles of {column!r} ({dtypes[column]}): a numeric column is needed")
    qs = checked_probabilities(q)
    parts = df[by + [column]].to_delayed()
    sketch = Reduction(
        f"l5-df-quantiles-{tokenize(by, column, int(bits))}",
        functools.partial(_group_partition, by, column, int(bits), frozenset({"sketch"})),
        combine_parts,
        functools.partial(empty_part, len(by), {"v": {"sketch"}}),
    )
    root = reduce_parts([[p.key] for p in parts], sketch, f"{sketch.name}-{tokenize(parts)}", parts)
    job = Job(scheduler)  # (the result is a pandas DataFrame: computed here)
    part = compute(root, client=job.client, **job.kw)
    stats = stats_of(
        part, "v", int(bits), column, None if isinstance(dtypes[column], pd.CategoricalDtype) else dtypes[column]
    )
    data = {qq: quantile(float(qq)).finalize(stats) for qq in qs}
    levels = []
    for j, b in enumerate(by):
        k = part.keys[:, j]
        cats = dtypes[b].categories if isinstance(dtypes[b], pd.CategoricalDtype) else None
        levels.append(pd.Categorical.from_codes(k, dtype=dtypes[b]) if cats is not None else k)
    index = pd.MultiIndex.from_arrays(levels, names=by) if len(by) > 1 else pd.Index(levels[0], name=by[0])
    out = pd.DataFrame(data, index=index)
    has = np.bincount(part.sketches["v"][0], minlength=len(part)) > 0
    return out[has]
