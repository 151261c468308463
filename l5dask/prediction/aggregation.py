"""Users' own aggregations, declared, in one pass over the stored chunks: :func:`~l5dask.prediction.aggregation.aggregate`.

``l5dask.aggregate(ds, "agents", by=["scene_index", "label"], values={"speed": ["mean", "max"]})``
is one :class:`~l5dask.core.engine.Reduction` (flox's shape: chunk, combine, finalize) run by the
engine as the report is: each stored chunk read once, its columns gathered straight from its
compressed bytes (:class:`~l5dask.prediction.reading.Encoded`: the records are never made) and from the
parent rows it overlaps (:mod:`l5dask.prediction.columns`), grouped, reduced; partials merged in an ordered
tree; the result a pandas DataFrame, a row per group that has rows (sorted by the keys).

Reductions of a value column: ``count`` (values that are not NaN), ``sum``, ``mean``, ``min``,
``max``, ``var`` and ``std`` (ddof=1, as pandas; merged with Chan's formula), ``median`` and
``q<percent>`` (``q50``, ``q99.9``). NaN values are skipped, as pandas does. Each is declared once,
an :class:`~l5dask.prediction.groupby.Aggregation` (the statistics it needs, its finalize) in
``l5dask.prediction.groupby.AGGREGATIONS``, which the xarray accessor and the dataframes'
quantiles use too.

Quantiles are computed from a sketch: each value's bucket is its float64 bit pattern with all
but ``quantile_bits`` bits of the mantissa dropped (sign and exponent kept), and each bucket's
count is kept exactly. A quantile is numpy's "linear" one with each of the two order statistics
it interpolates replaced by the midpoint of its bucket, so that
``|estimate - numpy| <= 2 ** -(quantile_bits + 1) * max(|x_lo|, |x_hi|)`` (``x_lo``, ``x_hi``
the two order statistics); zero is exact (its bucket stands for 0; it also holds the subnormal
numbers below ``2 ** (-1074 + 52 - quantile_bits)``, 5e-312 by default, which it rounds to 0). With ``quantile_bits >= 23`` a float32 column is exact (each bucket
holds one float32 value), with ``quantile_bits=52`` every column is.
"""

from __future__ import annotations

import ast
import copy
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from l5dask.core import config
from l5dask.core.engine import Job, Pass, Plan, Reduction
from l5dask.core.outputs import arrow_array, arrow_strings
from l5dask.errors import UsageError
from l5dask.prediction import format as fmt
from l5dask.prediction.columns import INDEX, Selection, Table
from l5dask.prediction.dataset import L5Dataset, open_dataset, warm_up
from l5dask.prediction.groupby import (
    AGGREGATIONS,
    QUANTILE_BITS,
    GroupPart,
    aggregation,
    combine_parts,
    group_part,
    stats_of,
)
from l5dask.prediction.groupby import empty_part as group_empty_part
from l5dask.prediction.joins import declared_parent_link

#: Groups allowed unless the caller says otherwise (checked before computing).
MAX_GROUPS = 10_000_000


