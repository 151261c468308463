"""The standard statistics report (``docs/statistics-report.md``): its maths, in one pass.

Shape (after flox): each level is one declared :class:`~l5dask.core.engine.Reduction` with
``chunk`` (one stored chunk, or block, and the parent rows that overlap it -> a partial),
an ordered ``combine`` and an ``identity``; ``finalize`` assembles the report. What the
passes read, and in which order, is declared in :mod:`l5dask.prediction.report`; the engine
(:mod:`l5dask.core.engine`) runs them. Every stored chunk is decoded once:

1. scenes are read whole (the report itself holds a row per scene);
2. the frames pass (a task per group of frame chunks, given the scenes they overlap) yields
   the frame partials and compact per-frame join rows (agent start, ego x/y, scene: 32 bytes
   a frame), which are persisted;
3. agents (a task per group of chunks, each given only the frame rows it overlaps) and
   traffic-light faces, and the tree combines of all three levels, run in one compute.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from l5dask.core import cache as cachelib
from l5dask.core.engine import Later, Reduction, Rows
from l5dask.prediction import format as fmt
from l5dask.prediction.kernels import (
    AGENT_ELEMENTS,
    SCENE_TRACKS,
    agent_chunk,
    agent_columns,
    gather,
    track_runs,
    uniform_histogram,
    union_sorted,
)

SPEED_EDGES = np.linspace(0.0, 50.0, 101)
DISTANCE_EDGES = np.linspace(0.0, 200.0, 41)
I64_MAX, I64_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min


def histogram(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Counts with ``edges[i] <= v < edges[i+1]``, the last bin counting ``v >= edges[-1]`` (NaN in none).

    ``edges`` are uniform from 0; binning is exact at the edges (see :func:`l5dask.prediction.kernels.uniform_bin`).
    """

    out = np.zeros(len(edges), np.int64)
    uniform_histogram(np.ascontiguousarray(values, dtype=np.float64), float(edges[1] - edges[0]), out)
    return out


def exact_add(acc: tuple[float, ...], values: Iterable[float]) -> tuple[float, ...]:
    """A sum of floats that no order of adding changes: ``acc`` (``()``, or a result of this) with
    ``values`` added, kept exactly. It is the sum of the values that are not finite, then
    Shewchuk's non-overlapping partials of the others' exact sum (those ``math.fsum`` keeps);
    :func:`exact_total` rounds it once. The report's speed sum is one per stored chunk (its rows
    added in order), added so: the same bits whatever the tasks, their sizes or the scheduler."""
    special, *parts = acc or (0.0,)
    for x in values:
        x = float(x)
        if not math.isfinite(x):
            special += x  # (inf, -inf and NaN: their sum is the same in any order)
            continue
        i = 0
        for y in parts:
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo:
                parts[i] = lo
                i += 1
            x = hi
        parts[i:] = [x]
    return (special, *parts)


def exact_merge(a: tuple[float, ...], b: tuple[float, ...]) -> tuple[float, ...]:
    """Two sums of :func:`exact_add` as one."""
    if not a or not b:
        return a or b
    out = exact_add(a, b[1:])
    return (out[0] + b[0], *out[1:])


def exact_total(acc: tuple[float, ...]) -> float:
    """The sum that :func:`exact_add` keeps, correctly rounded (the non-finite values' sum if any)."""
    if not acc:
        return 0.0
    special, *parts = acc
    if special != 0:  # (NaN != 0)
        return special
    try:
        return math.fsum(parts)
    except (OverflowError, ValueError):  # (past float64: a plain sum of them, inf or NaN as one would be)
        return sum(parts, 0.0)


def empty_is_identity(combine):
    """A partial of no rows (``n == 0``) is the identity of ``combine``: return the other one."""

    @functools.wraps(combine)
    def wrapper(a, b):
        if a.n == 0:
            return b
        if b.n == 0:
            return a
        return combine(a, b)

    return wrapper


