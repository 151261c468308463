"""3D-detection mAP: ``l5dask perception evaluate`` against the Lyft SDK and the parse floor.

    python benchmarks/detection_benchmark.py [--samples 20000] [--rounds 3] [--sdk-samples 100]

Generates (once, under benchmarks/data/) a detection set of ``--samples`` samples with about 50
ground-truth boxes and 100 predictions a sample (9 classes in the real mix; predictions near every
box, some twice, some missed, some of the wrong class, false positives near the boxes: realistic
overlaps), and the same at half the samples. Then, rounds interleaved:

- l5dask: ``l5dask perception evaluate PRED --gt GT`` as a whole process, the ten thresholds;
- (a) the SDK: ``get_average_precisions`` for the ten thresholds on the first ``--sdk-samples``
  samples (its time grows with the predictions: scaled by predictions per second);
- (b) the parse floor: both files read into columns by DuckDB's JSON reader (the declared fields,
  all threads), in a whole process too.

Printed: the best of each, l5dask's predictions per second against the SDK's, l5dask's time over
the floor's, and l5dask's peak RSS at both sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import DATA, run  # noqa: E402

CLASSES = ["car", "pedestrian", "bicycle", "truck", "bus", "other_vehicle", "motorcycle", "emergency_vehicle", "animal"]
SIZES = np.array(
    [
        (1.9, 4.7, 1.7),
        (0.7, 0.8, 1.8),
        (0.6, 1.8, 1.4),
        (2.8, 10, 3.4),
        (2.9, 12, 3.4),
        (2.6, 8, 3),
        (0.9, 2.3, 1.5),
        (2.4, 6.5, 2.5),
        (0.4, 0.8, 0.6),
    ]
)
MIX = np.array([60, 15, 5, 5, 2, 8, 2, 1, 2], float) / 100


def _records(tok, cls, xyz, size, yaw, score=None) -> list[str]:
    qw, qz = np.cos(yaw / 2).tolist(), np.sin(yaw / 2).tolist()
    xyz, size, cls = xyz.tolist(), size.tolist(), cls.tolist()
    score = None if score is None else score.tolist()
    out = []
    for i in range(len(cls)):
        s = "" if score is None else f', "score": {score[i]!r}'
        out.append(
            f'{{"sample_token": "{tok[i]}", "translation": [{xyz[i][0]!r}, {xyz[i][1]!r}, {xyz[i][2]!r}], '
            f'"size": [{size[i][0]!r}, {size[i][1]!r}, {size[i][2]!r}], "rotation": [{qw[i]!r}, 0.0, 0.0, {qz[i]!r}], '
            f'"name": "{CLASSES[cls[i]]}"{s}}}'
        )
    return out


def generate(samples: int, seed: int = 0) -> tuple[str, str]:
    gt_path, pred_path = str(DATA / f"detect-{samples}-gt.json"), str(DATA / f"detect-{samples}-pred.json")
    if os.path.exists(pred_path):
        return gt_path, pred_path
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    tokens = np.array([f"{rng.integers(2**62):016x}{s:08x}" for s in range(samples)], dtype=object)
    n_gt = rng.poisson(50, samples)
    s_gt = np.repeat(np.arange(samples), n_gt)
    origin = rng.uniform(-2000, 2000, (samples, 2))
    g = len(s_gt)
    cls = rng.choice(len(CLASSES), g, p=MIX)
    xyz = np.c_[rng.uniform(-60, 60, (g, 2)) + origin[s_gt], rng.normal(-20, 0.5, g)]
    size = SIZES[cls] * rng.uniform(0.85, 1.15, (g, 3))
    yaw = rng.uniform(-np.pi, np.pi, g)
    # predictions: each box found 0, 1 or 2 times, then false positives to about 100 a sample
    times = rng.choice([0, 1, 1, 1, 2], g)
    src = np.repeat(np.arange(g), times)
    m = len(src)
    p_cls = np.where(rng.random(m) < 0.05, rng.integers(len(CLASSES), size=m), cls[src])
    p_xyz = xyz[src] + rng.normal(0, [0.15, 0.15, 0.08], (m, 3))
    p_size = (size[src] * rng.normal(1, 0.05, (m, 3))).clip(0.1)
    p_yaw = yaw[src] + rng.normal(0, 0.05, m)
    p_score = np.round(rng.uniform(0.2, 1, m), 4)
    n_fp = np.maximum(0, 100 - np.bincount(s_gt[src], minlength=samples))
    f_s = np.repeat(np.arange(samples), n_fp)
    f = len(f_s)
    f_cls = rng.choice(len(CLASSES), f, p=MIX)
    near = rng.integers(0, np.maximum(n_gt[f_s], 1)) + np.r_[0, np.cumsum(n_gt)[:-1]][f_s]
    f_xy = np.where(
        (rng.random(f) < 0.6)[:, None] & (n_gt[f_s] > 0)[:, None],
        xyz[np.minimum(near, g - 1), :2],
        origin[f_s] + rng.uniform(-60, 60, (f, 2)),
    )
    f_xyz = np.c_[f_xy + rng.normal(0, 1.5, (f, 2)), rng.normal(-20, 0.5, f)]
    f_size = SIZES[f_cls] * rng.uniform(0.8, 1.2, (f, 3))
    f_yaw = rng.uniform(-np.pi, np.pi, f)
    f_score = np.round(rng.uniform(0, 0.7, f), 4)
    with open(gt_path, "w") as out:
        out.write("[" + ",\n".join(_records(tokens[s_gt], cls, xyz, size, yaw)) + "]")
    order = np.argsort(np.r_[s_gt[src], f_s], kind="stable")
    all_tok = tokens[np.r_[s_gt[src], f_s]][order]
    recs = _records(
        all_tok,
        np.r_[p_cls, f_cls][order],
        np.r_[p_xyz, f_xyz][order],
        np.r_[p_size, f_size][order],
        np.r_[p_yaw, f_yaw][order],
        np.r_[p_score, f_score][order],
    )
    with open(pred_path, "w") as out:
        out.write("[" + ",\n".join(recs) + "]")
    print(
        f"generated {samples:,} samples: {g:,} boxes, {len(recs):,} predictions in {time.perf_counter() - t0:.0f} s",
        flush=True,
    )
    return gt_path, pred_path


SDK = """
import json, sys, time
import numpy as np
from lyft_dataset_sdk.eval.detection.mAP_evaluation import get_average_precisions, get_class_names
gt, pred = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
keep = set(sorted({b["sample_token"] for b in gt})[: int(sys.argv[3])])
gt = [b for b in gt if b["sample_token"] in keep]
pred = [b for b in pred if b["sample_token"] in keep]
classes = get_class_names(gt)
t = time.perf_counter()
for thr in (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95):
    get_average_precisions(gt, pred, classes, thr)
