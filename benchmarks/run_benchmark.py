"""``l5dask run`` of the report, the catalog and three aggregations against the report alone and
against the five separate commands (issue 48: the run at most 1.3x the report alone).

    python benchmarks/run_benchmark.py [--scenes 1700] [--repeat 3] [--malloc]

Whole processes on the embedded default, each writing its outputs, in interleaved rounds (these
shared machines change speed from one minute to the next): ``l5dask stats -o``; ``l5dask run`` of
a job of the five analyses; the five commands one after the other (``stats``, ``catalog``, three
``agg``). Each round's times, the best of each, and the median of the per-round ratios to the
report alone; the run's record says the bytes it read (against the dataset's stored bytes).

``--malloc``: the run and the report with the command line's own glibc settings
(``l5dask.core.policy.LOCAL_ENV``: freed heap kept up to 256 MB) against the workers' (``WORKER_ENV``,
given back above 8 MB: set in the environment, which the command line then leaves alone), in
interleaved rounds: wall and CPU seconds, peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from common import dataset, measure, run  # noqa: E402

AGGREGATIONS = {
    "speeds": ("agents", "label", ["speed:mean,max,q99"], None),
    "near": ("agents", "scene_index", ["extent_length:mean"], "distance_to_ego < 20"),
    "busy": ("frames", "host,hour", ["num_agents:mean,max"], None),
}


def job_text(path: str, out: str) -> str:
    lines = [
        f'[run]\nrecord = "{out}/run.json"\n',
        f'[datasets]\nd = "{path}"\n',
        f'[analyses.report]\nkind = "report"\noutput = "{out}/report.json"\n',
        f'[analyses.catalog]\nkind = "catalog"\noutput = "{out}/catalog.parquet"\n',
    ]
    for name, (array, by, values, where) in AGGREGATIONS.items():
        cols = ", ".join(
            f"{c} = {json.dumps(r.split(','))}" for c, r in (v.split(":") for v in values)
        )  # speed = ["mean", "max"]
        w = f'where = "{where}"\n' if where else ""
        lines.append(
            f'[analyses.{name}]\nkind = "aggregate"\narray = "{array}"\nby = {json.dumps(by.split(","))}\n'
            f'values = {{ {cols} }}\n{w}output = "{out}/{name}.parquet"\n'
        )
    return "\n".join(lines)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "l5dask.cli", *args, "--quiet"]


def separate(path: str, out: str) -> list[list[str]]:
    cmds = [
        cli("stats", path, "-o", f"{out}/report.json"),
        cli("catalog", path, "-o", f"{out}/catalog.parquet", "--overwrite"),
    ]
    for name, (array, by, values, where) in AGGREGATIONS.items():
        args = ["agg", path, "--array", array, "--by", by, "-o", f"{out}/{name}.parquet"]
        args += [a for v in values for a in ("--value", v)]
        args += ["--where", where] if where else []
        cmds.append(cli(*args))
    return cmds


def stored_bytes(path: str) -> int:
    return sum(
        e.stat().st_size
        for a in ("scenes", "frames", "agents", "traffic_light_faces")
        for e in os.scandir(os.path.join(path, a))
        if not e.name.startswith(".")
    )


def malloc_rounds(path: str, repeat: int) -> None:
    """``--malloc``: each command with the command line's settings and with the workers'."""
    from l5dask.core.cluster import WORKER_ENV

    workers = ["env", *(f"{k}={v}" for k, v in WORKER_ENV.items())]
    got: dict[tuple[str, str], list] = {}
    with tempfile.TemporaryDirectory() as tmp:
        job = os.path.join(tmp, "job.toml")
        with open(job, "w") as f:
            f.write(job_text(path, f"{tmp}/run"))
        commands = {"stats": cli("stats", path, "-o", f"{tmp}/stats.json"), "run": cli("run", job)}
        for r in range(repeat):
            for name, cmd in commands.items():
                for setting in ("local", "workers") if r % 2 == 0 else ("workers", "local"):
                    u = measure(cmd if setting == "local" else workers + cmd)
                    if u.status != 0:
                        raise SystemExit(f"failed ({u.status}): {' '.join(cmd)[:200]}")
                    got.setdefault((name, setting), []).append(u)
                    print(
                        f"round {r + 1}: {name:<5} {setting:<7} {u.wall:5.2f} s wall, {u.cpu:5.2f} s CPU, "
                        f"peak RSS {u.rss_gb * 1000:4.0f} MB",
                        flush=True,
                    )
    for name in ("stats", "run"):
        loc, wrk = got[(name, "local")], got[(name, "workers")]
        print(
            f"{name}: median wall {statistics.median(u.wall for u in loc):.2f} s (local) against "
            f"{statistics.median(u.wall for u in wrk):.2f} s (workers'), CPU "
            f"{statistics.median(u.cpu for u in loc):.2f} against {statistics.median(u.cpu for u in wrk):.2f} s, "
            f"peak RSS {max(u.rss_gb for u in loc) * 1000:.0f} against {max(u.rss_gb for u in wrk) * 1000:.0f} MB"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenes", type=int, default=1700)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--malloc", action="store_true", help="the command line's glibc settings against the workers'")
    args = parser.parse_args()
    path = dataset(args.scenes)
    agents = int(__import__("l5dask").open_dataset(path).counts()["agents"])
    print(f"dataset: {path}: {agents:,} agents, {os.cpu_count()} cores", flush=True)
    if args.malloc:
        malloc_rounds(path, args.repeat)
        return
    times: dict[str, list[float]] = {"stats": [], "run": [], "separate": []}
    reads = []
    with tempfile.TemporaryDirectory() as tmp:
        job = os.path.join(tmp, "job.toml")
        with open(job, "w") as f:
            f.write(job_text(path, f"{tmp}/run"))
        os.makedirs(f"{tmp}/sep", exist_ok=True)
        for r in range(args.repeat):
            order = ["stats", "run", "separate"]
            order = order[r % 3 :] + order[: r % 3]
            for name in order:
                if name == "stats":
                    wall, _ = run(cli("stats", path, "-o", f"{tmp}/stats.json"))
                elif name == "run":
                    wall, _ = run(cli("run", job))
                    with open(f"{tmp}/run/run.json") as f:
                        reads.append(json.load(f)["reads"]["bytes"])
                else:
                    wall = sum(run(c)[0] for c in separate(path, f"{tmp}/sep"))
                times[name].append(wall)
                print(f"round {r + 1}: {name:<9} {wall:7.2f} s", flush=True)
    run_x = [a / s for a, s in zip(times["run"], times["stats"])]
    sep_x = [a / s for a, s in zip(times["separate"], times["stats"])]
    print(
        f"best: stats {min(times['stats']):.2f} s, run {min(times['run']):.2f} s, five commands "
        f"{min(times['separate']):.2f} s; against the report alone (median of rounds): run "
        f"{statistics.median(run_x):.2f}x (goal <= 1.3x), five commands {statistics.median(sep_x):.2f}x; "
        f"the run read {max(reads) / stored_bytes(path):.2f}x the dataset's stored bytes"
    )


if __name__ == "__main__":
    main()
