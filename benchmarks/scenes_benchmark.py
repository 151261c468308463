"""``l5dask stats --scenes`` on 5% of the scenes against the full report (issue 47: spread over the
dataset, at most 10% of the stored bytes read and 0.15x the full report's time; in one run of
consecutive scenes, at most 7% of the bytes).

    python benchmarks/scenes_benchmark.py [--scenes 1700] [--repeat 3]
    python benchmarks/scenes_benchmark.py --path /work/datasets/big/big.zarr --cold [--repeat 2]

With ``--path``, a dataset of the user's (e.g. the 1 G-agent one that ``big_cold.py build`` makes)
instead of a generated one. With ``--cold`` (root only: it drops the page cache), each measured
process starts with the page cache dropped, as a scheduled job on a bucket-sized dataset would, and
its bytes read from the disk (the kernel's count) are printed beside its times; the in-process
rounds are left out (a warm process over a dataset larger than the page cache is not a thing).
``--evict`` is cold too without root, and without disturbing others' measures: only the dataset's
files (and the catalog's) are put out of the page cache (``POSIX_FADV_DONTNEED`` each), the
interpreter's and l5dask's own files stay in it.

The catalog is made once (``l5dask catalog``, its time printed) and given with ``--catalog``, as a
user reuses it. Times: whole processes on the embedded default, the three commands interleaved in
each round (these shared machines change speed from one minute to the next); the best of each and
the median of the per-round ratios to the full run. Bytes: counted at the store (every
``Store.get``, ``get_into`` and read-ahead fetch of the command, run once more in a process that
counts them), against the stored bytes of the dataset's chunks and the bytes the full run reads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from common import dataset, drop_caches, evict, measure, record, run, run_measured  # noqa: E402

#: Runs an l5dask command in this process with every byte the store reads counted (written to argv[1]).
COUNTING = """
import json, sys, threading
from l5dask.core.store import LocalFile, Store
n = {"bytes": 0, "reads": 0}
lock = threading.Lock()  # (chunks read in part are read by threads)
get, get_into, fetched, read = Store.get, Store.get_into, Store._fetched, LocalFile.read
def counting_get(self, key, **kw):
    data = get(self, key, **kw)
    n["bytes"] += len(data); n["reads"] += 1
    return data
def counting_get_into(self, key, buffer, **kw):
    got = get_into(self, key, buffer, **kw)
    n["bytes"] += got; n["reads"] += 1
    return got
def counting_fetched(self, *a, **kw):
    for data in fetched(self, *a, **kw):
        n["bytes"] += len(data); n["reads"] += 1
        yield data
def counting_read(self, start=None, end=None):  # (a local chunk read in part: its file opened once)
    data = read(self, start, end)
    with lock:
        n["bytes"] += len(data); n["reads"] += 1
    return data
Store.get, Store.get_into, Store._fetched = counting_get, counting_get_into, counting_fetched
LocalFile.read = counting_read
from l5dask.cli import main
try:
    main(sys.argv[2:], standalone_mode=False)
finally:
    with open(sys.argv[1], "w") as f:
        json.dump(n, f)
"""


#: The same work in one process, its imports done: the full report against the filtered one (the
#: catalog read, the scenes chosen, the dataset restricted, its report), interleaved; prints JSON
#: of each round's wall and CPU seconds (the process's, its threads' too).
IN_PROCESS = """
import json, sys, time
import l5dask
from l5dask.prediction.report import compute_report
from l5dask.prediction.scenes import query_indices
path, cat, rounds, exprs = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
compute_report(path)  # (warm: the page cache, the kernels' first calls)
for expr in exprs.values():  # (and the filtered path's: pyarrow's import, the catalog's first read)
    ds = l5dask.open_dataset(path)
    compute_report(ds.isel(scene=query_indices(ds, expr, cat)))
out = {"full": [], **{name: [] for name in exprs}}
cpu = {"full": [], **{name: [] for name in exprs}}
for r in range(rounds):
    for name in (["full", *exprs] if r % 2 == 0 else [*exprs, "full"]):
        t, c = time.perf_counter(), time.process_time()
        if name == "full":
            compute_report(path)
        else:
            ds = l5dask.open_dataset(path)
            compute_report(ds.isel(scene=query_indices(ds, exprs[name], cat)))
        out[name].append(time.perf_counter() - t)
        cpu[name].append(time.process_time() - c)
