"""Lazy, vectorized interval joins: scene -> frame -> agent, frame -> traffic-light face.

``Joins(ds).agent_scene()`` and the other joins are dask arrays chunked like their child array;
building them reads nothing and computes nothing (nor does inspecting or optimising their
graphs). Each graph holds, declared by the engine (:meth:`l5dask.core.engine.Job.hold`):

1. the parent's rows as one pass: the scenes read whole, then the frames, each chunk decoded
   once, keeping only the join columns asked for; one task checks the intervals and holds the
   rows;
2. a task per child chunk that finds each row's parent with ``searchsorted``. A child chunk is
   never read: its rows are known from the metadata.

The joins of one :class:`Joins` declared before the first is built (:meth:`Joins.declare`, as
``ds.joined(...)`` does) share one parent pass: computing several join coordinates together
decodes each frame chunk once.

The eager passes (``aggregate``, exports) persist the frames pass instead
(:func:`parent_link`): each child task then gets only the parent blocks it overlaps.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph
from dask.task_spec import Task, TaskRef

from l5dask.core.engine import Block, Held, Job, Link, Pass, Reduction, Rows
from l5dask.core.intervals import check_bounds, check_intervals, raise_first
from l5dask.core.policy import where_keywords
from l5dask.errors import ChunkError
from l5dask.prediction import format as fmt
from l5dask.prediction.columns import hour_of_day
from l5dask.prediction.reading import decode_faults, header_faults

if TYPE_CHECKING:
    import dask.array as da

#: The interval field linking each child array to its parent.
PARENT = {
    fmt.FRAMES: (fmt.SCENES, "frame_index_interval"),
    fmt.AGENTS: (fmt.FRAMES, "agent_index_interval"),
    fmt.TL_FACES: (fmt.FRAMES, "traffic_light_faces_index_interval"),
}


def scene_rows(scenes: np.ndarray, hosts: tuple[str, ...] | None = None) -> Rows:
    """The scenes as the frames' parent rows: each scene's frame interval (``start``, ``end``),
    and with ``hosts`` (the sorted host names) each scene's host code (``host``)."""
    iv = scenes["frame_index_interval"].reshape(-1, 2)
    cols = {"start": np.ascontiguousarray(iv[:, 0]), "end": np.ascontiguousarray(iv[:, 1])}
    if hosts is not None:
        cols["host"] = np.searchsorted(np.asarray(hosts), scenes["host"]).astype(np.int32)
    return Rows(0, cols)


def scene_block_rows(scenes: np.ndarray, start: int, parent: Any, hosts: tuple[str, ...] | None) -> Rows:
    """:func:`scene_rows` of a block of scenes starting at scene ``start`` (a pass's ``rows``)."""
    return Rows(start, scene_rows(scenes, hosts).cols)


def frame_rows(frames: np.ndarray, offset: int, scenes: Rows, starts: tuple[str, ...], fields: tuple[str, ...]) -> Rows:
    """The join columns of a block of frames for their children: each interval's start (named
    by its field), the scene, the scene's ``host`` code if asked (and the scene rows have it),
    the frame's UTC ``hour`` of day if asked, and the frame fields asked for."""
    cols = {f: np.ascontiguousarray(frames[f][:, 0]) for f in starts}
    pos = scenes.locate(offset, offset + len(frames), "start")
    cols["scene"] = scenes.offset + pos
    if "host" in fields:
        cols["host"] = scenes["host"][pos]
    if "hour" in fields:  # (a frame's hour, spread as it is: not a row's hour from its spread timestamp)
        cols["hour"] = hour_of_day(frames["timestamp"])
    cols.update({f: np.ascontiguousarray(frames[f]) for f in fields if f not in ("host", "hour")})
    return Rows(offset, cols)


