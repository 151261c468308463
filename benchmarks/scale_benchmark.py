"""The pass at scale: datasets larger than memory, read cold (issue 32).

    python benchmarks/scale_benchmark.py build                  # once; resumable
    python benchmarks/scale_benchmark.py run [--sizes 1,10,34] [--rounds 2] [--cold/--warm]

``build`` makes, under benchmarks/data, copies-N datasets with ``l5dask concat`` of N copies of
the 1,700-scene generated dataset (30.0 M agents, 0.84 GB stored): N = 10 is 300 M agents
(8.4 GB), N = 34 is 1.02 G agents (28.6 GB stored, 145 GB decoded). A finished dataset is kept
(``l5dask concat`` writes the group's ``.zgroup`` last: a dataset cut short has none and is made
again), so building again only makes what is missing.

``run`` times, on each size, as whole processes with rounds interleaved:

- ``l5dask stats``, ``l5dask agg`` (the README's query: by host and label, speed mean and max)
  and ``l5dask select-agents`` (its mask written to a temporary folder);
- the floor: every chunk file of the arrays the command reads, in chunk order, read by 8 threads
  and blosc-decoded (numcodecs; the GIL released in both), in a process of its own.

With ``--cold`` (the default where the user may write /proc/sys/vm/drop_caches) the page cache is
dropped before each run, so that every byte comes from the disk. Peak RSS is that of the whole
command (measured by a small parent, see ``common.run``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import DATA, dataset, drop_caches, record, run  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BASE_SCENES = 1700
ALL = ("scenes", "frames", "agents", "traffic_light_faces")

#: What each command reads (the floor reads the same chunk files).
COMMANDS = {
    "stats": ALL,
    "agg": ("scenes", "frames", "agents"),
    "select-agents": ("scenes", "frames", "agents"),
}

FLOOR = """
import os, sys
from concurrent.futures import ThreadPoolExecutor
from numcodecs import Blosc
codec = Blosc()
root, arrays = sys.argv[1], sys.argv[2].split(",")
# in each array's chunk order, as a pass reads them (the directory's own order is a hash order:
# read in it, the files came off the disk 2-3x slower)
files = [
    os.path.join(root, a, k)
    for a in arrays
    for k in sorted((k for k in os.listdir(os.path.join(root, a)) if not k.startswith(".")), key=int)
]
def one(p):
    with open(p, "rb") as f:
        return len(codec.decode(f.read()))
with ThreadPoolExecutor(8) as pool:
    total = sum(pool.map(one, files, chunksize=16))
