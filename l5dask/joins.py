"""Vectorized interval joins: scene -> frame -> agent, frame -> traffic-light face.

A join first computes, per parent block, the child range it covers (one small task
per parent block; validated). Then each child chunk's task depends only on the
parent blocks that overlap it, and finds its parents with ``searchsorted``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import dask
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from . import format as fmt
from .errors import IntervalError

if TYPE_CHECKING:
    import dask.array as da


def interval_problems(iv: np.ndarray, offset: int, child_len: int) -> tuple[int, int, str]:
    """Check ``[start, end)`` rows of one block: (number of bad rows, first bad row, why).

    Rows are bad when ``end < start`` (not increasing), when ``start`` is not the
    previous row's ``end`` (not contiguous), or when they point outside the child.
    """
    if len(iv) == 0:
        return 0, -1, ""
    starts, ends = iv[:, 0], iv[:, 1]
    checks = (  # the most telling reason first, when a row has several
        ((starts < 0) | (ends > child_len), f"points outside the child array of length {child_len}"),
        (ends < starts, "end < start (not increasing)"),
        (np.r_[False, starts[1:] != ends[:-1]], "start != previous end (not contiguous)"),
    )
    bad = np.zeros(len(iv), bool)
    first, why = len(iv), ""
    for mask, reason in checks:
        bad |= mask
        hit = np.flatnonzero(mask)
        if len(hit) and hit[0] < first:
            first, why = int(hit[0]), reason
    n = int(bad.sum())
    return n, (offset + first if n else -1), why


def block_bounds(records: np.ndarray, field: str, offset: int, child_len: int) -> np.ndarray:
    """Per parent block: first start, last end, rows, bad rows, first bad row, reason code."""
    iv = records[field] if records.dtype.names else records
    n_bad, first_bad, why = interval_problems(iv, offset, child_len)
    reasons = ("", "end < start (not increasing)", "start != previous end (not contiguous)")
    code = reasons.index(why) if why in reasons else 3
    start, end = (int(iv[0, 0]), int(iv[-1, 1])) if len(iv) else (-1, -1)
    return np.array([[start, end, len(iv), n_bad, first_bad, code]], dtype=np.int64)


def _reason(code: int, child_len: int) -> str:
    return ("", "end < start (not increasing)", "start != previous end (not contiguous)",
            f"points outside the child array of length {child_len}")[code]


@dataclass
class Bounds:
    """Per parent block: parent row offset, first child row, child end; validated."""

    offsets: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    rows: np.ndarray


def check_bounds(table: np.ndarray, parent: str, field: str, child_len: int) -> list[str]:
    """All interval problems of a parent array, from its per-block bounds table."""
    problems = []
    offsets = np.r_[0, np.cumsum(table[:, 2])[:-1]] if len(table) else np.zeros(0, np.int64)
    for (_start, _end, _rows, n_bad, first_bad, code) in table:
        if n_bad:
            problems.append(f"{parent}.{field}: row {first_bad}: {_reason(code, child_len)} "
                            f"({n_bad} bad row(s) in its chunk)")
    expected = 0
    for off, (start, end, rows, *_r) in zip(offsets, table):
        if rows == 0:
            continue
        if start != expected:
            problems.append(f"{parent}.{field}: row {off}: starts at {start}, expected {expected} "
                            "(not contiguous with the previous row)")
        expected = end
    if len(table) and table[:, 2].sum() and expected != child_len:
        problems.append(f"{parent}.{field}: the last row ends at {expected}, but the child array has {child_len} rows")
    elif not (len(table) and table[:, 2].sum()) and child_len:
        problems.append(f"{parent}.{field}: no rows, but the child array has {child_len} rows")
    return problems


def first_problem_row(problem: str) -> int:
    try:
        return int(problem.split(": row ")[1].split(":")[0])
    except (IndexError, ValueError):
        return 2**62


def raise_first(problems: list[str]) -> None:
    if problems:
        raise IntervalError(min(problems, key=first_problem_row))


def parents_of(child_lo: int, child_hi: int, starts_blocks: Sequence[np.ndarray], offsets: Sequence[int]) -> np.ndarray:
    """Parent row of each child row in ``[child_lo, child_hi)``, from the overlapping parent blocks' starts."""
    starts = np.concatenate(starts_blocks) if len(starts_blocks) > 1 else starts_blocks[0]
    base = np.concatenate([np.full(len(s), o, np.int64) + np.arange(len(s)) for s, o in zip(starts_blocks, offsets)])
    pos = np.searchsorted(starts, np.arange(child_lo, child_hi), side="right") - 1
    return base[pos]


def _parent_index_task(child_lo: int, child_hi: int, offsets: list[int], field: str, *blocks: np.ndarray) -> np.ndarray:
    return parents_of(child_lo, child_hi, [b[field][:, 0] for b in blocks], offsets)


def _take_task(child_lo, child_hi, offsets, field, nblocks, *blocks):
    iv_blocks, value_blocks = blocks[:nblocks], blocks[nblocks:]
    idx = parents_of(child_lo, child_hi, [b[field][:, 0] for b in iv_blocks], offsets)
    values = np.concatenate(value_blocks) if len(value_blocks) > 1 else value_blocks[0]
    return values[idx - offsets[0]]


