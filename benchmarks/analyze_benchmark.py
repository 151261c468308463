"""Many analyses of one dataset in one pass (issue 48: the report, the catalog and three
aggregations together at most 1.3x the report alone; five separate commands take about 5x).

    python benchmarks/analyze_benchmark.py [--scenes 1700] [--rounds 3]

Whole processes on the embedded default, in interleaved rounds (these shared machines change
speed from one minute to the next), each writing its outputs:

- ``report``: ``l5dask stats`` (the baseline);
- ``together``: ``l5dask.analyze`` of the report, the catalog and the aggregation benchmark's
  three queries (``aggregate_queries.py``: mean speed per scene and label, agents within 20 m per
  host, hour and label, extent quantiles per label), written as JSON and Parquet;
- ``run``: ``l5dask run`` of a job file that declares the same five analyses (the issue's "in one
  ``run``"), written as the commands write them (Arrow tables: pandas is not imported);
- ``separate``: the five commands one after the other (``l5dask stats``, ``l5dask catalog``,
  three ``l5dask agg``), their times added.

Printed: each round's wall and CPU seconds (user + system, all threads: a crowded machine changes
it much less than wall time) and peak RSS, then the medians of the per-round ratios to the report.
Before timing, the together run's results are checked to be those of the separate functions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from aggregate_queries import CLI  # noqa: E402
from common import dataset, run_measured  # noqa: E402

#: The aggregation benchmark's three queries, as ``l5dask.analyses.Aggregate`` arguments.
QUERIES = {
    "q1": {"by": ["scene_index", "label"], "values": {"speed": ["mean"]}},
    "q2": {"by": ["host", "hour", "label"], "values": {"agent_index": ["count"]}, "where": "distance_to_ego < 20"},
    "q3": {"by": ["label"], "values": {"extent_length": ["q50", "q90", "q99"]}},
}
TARGET = 1.3


def analyses():
    from l5dask.analyses import Aggregate, Catalog, Report

    return {"report": Report(), "catalog": Catalog(), **{q: Aggregate(**kw) for q, kw in QUERIES.items()}}


def together(path: str, out: str) -> None:
    """The child process of ``together``: one analyze, its outputs written."""
    import l5dask
    from l5dask.core.outputs import write_json, write_table
    from l5dask.prediction.catalog import write_catalog

    got = l5dask.analyze(path, analyses())
    write_json(got["report"], os.path.join(out, "report.json"))
    write_catalog(got["catalog"], os.path.join(out, "catalog.parquet"), overwrite=True)
    for q in QUERIES:
        write_table(got[q], os.path.join(out, f"{q}.parquet"))


def check(path: str) -> None:
    """The together run's results are the separate functions' (bit for bit)."""
    import pandas as pd

    import l5dask
    from l5dask.core.outputs import json_text, public
    from l5dask.prediction.report import compute_report

    got = l5dask.analyze(path, analyses())
    report = json_text(public(compute_report(path)))
    catalog = l5dask.catalog(path)
    assert json_text(public(got["report"])) == report
    pd.testing.assert_frame_equal(got["catalog"], catalog, check_exact=True)
    aggregates = {q: l5dask.aggregate(path, "agents", **kw) for q, kw in QUERIES.items()}
    for q in QUERIES:
        pd.testing.assert_frame_equal(got[q], aggregates[q], check_exact=True)
    with tempfile.TemporaryDirectory() as out:
        run_measured(commands(path, out)["run"][0])
        with open(f"{out}/r-report.json") as f:
            assert json_text(public(json.load(f))) == report
        pd.testing.assert_frame_equal(pd.read_parquet(f"{out}/r-catalog.parquet"), catalog, check_exact=True)
        for q in QUERIES:
            pd.testing.assert_frame_equal(pd.read_parquet(f"{out}/r-{q}.parquet"), aggregates[q], check_exact=True)
    print("checked: the five results together (analyze, run) are those of the five functions, bit for bit", flush=True)


def job_file(path: str, out: str) -> str:
    """The five analyses as a job file for ``l5dask run`` (written in ``out``): its path."""
    import json

    lines = [
        f"[datasets]\nd = {json.dumps(path)}\n",
        f'[analyses.report]\nkind = "report"\noutput = "{out}/r-report.json"\n',
    ]
    lines.append(f'[analyses.catalog]\nkind = "catalog"\noutput = "{out}/r-catalog.parquet"\n')
    for q, kw in QUERIES.items():
        text = f'[analyses.{q}]\nkind = "aggregate"\nby = {json.dumps(kw["by"])}\noutput = "{out}/r-{q}.parquet"\n'
        text += "values = { " + ", ".join(f"{c} = {json.dumps(r)}" for c, r in kw["values"].items()) + " }\n"
        if "where" in kw:
            text += f"where = {json.dumps(kw['where'])}\n"
        lines.append(text)
    job = os.path.join(out, "job.toml")
    with open(job, "w") as f:
        f.write("\n".join(lines))
    return job


def commands(path: str, out: str) -> dict[str, list[list[str]]]:
    cli = [sys.executable, "-m", "l5dask.cli"]
    return {
        "report": [[*cli, "stats", path, "-o", f"{out}/report.json", "-q"]],
        "together": [[sys.executable, os.path.abspath(__file__), "--together", path, out]],
        "run": [[*cli, "run", job_file(path, out), "-q"]],
        "separate": [
            [*cli, "stats", path, "-o", f"{out}/s-report.json", "-q"],
            [*cli, "catalog", path, "-o", f"{out}/s-catalog.parquet", "-q", "--overwrite"],
            *[[*cli, "agg", path, *CLI[q], "-q", "--output", f"{out}/s-{q}.parquet"] for q in QUERIES],
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenes", type=int, default=1700)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--together", nargs=2, metavar=("PATH", "OUT"))
    parser.add_argument("--no-check", action="store_true")
    args = parser.parse_args()
    if args.together:
        together(*args.together)
        return
    path = dataset(args.scenes)
    agents = int(__import__("l5dask").open_dataset(path).counts()["agents"])
    print(f"dataset: {path}: {agents:,} agents, {os.cpu_count()} cores", flush=True)
    if not args.no_check:
        check(path)
    names = ("report", "together", "run", "separate")
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            with tempfile.TemporaryDirectory() as out:
                w = c = rss = 0.0
                for cmd in commands(path, out)[name]:
                    _, dw, drss, dc = run_measured(cmd)
                    w, c, rss = w + dw, c + dc, max(rss, drss)
            wall[name].append(w)
            cpu[name].append(c)
            print(f"round {r + 1}: {name:<9} wall {w:7.2f} s  CPU {c:7.2f} s  peak RSS {rss:.2f} GB", flush=True)
    for name in names[1:]:
        rw = statistics.median(a / b for a, b in zip(wall[name], wall["report"]))
        rc = statistics.median(a / b for a, b in zip(cpu[name], cpu["report"]))
        goal = f" (goal <= {TARGET}x)" if name != "separate" else ""
        print(f"{name} / report: wall {rw:.2f}x, CPU {rc:.2f}x{goal} (medians of {args.rounds} rounds)")


if __name__ == "__main__":
    main()
