"""Read throughput of the agents array against the decode floor (issue 2).

    python benchmarks/read_throughput.py [--scenes 530]

Generates >= 10 M agents once (benchmarks/data), then times, best of 3:
  floor:  reading + blosc-decoding every agents chunk file in one plain loop;
  whole:  the dask array of all fields, one task per chunk (embedded threads);
  field:  the same with only ``centroid`` projected (each chunk still decoded once).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from common import best_of, dataset, decode_floor  # noqa: E402

import l5dask  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenes", type=int, default=600)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    path = dataset(args.scenes)
    ds = l5dask.open_dataset(path)
    agents = ds["agents"]
    decoded = agents.meta.nchunks * agents.meta.chunk_rows * agents.dtype.itemsize
    print(f"agents: {len(agents):,} rows, {agents.meta.nchunks} chunks, {decoded / 1e9:.2f} GB decoded")

    floor_s, floor_bytes = best_of(args.repeat, lambda: decode_floor(path, ("agents",)))
    assert floor_bytes[1] == decoded

    def nbytes(x):
        return x.map_blocks(lambda b: np.array([b.nbytes]), chunks=(1,), dtype=np.int64).sum().compute()

    gbps = lambda s: decoded / s / 1e9  # noqa: E731
    print(f"floor (plain loop, read+decode):            {floor_s:6.2f} s  {gbps(floor_s):5.2f} GB/s")
    for per_task in (1, 8):
        for label, fields in (("whole array", None), ("one field (centroid)", ["centroid"])):
            s, _ = best_of(args.repeat, lambda: nbytes(agents.to_dask(fields=fields, chunks_per_task=per_task)))
            print(
                f"l5dask {label:<21} {per_task} chunk/task: {s:6.2f} s  {gbps(s):5.2f} GB/s"
                f"  ratio to floor {floor_s / s:.2f}"
            )


if __name__ == "__main__":
    main()
