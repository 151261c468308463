"""Lidar sweeps at scale: one lazy array of their points, and the points inside each annotation's box.

A sweep is a file of float32 little-endian points, 5 numbers each (x, y, z, intensity, ring), in
its sensor's frame. :func:`sweeps` makes every sweep one dask array of points, a task per group of
files (local, zip, tar or S3, through the store), laid out as L5Kit lays out agents (offsets per
sweep); its chunk sizes, and the report's ``lidar.*`` keys, come from one listing of each folder the
files live in (points = size / 20; a paginated listing on S3, not a request per file). Counting
points in boxes reads each sample's key-frame sweeps in a task per group of samples, moves the
points to the world frame through the sweep's calibrated_sensor and ego_pose exactly as the SDK's
point clouds do (float32 points, float64 transforms), and applies the SDK's ``points_in_box`` test
to every box, in one compiled pass a sweep (``_lidar.count_sweep``).
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from l5dask.core.engine import Job
from l5dask.core.lazy import compiled
from l5dask.errors import ChunkError, FormatError, UsageError
from l5dask.perception import joins

_compiled = compiled("l5dask.perception._lidar")
count = _compiled.count_in_boxes
count_sweep = _compiled.count_sweep
sweep_to_world = _compiled.sweep_to_world

POINT_BYTES = 20  # 5 float32
SAMPLES_PER_TASK = 64
READ_AHEAD = 8  # sweeps a task reads ahead of its compute (their reads overlap it; S3's latency too)


def lidar_rows(ds) -> np.ndarray:
    """Rows of sample_data whose sensor is a lidar (key frame or not)."""
    return np.flatnonzero(joins.modality_of_sample_data(ds) == "lidar")


def file_sizes(store: Any, names: list[str]) -> dict[str, int]:
    """Sizes of these files of a store (absent ones left out), one listing per folder."""
    out: dict[str, int] = {}
    for folder in sorted({posixpath.dirname(n) for n in names}):
        try:
            entries = store.fs.ls(store.path(folder) if folder else (store.root or ""), detail=True)
        except (FileNotFoundError, NotADirectoryError):
            continue
        base = store.path(folder) if folder else store.root
        for e in entries:
            if e.get("type") == "file":
                name = e["name"].rstrip("/")
                rel = name[len(base) + 1 :] if base and name.startswith(base + "/") else posixpath.basename(name)
                out[posixpath.join(folder, rel) if folder else rel] = int(e["size"])
    return out


def checked_sizes(ds, names: list[str]) -> np.ndarray:
    """The sizes of these lidar files (-1: missing), from one listing per folder; a size that is
    not a whole number of points is an error naming the file."""
    sizes = file_sizes(ds.store, names)
    got = np.array([sizes.get(n, -1) for n in names], np.int64)
    bad = np.flatnonzero((got >= 0) & (got % POINT_BYTES != 0))
    if len(bad):
        n = names[int(bad[0])]
        raise FormatError(
            f"{ds.store.url.rstrip('/')}/{n}: a lidar sweep of {int(got[bad[0]])} bytes, not a "
            f"multiple of {POINT_BYTES} (5 float32 a point)"
        )
    return got


def lidar_report(ds, sizes_out: list | None = None) -> dict[str, Any]:
    """``lidar.sweeps``, ``lidar.points``, ``lidar.points_per_sweep``, ``lidar.missing_files``: the
    metadata of the sweeps' collection (:func:`sweeps`, from one listing: a point is 20 bytes), no
    file read."""
    sw = sweeps(ds)
    points = np.diff(sw.offsets)
    if sizes_out is not None:
        sizes_out.append(points)
    per = (
        {"min": int(points.min()), "max": int(points.max()), "mean": float(points.mean())}
        if len(points)
        else {"min": 0, "max": 0, "mean": 0.0}
    )
    return {"sweeps": len(sw), "points": int(points.sum()), "points_per_sweep": per, "missing_files": list(sw.missing)}


# -- points in boxes ---------------------------------------------------------------------------
def quaternion_matrices(q: np.ndarray) -> np.ndarray:
    """Rotation matrices (n, 3, 3) of quaternions (w, x, y, z), normalised first (as pyquaternion)."""
    q = q / np.sqrt((q * q).sum(1))[:, None]
    w, x, y, z = q[:, 0], q[:, 1], q[:, 2], q[:, 3]
    return np.stack(
        [
            np.stack([w * w + x * x - y * y - z * z, 2 * (x * y - w * z), 2 * (w * y + x * z)], -1),
            np.stack([2 * (x * y + w * z), w * w - x * x + y * y - z * z, 2 * (y * z - w * x)], -1),
            np.stack([2 * (x * z - w * y), 2 * (w * x + y * z), w * w - x * x - y * y + z * z], -1),
        ],
        1,
    )


def to_world(
    points: np.ndarray, cs_r: np.ndarray, cs_t: np.ndarray, pose_r: np.ndarray, pose_t: np.ndarray
) -> np.ndarray:
    """(3, n) float32 sensor points to the world frame, as the SDK's ``rotate``/``translate`` do
    (each step computed in float64, stored back into the float32 points)."""
    p = np.array(points, dtype=np.float32, order="C")  # a copy: the input may be a read-only buffer
    for r, t in ((cs_r, cs_t), (pose_r, pose_t)):
        p[:] = np.dot(r, p)
        for k in range(3):
            p[k] = p[k] + t[k]
    return p


#: A point within this fraction of an edge's squared length of a box's face is decided by the exact
#: test (:func:`count_in_boxes_exact`); float64 rounding differences are 1e-11 of it at most.
BAND = 1e-6
_SIGN = np.array([[1, 1, 1, 1, -1, -1, -1, -1], [1, -1, -1, 1, 1, -1, -1, 1], [1, 1, -1, -1, 1, 1, -1, -1]])


def box_frames(centers: np.ndarray, sizes: np.ndarray, rots: np.ndarray) -> np.ndarray:
    """Per box, what the compiled test reads (``_lidar.count_in_boxes``): the SDK's first corner
    ``p1``, edges ``i, j, k`` (corners 4, 1, 3 minus p1), their squared lengths and the box's
    axis-aligned bounds."""
    local = np.stack(
        [sizes[:, 1, None] / 2 * _SIGN[0], sizes[:, 0, None] / 2 * _SIGN[1], sizes[:, 2, None] / 2 * _SIGN[2]], 1
    )  # (n, 3, 8): length, width, height
    corners = np.einsum("nij,njk->nik", rots, local) + centers[:, :, None]
    p1 = corners[:, :, 0]
    edges = [corners[:, :, c] - p1 for c in (4, 1, 3)]
    sq = np.stack([(e * e).sum(1) for e in edges], 1)
    # the corners' bounds, 1 um wider: a point the test passes is in the box, so within them; but
    # a box with an edge of length 0 passes a whole slab (the SDK's test on that edge is 0 <= 0 <= 0)
    flat = (sq == 0).any(1)[:, None]
    lo, hi = np.where(flat, -np.inf, corners.min(2) - 1e-6), np.where(flat, np.inf, corners.max(2) + 1e-6)
    return np.ascontiguousarray(np.concatenate([p1, *edges, sq, lo, hi], 1))


def count_in_boxes(points: np.ndarray, centers: np.ndarray, sizes: np.ndarray, rots: np.ndarray) -> np.ndarray:
    """Per box, how many of the (3, n) float32 world ``points`` pass the SDK's ``points_in_box``
    test: a compiled pass over the points, boxes tested only where their bounding cube holds the
    point; the rare points within ``BAND`` of a face are decided by the SDK's own operations."""
    points = np.ascontiguousarray(points, np.float32)
    out = np.zeros(len(centers), np.int64)
    undecided = count_in_boxes_compiled(points, box_frames(centers, sizes, rots), out)
    for b, got in _decide(points, undecided, centers, sizes, rots):
        out[b] += got
    return out


