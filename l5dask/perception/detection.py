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

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from l5dask.core.engine import Job
from l5dask.core.lazy import compiled
from l5dask.core.policy import where_keywords
from l5dask.errors import FormatError, UsageError
from l5dask.perception import boxes
from l5dask.perception.boxes import Boxes, boxes_of_dataset, check_boxes, read_boxes, take, yaw_quaternions
from l5dask.perception.geometry import (
    DEFAULT_GEOMETRY,
    EPS,
    GEOMETRIES,
    THRESHOLDS,
    check_geometry,
    sdk_box,
    sdk_iou,
    table,
)

__all__ = [
    "BANDS",
    "DEFAULT_GEOMETRY",
    "EPS",
    "GEOMETRIES",
    "THRESHOLDS",
    "Boxes",
    "ReadPlan",
    "average_precision",
    "boxes_of_dataset",
    "by_distance",
    "check_boxes",
    "distance_to_ego",
    "evaluate",
    "exact_group",
    "match_flags",
    "match_task",
    "read_boxes",
    "read_plan",
    "summary",
    "take",
    "yaw_quaternions",
]

_compiled = compiled("l5dask.perception._matching")
match_boxes = _compiled.match_boxes

#: Samples per matching task (about 100 predictions a sample: tens of milliseconds a task).
SAMPLES_PER_TASK = 500


def distance_to_ego(b: Boxes, egos: dict[str, np.ndarray]) -> np.ndarray:
    """Each box's ground distance to its sample's ego (NaN where the sample has no ego pose).
    ``egos``: ``tokens`` (in any order, as a dataset's ``sample`` table holds them) and each one's
    ``ego`` position."""
    order = np.argsort(egos["tokens"], kind="stable")  # a table's tokens are in no order
    tokens = egos["tokens"][order]
    pos = np.searchsorted(tokens, b.samples) if len(tokens) else np.zeros(len(b.samples), np.int64)
    known = (pos < len(tokens)) & (tokens[np.minimum(pos, len(tokens) - 1)] == b.samples)
    ego = np.full((len(b.samples), 3), np.nan)
    ego[known] = egos["ego"][order[pos[known]]]
    return np.hypot(*(b.xyz[:, :2] - ego[b.sample, :2]).T)


#: Distance-to-ego bands of the page's AP by distance (metres, [lo, hi)).
BANDS = ((0.0, 30.0), (30.0, 50.0), (50.0, math.inf))


def by_distance(pred: Boxes, gt: Boxes, egos: dict[str, np.ndarray], **kw) -> list[dict[str, Any]]:
    """The mAP of the boxes within each distance band of their sample's ego (ground truth and
    predictions filtered alike; a band without ground truth is left out). A band is ``[lo, hi]``
    in metres, ``hi`` None for the last, unbounded one (JSON has no infinity)."""
    dp, dg = distance_to_ego(pred, egos), distance_to_ego(gt, egos)
    out = []
    for lo, hi in BANDS:
        keep_g = (dg >= lo) & (dg < hi)
        if not keep_g.any():
            continue
        g = take(gt, keep_g)
        keep_p = (dp >= lo) & (dp < hi) & np.isin(pred.classes, g.classes[np.unique(g.cls)])[pred.cls]
        r = evaluate(take(pred, keep_p), g, **kw)
        out.append(
            {
                "band": [lo, hi if math.isfinite(hi) else None],
                "map": r["map"],
                "mean_map": r["mean_map"],
                "gt_boxes": int(keep_g.sum()),
            }
        )
    return out


def exact_group(pred: list, gt: list, thresholds, geometry: str = DEFAULT_GEOMETRY) -> np.ndarray:
    """One sample and class decided with the SDK's own arithmetic: ``pred`` and ``gt`` are lists
    of ``(xyz, size, rotation)`` (predictions in matching order); flags (predictions, thresholds)."""
    gts = [sdk_box(g[0], g[1], g[2], geometry) for g in gt]
    out = np.zeros((len(pred), len(thresholds)), np.uint8)
    checked = np.zeros((len(thresholds), len(gts)), bool)
    for i, p in enumerate(pred):
        if not gts:
            continue
        box = sdk_box(p[0], p[1], p[2], geometry)
        overlaps = [sdk_iou(box, g) for g in gts]
        top, jmax = np.max(overlaps), int(np.argmax(overlaps))
        for k, thr in enumerate(thresholds):
            if top > thr and not checked[k, jmax]:
                checked[k, jmax] = True
                out[i, k] = 1
    return out


