"""Evaluation (issue #9): ``l5dask evaluate``, ``select-agents`` and ``gt`` against their floors
and L5Kit's own code, in the same run.

    python benchmarks/evaluation_benchmark.py [--rows 500000] [--scenes 1700] [--rounds 3] [--part all]

- evaluate: a generated GT/PRED pair of ``--rows`` rows (T = 50, M = 3, PRED in GT's order as
  L5Kit writes them), whole process, against (a) the parse floor: pyarrow's CSV reader reading
  both files into numpy arrays with all cores and nothing else (a whole process too), and (b)
  L5Kit's ``compute_metrics_csv`` on a 20,000-row prefix of the same files (rows per second).
  Peak RSS of ``l5dask evaluate`` at ``--rows`` and half of it.
- select-agents and gt: on the generated dataset of ``--scenes`` scenes (30 M agents at 1700),
  whole process, against the decode floor of the arrays they read (every chunk of frames and
  agents read and blosc-decoded, a thread per core, nothing else; a whole process too, the
  decoding alone also printed), and against L5Kit's own
  per-scene code run on 20 scenes and scaled (``get_valid_agents``; L5Kit's ground truth runs
  ``AgentDataset``, which cannot be imported without torch, so gt has no L5Kit figure). gt exports a chopped-style mask (the agents of each scene's frame 100 with
  10 future frames in the agents mask: the validation use), and, once, the default
  (history 10, future 1, the mask computed on the fly).

Rounds are interleaved (these shared machines change speed from minute to minute); the best time
of each is printed and the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from common import DATA, dataset, record, run  # noqa: E402

T, M = 50, 3
L5DASK = [sys.executable, "-m", "l5dask.cli"]

PARSE_FLOOR = """
import sys, numpy as np, pyarrow.csv as pc
for path in sys.argv[1:]:
    t = pc.read_csv(path, read_options=pc.ReadOptions(use_threads=True, block_size=16 << 20))
    cols = [c.to_numpy() for c in t.columns]
"""

L5KIT_METRICS = """
import sys, time
sys.path.insert(0, {tests!r})
from conftest import l5kit_evaluation
cu, me, ex = l5kit_evaluation()
from l5dask.evaluation.metrics import METRICS
t = time.perf_counter()
ex.compute_metrics_csv(sys.argv[1], sys.argv[2], [getattr(me, k) for k in METRICS])
print(time.perf_counter() - t)
"""


def pair(rows: int) -> tuple[str, str]:
    """A GT/PRED pair of ``rows`` rows under benchmarks/data (made once)."""
    from l5dask.evaluation import write_gt_csv, write_pred_csv

    gt, pred = str(DATA / f"eval-{rows}-gt.csv"), str(DATA / f"eval-{rows}-pred.csv")
    if os.path.exists(gt) and os.path.exists(pred):
        return gt, pred
    t0 = time.perf_counter()
    rng = np.random.default_rng(rows)
    ts = np.sort(rng.integers(1_500_000_000_000_000_000, 1_600_000_000_000_000_000, rows))
    tid = rng.integers(1, 5000, rows)
    steps = np.cumsum(rng.normal(0, 0.3, (rows, T, 2)), axis=1)
    avail = (rng.random((rows, T)) > 0.1).astype(np.float32)
    write_gt_csv(gt, ts, tid, steps * avail[..., None], avail)
    p = steps[:, None] + np.cumsum(rng.normal(0, 0.2, (rows, M, T, 2)), axis=2)
    write_pred_csv(pred, ts, tid, p, rng.dirichlet(np.ones(M), rows))
    print(f"generated {gt} and {pred} in {time.perf_counter() - t0:.0f} s", flush=True)
    return gt, pred


def prefix(path: str, rows: int) -> str:
    out = path.replace(".csv", f"-head{rows}.csv")
    if not os.path.exists(out):
        with open(path, "rb") as f, open(out, "wb") as g:
            for _ in range(rows + 1):
                g.write(f.readline())
    return out


def bench_evaluate(rows: int, rounds: int) -> None:
    gt, pred = pair(rows)
    half = pair(rows // 2)
    tmp = tempfile.mkdtemp()
    out = os.path.join(tmp, "m.json")
    ours, floor = [], []
    for _ in range(rounds):
        ours.append(run(L5DASK + ["evaluate", gt, pred, "-o", out, "-q"]))
        floor.append(run([sys.executable, "-c", PARSE_FLOOR, gt, pred]))
    rss_half = run(L5DASK + ["evaluate", *half, "-o", out, "-q"])[1]
    g20, p20 = prefix(gt, 20_000), prefix(pred, 20_000)
    r = subprocess.run(
        [sys.executable, "-c", L5KIT_METRICS.format(tests=os.path.join(os.path.dirname(HERE), "tests")), g20, p20],
        capture_output=True,
        text=True,
        check=True,
    )
    l5kit_s = float(r.stdout.strip().splitlines()[-1])
    best, fbest = min(w for w, _ in ours), min(w for w, _ in floor)
    ratio = statistics.median(o[0] / f[0] for o, f in zip(ours, floor))
    mb = (os.path.getsize(gt) + os.path.getsize(pred)) / 1e6
    print(f"\nevaluate: {rows:,} rows (T={T}, M={M}), {mb:,.0f} MB of CSV, {rounds} interleaved rounds")
    print(
        f"  l5dask evaluate        best {best:6.2f} s  {rows / best:12,.0f} rows/s  peak RSS {ours[0][1]:.2f} GB "
        f"({rss_half:.2f} GB at {rows // 2:,} rows)"
    )
    print(f"  parse floor (pyarrow)  best {fbest:6.2f} s  peak RSS {floor[0][1]:.2f} GB")
    print(f"  L5Kit compute_metrics_csv, 20,000 rows: {l5kit_s:.2f} s = {20_000 / l5kit_s:,.0f} rows/s")
    print(
        f"  => {rows / best / (20_000 / l5kit_s):,.0f}x L5Kit's rows/s (target >= 100x); "
        f"{ratio:.2f}x the parse floor, per-round median (target <= 1.3x)"
    )
    return {
        "evaluate_s": round(best, 2),
        "evaluate_floor_x": round(ratio, 2),
        "evaluate_l5kit_x": round(rows / best / (20_000 / l5kit_s)),
    }


DECODE_FLOOR = """
import os, sys, time
from concurrent.futures import ThreadPoolExecutor
from numcodecs import Blosc
codec = Blosc()
path, arrays = sys.argv[1], sys.argv[2:]
files = [os.path.join(path, a, k) for a in arrays for k in os.listdir(os.path.join(path, a)) if not k.startswith(".")]

