"""``l5dask stats``, ``agg`` and ``evaluate`` from an S3 endpoint with a first-byte latency,
against the fetch floor of the same objects.

    python benchmarks/s3_latency_benchmark.py [--scenes 1700] [--latency 0,20,50] [--rounds 3]
        [--commands stats,agg,evaluate] [--eval-rows 500000] [--cluster] [--s3fs-gets] [--no-secede]
        [--before CHECKOUT]

The dataset (``benchmarks/data/synth-SCENES-0.zarr``, made once) is served as ``s3://bench/ds``,
and a GT/PRED pair of ``--eval-rows`` rows (``evaluation_benchmark.pair``, made once) as
``s3://bench/gt.csv`` and ``s3://bench/pred.csv``, by ``benchmarks/slow_s3.py``, which waits
``--latency`` milliseconds before every answer (as S3's first byte does). Then, rounds
interleaved, as whole processes:

- each command with the defaults (nothing the user must know), on local threads and on a local
  cluster of 2 worker processes (``--cluster``): ``stats``; ``agg`` (the README's query, by host
  and label, speed mean and max); ``evaluate`` of the pair;
- its fetch floor: every object the command reads (``stats``: the whole dataset; ``agg``: scenes,
  frames and agents; ``evaluate``: both CSV files) fetched with s3fs, 64 requests in flight, no
  HEAD, objects over 16 MB in 16 MB ranges, as a whole process (its start, imports and listing
  included, as the command's);
- the obstore floor: the same fetch through l5dask's own GETs (``l5dask.core.objects``: obstore),
  the floor of what the commands themselves do;
- with ``--s3fs-gets``, each command on local threads with every GET through s3fs
  (``l5dask.obstore: false``);
- with ``--before CHECKOUT`` (built in place, as ``benchmarks/before_after.py`` takes it), each
  command with that checkout first on ``PYTHONPATH`` too, on local threads (and 2 worker processes
  with ``--cluster``): the step before, in the same rounds. Run this from outside the checkouts (the
  current folder comes first on ``sys.path``), e.g. ``cd /tmp && python .../s3_latency_benchmark.py``;
- with ``--no-secede``, each command on 2 worker processes whose tasks keep their thread while
  they wait for their first bytes (``l5dask.secede-on-wait: false``).

Printed: the best of each, their ratio (the command's time over the floor's: 1/throughput), and the
requests the endpoint counted per command run (HEAD and GET).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import slow_s3  # noqa: E402
from common import DATA, dataset, record, run, run_output  # noqa: E402

#: The fetch floors: every object under the prefixes, 64 requests in flight, objects over 16 MB in
#: 16 MB ranges, nothing decoded; by s3fs ("s3fs"), or through l5dask's own GETs ("direct":
#: ``l5dask.core.objects``, obstore).
FLOOR = """
import asyncio, sys, time, s3fs, fsspec.asyn
fs = s3fs.S3FileSystem(key="x", secret="x", max_concurrency=1, skip_instance_cache=True,
                       client_kwargs={"endpoint_url": sys.argv[1], "region_name": "us-east-1"},
                       config_kwargs={"max_pool_connections": 64})
t = time.perf_counter()
sizes = {}
for prefix in sys.argv[3:]:
    sizes.update({p: d["size"] for p, d in fs.find(prefix, detail=True).items()})
part = 16 << 20
ranges = [(p, lo, min(lo + part, n)) for p, n in sizes.items() for lo in range(0, max(n, 1), part)]
if sys.argv[2] == "s3fs":
    got = fs.cat_ranges([r[0] for r in ranges], [r[1] for r in ranges], [r[2] for r in ranges], batch_size=64)
    total = sum(len(v) for v in got)
else:
    from l5dask.core import objects
    async def main():
        limit = asyncio.Semaphore(64)
        async def one(r):
            async with limit:
                return len(await objects.cat(fs, r[0], r[1], r[2]))
        return sum(await asyncio.gather(*map(one, ranges)))
    total = fsspec.asyn.sync(fs.loop, main)
print(total, len(sizes), time.perf_counter() - t)
"""

#: What each command reads, under the bucket (the floor fetches the same objects).
READS = {
    "stats": ["bench/ds"],
    "agg": ["bench/ds/.zgroup", "bench/ds/scenes", "bench/ds/frames", "bench/ds/agents"],
    "evaluate": ["bench/gt.csv", "bench/pred.csv"],
}


def command(name: str) -> list[str]:
    cli = [sys.executable, "-m", "l5dask.cli"]
    if name == "stats":
        return [*cli, "stats", "s3://bench/ds", "-q", "-o", "/tmp/l5dask-s3-latency.json"]
    if name == "agg":
        agg = ["agg", "s3://bench/ds", "--by", "host,label", "--value", "speed:mean,max"]
        return [*cli, *agg, "-q", "--output", "/tmp/l5dask-s3-latency.csv"]
    return [*cli, "evaluate", "s3://bench/gt.csv", "s3://bench/pred.csv", "-q", "-o", "/tmp/l5dask-s3-metrics.json"]


#: A local cluster of 2 worker processes (one thread each), with the workers' settings of
#: ``l5dask.core.cluster.WORKER_ENV``, in a process of its own: its workers import the l5dask of
#: its ``PYTHONPATH`` (multiprocessing gives them their parent's ``sys.path``).
CLUSTER = """
import sys, dask
from distributed import LocalCluster
from l5dask.core.cluster import WORKER_ENV
with dask.config.set({"distributed.nanny.pre-spawn-environ": dict(WORKER_ENV)}):
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as lc:
        print(lc.scheduler_address, flush=True)
        sys.stdin.read()