# --- per-scene series over a range of scene indices ------------------------------------
@cachelib.partial_type
@dataclass
class SceneSeries:
    """Per-scene values for scenes ``lo .. lo + len - 1``, merged by an op per column."""

    lo: int
    cols: dict[str, np.ndarray]

    OPS = {"sum": (np.add, 0), "min": (np.minimum, I64_MAX), "max": (np.maximum, I64_MIN)}

    @staticmethod
    def empty() -> SceneSeries:
        return SceneSeries(0, {})

    def __len__(self) -> int:
        return len(next(iter(self.cols.values()))) if self.cols else 0


def merge_series(a: SceneSeries, b: SceneSeries, ops: dict[str, str]) -> SceneSeries:
    if not len(a):
        return b
    if not len(b):
        return a
    lo, hi = min(a.lo, b.lo), max(a.lo + len(a), b.lo + len(b))
    cols = {}
    for name, op in ops.items():
        ufunc, identity = SceneSeries.OPS[op]
        dtype = np.result_type(a.cols[name], b.cols[name])
        out = np.full(hi - lo, identity, dtype=dtype)
        for s in (a, b):
            seg = slice(s.lo - lo, s.lo - lo + len(s))
            out[seg] = ufunc(out[seg], s.cols[name])
        cols[name] = out
    return SceneSeries(lo, cols)


# --- frames ----------------------------------------------------------------------------
SAMPLE_DTYPE = np.dtype([("scene", np.int64), ("timestamp", np.int64), ("agents", np.int64)])
PATH_DTYPE = np.dtype([("scene", np.int64), ("x", np.float64), ("y", np.float64)])
#: Ego path points kept for the overview map: one frame in this many (2.5 s at 10 Hz), and each scene's last.
PATH_EVERY = 25

FRAME_SERIES_OPS = {
    "num_agents": "sum",
    "num_tl_faces": "sum",
    "ego_distance_m": "sum",
    "first_ts": "min",
    "last_ts": "max",
}


@cachelib.partial_type
@dataclass
class FramePart:
    n: int = 0
    per_frame_min: int = I64_MAX
    per_frame_max: int = I64_MIN
    per_frame_sum: int = 0
    dt_values: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    dt_counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # the ego's speeds and steps between consecutive frames of a scene, added exactly (exact_add):
    # each stored chunk's sum (its pairs of frames, in row order) and each pair across two chunks
    ego_speed_sum: tuple[float, ...] = ()
    ego_pairs: int = 0
    ego_distance: tuple[float, ...] = ()
    series: SceneSeries = field(default_factory=SceneSeries.empty)  # ego_distance_m: closed scenes only
    open: list = field(default_factory=list)  # [(scene, its steps added exactly)] at the two edges
    first: tuple | None = None  # (scene, timestamp, x, y) of the first frame
    last: tuple | None = None
    # for the plots: (scene, timestamp, agents) of the sample scenes' frames; (scene, x, y) ego path points
    samples: np.ndarray = field(default_factory=lambda: np.zeros(0, SAMPLE_DTYPE))
    path: np.ndarray = field(default_factory=lambda: np.zeros(0, PATH_DTYPE))