print(json.dumps({"wall": out, "cpu": cpu}))
"""


def stored_bytes(path: str) -> int:
    """The bytes of the dataset's chunk files (its metadata objects left out)."""
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files if not f.startswith("."))
    return total


def counted(args: list[str], tmp: str) -> dict:
    out = os.path.join(tmp, "count.json")
    subprocess.run([sys.executable, "-c", COUNTING, out, *args], check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)


def cold_before_after(args: argparse.Namespace, path: str, cat: str, runs: dict[str, list[str]], total: int) -> None:
    """Each command of ``runs`` cold (``--cold`` or ``--evict`` before each process), with this
    checkout and with ``--before``'s, interleaved (which goes first alternates): wall, CPU and the
    bytes from the disk of each; the bytes at the store counted once each (they should be equal)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sides = {"after": here, "before": os.path.abspath(args.before)}
    with tempfile.TemporaryDirectory() as tmp:

        def command(side: str, name: str, r: int) -> list[str]:
            out = os.path.join(tmp, f"{side}-{name}-{r}.json")
            return ["stats", path, "-o", out, "-q", *runs[name]]

        def env(side: str) -> dict[str, str]:
            return {**os.environ, "PYTHONPATH": sides[side]}

        reads = {}
        for side in sides:
            for name in runs:
                if name != "full":
                    out = os.path.join(tmp, "count.json")
                    subprocess.run(
                        [sys.executable, "-P", "-c", COUNTING, out, *command(side, name, 0)],
                        check=True,
                        stdout=subprocess.DEVNULL,
                        env=env(side),
                    )
                    with open(out) as f:
                        reads[side, name] = json.load(f)["bytes"]
        got: dict[tuple[str, str], list[tuple[float, float, float]]] = {(s, n): [] for s in sides for n in runs}
        for r in range(args.repeat):
            for name in runs if r % 2 == 0 else list(reversed(runs)):
                for side in list(sides) if r % 2 == 0 else list(reversed(sides)):
                    if args.evict:
                        evict(path, cat)
                    else:
                        drop_caches()
                    # (-P: the current folder, perhaps a checkout, must not come before the side's own)
                    cmd = ["env", f"PYTHONPATH={sides[side]}", sys.executable, "-P", "-m", "l5dask.cli"]
                    u = measure([*cmd, *command(side, name, r + 1)])
                    if u.status != 0:
                        raise SystemExit(f"failed ({u.status}): {side} {name}")
                    got[side, name].append((u.wall, u.cpu, u.read_gb))
                    print(
                        f"round {r + 1}: {name:<12} {side:<6} {u.wall:7.2f} s wall, {u.cpu:7.2f} s CPU, "
                        f"{u.read_gb:.2f} GB from the disk",
                        flush=True,
                    )
        for name in runs:
            for side in sides:
                w, c, g = zip(*got[side, name])
                at = f", {reads[side, name] / 1e9:.2f} GB at the store" if (side, name) in reads else ""
                print(
                    f"{name:<12} {side:<6} wall {min(w):.2f}-{max(w):.2f} s, CPU {min(c):.2f}-{max(c):.2f} s, "
                    f"{min(g):.2f}-{max(g):.2f} GB from the disk{at}"
                )
            ratios = [a[0] / b[0] for a, b in zip(got["after", name], got["before", name])]
            print(f"{name:<12} after/before wall: median of rounds {statistics.median(ratios):.3f}x")
        if "full" in runs:
            for side in sides:
                for name in runs:
                    ratios = [a[0] / f[0] for a, f in zip(got[side, name], got[side, "full"])]
                    print(f"{side:<6} {name:<12} {statistics.median(ratios):.3f}x the full report's wall time")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenes", type=int, default=1700)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--record", action="store_true", help="write the figures to docs/figures/scenes.json")
    parser.add_argument("--path", help="an existing dataset (default: the generated one of --scenes scenes)")
    parser.add_argument("--cold", action="store_true", help="drop the page cache before each measured process")
    parser.add_argument(
        "--evict",
        action="store_true",
        help="cold too, the dataset's and the catalog's own pages put out of the page cache before each measured "
        "process (POSIX_FADV_DONTNEED on each file: no root, other processes' pages kept)",
    )
    parser.add_argument("--runs", default="full,spread,consecutive", help="which commands to run (comma-separated)")
    parser.add_argument("--catalog", help="the dataset's catalog, made already (default: made once here)")
    parser.add_argument(
        "--before",
        help="cold only: each command run with this checkout of l5dask too (first on PYTHONPATH), interleaved",
    )
    args = parser.parse_args()
    if args.cold and args.evict:
        raise SystemExit("--cold or --evict, not both")
    if args.cold and not drop_caches():
        raise SystemExit("--cold drops the page cache: run as root")
    cold = args.cold or args.evict
    if args.record and (cold or args.path):
        raise SystemExit("--record writes the generated datasets' warm figures: not with --path or --cold")
    if args.before and not cold:
        raise SystemExit("--before: with --cold or --evict")
    if not cold and args.runs != parser.get_default("runs"):
        raise SystemExit("--runs: with --cold or --evict")
    path = args.path or dataset(args.scenes)
    n = int(__import__("l5dask").open_dataset(path).counts()["scenes"]) if args.path else args.scenes
    k = max(1, n // 20)
    first = (n - k) // 2
    total = stored_bytes(path)
    agents = int(__import__("l5dask").open_dataset(path).counts()["agents"])
    print(f"dataset: {path}: {n:,} scenes, {agents:,} agents, {total / 1e9:.2f} GB stored, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        cat = args.catalog or os.path.join(tmp, "catalog.parquet")
        if not args.catalog:
            wall, _ = run([sys.executable, "-m", "l5dask.cli", "catalog", path, "-o", cat, "-q"])
            print(f"catalog made once: {wall:.2f} s ({cat})", flush=True)
        runs = {
            "full": [],
            "spread": ["--scenes", "scene_index % 20 == 0", "--catalog", cat],
            "consecutive": ["--scenes", f"scene_index >= {first} and scene_index < {first + k}", "--catalog", cat],
        }
        if cold:
            runs = {name: runs[name] for name in args.runs.split(",")}
            if args.before:
                return cold_before_after(args, path, cat, runs, total)

        def command(name: str, r: int) -> list[str]:
            return ["stats", path, "-o", os.path.join(tmp, f"{name}-{r}.json"), "-q", *runs[name]]

        reads = {name: counted(command(name, 0), tmp) for name in runs}
        chosen = {name: json.load(open(os.path.join(tmp, f"{name}-0.json")))["counts"]["scenes"] for name in runs}
        times: dict[str, list[float]] = {name: [] for name in runs}
        cpus: dict[str, list[float]] = {name: [] for name in runs}
        for r in range(args.repeat):
            order = list(runs) if r % 2 == 0 else list(reversed(runs))
            for name in order:
                cmd = [sys.executable, "-m", "l5dask.cli", *command(name, r + 1)]
                if cold:
                    if args.evict:
                        left = evict(path, cat)
                        if left:
                            print(f"(evicting: {left / 1e6:.1f} MB of the dataset stayed in the page cache)")
                    else:
                        drop_caches()
                    u = measure(cmd)
                    if u.status != 0:
                        raise SystemExit(f"failed ({u.status}): {' '.join(cmd)[:200]}")
                    wall, cpu, disk = u.wall, u.cpu, f", {u.read_gb:.2f} GB from the disk"
                else:
                    _, wall, _, cpu = run_measured(cmd)
                    disk = ""
                times[name].append(wall)
                cpus[name].append(cpu)
                print(f"round {r + 1}: {name:<12} {wall:7.2f} s wall, {cpu:7.2f} s CPU{disk}", flush=True)
        exprs = {name: runs[name][1] for name in runs if name != "full"}
        if cold:
            for name in runs:
                b = reads[name]["bytes"]
                line = f"{name:<12} {chosen[name]:>6,} scenes, cold: read {b / total:6.1%} of the stored bytes at the "
                line += f"store; best {min(times[name]):.2f} s"
                if "full" in runs:
                    ratios = [t / f for t, f in zip(times[name], times["full"])]
                    cpu_ratios = [t / f for t, f in zip(cpus[name], cpus["full"])]
                    line += f"; median of rounds {statistics.median(ratios):.3f}x the full report's wall time, "
                    line += f"{statistics.median(cpu_ratios):.3f}x its CPU"
                print(line)
            print(
                "goals: spread <= 10% of the bytes and <= 0.15x the full report's time; consecutive <= 7% of the bytes"
            )
            return
        done = subprocess.run(
            [sys.executable, "-c", IN_PROCESS, path, cat, str(args.repeat), json.dumps(exprs)],
            check=True,
            capture_output=True,
            text=True,
        )
        measured = json.loads(done.stdout.strip().splitlines()[-1])
        inproc, inproc_cpu = measured["wall"], measured["cpu"]
    for name in runs:
        b = reads[name]["bytes"]
        ratios = [t / f for t, f in zip(times[name], times["full"])]
        cpu_ratios = [t / f for t, f in zip(cpus[name], cpus["full"])]
        print(
            f"{name:<12} {chosen[name]:>5,} scenes: read {b / 1e6:9.1f} MB = {b / total:6.1%} of the stored bytes "
            f"({b / reads['full']['bytes']:6.1%} of the full run's) in {reads[name]['reads']:,} reads; "
            f"best {min(times[name]):.2f} s; median of rounds {statistics.median(ratios):.3f}x the full report's "
            f"wall time, {statistics.median(cpu_ratios):.3f}x its CPU"
        )
    for name in exprs:
        r = [t / f for t, f in zip(inproc[name], inproc["full"])]
        rc = [t / f for t, f in zip(inproc_cpu[name], inproc_cpu["full"])]
        print(
            f"in one process, imports done: {name:<12} {min(inproc[name]):.2f} s ({min(inproc_cpu[name]):.2f} CPU-s) "
            f"against the full report's {min(inproc['full']):.2f} s ({min(inproc_cpu['full']):.2f} CPU-s); "
            f"median of rounds {statistics.median(r):.3f}x its wall time, {statistics.median(rc):.3f}x its CPU"
        )
    print("goals: spread <= 10% of the bytes and <= 0.15x the full report's time; consecutive <= 7% of the bytes")
    if args.record:
        ratio = {n: [t / f for t, f in zip(times[n], times["full"])] for n in runs}
        figures = {
            "agents_n": agents,
            "full_s": round(min(times["full"]), 2),
            "spread_s": round(min(times["spread"]), 2),
            "consecutive_s": round(min(times["consecutive"]), 2),
            "spread_time_x": [round(min(ratio["spread"]), 3), round(max(ratio["spread"]), 3)],
            "consecutive_time_x": [round(min(ratio["consecutive"]), 3), round(max(ratio["consecutive"]), 3)],
            "spread_bytes_x": round(reads["spread"]["bytes"] / total, 4),
            "spread_in_process_x": round(
                statistics.median([t / f for t, f in zip(inproc["spread"], inproc["full"])]), 3
            ),
            "spread_in_process_cpu_x": round(
                statistics.median([t / f for t, f in zip(inproc_cpu["spread"], inproc_cpu["full"])]), 3
            ),
            "spread_cpu_x": round(statistics.median([t / f for t, f in zip(cpus["spread"], cpus["full"])]), 3),
            "consecutive_in_process_x": round(
                statistics.median([t / f for t, f in zip(inproc["consecutive"], inproc["full"])]), 3
            ),
            "consecutive_bytes_x": round(reads["consecutive"]["bytes"] / total, 4),
        }
        load = os.getloadavg()[0]
        print(
            record(
                "scenes",
                f"python benchmarks/scenes_benchmark.py --scenes {n} --repeat {args.repeat}",
                figures,
                f"load {load:.0f} on {os.cpu_count()} cores",
            )
        )


if __name__ == "__main__":
    main()
