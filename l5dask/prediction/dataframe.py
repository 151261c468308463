"""Each stored array as a dask DataFrame, with join columns: ``ds.to_dask_dataframe(...)``.

One partition per task of stored chunks (sized as the engine sizes a pass), known divisions
(the row index), the columns of :mod:`l5dask.prediction.columns`. Building the DataFrame reads nothing
(except the scenes' host names when a ``host`` column is asked for: they are its categories).
Building or inspecting its graph computes nothing: join columns come from the parent's rows, one
pass over the frames in the same graph (each chunk decoded once, held by one task; see
:meth:`l5dask.core.engine.Job.hold`); each partition decodes each of its stored chunks once and
copies out only the fields its columns need.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import pandas as pd
from dask.base import tokenize

from l5dask.core.engine import Block, Job, Pass, Reduction, Rows
from l5dask.core.policy import collection_chunks_per_task, compute
from l5dask.errors import UsageError
from l5dask.prediction import format as fmt
from l5dask.prediction.columns import INDEX, Selection, Table
from l5dask.prediction.groupby import (
    QUANTILE_BITS,
    GroupPart,
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
    import dask.dataframe as dd

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
        return dd.from_pandas(meta, npartitions=1)
    bounds = [source.chunk_bounds(f)[0] for f, _ in groups] + [
        source.chunk_bounds(groups[-1][0] + groups[-1][1] - 1)[1]
    ]
    divisions = tuple(bounds[:-1]) + (bounds[-1] - 1,)
    token = tokenize(selection, groups)
    name = f"l5-df-{fmt.SHORT_NAMES[table.array]}-{token}"
    keys = [(name, i) for i in range(len(groups))]

    graph = chunk_tasks(ds, selection, groups, keys, _partition)
    return dd.from_graph(graph, meta, divisions, keys, f"l5-df-{fmt.SHORT_NAMES[table.array]}")


def _sketch_partition(by: list[str], column: str, bits: int, frames: list[pd.DataFrame], i: int, parent) -> GroupPart:
    """The quantile sketch of one partition (``frames``: it alone), per group of ``by``
    (categorical codes or integers; rows with a missing category left out)."""
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
    values = frame[column].to_numpy(dtype=np.float64, na_value=np.nan)
    return group_part(keys, {"v": values}, {"v": {"sketch"}}, bits, keep)


def quantiles(df, by: Sequence[str] | str, column: str, q, quantile_bits: int | None = None) -> pd.DataFrame:
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

    Returns
    -------
    pandas.DataFrame
        A row per group that has values (indexed by the groups, categories by name, sorted), a
        column per probability.
    """
    bits = QUANTILE_BITS if quantile_bits is None else quantile_bits
    if not isinstance(bits, (int, np.integer)) or not 0 <= bits <= 52:
        raise UsageError(f"quantile_bits must be an integer from 0 to 52, not {quantile_bits!r}")
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
    qs = np.atleast_1d(np.asarray(q, dtype=np.float64))
    if ((qs < 0) | (qs > 1) | np.isnan(qs)).any():
        raise UsageError(f"quantiles are probabilities in [0, 1], not {q!r}")
    parts = df[by + [column]].to_delayed()
    sketch = Reduction(
        f"l5-df-quantiles-{tokenize(by, column, int(bits))}",
        functools.partial(_sketch_partition, by, column, int(bits)),
        combine_parts,
        functools.partial(empty_part, len(by), {"v": {"sketch"}}),
    )
    root = reduce_parts([[p.key] for p in parts], sketch, f"{sketch.name}-{tokenize(parts)}", parts)
    job = Job()  # (the result is a pandas DataFrame: computed here)
    part = compute(root, client=job.client, **job.kw)
    stats = stats_of(part, "v", int(bits))
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