def count_in_boxes_compiled(points: np.ndarray, frames: np.ndarray, out: np.ndarray) -> list:
    """``_lidar.count_in_boxes``: counts added to ``out``, the undecided (box, point) pairs returned."""

    return count(np.ascontiguousarray(points, np.float32), frames, out, BAND)


def _decide(points: np.ndarray, undecided: list, centers: np.ndarray, sizes: np.ndarray, rots: np.ndarray):
    """(box, count) of the undecided (box, point) pairs, by the SDK's operations."""
    if not undecided:
        return
    pairs = np.array(undecided, np.int64)
    for b in np.unique(pairs[:, 0]):
        pts = pairs[pairs[:, 0] == b, 1]
        yield (
            int(b),
            int(count_in_boxes_exact(points[:, pts], centers[b : b + 1], sizes[b : b + 1], rots[b : b + 1])[0]),
        )


def count_in_boxes_exact(points: np.ndarray, centers: np.ndarray, sizes: np.ndarray, rots: np.ndarray) -> np.ndarray:
    """Per box, how many of the (3, n) ``points`` pass the SDK's ``points_in_box`` test, with its
    operations (a numpy loop over the boxes)."""
    out = np.zeros(len(centers), np.int64)
    if points.shape[1] == 0:
        return out
    for b in range(len(centers)):
        w, ln, h = sizes[b]
        local = np.vstack((ln / 2 * _SIGN[0], w / 2 * _SIGN[1], h / 2 * _SIGN[2]))
        corners = np.dot(rots[b], local)
        corners[0, :] = corners[0, :] + centers[b, 0]
        corners[1, :] = corners[1, :] + centers[b, 1]
        corners[2, :] = corners[2, :] + centers[b, 2]
        p1 = corners[:, 0]
        i, j, k = corners[:, 4] - p1, corners[:, 1] - p1, corners[:, 3] - p1
        # only points within the box's bounding sphere can pass (the test itself decides)
        reach = np.sqrt(np.dot(i, i) + np.dot(j, j) + np.dot(k, k)) / 2 + 1e-6
        mid = (corners[:, 0] + corners[:, 6]) / 2
        near = np.flatnonzero(
            (np.abs(points[0] - mid[0]) <= reach)
            & (np.abs(points[1] - mid[1]) <= reach)
            & (np.abs(points[2] - mid[2]) <= reach)
        )
        if not len(near):
            continue
        v = points[:, near] - p1.reshape((-1, 1))
        iv, jv, kv = np.dot(i, v), np.dot(j, v), np.dot(k, v)
        inside = (0 <= iv) & (iv <= np.dot(i, i)) & (0 <= jv) & (jv <= np.dot(j, j)) & (0 <= kv) & (kv <= np.dot(k, k))
        out[b] = int(inside.sum())
    return out


