"""Threads or local worker processes for the embedded default? (issue 4)

    python benchmarks/embedded_default.py [--scenes 1700]

Times the report on local threads (dask's threaded scheduler) and on a LocalCluster
of one single-threaded worker process per core, cluster start-up included.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import dataset  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenes", type=int, default=1700)
    args = parser.parse_args()
    path = dataset(args.scenes)
    import dask
    from distributed import Client, LocalCluster

    from l5dask.core.cluster import WORKER_CONFIG, WORKER_ENV
    from l5dask.prediction.report import compute_report

    os.environ.update(WORKER_ENV)  # the nannies pass it to the worker processes (see l5dask/core/cluster.py)
    dask.config.set(WORKER_CONFIG)  # as cluster/dask.yaml sets it on real clusters

    cores = os.cpu_count() or 1
    for _ in range(2):
        t = time.perf_counter()
        compute_report(path, scheduler="threads")
        threads = time.perf_counter() - t
        t = time.perf_counter()
        with (
            LocalCluster(n_workers=cores, threads_per_worker=1, processes=True, dashboard_address=None) as lc,
            Client(lc) as client,
        ):
            started = time.perf_counter() - t
            compute_report(path, scheduler=client)
        procs = time.perf_counter() - t
        print(f"threads: {threads:6.2f} s   {cores} worker processes: {procs:6.2f} s (start-up {started:.2f} s)")


if __name__ == "__main__":
    main()
