"""Cold reads of a dataset's agent chunks: through the page cache, around it into kept buffers
(l5dask.core.diskread), and around it into a fresh buffer per read (issue 32).

    python benchmarks/direct_reads.py [--copies 10] [--threads 8] [--rounds 1]   # as root

Each way reads every agent chunk file of ``copies-N.zarr`` (``scale_benchmark.py build``) by
``--threads`` threads, in chunk order, in a process of its own, after the page cache is dropped;
the ways interleaved. It prints wall time and the process's user and system CPU.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import drop_caches  # noqa: E402
from scale_benchmark import copies_path  # noqa: E402

READER = """
import mmap, os, sys, time
from concurrent.futures import ThreadPoolExecutor
from l5dask.core import diskread
root, how, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
folder = os.path.join(root, "agents")
files = [os.path.join(folder, k) for k in sorted((k for k in os.listdir(folder) if not k.startswith(".")), key=int)]
def buffered(p):
    with open(p, "rb") as f:
        return len(f.read())
def kept(p):
    return len(diskread.read(p, direct=True))
def fresh(p):
    fd = os.open(p, os.O_RDONLY | os.O_DIRECT)
    try:
        size = os.fstat(fd).st_size
        buf = mmap.mmap(-1, size + (-size) % 4096)
        return min(size, os.readv(fd, [buf]))
    finally:
        os.close(fd)
t, c = time.perf_counter(), os.times()
with ThreadPoolExecutor(threads) as pool:
    total = sum(pool.map({"buffered": buffered, "kept": kept, "fresh": fresh}[how], files, chunksize=4))
c2 = os.times()
print(f"{time.perf_counter() - t:.2f} {c2.user - c.user:.2f} {c2.system - c.system:.2f} {total}")
"""

WAYS = {
    "buffered": "buffered (open, read)",
    "kept": "O_DIRECT, a buffer each thread keeps",
    "fresh": "O_DIRECT, a fresh buffer each read",
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--copies", type=int, default=10)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    path = copies_path(args.copies)
    if not drop_caches():
        raise SystemExit("the page cache cannot be dropped here (run as root): the reads would not be cold")
    print(f"{path}: agent chunks, {args.threads} threads, page cache dropped before each way")
    print("| how | wall | user | system | GB |")
    print("|---|---|---|---|---|")
    for _ in range(args.rounds):
        for how, label in WAYS.items():
            drop_caches()
            out = subprocess.run(
                [sys.executable, "-c", READER, path, how, str(args.threads)], check=True, capture_output=True, text=True
            ).stdout.split()
            wall, user, system, total = float(out[0]), float(out[1]), float(out[2]), int(out[3])
            print(f"| {label} | {wall:.1f} s | {user:.2f} s | {system:.2f} s | {total / 1e9:.2f} |", flush=True)


if __name__ == "__main__":
    main()