def one(f):
    with open(f, "rb") as fh:
        return len(codec.decode(fh.read()))

t = time.perf_counter()
with ThreadPoolExecutor(os.cpu_count()) as pool:
    sum(pool.map(one, files))
print(time.perf_counter() - t)
"""


def decode_floor(path: str, arrays: tuple[str, ...]) -> tuple[float, float]:
    """Read and blosc-decode every chunk of ``arrays``, a thread per core (numcodecs frees the
    GIL), nothing else, in a process of its own: (whole process, the decoding alone) seconds."""
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", DECODE_FLOOR, path, *arrays], capture_output=True, text=True, check=True)
    return time.perf_counter() - t, float(r.stdout.strip())


def l5kit_scenes(path: str, scenes: int = 20) -> float:
    """L5Kit's get_valid_agents on ``scenes`` scenes: seconds."""
    from tests.conftest import l5kit_select_agents

    sa = l5kit_select_agents()
    from l5kit.data.zarr_dataset import ChunkedDataset

    z = ChunkedDataset(path)
    z.open()
    t = time.perf_counter()
    for fr in z.scenes["frame_index_interval"][:scenes]:
        sa.get_valid_agents(fr, z, 0.5, 30, 1.1, 50)
    return time.perf_counter() - t


def chopped_mask(path: str, job=None) -> str:
    """The agents of each scene's frame 100 with >= 10 future frames in the agents mask (computed)."""
    out = os.path.join(DATA, os.path.basename(path).replace(".zarr", "-chopmask.npz"))
    if os.path.exists(out):
        return out
    import l5dask
    from l5dask.core.engine import Job
    from l5dask.evaluation.agents import Thresholds
    from l5dask.evaluation.chop import future_counts
    from l5dask.prediction import format as fmt
    from l5dask.prediction.surgery import pick_rows, scene_table

    ds = l5dask.open_dataset(path)
    job = Job()
    t = scene_table(ds, job)
    frames = np.unique(t.f0 + 100)
    iv = pick_rows(ds[fmt.FRAMES], frames, ("agent_index_interval",), job)["agent_index_interval"].reshape(-1, 2)
    rows = np.concatenate([np.arange(a, b) for a, b in iv])
    counts = future_counts(ds, rows, Thresholds(0.5), job)
    mask = np.zeros(len(ds[fmt.AGENTS]), bool)
    mask[rows[counts[:, 1] >= 10]] = True
    np.savez(out, mask)
    return out