#: numpy's sum of a float32 array and a float64 number: float64 (numpy 2's promotion) or float32 (numpy 1's)
WIDE_ADD = (np.zeros(1, np.float32) + np.float64(0.1)).dtype == np.float64


def _count_task(store: Any, sweeps: dict[str, np.ndarray], boxes: dict[str, np.ndarray]) -> np.ndarray:
    """Counts for the boxes of one group of samples from their key-frame sweeps (read ahead): a
    sweep is moved and counted in one compiled call on its sample's boxes (contiguous once the
    boxes are sorted by sample); the rare sweep or point that call leaves undecided takes the
    SDK's own operations."""

    n = len(boxes["sample"])
    if not n:
        return np.zeros(0, np.int64)
    order = np.argsort(boxes["sample"], kind="stable")
    center, size, rot = boxes["center"][order], boxes["size"][order], boxes["rot"][order]
    frames = box_frames(center, size, rot)
    counts = np.zeros(n, np.int64)
    lo = np.searchsorted(boxes["sample"][order], sweeps["sample"], side="left")
    hi = np.searchsorted(boxes["sample"][order], sweeps["sample"], side="right")
    # sweeps of samples with boxes whose file exists (a missing one is in lidar.missing_files)
    todo = np.flatnonzero((hi > lo) & (sweeps["size"] >= 0))
    names = [str(sweeps["filename"][s]) for s in todo]
    cs_r, cs_t, pose_r, pose_t = sweeps["cs_r"], sweeps["cs_t"], sweeps["pose_r"], sweeps["pose_t"]
    room = np.empty(int(sweeps["size"][todo].max(initial=0)) + 1, np.uint8)  # a file at a time, reused
    for k, raw in _read_each(store, names, sweeps["size"][todo], lambda k, size: memoryview(room.data)[: size + 1]):
        s = int(todo[k])
        scan = np.frombuffer(raw, dtype="<f4").reshape((-1, 5))
        b0, b1 = int(lo[s]), int(hi[s])
        pts = np.empty((3, len(scan)), np.float32)
        undecided = count_sweep(
            scan, cs_r[s], cs_t[s], pose_r[s], pose_t[s], WIDE_ADD, pts, frames[b0:b1], counts[b0:b1], BAND
        )
        if undecided is None:  # a point the compiled move cannot round as numpy does
            pts = to_world(scan[:, :3].T, cs_r[s], cs_t[s], pose_r[s], pose_t[s])
            undecided = count_in_boxes_compiled(pts, frames[b0:b1], counts[b0:b1])
        for b, got in _decide(pts, undecided, center[b0:b1], size[b0:b1], rot[b0:b1]):
            counts[b0 + b] += got
    out = np.empty(n, np.int64)
    out[order] = counts
    return out


