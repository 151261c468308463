"""Users' own aggregations, declared, in one pass over the stored chunks: :func:`aggregate`.

``l5dask.aggregate(ds, "agents", by=["scene_index", "label"], values={"speed": ["mean", "max"]})``
is one :class:`~l5dask.core.engine.Reduction` (flox's shape: chunk, combine, finalize) run by the
engine as the report is: each stored chunk read once, its columns gathered straight from its
compressed bytes (:class:`~l5dask.prediction.reading.Encoded`: the records are never made) and from the
parent rows it overlaps (:mod:`l5dask.prediction.columns`), grouped, reduced; partials merged in an ordered
tree; the result a pandas DataFrame, a row per group that has rows (sorted by the keys).

Reductions of a value column: ``count`` (values that are not NaN), ``sum``, ``mean``, ``min``,
``max``, ``var`` and ``std`` (ddof=1, as pandas; merged with Chan's formula), ``median`` and
``q<percent>`` (``q50``, ``q99.9``). NaN values are skipped, as pandas does.

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
import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from l5dask.prediction import format as fmt
from l5dask.prediction.columns import INDEX, Selection, Table
from l5dask.core.engine import Job, Pass, Reduction
from l5dask.errors import UsageError

#: The reductions of a value column (plus ``q<percent>``).
REDUCTIONS = ("count", "sum", "mean", "min", "max", "var", "std", "median")
#: Groups allowed unless the caller says otherwise (checked before computing).
MAX_GROUPS = 10_000_000
#: Mantissa bits the quantile sketch keeps by default: 1.2e-4 relative error at most.
QUANTILE_BITS = 12
_Q = re.compile(r"^q(\d+(?:\.\d*)?)$")
_SIGN = np.int64(0x7FFF_FFFF_FFFF_FFFF)


# --- the declaration ------------------------------------------------------------------------
def reduction_needs(name: str) -> tuple[str, ...]:
    """The per-group statistics a reduction is finalized from."""
    if name == "count":
        return ("n",)
    if name in ("sum", "mean"):
        return ("n", "sum")
    if name in ("var", "std"):
        return ("n", "sum", "m2")
    if name in ("min", "max"):
        return ("n", name)
    return ("sketch",)  # median, q<p>


def quantile_of(name: str) -> float | None:
    if name == "median":
        return 0.5
    m = _Q.match(name)
    return float(m.group(1)) / 100 if m else None


def parse_values(values: Mapping[str, Sequence[str] | str], table: Table) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``{column: [reductions]}`` checked: known columns, known reductions, numbers only."""
    if not values:
        raise UsageError("no values to aggregate: give at least one column and its reductions (e.g. speed:mean)")
    out = []
    for col, reds in values.items():
        reds = (reds,) if isinstance(reds, str) else tuple(reds)
        table.resolve([col], "value column")
        if not reds:
            raise UsageError(f"no reductions for {col!r}; they are: {', '.join(REDUCTIONS)}, q<percent> (q50, q99.9)")
        for r in reds:
            q = quantile_of(r)
            if r not in REDUCTIONS and q is None:
                raise UsageError(f"unknown reduction {r!r} (for {col}); they are: {', '.join(REDUCTIONS)}, "
                                  "q<percent> (q50, q99.9)")
            if q is not None and not 0 <= q <= 1:
                raise UsageError(f"{r!r}: a quantile is between q0 and q100")
        c = table.columns[col]
        if (c.categorical or c.dtype.kind not in "biuf") and set(reds) - {"count"}:
            raise UsageError(f"{col!r} is {'categorical' if c.categorical else c.dtype.name}: only count applies "
                              "(group by it instead)")
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
        return {s for r in dict(self.values)[col] for s in reduction_needs(r)}

    def __dask_tokenize__(self):
        from dask.base import tokenize

        return ("l5dask.prediction.aggregation.Spec", tokenize(self.selection), self.by, self.values, self.where, self.quantile_bits)


# --- where ----------------------------------------------------------------------------------
_CMP = {ast.Eq: np.equal, ast.NotEq: np.not_equal, ast.Lt: np.less, ast.LtE: np.less_equal, ast.Gt: np.greater,
        ast.GtE: np.greater_equal}
_BIN = {ast.Add: np.add, ast.Sub: np.subtract, ast.Mult: np.multiply, ast.Div: np.true_divide,
        ast.FloorDiv: np.floor_divide, ast.Mod: np.mod, ast.Pow: np.power, ast.BitAnd: np.logical_and,
        ast.BitOr: np.logical_or}