"""


@contextlib.contextmanager
def cluster():
    """The scheduler address of a local cluster (``CLUSTER``) for one run, with this process's
    environment."""
    import subprocess

    proc = subprocess.Popen(
        [sys.executable, "-c", CLUSTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/"
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        yield proc.stdout.readline().strip()
    finally:
        proc.communicate(timeout=60)


@contextlib.contextmanager
def _environ(**values: str):
    """These environment variables for the child processes started inside."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def link(root, name: str, target: str) -> None:
    if not (root / name).exists():
        os.symlink(os.path.abspath(target), root / name)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenes", type=int, default=1700)
    parser.add_argument("--latency", default="0,20,50", help="first-byte latencies, ms")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--commands", default="stats,agg,evaluate")
    parser.add_argument("--eval-rows", type=int, default=500_000)
    parser.add_argument("--cluster", action="store_true", help="also on a local cluster of 2 worker processes")
    parser.add_argument(
        "--s3fs-gets",
        action="store_true",
        help="also on local threads with every GET through s3fs (l5dask.obstore: false)",
    )
    parser.add_argument("--before", help="also each command with this checkout (built in place): the step before")
    parser.add_argument(
        "--no-secede",
        action="store_true",
        help="also on 2 worker processes whose tasks keep their thread while they wait (l5dask.secede-on-wait: false)",
    )
    parser.add_argument(
        "--record",
        action="store_true",
        help="write each latency's ratios to the direct floor (threads, 2 processes) to docs/figures/s3_latency.json",
    )
    args = parser.parse_args()
    names = args.commands.split(",")
    root = DATA / "s3-bench"  # bucket "bench": ds is the dataset, gt.csv and pred.csv the pair
    root.mkdir(exist_ok=True)
    link(root, "ds", dataset(args.scenes))
    if "evaluate" in names:
        from evaluation_benchmark import pair

        gt, pred = pair(args.eval_rows)
        for name, target in (("gt.csv", gt), ("pred.csv", pred)):
            if (root / name).exists() and os.path.realpath(root / name) != os.path.abspath(target):
                os.unlink(root / name)
            link(root, name, target)
    where = ["threads"] + (["s3fs GETs"] if args.s3fs_gets else []) + (["2 processes"] if args.cluster else [])
    where += ["2 procs, no secede"] if args.no_secede else []
    if args.before:
        where += ["before threads"] + (["before 2 procs"] if args.cluster else [])
    after = os.path.dirname(HERE)
    print(f"rounds interleaved, best of {args.rounds}")
    figures: dict[str, float] = {}
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
            times: dict[tuple, list[float]] = {}
            requests: dict[tuple, dict] = {}
            nbytes: dict[str, int] = {}
            for _ in range(args.rounds):
                for name in names:
                    for w in where:
                        cmd = command(name)
                        with contextlib.ExitStack() as stack:
                            tree = args.before if w.startswith("before") else after
                            stack.enter_context(_environ(PYTHONPATH=os.path.abspath(tree)))
                            if w == "s3fs GETs":
                                stack.enter_context(_environ(DASK_L5DASK__OBSTORE="False"))
                            elif "threads" not in w:  # (a cluster of its own: idle workers alive beside the
                                # runs on threads made them up to 1.8x slower on these 2 cores)
                                if w == "2 procs, no secede":  # (the workers inherit it)
                                    stack.enter_context(_environ(DASK_L5DASK__SECEDE_ON_WAIT="False"))
                                cmd += ["--scheduler", stack.enter_context(cluster())]
                            slow_s3.stats(url, reset=True)
                            times.setdefault((name, w), []).append(run(cmd)[0])
                            requests[(name, w)] = slow_s3.stats(url)
                    # as a whole process too (interpreter, imports, the filesystem, the listing)
                    for kind, label in (("s3fs", "floor"), ("direct", "obstore floor")):
                        out, wall, _ = run_output([sys.executable, "-c", FLOOR, url, kind, *READS[name]])
                        assert nbytes.setdefault(name, int(out.split()[0])) == int(out.split()[0]), "floors differ"
                        times.setdefault((name, label), []).append(wall)
            for name in names:
                fbest, dbest = min(times[(name, "floor")]), min(times[(name, "obstore floor")])
                for w in where:
                    best = min(times[(name, w)])
                    print(
                        f"  {ms:4.0f} ms, {name:8s} {w:14s}: {best:6.2f} s, floor {fbest:5.2f} s "
                        f"-> {best / fbest:4.2f}x, obstore floor {dbest:5.2f} s -> {best / dbest:4.2f}x "
                        f"({nbytes[name] / best / 1e6:,.0f} MB/s of {nbytes[name] / 1e6:,.0f} MB; "
                        f"requests {requests[(name, w)]})",
                        flush=True,
                    )
                    if w in ("threads", "2 processes"):
                        figures[f"{ms:.0f}ms_{name}_{w.split()[-1]}_x"] = round(best / dbest, 2)
        finally:
            proxy.kill()
    if args.record:
        ran = "python benchmarks/s3_latency_benchmark.py " + " ".join(sys.argv[1:])
        note = f"against the direct floor (l5dask's own GETs), best of {args.rounds} rounds"
        print("recorded", record("s3_latency", ran, figures, note))


if __name__ == "__main__":
    main()
