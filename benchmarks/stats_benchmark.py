"""The statistics report against a plain numpy loop and the decode floor (issue 3).

    python benchmarks/stats_benchmark.py [--scenes 1700] [--scale 3] [--repeat 5]

Generates >= 30 M agents (and a dataset --scale times larger, for peak memory), then:
  (a) ``l5dask stats`` as a whole process on the embedded default: time, peak RSS;
  (b) the plain single-process numpy computation of the same report (numpy_reference.py,
      arrays loaded with zarr-python 2 as L5Kit does): time, peak RSS;
  (c) the decode floor: reading and blosc-decoding every chunk of the four arrays.
(a) and (c) are measured in interleaved rounds (these shared machines change speed from one
minute to the next); the best of the rounds and the median of the per-round ratios are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from common import dataset, decode_floor, record, run  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ARRAYS = ("scenes", "frames", "agents", "traffic_light_faces")


def l5dask_stats(path: str) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        return run([sys.executable, "-m", "l5dask.cli", "stats", path, "--output", f"{tmp}/r.json", "--quiet"])


def numpy_reference(path: str) -> tuple[float, float]:
    code = (
        f"import sys; sys.path.insert(0, {HERE!r}); import zarr; from numpy_reference import reference_report; "
        f"from l5dask.prediction.format import LABELS; root = zarr.open_group({path!r}, mode='r'); "
        f"reference_report({{n: root[n][:] for n in {ARRAYS!r}}}, LABELS)"
    )
    return run([sys.executable, "-c", code])


def floor_process(path: str) -> float:
    """The decode floor as a whole process too: interpreter start-up and imports included, like (a)."""
    code = (
        f"import sys; sys.path.insert(0, {HERE!r}); from common import decode_floor; decode_floor({path!r}, {ARRAYS!r})"
    )
    return run([sys.executable, "-c", code])[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenes", type=int, default=1700)
    parser.add_argument("--scale", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--record", action="store_true", help="write the figures to docs/figures/stats.json")
    args = parser.parse_args()
    path = dataset(args.scenes)
    agents = int(__import__("l5dask").open_dataset(path).counts()["agents"])
    print(f"dataset: {agents:,} agents, {os.cpu_count()} cores")
    rounds = []
    for _ in range(args.repeat):
        c = decode_floor(path, ARRAYS)[0]
        c_proc = floor_process(path)
        a, a_mem = l5dask_stats(path)
        rounds.append((a, a_mem, c, c_proc))
    a, c, c_proc = (min(r[i] for r in rounds) for i in (0, 2, 3))
    a_mem = max(r[1] for r in rounds)
    b, b_mem = numpy_reference(path)
    print(f"(a) l5dask stats, whole process:      {a:7.2f} s   peak RSS {a_mem:5.2f} GB   (best of {args.repeat})")
    print(f"(b) plain numpy, single process:      {b:7.2f} s   peak RSS {b_mem:5.2f} GB")
    print(f"(c) decode floor (read + blosc):      {c:7.2f} s   in-process loop")
    print(f"(c') decode floor as a whole process: {c_proc:7.2f} s   (python start-up and imports included, like (a))")
    print(f"(a)/(b) = {a / b:.3f}   (target <= 0.25)")
    print(f"(a)/(c) = {a / c:.2f}    (target <= 2.5)    (a)/(c') = {a / c_proc:.2f}")
    ratios = [r[0] / r[2] for r in rounds]
    print(f"per round (a)/(c): {', '.join(f'{x:.2f}' for x in ratios)}   median {statistics.median(ratios):.2f}")
    if args.scale > 1:
        big = dataset(args.scenes * args.scale)
        n = int(__import__("l5dask").open_dataset(big).counts()["agents"])
        runs = [l5dask_stats(big) for _ in range(2)]  # the first may read from disk, not the page cache
        t, mem = min(r[0] for r in runs), max(r[1] for r in runs)
        print(f"(a) on {n:,} agents:  {t:7.2f} s   peak RSS {mem:5.2f} GB   (vs {a_mem:.2f} GB at {agents:,})")
    if args.record:
        figures = {
            "stats_s": round(a, 2),
            "numpy_s": round(b, 1),
            "numpy_x": round(a / b, 3),
            "floor_s": round(c, 2),
            "floor_x": round(a / c, 2),
            "rss_30m_gb": round(a_mem, 2),
        }
        if args.scale > 1:
            figures["rss_90m_gb"] = round(mem, 2)
        ran = "python benchmarks/stats_benchmark.py " + " ".join(sys.argv[1:])
        note = f"{agents:,} agents (and {args.scale}x for the second peak RSS), best of {args.repeat}"
        print("recorded", record("stats", ran.strip(), figures, note))


if __name__ == "__main__":
    main()
