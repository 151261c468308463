"""The scene catalog against the statistics report on the same data (issue 47: at most 1.2x).

    python benchmarks/catalog_benchmark.py [--scenes 1700] [--repeat 3]
    python benchmarks/catalog_benchmark.py --memory [--scenes 1700]

Both as whole processes on the embedded default (``l5dask catalog`` and ``l5dask stats``, each
writing its output), in interleaved rounds (these shared machines change speed from one minute to
the next): each round's wall and CPU times (user + system, all threads: on a machine shared by
many, a process's wall time depends on its share of the cores, its CPU time much less) and peak RSS,
the best of each and the median of the per-round ratios catalog / stats.

``--memory``: the peak RSS of each command against the dataset and one 4 times as large (made
once under benchmarks/data): the catalog's memory does not grow with the agents (it holds a task's
chunks and, per scene, a row of partials).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from common import dataset, run_measured  # noqa: E402


def command(name: str, path: str, out: str) -> list[str]:
    return [sys.executable, "-m", "l5dask.cli", name, path, "--output", out, "--quiet"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenes", type=int, default=1700)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--memory", action="store_true", help="peak RSS against a dataset 4x as large")
    args = parser.parse_args()
    if args.memory:
        return memory(args.scenes)
    path = dataset(args.scenes)
    agents = int(__import__("l5dask").open_dataset(path).counts()["agents"])
    print(f"dataset: {path}: {agents:,} agents, {os.cpu_count()} cores", flush=True)
    times: dict[str, list[float]] = {"stats": [], "catalog": []}
    cpus: dict[str, list[float]] = {"stats": [], "catalog": []}
    peaks: dict[str, list[float]] = {"stats": [], "catalog": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):
            order = ("stats", "catalog") if r % 2 == 0 else ("catalog", "stats")
            for name in order:
                out = f"{tmp}/{name}-{r}." + ("json" if name == "stats" else "parquet")
                _, wall, rss, cpu = run_measured(command(name, path, out))
                times[name].append(wall)
                cpus[name].append(cpu)
                peaks[name].append(rss)
                print(f"round {r + 1}: {name:<8} {wall:7.2f} s  CPU {cpu:6.2f} s  peak RSS {rss:.2f} GB", flush=True)
    ratios = [c / s for c, s in zip(times["catalog"], times["stats"])]
    cpu_ratios = [c / s for c, s in zip(cpus["catalog"], cpus["stats"])]
    print(
        f"best: stats {min(times['stats']):.2f} s, catalog {min(times['catalog']):.2f} s; "
        f"catalog / stats: median of rounds {statistics.median(ratios):.2f}x wall, "
        f"{statistics.median(cpu_ratios):.2f}x CPU (goal <= 1.2x); "
        f"peak RSS: stats {max(peaks['stats']):.2f} GB, catalog {max(peaks['catalog']):.2f} GB"
    )


def memory(scenes: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for n in (scenes, 4 * scenes):
            path = dataset(n)
            agents = int(__import__("l5dask").open_dataset(path).counts()["agents"])
            for name in ("stats", "catalog"):
                out = f"{tmp}/{name}-{n}." + ("json" if name == "stats" else "parquet")
                _, wall, rss, cpu = run_measured(command(name, path, out))
                print(
                    f"{agents / 1e6:6.1f} M agents ({n} scenes): {name:<8} peak RSS {rss:.2f} GB "
                    f"({wall:.1f} s, CPU {cpu:.1f} s)",
                    flush=True,
                )


if __name__ == "__main__":
    main()