def points_in_boxes(ds, samples_per_task: int = SAMPLES_PER_TASK) -> np.ndarray:
    """Lidar points inside each annotation's box, from its sample's key-frame sweeps of every lidar
    channel (the SDK's ``sample["data"]``), in parallel tasks over groups of samples."""

    sd, ann, ep, cs = (
        ds.table("sample_data"),
        ds.table("sample_annotation"),
        ds.table("ego_pose"),
        ds.table("calibrated_sensor"),
    )
    n_samples = len(ds.table("sample"))
    channels = sorted(set(ds.table("sensor").strings("channel")[ds.table("sensor").strings("modality") == "lidar"]))
    key = np.concatenate([joins.key_frame_of_samples(ds, ch) for ch in channels]) if channels else np.zeros(0, np.int64)
    key = key[key >= 0]
    key = key[np.argsort(sd.links["sample_token"][key], kind="stable")]
    sweep_sample = sd.links["sample_token"][key]
    pose = sd.links["ego_pose_token"][key]
    cal = sd.links["calibrated_sensor_token"][key]
    names = sd.strings("filename")[key]
    sweeps = {
        "sample": sweep_sample,
        "filename": names,
        "size": checked_sizes(ds, names.tolist()),
        "cs_r": quaternion_matrices(cs.vectors("rotation")[cal]),
        "cs_t": cs.vectors("translation")[cal],
        "pose_r": quaternion_matrices(ep.vectors("rotation")[pose]),
        "pose_t": ep.vectors("translation")[pose],
    }
    box_sample = ann.links["sample_token"]
    boxes = {
        "sample": box_sample,
        "center": ann.vectors("translation"),
        "size": ann.vectors("size"),
        "rot": quaternion_matrices(ann.vectors("rotation")) if len(ann) else np.zeros((0, 3, 3)),
    }
    calls, rows_of = [], []
    for lo in range(0, n_samples, samples_per_task):
        hi = min(lo + samples_per_task, n_samples)
        s = slice(*np.searchsorted(sweep_sample, [lo, hi]))
        b = np.flatnonzero((box_sample >= lo) & (box_sample < hi))
        if not len(b):
            continue
        calls.append((ds.store, {k: v[s] for k, v in sweeps.items()}, {k: v[b] for k, v in boxes.items()}))
        rows_of.append(b)
    job = ds.job or Job()
    counts = np.zeros(len(ann), np.int64)
    for b, got in zip(rows_of, job.map(_count_task, calls, name="l5-perception-points", remote=ds.store.remote)):
        counts[b] = got
    return counts


