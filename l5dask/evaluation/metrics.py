"""L5Kit's eight metrics of a GT/PRED pair, vectorized over rows, in one parallel pass.

The pass: both files' rows are found by the row scan (:func:`l5dask.evaluation.csvfiles.scanned`,
numpy on the raw bytes); the keys are joined on the pair ``(timestamp, track_id)`` (L5Kit joins
on the string ``track_id + timestamp``, where track 1 at timestamp 23 and track 12 at timestamp 3
collide); then a task per range of GT rows parses them and the PRED rows joined to them (one
ranged read per run of consecutive PRED rows: a single read when the files share their order,
as L5Kit writes them), computes every row's metrics as L5Kit's ``metrics.py`` defines them and
returns sums, by group when breakdowns are asked. Only sums travel; no file is held in memory.

The one numeric difference: a row whose NLL rounds below zero (no available step and two or more
non-zero confidences: about -1e-17) makes L5Kit's RMSE NaN, and with it the mean of the file;
here that row's ``2 nll / T`` is clamped at 0.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from l5dask.core.engine import Combine, Job
from l5dask.core.lazy import compiled
from l5dask.core.policy import where_keywords
from l5dask.evaluation import csvfiles
from l5dask.evaluation.breakdown import SHOW_KEYS, agent_groups
from l5dask.evaluation.csvfiles import (
    MAX_MODES,
    CSVError,
    CSVFile,
    open_csv,
    parse_rows,
    row_groups,
)

_row_metrics = compiled("l5dask.evaluation._metrics").row_metrics

#: L5Kit's metric functions, in the order of the JSON.
METRICS = (
    "neg_multi_log_likelihood",
    "rmse",
    "prob_true_mode",
    "time_displace",
    "average_displacement_error_oracle",
    "average_displacement_error_mean",
    "final_displacement_error_oracle",
    "final_displacement_error_mean",
)
#: Bins of the NLL histogram (log-spaced; the first bin holds everything below 1e-3, the last
#: everything above 1e6: every row is counted).
NLL_BINS = np.concatenate([[0.0], np.logspace(-3, 6, 91)])
#: Keys printed when a pair does not match.


def row_metrics(gt: np.ndarray, avail: np.ndarray, pred: np.ndarray, conf: np.ndarray) -> dict[str, np.ndarray]:
    """Every row's metrics: ``gt`` (n, T, 2), ``avail`` (n, T), ``pred`` (n, M, T, 2), ``conf`` (n, M),
    with L5Kit's definitions, element for element (one compiled loop over the rows)."""

    n, m, t = pred.shape[0], pred.shape[1], pred.shape[2]
    out = {k: np.empty(n) for k in METRICS if k not in ("prob_true_mode", "time_displace")}
    out["prob_true_mode"], out["time_displace"] = np.empty((n, m)), np.empty((n, t))
    f8 = [np.asarray(a, np.float64) for a in (gt, avail, pred, conf)]
    with np.errstate(all="ignore"):
        _row_metrics(*f8, *(out[k] for k in METRICS))
    return {k: out[k] for k in METRICS}


def _sums(values: dict[str, np.ndarray], groups: dict[str, tuple[np.ndarray, int]]) -> dict[str, Any]:
    """Sums of each metric over the rows, and per group of each breakdown."""
    out: dict[str, Any] = {
        "rows": len(values["rmse"]),
        "sum": {k: v.sum(axis=0) for k, v in values.items()},
        # (an NLL is >= 0; a row without a step rounds to -2e-16: first bin, as those above the last
        # edge go to the last)
        "nll_hist": np.histogram(np.clip(values["neg_multi_log_likelihood"], 0.0, NLL_BINS[-1]), NLL_BINS)[0],
    }
    for name, (codes, n) in groups.items():
        g = {"rows": np.bincount(codes, minlength=n)}
        for k, v in values.items():
            if v.ndim == 1:
                g[k] = np.bincount(codes, weights=v, minlength=n)
            else:
                g[k] = np.stack([np.bincount(codes, weights=v[:, j], minlength=n) for j in range(v.shape[1])], axis=1)
        out[name] = g
    return out


def _no_rows(future_len: int, max_modes: int, groups: dict) -> dict[str, Any]:
    """The sums of no rows (the identity of the metrics' reduction)."""
    return _sums(
        row_metrics(
            np.zeros((0, future_len, 2)),
            np.zeros((0, future_len)),
            np.zeros((0, max_modes, future_len, 2)),
            np.zeros((0, max_modes)),
        ),
        {k: (c, n) for k, (c, n) in groups.items()},
    )


