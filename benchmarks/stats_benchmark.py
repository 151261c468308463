"""The statistics report against a plain numpy loop and the decode floor (issue 3).

    python benchmarks/stats_benchmark.py [--scenes 1700] [--scale 3]

Generates >= 30 M agents (and a dataset --scale times larger, for peak memory), then:
  (a) ``l5dask stats`` as a whole process on the embedded default: time, peak RSS;
  (b) the plain single-process numpy computation of the same report (numpy_reference.py,
      arrays loaded with zarr-python 2 as L5Kit does): time, peak RSS;
  (c) the decode floor: reading and blosc-decoding every chunk of the four arrays.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import best_of, dataset, decode_floor  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ARRAYS = ("scenes", "frames", "agents", "traffic_light_faces")


def run(cmd: list[str]) -> tuple[float, float]:
    """Run a command to completion: (wall seconds, peak RSS in GB of that process)."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    if status != 0:
        raise SystemExit(f"failed ({status}): {' '.join(cmd)}")
    return wall, usage.ru_maxrss / 1e6


def l5dask_stats(path: str) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        return run([sys.executable, "-m", "l5dask.cli", "stats", path, "--output", f"{tmp}/r.json", "--quiet"])


def numpy_reference(path: str) -> tuple[float, float]:
    code = (f"import sys; sys.path.insert(0, {HERE!r}); import zarr; from numpy_reference import reference_report; "
            f"from l5dask.format import LABELS; root = zarr.open_group({path!r}, mode='r'); "
            f"reference_report({{n: root[n][:] for n in {ARRAYS!r}}}, LABELS)")
    return run([sys.executable, "-c", code])


def floor_process(path: str) -> float:
    """The decode floor as a whole process too: interpreter start-up and imports included, like (a)."""
    code = f"import sys; sys.path.insert(0, {HERE!r}); from common import decode_floor; decode_floor({path!r}, {ARRAYS!r})"
    return run([sys.executable, "-c", code])[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenes", type=int, default=1700)
    parser.add_argument("--scale", type=int, default=3)
    args = parser.parse_args()
    path = dataset(args.scenes)
    agents = int(__import__("l5dask").open_dataset(path).counts()["agents"])
    print(f"dataset: {agents:,} agents, {os.cpu_count()} cores")
    c, _ = best_of(3, lambda: decode_floor(path, ARRAYS))
    c_proc = min(floor_process(path) for _ in range(3))
    a, a_mem = min((l5dask_stats(path) for _ in range(2)), key=lambda r: r[0])
    b, b_mem = numpy_reference(path)
    print(f"(a) l5dask stats, whole process:      {a:7.2f} s   peak RSS {a_mem:5.2f} GB")
    print(f"(b) plain numpy, single process:      {b:7.2f} s   peak RSS {b_mem:5.2f} GB")
    print(f"(c) decode floor (read + blosc):      {c:7.2f} s   in-process loop")
    print(f"(c') decode floor as a whole process: {c_proc:7.2f} s   (python start-up and imports included, like (a))")
    print(f"(a)/(b) = {a / b:.3f}   (target <= 0.25)")
    print(f"(a)/(c) = {a / c:.2f}    (target <= 2.5)    (a)/(c') = {a / c_proc:.2f}")
    if args.scale > 1:
        big = dataset(args.scenes * args.scale)
        n = int(__import__("l5dask").open_dataset(big).counts()["agents"])
        t, mem = l5dask_stats(big)
        print(f"(a) on {n:,} agents:  {t:7.2f} s   peak RSS {mem:5.2f} GB   (vs {a_mem:.2f} GB at {agents:,})")


if __name__ == "__main__":
    main()