def _take(lo: int, hi: int, start: str, column: str, rows: Rows | None, *blocks: Block) -> np.ndarray:
    """``column`` of the parent of each child row ``lo .. hi - 1``, made of the parent rows that
    overlap them alone (a slice of the rows held whole: the scene of 30 M agents' 47 blocks,
    0.05 CPU-s against 0.8, which went through all 420,000 frames for each block)."""
    rows = rows if rows is not None else Rows.concat([b.rows for b in blocks if b.rows is not None])
    rows = rows.overlapping(lo, hi, start)
    if column == "index":
        return rows.spread(lo, hi, start, np.arange(rows.offset, rows.offset + len(rows), dtype=np.int64))
    # (a field of several numbers, ego_translation, column-major: xarray's .sel(xyz="x") of it is a
    # contiguous column, which dask's getitem copies in a third of a strided column's time)
    return rows.spread(lo, hi, start, rows[column], by_column=True)


class FramesPass:
    """The frames' join rows for the children of one dataset (agents, faces), made once per set
    of columns asked for: one pass over the frames (each chunk decoded once), persisted, its
    intervals checked. The scenes are read whole once (their intervals checked)."""

    def __init__(self, ds, job: Job | None = None) -> None:
        self.ds, self.job = ds, job
        self.starts: set[str] = set()
        self.fields: set[str] = set()
        self.hosts: tuple[str, ...] | None = None
        self._done: tuple | None = None
        self._scenes: np.ndarray | None = None

    def scenes(self) -> np.ndarray:
        """The scenes, read whole once (in one task; their intervals checked)."""
        if self._scenes is None:
            scenes = (self.job or Job()).read(self.ds[fmt.SCENES])
            check_intervals(
                scenes["frame_index_interval"].reshape(-1, 2),
                fmt.SCENES,
                "frame_index_interval",
                len(self.ds[fmt.FRAMES]),
            )
            self._scenes = scenes
        return self._scenes

    def scene_rows(self) -> Rows:
        return scene_rows(self.scenes(), self.hosts if "host" in self.fields else None)

    def want(self, start: str, field: str | None = None) -> None:
        """Child rows found by the interval field ``start``; a parent column ``field`` (a frame
        field, or ``host`` with :attr:`hosts` set)."""
        self.starts.add(start)
        if field is not None and field not in ("scene", "index", start):
            self.fields.add(field)

    def spec(self, scenes: Any = None) -> Pass:
        """The declared pass over the frames that keeps the rows asked for, given the scene rows
        (in memory, read here by default; or a :class:`~l5dask.core.engine.Held` scenes pass)."""
        ds = self.ds
        starts, fields = tuple(sorted(self.starts)), tuple(sorted(self.fields))
        child = {fmt.AGENTS: "agent_index_interval", fmt.TL_FACES: "traffic_light_faces_index_interval"}
        intervals = {f: len(ds[c]) for c, f in child.items() if f in starts}
        return Pass(
            ds[fmt.FRAMES],
            parent=Link(self.scene_rows() if scenes is None else scenes, "start"),
            rows=functools.partial(frame_rows, starts=starts, fields=fields),
            intervals=intervals,
            blocks=True,
            name="frames-join",
        )

    def held_scenes(self) -> Held:
        """The scene rows as a lazy graph (read whole in one task, their intervals checked)."""
        hosts = self.hosts if "host" in self.fields else None
        spec = Pass(
            self.ds[fmt.SCENES],
            rows=functools.partial(scene_block_rows, hosts=hosts),
            intervals={"frame_index_interval": len(self.ds[fmt.FRAMES])},
            blocks=True,
            name="scenes-join",
        )
        return Job(chunks_per_task=max(self.ds[fmt.SCENES].nchunks, 1)).hold(spec)

    def held(self) -> Held:
        """The frames' join rows asked for so far as a lazy graph (nothing computed): see
        :meth:`l5dask.core.engine.Job.hold`."""
        return (self.job or Job()).hold(self.spec(self.held_scenes()))

    def run(self) -> tuple[Any, dict]:
        """The persisted pass (its intervals checked) and its graph entries, once per set of columns."""
        wanted = (tuple(sorted(self.starts)), tuple(sorted(self.fields)))
        if self._done is None or self._done[0] != wanted:
            (persisted,) = (self.job or Job()).persist(self.spec())
            entries = {}
            for c in persisted.collections:
                entries.update(dict(c.__dask_graph__()))
            self._done = (wanted, persisted, entries)
        return self._done[1], self._done[2]


