"""3D detection evaluation: the Lyft SDK's mAP, exact, over tasks of samples.

The reference is the Lyft SDK's ``lyft_dataset_sdk/eval/detection/mAP_evaluation.py``, the metric of
the Lyft 3D Object Detection competition: for each IoU threshold, the mean over the ground truth's
classes of each class's average precision; the overall score is the mean over the thresholds. Its
rules, which l5dask keeps exactly:

- a class's predictions are visited in descending score (ties in input order: Python's stable
  sort); a prediction is compared with the ground-truth boxes of its class in its sample, and takes
  the one with the largest IoU (the first of equal ones) when that IoU is strictly above the
  threshold and that box is not matched yet; otherwise it is a false positive (no second choice);
- a box's ground polygon comes from its quaternion's rotation matrix (pyquaternion's, which
  normalises the quaternion): ``cos = R[0, 0]``, ``sin = R[0, 1]``; the 3D IoU is the ground
  polygons' intersection area times the height overlap, over the union of the volumes;
- recall is over the class's ground-truth boxes, precision the running ratio, their envelope
  summed over the recall steps.

Where the SDK says nothing or fails, l5dask decides (and the tests hold it): a predicted class the
ground truth does not have is an error naming it (the SDK fails on an assertion, or ignores it when
the class list comes from the ground truth); no ground truth at all is an error (every mAP would be
NaN); no prediction gives an AP of 0 for every class; a prediction on a sample without ground truth
of its class is a false positive (as in the SDK).

How: matching is independent per sample and class, so it runs as engine tasks over groups of
samples. A compiled pass (``match_boxes``) computes the IoUs (rotated rectangles clipped in float64,
candidate pairs found first by their corners' circles) and decides every threshold at once; a group
where an IoU lies within ``EPS`` of a threshold, or two IoUs within it of each other where the
choice matters, is decided again by the SDK's own arithmetic (pyquaternion and shapely's GEOS, as
the SDK calls them). Only each prediction's flags travel back; the curves are made in the SDK's
global order.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from l5dask.core.engine import Job
from l5dask.core.lazy import compiled
from l5dask.core.store import file_store
from l5dask.errors import FormatError, UsageError
from l5dask.perception import joins, tables

_compiled = compiled("l5dask.perception._kernels")
match_boxes = _compiled.match_boxes

#: The competition's IoU thresholds.
THRESHOLDS = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
#: IoUs closer than this to a threshold (or to each other, where the choice matters) are decided by
#: the SDK's own arithmetic. The compiled IoU differs from GEOS's by about 1e-15 here.
EPS = 1e-9
#: Samples per matching task (about 100 predictions a sample: tens of milliseconds a task).
SAMPLES_PER_TASK = 500

_JSON_GT = {
    "sample_token": "VARCHAR",
    "translation": tables.VEC,
    "size": tables.VEC,
    "rotation": tables.VEC,
    "name": "VARCHAR",
}
_JSON_PRED = {**_JSON_GT, "score": "DOUBLE"}


@dataclass
class Boxes:
    """Boxes of one file (or dataset), as columns: ``sample`` codes into ``samples`` (tokens),
    ``cls`` codes into ``classes`` (names), ``xyz``, ``size`` (width, length, height), ``rotation``
    (w, x, y, z), ``score`` (predictions), ``row`` (each box's JSON index or CSV line, for messages)."""

    where: str
    samples: np.ndarray
    sample: np.ndarray
    classes: np.ndarray
    cls: np.ndarray
    xyz: np.ndarray
    size: np.ndarray
    rotation: np.ndarray
    score: np.ndarray | None
    row: np.ndarray
    row_kind: str = "row"
    #: every sample the source lists (a CSV's rows, a dataset's samples); None: only those with boxes
    universe: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.sample)

    def at(self, i: int) -> str:
        return f"{self.where}: {self.row_kind} {int(self.row[i])}"