print(len(pred), time.perf_counter() - t)
"""

FLOOR = """
import sys, duckdb
cols = {"sample_token": "VARCHAR", "translation": "DOUBLE[]", "size": "DOUBLE[]", "rotation": "DOUBLE[]", "name": "VARCHAR"}
for path, extra in ((sys.argv[1], {}), (sys.argv[2], {"score": "DOUBLE"})):
    duckdb.read_json(path, format="array", columns={**cols, **extra}).to_arrow_table()
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sdk-samples", type=int, default=100)
    args = parser.parse_args()
    big = generate(args.samples)
    half = generate(args.samples // 2, seed=1)
    n_pred = sum(1 for _ in open(big[1]))
    l5 = [sys.executable, "-m", "l5dask.cli", "perception", "evaluate"]
    ours, floor, rss_half = [], [], 0.0
    for r in range(args.rounds):
        ours.append(run(l5 + [big[1], "--gt", big[0], "-o", "/tmp/l5dask-detect.json", "-q"]))
        floor.append(run([sys.executable, "-c", FLOOR, *big]))
        if r == 0:
            rss_half = run(l5 + [half[1], "--gt", half[0], "-o", "/tmp/l5dask-detect-half.json", "-q"])[1]
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", SDK, *big, str(args.sdk_samples)], capture_output=True, text=True, check=True
    )
    sdk_n, sdk_s = out.stdout.split()
    sdk_rate = int(sdk_n) / float(sdk_s)
    best, fbest = min(w for w, _ in ours), min(w for w, _ in floor)
    print(f"{args.samples:,} samples, {n_pred:,} predictions, 10 IoU thresholds, {os.cpu_count()} cores")
    print(
        f"  l5dask perception evaluate: {best:.2f} s best of {args.rounds} ({', '.join(f'{w:.2f}' for w, _ in ours)}), {n_pred / best:,.0f} predictions/s"
    )
    print(
        f"  (a) the SDK on {args.sdk_samples} samples: {int(sdk_n):,} predictions in {float(sdk_s):.1f} s = {sdk_rate:,.0f} predictions/s -> l5dask {n_pred / best / sdk_rate:,.0f}x"
    )
    print(f"  (b) parse floor (DuckDB, both files): {fbest:.2f} s -> l5dask {best / fbest:.2f}x")
    print(
        f"  peak RSS: {max(m for _, m in ours):.2f} GB at {args.samples:,} samples, {rss_half:.2f} GB at {args.samples // 2:,}"
    )
    json.dumps({})


if __name__ == "__main__":
    main()
