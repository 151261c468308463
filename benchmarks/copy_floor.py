"""The floor of a copy: read, blosc-decode, blosc-encode and write every stored chunk of a dataset,
on all cores (a thread per core, numcodecs releases the GIL), with nothing else: no plan, no
shifts, no dask. What any copy of those bytes costs at least on this machine.

    python benchmarks/copy_floor.py SRC DST
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numcodecs import Blosc

CODEC = Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE, blocksize=0)  # L5Kit's


def chunks(src: str) -> list[tuple[str, str, int, int]]:
    """(array folder, chunk key, decoded bytes, blosc typesize) of every stored chunk under ``src``."""
    out = []
    for folder, _, files in os.walk(src):
        if ".zarray" not in files:
            continue
        meta = json.load(open(os.path.join(folder, ".zarray")))
        descr = meta["dtype"]
        dtype = (
            np.dtype([tuple(f[:2]) + ((tuple(f[2]),) if len(f) == 3 else ()) for f in descr])
            if isinstance(descr, list)
            else np.dtype(descr)
        )
        nbytes = int(np.prod(meta["chunks"])) * dtype.itemsize
        out += [(os.path.relpath(folder, src), k, nbytes, dtype.itemsize) for k in files if not k.startswith(".")]
    return out


def copy(src: str, dst: str, item: tuple[str, str, int, int]) -> int:
    folder, key, nbytes, typesize = item
    with open(os.path.join(src, folder, key), "rb") as f:
        raw = f.read()
    buf = np.empty(nbytes, np.uint8)
    CODEC.decode(raw, out=buf)
    enc = CODEC.encode(buf.view(f"V{typesize}"))  # blosc shuffles by the record size, as zarr does
    with open(os.path.join(dst, folder, key), "wb") as f:
        f.write(enc)
    return len(enc)


def main(src: str, dst: str) -> None:
    items = chunks(src)
    for folder in {i[0] for i in items}:
        os.makedirs(os.path.join(dst, folder), exist_ok=True)
    t = time.perf_counter()
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        written = sum(pool.map(lambda i: copy(src, dst, i), items))
    print(f"{len(items)} chunks, {written / 1e9:.2f} GB written in {time.perf_counter() - t:.2f} s")


if __name__ == "__main__":
    main(*sys.argv[1:3])
