"""Reading part of a stored chunk from an object store: GETs and round trips, before and after.

    python benchmarks/partial_reads.py --scenes 400 --latency-ms 50 --reads 40 --rounds 3

A filter that keeps part of a stored chunk reads only the blosc blocks holding its rows
(``l5dask.prediction.reading.read_chunk_rows``). Before, that was the chunk's header, then its
blocks: two GETs one after the other. Now, once a chunk of the array was read in the process, the
blocks are guessed from its layout and asked for with the header (one GET, or two at once). The
"before" rows forget the layout before each read (the old path, the same code); rounds interleave
both. Through ``benchmarks/slow_s3.py`` (a first-byte latency on every answer), the agents chunks
of the generated dataset (20,000 rows, lz4), ``--reads`` chunks each read at one or two random
runs of rows under 3/4 of the chunk. Figures: GETs the endpoint counted, wall time, bytes read.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import slow_s3  # noqa: E402
from common import dataset  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--scenes", type=int, default=400)
    p.add_argument("--latency-ms", type=float, default=50.0)
    p.add_argument("--reads", type=int, default=40)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()

    import numpy as np

    from l5dask.core.store import Store, read_counts
    from l5dask.prediction import format as fmt
    from l5dask.prediction import reading
    from l5dask.prediction.dataset import open_dataset

    path = dataset(args.scenes)
    root, name = os.path.split(path)
    proc, url = slow_s3.start(root, args.latency_ms)
    try:
        options = {"key": "x", "secret": "x", "client_kwargs": {"endpoint_url": url, "region_name": "us-east-1"}}
        meta = open_dataset(path)[fmt.AGENTS].meta
        store = Store(f"s3://bench/{name}", options)
        rng = np.random.default_rng(0)
        reads = []
        for _ in range(args.reads):
            i = int(rng.integers(meta.nchunks - 1))
            a, b = meta.chunk_bounds(i)
            n = int(rng.integers(1, 3))
            cuts = np.sort(rng.choice(np.arange(a, a + (b - a) * 3 // 4), 2 * n, replace=False))
            reads.append((i, [(int(x), int(y)) for x, y in zip(cuts[::2], cuts[1::2])]))
        reading.read_chunk_rows(store, meta, reads[0][0], reads[0][1])  # (the layout learned once)
        layout = dict(reading._LAYOUTS)
        got: dict[str, dict[str, list[float]]] = {
            m: {"gets": [], "seconds": [], "bytes": []} for m in ("before", "after")
        }
        for _ in range(args.rounds):
            for mode in ("before", "after"):
                slow_s3.stats(url, reset=True)
                b0 = read_counts()["bytes"]
                t = time.perf_counter()
                for i, ranges in reads:
                    if mode == "before":
                        reading._LAYOUTS.clear()
                    else:
                        reading._LAYOUTS.update(layout)
                    reading.read_chunk_rows(store, meta, i, ranges)
                got[mode]["seconds"].append(time.perf_counter() - t)
                got[mode]["gets"].append(sum(v for k, v in slow_s3.stats(url).items() if k == "GET"))
                got[mode]["bytes"].append(read_counts()["bytes"] - b0)
        print(f"{args.reads} partial chunk reads of agents, {args.latency_ms:g} ms first-byte latency, "
              f"best of {args.rounds} interleaved rounds")  # fmt: skip
        for mode, f in got.items():
            print(
                f"  {mode:<7} {min(f['gets']):.0f} GETs  {min(f['seconds']):.2f} s  {min(f['bytes']) / 1e6:.2f} MB read"
            )
        b, a = got["before"], got["after"]
        print(
            f"  after/before: GETs {min(a['gets']) / min(b['gets']):.2f}x, time {min(a['seconds']) / min(b['seconds']):.2f}x, "
            f"bytes {min(a['bytes']) / min(b['bytes']):.2f}x"
        )
    finally:
        proc.kill()


if __name__ == "__main__":
    main()