# --- reading -----------------------------------------------------------------------------------
def read_boxes(path: str, kind: str, storage_options: dict | None = None) -> Boxes:
    """The boxes of a detection file: the SDK's JSON list (``sample_token``, ``translation``,
    ``size``, ``rotation``, ``name``, and ``score`` for predictions) or the competition's CSV
    (``Id,PredictionString``; ``score x y z width length height yaw name`` a box, no score in
    ground truth). ``kind``: ``"gt"`` or ``"pred"``. Anything else is a one-line error naming the
    file, the row (JSON index or CSV line) and the field."""
    store, key = file_store(path, storage_options)
    if store.local:  # parsed in place (DuckDB reads the file; the type scan maps it)
        local = store.path(key)
        with open(local, "rb") as f:
            head = f.read(4096).lstrip()[:1]
        if head == b"[":
            return _from_json(local, path, kind)
    data = store.get(key, what="the detection file")
    if data.lstrip()[:1] == b"[":
        return _from_json(data, path, kind)
    return _from_csv(data, path, kind)


def _codes(values: Any) -> tuple[np.ndarray, np.ndarray]:
    """A string column as (its distinct values, sorted; each row's code into them)."""
    import pyarrow.compute as pc

    enc = pc.dictionary_encode(values).combine_chunks()
    names = np.asarray(enc.dictionary.to_pylist(), dtype=object)
    order = np.argsort(names, kind="stable")
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    return names[order], rank[np.asarray(enc.indices, np.int64)] if len(names) else np.zeros(len(values), np.int64)


