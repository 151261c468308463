"""Where each aggregation's chunk function spends its CPU in ``l5dask run``'s one pass (issue 48):
the three aggregations of ``run_benchmark.py`` (``AGGREGATIONS``) fused with the report and the
catalog, as the run declares them, in one ``l5dask.analyze`` on one thread.

    python benchmarks/aggregation_parts.py [--scenes 1700] [--repeat 3] [--before CHECKOUT]

Per aggregation, the thread CPU seconds of its ``chunk`` split into its parts (each counted
without the parts inside it): ``gather`` (its columns gathered from the stored bytes: the block's
one gather, which serves every member, is counted where it is first asked for), ``columns``
(derived and join columns: speeds, distances, the parent's columns spread over the rows),
``where``, ``take`` (the kept rows taken), ``group`` (group codes and keys' ranges), ``reduce``
(counts, sums, minima and maxima), ``sketch`` (the quantile sketch's counts), ``rest`` (what the
chunk function does besides); and its ``combine``. Averaged over ``--repeat`` runs after one to
warm up, on the synchronous scheduler. With ``--before``, the same in a process of that checkout
(first on ``PYTHONPATH``), the two alternating, printed side by side.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from run_benchmark import AGGREGATIONS  # noqa: E402

#: (module, attribute, part): the functions timed, each counted without the timed ones inside it.
PARTS = (
    ("l5dask.prediction.reading", "Encoded.gather", "gather"),
    ("l5dask.prediction.columns", "Chunk._gather", "gather"),
    ("l5dask.prediction.columns", "Chunk.__getitem__", "columns"),
    ("l5dask.prediction.aggregation", "evaluate_where", "where"),
    ("l5dask.prediction.groupby", "encode", "group"),
    ("l5dask.prediction.groupby", "int_range", "group"),
    ("l5dask.prediction.groupby", "group_reduce", "reduce"),
    ("l5dask.prediction.groupby", "keyed_reduce", "reduce"),
    ("l5dask.prediction.groupby", "int_stats", "reduce"),
    ("l5dask.prediction.groupby", "_sketch", "sketch"),
    ("l5dask.prediction.groupby", "group_rows", "reduce"),
    ("l5dask.prediction.groupby", "_present_part", "rest"),
)


def analyses():
    from l5dask.analyses import Aggregate, Catalog, Report

    aggs = {}
    for name, (array, by, values, where) in AGGREGATIONS.items():
        vals = {c: r.split(",") for c, r in (v.split(":") for v in values)}
        aggs[name] = Aggregate(array=array, by=by.split(","), values=vals, where=where)
    return {"report": Report(), "catalog": Catalog(), **aggs}


def measure(path: str, repeat: int) -> dict[str, float]:
    import importlib

    import l5dask
    from l5dask.core import engine

    acc: collections.Counter = collections.Counter()
    stack: list[list] = []  # [part, start, children's time]
    member = [""]

    def enter(part: str) -> None:
        stack.append([part, time.thread_time(), 0.0])

    def leave() -> None:
        part, t0, inner = stack.pop()
        dt = time.thread_time() - t0
        if member[0]:
            acc[f"{member[0]}: {part}"] += dt - inner
        if stack:
            stack[-1][2] += dt

    def timed(fn, part):
        def wrapper(*a, **k):
            enter(part)
            try:
                return fn(*a, **k)
            finally:
                leave()

        return wrapper

    for mod, attr, part in PARTS:
        m = importlib.import_module(mod)
        owner, _, name = attr.rpartition(".")
        obj = getattr(m, owner) if owner else m
        if hasattr(obj, name):
            setattr(obj, name, timed(getattr(obj, name), part))

    by_name = {tuple(b.split(",")): n for n, (_, b, _, _) in AGGREGATIONS.items()}

    def wrap(red: engine.Reduction) -> engine.Reduction:
        spec = (getattr(red.chunk, "args", ()) or (None,))[0]
        label = by_name.get(tuple(getattr(spec, "by", ())), red.name[:16])

        def counted(fn, part):
            def call(*a):
                member[0] = label
                enter(part)
                try:
                    return fn(*a)
                finally:
                    leave()
                    member[0] = ""

            return call

        return dataclasses.replace(red, chunk=counted(red.chunk, "rest"), combine=counted(red.combine, "combine"))

    fused = engine.fused_reduction

    def fused_reduction(members, source):
        return fused([dataclasses.replace(m, reduction=wrap(m.reduction)) for m in members], source)

    engine.fused_reduction = fused_reduction  # type: ignore[assignment]
    l5dask.analyze(path, analyses(), scheduler="sync")
    acc.clear()
    for _ in range(repeat):
        l5dask.analyze(path, analyses(), scheduler="sync")
    out = {k: v / repeat for k, v in acc.items() if k.split(":")[0] in AGGREGATIONS}
    for n in AGGREGATIONS:
        out[f"{n}: total"] = sum(v for k, v in out.items() if k.startswith(f"{n}: "))
    return dict(sorted(out.items()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenes", type=int, default=1700)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--before")
    parser.add_argument("--child", metavar="PATH")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, 1)))
        return
    from common import checkouts, child_json, dataset, print_means

    path = dataset(args.scenes)
    trees = checkouts(args.before)
    got: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
    for _ in range(args.repeat):
        for name, tree in trees.items():
            got[name].append(child_json(__file__, tree, path))
    print_means(f"dataset: {path}; thread CPU seconds a run, mean of {args.repeat} (one thread)", got)


if __name__ == "__main__":
    main()