class Joins:
    """The joins of one dataset, as lazy dask arrays chunked like the child array.

    Parameters
    ----------
    ds : L5Dataset
    chunks_per_task : int
        Stored child chunks per output chunk (as ``L5Array.to_dask``).
    """

    def __init__(self, ds, chunks_per_task: int = 1) -> None:
        self.ds, self.chunks_per_task = ds, chunks_per_task
        self._frames = FramesPass(ds)

    def declare(self, child: str, columns: list[str]) -> None:
        """Columns of ``child``'s parent that will be asked for: declared before the first join is
        built, the joins share one parent pass."""
        parent, interval = PARENT[child]
        for column in columns:
            if parent == fmt.SCENES:
                if column == "host":
                    self._frames.fields.add("host")
            else:
                self._frames.want(interval, column)

    def column(self, child: str, column: str) -> da.Array:
        """``column`` of each child row's parent: ``"index"`` (the parent row), ``"scene"``, a
        field of the parent (frames only: ``timestamp``, ``ego_translation``...), ``"hour"`` (the
        frame's UTC hour of day, int8), or ``"host"`` (the code of the scene's host among the sorted
        names set in ``self._frames.hosts``)."""
        import dask.array as da

        parent, interval = PARENT[child]
        src = self.ds[child]
        chunks = src.to_dask(chunks_per_task=self.chunks_per_task).chunks[0]
        bounds = np.r_[0, np.cumsum(chunks)].astype(np.int64)
        tail: tuple[int, ...]
        if column == "host" and self._frames.hosts is None:
            raise ValueError("set the host names (self._frames.hosts) to join hosts")
        if parent == fmt.SCENES:
            if column not in ("index", "scene", "host"):
                raise ValueError(f"frames join scenes by index or host only, not {column!r}")
            dtype, tail = np.dtype(np.int32 if column == "host" else np.int64), ()
            if column == "host":
                self._frames.fields.add("host")
        else:
            if column in ("index", "scene"):
                dtype, tail = np.dtype(np.int64), ()
            elif column in ("host", "hour"):
                dtype, tail = np.dtype(np.int32 if column == "host" else np.int8), ()
            else:
                sub = fmt.fields_of(self.ds[fmt.FRAMES].dtype)[column][0]  # KeyError: no such frame field
                dtype, tail = sub.base, sub.shape
            self._frames.want(interval, column)
        start = interval if parent == fmt.FRAMES else "start"
        extra = (0,) * len(tail)
        graph: dict = {}
        if parent == fmt.SCENES:
            held = self._frames.held_scenes()
            ref = "start", "host" if column == "host" else "index"
        else:
            held = self._frames.held()
            ref = start, column
        name = f"l5-join-{child}-{column}-{tokenize(self.ds[child], held.key, self.chunks_per_task)}"
        graph.update(held.graph)
        for i in range(len(chunks)):
            lo, hi = int(bounds[i]), int(bounds[i + 1])
            key = (name, i, *extra)
            graph[key] = Task(key, _take, lo, hi, *ref, None, *held.refs(interval, lo, hi))
        hlg = HighLevelGraph.from_collections(name, graph, dependencies=())
        return da.Array(hlg, name, chunks=((*chunks,), *((k,) for k in tail)), dtype=dtype)

    def frame_scene(self) -> da.Array:
        """Scene index of every frame."""
        return self.column(fmt.FRAMES, "index")

    def agent_frame(self) -> da.Array:
        """Frame index of every agent."""
        return self.column(fmt.AGENTS, "index")

    def agent_scene(self) -> da.Array:
        """Scene index of every agent."""
        return self.column(fmt.AGENTS, "scene")

    def tl_face_frame(self) -> da.Array:
        """Frame index of every traffic-light face."""
        return self.column(fmt.TL_FACES, "index")

    def tl_face_scene(self) -> da.Array:
        """Scene index of every traffic-light face."""
        return self.column(fmt.TL_FACES, "scene")

    def agent_frame_field(self, field: str) -> da.Array:
        """A field of each agent's frame (e.g. ``timestamp``, ``ego_translation``), per agent."""
        return self.column(fmt.AGENTS, field)

    def tl_face_frame_field(self, field: str) -> da.Array:
        """A field of each traffic-light face's frame (e.g. ``timestamp``)."""
        return self.column(fmt.TL_FACES, field)


