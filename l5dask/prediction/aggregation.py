"""Users' own aggregations, declared, in one pass over the stored chunks: :func:`~l5dask.prediction.aggregation.aggregate`.

``l5dask.aggregate(ds, "agents", by=["scene_index", "label"], values={"speed": ["mean", "max"]})``
is one :class:`~l5dask.core.engine.Reduction` (flox's shape: chunk, combine, finalize) run by the
engine as the report is: each stored chunk read once, its columns gathered straight from its
compressed bytes (:class:`~l5dask.prediction.reading.Encoded`: the records are never made) and from the
parent rows it overlaps (:mod:`l5dask.prediction.columns`), grouped, reduced; partials merged in an ordered
tree; the result a pandas DataFrame, a row per group that has rows (sorted by the keys).

Reductions of a value column: ``count`` (values that are not NaN), ``sum``, ``mean``, ``min``,
``max``, ``var`` and ``std`` (ddof=1, as pandas; merged with Chan's formula), ``median`` and
``q<percent>`` (``q50``, ``q99.9``). NaN values are skipped, as pandas does. Integer and
boolean columns are reduced exactly (``groupby.int_stats``): their min, max and sum in pandas'
dtypes, a sum that does not fit refused. Each is declared once,
an :class:`~l5dask.prediction.groupby.Aggregation` (the statistics it needs, its finalize) in
``l5dask.prediction.groupby.AGGREGATIONS``, which the xarray accessor and the dataframes'
quantiles use too.

Quantiles are computed from a sketch: each value's bucket is its float64 bit pattern with all
but ``quantile_bits`` bits of the mantissa dropped (sign and exponent kept), and each bucket's
count is kept exactly. A quantile is numpy's "linear" one with each of the two order statistics
it interpolates replaced by the midpoint of its bucket, so that
``|estimate - numpy| <= 2 ** -(quantile_bits + 1) * max(|x_lo|, |x_hi|)`` (``x_lo``, ``x_hi``
the two order statistics); zero is exact (its bucket stands for 0; it also holds the subnormal
numbers below ``2 ** (-1074 + 52 - quantile_bits)``, 5e-312 by default, which it rounds to 0).
With ``quantile_bits=52`` every column is exact (each bucket one float64 value; below, a bucket
stands for its midpoint, so that a float32 column too is exact only then). A quantile that falls
on one value is that value, an infinity too (numpy's formula makes NaN of ``x + inf * 0``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from l5dask.core.cache import open_cache
from l5dask.core.engine import Job, Pass, Plan, Reduction
from l5dask.core.lazy import import_paused
from l5dask.core.outputs import arrow_array, arrow_strings
from l5dask.core.policy import where_keywords
from l5dask.errors import UsageError
from l5dask.prediction import format as fmt
from l5dask.prediction.columns import INDEX, SHARED, Chunk, Kept, LazyHosts, Selection, Table
from l5dask.prediction.dataset import L5Dataset, open_dataset, warm_up
from l5dask.prediction.groupby import (
    AGGREGATIONS,
    QUANTILE_BITS,
    GroupPart,
    aggregation,
    checked_bits,
    combine_parts,
    counts_rows,
    exact,
    group_part,
    one_group,
    stats_of,
)
from l5dask.prediction.groupby import empty_part as group_empty_part
from l5dask.prediction.joins import coverage, covered, declared_parent_link
from l5dask.prediction.where import evaluate_where, where_columns

#: Groups allowed unless the caller says otherwise (checked before computing).
MAX_GROUPS = 10_000_000


# --- the declaration ------------------------------------------------------------------------
def parse_values(values: Mapping[str, Sequence[str] | str], table: Table) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``{column: [reductions]}`` checked: known columns, known reductions, numbers only."""
    if not isinstance(values, Mapping):
        raise UsageError(
            "values must map each column to its reductions, e.g. {'speed': ['mean', 'max']}, "
            f"not a {type(values).__name__}"
        )
    if not values:
        raise UsageError("no values to aggregate: give at least one column and its reductions (e.g. speed:mean)")
    out = []
    for col, reds in values.items():
        reds = (reds,) if isinstance(reds, str) else tuple(reds)
        table.resolve([col], "value column")
        if not reds:
            raise UsageError(f"no reductions for {col!r}; they are: {', '.join(AGGREGATIONS)}, q<percent> (q50, q99.9)")
        for r in reds:
            aggregation(r, of=col)
        c = table.columns[col]
        if (c.categorical or c.dtype.kind not in "biuf") and set(reds) - {"count"}:
            raise UsageError(
                f"{col!r} is {'categorical' if c.categorical else c.dtype.name if c.dtype.kind not in 'SU' else c.dtype.str[1:]}: "
                "only count applies" + (" (group by it instead)" if c.categorical else "")
            )
        out.append((col, tuple(dict.fromkeys(reds))))
    return tuple(out)


