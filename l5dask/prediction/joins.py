"""Lazy, vectorized interval joins: scene -> frame -> agent, frame -> traffic-light face.

``Joins(ds).agent_scene()`` and the other joins are dask arrays chunked like their child array;
building them reads nothing. Their graphs are made when they are computed, by the engine:

1. the parent's rows are one pass (scenes read whole; the frames pass persisted, each chunk
   decoded once, keeping only the join columns asked for, and its intervals checked);
2. each child task gets only the parent blocks whose child ranges overlap its rows and finds
   each row's parent with ``searchsorted``. A child chunk is never read: its rows are known
   from the metadata.

All the joins of one :class:`Joins` (hence of one ``ds.joined(...)`` view) share one parent
pass: computing several join coordinates together decodes each frame chunk once.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph
from dask.task_spec import Task

from l5dask.core.engine import Block, Job, Link, Pass, Rows
from l5dask.core.intervals import check_intervals
from l5dask.prediction import format as fmt

if TYPE_CHECKING:
    import dask.array as da

#: The interval field linking each child array to its parent.
PARENT = {
    fmt.FRAMES: (fmt.SCENES, "frame_index_interval"),
    fmt.AGENTS: (fmt.FRAMES, "agent_index_interval"),
    fmt.TL_FACES: (fmt.FRAMES, "traffic_light_faces_index_interval"),
}


class Deferred(Mapping):
    """A graph layer made when it is first read (at compute time), not when it is declared."""

    def __init__(self, build, token: str | None = None) -> None:
        self._build, self._graph, self._token = build, None, token

    def __dask_tokenize__(self):
        return ("l5dask.Deferred", self._token or id(self))

    def _materialized(self) -> dict:
        if self._graph is None:
            self._graph = self._build()
        return self._graph

    def __getitem__(self, key):
        return self._materialized()[key]

    def __iter__(self) -> Iterator:
        return iter(self._materialized())

    def __len__(self) -> int:
        return len(self._materialized())

    def __contains__(self, key) -> bool:
        return key in self._materialized()


def scene_rows(scenes: np.ndarray, hosts: tuple[str, ...] | None = None) -> Rows:
    """The scenes as the frames' parent rows: each scene's frame interval (``start``, ``end``),
    and with ``hosts`` (the sorted host names) each scene's host code (``host``)."""
    iv = scenes["frame_index_interval"].reshape(-1, 2)
    cols = {"start": np.ascontiguousarray(iv[:, 0]), "end": np.ascontiguousarray(iv[:, 1])}
    if hosts is not None:
        cols["host"] = np.searchsorted(np.asarray(hosts), scenes["host"]).astype(np.int32)
    return Rows(0, cols)


def frame_rows(frames: np.ndarray, offset: int, scenes: Rows, starts: tuple[str, ...], fields: tuple[str, ...]) -> Rows:
    """The join columns of a block of frames for their children: each interval's start (named
    by its field), the scene, the scene's ``host`` code if asked (and the scene rows have it),
    and the frame fields asked for."""
    cols = {f: np.ascontiguousarray(frames[f][:, 0]) for f in starts}
    pos = scenes.locate(offset, offset + len(frames), "start")
    cols["scene"] = scenes.offset + pos
    if "host" in fields:
        cols["host"] = scenes["host"][pos]
    cols.update({f: np.ascontiguousarray(frames[f]) for f in fields if f != "host"})
    return Rows(offset, cols)


def _take(lo: int, hi: int, start: str, column: str, rows: Rows | None, *blocks: Block) -> np.ndarray:
    """``column`` of the parent of each child row ``lo .. hi - 1``."""
    rows = rows if rows is not None else Rows.concat([b.rows for b in blocks])
    pos = rows.locate(lo, hi, start)
    if column == "index":
        return rows.offset + pos
    return rows[column][pos]