def bench_dataset(scenes: int, rounds: int) -> None:
    path = dataset(scenes)
    import l5dask

    n = len(l5dask.open_dataset(path)["agents"])
    tmp = tempfile.mkdtemp()
    mask = chopped_mask(path)
    with np.load(mask) as z:
        gt_rows = int(z["arr_0"].sum())
    sel, gt, floor = [], [], []
    for _ in range(rounds):
        floor.append(decode_floor(path, ("frames", "agents")))
        sel.append(
            run(L5DASK + ["select-agents", path, "--output", os.path.join(tmp, "mask.zarr"), "--overwrite", "-q"])
        )
        gt.append(run(L5DASK + ["gt", path, "-o", os.path.join(tmp, "gt.csv"), "--mask", mask, "-q"]))
    t = time.perf_counter()
    r = subprocess.run(
        L5DASK + ["gt", path, "-o", os.path.join(tmp, "gt-all.csv"), "-q"], capture_output=True, text=True
    )
    gt_all = time.perf_counter() - t
    all_rows = r.stdout.strip()
    mask_s = l5kit_scenes(path)
    l5kit_mask = mask_s * scenes / 20
    fb, fin = min(w for w, _ in floor), min(d for _, d in floor)
    print(
        f"\nselect-agents / gt: {n:,} agents ({scenes} scenes), {rounds} interleaved rounds; "
        f"decode floor (frames + agents, {os.cpu_count()} threads) best {fb:.2f} s as a whole process "
        f"({fin:.2f} s of decoding in it)"
    )
    figures = {}
    for name, runs in (("select-agents", sel), (f"gt --mask ({gt_rows:,} rows)", gt)):
        best = min(w for w, _ in runs)
        ratio = statistics.median(w / f for (w, _), (f, _) in zip(runs, floor))
        if name == "select-agents":
            figures["select_agents_floor_x"] = round(ratio, 2)
        inner = statistics.median(w / d for (w, _), (_, d) in zip(runs, floor))
        print(
            f"  {name:<28} best {best:6.2f} s  peak RSS {max(r for _, r in runs):.2f} GB  "
            f"{ratio:.2f}x the decode floor, process to process (per-round median; target <= 2.5x); "
            f"{inner:.2f}x its decoding alone"
        )
    print(f"  gt, default mask (on the fly): {gt_all:.1f} s, {all_rows}")
    # peak memory at a second size: half the scenes
    half = dataset(scenes // 2)
    n_half = len(l5dask.open_dataset(half)["agents"])
    rss_sel = run(
        L5DASK + ["select-agents", half, "--output", os.path.join(tmp, "mask-half.zarr"), "--overwrite", "-q"]
    )[1]
    rss_gt = run(L5DASK + ["gt", half, "-o", os.path.join(tmp, "gt-half.csv"), "--mask", chopped_mask(half), "-q"])[1]
    print(
        f"  peak RSS at {n_half:,} agents ({scenes // 2} scenes): select-agents {rss_sel:.2f} GB, gt --mask {rss_gt:.2f} GB "
        f"(at {n:,}: {max(r for _, r in sel):.2f} GB, {max(r for _, r in gt):.2f} GB)"
    )
    best_sel = min(w for w, _ in sel)
    print(
        f"  L5Kit get_valid_agents, 20 scenes: {mask_s:.2f} s -> {l5kit_mask:.0f} s scaled to {scenes} scenes "
        f"(one process) = {l5kit_mask / best_sel:.0f}x l5dask select-agents (target >= 20x)"
    )
    figures["select_agents_l5kit_x"] = round(l5kit_mask / best_sel)
    return figures


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=500_000)
    ap.add_argument("--scenes", type=int, default=1700)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--part", choices=["all", "evaluate", "dataset"], default="all")
    ap.add_argument("--record", action="store_true", help="write the figures to docs/figures/evaluation.json")
    a = ap.parse_args()
    figures = {}
    if a.part in ("all", "evaluate"):
        figures.update(bench_evaluate(a.rows, a.rounds))
    if a.part in ("all", "dataset"):
        figures.update(bench_dataset(a.scenes, a.rounds))
    if a.record:
        ran = "python benchmarks/evaluation_benchmark.py " + " ".join(sys.argv[1:])
        print("recorded", record("evaluation", ran.strip(), figures, f"{a.rows:,} rows, {a.scenes} scenes"))


if __name__ == "__main__":
    main()
