"""Columnar exports (issue #11): ``l5dask export`` to Parquet and to the zarr v3 layout, their rows
per second against the copy floor, and the report on the zarr v3 export against the report on the
original, read from a local S3 endpoint (moto server): time and bytes read.

    python benchmarks/export_benchmark.py [--scenes 1700] [--rounds 2] [--no-s3]

- export parquet / zarr3: whole processes (``l5dask export``), best of interleaved rounds with the
  copy floor (read, decode, encode and write the same dataset's chunks with all cores,
  ``copy_floor.py``): rows (agents + frames + faces + scenes) per second and time / floor;
- S3: both datasets uploaded to moto; ``l5dask stats`` on each (whole processes, interleaved) and,
  in this process, the bytes the report's reads return (every ``Store.get``), by array.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import dataset, moto_bucket, moto_server, run  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenes", type=int, default=1700)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-s3", action="store_true")
    args = ap.parse_args()
    src = dataset(args.scenes)
    import l5dask

    rows = sum(l5dask.open_dataset(src).counts().values())
    l5 = os.path.join(HERE, "..", ".venv", "bin", "l5dask")
    l5 = l5 if os.path.exists(l5) else "l5dask"
    tmp = tempfile.mkdtemp(prefix="l5dask-export-", dir=os.path.join(HERE, "data"))
    times: dict[str, list[float]] = {"parquet": [], "zarr3": [], "floor": []}
    try:
        for rnd in range(args.rounds):
            for kind in ("parquet", "zarr3", "floor"):
                out = os.path.join(tmp, kind)
                shutil.rmtree(out, ignore_errors=True)
                cmd = (
                    [sys.executable, os.path.join(HERE, "copy_floor.py"), src, out]
                    if kind == "floor"
                    else [l5, "export", src, "-o", out, "--format", kind, "-q"]
                )
                t, _ = run(cmd)
                times[kind].append(t)
                print(f"round {rnd + 1}: {kind:<8} {t:6.2f} s", flush=True)
        sizes = {
            k: sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(os.path.join(tmp, k)) for f in fs)
            for k in times
        }
        print(
            f"\n{rows:,} rows ({args.scenes} scenes), {os.cpu_count()} cores, best of {args.rounds} interleaved rounds"
        )
        for kind in ("parquet", "zarr3"):
            ratios = [t / f for t, f in zip(times[kind], times["floor"])]
            print(
                f"  export {kind:<8} {min(times[kind]):6.2f} s  {rows / min(times[kind]) / 1e6:5.1f} M rows/s  "
                f"{sizes[kind] / 1e9:5.2f} GB   median time / floor {statistics.median(ratios):4.2f}x"
            )
        print(
            f"  copy floor      {min(times['floor']):6.2f} s  {rows / min(times['floor']) / 1e6:5.1f} M rows/s  "
            f"{sizes['floor'] / 1e9:5.2f} GB (L5Kit's layout)"
        )
        if not args.no_s3:
            s3(src, os.path.join(tmp, "zarr3"), l5, args.rounds)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def s3(src: str, v3: str, l5: str, rounds: int) -> None:
    import s3fs

    from l5dask.core.store import Store
    from l5dask.prediction.report import compute_report

    proc, endpoint = moto_server()
    try:
        opts = moto_bucket(endpoint)
        fs = s3fs.S3FileSystem(**opts)
        fs.put(src, "bench/l5kit.zarr", recursive=True)
        fs.put(v3, "bench/v3", recursive=True)
        urls = {"L5Kit layout": "s3://bench/l5kit.zarr", "zarr v3 export": "s3://bench/v3"}
        got: dict[str, dict[str, int]] = {}
        get = Store.get

        def counting(self, key, **kw):
            data = get(self, key, **kw)
            top = key.split("/")[0]
            got[self.url][top] = got[self.url].get(top, 0) + len(data)
            return data

        def counting_many(self, keys, what=None):
            out = get_many(self, keys, what)
            for k, data in zip(keys, out):
                top = k.split("/")[0]
                got[self.url][top] = got[self.url].get(top, 0) + len(data)
            return out

        get_many = Store.get_many
        Store.get, Store.get_many = counting, counting_many
        reports = {}
        for url in urls.values():
            got[url] = {}
            reports[url] = compute_report(url, storage_options=opts)
        Store.get, Store.get_many = get, get_many
        a, b = (reports[u] for u in urls.values())
        assert a["agents"] == b["agents"] and a["counts"] == b["counts"] and a["tracks"] == b["tracks"]
        env = dict(
            os.environ,
            AWS_ACCESS_KEY_ID="x",
            AWS_SECRET_ACCESS_KEY="x",
            AWS_ENDPOINT_URL=endpoint,
            AWS_DEFAULT_REGION="us-east-1",
        )
        os.environ.update(env)
        t = {k: [] for k in urls}
        for _ in range(rounds):
            for name, url in urls.items():
                t[name].append(run([l5, "stats", url, "-q"])[0])
        base = sum(got[urls["L5Kit layout"]].values())
        print(f"\nthe report from S3 (moto on 127.0.0.1), {rounds} interleaved rounds, whole processes:")
        for name, url in urls.items():
            total = sum(got[url].values())
            parts = ", ".join(f"{k} {v / 1e6:.0f}" for k, v in sorted(got[url].items()))
            print(
                f"  {name:<15} {min(t[name]):6.2f} s   {total / 1e6:7.1f} MB read ({parts})   "
                f"{total / base:4.2f}x the bytes (target <= 0.6x)"
            )
    finally:
        proc.terminate()


if __name__ == "__main__":
    main()
