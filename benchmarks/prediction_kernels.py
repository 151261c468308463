"""The aggregate's per-row loops (``l5dask/prediction/_columns.pyx``) beside the numpy a user would
write for the same values, in one process, one thread, rounds interleaved; the results checked equal.

    python benchmarks/prediction_kernels.py [--rows 200000] [--rounds 30]

Each loop through its public wrapper in :mod:`l5dask.prediction.kernels` (the path ``aggregate``,
the dataframes and the xarray accessor call), on ``--rows`` rows (a task's block of agents):

- ``group_reduce``: per group, the count, sum, minimum and maximum of the values that are not NaN,
  against ``np.bincount`` (count, weighted sum: the same row order) and ``np.minimum.at`` /
  ``np.maximum.at``;
- ``range_codes``: ``k - lo`` in ``[0, n)`` else -1, against ``np.where`` of the two comparisons;
- ``distance_to_parent``: each row's distance to its parent row's point, against numpy's takes of
  the parent's columns and the formula;
- ``distance_to_runs``: the same distances of rows that come in runs, one per parent row (a
  block's agents and its frames: ``Rows.runs``), against numpy's repeats of the parent's columns
  and the formula;
- ``norm2``: ``sqrt(x * x + y * y)`` of float32 pairs in float64, against numpy's casts and formula;
- ``keyed_reduce``: the count, sum and rows per group of two keys (a scene, in runs, int64; a
  label, int8) without their group codes made whole, against numpy's codes and ``np.bincount``;
- ``sketch``: a quantile sketch's (group, bucket, count) of a float32 column over 17 groups and
  the groups' rows (``groupby._sketch``: ``sketch_range`` and ``sketch_counts``, two passes),
  against the numpy it replaced (the rows' ``np.bincount``, the float64 bits shifted, their
  range, one ``np.bincount`` of group and bucket, its cells that are not 0);
- ``sketch (wide)``: the same of speeds (a tenth 0, the others around a speed of their label's:
  4.2 million buckets a group, past that table) through ``kernels.Sketch`` (the cells of the
  (group, exponent) pairs that occur, counted in one pass, listed in order), against the sort it
  replaced (``np.unique`` of group and bucket); ``sketch (spread)``: speeds spread over 0.01 to 30
  m/s, too many pairs for the table: the sort, after the table gave up;
- ``keyed_reduce + sketch``: the wide speeds' count, sum, maximum and sketch per label in
  ``keyed_reduce``'s one pass (``kernels.Sketch`` counted as the codes are made: ``aggregate``'s
  ``speed:mean,max,q99`` of a block), against numpy's ``np.bincount``, ``np.maximum.at`` and the sort;
- ``merge_sketches``: two such sketches (of each half of the rows) merged in one pass, against the
  ``np.lexsort`` of the two that ``groupby.combine_parts`` made.

(The ``(min, max)`` loop of an integer key measured here ran at 0.11x numpy's ``min()``/``max()``,
0.166 against 0.018 ms: it was deleted, ``kernels.int_range`` is numpy's; ``mix_codes``, ``codes += (k -
lo) * stride`` of an int8 key, ran at 1.02-1.13x numpy's, which widens ``k`` first: deleted, ``groupby.encode``
is numpy's.) The other modules have
their own benchmarks: the report's loops (``_report.pyx``) in
``benchmarks/stats_benchmark.py`` (against ``benchmarks/numpy_reference.py``) and
``benchmarks/handwritten_layers.py --part argmax``; the compressed gather (``_gather.pyx``) in
``benchmarks/compressed_gather.py``; the catalog's loops (``_catalog.pyx``) in
``benchmarks/catalog_benchmark.py``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def cases(n: int) -> dict[str, tuple]:
    from l5dask.prediction import kernels as k

    rng = np.random.default_rng(0)
    ngroups = 17 * 64
    codes = rng.integers(0, ngroups, n).astype(np.int64)
    values = rng.normal(size=n)
    values[rng.random(n) < 0.01] = np.nan
    key = rng.integers(-3, 17, n).astype(np.int8)
    x, y = rng.normal(size=n) * 50, rng.normal(size=n) * 50
    parent = rng.normal(size=(n // 50, 3)) * 50
    pos = np.sort(rng.integers(0, len(parent), n))
    vx, vy = rng.normal(size=n).astype(np.float32), rng.normal(size=n).astype(np.float32)

    def np_group_reduce():
        ok = ~np.isnan(values)
        c, v = codes[ok], values[ok]
        lo, hi = np.full(ngroups, np.inf), np.full(ngroups, -np.inf)
        np.minimum.at(lo, c, v)
        np.maximum.at(hi, c, v)
        return np.bincount(c, minlength=ngroups), np.bincount(c, weights=v, minlength=ngroups), lo, hi

    def np_distance():
        px, py = parent[pos, 0], parent[pos, 1]
        dx, dy = x - px, y - py
        return np.sqrt(dx * dx + dy * dy)

    counts = np.bincount(pos, minlength=len(parent))

    def np_distance_runs():
        dx, dy = x - np.repeat(parent[:, 0], counts), y - np.repeat(parent[:, 1], counts)
        return np.sqrt(dx * dx + dy * dy)

    def np_norm2():
        a, b = vx.astype(np.float64), vy.astype(np.float64)
        return np.sqrt(a * a + b * b)

    from l5dask.prediction.groupby import _exponents, _sketch, sketch_cells

    labels = rng.integers(0, 17, n).astype(np.int64)
    lengths = rng.lognormal(1.0, 0.6, n).astype(np.float32)  # (an agent's extent: 0.3 to 30 m)

    def l5_sketch():
        rows = np.zeros(17, np.int64)
        return rows, *_sketch(labels, lengths, 12, 17, rows=rows)

    def np_sketch():
        rows = np.bincount(labels, minlength=17)
        b = np.add(lengths, 0.0, dtype=np.float64).view(np.int64) >> (52 - 12)
        blo = int(b.min())
        span = int(b.max()) - blo + 1
        b -= blo
        b += labels * span
        counts = np.bincount(b, minlength=span * (int(labels.max()) + 1))
        nz = np.flatnonzero(counts != 0)
        return rows, nz // span, nz % span + blo, counts[nz]

    # speeds: a tenth of them 0 (standing agents), the others around a speed of their label's: their
    # buckets span 4.2 million a group, past sketch_counts' table (1,000 exponents, 2 or 3 of them
    # occupied a group, as the generated datasets'); and spread over 0.01 to 30 m/s (10 or so a group)
    standing = rng.random(n) < 0.1
    speeds = np.where(standing, 0.0, rng.lognormal(1.0 + labels / 10, 0.1, n))
    spread = np.where(standing, 0.0, rng.lognormal(1.0, 1.0, n).clip(0.01, 30.0))

    def l5_sketch_of(v):
        rows = np.zeros(17, np.int64)
        return rows, *_sketch(labels, v, 12, 17, rows=rows)

    def np_sketch_of(v):  # (the sort it replaced)
        rows = np.bincount(labels, minlength=17)
        b = (v + 0.0).view(np.int64) >> (52 - 12)
        blo = int(b.min())
        span = int(b.max()) - blo + 1
        uniq, many = np.unique(labels * span + (b - blo), return_counts=True)
        return rows, uniq // span, uniq % span + blo, many

    ga, gb = _sketch(labels[: n // 2], speeds[: n // 2], 12, 17), _sketch(labels[n // 2 :], speeds[n // 2 :], 12, 17)

    def l5_keyed_sketch():  # (a label's speeds: their mean, maximum and quantiles, aggregate's pass of a block)
        out = (np.zeros(17, np.int64), np.zeros(17), None, np.full(17, -np.inf))
        rows = np.zeros(17, np.int64)
        sketch = k.Sketch(17, 12, *_exponents(speeds, 12), sketch_cells(n, 12))
        assert k.keyed_reduce([labels], [0], [1], n, out, speeds, rows, sketch)
        return rows, *sketch.result(), out[0], out[1], out[3]

    def np_keyed_sketch():
        rows = np.bincount(labels, minlength=17)
        sums = np.bincount(labels, weights=speeds, minlength=17)
        highs = np.full(17, -np.inf)
        np.maximum.at(highs, labels, speeds)
        return (*np_sketch_of(speeds), rows, sums, highs)

    def np_merge():  # (combine_parts' lexsort of the two, which it replaced)
        g, bk, cnt = (np.concatenate([x, y]) for x, y in zip(ga, gb))
        order = np.lexsort((bk, g))
        g, bk, cnt = g[order], bk[order], cnt[order]
        new = np.r_[True, (g[1:] != g[:-1]) | (bk[1:] != bk[:-1])]
        starts = np.flatnonzero(new)
        return g[starts], bk[starts], np.add.reduceat(cnt, starts)

    scene = np.repeat(np.arange(1297, 1297 + 8), -(-n // 8))[:n].astype(np.int64)
    label = rng.integers(1, 15, n).astype(np.int8)
    keyed = values * 10

    def l5_keyed():
        out = (np.zeros(8 * 14, np.int64), np.zeros(8 * 14), None, None)
        rows = np.zeros(8 * 14, np.int64)
        k.keyed_reduce([scene, label], [1297, 1], [14, 1], n, out, keyed, rows)
        return rows, out[0], out[1]

    def np_keyed():
        codes = (scene - 1297) * 14 + (label.astype(np.int64) - 1)
        ok = ~np.isnan(keyed)
        c = codes[ok]
        return (
            np.bincount(codes, minlength=8 * 14),
            np.bincount(c, minlength=8 * 14),
            np.bincount(c, weights=keyed[ok], minlength=8 * 14),
        )

    return {
        "keyed_reduce": (l5_keyed, np_keyed),
        "sketch": (l5_sketch, np_sketch),
        "sketch (wide)": (lambda: l5_sketch_of(speeds), lambda: np_sketch_of(speeds)),
        "sketch (spread)": (lambda: l5_sketch_of(spread), lambda: np_sketch_of(spread)),
        "keyed_reduce + sketch": (l5_keyed_sketch, np_keyed_sketch),
        "merge_sketches": (lambda: k.merge_sketches(ga, gb), np_merge),
        "group_reduce": (lambda: k.group_reduce(codes, values, ngroups, True, True, True), np_group_reduce),
        "range_codes": (
            lambda: k.range_codes(key, 0, 10),
            lambda: np.where((key >= 0) & (key < 10), key.astype(np.int64), -1),
        ),
        "distance_to_parent": (lambda: k.distance_to_parent(x, y, parent, pos), np_distance),
        "distance_to_runs": (lambda: k.distance_to_runs(x, y, parent, counts), np_distance_runs),
        "norm2": (lambda: k.norm2(vx, vy), np_norm2),
    }


def same(a, b) -> bool:
    if isinstance(a, tuple):
        return all(same(u, v) for u, v in zip(a, b))
    return np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    import threadpoolctl

    with threadpoolctl.threadpool_limits(1):
        found = cases(args.rows)
        best = {name: [float("inf"), float("inf")] for name in found}
        for name, (ours, theirs) in found.items():
            assert same(ours(), theirs()), name
        for _ in range(args.rounds):
            for name, pair in found.items():
                for i, fn in enumerate(pair):
                    t0 = time.perf_counter()
                    fn()
                    best[name][i] = min(best[name][i], time.perf_counter() - t0)
    print(f"{args.rows:,} rows, one thread, best of {args.rounds} interleaved rounds (results equal)")
    for name, (ours, theirs) in best.items():
        print(
            f"  {name:20s} compiled {ours * 1e3:7.3f} ms   numpy {theirs * 1e3:7.3f} ms   "
            f"{theirs / ours:5.2f}x  ({ours / args.rows * 1e9:.2f} vs {theirs / args.rows * 1e9:.2f} ns a row)"
        )


if __name__ == "__main__":
    main()
