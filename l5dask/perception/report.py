"""The perception report (``docs/perception.md``): every key from the resolved tables in
vectorized passes (bincounts over row indices), the ``lidar.*`` keys from a parallel pass over the
sweep files (:mod:`l5dask.perception.lidar`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from l5dask.core.policy import thread_pool
from l5dask.perception import joins, tables
from l5dask.perception.lidar import lidar_report
from l5dask.perception.lidar import points_in_boxes as count_points

#: Distance to the ego: edges 0, 5, ..., 200 m; the 41st count holds 200 m and beyond.
DISTANCE_EDGES = np.arange(0.0, 201.0, 5.0)


def _stats(values: np.ndarray) -> dict[str, Any]:
    if len(values) == 0:
        return {"min": 0, "max": 0, "mean": 0.0}
    return {"min": int(values.min()), "max": int(values.max()), "mean": float(values.mean())}


def _by_name(names: np.ndarray, counts: np.ndarray) -> dict[str, Any]:
    """Counts of rows keyed by their name (rows sharing a name add up), every name present."""
    out: dict[str, Any] = {}
    for name, c in zip(names, counts):
        out[name] = out.get(name, 0) + int(c)
    return out


def histogram(values: np.ndarray, edges: np.ndarray = DISTANCE_EDGES) -> list[int]:
    """Counts in ``[edges[i], edges[i + 1])``, the last one holding ``edges[-1]`` and beyond."""
    bins = np.searchsorted(edges, values, side="right") - 1
    return np.bincount(bins[bins >= 0], minlength=len(edges)).astype(int).tolist()


def tables_report(ds) -> dict[str, Any]:
    """Every report key but ``lidar.*``."""
    big = "sample_annotation"
    if ds.job is None or ds.job.client is None:
        # on this machine's threads (DuckDB, Arrow and our kernels release the GIL): the annotations
        # parse in one thread while the other tables parse and resolve and their keys are computed
        # (a pipeline, not two steps)
        with thread_pool(1, "l5dask-tables") as pool:
            pending = pool.submit(ds.load, [big])
            ds.load([n for n in tables.TABLES if n != big])
            part = _sample_keys(ds)
            pending.result()
    else:
        ds.load()  # a task per table on the cluster
        part = _sample_keys(ds)
    part.update(_annotation_keys(ds, part))
    report = {k: part.pop(k) for k in ("counts", "annotations", "instances", "scenes", "sample_data", "ego")}
    report.update(part)  # the private keys last
    return report


def _sample_keys(ds) -> dict[str, Any]:
    """The keys that need no annotation: samples, sample_data, the ego's path, instances per category."""
    t = {name: ds.table(name) for name in tables.TABLES if name != "sample_annotation"}
    smp, inst, cat = t["sample"], t["instance"], t["category"]
    cat_names = cat.strings("name")
    report: dict[str, Any] = {}
    report["instances"] = {
        "per_category": _by_name(cat_names, np.bincount(inst.links["category_token"], minlength=len(cat)))
    }
    scene_of_sample = smp.links["scene_token"]
    report["scenes"] = {"num_samples": np.bincount(scene_of_sample, minlength=len(t["scene"])).astype(int).tolist()}
    sensors = t["sensor"]
    sensor_of = joins.sensor_of_sample_data(ds)
    report["sample_data"] = {
        "per_channel": _by_name(sensors.strings("channel"), np.bincount(sensor_of, minlength=len(sensors))),
        "key_frames": int(t["sample_data"].numbers("is_key_frame", bool).sum()),
    }
    # the ego's path: consecutive samples of each scene's chain, both with a LIDAR_TOP pose
    _, ego = joins.ego_of_samples(ds)
    order = np.lexsort((smp.position, scene_of_sample))
    same = scene_of_sample[order][1:] == scene_of_sample[order][:-1]
    step = np.hypot(*(ego[order][1:, :2] - ego[order][:-1, :2]).T)
    ok = same & ~np.isnan(step)
    report["ego"] = {"total_distance_km": float(step[ok].sum()) / 1000}
    # for the figures (private: not in the JSON)
    starts = np.concatenate([[0], np.cumsum(np.bincount(scene_of_sample, minlength=len(t["scene"])))])
    report["_ego_paths"] = [ego[order][a:b, :2][::5] for a, b in zip(starts[:-1], starts[1:])]
    return report