@dataclass(frozen=True)
class Spec:
    """One aggregation, as the tasks carry it."""

    selection: Selection
    by: tuple[str, ...]
    values: tuple[tuple[str, tuple[str, ...]], ...]
    where: str | None = None
    quantile_bits: int = QUANTILE_BITS

    def stats(self, col: str) -> set[str]:
        """The statistics the partial keeps for a value column: what its aggregations need."""
        return {s for r in dict(self.values)[col] for s in aggregation(r).needs}

    def __dask_tokenize__(self):
        from dask.base import tokenize

        return (
            "l5dask.prediction.aggregation.Spec",
            tokenize(self.selection),
            self.by,
            self.values,
            self.where,
            self.quantile_bits,
        )


# --- the partial ----------------------------------------------------------------------------
def empty_part(spec: Spec) -> GroupPart:
    return group_empty_part(
        len(spec.by),
        {col: spec.stats(col) for col, _ in spec.values},
        {col: spec.selection.columns[col].dtype for col, _ in spec.values},
    )


def chunk_part(spec: Spec, data: np.ndarray, start: int, parent) -> GroupPart:
    """The partial of one stored chunk (or block) of rows: its columns made, the rows a ``where``
    keeps taken, then grouped. An integer column only counted is never made (its count is the
    group's rows), nor a text column only counted (no row of it is null)."""
    chunk = spec.selection.chunk(data, start, parent)
    c: Chunk | Kept = chunk
    if spec.where is not None:
        cats = {n: tuple(col.categories or ()) for n, col in spec.selection.columns.items() if col.categorical}
        keep = evaluate_where(spec.where, chunk, cats)
        if not keep.all():
            # (the rows it keeps, their keys and values made or taken for them alone: a key of the
            # parent rows is spread over them only)
            c = chunk.kept(np.flatnonzero(keep))
    needs = {name: spec.stats(name) for name, _ in spec.values}
    values = {}
    for name, _ in spec.values:
        dtype = spec.selection.columns[name].dtype
        if counts_rows(needs[name], dtype):
            values[name] = np.zeros(0, dtype)
        else:
            values[name] = c[name]
    return group_part([ordered_key(c[b]) for b in spec.by], values, needs, spec.quantile_bits, n=len(c))


_TOP = np.uint64(1 << 63)


def ordered_key(k: np.ndarray) -> np.ndarray:
    """A key column as the groups take it (int64): uint64 with its top bit flipped (in the same
    order: ids from 2**63 on are no negative numbers sorted first), others as they are."""
    return (k ^ _TOP).view(np.int64) if k.dtype == np.uint64 else k


