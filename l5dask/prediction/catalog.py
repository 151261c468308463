"""The scene catalog (``docs/guide/catalog.md``): one row per scene, every column from one pass.

Declared over the engine (:mod:`l5dask.core.engine`) as the report is
(:mod:`l5dask.prediction.report`): the scenes read whole, a frames pass (persisted: its rows, the
agent and face starts, ego position and scene of each frame, are made again for the child tasks
that need them), then agents and traffic-light faces, each task given only the frame rows it
overlaps, and the three tree combines, in one compute.

The per-row work is compiled (:mod:`l5dask.prediction.kernels`): agents and faces are gathered
from their stored bytes (centroid, track id, the label's argmax and probability; the faces' status
and their ids as codes, found in the compressed blocks), then one loop a chunk gives each agent a
mask of its kinds (its label, its group within 10 and 30 m) and each run of rows of one scene its
distinct (track, kinds); frames are whole numpy arrays a block, reduced per scene with ``reduceat``.

Exact whatever the tasks: a partial holds the finished rows of the scenes wholly inside its rows,
and for the (at most two) scenes at its edges, which may go on in the neighbouring partials, what
they need to be finished: their raw frames (tens to a few hundred), or their distinct
(kind, track) keys. Combining two neighbouring partials finishes each scene that is no longer at
an edge; ``finalize`` the rest. Every per-scene value is so computed from all its rows at once,
by the same function, whatever the chunks and tasks.
"""

from __future__ import annotations

import functools
import json
import os
import posixpath
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from l5dask.core import cache as cachelib
from l5dask.core.cache import open_cache
from l5dask.core.engine import Job, Link, Pass, Plan, Reduction, Rows
from l5dask.core.intervals import check_intervals
from l5dask.core.outputs import arrow_array, arrow_strings, check_writable, exists, write_table
from l5dask.core.policy import where_keywords
from l5dask.errors import OutputError, UsageError
from l5dask.prediction import format as fmt
from l5dask.prediction.dataset import L5Dataset, open_dataset
from l5dask.prediction.joins import scene_rows
from l5dask.prediction.kernels import (
    SCENE_TRACKS,
    catalog_agents,
    face_runs,
    gather,
    mask_counts,
    union_masks,
)
from l5dask.prediction.scenes import CATALOG_KEY, fingerprint, scenes_digest

#: L5Kit's ``categorize_scenes.py``: a turn is a yaw change of at least this (rad) ...
TURN_THRESH = 1.0
#: ... between frames this many apart (L5Kit refuses scenes shorter than this: the tag is then null).
TIME_DURATION_TURN = 50
#: The nominal step between frames (10 Hz) ...
FRAME_STEP_NS = 100_000_000
#: ... a step further from it than this counts as a timestamp gap (a frame missing, or repeated:
#: stored steps jitter by a few ms around 100 ms).
GAP_TOLERANCE_NS = 50_000_000
#: The ego is stopped over a step whose speed is under this (m/s) ...
STOP_SPEED_MPS = 0.5
#: ... and a stop is a run of consecutive stopped steps lasting at least this (s).
STOP_MIN_S = 1.0
#: Distances (m) within which the distinct tracks of each label group are counted.
NEAR_M = (10.0, 30.0)
#: Agents whose largest label probability is under this count as low-confidence.
LOW_CONFIDENCE = 0.5
#: The default time zone of the local hour and weekday (the dataset's: Palo Alto).
DEFAULT_TZ = "America/Los_Angeles"
#: The key of the scenes' digest in the schema metadata of a catalog not yet fingerprinted.
SCENES_KEY = "l5dask.scenes_sha256"
#: Label groups, by L5Kit label name.
GROUPS: dict[str, tuple[str, ...]] = {
    "vehicles": tuple(
        f"PERCEPTION_LABEL_{x}" for x in ("CAR", "VAN", "TRAM", "BUS", "TRUCK", "EMERGENCY_VEHICLE", "OTHER_VEHICLE")
    ),
    "pedestrians": ("PERCEPTION_LABEL_PEDESTRIAN",),
    "cyclists": tuple(f"PERCEPTION_LABEL_{x}" for x in ("BICYCLE", "MOTORCYCLE", "CYCLIST", "MOTORCYCLIST")),
}
_EPS4 = np.finfo(float).eps * 4.0  # transforms3d's threshold in mat2euler


def label_column(name: str) -> str:
    """The catalog's column of distinct tracks of label ``name``: ``tracks_car`` for ``PERCEPTION_LABEL_CAR``."""
    short = name.split("_LABEL_", 1)[-1] if "_LABEL_" in name else name
    return "tracks_" + ("av_dontcare" if name == "AVRESEARCH_LABEL_DONTCARE" else short.lower())


def ego_yaw(rotation: np.ndarray) -> np.ndarray:
    """L5Kit's ``rotation33_as_yaw`` (``transforms3d.euler.mat2euler(m)[2]``, axes ``sxyz``) of each
    3x3 rotation: ``atan2(m[1, 0], m[0, 0])``, or 0 where ``hypot(m[0, 0], m[1, 0])`` is not above
    ``4 eps`` (gimbal lock)."""
    m = np.asarray(rotation, np.float64).reshape(-1, 3, 3)
    cy = np.sqrt(m[:, 0, 0] * m[:, 0, 0] + m[:, 1, 0] * m[:, 1, 0])
    return np.where(cy > _EPS4, np.arctan2(m[:, 1, 0], m[:, 0, 0]), 0.0)


