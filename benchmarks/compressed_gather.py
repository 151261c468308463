"""Columns straight from compressed chunks (``l5dask/_blosc.h``) against numcodecs' decode.

    python benchmarks/compressed_gather.py [--scenes 1700] [--chunks 300] [--rounds 5]

One thread, the stored agents chunks already in memory (the file reads are the same for all).
Per chunk of 20,000 agents, interleaved rounds:
  decode (the floor):     numcodecs' blosc decode of the records into a reused buffer;
  decode + gather:        the same, then the columns copied out (``kernels.gather``: one pass);
  from compressed bytes:  LZ4 per block into cache and the columns assembled from their byte
                          streams (``Encoded.gather``: no unshuffle, no records).
For the columns of the aggregation benchmark's queries (each with the label argmax) and for every
number of an agent. Each result is checked equal, bit for bit, to the decode + gather one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import dataset  # noqa: E402

import l5dask  # noqa: E402
from l5dask.prediction.kernels import Gather  # noqa: E402
from l5dask.prediction.reading import decode_chunk, fetch_chunks  # noqa: E402

SETS = {
    "q1: velocity x, y + label": [("velocity", (0,)), ("velocity", (1,))],
    "q2: centroid x, y + label": [("centroid", (0,)), ("centroid", (1,))],
    "q3: extent length + label": [("extent", (0,))],
    "every number + label": [
        ("centroid", (0,)),
        ("centroid", (1,)),
        ("extent", (0,)),
        ("extent", (1,)),
        ("extent", (2,)),
        ("yaw", ()),
        ("velocity", (0,)),
        ("velocity", (1,)),
        ("track_id", ()),
    ],
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenes", type=int, default=1700)
    parser.add_argument("--chunks", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    ds = l5dask.open_dataset(dataset(args.scenes))
    agents = ds["agents"]
    meta, rows = agents.meta, agents.meta.chunk_rows
    n = min(args.chunks, meta.nchunks - 1)  # full chunks only
    raws = [raw for _, raw in fetch_chunks(agents.store, meta, 0, n)]
    print(
        f"{n} agents chunks of {rows:,} rows ({n * rows * meta.dtype.itemsize / 1e9:.2f} GB decoded), one thread, "
        f"{args.rounds} interleaved rounds; ms per chunk: best (median)"
    )
    records = np.empty(rows, meta.dtype)
    times: dict[tuple[str, str], list[float]] = {}

    def clock(key, fn):
        t = time.perf_counter()
        fn()
        times.setdefault(key, []).append((time.perf_counter() - t) / n * 1e3)

    for _ in range(args.rounds):
        clock(("floor", ""), lambda: [decode_chunk(r, meta, True, "x", out=records) for r in raws])
        for name, elements in SETS.items():
            plan = Gather(meta.dtype, elements, ["label_probabilities"])
            a, am = plan.outputs(rows)
            b, bm = plan.outputs(rows)
            scratch = [np.empty(0, np.uint8)]

            def decoded():
                for r in raws:
                    decode_chunk(r, meta, True, "x", out=records)
                    plan.records(records, a, am)

            def direct():
                for r in raws:
                    done, scratch[0] = plan.blosc(r, rows, rows, b, bm, 0, scratch[0])
                    assert done

            clock((name, "decode + gather"), decoded)
            clock((name, "from compressed"), direct)
            for x, y in zip(a + am, b + bm):
                assert np.array_equal(x.view(np.uint8), y.view(np.uint8)), name

    floor = times[("floor", "")]
    print(f"\ndecode (the floor): {min(floor):.3f} ({statistics.median(floor):.3f})\n")
    print("| columns | decode + gather | from compressed bytes | speed-up | / decode floor |")
    print("|---|---|---|---|---|")
    for name in SETS:
        d, c = times[(name, "decode + gather")], times[(name, "from compressed")]
        print(
            f"| {name} | {min(d):.3f} ({statistics.median(d):.3f}) | {min(c):.3f} ({statistics.median(c):.3f}) "
            f"| {min(d) / min(c):.2f}x | {min(c) / min(floor):.2f}x |"
        )


if __name__ == "__main__":
    main()