def _from_json(data: bytes | str, where: str, kind: str) -> Boxes:
    import os

    import pyarrow.compute as pc

    columns = _JSON_PRED if kind == "pred" else _JSON_GT
    table = tables.parse(data, "detection", where, columns, threads=os.cpu_count() or 1)
    n = table.num_rows
    for col in columns:
        values = table.column(col)
        if values.null_count:
            row = int(np.flatnonzero(np.asarray(values.is_null()))[0])
            raise FormatError(f"{where}: row {row}: no {col} (a {'prediction' if kind == 'pred' else 'box'} needs one)")
    vec = {}
    for col, want in (("translation", 3), ("size", 3), ("rotation", 4)):
        values = table.column(col)
        lengths = np.asarray(pc.list_value_length(values).fill_null(-1))
        bad = np.flatnonzero(lengths != want)
        if len(bad):
            raise FormatError(f"{where}: row {int(bad[0])}: {col} has {lengths[bad[0]]} numbers, expected {want}")
        flat = pc.list_flatten(values)
        if flat.null_count:
            row = int(np.flatnonzero(np.asarray(flat.is_null()))[0] // want)
            raise FormatError(f"{where}: row {row}: {col} holds a null")
        vec[col] = np.asarray(flat, np.float64).reshape(n, want)
    samples, sample = _codes(table.column("sample_token"))
    classes, cls = _codes(table.column("name"))
    score = np.asarray(table.column("score"), np.float64) if kind == "pred" else None
    boxes = Boxes(
        where,
        samples,
        sample,
        classes,
        cls,
        vec["translation"],
        vec["size"],
        vec["rotation"],
        score,
        np.arange(n, dtype=np.int64),
    )
    check_boxes(boxes)
    return boxes


def _from_csv(data: bytes, where: str, kind: str) -> Boxes:
    import csv

    per = 9 if kind == "pred" else 8
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    ids, counts, tokens, lines = [], [], [], []
    limit = csv.field_size_limit()
    csv.field_size_limit(2**31 - 1)  # (a sample's PredictionString may pass csv's 128 KB)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        try:
            header = next(reader)
        except StopIteration:
            raise FormatError(f"{where}: empty (expected the header Id,PredictionString)") from None
        if [h.strip() for h in header] != ["Id", "PredictionString"]:
            raise FormatError(f"{where}: line 1: the header is {','.join(header)[:60]!r}, expected Id,PredictionString")
        for row in reader:
            line = reader.line_num
            if not row:
                continue
            if len(row) != 2:
                raise FormatError(f"{where}: line {line}: {len(row)} fields, expected 2 (Id,PredictionString)")
            parts = row[1].split()
            if len(parts) % per:
                raise FormatError(
                    f"{where}: line {line}: PredictionString has {len(parts)} tokens, not a multiple of {per} "
                    f"({'score x y z width length height yaw class' if per == 9 else 'x y z width length height yaw class'})"
                )
            ids.append(row[0].strip())
            counts.append(len(parts) // per)
            tokens += parts
            lines.append(line)
    except csv.Error as exc:
        raise FormatError(f"{where}: line {reader.line_num}: not a CSV row ({exc})") from None
    finally:
        csv.field_size_limit(limit)
    universe = np.asarray(ids, dtype=object)
    dup = _first_duplicate(universe)
    if dup is not None:
        raise FormatError(f"{where}: the sample {dup} has two rows")
    counts_a = np.asarray(counts, np.int64)
    n = int(counts_a.sum())
    grid = np.asarray(tokens, dtype=object).reshape(n, per) if n else np.zeros((0, per), object)
    numbers = np.empty((n, per - 1), np.float64)
    names_of = ("score", "x", "y", "z", "width", "length", "height", "yaw")[9 - per :]
    box_line = np.repeat(np.asarray(lines, np.int64), counts_a)
    for j in range(per - 1):
        try:
            numbers[:, j] = np.asarray(grid[:, j], dtype=np.float64)
        except ValueError:
            for i in range(n):
                try:
                    float(grid[i, j])
                except ValueError:
                    raise FormatError(
                        f"{where}: line {box_line[i]}: box {i - _first_of_line(box_line, i)}: "
                        f"{names_of[j]} is {str(grid[i, j])[:30]!r}, not a number"
                    ) from None
    off = 1 if per == 9 else 0
    yaw = numbers[:, off + 6]
    samples, sample = (
        np.unique(np.repeat(universe, counts_a), return_inverse=True) if n else (universe[:0], np.zeros(0, np.int64))
    )
    classes, cls = (
        np.unique(grid[:, per - 1].astype(object), return_inverse=True) if n else (universe[:0], np.zeros(0, np.int64))
    )
    boxes = Boxes(
        where,
        samples,
        sample.astype(np.int64),
        classes,
        cls.astype(np.int64),
        numbers[:, off : off + 3].copy(),
        numbers[:, off + 3 : off + 6].copy(),
        yaw_quaternions(yaw),
        numbers[:, 0].copy() if per == 9 else None,
        box_line,
        "line",
        universe,
    )
    check_boxes(boxes, yaw)
    return boxes


def _first_of_line(box_line: np.ndarray, i: int) -> int:
    return int(np.searchsorted(box_line, box_line[i], side="left"))


def _first_duplicate(tokens: np.ndarray) -> str | None:
    if len(tokens) == 0:
        return None
    uniq, counts = np.unique(tokens, return_counts=True)
    return str(uniq[np.flatnonzero(counts > 1)[0]]) if (counts > 1).any() else None


def yaw_quaternions(yaw: np.ndarray) -> np.ndarray:
    """``Quaternion(axis=[0, 0, 1], angle=yaw).elements`` of each yaw, as the SDK's
    ``kaggle2nuscenes`` converts the competition's CSV (pyquaternion's own arithmetic)."""
    out = np.zeros((len(yaw), 4))
    for i, a in enumerate(yaw.tolist()):
        theta = a / 2.0
        s = math.sin(theta)
        out[i] = (math.cos(theta), 0.0 * s, 0.0 * s, 1.0 * s)
    return out


def check_boxes(b: Boxes, yaw: np.ndarray | None = None) -> None:
    """Finite numbers, positive sizes, scores in [0, 1], names present: the first bad box named."""
    checks = [
        ("translation", b.xyz),
        ("size", b.size),
        ("rotation" if yaw is None else "yaw", b.rotation if yaw is None else yaw[:, None]),
    ]
    if b.score is not None:
        checks.append(("score", b.score[:, None]))
    for name, values in checks:
        bad = ~np.isfinite(values).all(axis=1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise FormatError(f"{b.at(i)}: {name} is not finite ({values[i].tolist()})")
    bad = ~(b.size > 0).all(axis=1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise FormatError(f"{b.at(i)}: size must be positive, got {b.size[i].tolist()}")
    if b.score is not None:
        bad = (b.score < 0) | (b.score > 1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise FormatError(f"{b.at(i)}: score {float(b.score[i])!r} is outside [0, 1]")
    if "" in b.classes.tolist():
        i = int(np.flatnonzero(b.cls == b.classes.tolist().index(""))[0])
        raise FormatError(f"{b.at(i)}: the class name is empty")


def boxes_of_dataset(pds) -> tuple[Boxes, dict[str, np.ndarray]]:
    """The ground truth of a perception dataset (its ``sample_annotation`` rows, named by their
    instances' categories, as the SDK's loader gives them), every sample of the dataset as the
    samples it lists, and each sample's ego position (its key-frame ``LIDAR_TOP`` pose)."""
    ann = pds.table("sample_annotation")
    tokens = np.asarray(pds.table("sample").strings("token"), dtype=object)
    frame = pds.frame("sample_annotation", ["sample", "category_name"])
    sample = frame["sample"].to_numpy(np.int64)
    boxes = Boxes(
        f"{pds.url} (sample_annotation.json)",
        tokens,
        sample,
        *np.unique(frame["category_name"].to_numpy(object), return_inverse=True),
        ann.vectors("translation").astype(np.float64),
        ann.vectors("size").astype(np.float64),
        ann.vectors("rotation").astype(np.float64),
        None,
        np.arange(len(sample), dtype=np.int64),
        universe=tokens,
    )
    check_boxes(boxes)
    _, ego = joins.ego_of_samples(pds)
    return boxes, {"tokens": tokens, "ego": ego}


def take(b: Boxes, idx: np.ndarray) -> Boxes:
    """The boxes ``idx`` of ``b`` (indices, in that order, or a mask), same samples and classes."""
    return Boxes(
        b.where,
        b.samples,
        b.sample[idx],
        b.classes,
        b.cls[idx],
        b.xyz[idx],
        b.size[idx],
        b.rotation[idx],
        None if b.score is None else b.score[idx],
        b.row[idx],
        b.row_kind,
        b.universe,
    )


def distance_to_ego(b: Boxes, egos: dict[str, np.ndarray]) -> np.ndarray:
    """Each box's ground distance to its sample's ego (NaN where the sample has no ego pose)."""
    pos = np.searchsorted(egos["tokens"], b.samples) if len(egos["tokens"]) else np.zeros(len(b.samples), np.int64)
    known = (pos < len(egos["tokens"])) & (egos["tokens"][np.minimum(pos, len(egos["tokens"]) - 1)] == b.samples)
    ego = np.full((len(b.samples), 3), np.nan)
    ego[known] = egos["ego"][pos[known]]
    return np.hypot(*(b.xyz[:, :2] - ego[b.sample, :2]).T)


#: Distance-to-ego bands of the page's AP by distance (metres, [lo, hi)).
BANDS = ((0.0, 30.0), (30.0, 50.0), (50.0, math.inf))


def by_distance(pred: Boxes, gt: Boxes, egos: dict[str, np.ndarray], **kw) -> list[dict[str, Any]]:
    """The mAP of the boxes within each distance band of their sample's ego (ground truth and
    predictions filtered alike; a band without ground truth is left out)."""
    dp, dg = distance_to_ego(pred, egos), distance_to_ego(gt, egos)
    out = []
    for lo, hi in BANDS:
        keep_g = (dg >= lo) & (dg < hi)
        if not keep_g.any():
            continue
        g = take(gt, keep_g)
        keep_p = (dp >= lo) & (dp < hi) & np.isin(pred.classes, g.classes[np.unique(g.cls)])[pred.cls]
        r = evaluate(take(pred, keep_p), g, **kw)
        out.append({"band": [lo, hi], "map": r["map"], "mean_map": r["mean_map"], "gt_boxes": int(keep_g.sum())})
    return out


# --- geometry ----------------------------------------------------------------------------------
def box_table(b: Boxes, idx: np.ndarray, origin: np.ndarray) -> np.ndarray:
    """The compiled pass's 12 numbers of boxes ``idx``: ground corners (as the SDK makes them,
    relative to ``origin``, one (x, y) a box), z min, z max, volume, the corners' circle radius."""
    q = b.rotation[idx]
    norm = np.sqrt((q * q).sum(axis=1))
    q = np.where(norm[:, None] > 0, q / np.where(norm > 0, norm, 1.0)[:, None], 0.0)
    w, x, y, z = q.T
    cos = 1.0 - 2.0 * (y * y + z * z)  # R[0, 0] of the normalised quaternion
    sin = 2.0 * (x * y - w * z)  # R[0, 1]
    wid, length, height = b.size[idx].T
    cx, cy = b.xyz[idx, 0] - origin[:, 0], b.xyz[idx, 1] - origin[:, 1]
    lc, ls, wc, ws = length / 2 * cos, length / 2 * sin, wid / 2 * cos, wid / 2 * sin
    out = np.empty((len(idx), 12))
    out[:, 0], out[:, 1] = cx + lc + ws, cy + ls - wc
    out[:, 2], out[:, 3] = cx + lc - ws, cy + ls + wc
    out[:, 4], out[:, 5] = cx - lc - ws, cy - ls + wc
    out[:, 6], out[:, 7] = cx - lc + ws, cy - ls - wc
    out[:, 8] = b.xyz[idx, 2] - height / 2
    out[:, 9] = b.xyz[idx, 2] + height / 2
    out[:, 10] = wid * length * height
    out[:, 11] = np.hypot(wid, length) / 2 * np.maximum(1.0, np.hypot(cos, sin))
    return out


def _sdk_box(xyz, size, rotation):
    """The SDK's ``Box3D`` geometry of one box, with its own libraries and arithmetic."""
    from pyquaternion import Quaternion
    from shapely.geometry import Polygon

    rm = Quaternion(list(rotation)).rotation_matrix
    cos, sin = rm[0, 0], rm[0, 1]
    width, length, height = size
    cx, cy, cz = xyz
    p = [
        (cx + length / 2 * cos + width / 2 * sin, cy + length / 2 * sin - width / 2 * cos),
        (cx + length / 2 * cos - width / 2 * sin, cy + length / 2 * sin + width / 2 * cos),
        (cx - length / 2 * cos - width / 2 * sin, cy - length / 2 * sin + width / 2 * cos),
        (cx - length / 2 * cos + width / 2 * sin, cy - length / 2 * sin - width / 2 * cos),
    ]
    return Polygon([*p, p[0]]), cz - height / 2, cz + height / 2, np.prod(size)


def _sdk_iou(a, b) -> float:
    poly_a, lo_a, hi_a, vol_a = a
    poly_b, lo_b, hi_b, vol_b = b
    height = max(0, min(hi_b, hi_a) - max(lo_b, lo_a))
    inter = height * poly_a.intersection(poly_b).area
    return np.clip(inter / (vol_a + vol_b - inter), 0, 1)


def exact_group(pred: list, gt: list, thresholds) -> np.ndarray:
    """One sample and class decided with the SDK's own arithmetic: ``pred`` and ``gt`` are lists
    of ``(xyz, size, rotation)`` (predictions in matching order); flags (predictions, thresholds)."""
    gts = [_sdk_box(*g) for g in gt]
    out = np.zeros((len(pred), len(thresholds)), np.uint8)
    checked = np.zeros((len(thresholds), len(gts)), bool)
    for i, p in enumerate(pred):
        if not gts:
            continue
        box = _sdk_box(*p)
        overlaps = [_sdk_iou(box, g) for g in gts]
        top, jmax = np.max(overlaps), int(np.argmax(overlaps))
        for k, thr in enumerate(thresholds):
            if top > thr and not checked[k, jmax]:
                checked[k, jmax] = True
                out[i, k] = 1
    return out


# --- matching ----------------------------------------------------------------------------------
def match_task(
    pred: Boxes, gt: Boxes, pred_idx: np.ndarray, gt_idx: np.ndarray, pred_key, gt_key, thresholds
) -> np.ndarray:
    """The flags (len(pred_idx), thresholds) of predictions ``pred_idx`` (in matching order: by
    group, then rank), against ground truth ``gt_idx`` (by group, then input order); a group is a
    (class, sample) key."""
    thr = np.asarray(thresholds, np.float64)
    groups, starts = np.unique(pred_key, return_index=True)
    gt_lo = np.searchsorted(gt_key, groups, side="left")
    gt_hi = np.searchsorted(gt_key, groups, side="right")
    gt_counts = gt_hi - gt_lo
    gt_start = np.concatenate([[0], np.cumsum(gt_counts)]).astype(np.int64)
    gt_rows = gt_idx[np.repeat(gt_lo, gt_counts) + np.arange(int(gt_start[-1])) - np.repeat(gt_start[:-1], gt_counts)]
    pred_group = np.searchsorted(groups, pred_key).astype(np.int64)
    origin = pred.xyz[pred_idx[starts], :2]  # each group's first prediction
    tp = np.zeros((len(pred_idx), len(thr)), np.uint8)
    unsure = np.zeros(len(groups), np.uint8)
    if len(pred_idx):
        ptab = box_table(pred, pred_idx, origin[pred_group])
        gtab = box_table(gt, gt_rows, origin[np.repeat(np.arange(len(groups)), gt_counts)])
        match_boxes(ptab, pred_group, gtab, gt_start, thr, EPS, tp, unsure)
    for g in np.flatnonzero(unsure):
        rows = np.flatnonzero(pred_group == g)
        p = [(pred.xyz[i].tolist(), pred.size[i].tolist(), pred.rotation[i].tolist()) for i in pred_idx[rows]]
        q = [
            (gt.xyz[i].tolist(), gt.size[i].tolist(), gt.rotation[i].tolist())
            for i in gt_rows[gt_start[g] : gt_start[g + 1]]
        ]
        tp[rows] = exact_group(p, q, thresholds)
    return tp


def average_precision(tp: np.ndarray, num_gts: int) -> tuple[float, np.ndarray, np.ndarray]:
    """The SDK's ``recall_precision`` and ``get_ap`` of a class's flags in its global order."""
    tp_ = np.cumsum(tp.astype(np.float64))
    fp_ = np.cumsum(1.0 - tp.astype(np.float64))
    recalls = tp_ / float(num_gts)
    precisions = tp_ / np.maximum(tp_ + fp_, np.finfo(np.float64).eps)
    r = np.concatenate(([0.0], recalls, [1.0]))
    p = np.concatenate(([0.0], precisions, [0.0]))
    p = np.maximum.accumulate(p[::-1])[::-1]
    i = np.where(r[1:] != r[:-1])[0]
    return float(np.sum((r[i + 1] - r[i]) * p[i + 1])), recalls, precisions


def evaluate(
    pred: str | Boxes,
    gt: str | Boxes,
    iou_thresholds=THRESHOLDS,
    storage_options: dict | None = None,
    job: Any = None,
    client: Any = None,
    curves: bool = False,
    allow_unknown_samples: bool = False,
    samples_per_task: int = SAMPLES_PER_TASK,
) -> dict[str, Any]:
    """The Lyft SDK's detection mAP of predictions against ground truth (paths of JSON or CSV
    files, or :class:`~l5dask.perception.detection.Boxes`), every threshold in one pass.

    Returns ``thresholds``, ``classes`` (the ground truth's, sorted as ``get_class_names``),
    ``ap`` (per class, a value per threshold: ``get_average_precisions``), ``map`` (per threshold),
    ``mean_map`` (their mean: the competition's score), ``gt_boxes`` and ``predictions`` per class,
    and with ``curves`` each class's recall and precision per threshold.
    """
    thresholds = [float(t) for t in iou_thresholds]
    if not thresholds or any(not (0 <= t <= 1) for t in thresholds):
        raise UsageError(f"IoU thresholds must be in [0, 1], got {thresholds}")
    p = pred if isinstance(pred, Boxes) else read_boxes(pred, "pred", storage_options)
    g = gt if isinstance(gt, Boxes) else read_boxes(gt, "gt", storage_options)
    if len(g) == 0:
        raise FormatError(f"{g.where}: no ground-truth box: the mAP is not defined")
    classes = sorted(set(g.classes[np.unique(g.cls)].tolist()))
    known_cls = np.isin(p.classes, classes)
    if len(p) and not known_cls[p.cls].all():
        i = int(np.flatnonzero(~known_cls[p.cls])[0])
        raise FormatError(
            f"{p.at(i)}: the class {p.classes[p.cls[i]]!r} is not in the ground truth, whose classes are {', '.join(classes)}"
        )
    # samples: one code space for both files
    tokens = np.union1d(g.samples, p.samples)
    g_sample = np.searchsorted(tokens, g.samples)[g.sample] if len(g) else g.sample
    p_sample = np.searchsorted(tokens, p.samples)[p.sample] if len(p) else p.sample
    warnings = []
    if g.universe is not None and len(p):
        known = np.isin(p.samples, g.universe)
        if not known.all():
            n_unknown = int(np.isin(p.sample, np.flatnonzero(~known)).sum())
            first = int(np.flatnonzero(~known[p.sample])[0])
            if not allow_unknown_samples:
                raise FormatError(
                    f"{p.at(first)}: the sample {p.samples[p.sample[first]]} is not in the ground truth "
                    f"({n_unknown} prediction(s) on unknown samples; --allow-unknown-samples counts them as false positives)"
                )
            warnings.append(f"{n_unknown} prediction(s) on samples the ground truth does not list")
    names = np.asarray(classes, dtype=object)
    g_cls = np.searchsorted(names, g.classes)[g.cls]  # (a ground-truth name missing from names: never used)
    p_cls = np.searchsorted(names, p.classes)[p.cls] if len(p) else np.zeros(0, np.int64)
    nsamp = len(tokens)
    # the SDK's order: within a class, descending score, ties in input order
    if p.score is None:
        raise UsageError(f"{p.where}: predictions need scores")
    order = np.argsort(-p.score, kind="stable") if len(p) else np.zeros(0, np.int64)
    n = len(p)
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n)
    p_key = p_cls * nsamp + p_sample
    g_key = g_cls * nsamp + g_sample
    # tasks over groups of samples: predictions by (task, class and sample, rank), ground truth by
    # (task, class and sample, input order), each as one int64 key sorted once
    per = max(1, samples_per_task)
    nkeys = max(1, len(classes) * nsamp)
    p_by_task = np.argsort(((p_sample // per) * nkeys + p_key) * max(n, 1) + rank)
    g_by_task = np.argsort(((g_sample // per) * nkeys + g_key) * max(len(g), 1) + np.arange(len(g)))
    ntasks = (nsamp + per - 1) // per
    cuts = np.searchsorted(p_sample[p_by_task] // per, np.arange(ntasks + 1))
    g_cuts = np.searchsorted(g_sample[g_by_task] // per, np.arange(ntasks + 1))
    job = job or Job(client=client)
    remote = job.client is not None
    calls = []
    for t in range(ntasks):
        pi = p_by_task[cuts[t] : cuts[t + 1]]
        if not len(pi):
            continue
        gi = g_by_task[g_cuts[t] : g_cuts[t + 1]]
        if remote:  # (to a worker: only the task's boxes travel)
            calls.append(
                (
                    take(p, pi),
                    take(g, gi),
                    np.arange(len(pi)),
                    np.arange(len(gi)),
                    p_key[pi],
                    g_key[gi],
                    tuple(thresholds),
                )
            )
        else:  # (local threads share the columns)
            calls.append((p, g, pi, gi, p_key[pi], g_key[gi], tuple(thresholds)))
    tp = np.zeros((n, len(thresholds)), np.uint8)
    if calls:
        parts = job.map(match_task, calls, name="l5-detection-match")
        for t, part in zip((t for t in range(ntasks) if cuts[t + 1] > cuts[t]), parts):
            tp[p_by_task[cuts[t] : cuts[t + 1]]] = part
    # each class's predictions in the SDK's order: by (class, rank)
    by_class = np.argsort(p_cls * max(n, 1) + rank) if n else np.zeros(0, np.int64)
    class_cuts = np.searchsorted(p_cls[by_class], np.arange(len(classes) + 1))
    result: dict[str, Any] = {
        "thresholds": thresholds,
        "classes": classes,
        "ap": {},
        "gt_boxes": {c: int((g_cls == i).sum()) for i, c in enumerate(classes)},
        "predictions": {c: int((p_cls == i).sum()) for i, c in enumerate(classes)},
        "samples": {
            "ground_truth": int(len(g.universe) if g.universe is not None else len(g.samples)),
            "predicted": int(len(p.samples)),
        },
    }
    if curves:
        result["curves"] = {}
    for i, c in enumerate(classes):
        mine = by_class[class_cuts[i] : class_cuts[i + 1]]
        aps = []
        for k in range(len(thresholds)):
            if len(mine) == 0:
                aps.append(0.0)
                continue
            ap, recalls, precisions = average_precision(tp[mine, k], result["gt_boxes"][c])
            aps.append(ap)
            if curves:
                result["curves"].setdefault(c, []).append(
                    {"recall": recalls.tolist(), "precision": precisions.tolist()}
                )
        result["ap"][c] = aps
    result["map"] = [float(np.mean([result["ap"][c][k] for c in classes])) for k in range(len(thresholds))]
    result["mean_map"] = float(np.mean(result["map"]))
    if warnings:
        result["warnings"] = warnings
    return result


def summary(result: dict[str, Any]) -> str:
    """The metrics in a few lines: mAP per threshold and the classes' AP at the first."""
    t = result["thresholds"]
    lines = [f"mAP {result['mean_map']:.4f} (mean over IoU {', '.join(f'{x:g}' for x in t)})"]
    lines.append("mAP by threshold: " + ", ".join(f"{x:g}: {m:.4f}" for x, m in zip(t, result["map"])))
    lines.append(f"AP at IoU {t[0]:g}: " + ", ".join(f"{c} {result['ap'][c][0]:.3f}" for c in result["classes"]))
    return "\n".join(lines)