# --- frames: each scene's row from all its frames -----------------------------------------
FRAME_FIELDS = (
    "timestamp",
    "agent_index_interval",
    "traffic_light_faces_index_interval",
    "ego_translation",
    "ego_rotation",
)
#: The columns of the frames' per-scene rows, in order.
FRAME_COLUMNS = (
    "duration_s",
    "timestamp_gaps",
    "path_length_m",
    "mean_speed_mps",
    "max_speed_mps",
    "max_accel_mps2",
    "max_decel_mps2",
    "max_abs_yaw_rate_rps",
    "time_stopped_s",
    "stops",
    "max_agents_in_frame",
    "turn",
    "turn_unwrapped",
)
#: Those of them that are counts.
INT_FRAME_COLUMNS = ("timestamp_gaps", "stops", "max_agents_in_frame")


#: The turn tags, by their codes in the frames' tables (NaN: none, under 50 frames).
TURNS = ("straight", "left", "right")


def _tags(yaw: np.ndarray, run: np.ndarray, nruns: int, long: np.ndarray) -> np.ndarray:
    """L5Kit's turn tag of each run of rows (``run``: each row's run, in order) as codes (:data:`TURNS`;
    NaN for runs of fewer than 50 rows): some ``yaw[i + 50] - yaw[i] >= 1`` in the run gives left,
    else some ``<= -1`` right, else straight."""
    k = TIME_DURATION_TURN
    out = np.where(long, 0.0, np.nan)
    if len(yaw) > k:
        d = yaw[k:] - yaw[:-k]
        same = run[k:] == run[:-k]
        left = np.bincount(run[:-k][same & (d >= TURN_THRESH)], minlength=nruns) > 0
        right = np.bincount(run[:-k][same & (d <= -TURN_THRESH)], minlength=nruns) > 0
        out[long & right] = 2
        out[long & left] = 1
    return out