# -- the sweeps as a dask array ----------------------------------------------------------------
SWEEPS_PER_TASK = 64
FRAMES = ("sensor", "world")


@dataclass(frozen=True)
class Sweeps:
    """Lidar sweeps as one lazy array of their points, laid out as L5Kit lays out agents: sweep
    ``i`` (sample_data row ``rows[i]``) holds ``points[offsets[i]:offsets[i + 1]]``.

    ``points`` is a dask array (n, 5) float32 (x, y, z, intensity, ring), a chunk per group of
    sweeps (a task reads its files: local, zip, tar or S3), its chunk sizes known from one listing
    of the files' folders; ``frame``: ``"sensor"`` as stored, or ``"world"`` moved through each
    sweep's calibrated_sensor and ego_pose as the SDK's point clouds move (see
    ``count_in_boxes``). Files that are missing are left out (``missing``, as in the
    report's ``lidar.missing_files``)."""

    rows: np.ndarray
    offsets: np.ndarray
    points: Any
    frame: str
    missing: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.rows)


def sweeps(
    ds,
    channels: Sequence[str] | None = None,
    key_frames: bool = False,
    frame: str = "sensor",
    sweeps_per_task: int = SWEEPS_PER_TASK,
) -> Sweeps:
    """The lidar sweeps of ``ds`` (of these ``channels``, every lidar's by default; only key
    frames if ``key_frames``) as a :class:`~l5dask.perception.lidar.Sweeps`: nothing is read until its points are computed."""
    import dask.array as da
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph
    from dask.task_spec import Task

    if frame not in FRAMES:
        raise UsageError(f"frame {frame!r}: one of {', '.join(FRAMES)}")
    if sweeps_per_task < 1:
        raise UsageError(f"sweeps_per_task {sweeps_per_task}: at least 1")
    sd = ds.table("sample_data")
    rows = lidar_rows(ds)
    channel = joins.channel_of_sample_data(ds)
    if channels is not None:
        known = sorted(set(channel[rows]))
        unknown = [c for c in channels if c not in known]
        if unknown:
            raise UsageError(f"no lidar channel {unknown[0]!r}: the lidars are {', '.join(known) or 'none'}")
        rows = rows[np.isin(channel[rows], list(channels))]
    if key_frames:
        rows = rows[sd.numbers("is_key_frame", bool)[rows]]
    names = sd.strings("filename")[rows].tolist()
    sizes = checked_sizes(ds, names)
    present = sizes >= 0
    missing = tuple(sorted({n for n, ok in zip(names, present) if not ok}))
    rows, sizes = rows[present], sizes[present]
    names = [n for n, ok in zip(names, present) if ok]
    counts = sizes // POINT_BYTES
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    moves = None
    if frame == "world":
        ep, cs = ds.table("ego_pose"), ds.table("calibrated_sensor")
        pose, cal = sd.links["ego_pose_token"][rows], sd.links["calibrated_sensor_token"][rows]
        moves = (
            quaternion_matrices(cs.vectors("rotation")[cal]) if len(rows) else np.zeros((0, 3, 3)),
            cs.vectors("translation")[cal],
            quaternion_matrices(ep.vectors("rotation")[pose]) if len(rows) else np.zeros((0, 3, 3)),
            ep.vectors("translation")[pose],
        )
    name = f"l5-lidar-sweeps-{tokenize(ds.store.url, names, sizes, frame, sweeps_per_task)}"
    graph: dict[Any, Task] = {}
    chunks: list[int] = []
    for i, lo in enumerate(range(0, len(rows), sweeps_per_task)):
        hi = min(lo + sweeps_per_task, len(rows))
        key = (name, i, 0)
        part = None if moves is None else tuple(m[lo:hi] for m in moves)
        graph[key] = Task(key, _read_sweeps, ds.store, names[lo:hi], sizes[lo:hi], part)
        chunks.append(int(offsets[hi] - offsets[lo]))
    if not graph:  # no sweeps: an empty array of one empty chunk
        key = (name, 0, 0)
        graph[key] = Task(key, np.zeros, (0, 5), np.float32)
        chunks = [0]
    points = da.Array(
        HighLevelGraph.from_collections(name, graph, dependencies=[]),
        name,
        (tuple(chunks), (5,)),
        dtype=np.float32,
    )
    return Sweeps(rows, offsets, points, frame, missing)


