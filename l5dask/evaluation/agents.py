"""L5Kit's agents mask (``select_agents``), one compiled pass over whole scenes, chunk-parallel.

Per agent, L5Kit counts how many consecutive past and future frames of its track are "valid"
with it (``l5kit/dataset/select_agents.py``). The rule:

- *point-wise*: the label filter (``sum of the 13 agent-like label probabilities > threshold``,
  summed in float32 as numpy does) and the distance to the ego (``np.linalg.norm`` of the 2-vector:
  numpy's ``dot`` fuses the multiply-add on FMA hardware, so the compiled kernel does too) below
  ``distance_m``; an agent failing either gets ``(0, 0)`` and ends its track's run;
- *pair-wise*, with the previous occurrence of the same track in the scene when that one passed
  the point-wise filters: the very next frame (no hole), the yaw change
  (``angular_distance``, in float32 as L5Kit's scalars) under ``yaw_degrees``, the ratio of the
  extents' areas under ``extent_ratio`` (areas under 0.01 m^2 fail); a failure starts a new run at
  the agent.

A run is a stretch of a track's valid agents without a start; the past count is the position in
its run, the future count what follows it. One compiled pass (``_mask.MaskPass``) walks the
agents in row order (frame order within a scene) a decoded chunk at a time, keeping each
track's last occurrence in its scene, and counts futures backwards at the end. A run never
leaves its scene, so a task that reads whole scenes is exact: each task owns a range of output
rows (whole 10,000-row chunks of the mask), reads the scenes that overlap it (at most a partial
scene more at each end) and writes its chunks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from l5dask.core.engine import Job
from l5dask.core.lazy import compiled
from l5dask.core.policy import auto_chunks_per_task, where_keywords
from l5dask.core.store import Store
from l5dask.errors import FormatError, OutputError, UsageError
from l5dask.prediction import format as fmt
from l5dask.prediction.dataset import open_dataset
from l5dask.prediction.surgery import scene_table
from l5dask.prediction.writing import put, write_chunks

_compiled = compiled("l5dask.evaluation._mask")
MaskPass = _compiled.MaskPass
label_pass = _compiled.label_pass

#: L5Kit's defaults (``select_agents.py``).
TH_YAW_DEGREE = 30
TH_EXTENT_RATIO = 1.1
TH_DISTANCE_AV = 50
#: L5Kit's ``PERCEPTION_LABELS_TO_KEEP`` (``l5kit/data/filter.py``): the agent-like labels, those of
#: the label list from ``PERCEPTION_LABEL_CAR`` to ``PERCEPTION_LABEL_ANIMAL``.
LABELS_TO_KEEP = fmt.LABELS[fmt.LABELS.index("PERCEPTION_LABEL_CAR") : fmt.LABELS.index("PERCEPTION_LABEL_ANIMAL") + 1]
KEEP = np.array([fmt.LABELS.index(name) for name in LABELS_TO_KEEP])
#: Why an agent was rejected (L5Kit's report keys), by code 1..5.
REJECTS = (
    "reject_th_agent_filter_probability_threshold",
    "reject_th_AV_distance",
    "reject_th_hole",
    "reject_th_yaw",
    "reject_th_extent",
)
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


def _label_offset() -> int:
    """The byte offset in an agent record of the first kept label probability (the compiled pass
    reads the 13 kept ones as consecutive floats)."""
    if not (np.diff(KEEP) == 1).all() or len(KEEP) != 13:
        raise AssertionError("L5Kit's kept labels are 13 consecutive ones")
    return int(fmt.fields_of(fmt.AGENT_DTYPE)["label_probabilities"][1] + 4 * KEEP[0])


def label_ok(records: np.ndarray, threshold: float) -> np.ndarray:
    """:func:`label_filter` of agent records in L5Kit's layout (uint8 0/1), read in place by the
    compiled pass; only rows whose sum is within a band of the threshold go through numpy's sum."""

    dt = fmt.AGENT_DTYPE
    ok = np.empty(len(records), np.uint8)
    if label_pass(records.view(np.uint8), len(records), dt.itemsize, _label_offset(), threshold, ok):
        near = np.flatnonzero(ok == 2)
        ok[near] = label_filter(records["label_probabilities"][near].reshape(len(near), -1), threshold)
    return ok


# --- the rows of whole scenes -----------------------------------------------------------------------
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


def span_frames(frames: Any, span: SceneSpan) -> np.ndarray:
    """The frames of a span (one ranged read), checked to cover its agents contiguously."""
    fr = frames.read_rows(span.f0, span.f1, np.empty(span.f1 - span.f0, frames.dtype))
    iv = fr["agent_index_interval"].reshape(-1, 2)
    if len(iv) and (iv[0, 0] != span.a0 or iv[-1, 1] != span.a1 or (iv[1:, 0] != iv[:-1, 1]).any()):
        raise FormatError(
            f"{frames.name}: frames {span.f0}..{span.f1} do not cover agents {span.a0}..{span.a1} "
            "contiguously (broken intervals)"
        )
    return fr


