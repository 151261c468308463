"""Two checkouts of l5dask compared on the main jobs, as whole processes, rounds interleaved.

    python benchmarks/before_after.py --before ../l5dask-before [--after ../other] [--scenes 1700]
        [--rows 500000] [--perception-scenes 180] [--rounds 5] [--jobs stats,agg-q1,agg-q2,evaluate,perception]

``--before`` (and ``--after``, default this checkout) is a checkout whose compiled modules are
built in place (``pip wheel --no-deps`` then the ``.so`` files copied into the tree, or
``python setup.py build_ext --inplace``). Each job runs with that checkout first on
``PYTHONPATH``, from a temporary folder; before and after alternate in each round (which goes
first alternates too). Each checkout's package is compiled to bytecode first (``compileall``):
where ``PYTHONDONTWRITEBYTECODE`` is set, a checkout without it compiled every module from its
source in every process (``l5dask stats`` on 30 M agents: 0.1 s of CPU more, 8-10% "slower"
with the same code). Printed: the best time of each, the best's ratio and the median of the
per-round after/before ratios (these shared machines change speed from minute to minute), and the
same of CPU seconds (user + system), which a crowded machine changes much less.

The jobs: ``l5dask stats`` and ``l5dask agg`` (the README's q1 and q2) on the generated dataset of
``--scenes`` scenes; ``l5dask evaluate`` on a generated GT/PRED pair of ``--rows`` rows;
``l5dask perception stats --no-lidar`` on a generated perception dataset of
``--perception-scenes`` scenes. Also, when named in ``--jobs``: the aggregation benchmark's
queries through its Python paths, ``aggregate-q1`` .. ``xarray-q3`` (``aggregate_queries.py``),
and ``run``: ``l5dask run`` of the job file of ``analyze_benchmark.py`` (the report, the catalog
and its three aggregations in one pass; issue 48).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from aggregate_queries import CLI  # noqa: E402
from common import dataset, run_measured  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = ("stats", "agg-q1", "agg-q2", "evaluate", "perception")
#: The aggregation benchmark's queries through its Python paths (``aggregate_queries.py``, run
#: with each checkout on ``PYTHONPATH``), asked for by name: ``aggregate-q1``, ``xarray-q2``...
ROUTES = tuple(f"{api}-{q}" for api in ("aggregate", "dataframe", "xarray") for q in ("q1", "q2", "q3"))
QUERIES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "aggregate_queries.py")
#: Jobs named only when asked for, and what each needs written in its round's folder first.
EXTRA = ("run",)
SETUP: dict = {}


def job_args(names: list[str], scenes: int, rows: int, perception_scenes: int) -> dict[str, list[str]]:
    """The command line of each job (``{tmp}``: the round's temporary folder)."""
    out: dict[str, list[str]] = {}
    if {"stats", "agg-q1", "agg-q2", "run", *ROUTES} & set(names):
        path = dataset(scenes)
        print(f"dataset: {path}")
        for route in ROUTES:
            api, q = route.split("-")
            out[route] = [QUERIES, path, q, api, "{tmp}/" + route + ".parquet"]
        out["stats"] = ["stats", path, "--quiet", "--output", "{tmp}/r.json"]
        out["agg-q1"] = ["agg", path, *CLI["q1"], "-q", "--output", "{tmp}/q1.parquet"]
        out["agg-q2"] = ["agg", path, *CLI["q2"], "-q", "--output", "{tmp}/q2.parquet"]
        out["run"] = ["run", "{tmp}/job.toml", "-q"]
        from analyze_benchmark import job_file

        SETUP["run"] = lambda tmp: job_file(path, tmp)
    if "evaluate" in names:
        from evaluation_benchmark import pair

        gt, pred = pair(rows)
        out["evaluate"] = ["evaluate", gt, pred, "-o", "{tmp}/m.json", "-q"]
    if "perception" in names:
        from perception_benchmark import perception_data

        data = perception_data(perception_scenes, 0)
        out["perception"] = ["perception", "stats", data, "--no-lidar", "--quiet", "--output", "{tmp}/p.json"]
    return {k: v for k, v in out.items() if k in names}


def compare(jobs: dict[str, list[str]], before: str, after: str, rounds: int) -> None:
    """Run each job with each checkout, ``rounds`` interleaved rounds; print the figures."""
    times: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}  # (user + system seconds: steadier on a shared machine)
    for r in range(rounds):
        for job, args in jobs.items():
            trees = (("before", before), ("after", after))
            for label, tree in trees if r % 2 == 0 else trees[::-1]:
                with tempfile.TemporaryDirectory() as tmp:
                    path = tree + os.pathsep + os.environ.get("PYTHONPATH", "")
                    # (run from the temporary folder: the current one would come first on sys.path)
                    cmd = ["env", "-C", tmp, f"PYTHONPATH={path}", sys.executable]
                    cmd += [] if args[0] == QUERIES else ["-m", "l5dask.cli"]
                    if job in SETUP:
                        SETUP[job](tmp)
                    _, wall, _, used = run_measured(cmd + [a.format(tmp=tmp) for a in args])
                    times.setdefault((job, label), []).append(wall)
                    cpu.setdefault((job, label), []).append(used)
    print(f"whole processes, {rounds} interleaved rounds (best; median of per-round after/before):")
    for job in jobs:
        b, a = times[(job, "before")], times[(job, "after")]
        cb, ca = cpu[(job, "before")], cpu[(job, "after")]
        print(
            f"    {job:<12} before {min(b):6.2f} s   after {min(a):6.2f} s   after/before best {min(a) / min(b):.3f}"
            f"   median {_median_ratio(a, b):.3f};   CPU before {statistics.median(cb):6.2f} s   after "
            f"{statistics.median(ca):6.2f} s   median {_median_ratio(ca, cb):.3f}"
        )


def compile_package(tree: str) -> None:
    """The bytecode of a checkout's package written (what its processes import, not compiled
    again in each of them)."""
    import compileall

    if not compileall.compile_dir(os.path.join(tree, "l5dask"), quiet=2):
        raise SystemExit(f"{tree}: its package does not compile")


def _median_ratio(after: list[float], before: list[float]) -> float:
    return statistics.median([x / y for x, y in zip(after, before)])


def checkout_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a comparison of two checkouts (this script's and trust_overhead.py's)."""
    parser.add_argument("--before", required=True, help="a checkout to compare with, kernels built in place")
    parser.add_argument("--after", default=ROOT, help="the checkout compared (default: this one)")
    parser.add_argument("--scenes", type=int, default=1700)
    parser.add_argument("--rounds", type=int, default=5)


def main() -> None:
    parser = argparse.ArgumentParser()
    checkout_arguments(parser)
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--perception-scenes", type=int, default=180)
    parser.add_argument(
        "--jobs", default=",".join(JOBS), help=f"a comma-separated subset of {','.join(JOBS + ROUTES + EXTRA)}"
    )
    args = parser.parse_args()
    names = [j for j in args.jobs.split(",") if j]
    unknown = set(names) - set(JOBS) - set(ROUTES) - set(EXTRA)
    if unknown:
        parser.error(f"unknown job(s): {', '.join(sorted(unknown))}")
    print(f"{os.cpu_count()} cores; before {args.before}, after {args.after}")
    for tree in (args.before, args.after):
        compile_package(tree)
    jobs = job_args(names, args.scenes, args.rows, args.perception_scenes)
    compare(jobs, os.path.abspath(args.before), os.path.abspath(args.after), args.rounds)


if __name__ == "__main__":
    main()