@where_keywords
def validate(ds, full: bool = False, scheduler: Any = None, progress: bool = False) -> list[str]:
    """Every fault of a dataset (empty when it is sound), a line each: each stored chunk of every
    array against its ``.zarray`` (stored, its size and blosc header: a 16-byte read a chunk;
    ``full``: every chunk decoded, on the job's workers), then every index interval (one pass per
    parent array, reading only its interval fields' bounds) of the arrays whose chunks are sound,
    on ``scheduler`` (a ``distributed.Client`` or its address, ``"threads"``...: as every
    function of the package takes it; default: the active client, else local threads). Reports, never repairs."""
    faults: list[str] = []
    bad: set[str] = set()
    sound_chunks = {}
    for name, array in ds.arrays.items():
        found, sound = header_faults(array.store, array.meta, array.compressed)
        faults += found
        sound_chunks[name] = sound
        bad |= {name} if found else set()
    if full:
        job = Job(scheduler, progress=progress)
        calls = [
            (a.store, a.meta, a.compressed, sound_chunks[n][i : i + FULL_CHUNKS_PER_TASK])
            for n, a in ds.arrays.items()
            for i in range(0, len(sound_chunks[n]), FULL_CHUNKS_PER_TASK)
        ]
        if calls:
            remote = any(a.remote for a in ds.arrays.values())
            for (_, meta, _, _), found in zip(calls, job.map(decode_faults, calls, "l5-validate", remote=remote)):
                faults += found
                bad |= {meta.name} if found else set()
    specs = []
    for parent, fld, child in fmt.INTERVALS:
        if ds.has(parent) and ds.has(child) and fld in fmt.names_of(ds[parent].dtype) and parent not in bad:
            specs.append(Pass(ds[parent], intervals={fld: len(ds[child])}, blocks=True, name=f"{parent}-{fld}"))
    problems: list[str] = []
    try:
        Job(scheduler).persist(*specs, check=False, problems=problems)
    except ChunkError as exc:  # (a chunk whose header is sound but whose blocks are not)
        problems.append(str(exc))
    return faults + problems


#: Stored chunks a task of ``validate --full`` decodes.
FULL_CHUNKS_PER_TASK = 16


def parent_frames(ds, selection, job: Job | None = None) -> FramesPass | None:
    """The parent rows the columns of ``selection`` (:class:`l5dask.prediction.columns.Selection`) need,
    declared: ``None`` when they need none; else a :class:`FramesPass` (for frames: only its
    scene rows, in memory)."""
    need = selection.parent
    if not need:
        return None
    frames = FramesPass(ds, job)
    hosts = [c.categories for c in selection.columns.values() if "host" in c.parent]
    if hosts:
        frames.hosts = tuple(hosts[0])
    for p in need:
        frames.want(selection.parent_start, p)
    return frames