def key_values(keys: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The groups' keys (int64, as :func:`ordered_key` made them) in their column's dtype, as
    pandas gives a groupby's keys."""
    if dtype == np.uint64:
        return keys.view(np.uint64) ^ _TOP
    return keys.astype(dtype)


@dataclass
class Result:
    """An aggregation's result as columns: a row per group, the keys first; a categorical key
    holds codes into its ``categories``. ``to_pandas()``/``to_arrow()`` make tables of it (the
    CLI writes Arrow without importing pandas, 0.4 s)."""

    columns: dict[str, np.ndarray]
    categories: dict[str, tuple[str, ...]]

    def to_pandas(self):
        pd = import_paused("pandas")

        return pd.DataFrame(
            {
                n: pd.Categorical.from_codes(v, categories=list(self.categories[n])) if n in self.categories else v
                for n, v in self.columns.items()
            }
        )

    def to_arrow(self):
        import pyarrow as pa

        return pa.Table.from_arrays(
            [
                pa.DictionaryArray.from_arrays(arrow_array(v.astype(np.int32)), arrow_strings(self.categories[n]))
                if n in self.categories
                else arrow_array(v)
                for n, v in self.columns.items()
            ],
            names=list(self.columns),
        )


def finalize_part(spec: Spec, part: GroupPart) -> Result:
    """The result: a row per group with rows, the keys first (categoricals as codes); without
    ``by``, one row even when no row is kept (count 0, sum 0, the others NaN)."""
    part = one_group(part)
    data: dict[str, Any] = {}
    cats = {}
    for j, name in enumerate(spec.by):
        col = spec.selection.columns[name]
        data[name] = part.keys[:, j]
        if col.categorical:
            cats[name] = tuple(col.categories or ())
        else:
            data[name] = key_values(np.ascontiguousarray(part.keys[:, j]), col.dtype)
    for name, reds in spec.values:
        stats = stats_of(part, name, spec.quantile_bits, name, spec.selection.columns[name].dtype)
        for r in reds:
            data[f"{name}_{r}"] = aggregation(r).finalize(stats)
    return Result(data, cats)


#: The statistics whose partials combine to the same bits in any grouping: of an integer column
#: (counts, sums in two int64 limbs, minima and maxima in its dtype), of a float column its counts
#: alone (its rows, the sketch's buckets). A float's sum follows the order of its additions, and
#: its minimum the order of -0.0 and 0.0.
EXACT_STATS = {True: frozenset({"n", "sum", "min", "max", "sketch"}), False: frozenset({"n", "sketch"})}


def exact_spec(spec: Spec) -> bool:
    """Whether an aggregation's result is the same bits however its chunks are grouped into tasks
    (``Reduction.exact``): in a run of several analyses, its pass then takes the groups of the
    passes it is fused with (an aggregation of 43 chunks of frames, in tasks of one chunk alone,
    made the report's and the catalog's frames pass as small, 44 tasks against 12)."""
    return all(spec.stats(name) <= EXACT_STATS[exact(spec.selection.columns[name].dtype)] for name, _ in spec.values)


def reduction(spec: Spec) -> Reduction:
    from dask.base import tokenize

    sel = spec.selection
    columns = sel.columns.values()
    cats = {n: list(c.categories) for n, c in sel.columns.items() if c.categories is not None}
    return Reduction(
        f"aggregate-{tokenize(spec)}",
        functools.partial(chunk_part, spec),
        combine_parts,
        functools.partial(empty_part, spec),
        functools.partial(finalize_part, spec),
        exact=exact_spec(spec),
        reads=(
            [c.element for c in columns if c.element is not None],
            [c.argmax for c in columns if c.argmax],
            (),
            [c.name for c in columns if c.name in SHARED],  # (made by the report's loop when fused with it)
        ),
        # what it computes apart from the dataset (whose length its name holds): the cache's key
        cache_token=(
            sel.array,
            list(sel.names),
            cats,
            sel.parent_start,
            list(spec.by),
            [[c, list(r)] for c, r in spec.values],
            spec.where,
            int(spec.quantile_bits),
        ),
    )


# --- the API --------------------------------------------------------------------------------
def group_bound(table: Table, by: Sequence[str], read: bool = True) -> int:
    """An upper bound of the number of groups, known before computing. ``read=False``: the
    columns whose categories are read from the scenes (the hosts) count one group each, none
    read: a bound of the others' groups alone (what a job's check knows without reading)."""
    ds, rows = table.ds, len(table.source)
    known = {
        "scene_index": len(ds[fmt.SCENES]),
        "frame_index": len(ds[fmt.FRAMES]),
        "hour": 24,
        INDEX[table.array]: rows,
    }
    bound = 1
    for b in by:
        cats = table.columns[b].categories
        if not read and isinstance(cats, LazyHosts):
            continue
        card = len(cats) if cats is not None else known.get(b, rows)
        if table.columns[b].dtype == np.dtype(bool):
            card = 2
        bound *= max(card, 1)
    return min(bound, max(rows, 1)) if by else 1


@where_keywords
def aggregate(
    ds,
    array: str = "agents",
    by: Sequence[str] | str = (),
    values: Mapping[str, Sequence[str] | str] | None = None,
    where: str | None = None,
    *,
    max_groups: int = MAX_GROUPS,
    quantile_bits: int = QUANTILE_BITS,
    storage_options: dict | None = None,
    chunks_per_task: int | None = None,
    scheduler: Any = None,
    progress: bool = False,
    cache: Any = None,
) -> Any:
    """Group the rows of one array by some columns and reduce others, in one pass.

    Parameters
    ----------
    ds : L5Dataset, str or path
    array : str
        ``agents``, ``frames``, ``scenes`` or ``tl_faces``.
    by : sequence of str
        Integer or categorical columns (:mod:`l5dask.prediction.columns`): ``scene_index``, ``label``,
        ``host``, ``hour``... Empty: one group, the whole array.
    values : mapping
        ``{column: [reductions]}``, e.g. ``{"speed": ["mean", "max", "count"]}``.
    where : str, optional
        Keep the rows where this holds, e.g. ``"distance_to_ego < 20 and label == 'PERCEPTION_LABEL_CAR'"``:
        columns, numbers, strings (a categorical's names), comparisons, ``and``/``or``/``not``,
        ``in [...]``, arithmetic. Parsed, never evaluated as Python.
    max_groups : int
        Refuse (before computing) a grouping that may make more groups than this.
    quantile_bits : int
        Mantissa bits of the quantile sketch (see the module's docstring; 52: exact).
    scheduler, chunks_per_task, progress
        Where to run (a ``distributed.Client`` or its address, ``"threads"``...; ``client=`` is
        its old name), as :class:`l5dask.core.engine.Job`.
    cache : str, path or l5dask.core.cache.Cache, optional
        A cache of partial results (a folder or a bucket's URL, opened with ``storage_options``),
        as for :func:`l5dask.prediction.report.compute_report`.

    Returns
    -------
    pandas.DataFrame
        The ``by`` columns (categoricals by name), then ``{column}_{reduction}`` for each value;
        a row per group that has rows, sorted by the keys (without ``by``: one row, count 0 and
        sum 0 where no row is kept). ``count`` is int64, ``min``/``max`` keep the column's dtype,
        an integer column's ``sum`` is exact in int64 (uint64: unsigned), refused
        (:class:`~l5dask.errors.UsageError`) where it does not fit; the others are float64.
    """
    # (pandas is imported at the end: imported in a thread while the pass runs, it slowed the pass
    # by more than its 0.25 s, the threads taking turns at the GIL; measured again on 2026-11-28,
    # whole processes on 30 M agents, 8 interleaved rounds: a thread started here 1.007x the wall
    # and CPU time, with sys.setswitchinterval(0.0005) during it 1.047x/1.033x. Nor did freezing the
    # collector for the pass and unfreezing it after (the CLI's tune_gc, scoped): CPU 0.95x on q1,
    # 1.03x on q2, within the noise. What a whole process pays beyond `l5dask agg` is pandas: its
    # import, ~0.2 CPU-s, and the interpreter's teardown at exit of every module's objects, 0.15-0.18
    # CPU-s on 30 M agents (2026-11-28: gc.freeze registered with atexit skips it; not done here, a
    # process's exit is its owner's: docs/guide/aggregations.md says how a script skips it))
    result = aggregate_result(
        ds,
        array,
        by,
        values,
        where,
        max_groups=max_groups,
        quantile_bits=quantile_bits,
        storage_options=storage_options,
        chunks_per_task=chunks_per_task,
        scheduler=scheduler,
        progress=progress,
        cache=cache,
    )
    return result.to_pandas()


@where_keywords
def aggregate_result(
    ds,
    array: str = "agents",
    by: Sequence[str] | str = (),
    values: Mapping[str, Sequence[str] | str] | None = None,
    where: str | None = None,
    *,
    max_groups: int = MAX_GROUPS,
    quantile_bits: int = QUANTILE_BITS,
    storage_options: dict | None = None,
    chunks_per_task: int | None = None,
    scheduler: Any = None,
    progress: bool = False,
    cache: Any = None,
):
    """:func:`~l5dask.prediction.aggregation.aggregate`'s pass with its parameters, the groups as a
    ``Result`` (whose ``to_pandas()`` is that function's DataFrame)."""

    warming = warm_up(ds, storage_options, scheduler)
    ds = ds if isinstance(ds, L5Dataset) else open_dataset(ds, storage_options=storage_options)
    job = Job(
        scheduler,
        chunks_per_task=chunks_per_task,
        progress=progress,
        cache=open_cache(cache, storage_options),
    )
    plan = aggregate_plan(ds, job, array, by, values, where, max_groups=max_groups, quantile_bits=quantile_bits)
    job.size_for = plan.size_for
    ((result,),) = job.run([plan])
    del warming  # (held until the job's tasks were submitted)
    return result


def as_names(by: Any) -> tuple[str, ...]:
    """``by`` as a tuple of column names (one name, a sequence of them, or ``None``: none), or a
    one-line error."""
    if by is None:
        return ()
    if isinstance(by, str):
        return (by,)
    if not isinstance(by, (list, tuple)) or not all(isinstance(b, str) for b in by):
        raise UsageError(f"by must be a column name or a list of them, such as ['scene_index', 'label'], not {by!r}")
    return tuple(by)


def check_arguments(
    table: Table,
    by: Any,
    values: Mapping[str, Sequence[str] | str] | None,
    where: str | None,
    max_groups: int = MAX_GROUPS,
    quantile_bits: Any = QUANTILE_BITS,
    bound: bool = True,
) -> tuple[tuple[str, ...], tuple, int, list[str]]:
    """An aggregation's arguments over ``table`` checked, before any chunk is read (a one-line
    :class:`~l5dask.errors.UsageError` each): ``(by, values, quantile_bits, the columns it reads)``.
    What a job's ``--check`` and a plan both ask; ``bound=False``: the groups' bound without
    the categories read from the scenes (the hosts: a job's check leaves them to the run, which
    reads them through its cache), each counting one group."""
    by = as_names(by)
    table.resolve(by, "group column")
    for b in by:
        c = table.columns[b]
        if not (c.categorical or c.dtype.kind in "biu"):
            raise UsageError(
                f"cannot group by {b!r} ({c.dtype.name}): group by integer or categorical columns "
                "(label, host, scene_index, hour...)"
            )
    if len(set(by)) != len(by):
        raise UsageError(f"a column is named twice in by: {', '.join(by)}")
    parsed = parse_values(values or {}, table)
    bits = checked_bits(quantile_bits)
    names = list(by) + [c for c, _ in parsed]
    if where is not None:
        names += where_columns(where, table)
    most = group_bound(table, by, read=bound)
    if most > max_groups:
        raise UsageError(
            f"grouping {fmt.SHORT_NAMES[table.array]} by {', '.join(by)} may make up to {most:,} "
            f"groups, more than the limit of {max_groups:,}; raise max_groups (--max-groups) or "
            "group by fewer columns"
        )
    return by, parsed, bits, names


def aggregate_plan(
    ds: L5Dataset,
    job: Job,
    array: str = "agents",
    by: Sequence[str] | str = (),
    values: Mapping[str, Sequence[str] | str] | None = None,
    where: str | None = None,
    *,
    max_groups: int = MAX_GROUPS,
    quantile_bits: int = QUANTILE_BITS,
) -> Plan:
    """An aggregation declared (:class:`~l5dask.core.engine.Plan`), its arguments checked (one-line
    :class:`~l5dask.errors.UsageError`), to run alone or with other analyses of the dataset in one
    pass (:func:`l5dask.analyze <l5dask.prediction.analyses.analyze>`); its result is the tuple of
    one ``Result``."""
    table = Table(ds, array, read=job.read)
    by, parsed, quantile_bits, names = check_arguments(table, by, values, where, max_groups, quantile_bits)
    selection = table.select(names)
    spec = Spec(selection, by, parsed, where, int(quantile_bits))
    source = selection.source
    link = declared_parent_link(ds, selection, job)
    passes = [Pass(source, reduction(spec), parent=link, blocks=True, encoded=True)]
    # (no parent rows read: the parent's intervals must still end where the array does)
    cover = coverage(ds, table.array, job) if link is None else None
    if cover is not None:
        passes.append(cover[0])
        return Plan(passes, final=covered, args=(cover[1],), name="l5-aggregate", size_for=source.nchunks)
    return Plan(passes, name="l5-aggregate", size_for=source.nchunks)


def parse_value_options(items: Sequence[str]) -> dict[str, list[str]]:
    """The CLI's ``--value speed:mean,max`` (repeatable) as ``{column: [reductions]}``."""
    out: dict[str, list[str]] = {}
    for item in items:
        col, sep, reds = item.partition(":")
        if not sep or not col.strip() or not reds.strip():
            raise UsageError(f"--value {item!r}: expected COLUMN:REDUCTION[,REDUCTION...] (e.g. speed:mean,max)")
        out.setdefault(col.strip(), []).extend(r.strip() for r in reds.split(",") if r.strip())
    return out