@functools.lru_cache(maxsize=64)
def _parse(text: str) -> ast.Expression:
    try:
        return ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise UsageError(f"where {text!r} does not parse: {exc.msg} (at column {exc.offset})") from None


def where_columns(text: str, table: Table) -> list[str]:
    """The columns a ``where`` names, checked (its syntax too) before any computation."""
    tree = _parse(text)
    names: list[str] = []

    def check(node: ast.AST) -> None:
        if isinstance(node, ast.Name):
            names.append(node.id)
        elif isinstance(node, ast.Constant):
            if not isinstance(node.value, (int, float, str, bool)):
                raise UsageError(f"where {text!r}: {node.value!r} is not a number or a string")
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, (ast.And, ast.Or)) or \
                isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub, ast.UAdd, ast.Invert)) or \
                isinstance(node, ast.BinOp) and type(node.op) in _BIN or isinstance(node, (ast.List, ast.Tuple)):
            pass
        elif isinstance(node, ast.Compare):
            if not all(type(op) in _CMP or isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
                raise UsageError(f"where {text!r}: only ==, !=, <, <=, >, >=, in and not in compare")
        elif not isinstance(node, (ast.Expression, ast.Load, ast.operator, ast.boolop, ast.unaryop, ast.cmpop)):
            raise UsageError(f"where {text!r}: {ast.unparse(node)!r} is not allowed (columns, numbers, strings, "
                              "comparisons, and/or/not, arithmetic)")
        for child in ast.iter_child_nodes(node):
            check(child)

    check(tree)
    unknown = [n for n in dict.fromkeys(names) if n not in table.columns]
    if unknown:
        raise UsageError(f"where {text!r} names unknown column{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(map(repr, unknown))}; the columns of {fmt.SHORT_NAMES[table.array]} are: "
                          f"{', '.join(table.columns)}")
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
                                raise UsageError(f"where {text!r}: {ast.unparse(c)} is not a {x.id}; they are: "
                                                  f"{', '.join(cats)}")
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
    keep = np.asarray(_value(_parse(text), chunk, categories))
    if keep.dtype != bool:
        raise UsageError(f"where {text!r} is not a condition (it gives {keep.dtype} values)")
    return np.broadcast_to(keep, (len(chunk),))


# --- the partial ----------------------------------------------------------------------------
@dataclass
class GroupPart:
    """Per group (a row of ``keys``, sorted): rows, and per value column its statistics."""

    keys: np.ndarray  # (groups, len(by)) int64
    rows: np.ndarray  # rows per group (after where)
    stats: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    # per quantiled column: (group, bucket, count), sorted by (group, bucket)
    sketches: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.rows)


def empty_part(spec: Spec) -> GroupPart:
    nby = len(spec.by)
    part = GroupPart(np.zeros((0, nby), np.int64), np.zeros(0, np.int64))
    for col, _ in spec.values:
        need = spec.stats(col)
        part.stats[col] = {s: np.zeros(0, np.int64 if s == "n" else np.float64) for s in need - {"sketch"}}
        if "sketch" in need:
            part.sketches[col] = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    return part


