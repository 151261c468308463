"""L5Kit's agents mask (``select_agents``), vectorized over whole scenes, chunk-parallel.

Per agent, L5Kit counts how many consecutive past and future frames of its track are "valid"
with it (``l5kit/dataset/select_agents.py``). The same rule as array operations:

- *point-wise*: the label filter (``sum of the 13 agent-like label probabilities > threshold``,
  summed in float32 as numpy does) and the distance to the ego (``np.linalg.norm`` of the 2-vector:
  numpy's ``dot`` fuses the multiply-add on FMA hardware, so the compiled kernel does too) below
  ``distance_m``; an agent failing either gets ``(0, 0)`` and ends its track's run;
- *pair-wise*, with the previous occurrence of the same track in the scene when that one passed
  the point-wise filters: the very next frame (no hole), the yaw change
  (``angular_distance``, in float32 as L5Kit's scalars) under ``yaw_degrees``, the ratio of the
  extents' areas under ``extent_ratio`` (areas under 0.01 m^2 fail); a failure starts a new run at
  the agent.

Agents sorted by (scene, track, row), a run is a stretch of valid agents without a start; the
past count is the position in its run, the future count what follows it. A run never leaves
its scene, so a task that reads whole scenes is exact: each task owns a range of output rows
(whole 10,000-row chunks of the mask), reads the scenes that overlap it (at most a partial scene
more at each end) and writes its chunks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import format as fmt
from ..errors import L5DaskError

#: L5Kit's defaults (``select_agents.py``).
TH_YAW_DEGREE = 30
TH_EXTENT_RATIO = 1.1
TH_DISTANCE_AV = 50
#: L5Kit's ``PERCEPTION_LABELS_TO_KEEP`` (``l5kit/data/filter.py``): the agent-like labels.
LABELS_TO_KEEP = (
    "PERCEPTION_LABEL_CAR", "PERCEPTION_LABEL_VAN", "PERCEPTION_LABEL_TRAM", "PERCEPTION_LABEL_BUS",
    "PERCEPTION_LABEL_TRUCK", "PERCEPTION_LABEL_EMERGENCY_VEHICLE", "PERCEPTION_LABEL_OTHER_VEHICLE",
    "PERCEPTION_LABEL_BICYCLE", "PERCEPTION_LABEL_MOTORCYCLE", "PERCEPTION_LABEL_CYCLIST",
    "PERCEPTION_LABEL_MOTORCYCLIST", "PERCEPTION_LABEL_PEDESTRIAN", "PERCEPTION_LABEL_ANIMAL",
)
KEEP = np.array([fmt.LABELS.index(name) for name in LABELS_TO_KEEP])
#: Why an agent was rejected (L5Kit's report keys), by code 1..5.
REJECTS = ("reject_th_agent_filter_probability_threshold", "reject_th_AV_distance", "reject_th_hole",
           "reject_th_yaw", "reject_th_extent")
#: The rows and columns of L5Kit's past/future table.
TABLE_STEPS = (0, 10, 30, 50)
#: Rows per chunk of an agents mask (L5Kit's).
MASK_CHUNK_ROWS = 10_000
MASK_DTYPE = np.dtype([("value", "<u4", (2,))])


@dataclass(frozen=True)
class Thresholds:
    """L5Kit's ``select_agents`` arguments."""

    threshold: float = 0.5
    yaw_degrees: float = TH_YAW_DEGREE
    extent_ratio: float = TH_EXTENT_RATIO
    distance_m: float = TH_DISTANCE_AV


def label_filter(label_probabilities: np.ndarray, threshold: float) -> np.ndarray:
    """L5Kit's ``_get_label_filter``: the same numpy expression (same float32 summation order)."""
    return np.sum(label_probabilities[:, KEEP], axis=1) > threshold


# --- the data of whole scenes --------------------------------------------------------------------
@dataclass
class SceneSpan:
    """Rows of the whole scenes ``[s0, s1)``: frames ``[f0, f1)`` and agents ``[a0, a1)``; each
    frame's scene (relative) comes from ``frames_per_scene``."""

    s0: int
    s1: int
    f0: int
    f1: int
    a0: int
    a1: int
    frames_per_scene: np.ndarray


