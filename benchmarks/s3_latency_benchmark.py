"""``l5dask stats`` from an S3 endpoint with a first-byte latency, against the fetch floor.

    python benchmarks/s3_latency_benchmark.py [--scenes 1700] [--latency 0,20,50] [--rounds 3]

The dataset (``benchmarks/data/synth-SCENES-0.zarr``, made once) is served as ``s3://bench/ds``
by ``benchmarks/slow_s3.py``, which waits ``--latency`` milliseconds before every answer (as S3's
first byte does). Then, rounds interleaved, as whole processes:

- ``l5dask stats s3://bench/ds`` with the defaults (nothing the user must know), on local threads
  and on a local cluster of 2 worker processes (``--cluster``);
- the fetch floor: every object of the dataset listed and fetched with s3fs, 64 requests in
  flight, no HEAD, as a whole process (its start, imports and listing included, as the report's).

Printed: the best of each, their ratio (the report's time over the floor's: 1/throughput), and the
requests the endpoint counted per report run (HEAD and GET).
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import slow_s3  # noqa: E402
from common import DATA, dataset, run, run_output  # noqa: E402

FLOOR = """
import sys, time, s3fs
fs = s3fs.S3FileSystem(key="x", secret="x", max_concurrency=1, skip_instance_cache=True,
                       client_kwargs={"endpoint_url": sys.argv[1], "region_name": "us-east-1"},
                       config_kwargs={"max_pool_connections": 64})
t = time.perf_counter()
paths = [p for p in fs.find("bench/ds")]
got = fs.cat(paths, batch_size=64)
print(sum(len(v) for v in got.values()), len(paths), time.perf_counter() - t)
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenes", type=int, default=1700)
    parser.add_argument("--latency", default="0,20,50", help="first-byte latencies, ms")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cluster", action="store_true", help="also on a local cluster of 2 worker processes")
    args = parser.parse_args()
    path = dataset(args.scenes)
    root = DATA / "s3-bench"  # bucket "bench": ds is the dataset
    root.mkdir(exist_ok=True)
    if not (root / "ds").exists():
        os.symlink(os.path.abspath(path), root / "ds")
    lc = client = None
    try:
        nbytes = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)
        if args.cluster:
            from distributed import Client, LocalCluster

            lc = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
            client = Client(lc)
        where = ["threads"] + (["2 processes"] if args.cluster else [])
        print(f"{nbytes / 1e6:,.0f} MB in the bucket; rounds interleaved, best of {args.rounds}")
        for ms in [float(x) for x in args.latency.split(",")]:
            proxy, url = slow_s3.start(str(root), ms)
            env = dict(
                os.environ,
                AWS_ACCESS_KEY_ID="x",
                AWS_SECRET_ACCESS_KEY="x",
                AWS_DEFAULT_REGION="us-east-1",
                AWS_ENDPOINT_URL=url,
            )
            os.environ.update(env)  # (the child processes of run() inherit it)
            try:
                times: dict[str, list[float]] = {w: [] for w in where}
                floor, requests = [], {}
                for _ in range(args.rounds):
                    for w in where:
                        cmd = [sys.executable, "-m", "l5dask.cli", "stats", "s3://bench/ds", "-q"]
                        cmd += ["-O", "/tmp/l5dask-s3-latency.json"]
                        if w != "threads":
                            cmd += ["--scheduler", lc.scheduler_address]  # type: ignore[union-attr]
                        slow_s3.stats(url, reset=True)
                        times[w].append(run(cmd)[0])
                        requests[w] = slow_s3.stats(url)
                    # as a whole process too (interpreter, imports, the filesystem, the listing)
                    out, wall, _ = run_output([sys.executable, "-c", FLOOR, url])
                    floor.append(wall)
                fbest = min(floor)
                for w in where:
                    best = min(times[w])
                    print(
                        f"  {ms:4.0f} ms, {w:11s}: stats {best:6.2f} s, floor {fbest:5.2f} s -> {best / fbest:4.2f}x"
                        f" ({nbytes / best / 1e6:,.0f} MB/s; requests {requests[w]})",
                        flush=True,
                    )
            finally:
                proxy.kill()
    finally:
        if client is not None:
            client.close()
            lc.close()  # type: ignore[union-attr]


if __name__ == "__main__":
    main()
