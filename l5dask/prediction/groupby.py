"""Per-group partials of any collection, the shared half of every grouping in l5dask: the partial
(:class:`~l5dask.prediction.groupby.GroupPart`: counts, sums, moments, extremes and the quantile sketch of each group), its
associative combine, the sketch's quantiles, and the user's reductions declared once
(:class:`~l5dask.prediction.groupby.Aggregation`, looked up by :func:`~l5dask.prediction.groupby.aggregation`).
:func:`l5dask.aggregate <l5dask.prediction.aggregation.aggregate>`, the xarray accessor's
``.l5.groupby(...)`` reductions and :func:`l5dask.prediction.dataframe.quantiles` build on it, their
partials merged by the engine's one ordered tree (:func:`~l5dask.prediction.groupby.reduce_parts`).

The quantile sketch keeps each value's float64 bits with all but ``quantile_bits`` of the mantissa
dropped: numpy's "linear" quantile within ``2 ** -(quantile_bits + 1)`` of the larger of the two
order statistics it interpolates. Of an integer (or boolean) column, a bucket that holds one
integer stands for it, exactly; a quantile that would come from a bucket of several integers (a
``timestamp`` in nanoseconds: 2**48 of them a bucket at 12 bits, a scene's 25 s in one) is refused
(:class:`~l5dask.errors.UsageError`, naming ``quantile_bits=52``), never given approximately.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from l5dask.core import cache as cachelib
from l5dask.core.engine import Reduction, fold_exclusive, tree_combine
from l5dask.errors import UsageError
from l5dask.prediction.kernels import (
    Sketch,
    group_reduce,
    int_range,
    keyed_reduce,
    merge_sketches,
    range_codes,
    sketch_add,
    sketch_counts,
    sketch_range,
)

#: Mantissa bits the quantile sketch keeps by default: 1.2e-4 relative error at most.
QUANTILE_BITS = 12
#: Up to these mantissa bits, a sketch's counts are kept in a table of the (group, exponent) pairs
#: that occur (``kernels.Sketch``: ``2 ** bits`` cells each).
SKETCH_TABLE_BITS = 16
_SIGN = np.int64(0x7FFF_FFFF_FFFF_FFFF)


@cachelib.partial_type
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


def dense_table(los: Sequence[int], spans: Sequence[int]) -> np.ndarray:
    """The keys of each mixed-radix code ``0 .. prod(spans) - 1`` (the last key varies fastest)."""
    grid = np.arange(math.prod(spans), dtype=np.int64)
    table = np.empty((len(grid), len(los)), np.int64)
    stride = 1
    for j in range(len(los) - 1, -1, -1):
        table[:, j] = (grid // stride) % spans[j] + los[j]
        stride *= spans[j]
    return table


def encode(keys: list[np.ndarray], n: int) -> tuple[np.ndarray, int, np.ndarray]:
    """Group codes of ``n`` rows keyed by ``keys`` (integer columns of any width): ``(codes,
    ngroups, key table)`` (the table int64).

    Small key ranges are dense (codes are mixed-radix positions, some groups empty, made a key at a
    time); others are made dense by sorting the distinct keys.
    """

    if not keys:
        return np.zeros(n, np.int64), 1, np.zeros((1, 0), np.int64)
    if n == 0:
        return np.zeros(0, np.int64), 0, np.zeros((0, len(keys)), np.int64)
    ranges = [int_range(k) for k in keys]
    los = [lo for lo, _ in ranges]
    spans = [hi - lo + 1 for lo, hi in ranges]
    total = math.prod(spans)
    if len(keys) == 1 and keys[0].dtype != np.uint64 and total <= 2 * n + 4096:
        # (one key: ``k - lo`` in one compiled pass, where numpy made four arrays of the rows)
        return range_codes(keys[0], los[0], total), total, dense_table(los, spans)
    if total < 2**62:
        codes = np.zeros(n, np.int64)
        stride = 1
        for k, lo, span in zip(keys[::-1], los[::-1], spans[::-1]):  # the last key varies fastest
            codes += (k.astype(np.int64, copy=False) - lo) * stride
            stride *= span
        if total <= 2 * n + 4096:
            return codes, total, dense_table(los, spans)
        uniq, codes = np.unique(codes, return_inverse=True)
        table = np.empty((len(uniq), len(keys)), np.int64)
        stride = 1
        for j in range(len(keys) - 1, -1, -1):
            table[:, j] = (uniq // stride) % spans[j] + los[j]
            stride *= spans[j]
        return codes.astype(np.int64), len(uniq), table
    table, codes = np.unique(
        np.stack([k.astype(np.int64, copy=False) for k in keys], axis=1), axis=0, return_inverse=True
    )
    return codes.reshape(-1).astype(np.int64), len(table), table


def buckets(values: np.ndarray, bits: int) -> np.ndarray:
    """Each value's sketch bucket: its float64 bits ordered as the values, all but ``bits`` of
    the mantissa dropped (values must not be NaN)."""
    raw = (values + 0.0).view(np.int64)  # + 0.0: -0.0 is 0.0
    ordered = raw ^ ((raw >> 63) & _SIGN)
    return ordered >> (52 - bits)


def _bucket_edges(b: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """The float64 values of each bucket's lowest and highest bits (in the order of the bits)."""
    shift = 52 - bits
    lo_ord = b << shift
    hi_ord = lo_ord + ((1 << shift) - 1)
    lo = (lo_ord ^ ((lo_ord >> 63) & _SIGN)).view(np.float64)
    hi = (hi_ord ^ ((hi_ord >> 63) & _SIGN)).view(np.float64)
    return lo, hi


def bucket_values(b: np.ndarray, bits: int) -> np.ndarray:
    """The midpoint of each bucket (the value itself when a bucket holds one value)."""
    lo, hi = _bucket_edges(b, bits)
    with np.errstate(invalid="ignore"):
        mid = lo + (hi - lo) / 2
    # the bucket that starts at 0.0 holds 0 (exactly) and the smallest subnormals: it stands for 0;
    # an infinity's bucket holds it alone (its other edge a NaN's bits: -inf's is its low one)
    inf = np.where(np.isinf(hi), hi, lo)
    with np.errstate(invalid="ignore"):
        return np.where(lo == 0.0, 0.0, np.where(np.isfinite(lo) & np.isfinite(hi), mid, inf))