print(total)
"""


def copies_path(n: int) -> str:
    return str(DATA / f"copies-{n}.zarr") if n > 1 else dataset(BASE_SCENES)


def build(sizes: list[int]) -> None:
    base = dataset(BASE_SCENES)
    for n in sizes:
        out = copies_path(n)
        if n == 1 or os.path.exists(os.path.join(out, ".zgroup")):
            continue
        t = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "l5dask.cli", "concat", *([base] * n), "--output", out, "--overwrite", "-q"],
            check=True,
        )
        print(f"built {out} ({n} copies) in {time.perf_counter() - t:.0f} s", flush=True)


def command(name: str, path: str, tmp: str) -> list[str]:
    cli = [sys.executable, "-m", "l5dask.cli"]
    if name == "stats":
        return [*cli, "stats", path, "--output", f"{tmp}/r.json", "--quiet"]
    if name == "agg":
        return [*cli, "agg", path, "--by", "host,label", "--value", "speed:mean,max", "--output", f"{tmp}/a.csv", "-q"]
    return [*cli, "select-agents", path, "--output", f"{tmp}/mask.zarr", "--overwrite", "-q"]


#: The same floor, each file read around the page cache (O_DIRECT, l5dask.core.diskread: what a
#: pass over a dataset larger than memory does) when it is not in it.
FLOOR_DIRECT = FLOOR.replace(
    """    with open(p, "rb") as f:
        return len(codec.decode(f.read()))""",
    """    return len(codec.decode(diskread.read(p, direct=True)))""",
).replace("from numcodecs import Blosc", "from numcodecs import Blosc\nfrom l5dask.core import diskread")
assert FLOOR_DIRECT != FLOOR


def floor(path: str, arrays: tuple[str, ...], direct: bool = False) -> tuple[float, float]:
    return run([sys.executable, "-c", FLOOR_DIRECT if direct else FLOOR, path, ",".join(arrays)])


def buffered(cmd: list[str]) -> list[str]:
    """The command with every read through the page cache (``l5dask.direct-reads: false``)."""
    return ["env", "DASK_L5DASK__DIRECT_READS=false", *cmd]


def secs(wall: float) -> str:
    """Seconds, to 10 ms under 10 s (the in-memory runs), else to 0.1 s."""
    return f"{wall:.2f} s" if wall < 10 else f"{wall:.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=("build", "run"))
    parser.add_argument("--sizes", default="1,10,34", help="copies of the 30 M-agent dataset")
    parser.add_argument("--commands", default="stats,agg,select-agents")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warm", action="store_true", help="do not drop the page cache")
    parser.add_argument(
        "--before", action="store_true", help="also each command with every read through the page cache"
    )
    parser.add_argument("--direct-floor", action="store_true", help="also the floor read around the page cache")
    parser.add_argument(
        "--record",
        action="store_true",
        help="write the largest size's figures to docs/figures/scale_cold.json (scale_warm.json with --warm), "
        "which the docs and the README quote",
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    build(sizes)
    if args.what == "build":
        return
    cold = not args.warm and drop_caches()
    print(f"{os.cpu_count()} cores; page cache {'dropped before each run' if cold else 'kept (warm)'}")
    names = args.commands.split(",")
    res: dict[tuple, list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        for n in sizes:
            path = copies_path(n)
            for name in names:
                kinds = ["floor", *(["direct floor"] if args.direct_floor else []), name]
                kinds += ["buffered"] if args.before else []
                for kind in kinds:  # interleaved: the floors right before their command
                    with tempfile.TemporaryDirectory(dir=DATA) as tmp:
                        if cold:
                            drop_caches()
                        if kind.endswith("floor"):
                            wall, rss = floor(path, COMMANDS[name], direct=kind == "direct floor")
                        else:
                            cmd = command(name, path, tmp)
                            wall, rss = run(buffered(cmd) if kind == "buffered" else cmd)
                    res.setdefault((n, name, kind), []).append((wall, rss))
                    print(f"round {r + 1}, {n} copies, {name} {kind}: {secs(wall)}, {rss:.2f} GB", flush=True)
    print()
    extra = [k for k, on in (("direct floor", args.direct_floor), ("buffered", args.before)) if on]
    print(
        "| agents | command | best | floor (best) | ratio (median of rounds) | "
        + "".join(f"{k} (best) | ratio to it | " for k in extra)
        + "peak RSS |"
    )
    print("|---|---|---|---|---|" + "---|---|" * len(extra) + "---|")

    def ratio(a: list, b: list) -> float:
        return statistics.median(x[0] / y[0] for x, y in zip(a, b))

    for n in sizes:
        for name in names:
            ours, base = res[(n, name, name)], res[(n, name, "floor")]
            cells = "".join(
                f"{secs(min(o[0] for o in res[(n, name, k)]))} | {ratio(ours, res[(n, name, k)]):.2f}x | "
                for k in extra
            )
            print(
                f"| {30.04 * n:,.0f} M | `l5dask {name}` | {secs(min(o[0] for o in ours))} | "
                f"{secs(min(b[0] for b in base))} | {ratio(ours, base):.2f}x | {cells}{max(o[1] for o in ours):.2f} GB |"
            )
    if args.record:
        n, figures = max(sizes), {}
        for name in names:
            ours, base, key = res[(n, name, name)], res[(n, name, "floor")], name.replace("-", "_")
            figures[f"{key}_s"] = round(min(o[0] for o in ours), 2 if min(o[0] for o in ours) < 10 else 1)
            figures[f"{key}_floor_s"] = round(min(b[0] for b in base), 2 if min(b[0] for b in base) < 10 else 1)
            figures[f"{key}_x"] = round(ratio(ours, base), 2)
            figures[f"{key}_gb"] = round(max(o[1] for o in ours), 2)
        stem = "scale_cold" if cold else "scale_warm"
        note = f"{30.04 * n:,.0f} M agents, {'cold' if cold else 'in the page cache'}, best of {args.rounds} rounds"
        print("recorded", record(stem, "python benchmarks/scale_benchmark.py " + " ".join(sys.argv[1:]), figures, note))


if __name__ == "__main__":
    main()
