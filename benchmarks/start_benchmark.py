"""Where a whole process of ``l5dask stats --cache`` over unchanged data spends its CPU (issue 48's
rerun at most 3% of the cold pass, and a run killed half way and started again at most 1.1x one
pass: both pay a process's start), each part as the difference of two whole processes measured in
the same rounds (interleaved: these shared machines change speed by the minute):

    python benchmarks/start_benchmark.py [--scenes 1700] [--rounds 12]

- **interpreter**: ``python`` that exits at once;
- **numpy, dask, click**: the libraries every such process imports (dask for the cache's keys,
  ``dask.tokenize``: importing any of dask runs its ``__init__``, which brings its config and
  YAML, ``jinja2`` for its widgets, ``psutil`` and its entry points' scan);
- **l5dask's imports**: the modules the rerun imports (``l5dask.cli``, the report, the cache)
  beyond those libraries;
- **the rerun's own work**: the command beyond its imports (the metadata, the chunk files'
  identities, the cached partials read, the report written);
- **the uncached pass**: the same command without a cache, the rerun's denominator.

Each process exits with ``os._exit``, as the command line does (no interpreter teardown), CPU
seconds as every benchmark here measures them (``common.measure``: every thread's); OPENBLAS_NUM_THREADS=1, as the command line sets it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from common import DATA, dataset, run_measured  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenes", type=int, default=1700)
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    path = dataset(args.scenes)
    os.environ["OPENBLAS_NUM_THREADS"] = "1"  # (as the command line sets it; the processes inherit it)
    py = sys.executable
    with tempfile.TemporaryDirectory(dir=DATA) as tmp:
        out, cache = os.path.join(tmp, "r.json"), os.path.join(tmp, "cache")
        stats = [py, "-m", "l5dask.cli", "stats", path, "-q", "-o", out]
        run_measured([*stats, "--cache", cache])  # (the cache filled)
        cmds = {
            "interpreter": [py, "-c", "import os; os._exit(0)"],
            "numpy, dask, click": [py, "-c", "import numpy, dask, click, os; os._exit(0)"],
            "the rerun's imports": [
                py,
                "-c",
                "import l5dask.cli, l5dask.prediction.cli, l5dask.core.cache, l5dask.prediction.report, os; os._exit(0)",
            ],
            "rerun": [*stats, "--cache", cache],
            "uncached": stats,
        }
        got: dict[str, list[tuple[float, float]]] = {k: [] for k in cmds}
        for r in range(args.rounds):
            for k in cmds if r % 2 == 0 else reversed(cmds):
                _, wall, _, cpu_s = run_measured(cmds[k])
                got[k].append((wall, cpu_s))
        cpu = {k: statistics.median(c for _, c in v) for k, v in got.items()}
        wall = {k: statistics.median(w for w, _ in v) for k, v in got.items()}
    parts = {
        "interpreter": cpu["interpreter"],
        "numpy, dask, click": cpu["numpy, dask, click"] - cpu["interpreter"],
        "l5dask's imports": cpu["the rerun's imports"] - cpu["numpy, dask, click"],
        "the rerun's own work": cpu["rerun"] - cpu["the rerun's imports"],
    }
    print(f"{path}: medians of {args.rounds} interleaved rounds, CPU seconds (wall)")
    for k in cmds:
        print(f"  {k:22s} {cpu[k]:.3f} CPU-s ({wall[k]:.3f} s)")
    print("the rerun's CPU, by part (differences of the medians):")
    for k, v in parts.items():
        print(f"  {k:22s} {v:+.3f} CPU-s  {v / cpu['rerun']:6.1%} of the rerun")
    ratio = statistics.median(a[1] / b[1] for a, b in zip(got["rerun"], got["uncached"]))
    print(
        f"rerun: {ratio:.1%} of the uncached process's CPU (median of the rounds' ratios; goal 3% of the cold pass); "
        f"l5dask's imports and work alone {parts_share(parts, cpu):.1%}"
    )


def parts_share(parts: dict[str, float], cpu: dict[str, float]) -> float:
    """The rerun's own part (l5dask's imports and work) against the uncached process's CPU."""
    return (parts["l5dask's imports"] + parts["the rerun's own work"]) / cpu["uncached"]


if __name__ == "__main__":
    main()