class IntervalJoin:
    """The join of a child array to its parent through ``parent[field]`` intervals.

    Parameters
    ----------
    ds : L5Dataset
    parent, field, child : str
        E.g. ``("frames", "agent_index_interval", "agents")``.
    """

    def __init__(self, ds, parent: str, field: str, child: str) -> None:
        self.ds, self.parent, self.field, self.child = ds, parent, field, child
        self.child_len = len(ds[child])
        self.intervals = ds[parent].to_dask(fields=[field])
        table = self._bounds_table()
        raise_first(check_bounds(table, parent, field, self.child_len))
        self.offsets = np.r_[0, np.cumsum(table[:, 2])[:-1]].astype(np.int64) if len(table) else np.zeros(0, np.int64)
        self.starts, self.ends, self.rows = table[:, 0], table[:, 1], table[:, 2]
        self.child_chunks = ds[child].to_dask().chunks

    def _bounds_table(self) -> np.ndarray:
        x = self.intervals
        if not x.npartitions or len(x) == 0:
            return np.zeros((0, 6), np.int64)
        offsets = np.r_[0, np.cumsum(x.chunks[0])[:-1]]
        parts = [dask.delayed(block_bounds)(b, self.field, int(o), self.child_len)
                 for b, o in zip(x.to_delayed().ravel(), offsets)]
        return np.concatenate(dask.compute(*parts))

    def blocks_for(self, lo: int, hi: int) -> list[int]:
        """Parent blocks whose child ranges overlap ``[lo, hi)``."""
        return [int(k) for k in np.flatnonzero((self.rows > 0) & (self.starts < hi) & (self.ends > lo))]

    def _graph(self, name: str, task, extra_of: da.Array | None = None):
        """One task per child chunk, depending only on the parent blocks it overlaps."""
        graph = {}
        lo = 0
        tail = (0,) * (extra_of.ndim - 1) if extra_of is not None else ()
        for i, n in enumerate(self.child_chunks[0]):
            ks = self.blocks_for(lo, lo + n)
            args = [(self.intervals.name, k) for k in ks]
            offsets = [int(self.offsets[k]) for k in ks]
            if extra_of is not None:
                args += [(extra_of.name, k, *tail) for k in ks]
                graph[(name, i, *tail)] = (task, lo, lo + n, offsets, self.field, len(ks), *args)
            else:
                graph[(name, i)] = (task, lo, lo + n, offsets, self.field, *args)
            lo += n
        return graph

    def parent_index(self) -> da.Array:
        """Parent row of every child row: an int64 dask array chunked like the child."""
        name = f"l5-parent-{self.child}-{tokenize(self.intervals.name)}"
        graph = self._graph(name, _parent_index_task)
        hlg = HighLevelGraph.from_collections(name, graph, dependencies=[self.intervals])
        import dask.array as da

        return da.Array(hlg, name, chunks=self.child_chunks, dtype=np.int64)

    def take(self, values: da.Array) -> da.Array:
        """``values`` (aligned with the parent's blocks) broadcast to every child row."""
        if values.chunks[0] != self.intervals.chunks[0]:
            raise ValueError("values must be chunked like the parent array's stored chunks")
        values = values.rechunk({i: -1 for i in range(1, values.ndim)})
        name = f"l5-take-{self.child}-{tokenize(self.intervals.name, values.name)}"
        graph = self._graph(name, _take_task, extra_of=values)
        hlg = HighLevelGraph.from_collections(name, graph, dependencies=[self.intervals, values])
        chunks = (self.child_chunks[0], *values.chunks[1:])
        import dask.array as da

        return da.Array(hlg, name, chunks=chunks, dtype=values.dtype)


class Joins:
    """The joins of one dataset, built on first use: ``Joins(ds).agent_scene()`` etc."""

    def __init__(self, ds) -> None:
        self.ds = ds
        self._cache: dict[tuple[str, str], IntervalJoin] = {}

    def join(self, parent: str, field: str, child: str) -> IntervalJoin:
        key = (parent, child)
        if key not in self._cache:
            self._cache[key] = IntervalJoin(self.ds, parent, field, child)
        return self._cache[key]

    def frame_scene(self) -> da.Array:
        """Scene index of every frame."""
        return self.join(fmt.SCENES, "frame_index_interval", fmt.FRAMES).parent_index()

    def agent_frame(self) -> da.Array:
        """Frame index of every agent."""
        return self.join(fmt.FRAMES, "agent_index_interval", fmt.AGENTS).parent_index()

    def agent_scene(self) -> da.Array:
        """Scene index of every agent."""
        return self.join(fmt.FRAMES, "agent_index_interval", fmt.AGENTS).take(self.frame_scene())

    def tl_face_frame(self) -> da.Array:
        return self.join(fmt.FRAMES, "traffic_light_faces_index_interval", fmt.TL_FACES).parent_index()

    def tl_face_scene(self) -> da.Array:
        return self.join(fmt.FRAMES, "traffic_light_faces_index_interval", fmt.TL_FACES).take(self.frame_scene())

    def agent_frame_field(self, field: str) -> da.Array:
        """A field of each agent's frame (e.g. ``timestamp``, ``ego_translation``), per agent."""
        values = self.ds[fmt.FRAMES].to_dask(fields=[field])[field]
        return self.join(fmt.FRAMES, "agent_index_interval", fmt.AGENTS).take(values)


def validate(ds) -> list[str]:
    """Every interval problem of a dataset (empty when it is consistent)."""
    problems = []
    for parent, field, child in fmt.INTERVALS:
        if not (ds.has(parent) and ds.has(child)) or field not in ds[parent].dtype.names:
            continue
        j = IntervalJoin.__new__(IntervalJoin)
        j.ds, j.parent, j.field, j.child = ds, parent, field, child
        j.child_len = len(ds[child])
        j.intervals = ds[parent].to_dask(fields=[field])
        problems += check_bounds(j._bounds_table(), parent, field, j.child_len)
    return problems
