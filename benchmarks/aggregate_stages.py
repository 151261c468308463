"""Where a whole ``l5dask.aggregate`` process spends its time beyond the pass (issue 46): the same
query (q1, mean speed per scene and label) as a pandas DataFrame written with ``to_parquet``, and,
the baseline measured in the same rounds, as the pass's Arrow table written with pyarrow.

    python benchmarks/aggregate_stages.py [--scenes 1700] [--rounds 3]

Each round runs both as whole processes, interleaved; each process times its own stages (wall and
CPU seconds): importing l5dask, opening, the pass (``aggregate_result``), importing pandas,
``to_pandas``, writing; what the process's total leaves of them is the interpreter's start and
teardown. Medians over the rounds are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import dataset  # noqa: E402

STAGED = r"""
import json, sys, time
marks = []
t0, c0 = time.perf_counter(), time.process_time()
def mark(what):
    global t0, c0
    t, c = time.perf_counter(), time.process_time()
    marks.append((what, t - t0, c - c0))
    t0, c0 = t, c
import l5dask
from l5dask.prediction.aggregation import aggregate_result
mark("import l5dask")
ds = l5dask.open_dataset(sys.argv[1])
mark("open")
res = aggregate_result(ds, "agents", by=["scene_index", "label"], values={"speed": ["mean"]})
mark("the pass")
if sys.argv[2] == "pandas":
    import pandas
    mark("import pandas")
    df = res.to_pandas()
    mark("to_pandas")
    df.astype({"label": str}).to_parquet(sys.argv[3])
    mark("write")
else:
    import pyarrow.parquet as pq
    t = res.to_arrow()
    mark("to_arrow")
    pq.write_table(t, sys.argv[3])
    mark("write")
open(sys.argv[4], "w").write(json.dumps(marks))
"""


def one(path: str, mode: str, tmp: str) -> dict[str, tuple[float, float]]:
    out, marks = os.path.join(tmp, f"{mode}.parquet"), os.path.join(tmp, f"{mode}.json")
    t, c = time.perf_counter(), os.times()
    subprocess.run([sys.executable, "-c", STAGED, path, mode, out, marks], check=True)
    wall, c2 = time.perf_counter() - t, os.times()
    cpu = (c2.children_user - c.children_user) + (c2.children_system - c.children_system)
    got = {k: (w, u) for k, w, u in json.load(open(marks))}
    got["start and teardown"] = (wall - sum(w for w, _ in got.values()), cpu - sum(u for _, u in got.values()))
    got["process"] = (wall, cpu)
    return got


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenes", type=int, default=1700)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    path = dataset(args.scenes)
    runs: dict[str, list[dict]] = {"pandas": [], "arrow": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode in ("pandas", "arrow") if r % 2 == 0 else ("arrow", "pandas"):
                runs[mode].append(one(path, mode, tmp))
    print(f"dataset: {path}; {args.rounds} interleaved rounds; medians (wall s / CPU s)")
    for mode, got in runs.items():
        print(f"\n{mode}:")
        for stage in got[0]:
            w = statistics.median(g[stage][0] for g in got)
            c = statistics.median(g[stage][1] for g in got)
            print(f"  {stage:22s} {w:6.3f} / {c:6.3f}")
    p = statistics.median(g["process"][0] for g in runs["pandas"])
    a = statistics.median(g["process"][0] for g in runs["arrow"])
    print(f"\nthe DataFrame's process / the Arrow table's: {p / a:.2f}x wall ({p - a:+.3f} s)")


if __name__ == "__main__":
    main()