class FramesPass:
    """The frames' join rows for the children of one dataset (agents, faces), made once per set
    of columns asked for: one pass over the frames (each chunk decoded once), persisted, its
    intervals checked. The scenes are read whole once (their intervals checked)."""

    def __init__(self, ds, job: Job | None = None) -> None:
        self.ds, self.job, self.starts, self.fields = ds, job, set(), set()
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

    def spec(self) -> Pass:
        """The declared pass over the frames that keeps the rows asked for."""
        ds = self.ds
        starts, fields = tuple(sorted(self.starts)), tuple(sorted(self.fields))
        child = {fmt.AGENTS: "agent_index_interval", fmt.TL_FACES: "traffic_light_faces_index_interval"}
        intervals = {f: len(ds[c]) for c, f in child.items() if f in starts}
        return Pass(
            ds[fmt.FRAMES],
            parent=Link(self.scene_rows(), "start"),
            rows=functools.partial(frame_rows, starts=starts, fields=fields),
            intervals=intervals,
            blocks=True,
            name="frames-join",
        )

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

    def column(self, child: str, column: str) -> da.Array:
        """``column`` of each child row's parent: ``"index"`` (the parent row), ``"scene"``, a
        field of the parent (frames only: ``timestamp``, ``ego_translation``...), or ``"host"``
        (the code of the scene's host among the sorted names set in ``self._frames.hosts``)."""
        import dask.array as da

        parent, interval = PARENT[child]
        src = self.ds[child]
        chunks = src.to_dask(chunks_per_task=self.chunks_per_task).chunks[0]
        bounds = np.r_[0, np.cumsum(chunks)].astype(np.int64)
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
            elif column == "host":
                dtype, tail = np.dtype(np.int32), ()
            else:
                sub = self.ds[fmt.FRAMES].dtype.fields[column][0]  # KeyError: no such frame field
                dtype, tail = sub.base, sub.shape
            self._frames.want(interval, column)
        start = interval if parent == fmt.FRAMES else "start"
        name = f"l5-join-{child}-{column}-{tokenize(self.ds[child], self.ds[parent], self.chunks_per_task)}"
        extra = (0,) * len(tail)

        def build() -> dict:
            graph = {}
            if parent == fmt.SCENES:
                rows = self._frames.scene_rows()
                for i in range(len(chunks)):
                    lo, hi = int(bounds[i]), int(bounds[i + 1])
                    graph[(name, i)] = Task(
                        (name, i),
                        _take,
                        lo,
                        hi,
                        "start",
                        "host" if column == "host" else "index",
                        rows.overlapping(lo, hi, "start"),
                    )
                return graph
            persisted, entries = self._frames.run()
            graph.update(entries)
            for i in range(len(chunks)):
                lo, hi = int(bounds[i]), int(bounds[i + 1])
                key = (name, i, *extra)
                graph[key] = Task(key, _take, lo, hi, start, column, None, *persisted.refs(interval, lo, hi))
            return graph

        hlg = HighLevelGraph({name: Deferred(build)}, {name: set()})
        return da.Array(hlg, name, chunks=((*chunks,), *((n,) for n in tail)), dtype=dtype)

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


def validate(ds) -> list[str]:
    """Every interval problem of a dataset (empty when it is consistent): one pass per parent
    array, reading only its interval fields' bounds."""
    specs = []
    for parent, fld, child in fmt.INTERVALS:
        if ds.has(parent) and ds.has(child) and fld in ds[parent].dtype.names:
            specs.append(Pass(ds[parent], intervals={fld: len(ds[child])}, blocks=True, name=f"{parent}-{fld}"))
    problems: list[str] = []
    Job().persist(*specs, check=False, problems=problems)
    return problems


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
    only the parent rows it overlaps: the scene rows
    (frames), or references to the blocks of the frames pass it overlaps (agents, faces), the pass
    run and persisted here (a graph made at compute time: ``Deferred``)."""
    from dask.task_spec import Task

    source = selection.source
    bounds = (
        [source.chunk_bounds(f)[0] for f, _ in groups] + [source.chunk_bounds(groups[-1][0] + groups[-1][1] - 1)[1]]
        if groups
        else [0]
    )
    graph: dict = {}
    frames = parent_frames(ds, selection, job)
    if frames is None:
        for key, (first, n) in zip(keys, groups):
            graph[key] = Task(key, func, selection, first, n, None)
    elif selection.array == fmt.FRAMES:
        rows = frames.scene_rows()
        for key, (first, n), lo, hi in zip(keys, groups, bounds, bounds[1:]):
            graph[key] = Task(key, func, selection, first, n, rows.overlapping(lo, hi, "start"))
    else:
        persisted, entries = frames.run()
        graph.update(entries)
        for key, (first, n), lo, hi in zip(keys, groups, bounds, bounds[1:]):
            graph[key] = Task(key, func, selection, first, n, None, *persisted.refs(selection.parent_start, lo, hi))
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