def value_counts(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v, c = np.unique(values, return_counts=True)
    return v.astype(np.int64), c.astype(np.int64)


def merge_counts(av, ac, bv, bc):
    if not len(av):
        return bv, bc
    if not len(bv):
        return av, ac
    v, inv = np.unique(np.concatenate([av, bv]), return_inverse=True)
    return v, np.bincount(inv, weights=np.concatenate([ac, bc]), minlength=len(v)).astype(np.int64)


def frame_rows(frames: np.ndarray, offset: int, scenes: Rows) -> Rows:
    """What agents need of their frames: agent start, ego x/y and scene of each frame (32 bytes)."""
    scene = scenes.offset + scenes.locate(offset, offset + len(frames), "start")
    return Rows(
        offset,
        {
            "agent_start": np.ascontiguousarray(frames["agent_index_interval"][:, 0]),
            "ego_xy": np.ascontiguousarray(frames["ego_translation"][:, :2], dtype=np.float64),
            "scene": scene,
        },
    )


def ego_steps(xy: np.ndarray, nxt: np.ndarray, dt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ego's step (m) and speed (m/s) from frames at ``xy`` to frames at ``nxt``, ``dt`` ns
    later: one function for the pairs within a block and those across two blocks (the same bits)."""
    step = np.sqrt(((nxt - xy) ** 2).sum(1))
    with np.errstate(divide="ignore", invalid="ignore"):  # (a step of 0 ns: inf or NaN, said once in the report)
        return step, step / (dt / 1e9)


class FrameStats:
    """Frame-level statistics: agents per frame, frame frequency, ego motion, per-scene sums.

    Its floating-point sums (the ego's distance, in all and per scene, and its speeds) are the
    same bits however the frames are grouped into tasks: each is the exact sum (:func:`exact_add`),
    rounded once, of the sums of each stored chunk's pairs of consecutive frames of one scene
    (added in row order: ``np.bincount``) and of each pair across two stored chunks. A partial
    keeps the exact sums of the scenes at its two edges (they may go on in its neighbours) and
    closes them when its neighbours meet."""

    @staticmethod
    def chunk(
        frames: np.ndarray,
        offset: int,
        scenes: Rows,
        has_tl: bool,
        sample_scenes: np.ndarray | None = None,
        chunk_rows: int = 0,
    ) -> FramePart:
        """Partial of one frame block whose first row is frame ``offset``; ``scenes`` are the
        scene rows (frame intervals) that overlap the block; its stored chunks are of
        ``chunk_rows`` rows (0: one chunk)."""
        n = len(frames)
        idx = offset + np.arange(n)
        pos = scenes.locate(offset, offset + n, "start")
        scene = scenes.offset + pos
        ai = frames["agent_index_interval"]
        per = ai[:, 1] - ai[:, 0]
        ts = frames["timestamp"]
        xy = frames["ego_translation"][:, :2].astype(np.float64)
        part = FramePart(n=n)
        if n == 0:
            return part
        part.per_frame_min, part.per_frame_max, part.per_frame_sum = int(per.min()), int(per.max()), int(per.sum())
        same = scene[1:] == scene[:-1]
        dt = (ts[1:] - ts[:-1])[same]
        step, speed = ego_steps(xy[:-1][same], xy[1:][same], dt)
        part.dt_values, part.dt_counts = value_counts(dt)
        part.ego_pairs = int(same.sum())
        s0 = int(scene[0])
        local = scene - s0
        k = int(local[-1]) + 1
        # each pair of frames (i - 1, i) of one scene: within stored chunk i // chunk_rows, or across two
        chunk = (idx[1:] // chunk_rows if chunk_rows else np.zeros(n - 1, np.int64))[same]
        across = chunk != (idx[:-1] // chunk_rows if chunk_rows else np.zeros(n - 1, np.int64))[same]
        within = ~across
        c0 = int(chunk[0]) if len(chunk) else 0
        nchunks = int(chunk[-1]) - c0 + 1 if len(chunk) else 0
        for name, values in (("ego_distance", step), ("ego_speed_sum", speed)):
            sums = np.bincount(chunk[within] - c0, weights=values[within], minlength=nchunks)
            setattr(part, name, exact_add((), [*sums.tolist(), *values[across].tolist()]))
        # per scene: the row-order sum of each run of its pairs within one stored chunk, and each
        # pair across two, added exactly; the scenes at the block's two edges stay open
        pair_scene = local[1:][same]
        new = np.ones(len(step), bool)
        new[1:] = (pair_scene[1:] != pair_scene[:-1]) | (chunk[1:] != chunk[:-1]) | across[1:] | across[:-1]
        run_sums = np.bincount(np.cumsum(new) - 1, weights=step)
        run_scene = pair_scene[new]
        runs_of = np.bincount(run_scene, minlength=k)
        ego_distance = np.zeros(k)
        one = runs_of[run_scene] == 1
        ego_distance[run_scene[one]] = run_sums[one]
        bounds = np.concatenate([[0], np.cumsum(runs_of)])
        edges = [0] + ([k - 1] if k > 1 else [])
        exact = {
            s: exact_add((), run_sums[bounds[s] : bounds[s + 1]].tolist())
            for s in {*np.flatnonzero(runs_of > 1).tolist(), *edges}
        }
        for s, acc in exact.items():
            ego_distance[s] = 0.0 if s in edges else exact_total(acc)
        part.open = [(s0 + s, exact[s]) for s in edges]
        tl = frames["traffic_light_faces_index_interval"] if has_tl else None
        # timestamps of each scene's first and last frame, where they fall in this block
        first_ts = np.full(k, I64_MAX, np.int64)
        last_ts = np.full(k, I64_MIN, np.int64)
        at_start, at_end = idx == scenes["start"][pos], idx == scenes["end"][pos] - 1
        first_ts[local[at_start]] = ts[at_start]
        last_ts[local[at_end]] = ts[at_end]
        part.series = SceneSeries(
            s0,
            {
                "num_agents": np.bincount(local, weights=per, minlength=k).astype(np.int64),
                "num_tl_faces": (
                    np.bincount(local, weights=tl[:, 1] - tl[:, 0], minlength=k).astype(np.int64)
                    if tl is not None
                    else np.zeros(k, np.int64)
                ),
                "ego_distance_m": ego_distance,
                "first_ts": first_ts,
                "last_ts": last_ts,
            },
        )
        if sample_scenes is not None and len(sample_scenes):
            keep = np.isin(scene, sample_scenes)
            part.samples = np.empty(int(keep.sum()), SAMPLE_DTYPE)
            part.samples["scene"], part.samples["timestamp"], part.samples["agents"] = scene[keep], ts[keep], per[keep]
        on_path = ((idx - scenes["start"][pos]) % PATH_EVERY == 0) | at_end
        part.path = np.empty(int(on_path.sum()), PATH_DTYPE)
        part.path["scene"], part.path["x"], part.path["y"] = scene[on_path], xy[on_path, 0], xy[on_path, 1]
        part.first = (int(scene[0]), int(ts[0]), float(xy[0, 0]), float(xy[0, 1]))
        part.last = (int(scene[-1]), int(ts[-1]), float(xy[-1, 0]), float(xy[-1, 1]))
        return part

    @staticmethod
    @empty_is_identity
    def combine(a: FramePart, b: FramePart) -> FramePart:
        out = FramePart(
            n=a.n + b.n,
            per_frame_min=min(a.per_frame_min, b.per_frame_min),
            per_frame_max=max(a.per_frame_max, b.per_frame_max),
            per_frame_sum=a.per_frame_sum + b.per_frame_sum,
            ego_speed_sum=exact_merge(a.ego_speed_sum, b.ego_speed_sum),
            ego_pairs=a.ego_pairs + b.ego_pairs,
            ego_distance=exact_merge(a.ego_distance, b.ego_distance),
            series=merge_series(a.series, b.series, FRAME_SERIES_OPS),
            first=a.first,
            last=b.last,
            samples=np.concatenate([a.samples, b.samples]),
            path=np.concatenate([a.path, b.path]),
        )
        out.dt_values, out.dt_counts = merge_counts(a.dt_values, a.dt_counts, b.dt_values, b.dt_counts)
        assert a.last is not None and b.first is not None  # blocks of frames: never empty
        (sa, ta, xa, ya), (sb, tb, xb, yb) = a.last, b.first
        opens = list(a.open)
        if sa == sb:  # the consecutive pair across the seam of the two blocks (of two stored chunks)
            dt = tb - ta
            step, speed = (float(v[0]) for v in ego_steps(np.array([[xa, ya]]), np.array([[xb, yb]]), np.array([dt])))
            out.dt_values, out.dt_counts = merge_counts(
                out.dt_values, out.dt_counts, np.array([dt], np.int64), np.array([1], np.int64)
            )
            out.ego_speed_sum = exact_add(out.ego_speed_sum, [speed])
            out.ego_pairs += 1
            out.ego_distance = exact_add(out.ego_distance, [step])
            opens.append((sa, exact_add((), [step])))
        opens += b.open
        merged: list = []
        for scene, acc in opens:
            if merged and merged[-1][0] == scene:
                merged[-1] = (scene, exact_merge(merged[-1][1], acc))
            else:
                merged.append((scene, acc))
        out.series = close_scenes(out.series, merged[1:-1])
        out.open = [merged[0]] + ([merged[-1]] if len(merged) > 1 else [])
        return out


def close_scenes(series: SceneSeries, opens: list) -> SceneSeries:
    """``series`` with the ego distance of each scene of ``opens`` (``[(scene, exact sum)]``), closed."""
    for scene, acc in opens:
        one = SceneSeries(
            scene,
            {
                "num_agents": np.zeros(1, np.int64),
                "num_tl_faces": np.zeros(1, np.int64),
                "ego_distance_m": np.array([exact_total(acc)]),
                "first_ts": np.array([I64_MAX]),
                "last_ts": np.array([I64_MIN]),
            },
        )
        series = merge_series(series, one, FRAME_SERIES_OPS)
    return series


def median_from_counts(values: np.ndarray, counts: np.ndarray) -> float:
    """``np.median`` of the multiset given as sorted values with counts."""
    total = int(counts.sum())
    cum = np.cumsum(counts)
    lo = values[np.searchsorted(cum, (total - 1) // 2, side="right")]
    hi = values[np.searchsorted(cum, total // 2, side="right")]
    return (float(lo) + float(hi)) / 2


# --- agents ----------------------------------------------------------------------------
@cachelib.partial_type
@dataclass
class AgentPart:
    n: int = 0
    labels: np.ndarray = field(default_factory=lambda: np.zeros(17, np.int64))
    speed_sum: tuple[float, ...] = ()  # each stored chunk's sum of speeds, added exactly (exact_add)
    speed_hist: np.ndarray = field(default_factory=lambda: np.zeros(101, np.int64))
    dist_hist: np.ndarray = field(default_factory=lambda: np.zeros(41, np.int64))
    tracks: SceneSeries = field(default_factory=SceneSeries.empty)  # closed scenes: distinct tracks
    open: list = field(default_factory=list)  # [(scene, sorted unique track ids)] at the two edges


def _close(series: SceneSeries, opens: list) -> SceneSeries:
    for scene, ids in opens:
        series = merge_series(series, SceneSeries(scene, {"n": np.array([len(ids)], np.int64)}), {"n": "sum"})
    return series


#: The per-row columns of the report's agents loop that other analyses of a fused pass take
#: (``l5dask.prediction.columns``' ``speed`` and ``distance_to_ego``, the same bits).
SHARED_COLUMNS = ("speed", "distance_to_ego")
#: The agent fields the report reads (a columnar store reads only these: never extent or yaw).
AGENT_FIELDS = ("centroid", "velocity", "track_id", "label_probabilities")
#: The frame fields it reads (never the ego's rotation).
FRAME_FIELDS = ("timestamp", "agent_index_interval", "traffic_light_faces_index_interval", "ego_translation")


class AgentStats:
    """Agent-level statistics: labels, speed, distance to ego, distinct tracks (exact)."""

    @staticmethod
    def chunk(agents: Any, lo: int, frames: Rows, nlabels: int = 17) -> AgentPart | Later:
        """Partial of one chunk of agents (first row ``lo``): records, or the chunk's stored bytes
        (an :class:`~l5dask.prediction.reading.Encoded`, whose columns are gathered without making
        records), given the rows of its frames (:func:`frame_rows`). In a fused pass whose catalog
        leaves its runs' distinct tracks in the block, the partial waits for them (an
        :class:`~l5dask.core.engine.Later`: :meth:`tracks`)."""
        part = AgentPart(n=len(agents), labels=np.zeros(nlabels, np.int64))
        if not len(agents):
            return part

        pos = np.empty(len(agents), np.int64)
        frame = (frames["agent_start"], frames["ego_xy"])
        widths = (float(SPEED_EDGES[1]), float(DISTANCE_EDGES[1]))
        into = (part.labels, part.speed_hist, part.dist_hist)
        if isinstance(agents, np.ndarray):
            ids = np.empty(len(agents), np.uint64)
            part.speed_sum = exact_add((), [agent_chunk(agents, *frame, lo, *widths, *into, pos, ids)])
        else:  # (stored chunks, maybe several: a sum each, so that how many a call takes changes nothing)
            columns, (label,) = agents.gather(AGENT_ELEMENTS, ["label_probabilities"])
            ids, sums = columns[4], []
            # (the speeds and distances made here, written out for the other analyses of a fused pass)
            out_of = getattr(agents, "derived_out", lambda name: None)  # (a view's chunk: none)
            speeds, dists = (out_of(n) for n in SHARED_COLUMNS)
            for a, b in agents.spans():
                cols = [c[a:b] for c in columns]
                outs = [None if x is None else x[a:b] for x in (speeds, dists)]
                sums.append(agent_columns(label[a:b], cols, *frame, lo + a, *widths, *into, pos[a:b], *outs))
            part.speed_sum = exact_add((), sums)
            leaves = getattr(agents, "leaves", None)  # (a view's chunk: none)
            if leaves is not None and leaves(SCENE_TRACKS):  # (a fused pass's catalog counts them too)
                return Later(functools.partial(AgentStats.tracks, part, ids, pos, frames, agents))
        return AgentStats.tracks(part, ids, pos, frames)

    @staticmethod
    def tracks(part: AgentPart, ids: np.ndarray, pos: np.ndarray, frames: Rows, block: Any = None) -> AgentPart:
        """``part`` with its rows' distinct tracks: agents are ordered by scene, so each scene is
        one run of rows here; the first and last runs stay open (their scenes may go on in the
        neighbouring chunks). Those another member of a fused pass left in ``block`` when it did
        (:data:`~l5dask.prediction.kernels.SCENE_TRACKS`: the same arrays), else counted here."""
        got = block.left(SCENE_TRACKS) if block is not None else None
        scenes, counts, first_ids, last_ids = got if got is not None else track_runs(ids, pos, frames["scene"])
        s_first, s_last = int(scenes[0]), int(scenes[-1])
        n_inner = np.zeros(s_last - s_first + 1, np.int64)
        n_inner[scenes[1:-1] - s_first] = counts[1:-1]
        part.tracks = SceneSeries(s_first, {"n": n_inner})
        part.open = [(s_first, first_ids)] + ([(s_last, last_ids)] if len(scenes) > 1 else [])
        return part

    @staticmethod
    @empty_is_identity
    def combine(a: AgentPart, b: AgentPart) -> AgentPart:

        opens: list = []
        for scene, ids in a.open + b.open:
            if opens and opens[-1][0] == scene:
                opens[-1] = (scene, union_sorted(opens[-1][1], ids))
            else:
                opens.append((scene, ids))
        tracks = merge_series(a.tracks, b.tracks, {"n": "sum"})
        tracks = _close(tracks, opens[1:-1])
        return AgentPart(
            n=a.n + b.n,
            labels=a.labels + b.labels,
            speed_sum=exact_merge(a.speed_sum, b.speed_sum),
            speed_hist=a.speed_hist + b.speed_hist,
            dist_hist=a.dist_hist + b.dist_hist,
            tracks=tracks,
            open=[opens[0]] + ([opens[-1]] if len(opens) > 1 else []),
        )


# --- traffic-light faces ---------------------------------------------------------------
@cachelib.partial_type
@dataclass
class TLPart:
    n: int = 0
    status: np.ndarray = field(default_factory=lambda: np.zeros(3, np.int64))
    faces: frozenset = frozenset()  # the distinct face ids (a set: unions cost a fraction of sorted merges)


class TLStats:
    """Traffic-light faces: status counts (argmax) and distinct face ids."""

    @staticmethod
    def chunk(faces: Any, start: int = 0, parent: None = None) -> TLPart:
        """Partial of a block of faces: records, or their stored bytes (an
        :class:`~l5dask.prediction.reading.Encoded`: the statuses' argmax and the distinct face ids
        found straight in the compressed blocks, ``_distinct.h``: 0.12 CPU-s for 5.4 M faces, against
        0.27 s decoded by numcodecs and counted, 2026-11-26)."""
        if not len(faces):
            return TLPart()
        ncols = faces.dtype["traffic_light_face_status"].shape[0]
        if ncols != 3:
            raise ValueError(f"traffic_light_face_status has {ncols} columns, but there are 3 statuses")
        found: list[np.ndarray] = []
        argmax = ["traffic_light_face_status"]
        if isinstance(faces, np.ndarray):
            _, (status,) = gather(faces, [], argmax, "face_id", found)
        else:
            _, (status,) = faces.gather([], argmax, "face_id", found)
        ids = np.concatenate(found) if len(found) > 1 else found[0]
        counts = np.array([np.count_nonzero(status == k) for k in range(3)], np.int64)  # (bincount: a cast to intp)
        return TLPart(len(faces), counts, frozenset(ids.tolist()))

    @staticmethod
    @empty_is_identity
    def combine(a: TLPart, b: TLPart) -> TLPart:
        return TLPart(a.n + b.n, a.status + b.status, a.faces | b.faces)


# --- the declared reductions -----------------------------------------------------------
def frames_reduction(has_tl: bool, sample_scenes: np.ndarray, chunk_rows: int = 0) -> Reduction:
    """Frame partials, given the overlapping scene rows (:func:`scene_rows`), over frames stored in
    chunks of ``chunk_rows`` rows (0: one chunk)."""
    samples = np.asarray(sample_scenes, np.int64)
    return Reduction(
        f"frames-tl{int(has_tl)}-rows{chunk_rows}-samples{'.'.join(map(str, samples.tolist()))}",
        functools.partial(FrameStats.chunk, has_tl=has_tl, sample_scenes=samples, chunk_rows=chunk_rows),
        FrameStats.combine,
        FramePart,
        exact=True,  # (counts, minima, value counts, and the ego's sums added exactly: see FrameStats)
        cache_token=functools.partial(_frames_token, has_tl, tuple(samples.tolist()), chunk_rows),
    )


def _frames_token(has_tl: bool, samples: tuple[int, ...], chunk_rows: int, scenes: Rows) -> tuple:
    """What a task of the frames pass computes, given its scene rows: only the sample scenes among
    them count (the samples move as a dataset grows; a task of other scenes is the same)."""
    lo, hi = scenes.offset, scenes.offset + len(scenes)
    return ("frames-exact", int(has_tl), chunk_rows, [s for s in samples if lo <= s < hi])


def agents_reduction(nlabels: int) -> Reduction:
    """Agent partials, given the overlapping frame rows (:func:`frame_rows`)."""
    return Reduction(
        f"agents-{nlabels}",
        functools.partial(AgentStats.chunk, nlabels=nlabels),
        AgentStats.combine,
        functools.partial(_empty_agent_part, nlabels),
        exact=True,  # (counts, histograms, distinct tracks, and the speed sum added exactly)
        reads=(AGENT_ELEMENTS, ("label_probabilities",)),
        provides=SHARED_COLUMNS,
    )


def _empty_agent_part(nlabels: int) -> AgentPart:
    return AgentPart(labels=np.zeros(nlabels, np.int64))


TL_FACES = Reduction("tl-faces", TLStats.chunk, TLStats.combine, TLPart, exact=True)


# --- the report ------------------------------------------------------------------------
def finalize(
    counts: dict[str, int],
    labels: tuple[str, ...],
    scenes: np.ndarray,
    fp: FramePart,
    ap: AgentPart,
    tp: TLPart | None = None,
) -> dict[str, Any]:
    """Assemble the report dict (contract version 1) from the three combined partials."""
    tp = tp if tp is not None else TLPart()
    if len(ap.labels) != len(labels):
        raise ValueError(f"{len(ap.labels)} label counts for {len(labels)} label names")
    n_scenes, n_frames, n_agents = counts["scenes"], counts["frames"], counts["agents"]
    total_dt = int(fp.dt_counts.sum())
    step = median_from_counts(fp.dt_values, fp.dt_counts) if total_dt else 1e8
    hz = 1e9 / step if step else math.inf
    if not step:
        warnings.warn(
            "the median step between consecutive frames of a scene is 0 ns (at least half of them repeat a "
            "timestamp): frame_frequency_hz is not finite (null in the report), and total_time_hours and "
            "avg_scene_time_s, made with it, are 0",
            RuntimeWarning,
            stacklevel=1,
        )
    series = close_scenes(fp.series, fp.open)
    per_scene = {}
    for name in ("num_agents", "num_tl_faces", "ego_distance_m", "first_ts", "last_ts"):
        col = np.zeros(n_scenes, dtype=np.float64 if name == "ego_distance_m" else np.int64)
        if len(series):
            col[series.lo : series.lo + len(series)] = series.cols[name]
        per_scene[name] = col
    tracks = _close(ap.tracks, ap.open)
    num_tracks = np.zeros(n_scenes, np.int64)
    if len(tracks):
        num_tracks[tracks.lo : tracks.lo + len(tracks)] = tracks.cols["n"]
    mean = lambda s, n: float(s / n) if n else 0.0  # noqa: E731
    for what, hist, why in (
        ("speed", ap.speed_hist, "a NaN velocity: agents.speed_mps.mean is null"),
        ("distance to its ego", ap.dist_hist, "a NaN centroid or ego position"),
    ):
        unbinned = ap.n - int(hist.sum())
        if unbinned:
            warnings.warn(
                f"{unbinned:,} agent(s) have a {what} that is not a number ({why}): its histogram counts "
                "no bin for them",
                RuntimeWarning,
                stacklevel=1,
            )
    not_later = int(fp.dt_counts[fp.dt_values <= 0].sum()) if total_dt else 0
    if not_later:
        speed = mean(exact_total(fp.ego_speed_sum), fp.ego_pairs)
        warnings.warn(
            f"{not_later:,} pair(s) of consecutive frames of one scene are 0 ns or less apart (a timestamp "
            "repeated or going back): ego.mean_speed_mps, the mean of each step over its time, "
            + ("is not finite (null in the report)" if not math.isfinite(speed) else "takes them as they are")
            + "; the catalog's timestamp_gaps counts such steps per scene",
            RuntimeWarning,
            stacklevel=1,  # (l5dask's own line: one line on the command's stderr, whoever called it)
        )
    return {
        "version": 1,
        "counts": dict(counts),
        "summary": {
            "frame_frequency_hz": hz,
            "total_time_hours": n_frames / hz / 3600,
            "avg_frames_per_scene": mean(n_frames, n_scenes),
            "avg_agents_per_frame": mean(n_agents, n_frames),
            "avg_scene_time_s": mean(n_frames, n_scenes) / hz,
        },
        "agents": {
            "label_counts": {name: int(c) for name, c in zip(labels, ap.labels)},
            "per_frame": {
                "min": int(fp.per_frame_min) if fp.n else 0,
                "max": int(fp.per_frame_max) if fp.n else 0,
                "mean": mean(fp.per_frame_sum, fp.n),
            },
            "speed_mps": {
                "mean": mean(exact_total(ap.speed_sum), ap.n),
                "histogram": {"edges": SPEED_EDGES.tolist(), "counts": ap.speed_hist.tolist()},
            },
            "distance_to_ego_m": {"histogram": {"edges": DISTANCE_EDGES.tolist(), "counts": ap.dist_hist.tolist()}},
        },
        "tracks": {"count": int(num_tracks.sum())},
        "tl_faces": {
            "status_counts": dict(zip(fmt.TL_FACE_STATUSES, (int(x) for x in tp.status))),
            "unique_faces": int(len(tp.faces)),
        },
        "ego": {
            "mean_speed_mps": mean(exact_total(fp.ego_speed_sum), fp.ego_pairs),
            "total_distance_km": exact_total(fp.ego_distance) / 1000,
        },
        "per_scene": {
            "num_agents": per_scene["num_agents"].tolist(),
            "num_tracks": num_tracks.tolist(),
            "ego_distance_m": per_scene["ego_distance_m"].tolist(),
        },
        "_plots": {"samples": fp.samples, "path": fp.path},
        "_scene_table": {
            "scene_index": np.arange(n_scenes),
            "host": scenes["host"],
            "start_time": scenes["start_time"],
            "end_time": scenes["end_time"],
            "num_frames": (scenes["frame_index_interval"][:, 1] - scenes["frame_index_interval"][:, 0]),
            "num_agents": per_scene["num_agents"],
            "num_tracks": num_tracks,
            "num_tl_faces": per_scene["num_tl_faces"],
            "duration_s": np.where(per_scene["first_ts"] == I64_MAX, 0, per_scene["last_ts"] - per_scene["first_ts"])
            / 1e9,
            "ego_distance_m": per_scene["ego_distance_m"],
        },
    }
