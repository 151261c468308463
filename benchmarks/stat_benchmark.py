"""The identities of a dataset's chunk files for the cache's keys (issue 48: a cache's rerun stats
every stored chunk first): ``l5dask/core/_stat.pyx`` against the Python listing it replaced
(``os.scandir`` and ``DirEntry.stat``, an f-string a file), in interleaved rounds.

    python benchmarks/stat_benchmark.py [--dataset PATH] [--rounds 5] [--cold-command CMD]

Each round runs each way in a process of its own over the dataset's four arrays' folders and
prints its wall time and its CPU seconds (user and system). Without ``--cold-command`` the inodes
are in the kernel's caches (warm); with it, ``CMD`` runs before each process to make them cold
(e.g. a script that remounts a scratch file system holding a copy of the dataset's files: the page
cache of a shared machine cannot be dropped without root).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys


def python_identities(path: str) -> dict[str, str]:
    """The definition: the Python listing the compiled one replaced (the tests' reference too)."""
    out = {}
    with os.scandir(path) as entries:
        for e in entries:
            if e.is_file():
                st = e.stat()
                out[e.name] = f"stat:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"
    return out


_ONE = """
import os, resource, sys, time
way, root, here = sys.argv[1], sys.argv[2], sys.argv[3]
folders = [os.path.join(root, a) for a in ("scenes", "frames", "agents", "traffic_light_faces")]
sys.path.insert(0, here)
from stat_benchmark import python_identities as python
from l5dask.core import _stat
from l5dask.core.store import STAT_THREADS
fn = python if way == "python" else (lambda p: _stat.identities(p, STAT_THREADS if way == "compiled" else 1))
r0, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
n = sum(len(fn(p)) for p in folders if os.path.isdir(p))
wall, r1 = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF)
print(n, wall, r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime)
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", default="/work/datasets/big/big.zarr")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cold-command", help="run (by the shell) before each process: makes the inodes cold")
    args = parser.parse_args()
    ways = ("python", "compiled-1-thread", "compiled")
    got: dict[str, list[tuple[float, float, float]]] = {w: [] for w in ways}
    for r in range(args.rounds):
        for way in ways if r % 2 == 0 else tuple(reversed(ways)):
            if args.cold_command:
                subprocess.run(args.cold_command, shell=True, check=True)
            out = subprocess.run(
                [sys.executable, "-c", _ONE, way, args.dataset, os.path.dirname(os.path.abspath(__file__))],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            n, wall, user, system = int(out[0]), float(out[1]), float(out[2]), float(out[3])
            got[way].append((wall, user, system))
            print(f"round {r + 1} {way:<18} {n:,} files: wall {wall:.3f} s, user {user:.3f} s, system {system:.3f} s")
    print(f"{'cold' if args.cold_command else 'warm'}, medians (and best wall) of {args.rounds} rounds:")
    for way in ways:
        w, u, s = (statistics.median(x[i] for x in got[way]) for i in range(3))
        print(
            f"  {way:<18} wall {w:.3f} s (best {min(x[0] for x in got[way]):.3f}), CPU {u + s:.3f} s "
            f"(user {u:.3f}, system {s:.3f})"
        )


if __name__ == "__main__":
    main()