# --- the declaration ------------------------------------------------------------------------
def parse_values(values: Mapping[str, Sequence[str] | str], table: Table) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``{column: [reductions]}`` checked: known columns, known reductions, numbers only."""
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
                f"{col!r} is {'categorical' if c.categorical else c.dtype.name}: only count applies "
                "(group by it instead)"
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


# --- where ----------------------------------------------------------------------------------
_CMP = {
    ast.Eq: np.equal,
    ast.NotEq: np.not_equal,
    ast.Lt: np.less,
    ast.LtE: np.less_equal,
    ast.Gt: np.greater,
    ast.GtE: np.greater_equal,
}
_BIN = {
    ast.Add: np.add,
    ast.Sub: np.subtract,
    ast.Mult: np.multiply,
    ast.Div: np.true_divide,
    ast.FloorDiv: np.floor_divide,
    ast.Mod: np.mod,
    ast.Pow: np.power,
    ast.BitAnd: np.logical_and,
    ast.BitOr: np.logical_or,
}


@functools.lru_cache(maxsize=64)
def _parse(text: str) -> ast.Expression:
    try:
        return ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise UsageError(f"where {text!r} does not parse: {exc.msg} (at column {exc.offset})") from None


config.on_reset(_parse.cache_clear)


@functools.lru_cache(maxsize=64)
def _named(text: str, categories: tuple[tuple[str, tuple[str, ...]], ...]) -> ast.Expression:
    """The parsed ``where`` with each bare name compared with a categorical column (``categories``:
    its names) that is one of its categories read as that category, as if quoted: ``label ==
    PERCEPTION_LABEL_CAR``, ``label in [PERCEPTION_LABEL_CAR, PERCEPTION_LABEL_VAN]``. Unambiguous:
    the only other reading, the column of that name (the label's probability), cannot be compared
    with a category."""
    cats = dict(categories)
    tree = copy.deepcopy(_parse(text))

    def as_category(node: ast.expr, names: tuple[str, ...]) -> ast.expr:
        if isinstance(node, ast.Name) and node.id in names:
            return ast.copy_location(ast.Constant(node.id), node)
        if isinstance(node, (ast.List, ast.Tuple)):
            node.elts = [as_category(e, names) for e in node.elts]
        return node

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for i in range(len(operands) - 1):
                for x, y in ((i, i + 1), (i + 1, i)):
                    a = operands[x]
                    if isinstance(a, ast.Name) and a.id in cats:
                        operands[y] = as_category(operands[y], cats[a.id])
            node.left, node.comparators = operands[0], operands[1:]
    return tree


config.on_reset(_named.cache_clear)


def where_columns(text: str, table: Table) -> list[str]:
    """The columns a ``where`` names, checked (its syntax too) before any computation."""
    named = {
        n.id
        for n in ast.walk(_parse(text))
        if isinstance(n, ast.Name) and n.id in table.columns and table.columns[n.id].categorical
    }
    tree = _named(text, tuple((n, tuple(table.categories(n) or ())) for n in sorted(named)))
    names: list[str] = []

    def check(node: ast.AST) -> None:
        if isinstance(node, ast.Name):
            names.append(node.id)
        elif isinstance(node, ast.Constant):
            if not isinstance(node.value, (int, float, str, bool)):
                raise UsageError(f"where {text!r}: {node.value!r} is not a number or a string")
        elif (
            isinstance(node, ast.BoolOp)
            and isinstance(node.op, (ast.And, ast.Or))
            or isinstance(node, ast.UnaryOp)
            and isinstance(node.op, (ast.Not, ast.USub, ast.UAdd, ast.Invert))
            or isinstance(node, ast.BinOp)
            and type(node.op) in _BIN
            or isinstance(node, (ast.List, ast.Tuple))
        ):
            pass
        elif isinstance(node, ast.Compare):
            if not all(type(op) in _CMP or isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
                raise UsageError(f"where {text!r}: only ==, !=, <, <=, >, >=, in and not in compare")
        elif not isinstance(node, (ast.Expression, ast.Load, ast.operator, ast.boolop, ast.unaryop, ast.cmpop)):
            raise UsageError(
                f"where {text!r}: {ast.unparse(node)!r} is not allowed (columns, numbers, strings, "
                "comparisons, and/or/not, arithmetic)"
            )
        for child in ast.iter_child_nodes(node):
            check(child)

    check(tree)
    # a bare name compared with a categorical column that is none of its categories is said to be
    # no category (below), not an unknown column
    compared = {
        e.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        and any(isinstance(o, ast.Name) and o.id in named for o in (node.left, *node.comparators))
        for o in (node.left, *node.comparators)
        for e in (o.elts if isinstance(o, (ast.List, ast.Tuple)) else [o])
        if isinstance(e, ast.Name) and e.id not in named
    }
    unknown = [n for n in dict.fromkeys(names) if n not in table.columns and n not in compared]
    if unknown:
        raise UsageError(
            f"where {text!r} names unknown column{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(map(repr, unknown))}; the columns of {fmt.SHORT_NAMES[table.array]} are: "
            f"{', '.join(table.columns)}"
        )
    if not names:
        raise UsageError(f"where {text!r} names no column")
    # categorical columns compare with their category names, and only by (in)equality
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for op, a, b in zip(node.ops, operands, operands[1:]):
                for x, y in ((a, b), (b, a)):
                    if isinstance(x, ast.Name) and table.columns[x.id].categorical:
                        if not isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
                            raise UsageError(f"where {text!r}: {x.id} is categorical: compare it with == or in")
                        cats = list(table.categories(x.id) or ())
                        consts = y.elts if isinstance(y, (ast.List, ast.Tuple)) else [y]
                        for c in consts:
                            if not (isinstance(c, ast.Constant) and c.value in cats):
                                raise UsageError(
                                    f"where {text!r}: {ast.unparse(c)} is not a {x.id}; they are: {', '.join(cats)}"
                                )
    return list(dict.fromkeys(names))


def _value(node: ast.AST, chunk, categories: dict, cats: tuple[str, ...] | None = None):
    """The value of a node of a ``where`` over one chunk (module level: no reference cycle keeps
    the chunk's columns alive)."""
    if isinstance(node, ast.Expression):
        return _value(node.body, chunk, categories)
    if isinstance(node, ast.Name):
        return chunk[node.id]
    if isinstance(node, ast.Constant):
        return cats.index(node.value) if cats is not None and isinstance(node.value, str) else node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_value(e, chunk, categories, cats) for e in node.elts]
    if isinstance(node, ast.BoolOp):
        parts = [np.asarray(_value(v, chunk, categories), bool) for v in node.values]
        return functools.reduce(np.logical_and if isinstance(node.op, ast.And) else np.logical_or, parts)
    if isinstance(node, ast.UnaryOp):
        v = _value(node.operand, chunk, categories)
        if isinstance(node.op, (ast.Not, ast.Invert)):
            return np.logical_not(v)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        return _BIN[type(node.op)](_value(node.left, chunk, categories), _value(node.right, chunk, categories))
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        out = None
        for op, a, b in zip(node.ops, operands, operands[1:]):
            ca = categories.get(a.id) if isinstance(a, ast.Name) else None
            cb = categories.get(b.id) if isinstance(b, ast.Name) else None
            left, right = _value(a, chunk, categories, cb), _value(b, chunk, categories, ca)
            if isinstance(op, (ast.In, ast.NotIn)):
                r = np.isin(left, np.asarray(right))
                r = ~r if isinstance(op, ast.NotIn) else r
            else:
                r = _CMP[type(op)](left, right)
            out = r if out is None else out & r
        return out
    raise UsageError(f"where: {ast.unparse(node)!r} is not allowed")


def evaluate_where(text: str, chunk, categories: dict[str, tuple[str, ...]]) -> np.ndarray:
    """The rows of a chunk (:class:`l5dask.prediction.columns.Chunk`) that ``text`` keeps."""
    keep = np.asarray(_value(_named(text, tuple(sorted(categories.items()))), chunk, categories))
    if keep.dtype != bool:
        raise UsageError(f"where {text!r} is not a condition (it gives {keep.dtype} values)")
    return np.broadcast_to(keep, (len(chunk),))


# --- the partial ----------------------------------------------------------------------------
def empty_part(spec: Spec) -> GroupPart:
    return group_empty_part(len(spec.by), {col: spec.stats(col) for col, _ in spec.values})


def chunk_part(spec: Spec, data: np.ndarray, start: int, parent) -> GroupPart:
    """The partial of one stored chunk (or block) of rows: its columns made, the rows a ``where``
    keeps taken, then grouped. An integer column only counted is never made (its count is the
    group's rows)."""
    c = spec.selection.chunk(data, start, parent)
    keep = None
    if spec.where is not None:
        cats = {n: tuple(col.categories or ()) for n, col in spec.selection.columns.items() if col.categorical}
        keep = evaluate_where(spec.where, c, cats)
        keep = None if keep.all() else np.flatnonzero(keep)  # (takes of the kept rows: 5x faster than masks)
    needs = {name: spec.stats(name) for name, _ in spec.values}
    values = {}
    for name, _ in spec.values:
        dtype = spec.selection.columns[name].dtype
        if needs[name] == {"n"} and dtype.kind in "biu":
            values[name] = np.zeros(0, dtype)
        else:
            values[name] = c[name] if keep is None else c[name].take(keep)
    n = len(c) if keep is None else len(keep)
    return group_part(
        [c[b] if keep is None else c[b].take(keep) for b in spec.by], values, needs, spec.quantile_bits, n=n
    )


@dataclass
class Result:
    """An aggregation's result as columns: a row per group, the keys first; a categorical key
    holds codes into its ``categories``. ``to_pandas()``/``to_arrow()`` make tables of it (the
    CLI writes Arrow without importing pandas, 0.4 s)."""

    columns: dict[str, np.ndarray]
    categories: dict[str, tuple[str, ...]]

    def to_pandas(self):
        import pandas as pd

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
    """The result: a row per group with rows, the keys first (categoricals as codes)."""
    data: dict[str, Any] = {}
    cats = {}
    for j, name in enumerate(spec.by):
        col = spec.selection.columns[name]
        data[name] = part.keys[:, j]
        if col.categorical:
            cats[name] = tuple(col.categories or ())
    for name, reds in spec.values:
        stats = stats_of(part, name, spec.quantile_bits)
        for r in reds:
            data[f"{name}_{r}"] = aggregation(r).finalize(stats)
    return Result(data, cats)


def reduction(spec: Spec) -> Reduction:
    from dask.base import tokenize

    columns = spec.selection.columns.values()
    return Reduction(
        f"aggregate-{tokenize(spec)}",
        functools.partial(chunk_part, spec),
        combine_parts,
        functools.partial(empty_part, spec),
        functools.partial(finalize_part, spec),
        reads=([c.element for c in columns if c.element is not None], [c.argmax for c in columns if c.argmax]),
    )


# --- the API --------------------------------------------------------------------------------
def group_bound(table: Table, by: Sequence[str]) -> int:
    """An upper bound of the number of groups, known before computing."""
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
        card = len(cats) if cats is not None else known.get(b, rows)
        if table.columns[b].dtype == np.dtype(bool):
            card = 2
        bound *= max(card, 1)
    return min(bound, max(rows, 1)) if by else 1


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
    client: Any = None,
    scheduler: Any = None,
    progress: bool = False,
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
    client, scheduler, chunks_per_task, progress
        As :class:`l5dask.core.engine.Job`.

    Returns
    -------
    pandas.DataFrame
        The ``by`` columns (categoricals by name), then ``{column}_{reduction}`` for each value;
        a row per group that has rows, sorted by the keys.
    """
    # (pandas is imported at the end: imported in a thread while the pass runs, it slowed the pass
    # by more than its 0.25 s, the threads taking turns at the GIL)
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
        client=client,
        scheduler=scheduler,
        progress=progress,
    )
    return result.to_pandas()


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
    client: Any = None,
    scheduler: Any = None,
    progress: bool = False,
):
    """:func:`~l5dask.prediction.aggregation.aggregate`'s pass with its parameters, the groups as a
    ``Result`` (whose ``to_pandas()`` is that function's DataFrame)."""

    warming = warm_up(ds, storage_options, client, scheduler)
    ds = ds if isinstance(ds, L5Dataset) else open_dataset(ds, storage_options=storage_options)
    job = Job(client=client, scheduler=scheduler, chunks_per_task=chunks_per_task, progress=progress)
    plan = aggregate_plan(ds, job, array, by, values, where, max_groups=max_groups, quantile_bits=quantile_bits)
    job.size_for = plan.size_for
    ((result,),) = job.run([plan])
    del warming  # (held until the job's tasks were submitted)
    return result


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
    one :class:`Result`."""
    table = Table(ds, array, read=job.read)
    by = (by,) if isinstance(by, str) else tuple(by)
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
    if not isinstance(quantile_bits, (int, np.integer)) or not 0 <= quantile_bits <= 52:
        raise UsageError(f"quantile_bits must be an integer from 0 to 52, not {quantile_bits!r}")
    names = list(by) + [c for c, _ in parsed]
    if where is not None:
        names += where_columns(where, table)
    bound = group_bound(table, by)
    if bound > max_groups:
        raise UsageError(
            f"grouping {fmt.SHORT_NAMES[table.array]} by {', '.join(by)} may make up to {bound:,} "
            f"groups, more than the limit of {max_groups:,}; raise max_groups (--max-groups) or "
            "group by fewer columns"
        )
    selection = table.select(names)
    spec = Spec(selection, by, parsed, where, int(quantile_bits))
    source = selection.source
    link = declared_parent_link(ds, selection, job)
    return Plan(
        [Pass(source, reduction(spec), parent=link, blocks=True, encoded=True)],
        name="l5-aggregate",
        size_for=source.nchunks,
    )


def parse_value_options(items: Sequence[str]) -> dict[str, list[str]]:
    """The CLI's ``--value speed:mean,max`` (repeatable) as ``{column: [reductions]}``."""
    out: dict[str, list[str]] = {}
    for item in items:
        col, sep, reds = item.partition(":")
        if not sep or not col.strip() or not reds.strip():
            raise UsageError(f"--value {item!r}: expected COLUMN:REDUCTION[,REDUCTION...] (e.g. speed:mean,max)")
        out.setdefault(col.strip(), []).extend(r.strip() for r in reds.split(",") if r.strip())
    return out
