"""The scene catalog (``docs/guide/catalog.md``): one row per scene, every column from one pass.

Declared over the engine (:mod:`l5dask.core.engine`) as the report is
(:mod:`l5dask.prediction.report`): the scenes read whole, a frames pass (persisted: its rows, the
agent and face starts, ego position and scene of each frame, are made again for the child tasks
that need them), then agents and traffic-light faces, each task given only the frame rows it
overlaps, and the three tree combines, in one compute.

Exact whatever the tasks: a partial holds the finished rows of the scenes wholly inside its rows,
and for the (at most two) scenes at its edges, which may go on in the neighbouring partials, what
they need to be finished: their raw frames (tens to a few hundred), or their distinct
(kind, track) keys. Combining two neighbouring partials finishes each scene that is no longer at
an edge; ``finalize`` the rest. Every per-scene value is so computed from all its rows at once,
by the same function, whatever the chunks and tasks.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from l5dask.core.engine import Job, Link, Pass, Plan, Reduction, Rows
from l5dask.core.intervals import check_intervals
from l5dask.core.outputs import check_writable, filesystem, table_format, write_table
from l5dask.errors import OutputError, UsageError
from l5dask.prediction import format as fmt
from l5dask.prediction.dataset import L5Dataset, open_dataset
from l5dask.prediction.joins import scene_rows
from l5dask.prediction.kernels import gather

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


def turn_tag(yaw: np.ndarray) -> str | None:
    """L5Kit's ``identify_turn`` of one scene's yaws (``None`` where it raises: under 50 frames)."""
    if len(yaw) < TIME_DURATION_TURN:
        return None
    diff = yaw[TIME_DURATION_TURN:] - yaw[:-TIME_DURATION_TURN]
    if np.sum(diff >= TURN_THRESH):
        return "left"
    if np.sum(diff <= -TURN_THRESH):
        return "right"
    return "straight"


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


def _nanmax(x: np.ndarray) -> float:
    x = x[~np.isnan(x)]
    return float(x.max()) if len(x) else float("nan")


def scene_frame_row(ts: np.ndarray, xy: np.ndarray, yaw: np.ndarray, agents: np.ndarray) -> tuple:
    """One scene's frame columns (:data:`FRAME_COLUMNS`) from all its frames, in order."""
    dt = np.diff(ts)
    dts = dt / 1e9
    step = np.sqrt(((xy[1:] - xy[:-1]) ** 2).sum(1))
    ok = dt > 0
    speed = np.full(len(dt), np.nan)
    speed[ok] = step[ok] / dts[ok]
    accel = (speed[1:] - speed[:-1]) / ((dts[1:] + dts[:-1]) / 2) if len(dt) > 1 else np.zeros(0)
    dyaw = (np.diff(yaw) + np.pi) % (2 * np.pi) - np.pi
    rate = np.full(len(dt), np.nan)
    rate[ok] = np.abs(dyaw[ok]) / dts[ok]
    stopped = ok & (speed < STOP_SPEED_MPS)
    stops = 0
    run = 0.0
    for s, d in zip(stopped.tolist(), dts.tolist()):
        if s:
            run += d
            continue
        stops += run >= STOP_MIN_S
        run = 0.0
    stops += run >= STOP_MIN_S
    duration = (int(ts[-1]) - int(ts[0])) / 1e9
    path = float(step.sum())
    return (
        duration,
        int(np.count_nonzero(np.abs(dt - FRAME_STEP_NS) > GAP_TOLERANCE_NS)),
        path,
        path / duration if duration > 0 else float("nan"),
        _nanmax(speed),
        _nanmax(accel),
        _nanmax(-accel),
        _nanmax(rate),
        float(dts[stopped].sum()),
        int(stops),
        int(agents.max()),
        turn_tag(yaw),
        turn_tag(np.unwrap(yaw)),
    )


@dataclass
class RunsPart:
    """Finished rows ``{scene: row}`` and the scenes at the two edges, still open: ``[(scene, payload)]``."""

    n: int = 0
    done: dict = field(default_factory=dict)
    open: list = field(default_factory=list)