def _annotation_keys(ds, part: dict[str, Any]) -> dict[str, Any]:
    """The keys of the annotations (and ``counts``, which needs them all)."""
    t = {name: ds.table(name) for name in tables.TABLES}
    ann, smp, inst, cat = t["sample_annotation"], t["sample"], t["instance"], t["category"]
    n_cat = len(cat)
    cat_names = cat.strings("name")
    report: dict[str, Any] = {"counts": {name: len(t[name]) for name in tables.TABLES}}

    ann_cat = joins.category_of_annotations(ds)
    per_cat = np.bincount(ann_cat, minlength=n_cat)
    report["annotations"] = a = {}
    a["per_category"] = _by_name(cat_names, per_cat)

    off, att = ann.lists["attribute_tokens"]
    owner = np.repeat(np.arange(len(ann)), np.diff(off))
    n_att = len(t["attribute"])
    pairs = np.sort(owner * max(n_att, 1) + att)  # an annotation counts once per attribute it lists
    pairs = pairs[np.r_[True, pairs[1:] != pairs[:-1]]] if len(pairs) else pairs
    a["per_attribute"] = _by_name(t["attribute"].strings("name"), np.bincount(pairs % max(n_att, 1), minlength=n_att))

    size = ann.vectors("size")
    sums = np.stack([np.bincount(ann_cat, weights=size[:, k], minlength=n_cat) for k in range(3)], 1)
    means: dict[str, list[float]] = {}
    for name in dict.fromkeys(cat_names):
        rows = cat_names == name
        n = per_cat[rows].sum()
        means[name] = (sums[rows].sum(0) / n).tolist() if n else [0.0, 0.0, 0.0]
    a["size_m"] = {"mean": means}

    per_sample = np.bincount(ann.links["sample_token"], minlength=len(smp))
    a["per_sample"] = _stats(per_sample)
    _, ego = joins.ego_of_samples(ds)
    ego_of_ann = ego[ann.links["sample_token"]]
    has = ~np.isnan(ego_of_ann[:, 0])
    d = np.hypot(*(ann.vectors("translation")[has, :2] - ego_of_ann[has, :2]).T)
    a["distance_to_ego_m"] = {"histogram": {"edges": DISTANCE_EDGES.tolist(), "counts": histogram(d)}}

    report["instances"] = dict(
        part["instances"], length=_stats(np.bincount(ann.links["instance_token"], minlength=len(inst)))
    )
    report["scenes"] = dict(
        part["scenes"],
        num_annotations=np.bincount(smp.links["scene_token"][ann.links["sample_token"]], minlength=len(t["scene"]))
        .astype(int)
        .tolist(),
    )
    report["_per_sample"] = per_sample  # for the figures (private: not in the JSON)
    return report


def perception_report(ds, lidar: bool = True, points_in_boxes: bool = False) -> dict[str, Any]:
    """The whole report: the tables' keys, then (``lidar``) the sweeps' keys from a parallel pass
    over their files, and (``points_in_boxes``) lidar points in each annotation's box per category."""
    report = tables_report(ds)
    if lidar or points_in_boxes:
        points: list = []
        report["lidar"] = lidar_report(ds, points)
        report["_points_per_sweep"] = points[0]
        if points_in_boxes:
            counts = count_points(ds)
            report["lidar"]["points_in_box"] = points_histograms(ds, counts)
    return report


#: Points in a box: edges 0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000 points; the last count holds more.
POINT_EDGES = np.array([0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000], float)


def points_histograms(ds, counts: np.ndarray) -> dict[str, Any]:
    cat = ds.table("category")
    names = cat.strings("name")
    ann_cat = joins.category_of_annotations(ds)
    out = {"edges": POINT_EDGES.tolist(), "per_category": {}}
    for name in dict.fromkeys(names):
        rows = np.isin(ann_cat, np.flatnonzero(names == name))
        out["per_category"][name] = histogram(counts[rows], POINT_EDGES)
    out["total"] = int(counts.sum())
    return out


def summary(report: dict[str, Any]) -> str:
    """A short human summary (the CLI prints it)."""
    c = report["counts"]
    a = report["annotations"]
    lines = [
        f"{c['scene']:,} scenes, {c['sample']:,} samples, {c['sample_annotation']:,} annotations of "
        f"{c['instance']:,} instances, {c['sample_data']:,} sample_data "
        f"({report['sample_data']['key_frames']:,} key frames)",
        "categories: " + ", ".join(f"{k} {v:,}" for k, v in sorted(a["per_category"].items(), key=lambda kv: -kv[1])),
        f"annotations per sample: {a['per_sample']['mean']:.1f} (max {a['per_sample']['max']}); "
        f"ego drove {report['ego']['total_distance_km']:.2f} km",
    ]
    if "lidar" in report:
        lid = report["lidar"]
        lines.append(
            f"lidar: {lid['sweeps']:,} sweeps, {lid['points']:,} points "
            f"({lid['points_per_sweep']['mean']:.0f} a sweep), {len(lid['missing_files'])} files missing"
        )
    return "\n".join(lines)