def encode(keys: list[np.ndarray], n: int) -> tuple[np.ndarray, int, np.ndarray]:
    """Group codes of ``n`` rows keyed by ``keys`` (integer columns of any width): ``(codes,
    ngroups, key table)`` (the table int64).

    Small key ranges are dense (codes are mixed-radix positions, some groups empty, made by a
    compiled pass per key: no widened copies); others are made dense by sorting the distinct keys.
    """
    from l5dask.prediction.kernels import int_range, mix_codes

    if not keys:
        return np.zeros(n, np.int64), 1, np.zeros((1, 0), np.int64)
    if n == 0:
        return np.zeros(0, np.int64), 0, np.zeros((0, len(keys)), np.int64)
    ranges = [int_range(k) for k in keys]
    los = [lo for lo, _ in ranges]
    spans = [hi - lo + 1 for lo, hi in ranges]
    total = math.prod(spans)
    if total < 2**62:
        codes = np.zeros(n, np.int64)
        stride = 1
        for k, lo, span in zip(keys[::-1], los[::-1], spans[::-1]):  # the last key varies fastest
            mix_codes(codes, k, lo, stride)
            stride *= span
        if total <= 2 * n + 4096:
            grid = np.arange(total, dtype=np.int64)
            table = np.empty((total, len(keys)), np.int64)
            stride = 1
            for j in range(len(keys) - 1, -1, -1):
                table[:, j] = (grid // stride) % spans[j] + los[j]
                stride *= spans[j]
            return codes, total, table
        uniq, codes = np.unique(codes, return_inverse=True)
        table = np.empty((len(uniq), len(keys)), np.int64)
        stride = 1
        for j in range(len(keys) - 1, -1, -1):
            table[:, j] = (uniq // stride) % spans[j] + los[j]
            stride *= spans[j]
        return codes.astype(np.int64), len(uniq), table
    table, codes = np.unique(np.stack([k.astype(np.int64, copy=False) for k in keys], axis=1), axis=0,
                             return_inverse=True)
    return codes.reshape(-1).astype(np.int64), len(table), table


def buckets(values: np.ndarray, bits: int) -> np.ndarray:
    """Each value's sketch bucket: its float64 bits ordered as the values, all but ``bits`` of
    the mantissa dropped (values must not be NaN)."""
    raw = (values + 0.0).view(np.int64)  # + 0.0: -0.0 is 0.0
    ordered = raw ^ ((raw >> 63) & _SIGN)
    return ordered >> (52 - bits)


def bucket_values(b: np.ndarray, bits: int) -> np.ndarray:
    """The midpoint of each bucket (the value itself when a bucket holds one value)."""
    shift = 52 - bits
    lo_ord = b << shift
    hi_ord = lo_ord + ((1 << shift) - 1)
    lo = (lo_ord ^ ((lo_ord >> 63) & _SIGN)).view(np.float64)
    hi = (hi_ord ^ ((hi_ord >> 63) & _SIGN)).view(np.float64)
    mid = lo + (hi - lo) / 2
    # the bucket that starts at 0.0 holds 0 (exactly) and the smallest subnormals: it stands for 0
    return np.where(lo == 0.0, 0.0, np.where(np.isfinite(lo) & np.isfinite(hi), mid, lo))


def _sketch(codes: np.ndarray, values: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(group, bucket, count) of the rows, sorted by group then bucket."""
    if not len(values):
        z = np.zeros(0, np.int64)
        return z, z, z
    b = buckets(values, bits)
    blo = int(b.min())
    span = int(b.max()) - blo + 1
    g_hi = int(codes.max()) + 1
    if span * g_hi <= 4 * len(values) + 4096:
        counts = np.bincount(codes * span + (b - blo), minlength=span * g_hi)
        nz = np.flatnonzero(counts)
        return nz // span, nz % span + blo, counts[nz]
    if span < 2**62 // max(g_hi, 1):
        uniq, counts = np.unique(codes * span + (b - blo), return_counts=True)
        return uniq // span, uniq % span + blo, counts.astype(np.int64)
    order = np.lexsort((b, codes))
    g, b = codes[order], b[order]
    new = np.r_[True, (g[1:] != g[:-1]) | (b[1:] != b[:-1])]
    starts = np.flatnonzero(new)
    return g[starts], b[starts], np.diff(np.r_[starts, len(g)])


def chunk_part(spec: Spec, data: np.ndarray, start: int, parent) -> GroupPart:
    """The partial of one stored chunk (or block) of rows: its columns made, the rows a ``where``
    keeps taken, then grouped. An integer column only counted is never made (its count is the
    group's rows)."""
    c = spec.selection.chunk(data, start, parent)
    keep = None
    if spec.where is not None:
        cats = {n: col.categories for n, col in spec.selection.columns.items() if col.categorical}
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
    return group_part([c[b] if keep is None else c[b].take(keep) for b in spec.by], values, needs, spec.quantile_bits, n=n)


def group_part(keys: list[np.ndarray], values: dict[str, np.ndarray], needs: dict[str, set[str]],
               quantile_bits: int = QUANTILE_BITS, keep: np.ndarray | None = None, n: int | None = None) -> GroupPart:
    """The partial of ``n`` rows (default: the keys' or the values' length): grouped by ``keys``
    (integer columns), each value column reduced to the statistics it ``needs`` (an integer column
    only counted may be left empty); rows where ``keep`` is False left out."""
    if n is None:
        n = len(keys[0]) if keys else len(next(iter(values.values())))
    if keep is not None and keep.all():
        keep = None
    codes, ngroups, table = encode(list(keys), n)
    if keep is not None:  # the rows left out go to one more group, dropped below
        codes[~keep] = ngroups
        table = np.concatenate([table, np.zeros((1, table.shape[1]), np.int64)])
        ngroups += 1
    rows = np.bincount(codes, minlength=ngroups)
    present = rows > 0
    if keep is not None:
        present[-1] = False
    dense = not present.all()
    remap = np.cumsum(present) - 1 if dense else None
    part = GroupPart(table[present] if dense else table, rows[present] if dense else rows)
    from l5dask.prediction.kernels import group_reduce

    for name, v in values.items():
        need = needs[name]
        stats = {}
        if need == {"n"} and v.dtype.kind in "biu":  # counting an integer column: no NaN, its rows
            part.stats[name] = {"n": (rows[present] if dense else rows).copy()}
            continue
        v = v.astype(np.float64, copy=False)
        if need & {"n", "sum", "min", "max", "m2"}:
            count, total, lo, hi = group_reduce(codes, v, ngroups, sums="sum" in need or "m2" in need,
                                                mins="min" in need, maxs="max" in need)
            stats["n"] = count
            if "sum" in need or "m2" in need:
                stats["sum"] = total
            if "min" in need:
                stats["min"] = lo
            if "max" in need:
                stats["max"] = hi
            if "m2" in need:
                mean = np.divide(total, count, out=np.zeros(ngroups), where=count > 0)
                dev = v - mean[codes]
                dev[np.isnan(dev)] = 0.0
                stats["m2"] = np.bincount(codes, weights=dev * dev, minlength=ngroups)
        part.stats[name] = {k: (a[present] if dense else a) for k, a in stats.items()}
        if "sketch" in need:
            ok = ~np.isnan(v) if keep is None else ~np.isnan(v) & keep
            g = codes if ok.all() else codes[ok]
            part.sketches[name] = _sketch(remap[g] if dense else g, v if ok.all() else v[ok], quantile_bits)
    return part


def _scatter(size: int, index: np.ndarray, values: np.ndarray, fill: float | int) -> np.ndarray:
    out = np.full(size, fill, dtype=values.dtype)
    out[index] = values
    return out


def combine_parts(a: GroupPart, b: GroupPart) -> GroupPart:
    """Two neighbouring partials merged (associative; the keys stay sorted)."""
    if not len(a):
        return b
    if not len(b):
        return a
    keys = np.concatenate([a.keys, b.keys])
    if keys.shape[1] == 0:
        uniq, inv = keys[:1], np.zeros(len(keys), np.int64)
    elif keys.shape[1] == 1:
        u, inv = np.unique(keys[:, 0], return_inverse=True)
        uniq = u[:, None]
    else:
        uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    ia, ib, size = inv[: len(a)], inv[len(a):], len(uniq)
    rows = _scatter(size, ia, a.rows, 0)
    rows[ib] += b.rows
    out = GroupPart(uniq, rows)
    for name, sa in a.stats.items():
        sb = b.stats[name]
        if not sa:  # quantiles only: the sketch holds everything
            out.stats[name] = {}
            continue
        na, nb = _scatter(size, ia, sa["n"], 0), _scatter(size, ib, sb["n"], 0)
        n = na + nb
        s = {"n": n}
        if "sum" in sa:
            ta, tb = _scatter(size, ia, sa["sum"], 0.0), _scatter(size, ib, sb["sum"], 0.0)
            s["sum"] = ta + tb
            if "m2" in sa:
                ma = np.divide(ta, na, out=np.zeros(size), where=na > 0)
                mb = np.divide(tb, nb, out=np.zeros(size), where=nb > 0)
                delta = mb - ma
                s["m2"] = _scatter(size, ia, sa["m2"], 0.0) + _scatter(size, ib, sb["m2"], 0.0) + \
                    np.divide(delta * delta * na * nb, n, out=np.zeros(size), where=n > 0)
        if "min" in sa:
            s["min"] = np.minimum(_scatter(size, ia, sa["min"], np.inf), _scatter(size, ib, sb["min"], np.inf))
        if "max" in sa:
            s["max"] = np.maximum(_scatter(size, ia, sa["max"], -np.inf), _scatter(size, ib, sb["max"], -np.inf))
        out.stats[name] = s
    for name, (ga, ba, ca) in a.sketches.items():
        gb, bb, cb = b.sketches[name]
        g, bk, cnt = np.concatenate([ia[ga], ib[gb]]), np.concatenate([ba, bb]), np.concatenate([ca, cb])
        order = np.lexsort((bk, g))
        g, bk, cnt = g[order], bk[order], cnt[order]
        if len(g):
            new = np.r_[True, (g[1:] != g[:-1]) | (bk[1:] != bk[:-1])]
            starts = np.flatnonzero(new)
            g, bk, cnt = g[starts], bk[starts], np.add.reduceat(cnt, starts)
        out.sketches[name] = (g, bk, cnt)
    return out


def _combine_all(*parts: GroupPart) -> GroupPart:
    return functools.reduce(combine_parts, parts)


def combine_delayed(parts: list) -> GroupPart:
    """Delayed partials (neighbours in order) merged in an ordered tree (fan-in from dask's
    ``split_every``) and computed: for passes over other collections' blocks (xarray's, dask
    DataFrames'), as the engine's tree combines its own."""
    import dask
    from dask import delayed

    from l5dask.core.engine import SPLIT_EVERY

    fan_in = int(dask.config.get("split_every", None) or SPLIT_EVERY)
    while len(parts) > 1:
        parts = [delayed(_combine_all)(*parts[i: i + fan_in]) for i in range(0, len(parts), fan_in)]
    (part,) = dask.compute(parts[0])
    return part


def _lerp(a: np.ndarray, b: np.ndarray, t: np.ndarray) -> np.ndarray:
    """numpy's linear interpolation of its quantiles (``numpy.lib._function_base_impl._lerp``)."""
    diff = b - a
    out = a + diff * t
    return np.where(t >= 0.5, b - diff * (1 - t), out)


def sketch_quantiles(sketch: tuple[np.ndarray, np.ndarray, np.ndarray], ngroups: int, q: float,
                     bits: int) -> np.ndarray:
    """Quantile ``q`` of each group (NaN for a group without values), numpy's "linear" method."""
    g, b, cnt = sketch
    n = np.bincount(g, weights=cnt, minlength=ngroups).astype(np.int64)
    out = np.full(ngroups, np.nan)
    has = n > 0
    if not has.any():
        return out
    cum = np.cumsum(cnt)
    base = np.r_[0, np.cumsum(n)[:-1]]  # rows before each group, in the sketch order
    h = (n[has] - 1) * q
    lo_rank = np.floor(h).astype(np.int64)
    hi_rank = np.minimum(lo_rank + 1, n[has] - 1)
    vals = bucket_values(b, bits)
    x_lo = vals[np.searchsorted(cum, base[has] + lo_rank, side="right")]
    x_hi = vals[np.searchsorted(cum, base[has] + hi_rank, side="right")]
    out[has] = _lerp(x_lo, x_hi, h - lo_rank)
    return out


@dataclass
class Result:
    """An aggregation's result as columns: a row per group, the keys first; a categorical key
    holds codes into its ``categories``. ``to_pandas()``/``to_arrow()`` make tables of it (the
    CLI writes Arrow without importing pandas, 0.4 s)."""

    columns: dict[str, np.ndarray]
    categories: dict[str, tuple[str, ...]]

    def to_pandas(self):
        import pandas as pd

        return pd.DataFrame({n: pd.Categorical.from_codes(v, categories=list(self.categories[n]))
                             if n in self.categories else v for n, v in self.columns.items()})

    def to_arrow(self):
        import pyarrow as pa

        from l5dask.core.outputs import arrow_array, arrow_strings

        return pa.Table.from_arrays(
            [pa.DictionaryArray.from_arrays(arrow_array(v.astype(np.int32)), arrow_strings(self.categories[n]))
             if n in self.categories else arrow_array(v) for n, v in self.columns.items()], names=list(self.columns))


def finalize_part(spec: Spec, part: GroupPart) -> Result:
    """The result: a row per group with rows, the keys first (categoricals as codes)."""
    data: dict[str, Any] = {}
    cats = {}
    for j, name in enumerate(spec.by):
        col = spec.selection.columns[name]
        data[name] = part.keys[:, j]
        if col.categorical:
            cats[name] = tuple(col.categories)
    size = len(part)
    for name, reds in spec.values:
        s = part.stats.get(name, {})
        n = s.get("n")
        for r in reds:
            if r == "count":
                out = n if n is not None else np.bincount(part.sketches[name][0], weights=part.sketches[name][2],
                                                          minlength=size).astype(np.int64)
            elif r == "sum":
                out = s["sum"]
            elif r == "mean":
                out = np.divide(s["sum"], n, out=np.full(size, np.nan), where=n > 0)
            elif r in ("var", "std"):
                out = np.divide(s["m2"], n - 1, out=np.full(size, np.nan), where=n > 1)
                out = np.sqrt(out) if r == "std" else out
            elif r in ("min", "max"):
                out = np.where(n > 0, s[r], np.nan)
            else:
                out = sketch_quantiles(part.sketches[name], size, quantile_of(r), spec.quantile_bits)
            data[f"{name}_{r}"] = out
    return Result(data, cats)


def reduction(spec: Spec) -> Reduction:
    from dask.base import tokenize

    return Reduction(f"aggregate-{tokenize(spec)}", functools.partial(chunk_part, spec), combine_parts,
                     functools.partial(empty_part, spec), functools.partial(finalize_part, spec))


# --- the API --------------------------------------------------------------------------------
def group_bound(table: Table, by: Sequence[str]) -> int:
    """An upper bound of the number of groups, known before computing."""
    ds, rows = table.ds, len(table.source)
    known = {"scene_index": len(ds[fmt.SCENES]), "frame_index": len(ds[fmt.FRAMES]), "hour": 24,
             INDEX[table.array]: rows}
    bound = 1
    for b in by:
        cats = table.columns[b].categories
        card = len(cats) if cats is not None else known.get(b, rows)
        if table.columns[b].dtype == np.dtype(bool):
            card = 2
        bound *= max(card, 1)
    return min(bound, max(rows, 1)) if by else 1


def aggregate(*args, **kwargs):
    """Group the rows of one array by some columns and reduce others, in one pass: a pandas
    DataFrame (see :func:`aggregate_result` for the parameters)."""
    # (pandas is imported at the end: imported in a thread while the pass runs, it slowed the pass
    # by more than its 0.25 s, the threads taking turns at the GIL)
    return aggregate_result(*args, **kwargs).to_pandas()


def aggregate_result(ds, array: str = "agents", by: Sequence[str] | str = (), values: Mapping[str, Sequence[str] | str] | None = None,
              where: str | None = None, *, max_groups: int = MAX_GROUPS, quantile_bits: int = QUANTILE_BITS,
              storage_options: dict | None = None, chunks_per_task: int | None = None, client: Any = None,
              scheduler: Any = None, progress: bool = False):
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
    Result
        The ``by`` columns, then ``{column}_{reduction}`` for each value; a row per group that
        has rows, sorted by the keys (:func:`aggregate` gives it as a pandas DataFrame, with
        categoricals by name).
    """
    from l5dask.prediction.reading import L5Dataset, open_dataset

    ds = ds if isinstance(ds, L5Dataset) else open_dataset(ds, storage_options=storage_options)
    table = Table(ds, array)
    by = (by,) if isinstance(by, str) else tuple(by)
    table.resolve(by, "group column")
    for b in by:
        c = table.columns[b]
        if not (c.categorical or c.dtype.kind in "biu"):
            raise UsageError(f"cannot group by {b!r} ({c.dtype.name}): group by integer or categorical columns "
                              "(label, host, scene_index, hour...)")
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
        raise UsageError(f"grouping {fmt.SHORT_NAMES[table.array]} by {', '.join(by)} may make up to {bound:,} "
                          f"groups, more than the limit of {max_groups:,}; raise max_groups (--max-groups) or "
                          "group by fewer columns")
    selection = table.select(names)
    spec = Spec(selection, by, parsed, where, int(quantile_bits))
    source = selection.source
    job = Job(client=client, scheduler=scheduler, chunks_per_task=chunks_per_task, progress=progress,
              size_for=source.nchunks)
    from l5dask.prediction.joins import parent_link

    link = parent_link(ds, selection, job)
    (result,) = job.compute([Pass(source, reduction(spec), parent=link, blocks=True, encoded=True)])
    return result


def parse_value_options(items: Sequence[str]) -> dict[str, list[str]]:
    """The CLI's ``--value speed:mean,max`` (repeatable) as ``{column: [reductions]}``."""
    out: dict[str, list[str]] = {}
    for item in items:
        col, sep, reds = item.partition(":")
        if not sep or not col.strip() or not reds.strip():
            raise UsageError(f"--value {item!r}: expected COLUMN:REDUCTION[,REDUCTION...] (e.g. speed:mean,max)")
        out.setdefault(col.strip(), []).extend(r.strip() for r in reds.split(",") if r.strip())
    return out