def _add(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {k: (_add(a[k], b[k]) if isinstance(a[k], dict) else a[k] + b[k]) for k in a}


def _check_confs(conf: np.ndarray, f: CSVFile, rows: np.ndarray) -> None:
    sums = conf.sum(axis=1)
    bad = ~np.isclose(sums, 1.0)  # L5Kit: np.allclose(np.sum(confidences), 1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise CSVError(f"{f.path}: line {int(rows[i]) + 2}: the confidences sum to {float(sums[i])!r}, not 1")
    neg = conf < 0  # summing to 1 or not: L5Kit takes their log, and every probabilistic metric is NaN
    if neg.any():
        i, j = (int(k[0]) for k in np.nonzero(neg))
        raise CSVError(
            f"{f.path}: line {int(rows[i]) + 2}: conf_{j} is negative ({float(conf[i, j])!r}): a confidence is a "
            "probability, in [0, 1]"
        )


def _pair_task(
    gt: CSVFile,
    pred: CSVFile,
    lo: int,
    hi: int,
    span: tuple[int, int],
    pred_rows: np.ndarray,
    segments: list[tuple[int, int, tuple[int, int]]],
    groups: dict[str, tuple[np.ndarray, int]],
) -> dict[str, Any]:
    """Metrics sums of GT rows ``[lo, hi)`` (bytes ``span``), joined to PRED rows ``pred_rows`` (read
    as ``segments``: rows and bytes). Both files bare (:meth:`CSVFile.bare`)."""
    got = pred.read_ranges([s for _, _, s in segments])  # (asked for now, all at once)
    g = parse_rows(gt, lo, hi, span)
    parts = [parse_rows(pred, a, b, s, next(got)) for a, b, s in segments]
    if len(parts) == 1 and np.array_equal(pred_rows, np.arange(*segments[0][:2])):  # PRED in GT's order
        conf, coords = parts[0].confs, parts[0].coords
    else:
        firsts = np.array([a for a, _, _ in segments], np.int64)
        offset = np.cumsum([0] + [b - a for a, b, _ in segments])
        seg = np.searchsorted(firsts, pred_rows, side="right") - 1  # each row's segment (they cover every row)
        pos = pred_rows - firsts[seg] + offset[seg]
        conf = np.concatenate([p.confs for p in parts])[pos]
        coords = np.concatenate([p.coords for p in parts])[pos]
    assert conf is not None and g.avails is not None  # predictions' rows carry confidences; GT rows availabilities
    _check_confs(conf, pred, pred_rows)
    return _sums(row_metrics(g.coords, g.avails, coords, conf), groups)


def _segments(rows: np.ndarray, gap: int = 64) -> list[tuple[int, int]]:
    """Runs of sorted row numbers, merged across gaps of fewer than ``gap`` rows."""
    u = np.unique(rows)
    if len(u) == 0:
        return []
    cut = np.flatnonzero(np.diff(u) > gap) + 1
    firsts = u[np.r_[0, cut]]
    lasts = u[np.r_[cut - 1, len(u) - 1]]
    return [(int(a), int(b) + 1) for a, b in zip(firsts, lasts)]


def _keys_text(ts: np.ndarray, tid: np.ndarray, idx: np.ndarray) -> str:
    shown = ", ".join(f"(timestamp {ts[i]}, track {tid[i]})" for i in idx[:SHOW_KEYS])
    return shown + (", ..." if len(idx) > SHOW_KEYS else "")


def _duplicates(f: CSVFile) -> None:
    order = np.lexsort((f.track_ids, f.timestamps))
    ts, tid = f.timestamps[order], f.track_ids[order]
    same = (ts[1:] == ts[:-1]) & (tid[1:] == tid[:-1])
    if same.any():
        i = np.flatnonzero(same)
        rows = np.sort(np.stack([order[i], order[i + 1]], axis=1), axis=1)
        first = rows[np.argmin(rows[:, 1])]
        raise CSVError(
            f"{f.path}: {len(i)} duplicate (timestamp, track_id) rows, first: lines {first[0] + 2} and "
            f"{first[1] + 2} {_keys_text(f.timestamps, f.track_ids, first[:1])}"
        )


def join(gt: CSVFile, pred: CSVFile) -> np.ndarray:
    """For each GT row, the PRED row with the same ``(timestamp, track_id)``; every key must be in
    both files exactly once (else a :class:`CSVError` with the counts and the first keys)."""
    _duplicates(gt)
    _duplicates(pred)
    n, m = len(gt), len(pred)
    ts = np.concatenate([gt.timestamps, pred.timestamps])
    tid = np.concatenate([gt.track_ids, pred.track_ids])
    order = np.lexsort((np.r_[np.zeros(n, np.int8), np.ones(m, np.int8)], tid, ts))
    st, sk = ts[order], tid[order]
    pair = np.zeros(len(order), bool)
    if len(order) > 1:
        pair[:-1] = (st[1:] == st[:-1]) & (sk[1:] == sk[:-1])
    first = pair.copy()
    second = np.r_[False, pair[:-1]]
    alone = ~(first | second)
    missing = order[alone & (order < n)]
    unknown = order[alone & (order >= n)] - n
    if len(missing) or len(unknown):
        parts = []
        if len(missing):
            parts.append(
                f"{len(missing)} GT rows have no prediction: {_keys_text(gt.timestamps, gt.track_ids, np.sort(missing))}"
            )
        if len(unknown):
            parts.append(
                f"{len(unknown)} PRED rows are unknown to the GT: "
                f"{_keys_text(pred.timestamps, pred.track_ids, np.sort(unknown))}"
            )
        raise CSVError(f"{pred.path} does not match {gt.path}: " + "; ".join(parts))
    match = np.empty(n, np.int64)
    match[order[first]] = order[np.flatnonzero(first) + 1] - n
    return match


@where_keywords
def evaluate(
    gt_path: str,
    pred_path: str,
    max_modes: int = MAX_MODES,
    dataset: Any = None,
    storage_options: dict | None = None,
    scheduler: Any = None,
    task_bytes: int = 8 << 20,
) -> dict[str, Any]:
    """L5Kit's metrics of a GT/PRED pair (``compute_metrics_csv`` with its eight functions).

    Returns ``rows`` and each metric's mean over the rows (lists for ``prob_true_mode`` and
    ``time_displace``). With ``dataset`` (a path, URL or :class:`~l5dask.prediction.dataset.L5Dataset`),
    also ``by_label`` (the agent's most probable label at its current frame) and ``by_scene``:
    every metric's mean per group.
    ``scheduler``: where to run (a ``distributed.Client`` or its address, ``"threads"``...;
    default: the active client, else local threads); ``job=`` and ``client=`` are its old names
    (until the next release, with a ``FutureWarning``).
    """

    job = Job.of(scheduler)
    gt = open_csv(gt_path, "gt", storage_options=storage_options)
    pred = open_csv(pred_path, "pred", max_modes, storage_options)
    if gt.future_len != pred.future_len:
        raise CSVError(f"{pred_path} predicts {pred.future_len} steps, {gt_path} has {gt.future_len}")
    with csvfiles.scanned([gt, pred], job):  # (the scan's spill folder lives as long as the pass)
        return _evaluate(gt, pred, max_modes, dataset, storage_options, job, task_bytes)


def _evaluate(
    gt: CSVFile,
    pred: CSVFile,
    max_modes: int,
    dataset: Any,
    storage_options: dict | None,
    job: Job,
    task_bytes: int,
) -> dict[str, Any]:
    if not len(gt.timestamps):  # (L5Kit refuses it too: a scheduled job fed an empty file must not pass)
        raise CSVError(f"{gt.path}: no rows under its header: nothing to evaluate")
    match = join(gt, pred)
    groups: dict[str, tuple[np.ndarray, int]] = {}
    names: dict[str, list] = {}
    if dataset is not None:
        groups, names = agent_groups(dataset, gt.timestamps, gt.track_ids, job, storage_options)
    calls = []
    gt_bare, pred_bare = gt.bare(), pred.bare()  # (the tasks carry their rows' bytes, not the tables)
    for lo, hi in row_groups(gt, task_bytes):
        rows = match[lo:hi]
        segments = [(a, b, pred.span(a, b)) for a, b in _segments(rows)]
        codes = {k: (c[lo:hi], n) for k, (c, n) in groups.items()}
        calls.append((gt_bare, pred_bare, lo, hi, gt.span(lo, hi), rows, segments, codes))
    empty = functools.partial(_no_rows, gt.future_len, max_modes, groups)
    total = job.map_reduce(
        _pair_task, calls, Combine("l5-metrics", _add, empty), name="l5-metrics", remote=gt.remote or pred.remote
    )
    return result(total, names, gt.future_len, max_modes)


def _means(sums: dict[str, Any], rows) -> dict[str, Any]:
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            k: np.asarray(sums[k])
            / (np.asarray(rows).reshape(-1, *[1] * (np.ndim(sums[k]) - np.ndim(rows))) if np.ndim(rows) else rows)
            for k in METRICS
        }


def _json(v: Any) -> Any:
    v = np.asarray(v)
    if v.ndim == 0:
        f = float(v)
        return None if not np.isfinite(f) else f
    return [_json(x) for x in v]


def result(total: dict[str, Any], names: dict[str, list], future_len: int, max_modes: int) -> dict[str, Any]:
    """The JSON object of an evaluation: ``rows``, the eight means, breakdowns, histograms."""
    n = int(total["rows"])
    means = _means(total["sum"], n) if n else {k: np.full(np.shape(total["sum"][k]), np.nan) for k in METRICS}
    out: dict[str, Any] = {"rows": n, **{k: _json(means[k]) for k in METRICS}}
    for name, labels in names.items():
        g = total[name]
        per = _means(g, g["rows"])
        out[name] = [
            {"name": lab, "rows": int(r), **{k: _json(per[k][i]) for k in METRICS}}
            for i, (lab, r) in enumerate(zip(labels, g["rows"]))
            if r > 0
        ]
    out["nll_histogram"] = {"edges": NLL_BINS.tolist(), "counts": total["nll_hist"].astype(int).tolist()}
    out["future_len"], out["max_modes"] = future_len, max_modes
    return out