def combine_runs(a: RunsPart, b: RunsPart, join, finish) -> RunsPart:
    """Two neighbouring partials: open scenes met again joined (``join``), those no longer at an
    edge finished (``finish(scene, payload) -> row``)."""
    if a.n == 0:
        return b
    if b.n == 0:
        return a
    opens: list = []
    for scene, p in a.open + b.open:
        if opens and opens[-1][0] == scene:
            opens[-1] = (scene, join(opens[-1][1], p))
        else:
            opens.append((scene, p))
    done = {**a.done, **b.done}
    for scene, p in opens[1:-1]:
        done[scene] = finish(scene, p)
    return RunsPart(a.n + b.n, done, [opens[0]] + ([opens[-1]] if len(opens) > 1 else []))


def runs(scene: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of each run of equal (sorted) scene numbers."""
    cut = np.flatnonzero(scene[1:] != scene[:-1]) + 1
    return np.concatenate([[0], cut]), np.concatenate([cut, [len(scene)]])


def catalog_frame_rows(frames: np.ndarray, offset: int, scenes: Rows, has_tl: bool) -> Rows:
    """What agents and faces need of their frames: their starts, the ego's x/y, the scene."""
    cols = {
        "agent_start": np.ascontiguousarray(frames["agent_index_interval"][:, 0]),
        "ego_xy": np.ascontiguousarray(frames["ego_translation"][:, :2], dtype=np.float64),
        "scene": scenes.offset + scenes.locate(offset, offset + len(frames), "start"),
    }
    if has_tl:
        cols["tl_start"] = np.ascontiguousarray(frames["traffic_light_faces_index_interval"][:, 0])
    return Rows(offset, cols)


def _join_frames(a: tuple, b: tuple) -> tuple:
    return tuple(np.concatenate([x, y]) for x, y in zip(a, b))


def _finish_frames(scene: int, p: tuple) -> tuple:
    return scene_frame_row(*p)


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
    for i, (a, b) in enumerate(zip(starts.tolist(), ends.tolist())):
        p = tuple(c[a:b] for c in cols)
        if i == 0 or i == len(starts) - 1:
            part.open.append((int(scene[a]), p))
        else:
            part.done[int(scene[a])] = scene_frame_row(*p)
    return part


FRAMES_REDUCTION = Reduction(
    "catalog-frames",
    frames_chunk,
    functools.partial(combine_runs, join=_join_frames, finish=_finish_frames),
    RunsPart,
    exact=True,  # (each scene's row made from all its frames at once)
)


# --- agents and faces: distinct keys per scene, per-scene minima and sums ------------------
@dataclass
class KeyPart:
    """Per-scene counts of distinct keys of each kind (finished scenes) over scenes ``lo ..``, per-scene
    minima and sums (``mins``, ``sums``: exact in any grouping), and the open scenes' distinct
    ``(kind, key)`` pairs (two sorted arrays)."""

    n: int = 0
    lo: int = 0
    counts: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    mins: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    sums: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    open: list = field(default_factory=list)


def _merge_dense(a: np.ndarray, alo: int, b: np.ndarray, blo: int, lo: int, hi: int, fill, op) -> np.ndarray:
    out = np.full((hi - lo, max(a.shape[1], b.shape[1])), fill, np.result_type(a, b))
    for x, xlo in ((a, alo), (b, blo)):
        seg = slice(xlo - lo, xlo - lo + len(x))
        out[seg] = op(out[seg], x)
    return out


def _unique_pairs(kind: np.ndarray, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.lexsort((key, kind))
    kind, key = kind[order], key[order]
    keep = np.ones(len(kind), bool)
    keep[1:] = (kind[1:] != kind[:-1]) | (key[1:] != key[:-1])
    return kind[keep], key[keep]


def _join_keys(a: tuple, b: tuple) -> tuple:
    return _unique_pairs(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))


def finish_counts(part: KeyPart, opens: list, nkinds: int) -> KeyPart:
    """``part`` with the distinct keys of ``opens`` added to its counts (their scenes finished)."""
    for scene, (kind, _) in opens:
        row = np.bincount(kind, minlength=nkinds)[None, :].astype(np.int64)
        hi = max(part.lo + len(part.counts), scene + 1)
        lo = min(part.lo, scene) if len(part.counts) else scene
        part.counts = _merge_dense(
            part.counts if len(part.counts) else np.zeros((0, nkinds), np.int64), part.lo, row, scene, lo, hi, 0, np.add
        )
        part.lo = lo
    return part


#: Bits of the one sort key of (scene, kind, track) triples (the fast path of :func:`distinct_triples`).
_KIND_BITS, _KEY_BITS = 5, 40


def distinct_triples(scene: np.ndarray, kind: np.ndarray, key: np.ndarray, nkinds: int) -> tuple:
    """The distinct ``(scene, kind, key)`` triples, sorted: one sort of a uint64 that packs them
    when they fit (``scene`` from 0, under 2**19; ``kind`` under 32; integer keys under 2**40, as
    track ids are), else a lexsort of the three."""
    if (
        len(key)
        and key.dtype.kind in "iu"
        and nkinds <= 1 << _KIND_BITS
        and int(scene.max()) < 1 << (64 - _KIND_BITS - _KEY_BITS)
        and int(key.min()) >= 0
        and int(key.max()) < 1 << _KEY_BITS
    ):
        packed = (
            (scene.astype(np.uint64) << np.uint64(_KIND_BITS + _KEY_BITS))
            | (key.astype(np.uint64) << np.uint64(_KIND_BITS))
            | kind.astype(np.uint64)
        )
        u = np.unique(packed)
        return (
            (u >> np.uint64(_KIND_BITS + _KEY_BITS)).astype(np.int64),
            (u & np.uint64((1 << _KIND_BITS) - 1)).astype(np.int64),
            ((u >> np.uint64(_KIND_BITS)) & np.uint64((1 << _KEY_BITS) - 1)).astype(key.dtype),
        )
    order = np.lexsort((key, kind, scene))
    ms, mk, mx = scene[order], kind[order], key[order]
    keep = np.ones(len(ms), bool)
    keep[1:] = (ms[1:] != ms[:-1]) | (mk[1:] != mk[:-1]) | (mx[1:] != mx[:-1])
    return ms[keep], mk[keep], mx[keep]


def keyed_part(n: int, scene: np.ndarray, m_scene, m_kind, m_key, nkinds: int, mins, sums) -> KeyPart:
    """A chunk's partial: rows' ``scene`` (sorted), memberships ``(m_scene, m_kind, m_key)``,
    per-row ``mins`` and ``sums``."""
    s0, s1 = int(scene[0]), int(scene[-1])
    k = s1 - s0 + 1
    local = scene - s0
    part = KeyPart(n, s0)
    a, _ = runs(scene)  # (rows are ordered by scene: a run each)
    at = local[a]
    part.mins = np.full((k, mins.shape[1]), np.inf)
    part.sums = np.zeros((k, sums.shape[1]), np.int64)
    if mins.shape[1]:
        part.mins[at] = np.minimum.reduceat(mins, a, axis=0)
    if sums.shape[1]:
        part.sums[at] = np.add.reduceat(sums, a, axis=0)
    ms, mk, mx = distinct_triples(m_scene - s0, m_kind, m_key, nkinds)
    ms = ms + s0
    part.counts = np.zeros((k, nkinds), np.int64)
    inner = (ms != s0) & (ms != s1)
    part.counts += np.bincount((ms[inner] - s0) * nkinds + mk[inner], minlength=k * nkinds).reshape(k, nkinds)
    for s in sorted({s0, s1}):
        at = ms == s
        part.open.append((s, (mk[at], mx[at])))
    return part


def combine_keys(a: KeyPart, b: KeyPart, nkinds: int) -> KeyPart:
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
            opens[-1] = (scene, _join_keys(opens[-1][1], p))
        else:
            opens.append((scene, p))
    out = finish_counts(out, opens[1:-1], nkinds)
    out.open = [opens[0]] + ([opens[-1]] if len(opens) > 1 else [])
    return out


def agents_chunk(agents: np.ndarray, lo: int, frames: Rows, nlabels: int, groups: np.ndarray) -> KeyPart:
    """Memberships: ``(label, track)`` of every agent (kind = label); ``(group, track)`` of agents of a
    group within 10 m (kind ``nlabels + group``) and 30 m (``nlabels + 3 + group``). Minima: the
    distance of pedestrians, of cyclists; sums: agents under the confidence threshold."""
    n = len(agents)
    if not n:
        return KeyPart()
    pos = frames.locate(lo, lo + n, "agent_start")
    scene = frames["scene"][pos]
    ego = frames["ego_xy"][pos]
    elements = agent_elements(nlabels)
    if isinstance(agents, np.ndarray):
        columns, (label,) = gather(agents, elements, ["label_probabilities"])
    else:  # (the stored bytes: the columns gathered without making records)
        columns, (label,) = agents.gather(elements, ["label_probabilities"])
    cx, cy, track = columns[:3]
    dist = np.sqrt((cx - ego[:, 0]) ** 2 + (cy - ego[:, 1]) ** 2)
    top = np.maximum.reduce(columns[3:]) if nlabels else np.zeros(n, np.float32)
    label = label.astype(np.int64)
    group = groups[label]
    kinds, keys, owners = [label.astype(np.int64)], [track], [scene]
    for i, radius in enumerate(NEAR_M):
        near = (group >= 0) & (dist <= radius)
        kinds.append(nlabels + 3 * i + group[near])
        keys.append(track[near])
        owners.append(scene[near])
    mins = np.stack([np.where(group == 1, dist, np.inf), np.where(group == 2, dist, np.inf)], 1)
    sums = (top < LOW_CONFIDENCE).astype(np.int64)[:, None]
    return keyed_part(
        n, scene, np.concatenate(owners), np.concatenate(kinds), np.concatenate(keys), nlabels + 6, mins, sums
    )


def agent_elements(nlabels: int) -> list[tuple[str, tuple[int, ...]]]:
    """The numbers the agents' partials gather: centroid, track and each label's probability."""
    return [("centroid", (0,)), ("centroid", (1,)), ("track_id", ())] + [
        ("label_probabilities", (k,)) for k in range(nlabels)
    ]


def as_key(values: np.ndarray) -> np.ndarray:
    """Values (face ids ``<U16``, frame numbers) as byte strings, one to one (``S`` strips trailing
    NULs, which padding gives back), so that ids and frames sort and compare in one key array."""
    values = np.ascontiguousarray(values)
    if values.dtype.kind in "iu":
        values = values.astype(">i8")
    return values.view(f"S{values.dtype.itemsize}").astype("S64")


def faces_chunk(faces: np.ndarray, lo: int, frames: Rows) -> KeyPart:
    """Memberships: ``(0, face id)`` of every face; ``(1 + status, frame)`` of its frame, its status
    the argmax of ``traffic_light_face_status`` (ACTIVE, INACTIVE, UNKNOWN)."""
    n = len(faces)
    if not n:
        return KeyPart()
    pos = frames.locate(lo, lo + n, "tl_start")
    scene = frames["scene"][pos]
    frame = (frames.offset + pos).astype(np.int64)
    status = np.argmax(faces["traffic_light_face_status"], axis=1).astype(np.int64)
    kinds = np.concatenate([np.zeros(n, np.int64), 1 + status])
    keys = np.concatenate([as_key(faces["face_id"]), as_key(frame)])
    owners = np.concatenate([scene, scene])
    return keyed_part(n, scene, owners, kinds, keys, 4, np.zeros((n, 0)), np.zeros((n, 0), np.int64))


def _groups_of(labels: tuple[str, ...]) -> np.ndarray:
    """Each label's group (0 vehicles, 1 pedestrians, 2 cyclists; -1 none)."""
    out = np.full(len(labels), -1, np.int64)
    for g, names in enumerate(GROUPS.values()):
        for i, name in enumerate(labels):
            if name in names:
                out[i] = g
    return out


def agents_reduction(labels: tuple[str, ...]) -> Reduction:
    nlabels = len(labels)
    return Reduction(
        f"catalog-agents-{nlabels}",
        functools.partial(agents_chunk, nlabels=nlabels, groups=_groups_of(labels)),
        functools.partial(combine_keys, nkinds=nlabels + 6),
        KeyPart,
        exact=True,  # (distinct keys, minima, integer sums)
        reads=(agent_elements(nlabels), ("label_probabilities",)),
    )


FACES_REDUCTION = Reduction(
    "catalog-faces", faces_chunk, functools.partial(combine_keys, nkinds=4), KeyPart, exact=True
)


def _dense(part: KeyPart, nkinds: int, n_scenes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Counts, minima and sums of every scene (the open ones finished)."""
    part = finish_counts(part, part.open, nkinds) if part.n else part
    counts = np.zeros((n_scenes, nkinds), np.int64)
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

    try:
        zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise UsageError(f"unknown time zone {tz!r}: name one of the IANA database (e.g. {DEFAULT_TZ!r})") from None
    return tz


def assemble(
    scenes: np.ndarray,
    labels: tuple[str, ...],
    tz: str,
    fp: RunsPart,
    ap: KeyPart | None = None,
    tp: KeyPart | None = None,
):
    """The catalog (a pandas DataFrame) from the three combined partials."""
    import pandas as pd

    n = len(scenes)
    done = dict(fp.done)
    for scene, p in fp.open:
        done[scene] = scene_frame_row(*p)
    iv = scenes["frame_index_interval"].reshape(-1, 2)
    start = pd.to_datetime(scenes["start_time"].astype(np.int64), unit="ns", utc=True)
    local = start.tz_convert(tz)
    cols: dict[str, Any] = {
        "scene_index": np.arange(n, dtype=np.int64),
        "host": scenes["host"].astype(str),
        "start_time": start,
        "end_time": pd.to_datetime(scenes["end_time"].astype(np.int64), unit="ns", utc=True),
        "local_hour": np.asarray(local.hour, np.int64),
        "local_weekday": np.asarray(local.day_of_week, np.int64),
        "frames": (iv[:, 1] - iv[:, 0]).astype(np.int64),
    }
    empty = (0.0, 0, 0.0) + (float("nan"),) * 5 + (0.0, 0, 0, None, None)
    rows = [done.get(i, empty) for i in range(n)]
    for j, name in enumerate(FRAME_COLUMNS):
        values = [r[j] for r in rows]
        if name in ("turn", "turn_unwrapped"):
            cols[name] = pd.array(values, dtype="string")
        else:
            cols[name] = np.asarray(values, np.int64 if isinstance(empty[j], int) else np.float64)
    nl = len(labels)
    counts, mins, sums = _dense(ap if ap is not None else KeyPart(), nl + 6, n)
    for i, name in enumerate(labels):
        cols[label_column(name)] = counts[:, i]
    for r, radius in enumerate(NEAR_M):
        for g, group in enumerate(GROUPS):
            cols[f"{group}_within_{int(radius)}m"] = counts[:, nl + 3 * r + g]
    inf_nan = lambda x: np.where(np.isinf(x), np.nan, x)  # noqa: E731
    cols["closest_pedestrian_m"] = inf_nan(mins[:, 0]) if mins.shape[1] else np.full(n, np.nan)
    cols["closest_cyclist_m"] = inf_nan(mins[:, 1]) if mins.shape[1] else np.full(n, np.nan)
    fc, _, _ = _dense(tp if tp is not None else KeyPart(), 4, n)
    cols["tl_faces_seen"] = fc[:, 0]
    frames = cols["frames"]
    for k, status in enumerate(fmt.TL_FACE_STATUSES):
        cols[f"tl_{status.lower()}_share"] = np.where(frames > 0, fc[:, 1 + k] / np.maximum(frames, 1), np.nan)
    cols["low_confidence_agents"] = sums[:, 0] if sums.shape[1] else np.zeros(n, np.int64)
    return pd.DataFrame(cols)


CATALOG_AGENT_FIELDS = ("centroid", "track_id", "label_probabilities")


def fingerprint(ds) -> dict[str, Any]:
    """What identifies the dataset a catalog was made of: its path, each array's length and chunk
    size, and a digest of each array's stored metadata (``.zarray``)."""
    arrays = {}
    for name, arr in ds.arrays.items():
        raw = ds.store.get_metadata(f"{name}/.zarray") or b""
        arrays[name] = {
            "length": len(arr),
            "chunk_rows": arr.meta.chunk_rows,
            "nchunks": arr.meta.nchunks,
            "zarray_sha256": hashlib.sha256(raw).hexdigest(),
        }
    return {"dataset": ds.url, "arrays": arrays}


def catalog(
    dataset: Any,
    *,
    tz: str = DEFAULT_TZ,
    storage_options: dict | None = None,
    chunks_per_task: int | None = None,
    progress: bool = False,
    scheduler: Any = None,
    client: Any = None,
):
    """The scene catalog of ``dataset``: a pandas DataFrame, one row per scene, from one parallel
    pass over its frames, agents and traffic-light faces (columns: ``docs/guide/catalog.md``).

    Parameters
    ----------
    dataset : str, path or L5Dataset
    tz : str
        The time zone (IANA name) of ``local_hour`` and ``local_weekday``: Palo Alto's by default.
    storage_options, chunks_per_task, progress, scheduler, client
        As for :func:`l5dask.prediction.report.compute_report`.
    """

    check_tz(tz)
    ds = dataset if isinstance(dataset, L5Dataset) else open_dataset(dataset, storage_options=storage_options)
    job = Job(
        client=client,
        scheduler=scheduler,
        chunks_per_task=chunks_per_task,
        progress=progress,
        size_for=ds[fmt.AGENTS].nchunks,
    )
    (table,) = job.run([catalog_plan(ds, job, tz)])
    table.attrs["l5dask"] = fingerprint(ds)
    return table


def catalog_plan(ds: L5Dataset, job: Job, tz: str = DEFAULT_TZ) -> Plan:
    """The catalog declared (:class:`~l5dask.core.engine.Plan`), to run alone or with other
    analyses of the dataset in one pass (:func:`l5dask.analyze <l5dask.prediction.analyses.analyze>`):
    the scenes read whole, the frames pass (persisted), then agents and faces, each task given only
    the frame rows it overlaps. Its result lacks the fingerprint (``attrs``)."""
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
                name="catalog-faces",
            )
        )
    return Plan(passes, final=assemble, args=(scenes, ds.labels, tz), name="l5-catalog", size_for=agents.nchunks)


def check_output(path: str, storage_options: dict | None = None, overwrite: bool = False) -> None:
    """Refuse (one line) an output that cannot be written, or that exists unless ``overwrite``."""

    if table_format(path) != ".parquet":
        raise UsageError(f"{path}: the catalog is written as Parquet; name the file *.parquet")
    check_writable(path, storage_options)
    fs, target = filesystem(path, storage_options)
    if not overwrite and fs.exists(target):
        raise OutputError(f"{path}: already exists (pass overwrite=True / --overwrite)")


def write_catalog(table, path: str, storage_options: dict | None = None, overwrite: bool = False) -> None:
    """The catalog as Parquet, written atomically (refused if ``path`` exists, unless ``overwrite``),
    the dataset's ``fingerprint`` in its metadata (key ``l5dask.catalog``, JSON)."""
    import json

    import pyarrow as pa

    check_output(path, storage_options, overwrite)
    t = pa.Table.from_pandas(table, preserve_index=False)
    meta = dict(t.schema.metadata or {})
    meta[b"l5dask.catalog"] = json.dumps({"version": 1, **table.attrs.get("l5dask", {})}).encode()
    write_table(t.replace_schema_metadata(meta), path, storage_options, ".parquet")