def frame_table(ts: np.ndarray, xy: np.ndarray, yaw: np.ndarray, agents: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The frame columns (:data:`FRAME_COLUMNS`, as float64; the turn tags as codes of
    :data:`TURNS`) of each run of consecutive frames of one scene (runs start at ``starts``, the
    last ends with the rows), all runs at once: each step between consecutive frames of a run,
    and a NaN (or 0, or False) step after each run's last frame, so that each run's segment of
    the step arrays (``reduceat`` at ``starts``) is its steps and one empty slot."""
    n, r = len(ts), len(starts)
    ends = np.append(starts[1:], n)
    run = np.repeat(np.arange(r), ends - starts)
    inner = np.zeros(n, bool)  # (step i: from frame i to i + 1, within a run)
    inner[:-1] = run[1:] == run[:-1]
    dt = np.zeros(n, np.int64)
    dt[:-1] = np.diff(ts)
    dt[~inner] = 0
    dts = np.where(inner, dt / 1e9, np.nan)
    step = np.zeros(n)
    step[:-1] = np.sqrt(((xy[1:] - xy[:-1]) ** 2).sum(1))
    step[~inner] = 0.0
    ok = inner & (dt > 0)
    speed = np.full(n, np.nan)
    speed[ok] = step[ok] / dts[ok]
    accel = np.full(n, np.nan)
    accel[:-1] = (speed[1:] - speed[:-1]) / ((dts[1:] + dts[:-1]) / 2)
    dyaw = np.zeros(n)
    dyaw[:-1] = (np.diff(yaw) + np.pi) % (2 * np.pi) - np.pi
    rate = np.full(n, np.nan)
    rate[ok] = np.abs(dyaw[ok]) / dts[ok]
    stopped = ok & (speed < STOP_SPEED_MPS)
    # runs of stopped steps (never across scenes: a run's last slot is not stopped), their length in ns
    prev = np.zeros(n, bool)
    prev[1:] = stopped[:-1]
    nxt = np.zeros(n, bool)
    nxt[:-1] = stopped[1:]
    first, last = np.flatnonzero(stopped & ~prev), np.flatnonzero(stopped & ~nxt)
    long_stop = ts[last + 1].astype(np.int64) - ts[first].astype(np.int64) >= int(STOP_MIN_S * 1e9)
    duration = (ts[ends - 1].astype(np.int64) - ts[starts].astype(np.int64)) / 1e9
    path = np.add.reduceat(step, starts)
    out = np.empty((r, len(FRAME_COLUMNS)))
    out[:, 0] = duration
    out[:, 1] = np.add.reduceat(inner & (np.abs(dt - FRAME_STEP_NS) > GAP_TOLERANCE_NS), starts)
    out[:, 2] = path
    with np.errstate(divide="ignore", invalid="ignore"):
        out[:, 3] = np.where(duration > 0, path / duration, np.nan)
    out[:, 4] = np.fmax.reduceat(speed, starts)
    # (the largest rise and fall: 0 where the speed never rises, or never falls; NaN without two steps)
    rise, fall = np.fmax.reduceat(accel, starts), np.fmax.reduceat(-accel, starts)
    out[:, 5] = np.where(rise < 0, 0.0, rise)
    out[:, 6] = np.where(fall < 0, 0.0, fall)
    out[:, 7] = np.fmax.reduceat(rate, starts)
    out[:, 8] = np.add.reduceat(np.where(stopped, dt, 0), starts) / 1e9
    out[:, 9] = np.bincount(run[first[long_stop]], minlength=r)
    out[:, 10] = np.maximum.reduceat(agents, starts)
    long = ends - starts >= TIME_DURATION_TURN
    out[:, 11] = _tags(yaw, run, r, long)
    out[:, 12] = out[:, 11]
    # the corrected tag: where a run's yaw jumps by pi or more (np.unwrap changes nothing elsewhere)
    wraps = run[:-1][inner[:-1] & (np.abs(np.diff(yaw)) >= np.pi)]  # (sorted: np.unique imports numpy.ma)
    for i in wraps[np.diff(wraps, prepend=-1) != 0].tolist():
        a, b = int(starts[i]), int(ends[i])
        out[i, 12] = _tags(np.unwrap(yaw[a:b]), np.zeros(b - a, np.int64), 1, long[i : i + 1])[0]
    return out


@cachelib.partial_type
@dataclass
class RunsPart:
    """Finished rows (scenes ``done_scenes``, rows ``done``) and the scenes at the two edges, still
    open: ``[(scene, payload)]``."""

    n: int = 0
    done_scenes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    done: np.ndarray = field(default_factory=lambda: np.zeros((0, len(FRAME_COLUMNS))))
    open: list = field(default_factory=list)


def combine_runs(a: RunsPart, b: RunsPart) -> RunsPart:
    """Two neighbouring partials: open scenes met again joined, those no longer at an edge finished."""
    if a.n == 0:
        return b
    if b.n == 0:
        return a
    opens: list = []
    for scene, p in a.open + b.open:
        if opens and opens[-1][0] == scene:
            opens[-1] = (scene, tuple(np.concatenate([x, y]) for x, y in zip(opens[-1][1], p)))
        else:
            opens.append((scene, p))
    scenes, rows = [a.done_scenes, b.done_scenes], [a.done, b.done]
    for scene, p in opens[1:-1]:
        scenes.append(np.array([scene], np.int64))
        rows.append(finish_frames(p))
    return RunsPart(
        a.n + b.n, np.concatenate(scenes), np.concatenate(rows), [opens[0]] + ([opens[-1]] if len(opens) > 1 else [])
    )


def finish_frames(p: tuple) -> np.ndarray:
    """The row of one scene from all its frames (an open payload)."""
    ts, xy, yaw, agents = p
    return frame_table(ts, xy, yaw, agents, np.zeros(1, np.int64))


def runs(scene: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of each run of equal (sorted) scene numbers."""
    cut = np.flatnonzero(scene[1:] != scene[:-1]) + 1
    return np.concatenate([[0], cut]), np.concatenate([cut, [len(scene)]])


def catalog_frame_rows(frames: np.ndarray, offset: int, scenes: Rows, has_tl: bool) -> Rows:
    """What agents and faces need of their frames: their starts, the ego's x/y, the scene."""
    cols = {
        "agent_start": np.ascontiguousarray(frames["agent_index_interval"][:, 0], dtype=np.int64),
        "ego_xy": np.ascontiguousarray(frames["ego_translation"][:, :2], dtype=np.float64),
        "scene": scenes.offset + scenes.locate(offset, offset + len(frames), "start"),
    }
    if has_tl:
        cols["tl_start"] = np.ascontiguousarray(frames["traffic_light_faces_index_interval"][:, 0], dtype=np.int64)
    return Rows(offset, cols)


def frames_chunk(frames: np.ndarray, offset: int, scenes: Rows) -> RunsPart:
    n = len(frames)
    if not n:
        return RunsPart()
    scene = scenes.offset + scenes.locate(offset, offset + n, "start")
    ai = frames["agent_index_interval"]
    cols = (
        np.ascontiguousarray(frames["timestamp"], np.int64),
        np.ascontiguousarray(frames["ego_translation"][:, :2], np.float64),
        ego_yaw(frames["ego_rotation"]),
        (ai[:, 1] - ai[:, 0]).astype(np.int64),
    )
    starts, ends = runs(scene)
    part = RunsPart(n)
    edge = [0] + ([len(starts) - 1] if len(starts) > 1 else [])
    for i in edge:
        # (copies: a view would keep the whole block's columns alive as long as the partial)
        part.open.append((int(scene[starts[i]]), tuple(c[starts[i] : ends[i]].copy() for c in cols)))
    if len(starts) > 2:  # (the inner runs: their scenes are whole here)
        a, b = int(starts[1]), int(ends[-2])
        part.done_scenes = scene[starts[1:-1]].astype(np.int64)
        ts, xy, yaw, agents = (c[a:b] for c in cols)
        part.done = frame_table(ts, xy, yaw, agents, starts[1:-1] - a)
    return part


FRAMES_REDUCTION = Reduction(
    "catalog-frames",
    frames_chunk,
    combine_runs,
    RunsPart,
    exact=True,  # (each scene's row made from all its frames at once)
)


# --- agents and faces: distinct keys per scene, per-scene minima and sums ------------------
@cachelib.partial_type
@dataclass
class KeyPart:
    """Per-scene counts of distinct keys of each kind (finished scenes) over scenes ``lo ..``, per-scene
    minima and sums (``mins``, ``sums``: exact in any grouping), and the open scenes' distinct keys:
    ``[(scene, ((keys, masks), ...))]``, a pair of arrays per key space (sorted keys, and each
    key's kinds as the bits of a uint64 mask)."""

    n: int = 0
    lo: int = 0
    counts: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    mins: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    sums: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    open: list = field(default_factory=list)


def _merge_dense(a: np.ndarray, alo: int, b: np.ndarray, blo: int, lo: int, hi: int, fill, op) -> np.ndarray:
    """Rows ``lo .. hi - 1`` of two tables of rows (from ``alo``, ``blo``), ``op`` where both have one."""
    if alo == lo and blo + len(b) == hi and alo + len(a) - 1 <= blo <= alo + len(a) and a.shape[1] == b.shape[1]:
        # (neighbours in order, as the tree combines them: one row shared at most)
        if blo == alo + len(a):
            return np.concatenate([a, b])
        edge = op(a[-1:], b[:1])
        return np.concatenate([a[:-1], edge, b[1:]])
    out = np.full((hi - lo, max(a.shape[1], b.shape[1])), fill, np.result_type(a, b))
    for x, xlo in ((a, alo), (b, blo)):
        seg = slice(xlo - lo, xlo - lo + len(x))
        out[seg] = op(out[seg], x)
    return out


def _join_space(a: tuple, b: tuple) -> tuple:
    """Two key spaces' ``(keys, masks)`` of one scene as one: the union of the keys, masks OR'd."""
    if a[0].dtype == np.uint64 and b[0].dtype == np.uint64:  # (track ids, frames: a merge)
        return union_masks(a[0], a[1], b[0], b[1])
    keys, inverse = unique_inverse(np.concatenate([a[0], b[0]]))
    masks = np.zeros(len(keys), np.uint64)
    np.bitwise_or.at(masks, inverse, np.concatenate([a[1], b[1]]))
    return keys, masks


def unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` by one stable sort (``np.unique`` imports
    numpy.ma, 35 ms of a command's start)."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    first = np.ones(len(values), bool)
    first[1:] = ordered[1:] != ordered[:-1]
    inverse = np.empty(len(values), np.int64)
    inverse[order] = np.cumsum(first) - 1
    return ordered[first], inverse


def _space_counts(masks: np.ndarray, nbits: int) -> np.ndarray:
    """How many keys have each bit of their mask."""
    return mask_counts(np.ascontiguousarray(masks, np.uint64), nbits)


def finish_counts(part: KeyPart, opens: list, bits: tuple[int, ...]) -> KeyPart:
    """``part`` with the distinct keys of ``opens`` added to its counts (their scenes finished)."""
    nkinds = sum(bits)
    for scene, spaces in opens:
        row = np.concatenate([_space_counts(m, nb) for (_, m), nb in zip(spaces, bits)])[None, :]
        if part.lo <= scene < part.lo + len(part.counts):
            part.counts[scene - part.lo] += row[0]
            continue
        hi = max(part.lo + len(part.counts), scene + 1)
        lo = min(part.lo, scene) if len(part.counts) else scene
        part.counts = _merge_dense(
            part.counts if len(part.counts) else np.zeros((0, nkinds), np.int64), part.lo, row, scene, lo, hi, 0, np.add
        )
        part.lo = lo
    return part


def keyed_part(
    n: int, scenes: np.ndarray, counts: np.ndarray, mins: np.ndarray, sums: np.ndarray, first: tuple, last: tuple
) -> KeyPart:
    """A chunk's partial from its runs of rows of one scene (``scenes``, increasing): each run's
    counts, minima and sums; the first and last runs' keys (a ``(keys, masks)`` per space), open."""
    s0, s1 = int(scenes[0]), int(scenes[-1])
    k = s1 - s0 + 1
    at = scenes - s0
    part = KeyPart(n, s0)
    part.mins = np.full((k, mins.shape[1]), np.inf)
    part.mins[at] = mins
    part.sums = np.zeros((k, sums.shape[1]), np.int64)
    part.sums[at] = sums
    part.counts = np.zeros((k, counts.shape[1]), np.int64)
    part.counts[at[1:-1]] = counts[1:-1]
    part.open = [(s0, first)] + ([(s1, last)] if len(scenes) > 1 else [])
    return part


def combine_keys(a: KeyPart, b: KeyPart, bits: tuple[int, ...]) -> KeyPart:
    if a.n == 0:
        return b
    if b.n == 0:
        return a
    lo, hi = min(a.lo, b.lo), max(a.lo + len(a.mins), b.lo + len(b.mins))
    out = KeyPart(
        a.n + b.n,
        lo,
        _merge_dense(a.counts, a.lo, b.counts, b.lo, lo, hi, 0, np.add),
        _merge_dense(a.mins, a.lo, b.mins, b.lo, lo, hi, np.inf, np.minimum),
        _merge_dense(a.sums, a.lo, b.sums, b.lo, lo, hi, 0, np.add),
    )
    opens: list = []
    for scene, p in a.open + b.open:
        if opens and opens[-1][0] == scene:
            opens[-1] = (scene, tuple(_join_space(x, y) for x, y in zip(opens[-1][1], p)))
        else:
            opens.append((scene, p))
    out = finish_counts(out, opens[1:-1], bits)
    out.open = [opens[0]] + ([opens[-1]] if len(opens) > 1 else [])
    return out


#: What an agent gives the catalog, gathered from the stored bytes: its centroid and track id
#: (and the argmax of its label probabilities, and their maximum).
AGENT_ELEMENTS = (("centroid", (0,)), ("centroid", (1,)), ("track_id", ()))
#: The per-row column the report's agents loop makes of the same rows in a fused pass
#: (``l5dask.prediction.stats.SHARED_COLUMNS``), which the catalog's loop then takes.
DISTANCE = "distance_to_ego"


def agents_chunk(agents: Any, lo: int, frames: Rows, groups: np.ndarray) -> KeyPart:
    """Keys ``track``, an agent's kinds the bits of its mask (:func:`~l5dask.prediction.kernels.catalog_agents`):
    its label; its label's group (``groups``) within 10 m (bit ``nlabels + group``) and 30 m
    (``nlabels + 3 + group``). Minima: the distance of pedestrians, of cyclists; sums: agents
    under the confidence threshold."""
    n = len(agents)
    if not n:
        return KeyPart()
    values: list[np.ndarray] = []
    if isinstance(agents, np.ndarray):
        columns, (label,) = gather(agents, list(AGENT_ELEMENTS), ["label_probabilities"], values=values)
    else:  # (the stored bytes: the columns gathered without making records)
        columns, (label,) = agents.gather(AGENT_ELEMENTS, ["label_probabilities"], values=values)
    cx, cy, track = columns
    masks = np.empty(n, np.uint64)
    # (each row's distance to its ego, made by the report's agents loop of the same rows when fused
    # with it: the same bits; else made here)
    made = getattr(agents, "derived", None)
    dist = made(DISTANCE) if made is not None else None
    # (a bijection onto uint64: distinct ids stay distinct)
    keys = track if track.dtype == np.uint64 else track.astype(np.int64).view(np.uint64)
    cuts, scenes, mins, lows, counts, nkeys, first, last = catalog_agents(
        label,
        values[0],
        np.ascontiguousarray(cx, np.float64),
        np.ascontiguousarray(cy, np.float64),
        frames["agent_start"],
        frames["ego_xy"],
        frames["scene"],
        lo,
        groups,
        NEAR_M[0],
        NEAR_M[1],
        LOW_CONFIDENCE,
        masks,
        dist,
        keys,
    )
    if track.dtype == np.uint64 and hasattr(agents, "leave"):
        # (every row's mask holds its label's bit: a run's keys are its distinct tracks, which the
        # report of a fused pass counts too: left for it, the same arrays as its track_runs')
        agents.leave(SCENE_TRACKS, (scenes, nkeys, first[0], last[0]))
    return keyed_part(n, scenes, counts, mins, lows[:, None], (first,), (last,))


def faces_chunk(faces: Any, lo: int, frames: Rows) -> KeyPart:
    """Two key spaces: face ids (kind 0: seen), and frames (kinds ``1 + status``: a face of that
    status in the frame, the status the argmax of ``traffic_light_face_status``: ACTIVE, INACTIVE,
    UNKNOWN)."""
    n = len(faces)
    if not n:
        return KeyPart()
    ncols = faces.dtype["traffic_light_face_status"].shape[0]
    if ncols != len(fmt.TL_FACE_STATUSES):
        raise ValueError(f"traffic_light_face_status has {ncols} columns, but there are 3 statuses")
    found: list[np.ndarray] = []
    found_codes: list[np.ndarray] = []
    argmax = ["traffic_light_face_status"]
    if isinstance(faces, np.ndarray):
        _, (status,) = gather(faces, [], argmax, "face_id", found, codes=found_codes)
    else:  # (the ids' codes and the statuses found in the stored bytes: no ids copied out)
        _, (status,) = faces.gather([], argmax, "face_id", found, codes=found_codes)
    # each chunk's values and codes, as codes of the task's distinct values
    ids, inverse = unique_inverse(np.concatenate(found))
    # (the frames of these faces first: a task's frames are many more than a group of chunks')
    near = frames.overlapping(lo, lo + n, "tl_start")
    scenes, counts, f_codes, l_codes, f_frames, f_masks, l_frames, l_masks = face_runs(
        np.ascontiguousarray(found_codes[0], np.int32),  # (each row's, among all chunks' values found)
        inverse,
        max(len(ids), 1),
        np.ascontiguousarray(status, np.int8),
        near["tl_start"],
        near["scene"],
        near.offset,
        lo,
    )

    def by_id(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # (the codes as the ids, sorted)
        return ids[np.sort(codes).astype(np.int64)], np.ones(len(codes), np.uint64)

    return keyed_part(
        n,
        scenes,
        counts,
        np.zeros((len(scenes), 0)),
        np.zeros((len(scenes), 0), np.int64),
        (by_id(f_codes), (f_frames, f_masks)),
        (by_id(l_codes), (l_frames, l_masks)),
    )


def _groups_of(labels: tuple[str, ...]) -> np.ndarray:
    """Each label's group (0 vehicles, 1 pedestrians, 2 cyclists; -1 none), int8."""
    out = np.full(len(labels), -1, np.int8)
    for g, names in enumerate(GROUPS.values()):
        for i, name in enumerate(labels):
            if name in names:
                out[i] = g
    return out


def agents_reduction(labels: tuple[str, ...]) -> Reduction:
    nlabels = len(labels)
    if nlabels + 6 > 64:
        raise ValueError(f"the catalog counts tracks of at most 58 labels, not {nlabels}")
    return Reduction(
        f"catalog-agents-{nlabels}",
        functools.partial(agents_chunk, groups=_groups_of(labels)),
        functools.partial(combine_keys, bits=(nlabels + 6,)),
        KeyPart,
        exact=True,  # (distinct keys, minima, integer sums)
        reads=(AGENT_ELEMENTS, ("label_probabilities",), ("label_probabilities",), (DISTANCE,)),
        leaves=(SCENE_TRACKS,),
    )


FACE_BITS = (1, 3)
FACES_REDUCTION = Reduction(
    "catalog-faces", faces_chunk, functools.partial(combine_keys, bits=FACE_BITS), KeyPart, exact=True
)


def _dense(part: KeyPart, bits: tuple[int, ...], n_scenes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Counts, minima and sums of every scene (the open ones finished)."""
    part = finish_counts(part, part.open, bits) if part.n else part
    counts = np.zeros((n_scenes, sum(bits)), np.int64)
    mins = np.full((n_scenes, part.mins.shape[1] if part.n else 0), np.inf)
    sums = np.zeros((n_scenes, part.sums.shape[1] if part.n else 0), np.int64)
    if part.n:
        counts[part.lo : part.lo + len(part.counts)] = part.counts
        mins[part.lo : part.lo + len(part.mins)] = part.mins
        sums[part.lo : part.lo + len(part.sums)] = part.sums
    return counts, mins, sums


def check_tz(tz: str) -> str:
    """``tz`` if it names a time zone (IANA), else a one-line :class:`~l5dask.errors.UsageError`."""
    import zoneinfo

    if not isinstance(tz, str):
        raise UsageError(f"a time zone is a name of the IANA database (e.g. {DEFAULT_TZ!r}), not {tz!r}")
    try:
        zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        # (the database's names are spelled with their capitals: 'utc' is 'UTC')
        near = [n for n in zoneinfo.available_timezones() if n.lower() == tz.lower()]
        hint = f"; did you mean {near[0]!r}?" if near else f": name one of the IANA database (e.g. {DEFAULT_TZ!r})"
        raise UsageError(f"unknown time zone {tz!r}{hint}") from None
    return tz


def local_clock(ns: np.ndarray, tz: str) -> tuple[np.ndarray, np.ndarray]:
    """The hour (0-23) and weekday (0 = Monday) in ``tz`` of each instant (int64 nanoseconds since
    the epoch, UTC; the second it is in), by the tz database's rules (``zoneinfo``): pyarrow's
    ``hour`` and ``day_of_week`` of the instants cast to ``tz``, whose module cost 28 ms of a
    command's start (these take 9 ms for train_full's 16,265 scenes)."""
    import datetime
    import zoneinfo

    zone = zoneinfo.ZoneInfo(tz)
    secs = np.floor_divide(np.asarray(ns, np.int64), 10**9)
    local = [datetime.datetime.fromtimestamp(s, zone) for s in secs.reshape(-1).tolist()]
    return (
        np.array([t.hour for t in local], np.int64).reshape(secs.shape),
        np.array([t.weekday() for t in local], np.int64).reshape(secs.shape),
    )


def assemble(
    scenes: np.ndarray,
    labels: tuple[str, ...],
    tz: str,
    fp: RunsPart,
    ap: KeyPart | None = None,
    tp: KeyPart | None = None,
):
    """The catalog (a pyarrow Table: no pandas needed to write it) from the three combined partials."""
    import pyarrow as pa

    n = len(scenes)
    table = np.full((n, len(FRAME_COLUMNS)), np.nan)
    table[:, [0, 1, 2, 8, 9, 10]] = 0  # (a scene without frames)
    table[fp.done_scenes] = fp.done
    for scene, p in fp.open:
        table[scene] = finish_frames(p)[0]
    iv = scenes["frame_index_interval"].reshape(-1, 2)
    utc = pa.timestamp("ns", tz="UTC")
    start = arrow_array(scenes["start_time"].astype(np.int64), utc)
    hour, weekday = local_clock(scenes["start_time"], tz)
    cols: dict[str, Any] = {
        "scene_index": np.arange(n, dtype=np.int64),
        "host": arrow_strings(scenes["host"].astype(str).tolist()),
        "start_time": start,
        "end_time": arrow_array(scenes["end_time"].astype(np.int64), utc),
        "local_hour": hour,
        "local_weekday": weekday,  # (0 = Monday)
        "num_frames": (iv[:, 1] - iv[:, 0]).astype(np.int64),
    }
    for j, name in enumerate(FRAME_COLUMNS):
        if name in ("turn", "turn_unwrapped"):
            code = table[:, j]
            known = ~np.isnan(code)
            tags = np.array(TURNS, object)[np.where(known, code, 0).astype(np.int64)]
            cols[name] = arrow_strings(tags.tolist(), known)
        else:
            cols[name] = table[:, j].astype(np.int64) if name in INT_FRAME_COLUMNS else table[:, j]
    nl = len(labels)
    counts, mins, sums = _dense(ap if ap is not None else KeyPart(), (nl + 6,), n)
    for i, name in enumerate(labels):
        cols[label_column(name)] = counts[:, i]
    for r, radius in enumerate(NEAR_M):
        for g, group in enumerate(GROUPS):
            cols[f"{group}_within_{int(radius)}m"] = counts[:, nl + 3 * r + g]
    inf_nan = lambda x: np.where(np.isinf(x), np.nan, x)  # noqa: E731
    cols["closest_pedestrian_m"] = inf_nan(mins[:, 0]) if mins.shape[1] else np.full(n, np.nan)
    cols["closest_cyclist_m"] = inf_nan(mins[:, 1]) if mins.shape[1] else np.full(n, np.nan)
    fc, _, _ = _dense(tp if tp is not None else KeyPart(), FACE_BITS, n)
    cols["tl_faces_seen"] = fc[:, 0]
    frames = cols["num_frames"]
    for k, status in enumerate(fmt.TL_FACE_STATUSES):
        cols[f"tl_{status.lower()}_share"] = np.where(frames > 0, fc[:, 1 + k] / np.maximum(frames, 1), np.nan)
    cols["low_confidence_agents"] = sums[:, 0] if sums.shape[1] else np.zeros(n, np.int64)
    table = pa.Table.from_arrays(
        [c if isinstance(c, pa.Array) else arrow_array(np.asarray(c)) for c in cols.values()], names=list(cols)
    )
    # (the digest of the scenes' records, for the fingerprint: from the records read here)
    return table.replace_schema_metadata({SCENES_KEY: scenes_digest(scenes).encode()})


CATALOG_AGENT_FIELDS = ("centroid", "track_id", "label_probabilities")


@where_keywords
def catalog_table(
    dataset: Any,
    *,
    tz: str = DEFAULT_TZ,
    storage_options: dict | None = None,
    chunks_per_task: int | None = None,
    progress: bool = False,
    scheduler: Any = None,
    cache: Any = None,
):
    """The scene catalog of ``dataset`` as a pyarrow Table, one row per scene, from one parallel
    pass over its frames, agents and traffic-light faces (columns: ``docs/guide/catalog.md``); the
    dataset's :func:`~l5dask.prediction.scenes.fingerprint` in its schema metadata (key ``l5dask.catalog``, JSON).

    Parameters
    ----------
    dataset : str, path or L5Dataset
    tz : str
        The time zone (IANA name) of ``local_hour`` and ``local_weekday``: Palo Alto's by default.
    storage_options, chunks_per_task, progress, scheduler, cache
        As for :func:`l5dask.prediction.report.compute_report`.
    """

    check_tz(tz)
    ds = dataset if isinstance(dataset, L5Dataset) else open_dataset(dataset, storage_options=storage_options)
    job = Job(
        scheduler,
        chunks_per_task=chunks_per_task,
        progress=progress,
        size_for=ds[fmt.AGENTS].nchunks,
        cache=open_cache(cache, storage_options),
    )
    (table,) = job.run([catalog_plan(ds, job, tz)])
    return with_fingerprint(table, ds)


def catalog_plan(ds: L5Dataset, job: Job, tz: str = DEFAULT_TZ) -> Plan:
    """The catalog declared (:class:`~l5dask.core.engine.Plan`), to run alone or with other
    analyses of the dataset in one pass (:func:`l5dask.analyze <l5dask.prediction.analyses.analyze>`):
    the scenes read whole, the frames pass (persisted), then agents and faces, each task given only
    the frame rows it overlaps. Its result (a pyarrow Table) lacks the fingerprint (``with_fingerprint``)."""
    counts = ds.counts()
    frames = ds[fmt.FRAMES]
    frames = frames.select([f for f in FRAME_FIELDS if f in fmt.names_of(frames.dtype)])
    agents = ds[fmt.AGENTS].select(CATALOG_AGENT_FIELDS)
    has_tl = ds.has(fmt.TL_FACES) and "traffic_light_faces_index_interval" in fmt.names_of(frames.dtype)
    scenes = job.read(ds[fmt.SCENES])
    check_intervals(scenes["frame_index_interval"].reshape(-1, 2), fmt.SCENES, "frame_index_interval", counts["frames"])
    intervals = {"agent_index_interval": counts["agents"]}
    if has_tl:
        intervals["traffic_light_faces_index_interval"] = counts["tl_faces"]
    frame_pass = Pass(
        frames,
        FRAMES_REDUCTION,
        parent=Link(scene_rows(scenes), "start"),
        rows=functools.partial(catalog_frame_rows, has_tl=has_tl),
        intervals=intervals,
        blocks=True,
        name="catalog-frames",
    )
    passes: list = [
        frame_pass,
        Pass(
            agents,
            agents_reduction(ds.labels),
            parent=Link(frame_pass, "agent_start", "agent_index_interval"),
            encoded=True,  # the columns it needs gathered from each chunk's bytes, no records made
            name="catalog-agents",
        ),
    ]
    if has_tl:
        passes.append(
            Pass(
                ds[fmt.TL_FACES].select(["face_id", "traffic_light_face_status"]),
                FACES_REDUCTION,
                parent=Link(frame_pass, "tl_start", "traffic_light_faces_index_interval"),
                encoded=True,
                name="catalog-faces",
            )
        )
    return Plan(passes, final=assemble, args=(scenes, ds.labels, tz), name="l5-catalog", size_for=agents.nchunks)


def empty_catalog(ds: L5Dataset, tz: str = DEFAULT_TZ):
    """The catalog of ``ds`` with no row: its columns and their types (from the dataset's metadata,
    no chunk read), to check an expression over the catalog before the catalog is made."""
    return assemble(np.zeros(0, ds[fmt.SCENES].dtype), ds.labels, tz, RunsPart())


def with_fingerprint(table, ds: L5Dataset):
    """The catalog (a pyarrow Table) with the dataset's :func:`~l5dask.prediction.scenes.fingerprint` in its schema metadata."""
    meta = dict(table.schema.metadata or {})
    digest = meta.pop(SCENES_KEY.encode(), None)
    meta[CATALOG_KEY.encode()] = json.dumps(
        {"version": 1, **fingerprint(ds, digest.decode() if digest else None)}
    ).encode()
    if ds.parent is not None and ds.scene_indices is not None and "stored_scene_index" not in table.column_names:
        # (a restricted dataset's: its scene_index counts its scenes; the stored index maps back)
        import pyarrow as pa

        table = table.add_column(1, "stored_scene_index", pa.array(np.asarray(ds.scene_indices, np.int64)))
    return table.replace_schema_metadata(meta)


def as_frame(table):
    """The catalog (a pyarrow Table) as a pandas DataFrame, the fingerprint in ``attrs["l5dask"]``."""
    frame = table.to_pandas()
    frame.attrs["l5dask"] = catalog_metadata(table)
    return frame


@where_keywords
def catalog(dataset: Any, **options: Any):
    """The scene catalog of ``dataset``: a pandas DataFrame, one row per scene, from one parallel
    pass over its frames, agents and traffic-light faces (columns: ``docs/guide/catalog.md``); the
    dataset's :func:`~l5dask.prediction.scenes.fingerprint` in its ``attrs["l5dask"]``. The options are
    ``catalog_table``'s."""
    return as_frame(catalog_table(dataset, **options))


def catalog_metadata(table) -> dict[str, Any]:
    """The fingerprint of the dataset a catalog (a pyarrow Table or a Parquet schema) was made of."""
    meta = (table.schema if hasattr(table, "schema") else table).metadata or {}
    raw = meta.get(CATALOG_KEY.encode())
    if raw is None:
        return {}
    out = json.loads(raw)
    out.pop("version", None)
    return out


def check_output(path: str, storage_options: dict | None = None, overwrite: bool = False) -> None:
    """Refuse (one line) an output that cannot be written, or that exists unless ``overwrite``."""

    if not os.fspath(path).lower().endswith(".parquet"):
        raise UsageError(f"{path}: the catalog is written as Parquet; name the file *.parquet")
    check_writable(path, storage_options)
    if not overwrite and exists(path, storage_options):
        raise OutputError(f"{path}: already exists (pass overwrite=True / --overwrite)")


def write_catalog(table, path: str, storage_options: dict | None = None, overwrite: bool = False) -> None:
    """The catalog (a pyarrow Table, or a pandas DataFrame from :func:`~l5dask.prediction.catalog.catalog`) as Parquet, written
    atomically (refused if ``path`` exists, unless ``overwrite``), the dataset's ``fingerprint`` in
    its metadata (key ``l5dask.catalog``, JSON), and again where pandas keeps a DataFrame's
    ``attrs`` (key ``PANDAS_ATTRS``: ``{"l5dask": fingerprint}``): ``pandas.read_parquet`` gives
    the catalog with its fingerprint in ``attrs["l5dask"]``, as ``catalog`` does, which a
    filter keeps and ``to_parquet`` writes back (before, a catalog read with pandas had lost it)."""
    import pyarrow as pa

    check_output(path, storage_options, overwrite)
    attrs: dict = {}
    if isinstance(table, pa.Table):
        t = table
        found = catalog_metadata(t)
    else:
        t = pa.Table.from_pandas(table, preserve_index=False)
        attrs, found = dict(table.attrs), table.attrs.get("l5dask", {})
    meta = dict(t.schema.metadata or {})
    if found:  # (none: the file has none, and is refused as a catalog of a dataset, saying why)
        meta[CATALOG_KEY.encode()] = json.dumps({"version": 1, **found}).encode()
        try:
            meta[b"PANDAS_ATTRS"] = json.dumps({**attrs, "l5dask": found}).encode()
        except (TypeError, ValueError):  # (the DataFrame's other attrs are not JSON: its fingerprint alone)
            meta[b"PANDAS_ATTRS"] = json.dumps({"l5dask": found}).encode()
    write_table(t.replace_schema_metadata(meta), path, storage_options, ".parquet")


#: The cache's folder of scene catalogs (``--scenes`` with a cache and no ``--catalog``).
CACHE_FOLDER = "scene-catalogs"


def chunks_digest(ds: L5Dataset) -> str:
    """A digest of the identity of every stored chunk of ``ds``'s arrays, the one the cache keys
    its partials by (``chunk_identities()``: each chunk's path, rows, size and ETag or mtime/ctime/inode,
    from one listing of each array's folder; no chunk read where the store says these): a catalog
    kept in the cache is found only while every chunk it was computed from is unchanged (the
    fingerprint alone misses the agents, frames or faces rewritten in place)."""
    import hashlib

    h = hashlib.blake2b(digest_size=20)
    for name, arr in sorted(ds.arrays.items()):
        h.update(f"\0{name}\0".encode())
        for ident in arr.chunk_identities():
            h.update((ident if isinstance(ident, str) else cachelib.digest(ident)).encode() + b"\n")
    return h.hexdigest()


def cached_catalog(
    ds: L5Dataset,
    cache: Any,
    *,
    tz: str = DEFAULT_TZ,
    storage_options: dict | None = None,
    progress: bool = False,
    scheduler: Any = None,
    say: Any = None,
):
    """The catalog of ``ds`` kept in ``cache`` (a :class:`~l5dask.core.cache.Cache`), by the
    dataset's :func:`~l5dask.prediction.scenes.fingerprint` (all but its path), the identity of
    every stored chunk (:func:`chunks_digest`, the cache's own), ``tz`` and l5dask's version:
    read back when there (checked: the entry's digest, then the fingerprint in the Parquet's
    metadata), else computed (:func:`catalog_table`) and stored. The entry is the
    Parquet's bytes in one of the cache's own entries (:func:`~l5dask.core.cache.encode`: no
    pickle, written atomically); a damaged one is one warning and computed again. ``say`` (a
    function of one line) is told where the catalog came from. Returns a pyarrow Table (computed),
    or the kept Parquet as a ``pyarrow.parquet.ParquetFile`` (read back: a filter then decodes only
    the columns it names, as from ``--catalog``: 2 of 50 for ``turn == 'left'``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    print_ = say or (lambda line: None)
    mine = fingerprint(ds)
    ident = {k: v for k, v in mine.items() if k != "dataset"}
    key = cachelib.digest("scene-catalog", ident, chunks_digest(ds), tz, cachelib.version())
    folder = cache.folder_of(CACHE_FOLDER)
    path = posixpath.join(folder, cache.entry_name("scene-catalog", key))
    data = cache.read(path)
    if data is not None:
        try:
            raw = cachelib.decode(data)
            kept = pq.ParquetFile(pa.BufferReader(pa.py_buffer(np.ascontiguousarray(raw, np.uint8))))
            theirs = catalog_metadata(kept.schema_arrow)
            if theirs.get("arrays") != ident["arrays"] or theirs.get("scenes_sha256") != ident["scenes_sha256"]:
                raise cachelib.Damaged("its fingerprint is not the dataset's")
            if kept.metadata.num_rows != len(ds[fmt.SCENES]):
                raise cachelib.Damaged(f"it has {kept.metadata.num_rows:,} rows, not one a scene")
        except Exception as exc:  # noqa: BLE001 - any fault of a stored catalog: computed again
            cachelib.warn_once(
                "damaged-catalog", f"{cache.url}: ignoring a damaged scene catalog {path} ({exc}); computing it again"
            )
            cachelib.count(damaged=1)
        else:
            cachelib.count(hits=1, bytes_read=len(data))
            print_(f"l5dask: the scene catalog of {ds.url} for --scenes: read from the cache {cache.url}")
            return kept
    cachelib.count(misses=1)
    print_(f"l5dask: computing the scene catalog of {ds.url} for --scenes (kept in the cache {cache.url})")
    table = catalog_table(ds, tz=tz, storage_options=storage_options, progress=progress, scheduler=scheduler)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    cache.describe(folder, {"dataset": ds.url, "source": "scene catalogs"})
    cache.write(path, cachelib.encode(np.frombuffer(sink.getvalue(), np.uint8), {"reduction": "scene-catalog"}))
    return table
