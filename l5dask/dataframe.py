"""Each stored array as a dask DataFrame, with join columns: ``ds.to_dask_dataframe(...)``.

One partition per task of stored chunks (sized as the engine sizes a pass), known divisions
(the row index), the columns of :mod:`l5dask.columns`. Building the DataFrame reads nothing
(except the scenes' host names when a ``host`` column is asked for: they are its categories).
Its graph is made when it is computed: join columns come from the parent's rows, one pass over
the frames (persisted, each chunk decoded once) whose blocks go to only the partitions they
overlap, as the report does; each partition decodes each of its stored chunks once and copies
out only the fields its columns need.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from dask.base import tokenize

from . import format as fmt
from .columns import INDEX, Selection, Table
from .engine import Block, Job, Pass, Rows, collection_chunks_per_task
from .errors import L5DaskError
from .joins import Deferred, chunk_tasks


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
        data[name] = pd.Categorical.from_codes(values, dtype=category_dtype(col.categories), validate=False) \
            if col.categorical else values
    return pd.DataFrame(data, index=pd.RangeIndex(lo, hi, name=INDEX[selection.array]), copy=False)


def _partition(selection: Selection, first: int, n: int, rows: Rows | None, *blocks: Block) -> pd.DataFrame:
    """One partition: stored chunks ``first .. first + n - 1`` read as one block (each decoded
    once), its columns made from the fields they need."""
    lo, data, cols = selection.block(first, n, rows, blocks)
    return pandas_frame(selection, cols, lo, lo + len(data))


def default_columns(table: Table) -> list[str]:
    """The stored fields' columns (no derived or join columns: those are asked for)."""
    return [n for n, c in table.columns.items() if c.kind == "stored"]


def to_dask_dataframe(ds, array: str = "agents", columns: Sequence[str] | None = None, joins: Sequence[str] = (),
                      chunks_per_task: int | None = None):
    """A dask DataFrame of one array of ``ds``, its row index as the index (known divisions).

    Parameters
    ----------
    ds : L5Dataset
    array : str
        ``agents``, ``frames``, ``scenes`` or ``tl_faces``.
    columns : sequence of str, optional
        Any columns of :mod:`l5dask.columns` (stored, derived, join); default: the stored fields'.
    joins : sequence of str
        Join columns to add (``scene_index``, ``frame_index``, ``timestamp``, ``host``,
        ``ego_x``, ``ego_y``...); also accepted in ``columns``.
    chunks_per_task : int, optional
        Stored chunks per partition (default: :func:`l5dask.engine.collection_chunks_per_task`,
        about 100 MB).
    """
    import dask.dataframe as dd

    table = Table(ds, array)
    joins = list(joins)
    table.resolve(joins, "join")
    not_joins = [j for j in joins if not table.parent_columns([j])]
    if not_joins:
        join_names = [n for n in table.columns if table.parent_columns([n])]
        raise L5DaskError(f"not a join column of {fmt.SHORT_NAMES[table.array]}: {', '.join(not_joins)}; the join "
                          f"columns are: {', '.join(join_names) or 'none (scenes have no parent)'}")
    names = (list(columns) if columns is not None else default_columns(table)) + joins
    index = INDEX[table.array]
    names = [n for n in dict.fromkeys(names) if n != index]
    selection = table.select(names)
    source = selection.source
    chunks_per_task = chunks_per_task or collection_chunks_per_task(source.nchunks)
    groups = Job(chunks_per_task=chunks_per_task).groups(Pass(source), guided=False)
    meta = pandas_frame(selection, selection.empty(), 0, 0)
    if not groups:
        return dd.from_pandas(meta, npartitions=1)
    bounds = [source.chunk_bounds(f)[0] for f, _ in groups] + [source.chunk_bounds(groups[-1][0] + groups[-1][1] - 1)[1]]
    divisions = tuple(bounds[:-1]) + (bounds[-1] - 1,)
    token = tokenize(selection, groups)
    name = f"l5-df-{fmt.SHORT_NAMES[table.array]}-{token}"
    keys = [(name, i) for i in range(len(groups))]

    def build() -> dict:
        return chunk_tasks(ds, selection, groups, keys, _partition)

    return dd.from_graph(Deferred(build, token=name), meta, divisions, keys, f"l5-df-{fmt.SHORT_NAMES[table.array]}")