def chunk_tasks(ds, selection, groups: list[tuple[int, int]], keys: list, func, job: Job | None = None) -> dict:
    """A task per group of stored chunks of ``selection``'s array, ``func(selection, first, n,
    rows, *parent_blocks)`` (bind other arguments first, with ``functools.partial``), each given
    the parent rows as a held block (the scene rows for frames; the frames pass for agents and
    faces; see :meth:`l5dask.core.engine.Job.hold`): a graph whose building computes nothing."""
    graph: dict = {}
    frames = parent_frames(ds, selection, job)
    if frames is None:
        for key, (first, n) in zip(keys, groups):
            graph[key] = Task(key, func, selection, first, n, None)
        return graph
    held = frames.held_scenes() if selection.array == fmt.FRAMES else frames.held()
    graph.update(held.graph)
    for key, (first, n) in zip(keys, groups):
        graph[key] = Task(key, func, selection, first, n, None, TaskRef(held.key))
    return graph


def parent_link(ds, selection, job: Job) -> Link | None:
    """How each chunk of ``selection``'s array gets its parent rows, ready to run: the scene rows
    in memory (frames), or the frames pass persisted on the job's workers (agents, faces)."""
    frames = parent_frames(ds, selection, job)
    if frames is None:
        return None
    if selection.array == fmt.FRAMES:
        return Link(frames.scene_rows(), "start")
    persisted, _ = frames.run()
    return persisted.link(selection.parent_start, selection.parent_start)


def _last_end(field: str, data: np.ndarray, start: int, parent: Any) -> int:
    iv = data[field]
    return int(iv[-1, 1]) if len(iv) else -1


def _no_end() -> int:
    return -1


def covered(check: tuple[str, str, int], result: Any, end: int) -> tuple:
    """A plan's ``final`` (:func:`coverage`): ``(result,)`` when the parent's last interval
    (``end``; -1: no parent rows) ends where the child array does, else the
    :class:`~l5dask.errors.IntervalError` of the passes that read the parent."""
    parent, field, child_len = check
    table = np.array([[0, max(end, 0), int(end >= 0), 0, 0, 0]], dtype=np.int64)
    raise_first(check_bounds(table, parent, field, child_len))
    return (result,)


def coverage(ds, array: str, job: Job) -> tuple[Pass, tuple[str, str, int]] | None:
    """For a pass over ``array`` that reads no parent rows (an aggregation of the agents' own
    columns): what checks that the parent's intervals end where ``array`` does. A dataset caught
    half-way through an append (its agents grown, its frames not yet) is refused, where such a
    pass counted the rows no frame points to. The frames' check is a pass over their last stored
    chunk (:func:`covered` its ``final``; exact, so that a frames pass of another analysis of the
    run reads it once for both), ``None`` then for the scenes', made now from the scene rows the
    job reads whole (an :class:`~l5dask.errors.IntervalError` raised here)."""
    for parent_name, field, child in fmt.INTERVALS:
        if child != array or not ds.has(parent_name) or not ds.has(child):
            continue
        parent, child_len = ds[parent_name], len(ds[child])
        if parent_name == fmt.SCENES:
            check_intervals(job.read(parent)[field].reshape(-1, 2), parent_name, field, child_len)
            return None
        if not len(parent):
            covered((parent_name, field, child_len), None, -1)
            return None
        ends = Reduction(f"l5-last-end-{field}", functools.partial(_last_end, field), max, _no_end, exact=True)
        spec = Pass(parent, ends, blocks=True, name=f"{parent_name}-ends", groups=[(parent.nchunks - 1, 1)])
        return spec, (parent_name, field, child_len)
    return None


def declared_parent_link(ds, selection, job: Job) -> Link | None:
    """How each chunk of ``selection``'s array gets its parent rows, declared (for
    :meth:`l5dask.core.engine.Job.run`): the scene rows in memory (frames), or the frames pass
    keeping the rows asked for, persisted by the run (agents, faces: fused there with the other
    analyses' frames passes)."""
    frames = parent_frames(ds, selection, job)
    if frames is None:
        return None
    if selection.array == fmt.FRAMES:
        return Link(frames.scene_rows(), "start")
    return Link(frames.spec(), selection.parent_start, selection.parent_start)