def spans(table: Any, lo: int, hi: int) -> SceneSpan:
    """The whole scenes that hold agent rows ``[lo, hi)`` (``table``: a surgery ``SceneTable``)."""
    has = table.a1 > table.a0
    idx = np.flatnonzero(has)
    s0 = int(idx[np.searchsorted(table.a1[idx], lo, side="right")])
    s1 = int(idx[np.searchsorted(table.a0[idx], hi, side="left") - 1]) + 1
    return SceneSpan(
        s0,
        s1,
        int(table.f0[s0]),
        int(table.f1[s1 - 1]),
        int(table.a0[s0]),
        int(table.a1[s1 - 1]),
        (table.f1[s0:s1] - table.f0[s0:s1]).astype(np.int64),
    )


def task_ranges(n: int, rows_per_task: int, align: int = MASK_CHUNK_ROWS) -> list[tuple[int, int]]:
    """``[0, n)`` cut into ranges of about ``rows_per_task`` rows, each a multiple of ``align``."""
    step = max(align, rows_per_task // align * align)
    return [(lo, min(lo + step, n)) for lo in range(0, n, step)]


def rows_per_task(agents: Any, job: Any, table: Any = None) -> int:
    """Agent rows per task: whole stored chunks, as many per task as the engine would read, and
    (given the scene table) at least 40 scenes' worth, so that the partial scenes a task reads
    past each end of its rows cost at most a few percent more decoding."""

    per = job.chunks_per_task or auto_chunks_per_task(agents.meta.nchunks, job.threads, job.scheduler_kind)
    rows = max(1, per) * agents.meta.chunk_rows
    if table is not None and not job.chunks_per_task and len(table.a0):
        rows = max(rows, 40 * len(agents) // len(table.a0))
    return rows


# --- the mask ---------------------------------------------------------------------------------------
#: the fields the pass reads in place, in the layout it reads them from
_FIELDS = ("centroid", "extent", "yaw", "track_id")


def as_stored(records: np.ndarray) -> np.ndarray:
    """Agent records in L5Kit's layout (a copy only if they are not)."""
    if records.dtype == fmt.AGENT_DTYPE:
        return records
    out = np.zeros(len(records), fmt.AGENT_DTYPE)
    for name in _FIELDS + ("label_probabilities",):
        out[name] = records[name]
    return out


def span_mask(
    agents: Any, fr: np.ndarray, span: SceneSpan, th: Thresholds, lo: int, hi: int, records: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The agents mask of rows ``[lo, hi)`` (inside the span), computed over its whole scenes by
    one compiled pass over the span's agents, a decoded chunk at a time: ``(past, future)`` per
    agent (uint32), the rejections by reason (:data:`REJECTS`) and L5Kit's past/future table
    (agents with ``past >= TABLE_STEPS[i]`` and ``future >= TABLE_STEPS[j]``) of those rows.
    ``records``: the span's agents when the caller has decoded them already."""

    n = span.a1 - span.a0
    iv = fr["agent_index_interval"].reshape(-1, 2).astype(np.int64)
    frame_scene = np.repeat(np.arange(span.s0, span.s1, dtype=np.int64), span.frames_per_scene)
    ego = fr["ego_translation"].reshape(len(fr), -1).astype(np.float64)
    mp = MaskPass(
        np.ascontiguousarray(iv[:, 1] - span.a0),
        frame_scene,
        np.ascontiguousarray(ego[:, 0]),
        np.ascontiguousarray(ego[:, 1]),
        n,
        np.float32(th.yaw_degrees),
        np.float32(th.extent_ratio),
        float(th.distance_m),
    )
    dt = fmt.AGENT_DTYPE
    offsets = tuple(fmt.fields_of(dt)[f][1] for f in _FIELDS)
    keep = _label_offset()
    rows = agents.meta.chunk_rows
    pieces: Any
    if records is not None:
        pieces = ((span.a0, records),)
    elif n:
        first = span.a0 // rows
        pieces = agents.iter_chunks(first, (span.a1 - 1) // rows + 1 - first)
    else:
        pieces = ()
    for start, chunk in pieces:
        part = as_stored(chunk[max(span.a0, start) - start : min(span.a1, start + len(chunk)) - start])
        buf, i, forced = part.view(np.uint8), 0, -1
        while (i := mp.feed(buf, len(part), dt.itemsize, offsets, keep, th.threshold, i, forced)) < len(part):
            # a label sum within the band of the threshold: numpy's float32 sum decides it
            forced = int(label_filter(part["label_probabilities"][i : i + 1].reshape(1, -1), th.threshold)[0])
    return mp.finish(lo - span.a0, hi - span.a0, np.array(TABLE_STEPS, np.int64))


def _mask_task(
    agents: Any, frames: Any, span: SceneSpan, lo: int, hi: int, th: Thresholds, store: Any = None, meta: Any = None
) -> dict[str, np.ndarray]:
    """Compute the mask of agent rows ``[lo, hi)`` (whole scenes read) and write its chunks."""

    mask, rejects, table = span_mask(agents, span_frames(frames, span), span, th, lo, hi)
    if store is not None:
        write_chunks(store, meta, lo // MASK_CHUNK_ROWS, mask.view(MASK_DTYPE).reshape(-1))
    return {"rejects": rejects, "table": table, "agents": np.array(hi - lo)}


def check_threshold(name: str, value: float, probability: bool = False) -> None:
    """One of :class:`Thresholds` (``name``: as the caller says it, ``yaw-degrees``) checked: a
    number (NaN, which L5Kit takes and every comparison then fails, is almost surely a mistake: a
    one-line :class:`~l5dask.errors.UsageError`); with ``probability`` (the label threshold), from
    0 to 1."""
    if math.isnan(value):
        raise UsageError(f"{name} is NaN: give a number (infinity leaves that test out)")
    if probability and not 0 <= value <= 1:
        raise UsageError(f"{name} must be from 0 to 1, not {value}")


def mask_name(threshold: float) -> str:
    """``agents_mask/{threshold}`` as L5Kit names it (``str`` of the float: ``0.5``)."""
    return f"{fmt.MASKS}/{float(threshold)}"


@where_keywords
def select_agents(
    dataset: Any,
    threshold: float = 0.5,
    yaw_degrees: float = TH_YAW_DEGREE,
    extent_ratio: float = TH_EXTENT_RATIO,
    distance_m: float = TH_DISTANCE_AV,
    *,
    output: Any = None,
    overwrite: bool = False,
    storage_options: dict | None = None,
    scheduler: Any = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Write L5Kit's agents mask ``agents_mask/{threshold}`` into ``dataset`` (as ``select_agents``
    does), or as a zarr v2 array at ``output``; return L5Kit's report (its counters, and the
    past/future table as ``{past: {future: agents}}``).

    The mask's chunks are written first and its metadata last: an interrupted run leaves nothing
    that opens as a mask. An existing mask is refused unless ``overwrite``.
    ``scheduler``: where to run (a ``distributed.Client`` or its address, ``"threads"``...;
    default: the active client, else local threads); ``job=`` and ``client=`` are its old names
    (until the next release, with a ``FutureWarning``).
    """

    job = Job.of(scheduler, progress=progress)
    ds = dataset if hasattr(dataset, "arrays") else open_dataset(dataset, storage_options=storage_options)
    th = Thresholds(float(threshold), float(yaw_degrees), float(extent_ratio), float(distance_m))
    for field_name, value in vars(th).items():
        check_threshold(field_name, value, probability=field_name == "threshold")
    name = mask_name(th.threshold)
    if output is None and getattr(ds, "parent", None) is not None:
        raise UsageError(
            "select_agents on a dataset restricted to some scenes writes the mask of their agents: give output= "
            "(it cannot go into the stored dataset, whose agents are all the scenes')"
        )
    if output is None:
        store, array_name = ds.store, name
        exists = name.split("/", 1)[1] in ds.masks
    else:
        store, array_name = Store(str(output), storage_options), ""
        exists = store.fs.exists(store.path(".zarray"))
    if exists and not overwrite:
        where = f"{ds.url}/{name}" if output is None else str(output)
        raise OutputError(
            f"{where} exists already (L5Kit supports one mask per threshold; pass overwrite=True / --overwrite)"
        )
    if exists:
        store.fs.rm(store.path(f"{array_name}/.zarray" if array_name else ".zarray"))
    n = len(ds[fmt.AGENTS])
    meta = fmt.ArrayMeta(array_name, MASK_DTYPE, n, MASK_CHUNK_ROWS, (2,))
    table = scene_table(ds, job)
    calls = [
        (ds[fmt.AGENTS], ds[fmt.FRAMES], spans(table, lo, hi), lo, hi, th, store, meta)
        for lo, hi in task_ranges(n, rows_per_task(ds[fmt.AGENTS], job, table))
    ]
    parts = job.map(_mask_task, calls, name="l5-agents-mask") if calls else []
    put(
        store,
        f"{array_name}/.zarray" if array_name else ".zarray",
        fmt.zarray_json(MASK_DTYPE, n, MASK_CHUNK_ROWS, (2,)),
    )
    if array_name:
        put(store, f"{fmt.MASKS}/.zgroup", fmt.ZGROUP_JSON)
    return report(parts, th, n)


def report(parts: list[dict[str, np.ndarray]], th: Thresholds, n: int) -> dict[str, Any]:
    rejects = np.sum([p["rejects"] for p in parts], axis=0) if parts else np.zeros(len(REJECTS), np.int64)
    table = np.sum([p["table"] for p in parts], axis=0) if parts else np.zeros((4, 4), np.int64)
    out: dict[str, Any] = {
        "th_agent_filter_probability_threshold": th.threshold,
        "th_yaw_degree": th.yaw_degrees,
        "th_extent_ratio": th.extent_ratio,
        "th_distance_av": th.distance_m,
    }
    out.update({k: int(v) for k, v in zip(REJECTS, rejects)})
    out["total_reject"] = int(rejects.sum())
    out["total_agent_frames"] = int(n)
    out["past_future"] = {
        str(p): {str(f): int(table[i, j]) for j, f in enumerate(TABLE_STEPS)} for i, p in enumerate(TABLE_STEPS)
    }
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
