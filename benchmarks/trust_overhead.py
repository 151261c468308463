"""What the chunk rule costs: the header checks against a pass, and the passes before and after.

    python benchmarks/trust_overhead.py --before ../l5dask-before [--after ../other] [--scenes 1700] [--rounds 5]

``--before`` is a checkout of the code to compare with, its kernels built in place
(``python setup.py build_ext --inplace``); the code of this checkout is "after".
  (1) in one process, over every stored agents chunk (fetched once, in memory): the header rule
      (:func:`l5dask.prediction.reading.check_chunk`) against numcodecs' decode of the chunk (the report's
      path) and against the compressed gather of q1's columns (aggregate's path): its share of
      each, best of --rounds;
  (2) as whole processes, rounds interleaved, before and after: ``l5dask stats`` and ``l5dask agg``
      for the README's q1 and q2; best of the rounds and the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from before_after import checkout_arguments, compare, job_args  # noqa: E402
from common import dataset  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def in_process(path: str, rounds: int) -> None:
    import numpy as np

    import l5dask
    from l5dask.prediction.kernels import Gather
    from l5dask.prediction.reading import check_chunk, decode_chunk

    arr = l5dask.open_dataset(path)["agents"]
    meta = arr.meta
    raws = [raw for _, raw in arr.read_encoded(0, meta.nchunks).chunks]
    scratch = np.empty(meta.chunk_rows, meta.dtype)
    plan = Gather(
        meta.dtype,
        [("centroid", (0,)), ("centroid", (1,)), ("velocity", (0,)), ("velocity", (1,))],
        ["label_probabilities"],
    )
    outs, maxes = plan.outputs(meta.chunk_rows)
    blocks = np.empty(0, np.uint8)

    def check():
        for i, raw in enumerate(raws):
            check_chunk(raw, meta, True, str(i))

    def decode():
        for i, raw in enumerate(raws):
            decode_chunk(raw, meta, True, str(i), out=scratch)

    def gather():
        nonlocal blocks
        for i, raw in enumerate(raws):
            lo, hi = meta.chunk_bounds(i)
            done, blocks = plan.blosc(raw, meta.chunk_rows, hi - lo, outs, maxes, 0, blocks)
            assert done

    best = {}
    for _ in range(rounds):
        for name, fn in (("check", check), ("decode", decode), ("gather", gather)):
            t = time.perf_counter()
            fn()
            best[name] = min(best.get(name, 1e9), time.perf_counter() - t)
    n = len(raws)
    print(f"(1) {n:,} agents chunks of {meta.chunk_rows:,} rows, one thread, best of {rounds}:")
    print(f"    header rule      {best['check'] / n * 1e6:8.2f} us a chunk")
    print(
        f"    numcodecs decode {best['decode'] / n * 1e6:8.2f} us a chunk   (the rule: "
        f"{100 * best['check'] / (best['decode'] - best['check']):.2f}% of the decode without it)"
    )
    print(
        f"    compressed gather {best['gather'] / n * 1e6:7.2f} us a chunk   (the rule: "
        f"{100 * best['check'] / best['gather']:.2f}% of the gather)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    checkout_arguments(parser)
    args = parser.parse_args()
    path = dataset(args.scenes)
    print(f"dataset: {path}, {os.cpu_count()} cores")
    in_process(path, args.rounds)
    print("(2) ", end="")
    jobs = job_args(["stats", "agg-q1", "agg-q2"], args.scenes, 0, 0)
    compare(jobs, os.path.abspath(args.before), os.path.abspath(args.after), args.rounds)


if __name__ == "__main__":
    main()