@dataclass
class SceneData:
    """The decoded rows of a :class:`SceneSpan` and, per agent, its frame and scene (absolute)."""

    span: SceneSpan
    agents: np.ndarray
    frames: np.ndarray
    frame: np.ndarray
    scene: np.ndarray


def read_span(agents: Any, frames: Any, span: SceneSpan) -> SceneData:
    """Decode the frames and agents of whole scenes (one ranged read of each array)."""
    fr = frames.read_rows(span.f0, span.f1, np.empty(span.f1 - span.f0, frames.dtype))
    ag = agents.read_rows(span.a0, span.a1, np.empty(span.a1 - span.a0, agents.dtype))
    iv = fr["agent_index_interval"].reshape(-1, 2).astype(np.int64)
    lengths = iv[:, 1] - iv[:, 0]
    if len(iv) and (iv[0, 0] != span.a0 or iv[-1, 1] != span.a1 or (iv[1:, 0] != iv[:-1, 1]).any()):
        raise L5DaskError(f"{frames.name}: frames {span.f0}..{span.f1} do not cover agents {span.a0}..{span.a1} "
                          "contiguously (broken intervals)")
    frame = np.repeat(np.arange(span.f0, span.f1, dtype=np.int64), lengths)
    scene_of_frame = np.repeat(np.arange(span.s0, span.s1, dtype=np.int64), span.frames_per_scene)
    return SceneData(span, ag, fr, frame, scene_of_frame[frame - span.f0])


def spans(table: Any, lo: int, hi: int) -> SceneSpan:
    """The whole scenes that hold agent rows ``[lo, hi)`` (``table``: a surgery ``SceneTable``)."""
    has = table.a1 > table.a0
    idx = np.flatnonzero(has)
    s0 = int(idx[np.searchsorted(table.a1[idx], lo, side="right")])
    s1 = int(idx[np.searchsorted(table.a0[idx], hi, side="left") - 1]) + 1
    return SceneSpan(s0, s1, int(table.f0[s0]), int(table.f1[s1 - 1]), int(table.a0[s0]), int(table.a1[s1 - 1]),
                     (table.f1[s0:s1] - table.f0[s0:s1]).astype(np.int64))