# --- matching ----------------------------------------------------------------------------------
def match_task(
    pred: Boxes,
    gt: Boxes,
    pred_idx: np.ndarray,
    gt_idx: np.ndarray,
    pred_key,
    gt_key,
    thresholds,
    geometry: str = DEFAULT_GEOMETRY,
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
        ptab = table(pred.xyz[pred_idx], pred.size[pred_idx], pred.rotation[pred_idx], geometry, origin[pred_group])
        gorigin = origin[np.repeat(np.arange(len(groups)), gt_counts)]
        gtab = table(gt.xyz[gt_rows], gt.size[gt_rows], gt.rotation[gt_rows], geometry, gorigin)
        match_boxes(ptab, pred_group, gtab, gt_start, thr, EPS, tp, unsure)
    for g in np.flatnonzero(unsure):
        rows = np.flatnonzero(pred_group == g)
        p = [(pred.xyz[i].tolist(), pred.size[i].tolist(), pred.rotation[i].tolist()) for i in pred_idx[rows]]
        q = [
            (gt.xyz[i].tolist(), gt.size[i].tolist(), gt.rotation[i].tolist())
            for i in gt_rows[gt_start[g] : gt_start[g + 1]]
        ]
        tp[rows] = exact_group(p, q, thresholds, geometry)
    return tp


def average_precision(tp: np.ndarray, num_gts: int) -> np.ndarray:
    """The SDK's ``get_ap(*recall_precision(...))`` of a class's flags in its global order, every
    threshold at once (``tp``: thresholds x predictions), from the true positives alone.

    Its sum runs over the steps where recall changes, which are the true positives, and one last
    step to recall 1 (times the appended precision 0) unless recall reaches 1; its precision
    envelope at a true positive is the largest precision at that one or a later one (between them
    precision only falls). So the same terms, in the same order, go to the same ``np.sum``: the
    AP bit for bit, in time proportional to the true positives once they are found."""
    aps = np.empty(tp.shape[0])
    n_gt = float(num_gts)
    for k in range(tp.shape[0]):
        at = np.flatnonzero(tp[k]) + 1  # positions 1..n of the true positives
        hits = np.arange(1, len(at) + 1, dtype=np.float64)
        precision = hits / np.maximum(at.astype(np.float64), np.finfo(np.float64).eps)
        envelope = np.maximum.accumulate(precision[::-1])[::-1]
        recall = hits / n_gt
        terms = (recall - (hits - 1.0) / n_gt) * envelope
        if not len(recall) or recall[-1] != 1.0:
            terms = np.concatenate([terms, [0.0]])  # the last step to recall 1, at precision 0
        aps[k] = np.sum(terms)
    return aps


def curves_of(tp: np.ndarray, num_gts: int) -> list[dict[str, list[float]]]:
    """The SDK's recall and precision after each prediction, a curve per threshold."""
    hits = np.cumsum(tp, axis=1, dtype=np.float64)
    steps = np.maximum(np.arange(1, tp.shape[1] + 1, dtype=np.float64), np.finfo(np.float64).eps)
    return [{"recall": (h / float(num_gts)).tolist(), "precision": (h / steps).tolist()} for h in hits]


def match_flags(p: Boxes, g: Boxes, thresholds, geometry: str = DEFAULT_GEOMETRY) -> np.ndarray:
    """The flags (predictions, thresholds) of all of ``p`` against ``g`` (boxes of the same samples,
    each read in file order): each (sample, class)'s predictions in the SDK's order, descending
    score, ties in input order."""
    names = np.union1d(p.classes, g.classes)
    tokens = np.union1d(p.samples, g.samples)
    ns = max(len(tokens), 1)
    p_key = (
        (np.searchsorted(names, p.classes)[p.cls] * ns + np.searchsorted(tokens, p.samples)[p.sample])
        if len(p)
        else p.cls
    )
    g_key = (
        (np.searchsorted(names, g.classes)[g.cls] * ns + np.searchsorted(tokens, g.samples)[g.sample])
        if len(g)
        else g.cls
    )
    tp = np.zeros((len(p), len(thresholds)), np.uint8)
    if not len(p):
        return tp
    if p.score is None:
        raise UsageError(f"{p.where}: predictions need scores")
    order = np.argsort(-p.score, kind="stable")
    pi = order[np.argsort(p_key[order], kind="stable")]  # by (sample, class), then the SDK's order
    gi = np.argsort(g_key, kind="stable")
    tp[pi] = match_task(p, g, pi, gi, p_key[pi], g_key[gi], thresholds, check_geometry(geometry))
    return tp


@dataclass(frozen=True)
class ReadPlan:
    """How :func:`~l5dask.perception.detection.evaluate` reads its two inputs, chosen before any
    box is read: ``how`` is ``"blocks"`` (two JSON lists, each cut into ``Blocks``: ``pred`` and
    ``gt``, read by the tasks that match them) or ``"whole"`` (each input read, or taken, whole);
    ``why`` says why in a line.

    A plan of blocks rests on guesses that only the reading can check (the predictions grouped by
    sample, no seam inside a string, each run of ground truth the sample guessed): where one does
    not hold, the blocks' pass says so and the inputs are read whole (a warning says why)."""

    how: str
    why: str
    pred: boxes.Blocks | None = None
    gt: boxes.Blocks | None = None


def read_plan(
    pred: str | Boxes, gt: str | Boxes, storage_options: dict | None = None, block_bytes: int | None = None
) -> ReadPlan:
    """The :class:`~l5dask.perception.detection.ReadPlan` of ``evaluate(pred, gt)``, from what is
    known before reading: the inputs' kind (boxes given, or paths) and each file's first and last
    bytes and size (a JSON list ``[...]`` is cut into blocks of ``block_bytes``; a CSV, or anything
    else, is read whole)."""
    if not isinstance(pred, str) or not isinstance(gt, str):
        given = " and ".join(k for k, x in (("pred", pred), ("gt", gt)) if not isinstance(x, str))
        return ReadPlan("whole", f"boxes given ({given}), not files")
    pb = boxes.plan(pred, "pred", storage_options, block_bytes)
    if pb is None:
        return ReadPlan("whole", f"{pred}: not a JSON list (a CSV, or a fault the whole read names)")
    gb = boxes.plan(gt, "gt", storage_options, block_bytes)
    if gb is None:
        return ReadPlan("whole", f"{gt}: not a JSON list (a CSV, or a fault the whole read names)")
    return ReadPlan(
        "blocks",
        f"two JSON lists: {pb.n} block(s) of predictions and {gb.n} of ground truth, "
        f"{pb.stop - pb.first:,} and {gb.stop - gb.first:,} bytes",
        pb,
        gb,
    )


def _check_thresholds(iou_thresholds) -> list[float]:
    thresholds = [float(t) for t in iou_thresholds]
    if not thresholds or any(not (0 <= t <= 1) for t in thresholds):
        raise UsageError(f"IoU thresholds must be in [0, 1], got {thresholds}")
    return thresholds


@where_keywords
def evaluate(
    pred: str | Boxes,
    gt: str | Boxes,
    iou_thresholds=THRESHOLDS,
    storage_options: dict | None = None,
    scheduler: Any = None,
    curves: bool = False,
    allow_unknown_samples: bool = False,
    samples_per_task: int = SAMPLES_PER_TASK,
    block_bytes: int | None = None,
    geometry: str = DEFAULT_GEOMETRY,
    allow_unknown_classes: bool = False,
) -> dict[str, Any]:
    """The Lyft SDK's detection mAP of predictions against ground truth (paths of JSON or CSV
    files, or :class:`~l5dask.perception.boxes.Boxes`), every threshold in one pass.

    Two JSON files are read in blocks of ``block_bytes`` (default: the setting
    ``l5dask.detection.block-bytes``, 32 MiB: :doc:`/configuration`)
    by the tasks that match them, so that no process holds every box: this needs the predictions
    grouped by sample (each sample's boxes one after the other, as writers loop over samples);
    otherwise, and for CSV files or boxes given, the boxes are read whole (``warnings`` says why
    when it was not the caller's choice).

    Returns ``thresholds``, ``classes`` (the ground truth's, sorted as ``get_class_names``),
    ``ap`` (per class, a value per threshold: ``get_average_precisions``), ``map`` (per threshold),
    ``mean_map`` (their mean: the competition's score), ``gt_boxes`` and ``predictions`` per class,
    ``samples`` (counted), ``blocks`` (when read in blocks: how many of each file), ``geometry``
    (the boxes' geometry, see :mod:`l5dask.perception.geometry`: ``"corrected"``, the SDK's source
    since its PR #64, by default; ``"sdk-0.0.8"`` reproduces the PyPI release bit for bit), and
    with ``curves`` each class's recall and precision per threshold (a class without predictions
    too: no point, recall 0).

    A prediction of a class the ground truth has no box of is refused (a misspelt class), unless
    ``allow_unknown_classes``: then it is left out, as the SDK's ``get_average_precisions`` leaves it
    (a split without that class), and ``warnings`` counts them.

    ``scheduler``: where its tasks run (a ``distributed.Client`` or its address, ``"threads"``...;
    default: the active client, else local threads); ``job=`` and ``client=`` are its old names
    (until the next release, with a ``FutureWarning``).
    """
    thresholds = _check_thresholds(iou_thresholds)
    check_geometry(geometry)
    job = Job.of(scheduler)
    warnings: list[str] = []
    plan = read_plan(pred, gt, storage_options, block_bytes)
    if plan.how == "blocks":
        assert plan.pred is not None and plan.gt is not None
        result, fault = _in_blocks(
            plan.pred, plan.gt, thresholds, job, curves, geometry, allow_unknown_samples, allow_unknown_classes
        )
        if result is not None:
            return result
        warnings.append(f"read whole, not in blocks: {fault}")
    p = pred if isinstance(pred, Boxes) else read_boxes(pred, "pred", storage_options)
    g = gt if isinstance(gt, Boxes) else read_boxes(gt, "gt", storage_options)
    return _whole(
        p,
        g,
        thresholds,
        job,
        curves,
        allow_unknown_samples,
        samples_per_task,
        warnings,
        geometry,
        allow_unknown_classes,
    )


def _unknown_classes(names: list[str], n: int) -> str:
    """The warning of ``n`` predictions of classes the ground truth has no box of, left out."""
    return (
        f"{n} prediction(s) of classes the ground truth has no box of ({', '.join(names)}): left out, as the SDK does"
    )


def _whole(
    p: Boxes,
    g: Boxes,
    thresholds: list[float],
    job: Job,
    curves: bool,
    allow_unknown_samples: bool,
    samples_per_task: int,
    warnings: list[str],
    geometry: str,
    allow_unknown_classes: bool = False,
) -> dict[str, Any]:
    if len(g) == 0:
        raise FormatError(f"{g.where}: no ground-truth box: the mAP is not defined")
    classes = sorted(set(g.classes[np.unique(g.cls)].tolist()))
    known_cls = np.isin(p.classes, classes)
    if len(p) and not known_cls[p.cls].all():
        i = int(np.flatnonzero(~known_cls[p.cls])[0])
        if not allow_unknown_classes:
            raise FormatError(
                f"{p.at(i)}: the class {p.classes[p.cls[i]]!r} is not in the ground truth, whose classes are "
                f"{', '.join(classes)} (--allow-unknown-classes leaves such predictions out, as the SDK does)"
            )
        keep = known_cls[p.cls]
        unknown = sorted(set(p.classes[np.unique(p.cls[~keep])].tolist()))
        warnings.append(_unknown_classes(unknown, int((~keep).sum())))
        p = take(p, keep)
    if p.score is None:
        raise UsageError(f"{p.where}: predictions need scores")
    if len(p):  # (the samples a JSON ground truth lists: those with a box)
        unknown = ~np.isin(p.samples, g.universe if g.universe is not None else g.samples)[p.sample]
        if unknown.any():
            n_unknown = int(unknown.sum())
            first = int(np.flatnonzero(unknown)[0])
            if not allow_unknown_samples:
                raise FormatError(
                    f"{p.at(first)}: the sample {p.samples[p.sample[first]]} is not in the ground truth "
                    f"({n_unknown} prediction(s) on unknown samples; --allow-unknown-samples counts them as false positives)"
                )
            warnings.append(f"{n_unknown} prediction(s) on samples the ground truth does not list")
    # tasks over groups of samples: each matches its predictions against its ground truth
    tokens = np.union1d(g.samples, p.samples)
    per = max(1, samples_per_task)
    p_group = (np.searchsorted(tokens, p.samples)[p.sample] // per) if len(p) else p.sample
    g_group = (np.searchsorted(tokens, g.samples)[g.sample] // per) if len(g) else g.sample
    p_by = np.argsort(p_group, kind="stable")
    g_by = np.argsort(g_group, kind="stable")
    ngroups = (len(tokens) + per - 1) // per
    p_cuts = np.searchsorted(p_group[p_by], np.arange(ngroups + 1))
    g_cuts = np.searchsorted(g_group[g_by], np.arange(ngroups + 1))
    groups = [t for t in range(ngroups) if p_cuts[t + 1] > p_cuts[t]]
    calls = [
        (
            take(p, p_by[p_cuts[t] : p_cuts[t + 1]]),
            take(g, g_by[g_cuts[t] : g_cuts[t + 1]]),
            tuple(thresholds),
            geometry,
        )
        for t in groups
    ]
    tp = np.zeros((len(p), len(thresholds)), np.uint8)
    if calls:
        for t, part in zip(groups, job.map(match_flags, calls, name="l5-detection-match")):
            tp[p_by[p_cuts[t] : p_cuts[t + 1]]] = part
    names = np.asarray(classes, dtype=object)
    g_cls = np.searchsorted(names, g.classes)[g.cls]
    p_cls = np.searchsorted(names, p.classes)[p.cls] if len(p) else np.zeros(0, np.int64)
    samples = {
        "ground_truth": int(len(g.universe) if g.universe is not None else len(g.samples)),
        "predicted": int(len(p.samples)),
    }
    counts = np.bincount(g_cls, minlength=len(classes))
    return _result(classes, counts, p_cls, p.score, tp, thresholds, curves, samples, warnings, geometry)


def _result(
    classes: list[str],
    gt_counts: np.ndarray,
    p_cls: np.ndarray,
    score: np.ndarray,
    tp: np.ndarray,
    thresholds: list[float],
    curves: bool,
    samples: dict,
    warnings: list[str],
    geometry: str,
    extra: dict | None = None,
) -> dict[str, Any]:
    """The metrics from every prediction's class, score and flags (in input order)."""
    # each class's predictions in the SDK's order: descending score, ties in input order
    by_class = np.argsort(p_cls.astype(np.int16), kind="stable")  # (a radix sort)
    class_cuts = np.searchsorted(p_cls[by_class], np.arange(len(classes) + 1))
    result: dict[str, Any] = {
        "thresholds": thresholds,
        "classes": classes,
        "ap": {},
        "gt_boxes": {c: int(gt_counts[i]) for i, c in enumerate(classes)},
        "predictions": {c: int(class_cuts[i + 1] - class_cuts[i]) for i, c in enumerate(classes)},
        "samples": samples,
        "geometry": geometry,
        **(extra or {}),
    }
    if curves:
        result["curves"] = {}
    for i, c in enumerate(classes):
        mine = by_class[class_cuts[i] : class_cuts[i + 1]]
        if len(mine) == 0:  # no prediction: AP 0, a curve of one point, recall 0 and precision 0
            result["ap"][c] = [0.0] * len(thresholds)  # (the point where get_ap's curve starts)
            if curves:
                result["curves"][c] = [{"recall": [0.0], "precision": [0.0]} for _ in thresholds]
            continue
        mine = mine[np.argsort(-score[mine], kind="stable")]
        flags = np.ascontiguousarray(tp[mine].T)
        result["ap"][c] = average_precision(flags, result["gt_boxes"][c]).tolist()
        if curves:
            result["curves"][c] = curves_of(flags, result["gt_boxes"][c])
    result["map"] = [float(np.mean([result["ap"][c][k] for c in classes])) for k in range(len(thresholds))]
    result["mean_map"] = float(np.mean(result["map"]))
    if warnings:
        result["warnings"] = warnings
    return result


# --- in blocks -----------------------------------------------------------------------------------
def _class_counts(b: Boxes) -> dict[str, int]:
    counts = np.bincount(b.cls, minlength=len(b.classes)) if len(b) else np.zeros(0, np.int64)
    return {str(c): int(n) for c, n in zip(b.classes.tolist(), counts.tolist()) if n}


def block_flags(
    pb: boxes.Blocks, k: int, index: boxes.GroundIndex, thresholds: tuple, geometry: str = DEFAULT_GEOMETRY
) -> dict[str, Any]:
    """One block of predictions: read, its interior samples (all but its first and last, which may
    go on in the blocks beside) matched against their ground truth (read from its runs)."""
    p = boxes.read_block(pb, k)
    tokens = boxes.encode_tokens(p.samples)
    tp = np.zeros((len(p), len(thresholds)), np.uint8)
    if not len(p):
        return {"n": 0, "samples": tokens, "interior": tokens, "edges": tokens, "gt": {}}
    ends = np.unique(p.sample[[0, -1]])
    edge = np.isin(p.sample, ends)
    inner = np.setdiff1d(np.arange(len(p.samples)), ends)
    g = index.read(index.find(tokens[inner]))
    tp[~edge] = match_flags(take(p, ~edge), g, thresholds, geometry)
    return {
        "n": len(p),
        "unknown": int((index.find(tokens) < 0)[p.sample].sum()),
        "score": p.score,
        "names": p.classes,
        "cls": p.cls.astype(np.int32),
        "tp": tp,
        "samples": tokens,
        "interior": tokens[inner],
        "edges": tokens[ends],
        "edge_rows": np.flatnonzero(edge),
        "edge_boxes": take(p, edge),
        "gt": _class_counts(g),
    }


def ground_counts(index: boxes.GroundIndex, samples: np.ndarray) -> dict[str, int]:
    """The boxes of these ground-truth samples, read and checked, counted by class."""
    return _class_counts(index.read(samples))


def _in_blocks(
    pb: boxes.Blocks,
    gb: boxes.Blocks,
    thresholds: list[float],
    job: Job,
    curves: bool,
    geometry: str,
    allow_unknown_samples: bool = False,
    allow_unknown_classes: bool = False,
) -> tuple[dict[str, Any] | None, str]:
    """The result of a plan of blocks, or ``None`` and why: where a guess of the plan does not hold,
    or a block's strict parse fails, or a prediction's sample is not in the ground truth (the whole
    read names the fault, or cuts no box)."""
    try:
        return (
            _blocks_result(pb, gb, thresholds, job, curves, geometry, allow_unknown_samples, allow_unknown_classes),
            "",
        )
    except (boxes.Unsure, FormatError) as exc:
        return None, str(exc)


def _blocks_result(
    pb: boxes.Blocks,
    gb: boxes.Blocks,
    thresholds: list[float],
    job: Job,
    curves: bool,
    geometry: str,
    allow_unknown_samples: bool = False,
    allow_unknown_classes: bool = False,
) -> dict[str, Any]:
    remote = pb.store()[0].remote or gb.store()[0].remote  # (each task reads its block)
    index = boxes.GroundIndex.merge(
        gb, job.map(boxes.index_block, [(gb, k) for k in range(gb.n)], name="l5-detection-index", remote=remote)
    )
    calls = [(pb, k, index, tuple(thresholds), geometry) for k in range(pb.n)]
    outs = job.map(block_flags, calls, name="l5-detection-match", remote=remote)
    # a sample in several blocks must be at an end of each (the predictions grouped by sample)
    seen, times = np.unique(np.concatenate([o["samples"] for o in outs]), return_counts=True)
    split = seen[times > 1]
    if any(np.isin(o["interior"], split).any() for o in outs):
        raise boxes.Unsure(f"{pb.path}: the predictions are not grouped by sample")
    unknown = sum(o.get("unknown", 0) for o in outs)
    if unknown and not allow_unknown_samples:  # (the whole read names the first one)
        raise boxes.Unsure(f"{pb.path}: {unknown} prediction(s) on samples the ground truth does not list")
    # the blocks' ends: their predictions together (in file order), against their ground truth
    edges = np.unique(np.concatenate([o["edges"] for o in outs]))
    g_edges = index.read(index.find(edges))
    with_edges = [o for o in outs if o["n"]]
    flags = match_flags(boxes.concat([o["edge_boxes"] for o in with_edges], pb.path), g_edges, thresholds, geometry)
    at = 0
    for o in with_edges:
        o["tp"][o["edge_rows"]] = flags[at : at + len(o["edge_rows"])]
        at += len(o["edge_rows"])
    # the ground truth no prediction needed: read and checked too (its boxes count)
    owned = np.concatenate([o["interior"] for o in outs] + [edges])
    rest = np.setdiff1d(np.arange(len(index.tokens)), index.find(owned))
    per = max(1, len(rest) // max(1, gb.n))
    counts: dict[str, int] = {}
    for part in (
        [o["gt"] for o in outs]
        + [_class_counts(g_edges)]
        + (
            job.map(
                ground_counts,
                [(index, rest[i : i + per]) for i in range(0, len(rest), per)],
                name="l5-detection-truth",
                remote=remote,
            )
            if len(rest)
            else []
        )
    ):
        for c, n in part.items():
            counts[c] = counts.get(c, 0) + n
    if not counts:
        raise boxes.Unsure(f"{gb.path}: no ground-truth box")
    classes = sorted(counts)
    names = np.asarray(classes, dtype=object)
    p_cls, score, tp = [], [], []
    left_out: dict[str, int] = {}
    for o in with_edges:
        pos = np.searchsorted(names, o["names"])
        known = (pos < len(names)) & (names[np.minimum(pos, len(names) - 1)] == o["names"])
        keep = known[o["cls"]]
        if not keep.all():
            if not allow_unknown_classes:  # (the whole read names the first one)
                raise boxes.Unsure(f"{pb.path}: a class the ground truth does not have")
            for c, n in zip(*np.unique(np.asarray(o["names"], dtype=object)[o["cls"][~keep]], return_counts=True)):
                left_out[str(c)] = left_out.get(str(c), 0) + int(n)
        p_cls.append(pos[o["cls"]][keep])
        score.append(o["score"][keep])
        tp.append(o["tp"][keep])
    cat = lambda xs, z: np.concatenate(xs) if xs else z  # noqa: E731
    samples = {"ground_truth": int(len(index.tokens)), "predicted": int(len(seen))}
    return _result(
        classes,
        np.array([counts[c] for c in classes]),
        cat(p_cls, np.zeros(0, np.int64)),
        cat(score, np.zeros(0)),
        cat(tp, np.zeros((0, len(thresholds)), np.uint8)),
        thresholds,
        curves,
        samples,
        ([f"{unknown} prediction(s) on samples the ground truth does not list"] if unknown else [])
        + ([_unknown_classes(sorted(left_out), sum(left_out.values()))] if left_out else []),
        geometry,
        {"blocks": {"predictions": pb.n, "ground_truth": gb.n}},
    )


def summary(result: dict[str, Any]) -> str:
    """The metrics in a few lines: mAP per threshold and the classes' AP at the first."""
    t = result["thresholds"]
    lines = [
        f"mAP {result['mean_map']:.4f} (mean over IoU {', '.join(f'{x:g}' for x in t)}; "
        f"geometry {result.get('geometry', DEFAULT_GEOMETRY)})"
    ]
    lines.append("mAP by threshold: " + ", ".join(f"{x:g}: {m:.4f}" for x, m in zip(t, result["map"])))
    lines.append(f"AP at IoU {t[0]:g}: " + ", ".join(f"{c} {result['ap'][c][0]:.3f}" for c in result["classes"]))
    return "\n".join(lines)