def _sketch(
    codes: np.ndarray,
    values: np.ndarray,
    bits: int,
    ngroups: int | None = None,
    rows: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(group, bucket, count) of the rows whose value is not NaN (codes in ``[0, ngroups)``),
    sorted by group then bucket (values of any number type, taken as float64); with ``rows``
    (``ngroups`` int64), each row (NaN or not) is added to ``rows[code]`` in the same pass.

    The buckets' range (numpy's ``min`` and ``max`` of the values; ``kernels.sketch_range``'s
    compiled pass where a value is NaN), then one compiled pass (``kernels.sketch_counts``) counts
    each row in a table of (group, bucket) whose cells that are not 0 are the sketch (2.6x the
    numpy it replaced: ``_columns.pyx``). Where that table would be large (values from 0 to 30
    span 4.2 million buckets), the cells of each (group, sign and exponent) that occurs
    (``kernels.Sketch``, ``bits`` up to :data:`SKETCH_TABLE_BITS`); else the buckets are made and
    sorted."""
    z = np.zeros(0, np.int64)
    if not len(values):
        return z, z, z
    if values.dtype != np.dtype(np.float32) and values.dtype != np.dtype(np.float64):
        values = values.astype(np.float64)
    if ngroups is None:
        ngroups = int(codes.max()) + 1
    # (the buckets' range from the values' minimum and maximum, numpy's vector loops, when no
    # value is NaN: a bucket grows with its value)
    lo_hi = np.array([values.min(), values.max()], np.float64)
    counted = rows is None
    if np.isnan(lo_hi).any():
        n, blo, bhi, g_hi = sketch_range(codes, values, bits, ngroups, rows)
        counted = True
        if n == 0:
            return z, z, z
    else:
        blo, bhi = (int(b) for b in buckets(lo_hi, bits))
        n, g_hi = len(values), ngroups
    span = bhi - blo + 1
    if span * g_hi <= 4 * n + 4096 and len(values) < 2**31:  # (int32 counts: the table is half the bytes)
        counts = np.zeros(span * g_hi, np.int32)
        sketch_counts(codes, values, bits, blo, span, counts, None if counted else rows)
        nz = np.flatnonzero(counts != 0)  # (numpy's nonzero of bools: 7x its nonzero of int64)
        return nz // span, nz % span + blo, counts[nz].astype(np.int64)
    hspan = (bhi >> bits) - (blo >> bits) + 1
    if bits <= SKETCH_TABLE_BITS and g_hi * hspan <= 4 * n + 4096:
        # (a value range wider than the table above (0 among values of 1 to 30: 4.2 million
        # buckets a group): the cells of each (group, exponent) that occurs, no sort)
        sketch = Sketch(g_hi, bits, blo >> bits, hspan, sketch_cells(n, bits))
        # (rows counted first: a table that fills up leaves them partly counted)
        if not counted and rows is not None:
            rows += np.bincount(codes, minlength=ngroups)
            counted = True
        if sketch_add(codes, values, sketch):
            return sketch.result()
    if not counted and rows is not None:
        rows += np.bincount(codes, minlength=ngroups)
    v = values.astype(np.float64, copy=False)
    ok = ~np.isnan(v)
    g, x = (codes, v) if ok.all() else (codes[ok], v[ok])
    b = buckets(x, bits)
    if span < 2**62 // max(g_hi, 1):
        uniq, many = np.unique(g * span + (b - blo), return_counts=True)
        return uniq // span, uniq % span + blo, many.astype(np.int64)
    order = np.lexsort((b, g))
    g, b = g[order], b[order]
    new = np.r_[True, (g[1:] != g[:-1]) | (b[1:] != b[:-1])]
    starts = np.flatnonzero(new)
    return g[starts], b[starts], np.diff(np.r_[starts, len(g)])


def counts_rows(need: set[str], dtype: np.dtype) -> bool:
    """Whether a value column asked ``need`` is only counted and holds no NaN (integers, booleans,
    text: as pandas' count of a column without nulls, every row counts): its count is its group's
    rows, the column never made."""
    return need == {"n"} and np.dtype(dtype).kind not in "fc"


def exact(dtype: np.dtype) -> bool:
    """Whether a value column is reduced exactly as integers (booleans, signed and unsigned
    integers): min and max in its dtype, its sum in two int64 limbs (:func:`int_stats`)."""
    return np.dtype(dtype).kind in "biu"


_LOW = 0xFFFF_FFFF


def _fill(dtype: np.dtype, high: bool) -> Any:
    """The identity of a group's minimum (``high``: the largest value) or maximum in ``dtype``."""
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return high
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return info.max if high else info.min
    return np.inf if high else -np.inf


def _carried(hi: np.ndarray, lo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A sum ``hi * 2**32 + lo`` with ``lo`` brought into ``[0, 2**32)`` (its carry into ``hi``)."""
    return hi + (lo >> 32), lo & hi.dtype.type(_LOW)


def int_mean(hi: np.ndarray, lo: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The mean of integers whose sum is ``hi * 2**32 + lo`` (``lo`` in ``[0, 2**32)``) over ``n``
    values (0: no value; any) as ``(whole, frac)``: its floor, exactly, in ``hi``'s dtype, and
    the rest, ``0 <= frac < 1``, rounded once (made from integer divisions while a group has
    fewer than ``2**31`` values; past that, ``frac`` within ``2**-21`` of it): each value's
    deviation from it (``m2``). :func:`exact_mean` makes the mean itself."""
    wide = hi.dtype.type
    nn = np.maximum(n, 1).astype(hi.dtype)
    q = hi // nn  # (floor)
    r = hi - q * nn  # (0 <= r < n)
    with np.errstate(over="ignore"):  # (wrapping only where np.where drops it, or back into range)
        rest = (r << wide(32)) + lo  # (< n * 2**32 + 2**32: fits while n < 2**31)
        q2 = rest // nn
        frac = (rest - q2 * nn).astype(np.float64) / nn.astype(np.float64)
        big = nn >= 2**31
        if big.any():
            t = (r.astype(np.float64) * 2.0**32 + lo.astype(np.float64)) / nn.astype(np.float64)
            w = np.floor(t)
            q2 = np.where(big, w.astype(hi.dtype), q2)
            frac = np.where(big, t - w, frac)
        return (q << wide(32)) + q2, frac


def exact_mean(hi: np.ndarray, lo: np.ndarray, n: np.ndarray) -> np.ndarray:
    """The mean of integers whose sum is ``hi * 2**32 + lo`` (``lo`` in ``[0, 2**32)``) over ``n``
    values, correctly rounded to float64 (NaN where ``n`` is 0): a sum under ``2**53`` (exact in
    float64) divided by ``n`` in one IEEE division, as numpy and pandas make the mean of such a
    group; a larger one (a column of timestamps) as Python divides its integers (``int / int``,
    correctly rounded), a group at a time. (The floor and the fraction of :func:`int_mean` added
    in float64 rounded twice: one mean in 300 came out a unit in the last place off, a new user's
    trial.)"""
    out = np.full(len(n), np.nan)
    has = n > 0
    small = has & (hi >= -(2**21)) & (hi < 2**21)  # (|sum| < 2**53)
    total = (hi[small].astype(np.int64) << np.int64(32)) + lo[small].astype(np.int64)
    out[small] = total.astype(np.float64) / n[small].astype(np.float64)
    for i in np.flatnonzero(has & ~small):
        out[i] = (int(hi[i]) * 2**32 + int(lo[i])) / int(n[i])
    return out


def int_stats(codes: np.ndarray, raw: np.ndarray, ngroups: int, need: set[str]) -> dict[str, np.ndarray]:
    """The statistics of an integer (or boolean) value column per group, exact: ``n`` (its rows),
    ``sum_hi`` and ``sum_lo`` (the sum ``sum_hi * 2**32 + sum_lo``, ``sum_lo`` in ``[0, 2**32)``,
    int64, uint64 for unsigned columns: any sum of fewer than ``2**31`` rows at a time, never
    wrapped), ``min``/``max`` in the column's dtype, ``m2`` from each value's deviation from its
    group's mean made as integers (exact) less the mean's fraction."""
    stats: dict[str, np.ndarray] = {"n": np.bincount(codes, minlength=ngroups).astype(np.int64)}
    one = ngroups == 1
    if need & {"sum", "m2"}:
        wide = np.uint64 if raw.dtype.kind == "u" else np.int64
        if not one and raw.dtype.itemsize <= 2 and len(raw) < 2**31:
            # values within 2**16 of 0 (booleans, 8- and 16-bit integers), fewer than 2**31 rows:
            # every group's sum is within 2**47 of 0, exact in float64: bincount's weighted count
            # instead of np.add.at into two limbs (this function with a sum, 640,000 rows, 300
            # groups: 2.5-3.0 ms against 9.2-12.3 ms, the same bits; 4-byte and wider values still
            # take the limbs, 10 ms)
            weights = raw.view(np.uint8) if raw.dtype == bool else raw
            total = np.bincount(codes, weights=weights, minlength=ngroups).astype(wide)
            hi, lo = total >> wide(32), total & wide(_LOW)
        else:
            v = raw.astype(wide, copy=False)
            hi_v, lo_v = v >> wide(32), v & wide(_LOW)
            hi, lo = np.zeros(ngroups, wide), np.zeros(ngroups, wide)
            if one:
                hi[:] = hi_v.sum(dtype=wide) if len(v) else 0
                lo[:] = lo_v.sum(dtype=wide) if len(v) else 0
            else:
                np.add.at(hi, codes, hi_v)
                np.add.at(lo, codes, lo_v)
        stats["sum_hi"], stats["sum_lo"] = _carried(hi, lo)
        if "m2" in need:
            v = raw.astype(wide, copy=False)
            whole, frac = int_mean(stats["sum_hi"], stats["sum_lo"], stats["n"])
            with np.errstate(over="ignore"):  # (a deviation is exact in int64 unless the values span 2**63)
                dev = (v - whole[codes]).view(np.int64).astype(np.float64) - frac[codes]
            stats["m2"] = np.bincount(codes, weights=dev * dev, minlength=ngroups)
    for stat, ufunc, reduce in (("min", np.minimum, np.min), ("max", np.maximum, np.max)):
        if stat in need:
            out = np.full(ngroups, _fill(raw.dtype, stat == "min"), raw.dtype)
            if one:
                if len(raw):
                    out[:] = reduce(raw)
            else:
                ufunc.at(out, codes, raw)
            stats[stat] = out
    return stats


def group_part(
    keys: list[np.ndarray],
    values: dict[str, np.ndarray],
    needs: dict[str, set[str]],
    quantile_bits: int = QUANTILE_BITS,
    keep: np.ndarray | None = None,
    n: int | None = None,
    ranges: Sequence[tuple[int, int]] | None = None,
) -> GroupPart:
    """The partial of ``n`` rows (default: the keys' or the values' length): grouped by ``keys``
    (integer columns), each value column reduced to the statistics it ``needs`` (an integer column
    only counted may be left empty); rows where ``keep`` is False left out. ``ranges``: each key's
    ``(min, max)`` where the caller knows them (no ``keep``), not computed again."""
    if n is None:
        n = len(keys[0]) if keys else len(next(iter(values.values())))
    if keep is not None and keep.all():
        keep = None
    if keep is not None:  # (the kept rows taken: 5x faster than the codes of a mask; faster than
        # skipping the others in keyed_reduce's loop, 2026-11-28)
        kept = np.flatnonzero(keep)
        keys = [k.take(kept) for k in keys]
        values = {name: v if counts_rows(needs[name], v.dtype) else v.take(kept) for name, v in values.items()}
        n, keep, ranges = len(kept), None, None
    keyed = _keyed_ranges(keys, values, needs, n, quantile_bits, ranges)
    if keyed is not None:
        part = _group_part_keyed(keys, *keyed, values, needs, n, quantile_bits)
        if part is not None:
            return part
    codes, ngroups, table = encode(list(keys), n)
    rows = None
    full: dict[str, dict[str, Any]] = {}  # each value column's statistics over all ngroups
    floats: dict[str, np.ndarray] = {}
    for name, v in values.items():
        need = needs[name]
        if counts_rows(need, v.dtype):  # counting a column with no NaN (integers, text): its rows
            continue
        floats[name] = raw = v
        stats: dict[str, Any] = {}
        if exact(raw.dtype) and need & {"n", "sum", "min", "max", "m2"}:
            stats = int_stats(codes, raw, ngroups, need)
            rows = stats["n"] if rows is None else rows  # (integers: every row counts)
        elif need & {"n", "sum", "min", "max", "m2"}:
            v = raw.astype(np.float64, copy=False)
            # (the first column reduced counts the groups' rows in its pass: no bincount of its own)
            counted = np.zeros(ngroups, np.int64) if rows is None else None
            count, total, lo, hi = group_reduce(
                codes,
                v,
                ngroups,
                sums="sum" in need or "m2" in need,
                mins="min" in need,
                maxs="max" in need,
                rows=counted,
            )
            rows = counted if counted is not None else rows
            stats["n"] = count
            if "sum" in need or "m2" in need:
                stats["sum"] = total
            if "min" in need:
                stats["min"] = lo
            if "max" in need:
                stats["max"] = hi
            if "m2" in need:
                assert total is not None  # asked for with m2
                mean = np.divide(total, count, out=np.zeros(ngroups), where=count > 0)
                with np.errstate(invalid="ignore"):  # (inf - inf: NaN, as it should be)
                    dev = v - mean[codes]
                # (a NaN value is skipped; a group holding an infinity has no variance: NaN, as
                # pandas and numpy say, never the 0 or inf of its deviations taken as 0)
                dev[np.isnan(v)] = 0.0
                stats["m2"] = np.bincount(codes, weights=dev * dev, minlength=ngroups)
        full[name] = stats
    # (each sketch over the column as it came, the groups' rows counted by the first when no column
    # did; its groups renumbered after, on its few rows: the renumbering keeps their order, every
    # row's group has rows)
    sketches = {}
    for name in values:
        if "sketch" in needs[name]:
            counted = np.zeros(ngroups, np.int64) if rows is None else None
            sketches[name] = _sketch(codes, floats[name], quantile_bits, ngroups, counted)
            rows = counted if counted is not None else rows
    if rows is None:
        rows = np.bincount(codes, minlength=ngroups)
    part, present, remap = _present_part(table, rows, full, values)
    for name, (sg, sb, sc) in sketches.items():
        part.sketches[name] = (remap[sg] if remap is not None else sg, sb, sc)
    return part


def _present_part(
    table: np.ndarray, rows: np.ndarray, full: dict[str, dict[str, Any]], values: dict
) -> tuple[GroupPart, np.ndarray, np.ndarray | None]:
    """The partial of the groups that have rows (``dropped``: the last group holds the rows left
    out), from each column's statistics over all groups (``full``; a column not there is an
    integer only counted: its groups' rows); with the groups kept and their new positions."""
    present = rows > 0
    dense = not present.all()
    remap = np.cumsum(present) - 1 if dense else None
    part = GroupPart(table[present] if dense else table, rows[present] if dense else rows)
    for name in values:
        if name not in full:
            part.stats[name] = {"n": part.rows.copy()}
        else:
            part.stats[name] = {k: (a[present] if dense else a) for k, a in full[name].items()}
    return part, present, remap


def sketch_cells(n: int, bits: int) -> int:
    """The most cells a sketch's table of the pairs that occur (``kernels.Sketch``) may hold for
    ``n`` rows: one a row, and room for 16 pairs; past them, the buckets are sorted instead (a
    table of more cells, values spread over many exponents, lost to the sort, whose counts leave
    the caches: ``benchmarks/prediction_kernels.py``, ``sketch (spread)``)."""
    return n + 2 ** (bits + 4)


#: Every sign and exponent of a float64 (a sketch's bucket ``>> bits``: -inf's is -2048, +inf's
#: 2047), as ``_exponents`` gives a range: ``(lowest, number)``.
ALL_EXPONENTS = (-(1 << 11), 1 << 12)
#: The most (group, exponent) pairs a sketch's table is made for with every exponent (a 1 MB
#: table; its pairs are marked, their cells made as values come): past them, the values' range is
#: found first (numpy's minimum and maximum: 0.06 CPU-s of a run over 30 M agents' speeds).
FULL_TABLE_PAIRS = 1 << 18


def _exponents(values: np.ndarray, bits: int) -> tuple[int, int]:
    """``(lowest, number)`` of the signs and exponents (a sketch's bucket ``>> bits``) from the
    lowest value that is not NaN to the highest (numpy's vector minimum and maximum; ``(0, 1)``
    when every value is NaN)."""
    lo, hi = values.min(), values.max()
    if np.isnan(lo) or np.isnan(hi):
        lo, hi = np.fmin.reduce(values), np.fmax.reduce(values)  # (NaN left out)
        if np.isnan(lo):
            return 0, 1
    blo, bhi = (int(b) >> bits for b in buckets(np.array([lo, hi], np.float64), bits))
    return blo, bhi - blo + 1


def _keyed_ranges(
    keys: list[np.ndarray],
    values: dict[str, np.ndarray],
    needs: dict[str, set[str]],
    n: int,
    bits: int,
    ranges: Sequence[tuple[int, int]] | None = None,
) -> tuple[list[int], list[int], dict[str, tuple[int, int]]] | None:
    """Whether :func:`_group_part_keyed` takes these rows: ``(los, spans, exponents)`` (the keys'
    ranges; each sketched column's :func:`_exponents`), or ``None`` (no rows, no keys, keys not
    dense, an ``m2``, an integer column reduced, a sketch of more than ``SKETCH_TABLE_BITS`` or of
    too many exponents). ``ranges``: the keys' ``(min, max)`` where known (not found again)."""
    if (
        not n
        or not keys
        or any("m2" in needs[c] for c in values)
        or any(exact(v.dtype) and not counts_rows(needs[c], v.dtype) for c, v in values.items())
        or (bits > SKETCH_TABLE_BITS and any("sketch" in needs[c] for c in values))
    ):
        return None
    ranges = [int_range(k) for k in keys] if ranges is None else list(ranges)
    spans = [hi - lo + 1 for lo, hi in ranges]
    size = math.prod(spans)
    if size > 2 * n + 4096:
        return None
    exponents = {}
    for name, v in values.items():
        if "sketch" in needs[name]:
            # (few groups: the table of every sign and exponent, no pass over the values for their
            # lowest and highest; the sketch holds the same counts)
            full = size * ALL_EXPONENTS[1] <= min(4 * n + 4096, FULL_TABLE_PAIRS)
            exponents[name] = ALL_EXPONENTS if full else _exponents(v, bits)
            if size * exponents[name][1] > 4 * n + 4096:
                return None
    return [lo for lo, _ in ranges], spans, exponents


def _group_part_keyed(
    keys: list[np.ndarray],
    los: list[int],
    spans: list[int],
    exponents: dict[str, tuple[int, int]],
    values: dict[str, np.ndarray],
    needs: dict[str, set[str]],
    n: int,
    bits: int = QUANTILE_BITS,
    keep: np.ndarray | None = None,
) -> GroupPart | None:
    """:func:`group_part` of dense keys (``los``, ``spans``: their ranges), no ``m2`` asked: each
    value column reduced by one compiled pass that makes the rows' group codes a few thousand at a
    time as it goes (``kernels.keyed_reduce``), where they were made whole, mixed and read again;
    a sketch counted in the same pass (``kernels.Sketch``; ``exponents``: each sketched column's
    range of them); the rows where ``keep`` is False skipped there, none taken out first. The same
    statistics, bit for bit (each group's values added in row order). ``None`` when a sketch's
    table would hold more than :func:`sketch_cells`."""
    table = dense_table(los, spans)
    size = len(table)
    strides = [math.prod(spans[j + 1 :]) for j in range(len(spans))]  # (the last key varies fastest)
    rows = np.zeros(size, np.int64)
    full: dict[str, dict[str, Any]] = {}
    sketches: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    counted = False
    for name, v in values.items():
        need = needs[name]
        if counts_rows(need, v.dtype):  # counting a column with no NaN (integers, text): its rows
            continue
        out = (
            np.zeros(size, np.int64),
            np.zeros(size) if "sum" in need else None,
            np.full(size, np.inf) if "min" in need else None,
            np.full(size, -np.inf) if "max" in need else None,
        )
        sketch = Sketch(size, bits, *exponents[name], sketch_cells(n, bits)) if "sketch" in need else None
        if not keyed_reduce(keys, los, strides, n, out, v, None if counted else rows, sketch, keep):
            return None  # (the sketch's table full: group_part's other way)
        counted = True
        if sketch is not None:
            sketches[name] = sketch.result()
        if need & {"n", "sum", "min", "max"}:  # (a column only quantiled: its sketch holds everything)
            full[name] = {"n": out[0], **{k: a for k, a in zip(("sum", "min", "max"), out[1:]) if a is not None}}
        else:
            full[name] = {}
    if not counted:
        keyed_reduce(keys, los, strides, n, (np.zeros(size, np.int64), None, None, None), None, rows, None, keep)
    part, _, remap = _present_part(table, rows, full, values)
    for name, (sg, sb, sc) in sketches.items():
        part.sketches[name] = (remap[sg] if remap is not None else sg, sb, sc)
    return part


def _scatter(size: int, index: np.ndarray, values: np.ndarray, fill: float | int) -> np.ndarray:
    out = np.full(size, fill, dtype=values.dtype)
    out[index] = values
    return out


def merge_keys(ka: np.ndarray, kb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sorted union of two sorted tables of distinct keys (``(groups, len(by))`` int64) and
    where each row of each went: ``(keys, ia, ib)``, ``keys[ia] == ka``, ``keys[ib] == kb``.

    Each row is one int64 code, its mixed-radix position in the keys' ranges (lexicographic order
    kept), when they fit; the codes merged by a sort of the two sorted runs, 7x faster than
    ``np.unique(axis=0)`` on the 2-column keys of a scene-and-label partial (1,500-29,000 groups)."""
    width = ka.shape[1]
    if width == 0 or not len(ka) + len(kb):  # (no keys: one group, the whole array)
        uniq = np.zeros((min(1, len(ka) + len(kb)), width), np.int64)
        return uniq, np.zeros(len(ka), np.int64), np.zeros(len(kb), np.int64)
    if width == 1:
        codes_a, codes_b = ka[:, 0], kb[:, 0]
    else:
        # (column by column: numpy's reductions and products along the rows of a 2-D table are
        # strided, 10-20x slower)
        ranges = [int_range(np.concatenate([ka[:, j], kb[:, j]])) for j in range(width)]
        if math.prod(hi - lo + 1 for lo, hi in ranges) >= 2**62:
            uniq, inv = np.unique(np.concatenate([ka, kb]), axis=0, return_inverse=True)
            inv = inv.reshape(-1)
            return uniq, inv[: len(ka)], inv[len(ka) :]
        codes_a, codes_b = np.zeros(len(ka), np.int64), np.zeros(len(kb), np.int64)
        stride = 1
        for j in range(width - 1, -1, -1):  # the last key varies fastest
            lo, hi = ranges[j]
            codes_a += (ka[:, j] - lo) * stride
            codes_b += (kb[:, j] - lo) * stride
            stride *= hi - lo + 1
    codes = np.concatenate([codes_a, codes_b])
    order = np.argsort(codes, kind="stable")  # (two sorted runs: one merge)
    ordered = codes[order]
    new = np.empty(len(codes), bool)
    new[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    inv = np.empty(len(codes), np.int64)
    inv[order] = np.cumsum(new) - 1
    ia, ib = inv[: len(ka)], inv[len(ka) :]
    keys = np.empty((int(new.sum()), width), np.int64)
    keys[ia] = ka
    keys[ib] = kb
    return keys, ia, ib


def combine_parts(a: GroupPart, b: GroupPart) -> GroupPart:
    """Two neighbouring partials merged (associative; the keys stay sorted)."""
    if not len(a):
        return b
    if not len(b):
        return a
    uniq, ia, ib = merge_keys(a.keys, b.keys)
    size = len(uniq)
    rows = _scatter(size, ia, a.rows, 0)
    rows[ib] += b.rows
    out = GroupPart(uniq, rows)
    with np.errstate(invalid="ignore"):  # (an infinity's group: NaN sums and deviations, said by the result)
        for name, sa in a.stats.items():
            sb = b.stats[name]
            if not sa:  # quantiles only: the sketch holds everything
                out.stats[name] = {}
                continue
            na, nb = _scatter(size, ia, sa["n"], 0), _scatter(size, ib, sb["n"], 0)
            n = na + nb
            s = {"n": n}
            if "sum_hi" in sa:
                s["sum_hi"], s["sum_lo"] = _carried(
                    _scatter(size, ia, sa["sum_hi"], 0) + _scatter(size, ib, sb["sum_hi"], 0),
                    _scatter(size, ia, sa["sum_lo"], 0) + _scatter(size, ib, sb["sum_lo"], 0),
                )
                if "m2" in sa:
                    wa, fa = int_mean(_scatter(size, ia, sa["sum_hi"], 0), _scatter(size, ia, sa["sum_lo"], 0), na)
                    wb, fb = int_mean(_scatter(size, ib, sb["sum_hi"], 0), _scatter(size, ib, sb["sum_lo"], 0), nb)
                    # (the means' difference from their floors, exact: not of two rounded means)
                    with np.errstate(over="ignore"):
                        delta = (wb - wa).view(np.int64).astype(np.float64) + (fb - fa)
                    s["m2"] = (
                        _scatter(size, ia, sa["m2"], 0.0)
                        + _scatter(size, ib, sb["m2"], 0.0)
                        + np.divide(delta * delta * na * nb, n, out=np.zeros(size), where=(na > 0) & (nb > 0))
                    )
            if "sum" in sa:
                ta, tb = _scatter(size, ia, sa["sum"], 0.0), _scatter(size, ib, sb["sum"], 0.0)
                s["sum"] = ta + tb
                if "m2" in sa:
                    ma = np.divide(ta, na, out=np.zeros(size), where=na > 0)
                    mb = np.divide(tb, nb, out=np.zeros(size), where=nb > 0)
                    delta = mb - ma
                    s["m2"] = (
                        _scatter(size, ia, sa["m2"], 0.0)
                        + _scatter(size, ib, sb["m2"], 0.0)
                        + np.divide(delta * delta * na * nb, n, out=np.zeros(size), where=n > 0)
                    )
            if "min" in sa:
                fill = _fill(sa["min"].dtype, True)
                s["min"] = np.minimum(_scatter(size, ia, sa["min"], fill), _scatter(size, ib, sb["min"], fill))
            if "max" in sa:
                fill = _fill(sa["max"].dtype, False)
                s["max"] = np.maximum(_scatter(size, ia, sa["max"], fill), _scatter(size, ib, sb["max"], fill))
            out.stats[name] = s
    for name, (ga, ba, ca) in a.sketches.items():
        gb, bb, cb = b.sketches[name]
        # (each sorted by group and bucket, the groups renumbered in their order: one merge)
        merged = merge_sketches((ia[ga], ba, ca), (ib[gb], bb, cb))
        if merged is not None:
            out.sketches[name] = merged
            continue
        g, bk, cnt = np.concatenate([ia[ga], ib[gb]]), np.concatenate([ba, bb]), np.concatenate([ca, cb])
        order = np.lexsort((bk, g))
        g, bk, cnt = g[order], bk[order], cnt[order]
        if len(g):
            new = np.r_[True, (g[1:] != g[:-1]) | (bk[1:] != bk[:-1])]
            starts = np.flatnonzero(new)
            g, bk, cnt = g[starts], bk[starts], np.add.reduceat(cnt, starts)
        out.sketches[name] = (g, bk, cnt)
    return out


def reduce_parts(leaves: Sequence[Sequence[Any]], reduction: Reduction, name: str, dependencies: Sequence = ()):
    """A ``Delayed`` of ``reduction``'s finalized result over the blocks of other collections
    (dask's ``Bag.reduction`` shape): leaf ``i`` is ``reduction.chunk(args, i, None)``, ``args`` the
    outputs of the keys ``leaves[i]`` lists (a block of a dask array and its coordinates' blocks,
    a partition of a DataFrame); the partials are merged by the engine's one ordered tree
    (:func:`l5dask.core.engine.tree_combine`, fan-in from dask's ``split_every``), as a pass's are.
    ``dependencies``: the collections that hold the keys. Nothing is computed here."""
    from dask.delayed import Delayed
    from dask.highlevelgraph import HighLevelGraph
    from dask.task_spec import List, Task, TaskRef

    layer = f"{name}-chunk"
    graph: dict = {}
    for i, deps in enumerate(leaves):
        key = (layer, i)
        graph[key] = Task(key, reduction.chunk, List(*[TaskRef(d) for d in deps]), i, None)
    keys = list(graph)
    # (each leaf one task with the tasks of its block only it needs: see fold_exclusive)
    whole = dict(HighLevelGraph.merge(*[c.__dask_graph__() for c in dependencies])) if dependencies else {}
    folded = fold_exclusive({**whole, **graph}, keys) if whole else None
    if folded is not None:
        hlg = HighLevelGraph.from_collections(layer, folded, dependencies=())
    else:
        hlg = HighLevelGraph.from_collections(layer, graph, dependencies=list(dependencies))
    parts = [Delayed(key, hlg, layer=layer) for key in keys]
    return tree_combine(parts, reduction, finalize=True, name=f"{name}-combine")


def _lerp(a: np.ndarray, b: np.ndarray, t: np.ndarray) -> np.ndarray:
    """numpy's linear interpolation of its quantiles (``numpy.lib._function_base_impl._lerp``),
    but for a quantile that falls on one value (``t == 0``, or both order statistics the same):
    that value, an infinity too (numpy's formula makes NaN of ``x + inf * 0``; its median and
    pandas' quantiles take the value)."""
    with np.errstate(invalid="ignore"):
        diff = b - a
        out = np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)
    return np.where((t == 0) | (a == b), a, out)


def integer_buckets(b: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Of buckets of integers: each one's integer where it holds one (as float64), and whether it
    holds one (else its midpoint, and False). A bucket holds the values whose float64 bits agree
    but for the mantissa's last ``52 - bits``: from 2**(bits + 1) on, more than one integer."""
    lo, hi = _bucket_edges(b, bits)
    a, z = np.ceil(np.minimum(lo, hi)), np.floor(np.maximum(lo, hi))
    one = a == z  # (a bucket that holds an integer column's value holds at least that one)
    return np.where(one, a, bucket_values(b, bits)), one


def sketch_quantiles(
    sketch: tuple[np.ndarray, np.ndarray, np.ndarray],
    ngroups: int,
    q: float,
    bits: int,
    integers: bool = False,
    column: str = "",
) -> np.ndarray:
    """Quantile ``q`` of each group (NaN for a group without values), numpy's "linear" method.
    ``integers``: the sketch of an integer column (``column``, for the message): exact, or a
    :class:`~l5dask.errors.UsageError` where a bucket it needs holds more than one integer."""
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
    at_lo = np.searchsorted(cum, base[has] + lo_rank, side="right")
    at_hi = np.searchsorted(cum, base[has] + hi_rank, side="right")
    if integers:
        vals, one = integer_buckets(b, bits)
        if not (one[at_lo].all() and one[at_hi].all()):
            wide = np.concatenate([at_lo[~one[at_lo]], at_hi[~one[at_hi]]])
            largest = float(np.max(np.abs(vals[wide])))
            off = largest * 2.0 ** -(bits + 1)
            raise UsageError(
                f"the q{q * 100:g} of {column or 'an integer column'} cannot be exact: its integers (up to "
                f"{largest:.4g}) share the quantile sketch's buckets at quantile_bits={bits} (off by up to "
                f"{off:.3g}); pass quantile_bits=52 (--quantile-bits 52; quantile-bits = 52 in a job): exact to 2**53"
            )
    else:
        vals = bucket_values(b, bits)
    out[has] = _lerp(vals[at_lo], vals[at_hi], h - lo_rank)
    return out


# --- the declared aggregations --------------------------------------------------------------
#: The statistics a partial keeps per group of a value column (what an aggregation ``needs``):
#: ``group_part`` makes them from rows, ``combine_parts`` merges two partials' (``m2``
#: by Chan's formula, the sketch's counts added bucket by bucket).
STATISTICS = ("n", "sum", "m2", "min", "max", "sketch")


@dataclass(frozen=True)
class Stats:
    """One value column's statistics over ``size`` groups, as an aggregation is finalized from
    them: a statistic not needed is ``None``."""

    size: int
    n: Any = None
    sum: Any = None
    m2: Any = None
    min: Any = None
    max: Any = None
    sketch: Any = None
    quantile_bits: int = 12
    sum_hi: Any = None  # (an integer column's exact sum: sum_hi * 2**32 + sum_lo)
    sum_lo: Any = None
    column: str = ""
    dtype: Any = None  # (the column's, when known: a float32 column's min and max keep it, as pandas')


def stats_of(part: GroupPart, name: str, quantile_bits: int, column: str | None = None, dtype: Any = None) -> Stats:
    """The statistics of value column ``name`` in a (merged) partial (``column``: as users name
    it, for messages; ``dtype``: its dtype, when known)."""
    s = part.stats.get(name, {})
    return Stats(
        len(part), **s, sketch=part.sketches.get(name), quantile_bits=quantile_bits, column=column or name, dtype=dtype
    )


@dataclass(frozen=True)
class Aggregation:
    """A reduction of a value column per group, declared once (flox's ``Aggregation``).

    Parameters
    ----------
    name : str
        As users name it (``aggregate(values={"speed": [name]})``, ``--value speed:name``, the
        column ``speed_name`` of the result).
    needs : tuple of str
        The per-group statistics (``STATISTICS``) it is finalized from: each chunk of rows is
        reduced to them (``group_part``) and partials are merged (``combine_parts``) before
        ``finalize`` sees them.
    finalize : callable ``(Stats) -> array``
        A value per group of the merged partial (its groups have rows; NaN values skipped).
    fill_value : float
        A group without values (no rows, or only NaN ones) where results are laid on a grid of
        expected groups (the xarray accessor's), as xarray's own reduction fills it.
    q : float, optional
        A quantile's probability.
    """

    name: str
    needs: tuple[str, ...]
    finalize: Callable[[Stats], np.ndarray]
    fill_value: float = np.nan
    q: float | None = None

    def __dask_tokenize__(self):
        return ("l5dask.prediction.groupby.Aggregation", self.name, self.q)


def _count(s: Stats) -> np.ndarray:
    return s.n


def _sum(s: Stats) -> np.ndarray:
    if s.sum_hi is None:
        return s.sum
    hi, lo = s.sum_hi, s.sum_lo
    if hi.dtype.kind == "u":  # (pandas' sum of unsigned integers: uint64)
        fits, bound = hi < 2**32, "uint64"
    else:
        fits, bound = (hi >= -(2**31)) & (hi < 2**31), "int64"
    if not fits.all():
        bad = np.flatnonzero(~fits)
        first = int(hi[bad[0]]) * 2**32 + int(lo[bad[0]])
        raise UsageError(
            f"the sum of {s.column} does not fit {bound} in {len(bad):,} group(s) (e.g. {first:.4g}): "
            "refused rather than wrapped or rounded (ask its mean, or sum fewer rows)"
        )
    return (hi << hi.dtype.type(32)) + lo


def _mean(s: Stats) -> np.ndarray:
    if s.sum_hi is not None:  # (an integer column: from its exact sum)
        return exact_mean(s.sum_hi, s.sum_lo, s.n)
    return np.divide(s.sum, s.n, out=np.full(s.size, np.nan), where=s.n > 0)


def _var(s: Stats) -> np.ndarray:  # ddof=1, as pandas
    return np.divide(s.m2, s.n - 1, out=np.full(s.size, np.nan), where=s.n > 1)


def _std(s: Stats) -> np.ndarray:
    return np.sqrt(_var(s))


def _extreme(s: Stats, values: np.ndarray) -> np.ndarray:
    # (an integer column's in its dtype when every group has a value; else float64, NaN where
    # none, as pandas; a float32 column's in float32, whose values they are)
    if exact(values.dtype) and (s.n > 0).all():
        return values
    out = np.where(s.n > 0, values, np.nan)
    return out.astype(np.float32) if s.dtype is not None and np.dtype(s.dtype) == np.float32 else out


def _min(s: Stats) -> np.ndarray:
    return _extreme(s, s.min)


def _max(s: Stats) -> np.ndarray:
    return _extreme(s, s.max)


def _quantile(q: float, s: Stats) -> np.ndarray:
    integers = s.dtype is not None and exact(s.dtype)
    return sketch_quantiles(s.sketch, s.size, q, s.quantile_bits, integers, s.column)


def quantile(q: float, name: str | None = None) -> Aggregation:
    """The aggregation of quantile ``q`` (numpy's "linear" one, from the sketch: see the module)."""
    return Aggregation(name or f"q{q * 100:g}", ("sketch",), functools.partial(_quantile, q), np.nan, q)


count = Aggregation("count", ("n",), _count)
sum_ = Aggregation("sum", ("n", "sum"), _sum, fill_value=0)
mean = Aggregation("mean", ("n", "sum"), _mean)
min_ = Aggregation("min", ("n", "min"), _min)
max_ = Aggregation("max", ("n", "max"), _max)
var = Aggregation("var", ("n", "sum", "m2"), _var)
std = Aggregation("std", ("n", "sum", "m2"), _std)
median = quantile(0.5, "median")

#: The declared aggregations by name; ``q<percent>`` (``q50``, ``q99.9``) makes a quantile's.
AGGREGATIONS = {a.name: a for a in (count, sum_, mean, min_, max_, var, std, median)}
_Q = re.compile(r"^q(\d+(?:\.\d+)?)$")


def checked_bits(quantile_bits: Any) -> int:
    """The sketch's mantissa bits (``None``: the default), or a one-line error."""
    bits = QUANTILE_BITS if quantile_bits is None else quantile_bits
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 0 <= bits <= 52:
        raise UsageError(f"quantile_bits must be an integer from 0 to 52, not {quantile_bits!r}")
    return int(bits)


def checked_probabilities(q: Any) -> np.ndarray:
    """Quantiles' probabilities (one, or a sequence) as float64, each in [0, 1], or a one-line error."""
    try:
        qs = np.atleast_1d(np.asarray(q, dtype=np.float64))
    except (TypeError, ValueError):
        raise UsageError(f"quantiles are probabilities in [0, 1], not {q!r}") from None
    if qs.ndim != 1 or not len(qs) or ((qs < 0) | (qs > 1) | np.isnan(qs)).any():
        raise UsageError(f"quantiles are probabilities in [0, 1], not {q!r}")
    return qs


def aggregation(name: str, of: str = "") -> Aggregation:
    """The declared aggregation called ``name`` (``of``: the column, for the error message)."""
    found = AGGREGATIONS.get(name) if isinstance(name, str) else None
    if found is not None:
        return found
    m = _Q.fullmatch(name) if isinstance(name, str) else None
    if m is None:
        raise UsageError(
            f"unknown reduction {name!r}{f' (for {of})' if of else ''}; they are: {', '.join(AGGREGATIONS)}, "
            "q<percent> (q50, q99.9)"
        )
    q = float(m.group(1)) / 100
    if not 0 <= q <= 1:
        raise UsageError(f"{name!r}: a quantile is between q0 and q100")
    return quantile(q, name)


def empty_part(nby: int, needs: dict[str, set[str]], dtypes: dict[str, np.dtype] | None = None) -> GroupPart:
    """The partial of no rows (the identity of :func:`combine_parts`) for value columns that need
    these statistics (``dtypes``: the columns', float64 where not given)."""
    part = GroupPart(np.zeros((0, nby), np.int64), np.zeros(0, np.int64))
    for col, need in needs.items():
        dtype = np.dtype((dtypes or {}).get(col, np.float64))
        if exact(dtype):
            wide = np.uint64 if dtype.kind == "u" else np.int64
            stats: dict[str, np.ndarray] = {"n": np.zeros(0, np.int64)}
            if need & {"sum", "m2"}:
                stats["sum_hi"], stats["sum_lo"] = np.zeros(0, wide), np.zeros(0, wide)
            stats.update({s: np.zeros(0, dtype) for s in ("min", "max") if s in need})
            if "m2" in need:
                stats["m2"] = np.zeros(0)
            part.stats[col] = stats
        else:
            part.stats[col] = {s: np.zeros(0, np.int64 if s == "n" else np.float64) for s in set(need) - {"sketch"}}
        if "sketch" in need:
            part.sketches[col] = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    return part


def one_group(part: GroupPart) -> GroupPart:
    """A partial without keys (one group, the whole collection) that has no rows as the group of
    no rows: each column's count and sum 0, its other statistics their identities (SQL's
    ``count(*)`` without ``GROUP BY``, pandas' ``s[mask].agg([...])``: one row)."""
    if len(part) or part.keys.shape[1]:
        return part
    out = GroupPart(np.zeros((1, 0), np.int64), np.zeros(1, np.int64), sketches=dict(part.sketches))
    for col, stats in part.stats.items():
        out.stats[col] = {
            k: np.full(1, _fill(a.dtype, True) if k == "min" else _fill(a.dtype, False) if k == "max" else 0, a.dtype)
            for k, a in stats.items()
        }
    return out