def task_ranges(n: int, rows_per_task: int, align: int = MASK_CHUNK_ROWS) -> list[tuple[int, int]]:
    """``[0, n)`` cut into ranges of about ``rows_per_task`` rows, each a multiple of ``align``."""
    step = max(align, rows_per_task // align * align)
    return [(lo, min(lo + step, n)) for lo in range(0, n, step)]


def rows_per_task(agents: Any, job: Any) -> int:
    """Agent rows per task: whole stored chunks, as many per task as the engine would read."""
    from ..engine import auto_chunks_per_task

    per = job.chunks_per_task or auto_chunks_per_task(agents.meta.nchunks, job.threads, job.scheduler_kind)
    return max(1, per) * agents.meta.chunk_rows


# --- the mask ---------------------------------------------------------------------------------------
def mask_of(data: SceneData, th: Thresholds) -> tuple[np.ndarray, np.ndarray]:
    """The agents mask of whole scenes: ``(past, future)`` per agent (uint32) and why each agent
    was rejected (0, or the 1-based index into :data:`REJECTS`)."""
    from .._kernels import norm2_fma

    ag, fr = data.agents, data.frames
    n = len(ag)
    reason = np.zeros(n, np.int8)
    lp = ag["label_probabilities"].reshape(n, -1)
    ok_label = label_filter(lp, th.threshold)
    ego = fr["ego_translation"].reshape(len(fr), -1)[data.frame - data.span.f0]
    c = ag["centroid"].reshape(n, 2)
    dist = np.empty(n)
    norm2_fma(np.ascontiguousarray(ego[:, 0] - c[:, 0]), np.ascontiguousarray(ego[:, 1] - c[:, 1]), dist)
    ok_dist = dist < th.distance_m
    valid = ok_label & ok_dist
    reason[~ok_label] = 1
    reason[ok_label & ~ok_dist] = 2
    # pairs: each agent and the previous occurrence of its track in its scene
    track = ag["track_id"].astype(np.uint64)
    rel = data.scene - data.span.s0
    if n and int(track.max()) < (1 << 43) and int(rel.max()) < (1 << 20):
        # one int64 key (scene, track), sorted stably: the row order within a key is kept
        order = np.argsort((rel.astype(np.int64) << 43) | track.astype(np.int64), kind="stable")
    else:
        order = np.lexsort((np.arange(n), track, data.scene))
    s_scene, s_track, s_frame = data.scene[order], track[order], data.frame[order]
    s_valid = valid[order]
    prev_same = np.zeros(n, bool)
    prev_same[1:] = (s_scene[1:] == s_scene[:-1]) & (s_track[1:] == s_track[:-1])
    has_prev = prev_same.copy()
    has_prev[1:] &= s_valid[:-1]
    has_prev &= s_valid
    yaw = ag["yaw"].astype(np.float32)[order]
    ext = ag["extent"].reshape(n, -1)[order].astype(np.float32)
    p = np.flatnonzero(has_prev)
    q = p - 1
    hole = s_frame[p] != s_frame[q] + 1
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        ad = (yaw[p] - yaw[q] + np.pi) % (2 * np.pi) - np.pi  # angular_distance(current, previous), float32
        ok_yaw = (np.abs(ad) * 180 / np.pi) < th.yaw_degrees
        area_prev = ext[q, 0] * ext[q, 1]
        area_cur = ext[p, 0] * ext[p, 1]
        ratio = np.where(area_prev > area_cur, area_prev / area_cur, area_cur / area_prev)
        ok_ext = (area_prev >= 0.01) & (area_cur >= 0.01) & (ratio < th.extent_ratio)
    pair_reason = np.where(hole, 3, np.where(~ok_yaw, 4, np.where(~ok_ext, 5, 0))).astype(np.int8)
    reason[order[p]] = pair_reason
    start = s_valid & ~has_prev
    start[p] |= pair_reason > 0
    # runs: stretches of valid agents (in sorted order) between starts
    idx = np.arange(n)
    run_first = np.maximum.accumulate(np.where(start, idx, 0)) if n else idx
    run_id = np.cumsum(start) - 1
    lengths = np.bincount(run_id[s_valid], minlength=max(int(run_id[-1]) + 1, 0) if n else 0)
    past = np.where(s_valid, idx - run_first, 0)
    future = np.where(s_valid, lengths[np.maximum(run_id, 0)] - past - 1 if n else 0, 0)
    mask = np.zeros((n, 2), np.uint32)
    mask[order, 0] = past
    mask[order, 1] = future
    return mask, reason


def summarize(mask: np.ndarray, reason: np.ndarray) -> dict[str, np.ndarray]:
    """Counts for L5Kit's report: rejections by reason, the past/future table, agents."""
    steps = np.array(TABLE_STEPS)
    table = ((mask[:, 0, None, None] >= steps[:, None]) & (mask[:, 1, None, None] >= steps[None, :])).sum(axis=0) \
        if len(mask) < 2_000_000 else sum(summarize(mask[i: i + 1_000_000], reason[i: i + 1_000_000])["table"]
                                        for i in range(0, len(mask), 1_000_000))
    return {"rejects": np.bincount(reason, minlength=len(REJECTS) + 1)[1:], "table": np.asarray(table),
            "agents": np.array(len(mask))}


def _mask_task(agents: Any, frames: Any, span: SceneSpan, lo: int, hi: int, th: Thresholds,
               store: Any = None, meta: Any = None) -> dict[str, np.ndarray]:
    """Compute the mask of agent rows ``[lo, hi)`` (whole scenes read) and write its chunks."""
    from ..writing import write_chunks

    mask, reason = mask_of(read_span(agents, frames, span), th)
    mine = slice(lo - span.a0, hi - span.a0)
    mask, reason = mask[mine], reason[mine]
    if store is not None:
        records = np.empty(len(mask), MASK_DTYPE)
        records["value"] = mask
        write_chunks(store, meta, lo // MASK_CHUNK_ROWS, records)
    return summarize(mask, reason)


def mask_name(threshold: float) -> str:
    """``agents_mask/{threshold}`` as L5Kit names it (``str`` of the float: ``0.5``)."""
    return f"{fmt.MASKS}/{float(threshold)}"


def select_agents(dataset: Any, threshold: float = 0.5, yaw_degrees: float = TH_YAW_DEGREE,
                  extent_ratio: float = TH_EXTENT_RATIO, distance_m: float = TH_DISTANCE_AV, *,
                  output: Any = None, overwrite: bool = False, storage_options: dict | None = None,
                  job: Any = None, client: Any = None, progress: bool = False) -> dict[str, Any]:
    """Write L5Kit's agents mask ``agents_mask/{threshold}`` into ``dataset`` (as ``select_agents``
    does), or as a zarr v2 array at ``output``; return L5Kit's report (its counters, and the
    past/future table as ``{past: {future: agents}}``).

    The mask's chunks are written first and its metadata last: an interrupted run leaves nothing
    that opens as a mask. An existing mask is refused unless ``overwrite``.
    """
    from ..engine import Job
    from ..reading import open_dataset
    from ..store import Store
    from ..surgery import scene_table
    from ..writing import put

    job = job or Job(client=client, progress=progress)
    ds = dataset if hasattr(dataset, "arrays") else open_dataset(dataset, storage_options=storage_options)
    th = Thresholds(float(threshold), float(yaw_degrees), float(extent_ratio), float(distance_m))
    name = mask_name(th.threshold)
    if output is None:
        store, array_name = ds.store, name
        exists = name.split("/", 1)[1] in ds.masks
    else:
        store, array_name = Store(str(output), storage_options), ""
        exists = store.fs.exists(store.path(".zarray"))
    if exists and not overwrite:
        where = f"{ds.url}/{name}" if output is None else str(output)
        raise L5DaskError(f"{where} exists already (L5Kit supports one mask per threshold); pass --overwrite")
    if exists:
        store.fs.rm(store.path(f"{array_name}/.zarray" if array_name else ".zarray"))
    n = len(ds[fmt.AGENTS])
    meta = fmt.ArrayMeta(array_name, MASK_DTYPE, n, MASK_CHUNK_ROWS, (2,))
    table = scene_table(ds, job)
    calls = [(ds[fmt.AGENTS], ds[fmt.FRAMES], spans(table, lo, hi), lo, hi, th, store, meta)
             for lo, hi in task_ranges(n, rows_per_task(ds[fmt.AGENTS], job))]
    parts = job.map(_mask_task, calls, name="l5-agents-mask") if calls else []
    put(store, f"{array_name}/.zarray" if array_name else ".zarray", fmt.zarray_json(MASK_DTYPE, n, MASK_CHUNK_ROWS, (2,)))
    if array_name:
        put(store, f"{fmt.MASKS}/.zgroup", fmt.ZGROUP_JSON)
    return report(parts, th, n)


def report(parts: list[dict[str, np.ndarray]], th: Thresholds, n: int) -> dict[str, Any]:
    rejects = sum(p["rejects"] for p in parts) if parts else np.zeros(len(REJECTS), np.int64)
    table = sum(p["table"] for p in parts) if parts else np.zeros((4, 4), np.int64)
    out: dict[str, Any] = {"th_agent_filter_probability_threshold": th.threshold, "th_yaw_degree": th.yaw_degrees,
                           "th_extent_ratio": th.extent_ratio, "th_distance_av": th.distance_m}
    out.update({k: int(v) for k, v in zip(REJECTS, rejects)})
    out["total_reject"] = int(rejects.sum())
    out["total_agent_frames"] = int(n)
    out["past_future"] = {str(p): {str(f): int(table[i, j]) for j, f in enumerate(TABLE_STEPS)}
                          for i, p in enumerate(TABLE_STEPS)}
    return out


def table_text(rep: dict[str, Any]) -> str:
    """L5Kit's past/future table (its PrettyTable layout)."""
    head = ["past/future"] + [str(s) for s in TABLE_STEPS]
    rows = [[str(p)] + [str(rep["past_future"][str(p)][str(f)]) for f in TABLE_STEPS] for p in TABLE_STEPS]
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def fmt_row(r):
        return "|" + "|".join(f" {c:^{w}} " for c, w in zip(r, widths)) + "|"

    return "\n".join([line, fmt_row(head), line] + [fmt_row(r) for r in rows] + [line])