def _read_each(store: Any, names: list[str], sizes: np.ndarray, into):
    """``(k, bytes of file k)`` for each file in order, the next ``READ_AHEAD`` read while the
    caller works on this one (:meth:`Store.iter_many`). On a local disk each is read straight into ``into(k, size)`` (a writable
    buffer of ``size + 1`` bytes; what is yielded is its first ``size``), elsewhere the store's
    bytes are yielded. A file whose size is not the listed one, or is gone, is an error naming it."""

    def check(name: str, size: int, got: int, capped: bool = False) -> None:
        if got != size:
            now = (
                "is missing"
                if got < 0
                else f"has more than {size} bytes"
                if capped and got > size
                else f"has {got} bytes"
            )
            raise FormatError(f"{store.url.rstrip('/')}/{name}: a lidar sweep listed with {size} bytes {now} now")

    sizes = [int(v) for v in sizes]  # type: ignore[assignment]
    if not store.local:
        raws = store.iter_many(names, what=dict.fromkeys(names, "a lidar sweep"), depth=READ_AHEAD)
        for k, name in enumerate(names):
            try:
                raw = next(raws)
            except ChunkError:  # (gone since it was listed: named below)
                raw = None
            check(name, sizes[k], -1 if raw is None else len(raw))
            yield k, raw
        return
    store.will_need(names[:READ_AHEAD])
    for k, (name, size) in enumerate(zip(names, sizes)):
        store.will_need(names[k + READ_AHEAD : k + READ_AHEAD + 1])
        buf = into(k, size)
        try:
            got = store.get_into(name, buf, what="a lidar sweep")
        except ChunkError:
            got = -1
        check(name, size, got, capped=True)
        yield k, buf[:size]


def _read_sweeps(store: Any, names: list[str], sizes: np.ndarray, moves: tuple | None) -> np.ndarray:
    """The points of these sweeps, one after the other (moved to the world frame with ``moves``)."""

    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    room = np.empty(int(starts[-1]) + 1, np.uint8)
    out = room[:-1].view(np.float32).reshape((-1, 5))
    flat = memoryview(room.data)
    for k, raw in _read_each(store, names, sizes, lambda k, size: flat[starts[k] : starts[k] + size + 1]):
        part = out[starts[k] // POINT_BYTES : starts[k + 1] // POINT_BYTES]
        scan = np.frombuffer(raw, dtype="<f4").reshape((-1, 5))
        if not np.shares_memory(scan, part):  # (read elsewhere than into the array)
            part[:] = scan
        if moves is not None and len(scan):
            cs_r, cs_t, pose_r, pose_t = (m[k] for m in moves)
            moved = np.empty((3, len(scan)), np.float32)
            if not sweep_to_world(part, cs_r, cs_t, pose_r, pose_t, moved, WIDE_ADD):
                moved = to_world(part[:, :3].T, cs_r, cs_t, pose_r, pose_t)
            part[:, :3] = moved.T
    return out
