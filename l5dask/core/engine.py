"""The one engine for passes over stored chunks.

A computation is declared, not assembled (after flox and ``dask.array.reduction``):

- a :class:`ChunkSource` is anything read in numbered chunks of rows: an L5Kit array
  (:class:`l5dask.prediction.reading.L5Array`), rows held in memory; work that is not a pass over
  chunks (CSV byte ranges, lidar files, perception tables) runs as the job's tasks
  (:meth:`Job.map`, :meth:`Job.map_reduce`), each reading through :class:`l5dask.core.store.Store`;
- a :class:`Reduction` is one declared object: ``chunk`` (one chunk -> a partial), an ordered,
  associative ``combine``, its ``identity`` and a ``finalize``;
- a :class:`Pass` runs a reduction over a source in tasks of whole chunks (each decoded once),
  optionally given the :class:`Rows` of a parent (the rows whose ``[start, end)`` intervals
  overlap the task's rows), optionally keeping per-row columns for children (``rows``) and
  checking its interval fields (``intervals``).

A :class:`Job` turns them into graphs: persisting a parent pass and routing its rows to only the
child tasks that overlap it, the interval checks, the ordered tree combines (:func:`tree_reduce`,
fan-in from dask's ``split_every`` config), independent calls (:meth:`Job.map`,
:meth:`Job.map_reduce`), and errors that name the array and chunk. What the declarations leave
open (task sizes for the scheduler in use and guided groups, priorities, where the graph runs and
in which threads, waits on an object store, tuning) is the engine's policy,
:mod:`l5dask.core.policy`.

Graphs are written with dask's explicit task spec (``Task``/``TaskRef``); a task of a parent
pass returns a :class:`Block` (a NamedTuple), never a positional tuple.
"""

from __future__ import annotations

import bisect
import functools
import posixpath
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import dask
import numpy as np
from dask.base import is_dask_collection, tokenize
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph
from dask.task_spec import DataNode, List, Task, TaskRef
from dask.utils import funcname

from l5dask.core import cache as cachelib
from l5dask.core import config
from l5dask.core.intervals import block_bounds, check_bounds, raise_first
from l5dask.core.policy import (
    HELD_ROWS_BYTES,
    PARENT_TASKS_PER_THREAD,
    auto_chunks_per_task,
    call_keys,
    compute,
    interleave,
    persist,
    remote_threads,
    resolve_scheduler,
    run_remote,
    store_waits,
    task_groups,
    where_keywords,
    worker_threads,
)
from l5dask.core.progress import passes_label, stage_name
from l5dask.core.store import Store
from l5dask.errors import L5DaskError

#: Fan-in of the tree combines, unless dask's ``split_every`` config says otherwise.
SPLIT_EVERY = 16


class ChunkSource(Protocol):
    """What a pass reads: numbered chunks of consecutive rows (or bytes, or files)."""

    name: str

    @property
    def nchunks(self) -> int: ...

    def chunk_bounds(self, index: int) -> tuple[int, int]:
        """``[start, stop)`` of chunk ``index`` in the source's own unit (rows, bytes, files)."""

    def iter_chunks(self, first: int, n: int) -> Iterator[tuple[int, Any]]:
        """``(start, data)`` of chunks ``first .. first + n - 1``, each read and decoded once
        (``data`` may be a reused buffer, valid until the next one)."""

    def read(self, first: int, n: int) -> Any:
        """Chunks ``first .. first + n - 1`` as one block (for passes with ``blocks=True``)."""

    # optional: ``window(first, n)``, the source as a task over chunks ``first .. first + n - 1``
    # needs it (what it carries to a worker): a source whose chunks are made from tables of its
    # own (a restricted dataset's pieces of rows) gives each task only the part its chunks use,
    # so that the tables travel once in all, not once a task (see :func:`windowed`).


def windowed(source: Any, first: int, n: int) -> Any:
    """What a task over chunks ``first`` to ``first + n - 1`` of ``source`` carries: its ``window``
    of them when it has one, else the source itself."""
    window = getattr(source, "window", None)
    return source if window is None else window(first, n)


def _no_finalize(partial: Any) -> Any:
    return partial


@dataclass(frozen=True)
class Combine:
    """How partials merge, declared once: what :func:`~l5dask.core.engine.tree_reduce`,
    :func:`~l5dask.core.engine.tree_combine` and :meth:`~l5dask.core.engine.Job.map_reduce` need
    (a :class:`~l5dask.core.engine.Reduction` without its ``chunk``: the partials come from
    elsewhere, such as the calls of ``map_reduce`` or a dask collection's tasks).

    Parameters
    ----------
    name : str
        Names its tasks and tokenizes it: two combines with one name are the same maths.
    combine : callable ``(a, b) -> partial``
        Two neighbouring partials, ``a`` before ``b``: associative, not necessarily commutative.
    identity : callable ``() -> partial``
        The partial of nothing: ``combine(identity(), p) == p``.
    finalize : callable ``(partial) -> result``, optional
    """

    name: str
    combine: Callable[[Any, Any], Any]
    identity: Callable[[], Any]
    finalize: Callable[[Any], Any] = _no_finalize

    def __dask_tokenize__(self):
        return ("l5dask.Combine", self.name)


@dataclass(frozen=True)
class Reduction:
    """A reduction over chunks, declared once (flox's ``Aggregation`` shape): a :class:`~l5dask.core.engine.Combine`
    with the ``chunk`` that makes each partial.

    Parameters
    ----------
    name : str
        Names its tasks and tokenizes it: two reductions with one name are the same maths.
    chunk : callable ``(data, start, parent) -> partial``
        One chunk (or block) whose first row is ``start``; ``parent`` is the :class:`Rows` of the
        parent rows that overlap it (``None`` without a parent).
    combine : callable ``(a, b) -> partial``
        Two neighbouring partials, ``a`` before ``b``: associative, not necessarily commutative.
    identity : callable ``() -> partial``
        The partial of no rows: ``combine(identity(), p) == p``.
    finalize : callable ``(partial) -> result``, optional
    exact : bool
        Its result does not depend on how chunks are grouped into tasks (see the attribute).
    cache_token : optional
        What ``chunk`` computes apart from the data it is given (its parameters, JSON-able or
        tokenizable), for the cache of partials' keys (:mod:`l5dask.core.cache`): declared by a
        reduction whose name or bound arguments hold the dataset itself (its length changes as it
        grows); a callable ``(parent rows) -> token`` when what a task computes depends on which
        parent rows (held in memory) it is given. ``None``: the name and the functions with their
        bound arguments.
    """

    name: str
    chunk: Callable[[Any, int, Any], Any]
    combine: Callable[[Any, Any], Any]
    identity: Callable[[], Any]
    finalize: Callable[[Any], Any] = _no_finalize
    #: Its result is the same bits however the chunks are grouped into tasks and the tree (integer
    #: counts, exact sums, minima, each row finished from all of its rows): a fused pass
    #: (:meth:`~l5dask.core.engine.Job.run`) may then group them for its other members. Each call of ``chunk`` is
    #: still handed what the pass declares (one stored chunk at a time, or a whole block).
    exact: bool = False
    #: What ``chunk`` reads of each chunk, as its source names it (for stored chunks read encoded:
    #: ``(elements, argmaxes[, maxima[, derived columns]])`` gathered): a fused pass hands the
    #: block the union (``expect``), so that one pass over its bytes serves every member, and the
    #: derived columns another member makes anyway (``provides``) are written out for it. ``None``:
    #: not declared.
    reads: Any = None
    cache_token: Any = None
    #: Per-row columns ``chunk`` makes anyway and writes out for the other members of a fused pass
    #: that declare them in their ``reads`` (its source's ``derived_out``): a fused pass runs the
    #: members that make them first.
    provides: tuple[str, ...] = ()
    #: Results of a block ``chunk`` makes anyway and leaves in it (its source's ``leave``) for the
    #: other members of a fused pass, which then finish their partials with them (:class:`~l5dask.core.engine.Later`).
    leaves: tuple[str, ...] = ()

    def __dask_tokenize__(self):
        return ("l5dask.Reduction", self.name)


@cachelib.partial_type
@dataclass
class Rows:
    """Columns of consecutive parent rows ``offset, offset + 1, ...`` (the join columns of a pass).

    ``cols[start]`` holds each row's first child row; with contiguous intervals, parent row
    ``offset + i`` covers the child rows ``[cols[start][i], cols[start][i + 1])``.
    """

    offset: int
    cols: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(next(iter(self.cols.values()))) if self.cols else 0

    def __getitem__(self, name: str) -> np.ndarray:
        return self.cols[name]

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.cols.values())

    @staticmethod
    def concat(blocks: Sequence[Rows]) -> Rows:
        if len(blocks) == 1:
            return blocks[0]
        return Rows(blocks[0].offset, {k: np.concatenate([b.cols[k] for b in blocks]) for k in blocks[0].cols})

    def overlapping(self, lo: int, hi: int, start: str) -> Rows:
        """The rows whose child ranges overlap child rows ``[lo, hi)`` (a slice: no copy)."""
        starts = self.cols[start]
        a = max(0, int(np.searchsorted(starts, lo, side="right")) - 1)
        b = int(np.searchsorted(starts, hi - 1, side="right")) if hi > lo else a
        return Rows(self.offset + a, {k: v[a:b] for k, v in self.cols.items()})

    def runs(self, lo: int, hi: int, start: str) -> np.ndarray | None:
        """The number of child rows of ``[lo, hi)`` each of these rows is the parent of, in order
        (the child rows come in runs, one per parent row), or ``None`` when a child row there has
        no parent among these (before the first one's first child row) or there is none."""
        starts = self.cols[start]
        if not len(starts) or starts[0] > lo or hi <= lo:
            return None
        return np.diff(np.clip(starts, lo, hi), append=hi)

    def locate(self, lo: int, hi: int, start: str) -> np.ndarray:
        """Position (in these rows) of the parent of each child row in ``[lo, hi)``: the last row
        whose first child row is at or before it (``searchsorted(..., side="right") - 1``)."""
        counts = self.runs(lo, hi, start)
        if counts is None:
            return np.searchsorted(self.cols[start], np.arange(lo, hi), side="right") - 1
        # the same, in one pass over the rows: each parent repeated over its rows in [lo, hi)
        return np.repeat(np.arange(len(counts), dtype=np.int64), counts)

    def parents_of(self, rows: np.ndarray, start: str) -> np.ndarray:
        """How many of the child rows ``rows`` (increasing) each of these rows is the parent of, in
        order: ``np.repeat(values, counts)`` spreads their values over them (a search of each of
        these rows' first child among ``rows``, not of each child among these); ``ValueError``
        where a child row has none among these."""
        firsts = np.searchsorted(rows, self.cols[start], side="left")
        if len(rows) and (not len(firsts) or firsts[0] > 0):
            raise ValueError(f"child row {int(rows[0])} has no parent among rows from {self.offset}")
        return np.diff(firsts, append=len(rows))

    def spread(self, lo: int, hi: int, start: str, values: np.ndarray, by_column: bool = False) -> np.ndarray:
        """``values`` (one per row of these) of the parent of each child row in ``[lo, hi)``:
        ``values[self.locate(lo, hi, start)]``, each value repeated over its rows in one pass
        (no positions made and taken from: the scene of 30 M agents, 0.1 s against 0.4 s).
        ``by_column``: values of several numbers a row (``(rows, k)``) spread column by column,
        the result column-major, each of its columns contiguous (8,000 frames' ego positions over
        640,000 agents: 1.8-2.4 ms against 3.6-4.3 ms, and a column's copy 1.0 ms against 3.4)."""
        counts = self.runs(lo, hi, start)
        if by_column and values.ndim == 2:
            if counts is None:
                return values.T.take(self.locate(lo, hi, start), axis=1).T
            return np.repeat(values.T, counts, axis=1).T
        if counts is None:
            return values[self.locate(lo, hi, start)]
        return np.repeat(values, counts, axis=0)


@cachelib.partial_type
class Block(NamedTuple):
    """What a task of a pass returns."""

    partial: Any
    rows: Rows | None
    bounds: dict[str, np.ndarray] | None  # per interval field: (chunks, 6) table of block_bounds


@dataclass(frozen=True)
class Link:
    """How a child pass gets its parent rows: from a persisted pass, or from rows in memory."""

    parent: Any  # Persisted | Held | Rows | Pass (declared: persisted first by Job.run)
    start: str  # the column of parent rows holding each row's first child row
    interval: str | None = None  # the parent's interval field (a persisted parent's checked bounds)


class Stage(NamedTuple):
    """What a task of a pass carries: the pass without its parent (which may hold a graph)."""

    label: str
    source: Any
    reduction: Reduction | None
    rows: Callable | None
    intervals: dict[str, int]
    blocks: bool
    encoded: bool = False
    #: The parent rows' column of each one's first child row: a task is handed only the parent
    #: rows that overlap its own (``task_parent``), so that its result depends on those alone.
    start: str | None = None


@dataclass
class Pass:
    """A declared pass over one source.

    Parameters
    ----------
    source : ChunkSource
    reduction : Reduction, optional
        What to reduce; ``None`` for a pass that only keeps rows (a join's parent).
    parent : Link, optional
        Rows of the parent handed to each chunk (only those overlapping its rows).
    rows : callable ``(data, start, parent) -> Rows``, optional
        Per-row columns kept for child passes (the pass is then persisted, spread finer): each
        row's made from its own record and its parent rows (the cache of partials names the rows
        a stored chunk at a time).
    intervals : dict, optional
        ``{field: child length}``: interval fields whose bounds the job checks before any child
        pass is built (an :class:`~l5dask.errors.IntervalError` names the array and first row).
    blocks : bool
        Hand ``chunk`` the task's chunks as one block (read with ``source.read``) instead of one
        chunk at a time (streamed through one reused buffer).
    encoded : bool
        Hand ``chunk`` each chunk (or with ``blocks``, the block) fetched but not decoded
        (``source.iter_encoded``, ``source.read_encoded``: a
        :class:`~l5dask.prediction.reading.Encoded`, decoded or gathered as ``chunk`` asks), from
        sources that have it; ``chunk`` then takes either.
    priority : int
        Scheduling priority of its tasks (higher first).
    name : str, optional
        Names its tasks (default: the source's name).
    groups : list of (first, n), optional
        Its tasks' chunks, fixed (default: sized by the job).
    """

    source: Any
    reduction: Reduction | None = None
    parent: Link | None = None
    rows: Callable[[Any, int, Any], Rows] | None = None
    intervals: dict[str, int] = field(default_factory=dict)
    blocks: bool = False
    encoded: bool = False
    priority: int = 0
    name: str | None = None
    #: The tasks' chunk groups ``[(first, n)]``, fixed (a fused pass keeps its members' own);
    #: ``None``: sized by the job's policy.
    groups: list[tuple[int, int]] | None = None

    def __post_init__(self) -> None:
        if self.encoded and (self.rows is not None or self.intervals):
            raise ValueError("an encoded pass hands its chunks to its reduction only (no rows or intervals)")

    @property
    def label(self) -> str:
        return self.name or self.source.name

    def stage(self) -> Stage:
        return Stage(
            self.label,
            self.source,
            self.reduction,
            self.rows,
            dict(self.intervals),
            self.blocks,
            self.encoded,
            self.parent.start if self.parent is not None else None,
        )


def _aligned_nodes(first: int, n: int) -> list[tuple[int, int]]:
    """The aligned nodes of chunks ``[first, first + n)``, largest first: runs of ``2**k`` chunks
    starting at a multiple of ``2**k`` (a cached task of an exact reduction is kept in them)."""
    nodes = []
    while n > 0:
        size = 1 << min((first & -first).bit_length() - 1 if first else 62, n.bit_length() - 1)
        nodes.append((first, size))
        first, n = first + size, n - size
    return nodes


def _sorted_bounds(t: np.ndarray) -> tuple[np.ndarray, list[int], list[int]] | None:
    """Of a bounds table (a row a chunk: child start, child end, rows), the chunks with rows and
    their starts and ends (lists, for :mod:`bisect`), when both are in order (``None`` when not:
    then scanned)."""
    with_rows = np.flatnonzero(t[:, 2] > 0)
    starts, ends = t[with_rows, 0], t[with_rows, 1]
    if np.any(starts[1:] < starts[:-1]) or np.any(ends[1:] < ends[:-1]):
        return None
    return with_rows, starts.tolist(), ends.tolist()


@dataclass
class Persisted:
    """A pass whose blocks are held (on the workers, or in this process): its keys, its graph,
    and each block's child bounds per interval field."""

    spec: Pass
    keys: list
    collections: list
    groups: list[tuple[int, int]]
    bounds: dict[str, np.ndarray] = field(default_factory=dict)
    #: Block index -> the task that makes its rows again, when the blocks do not hold them (see
    #: :meth:`Job.persist`; ``None`` for a block that holds them); ``None`` when they all do.
    remake: list[Task | None] | None = None
    #: Stored chunk index -> the identity of its rows (for the cache's keys of child tasks: a child
    #: task's key names the rows of only the chunks it takes rows of, so that the parent's last
    #: chunk taking rows as the dataset grows changes the keys of only its own children);
    #: ``None`` when the job has no cache or the pass cannot be cached.
    row_ids: list[str] | None = None
    #: Block index -> ``run_group``'s arguments that make its rows again (a damaged cache entry of a
    #: child task is computed again with them).
    remake_calls: list[tuple] | None = None
    #: Interval field -> (its bounds table, :meth:`child_range` of it): made once, asked a task.
    _ranges: dict = field(default_factory=dict, repr=False, compare=False)
    #: Interval field -> (its bounds table, :func:`_sorted_bounds` of it): made once, for :meth:`chunks`.
    _sorted: dict = field(default_factory=dict, repr=False, compare=False)

    def link(self, interval: str, start: str) -> Link:
        """Hand child passes the rows of this pass, placed by ``interval`` (checked), found by ``start``."""
        if interval not in self.bounds:
            raise ValueError(f"pass {self.spec.label!r} does not check {interval!r}")
        return Link(self, start, interval)

    def child_range(self, interval: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per block: first child row, child end, parent rows (from the checked bounds)."""
        t = self.bounds[interval]
        got = self._ranges.get(interval)
        if got is None or got[0] is not t:
            got = self._ranges[interval] = (t, self._child_range(t))
        return got[1]

    def _child_range(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if len(t) == len(self.groups):
            return t[:, 0], t[:, 1], t[:, 2]
        # a row per chunk (a pass that is not read in blocks): per block, over its chunks with rows
        cuts = np.cumsum([0] + [n for _, n in self.groups[:-1]])
        has = t[:, 2] > 0
        starts = np.minimum.reduceat(np.where(has, t[:, 0], np.iinfo(np.int64).max), cuts)
        return starts, np.maximum.reduceat(np.where(has, t[:, 1], -1), cuts), np.add.reduceat(t[:, 2], cuts)

    def chunks(self, interval: str, lo: int, hi: int) -> np.ndarray | None:
        """The stored chunks whose child rows (by ``interval``) overlap ``[lo, hi)`` (its bounds
        hold a row a chunk); ``None`` if they cannot be told."""
        t = self.bounds.get(interval)
        if t is None or self.row_ids is None or len(t) != len(self.row_ids):
            return None
        got = self._sorted.get(interval)
        if got is None or got[0] is not t:
            got = self._sorted[interval] = (t, _sorted_bounds(t))
        if got[1] is None:
            return np.flatnonzero((t[:, 2] > 0) & (t[:, 0] < hi) & (t[:, 1] > lo))
        # (the chunks with rows, their starts and ends both in order: those overlapping [lo, hi)
        # are one run of them, found by two bisections; a restart's keys of the pieces inside its
        # tasks asked 52,861 times at 1 G agents, each a scan of every frames chunk)
        with_rows, starts, ends = got[1]
        return with_rows[bisect.bisect_right(ends, lo) : bisect.bisect_left(starts, hi)]

    def overlapping(self, interval: str, lo: int, hi: int) -> np.ndarray:
        """The blocks whose child rows (by ``interval``) overlap ``[lo, hi)``."""
        starts, ends, rows = self.child_range(interval)
        return np.flatnonzero((rows > 0) & (starts < hi) & (ends > lo))

    def refs(self, interval: str, lo: int, hi: int) -> list[TaskRef]:
        """References to the rows of only the blocks whose child rows overlap ``[lo, hi)``: the
        blocks themselves, or the tasks that make their rows again (add :meth:`Persisted.tasks` to the graph)."""
        ks = self.overlapping(interval, lo, hi)
        return [TaskRef(self.keys[k] if (t := self.remade(k)) is None else t.key) for k in ks]

    def remade(self, block: int) -> Task | None:
        """The task that makes a block's rows again; ``None`` when the block holds them."""
        return None if self.remake is None else self.remake[block]

    def tasks(self, interval: str, lo: int, hi: int) -> dict:
        """The graph entries :meth:`refs` needs besides the persisted blocks."""
        if self.remake is None:
            return {}
        tasks = (self.remade(k) for k in self.overlapping(interval, lo, hi))
        return {t.key: t for t in tasks if t is not None}


@dataclass(frozen=True)
class Held:
    """A parent pass declared into a lazy graph, not run (:meth:`~l5dask.core.engine.Job.hold`): its
    block tasks and one task, ``key``, that checks their interval bounds and holds all their rows as
    one :class:`~l5dask.core.engine.Block`. Which blocks a child task overlaps is known only from the data, so every
    child task takes the whole (on threads, shared memory; on a cluster, copied once to each
    worker that runs a child): building and inspecting the graph computes nothing, unlike a
    :class:`Persisted` pass, which runs when declared and routes each child only its blocks."""

    key: tuple
    graph: dict

    def refs(self, interval: str, lo: int, hi: int) -> list[TaskRef]:
        """A reference to the held rows (every child task takes them whole)."""
        return [TaskRef(self.key)]

    def tasks(self, interval: str, lo: int, hi: int) -> dict:
        """Nothing besides the held ``graph``, which the child's graph holds whole."""
        return {}


# --- tasks ---------------------------------------------------------------------------------
def parent_rows(link_rows: Rows | None, blocks: tuple[Block, ...]) -> Rows | None:
    """A task's parent rows: those handed to it, else the rows of the parent blocks it was given."""
    if link_rows is not None:
        return link_rows
    rows = [b.rows for b in blocks if b.rows is not None]
    return Rows.concat(rows) if rows else None


def task_parent(spec: Stage, first: int, n: int, link_rows: Rows | None, blocks: tuple[Block, ...]) -> Rows | None:
    """The parent rows a task over chunks ``first .. first + n - 1`` computes with: of those handed
    to it (:func:`parent_rows`: whole parent blocks), the rows whose child rows overlap its own (no
    copy). Its result then depends on these rows alone, and the cache can find it by them
    (:meth:`Job.by_rows`): a parent chunk that changed elsewhere (grown) changes nothing here."""
    if spec.start is None or not n:
        return parent_rows(link_rows, blocks)
    lo, hi, start = spec.source.chunk_bounds(first)[0], spec.source.chunk_bounds(first + n - 1)[1], spec.start
    if link_rows is not None:
        return link_rows.overlapping(lo, hi, start)
    rows = [b.rows for b in blocks if b.rows is not None and len(b.rows)]
    if not rows:
        return parent_rows(None, blocks)
    # from the last block whose first row is the parent of a row at or before ``lo``, each block's
    # rows that overlap ``[lo, hi)`` joined (consecutive rows): not every block's rows copied
    first = max((i for i, r in enumerate(rows) if r.cols[start][0] <= lo), default=0)
    return Rows.concat([r.overlapping(lo, hi, start) for r in rows[first:]]).overlapping(lo, hi, start)


def _note(exc: BaseException, spec_name: str, source: Any, first: int, n: int, what: str) -> None:
    chunks = f"chunk {first}" if n == 1 else f"chunks {first}..{first + n - 1}"
    exc.add_note(f"l5dask: in {what} of {source.name!r}, {chunks} (pass {spec_name!r})")


def call_task(key: Any, func: Callable, args: Sequence[Any], remote: bool) -> Task:
    """The task ``func(*args)`` of :meth:`Job.map` and :meth:`Job.map_reduce`; ``remote`` (its reads
    are an object store's): on a dask.distributed worker, it gives its thread back at each wait for
    bytes that have not come, as a pass's task does (:func:`run_remote`)."""
    return Task(key, run_remote, func, *args) if remote else Task(key, func, *args)


def call_graph(key: str, func: Callable, calls: Sequence[tuple], remote: bool) -> tuple[dict, list, list]:
    """The tasks of :meth:`Job.map` and :meth:`Job.map_reduce`: ``(graph, keys, collections)``, a
    task ``func(*args)`` a call (:func:`call_task`); calls whose arguments hold dask collections
    (blocks of a dask array, ``Delayed``) take their computed values, as ``dask.delayed`` does, and
    their graphs are the returned collections."""
    keys = call_keys(key, len(calls))
    if not any(is_dask_collection(a) for args in calls for a in args):
        return {k: call_task(k, func, args, remote) for k, args in zip(keys, calls)}, keys, []
    return {}, keys, lazy_map(functools.partial(run_remote, func) if remote else func, calls, keys=keys)


def lazy_map(
    func: Callable, calls: Sequence[tuple], name: str | None = None, keys: Sequence[Any] | None = None
) -> list[Delayed]:
    """``func(*args)`` of each call, lazily: one ``Delayed`` task each (arguments may be dask
    collections, their values passed), named ``name-<token of the call>`` (the same call, the
    same key, as ``dask.delayed(pure=True)``'s) or by ``keys``. The engine's lazy counterpart of
    :meth:`Job.map`, for collections built of independent calls (a CSV's parsed row groups as dask
    arrays); their partials merge through :func:`tree_combine`, never a tree of the caller's own."""
    from dask.delayed import delayed

    lazy = delayed(func, pure=True)
    if keys is None:
        keys = [f"{name or funcname(func)}-{tokenize(func, *args)}" for args in calls]
    return [lazy(*args, dask_key_name=k) for k, args in zip(keys, calls)]


def read_block_of(source: Any, first: int, n: int, encoded: bool = False) -> Any:
    """Chunks ``first .. first + n - 1`` of ``source`` as one block: records, or (``encoded``, from
    sources that can) the stored chunks not yet decoded."""
    return source.read_encoded(first, n) if encoded and hasattr(source, "read_encoded") else source.read(first, n)


def run_group(spec: Stage, first: int, n: int, link_rows: Rows | None, *parent_blocks: Block) -> Block:
    """The task of a pass: read chunks ``first .. first + n - 1`` (each decoded once) and reduce
    them, keep their rows and their interval bounds."""
    source, red = spec.source, spec.reduction
    parent = task_parent(spec, first, n, link_rows, parent_blocks)
    part, rows = None, []
    bounds: dict[str, list[np.ndarray]] = {f: [] for f in spec.intervals}
    remote = getattr(source, "remote", False)
    try:
        with store_waits(remote):  # (on a worker: out of its threads while the bytes have not come)
            if spec.blocks:
                block = read_block_of(source, first, n, spec.encoded)
                chunks: Iterable[tuple[Any, Any]] = [(source.chunk_bounds(first)[0], block)]
            else:
                chunks = (
                    source.iter_encoded(first, n)
                    if spec.encoded and hasattr(source, "iter_encoded")
                    else source.iter_chunks(first, n)
                )
            for start, data in chunks:
                if red is not None:
                    p = red.chunk(data, start, parent)
                    part = p if part is None else red.combine(part, p)
                if spec.rows is not None:
                    rows.append(spec.rows(data, start, parent))
                for f, child_len in spec.intervals.items():
                    if spec.blocks:  # (a row a stored chunk, as a streaming pass's: see Persisted.chunks)
                        for i in range(first, first + n):
                            a, b = source.chunk_bounds(i)
                            bounds[f].append(block_bounds(data[a - start : b - start], f, a, child_len))
                    else:
                        bounds[f].append(block_bounds(data, f, start, child_len))
    except Exception as exc:
        if not isinstance(exc, L5DaskError):
            _note(exc, spec.label, source, first, n, red.name if red is not None else "rows")
        raise
    return Block(
        part if red is not None else None,
        Rows.concat(rows) if rows else None,
        {f: np.concatenate(b) for f, b in bounds.items()} if spec.intervals else None,
    )


class ByRows(NamedTuple):
    """How a task given a persisted parent's rows is also found by them (:meth:`Job.by_rows`):
    ``prefix``, the ``repr`` of its key's parts before its parent rows (what it computes, its own
    chunks); ``look``, whether the cache holds an alias of its chunks (a read worth making)."""

    prefix: str
    look: bool


def _alias_of(
    entry: cachelib.Entry, by: ByRows, spec: Stage, first: int, n: int, link_rows: Rows | None, blocks: tuple
) -> cachelib.Entry | None:
    """The alias entry of a task over chunks ``first .. first + n - 1``: keyed by what it computes,
    its own chunks and a hash of the parent rows it computes with (``task_parent``)."""
    parent = task_parent(spec, first, n, link_rows, blocks)
    if parent is None:
        return None
    key = cachelib.digest_repr(f"{by.prefix}{('rows', cachelib.rows_digest(parent.offset, parent.cols))!r})")
    name = entry.cache.entry_name(str(entry.about.get("reduction")), cachelib.alias_key(first, n, key))
    return cachelib.Entry(entry.cache, posixpath.join(posixpath.dirname(entry.path), name), entry.about)


def _found_by_rows(entry: cachelib.Entry, alias: cachelib.Entry | None, spec: Stage) -> Block | None:
    """The block an alias leads to (then kept under ``entry``'s key too, read directly next time);
    ``None`` when it leads nowhere sound."""
    target = cachelib.follow(alias) if alias is not None else None
    if target is None:
        return None
    ok, got = cachelib.load(target)
    if not ok or not _still_valid(got, spec.intervals):
        return None
    cachelib.store(entry, got)  # (written again under its own name: an entry names itself)
    return got[0]


def _kept(entry: cachelib.Entry, alias: cachelib.Entry | None, block: Block, intervals: dict) -> None:
    """Keep a computed block in ``entry`` (its rows never), and the alias that names it."""
    if cachelib.store(entry, (block._replace(rows=None), intervals)) and alias is not None:
        cachelib.keep_alias(alias, entry)


def run_group_cached(
    entry: cachelib.Entry,
    by: ByRows | None,
    spec: Stage,
    first: int,
    n: int,
    link_rows: Rows | None,
    *parent_blocks: Block,
) -> Block:
    """:func:`run_group`, its block (partial and interval bounds) then kept in the cache's ``entry``;
    ``by``: first looked for by its parent rows (``ByRows``), and its alias kept."""
    alias = _alias_of(entry, by, spec, first, n, link_rows, parent_blocks) if by is not None else None
    if by is not None and by.look:
        found = _found_by_rows(entry, alias, spec)
        if found is not None:
            cachelib.count(hits=1, misses=-1)
            return found
    block = run_group(spec, first, n, link_rows, *parent_blocks)
    _kept(entry, alias, block, dict(spec.intervals))
    return block


def run_pieces(
    entry: cachelib.Entry | None,
    by: ByRows | None,
    pieces: Sequence[tuple[cachelib.Entry, bool, int, int, ByRows | None]],
    spec: Stage,
    first: int,
    n: int,
    link_rows: Rows | None,
    *parent_blocks: Block,
) -> Block:
    """The task of an exact reduction over chunks ``first .. first + n - 1`` in aligned pieces
    (``Job._pieces``): each piece read from the cache when it is there (by its key, or by its
    parent rows: its ``ByRows``), else computed and kept; their blocks combined in order (the
    same bits as one block: the reduction is exact), then kept whole in ``entry`` too (``None``: a
    pass's last, short task, kept in its pieces alone, ``Job._cached_tasks``). A pass that makes
    rows (``spec.rows``) returns them when every piece was computed (none is kept in the cache)."""
    red = spec.reduction
    assert red is not None
    part: Any = None
    bounds: dict[str, list[np.ndarray]] = {f: [] for f in spec.intervals}
    rows: list[Rows | None] = []
    found = 0
    for piece, hit, f, m, piece_by in pieces:
        block = None
        if hit:
            ok, got = cachelib.load(piece)
            block = got[0] if ok and _still_valid(got, spec.intervals) else None
            found += block is not None
        alias = None
        if block is None and piece_by is not None:
            alias = _alias_of(piece, piece_by, spec, f, m, link_rows, parent_blocks)
            block = _found_by_rows(piece, alias, spec) if piece_by.look else None
            found += block is not None
        if block is None:
            block = run_group(spec, f, m, link_rows, *parent_blocks)
            _kept(piece, alias, block, dict(spec.intervals))
        part = block.partial if part is None else red.combine(part, block.partial)
        rows.append(block.rows)
        for k in bounds:
            bounds[k].append((block.bounds or {})[k])
    out = Block(part, None, {k: np.concatenate(b) for k, b in bounds.items()} if spec.intervals else None)
    if found == len(pieces) and not all(hit for _, hit, _, _, _ in pieces):
        cachelib.count(hits=1, misses=-1)  # (found whole, some pieces by their parent rows)
    if entry is not None and not all(hit for _, hit, _, _, _ in pieces):
        alias = _alias_of(entry, by, spec, first, n, link_rows, parent_blocks) if by is not None else None
        _kept(entry, alias, out, dict(spec.intervals))
    if spec.rows is not None and all(r is not None for r in rows):
        out = out._replace(rows=Rows.concat([r for r in rows if r is not None]))
    return out


def _still_valid(got: Any, intervals: dict[str, int]) -> bool:
    """Whether a cached ``(block, child lengths)`` holds what the task computes now: its interval
    checks found no bad row against child arrays no longer than they are now (a block's checks
    against longer children are then the same: its key leaves the children's lengths out, which
    change as a dataset grows), or were made against the same lengths."""
    if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], Block) and isinstance(got[1], dict)):
        return False
    block, then = got
    if set(then) != set(intervals):
        return False
    for f, now in intervals.items():
        table = (block.bounds or {}).get(f)
        if table is None:
            return False
        if then[f] != now and (then[f] > now or bool(table[:, 3].any())):
            return False
    return True


def load_group(
    entry: cachelib.Entry,
    remake: Sequence[tuple],
    spec: Stage,
    first: int,
    n: int,
    link_rows: Rows | None,
    *parent_blocks: Block,
) -> Block:
    """The block a cache's ``entry`` holds; when it is damaged (one warning, counted), computed
    again as :func:`run_group_cached`, the parent rows made again by ``remake`` (``run_group``'s
    arguments for each parent block it overlaps) unless they are given."""
    ok, got = cachelib.load(entry)
    if ok and _still_valid(got, spec.intervals):
        return got[0]
    cachelib.count(hits=-1, misses=1)
    if remake:
        parent_blocks = tuple(run_group(*call) for call in remake)
    return run_group_cached(entry, None, spec, first, n, link_rows, *parent_blocks)


def keep_pass(entry: cachelib.Entry, bounds: dict | None, intervals: dict | None, partial: Any) -> Any:
    """Keep a whole pass in the cache's ``entry``: its combined partial (the root of its tree) and,
    for a persisted pass, its interval bounds and the child lengths they were checked against;
    returns the partial (its members are finalized after it is kept: a finalize may change it)."""
    cachelib.store(entry, ("pass", partial, bounds, intervals))
    return partial


def keep_prefix(entry: cachelib.Entry, partial: Any) -> Any:
    """Keep the combined partial of a pass's first tasks in the cache's ``entry`` (``Job._prefix``);
    returns it."""
    cachelib.store(entry, ("prefix", partial))
    return partial


class Prefix(NamedTuple):
    """A pass's first tasks combined (``Job._prefix``): ``found``, how many the cache held (0: none),
    their ``partial``; ``keep``, where this run keeps its first ``cut`` tasks (``None``: not kept)."""

    found: int
    partial: Any
    keep: cachelib.Entry | None
    cut: int


def _remade(spec: Pass) -> bool:
    """Whether a persisted pass's blocks leave its rows out (made again by the child tasks that
    need them): its rows are kept, and its parent is none or rows in memory."""
    return spec.rows is not None and (spec.parent is None or isinstance(spec.parent.parent, Rows))


def _first_of(values: list, _kept: list) -> list:
    return values


def _sound_pass(got: Any, intervals: dict[str, int]) -> bool:
    """Whether a whole pass's cached ``("pass", partial, bounds, child lengths)`` holds what the pass
    computes now (the interval checks as :func:`_still_valid` says of a task's block)."""
    if not (isinstance(got, tuple) and len(got) == 4 and got[0] == "pass"):
        return False
    _, _, bounds, then = got
    if not intervals:
        return bounds is None and then is None
    if not (isinstance(bounds, dict) and isinstance(then, dict) and set(bounds) == set(then) == set(intervals)):
        return False
    for f, now in intervals.items():
        table = bounds[f]
        if not (isinstance(table, np.ndarray) and table.ndim == 2 and table.shape[1] == 6 and isinstance(then[f], int)):
            return False
        if then[f] != now and (then[f] > now or bool(table[:, 3].any())):
            return False
    return True


def _partial(x: Any) -> Any:
    return x.partial if isinstance(x, Block) else x


def combine_many(reduction: Combine | Reduction, *parts: Any) -> Any:
    """Combine neighbouring partials (or blocks) in order."""
    out = _partial(parts[0])
    for p in parts[1:]:
        out = reduction.combine(out, _partial(p))
    return out


def _finalize(reduction: Combine | Reduction, part: Any) -> Any:
    return reduction.finalize(part)


def _finalize_member(reduction: Combine | Reduction, index: int | None, part: Any) -> Any:
    """A member's result from a fused partial (``index``: its place; ``None``: not fused)."""
    return reduction.finalize(part if index is None else part[index])


def hold_blocks(parent: str, intervals: dict[str, int], *blocks: Block) -> Block:
    """The task of a :class:`Held` pass: its blocks' interval bounds checked (the first problem
    raised, as :meth:`Job.persist` does), their rows as one block."""
    for f, child_len in intervals.items():
        table = np.concatenate([b.bounds[f] for b in blocks if b.bounds]) if blocks else np.zeros((0, 6), np.int64)
        raise_first(check_bounds(table, parent, f, child_len))
    rows = [b.rows for b in blocks if b.rows is not None]
    return Block(None, Rows.concat(rows) if rows else None, None)


def rows_within(limit: int, task: Callable[..., Block], *args: Any) -> Block:
    """``task(*args)`` (:func:`run_group`, or with a cache :func:`run_group_cached`,
    :func:`run_pieces` or :func:`load_group`), its rows left out when they take more than ``limit``
    bytes (made again by the child tasks that need them): a persisted pass's rows held, memory
    bounded."""
    block = task(*args)
    if block.rows is not None and block.rows.nbytes > limit:
        return block._replace(rows=None)
    return block


def _held_rows(held: list, remake: list[Task | None]) -> list[Task | None] | None:
    """A locally persisted pass's remake tasks, ``None`` for each block that holds its rows (its
    child tasks take them, no read again); ``None`` when every block does."""
    out: list[Task | None] = []
    for collection, task in zip(held, remake, strict=True):
        graph = collection.__dask_graph__()
        block = graph.get(collection.key) if isinstance(graph, Mapping) else None
        out.append(None if isinstance(block, Block) and block.rows is not None else task)
    return None if all(t is None for t in out) else out


def _bounds_of(block: Block) -> dict[str, np.ndarray]:
    return block.bounds or {}


def _held_here(passes: list[Persisted]) -> list[dict[str, np.ndarray]] | None:
    """Each block's interval bounds, taken from the blocks when they are held in this process (a
    persist on local threads leaves each in its collection's graph); ``None`` when one is not (then
    they are fetched by a compute). Saves a compute of its own, thread pool included, a persist."""
    out = []
    for p in passes:
        for key, held in zip(p.keys, p.collections, strict=True):
            graph = held.__dask_graph__()
            block = graph.get(key) if isinstance(graph, Mapping) else None
            if not isinstance(block, Block):
                return None
            out.append(_bounds_of(block))
    return out


# --- the tree combine ----------------------------------------------------------------------
def fold_exclusive(graph: Mapping[Any, Any], roots: Sequence[Any]) -> dict | None:
    """``graph`` (every task a task spec node) with each of ``roots`` made one task that also runs
    the tasks only it needs (``GraphNode.fuse``: the root's subgraph, run in order by the thread
    that runs it); a task two roots need stays a task of its own, as does every task no root
    needs. ``None`` when a task is not a task spec node (nothing is folded then).

    The leaves of a reduction over a dask collection's blocks (:func:`~l5dask.prediction.groupby.reduce_parts`):
    the tasks of one block are then one task, so that two of them that share the block's data
    (the two columns a block's stored chunks are gathered into once) run one after the other in
    one thread, never each on a thread of its own, one waiting for the other (on local threads,
    the xarray view's mean speed per scene and label over 30 M agents: 11% of the workers' time
    waited so), and the scheduler has a task a block to run, not eight."""
    from dask.task_spec import GraphNode

    if not all(isinstance(t, GraphNode) for t in graph.values()):
        return None
    shared = object()
    owner: dict[Any, Any] = {}

    def share(key: Any) -> None:
        todo = [key]
        while todo:
            k = todo.pop()
            if owner.get(k) is not shared and k in graph:
                owner[k] = shared
                todo.extend(graph[k].dependencies)

    for root in roots:
        owner[root] = root
        todo = list(graph[root].dependencies)
        while todo:
            k = todo.pop()
            if k not in graph:
                continue
            got = owner.get(k)
            if got is None:
                owner[k] = root
                todo.extend(graph[k].dependencies)
            elif got is not root and got is not shared:
                share(k)
    own: dict[Any, list] = {root: [] for root in roots}
    out = {}
    for k, task in graph.items():
        o = owner.get(k)
        if o is None or o is shared:
            out[k] = task
        elif k != o:
            own[o].append(task)
    for root in roots:
        out[root] = GraphNode.fuse(*own[root], graph[root], key=root) if own[root] else graph[root]
    return out


def tree_reduce(
    graph: dict, name: str, leaves: Sequence[Any], reduction: Combine | Reduction, split_every: int | None = None
) -> Any:
    """Add an ordered tree combine of ``leaves`` (keys) to ``graph``, one key name per level
    (``name-0``, ``name-1``...); returns the root key. Fan-in: ``split_every``, else dask's
    ``split_every`` config, else ``SPLIT_EVERY``. The engine's one tree: its passes, its
    :meth:`Job.map_reduce` and :func:`tree_combine` (over lazy partials) all merge through it."""
    fan_in = int(split_every or dask.config.get("split_every", None) or SPLIT_EVERY)
    if fan_in < 2:
        raise ValueError("split_every must be at least 2")
    if not leaves:
        key = (name, 0, 0)
        graph[key] = Task(key, reduction.identity)
        return key
    level, keys = 0, list(leaves)
    while len(keys) > 1 or level == 0:
        nxt = []
        for j in range(0, len(keys), fan_in):
            key = (name, level, j // fan_in)
            graph[key] = Task(key, combine_many, reduction, *[TaskRef(k) for k in keys[j : j + fan_in]])
            nxt.append(key)
        keys, level = nxt, level + 1
    return keys[0]


def tree_combine(
    parts: Sequence[Any],
    combine: Combine | Reduction,
    split_every: int | None = None,
    finalize: bool = False,
    name: str | None = None,
) -> Delayed:
    """Lazy partials merged by :func:`~l5dask.core.engine.tree_reduce`, lazily (dask's ``Bag.reduction`` shape).

    ``parts`` are ``Delayed`` partials (or values), neighbours in order; returns a ``Delayed`` of
    their ordered combine (``combine.identity()`` for none), ``combine.finalize``-d if
    ``finalize``. Nothing is computed: each merge is a task of the returned graph, run where its
    partials are (on a cluster: on the workers), fan-in as :func:`tree_reduce`'s. The one tree
    for every collection's partials (the accessor's and the dataframes' quantile sketches too).

    >>> import dask
    >>> add = Combine("add", lambda a, b: a + b, lambda: 0)
    >>> tree_combine([dask.delayed(i) for i in range(100)], add, split_every=4).compute()
    4950
    """
    from dask.delayed import delayed

    parts = [p if isinstance(p, Delayed) else delayed(p) for p in parts]
    keys = [p.key for p in parts]
    name = name or f"l5-tree-{combine.name}-{tokenize(combine, keys, split_every, finalize)}"
    graph: dict = {}
    root = tree_reduce(graph, name, keys, combine, split_every)
    if finalize:
        fin = (f"{name}-finalize",)
        graph[fin] = Task(fin, _finalize, combine, TaskRef(root))
        root = fin
    return Delayed(root, HighLevelGraph.from_collections(name, graph, dependencies=parts), layer=name)


def _pow2(n: int) -> int:
    """The least power of two at or above ``n`` (1 for none)."""
    return 1 << max(0, int(n) - 1).bit_length()


# --- fusion: many passes over one source as one --------------------------------------------
class Later:
    """A member's partial of a fused pass's block, finished (``finish()``) once every member has
    taken the block: with what the others left in it (``Reduction.leaves``), where it would have
    made the same again. A ``chunk`` returns one only where its block says a member will leave
    something in it (its source's ``leaves(name)``: a fused pass's block, never a lone pass's)."""

    __slots__ = ("finish",)

    def __init__(self, finish: Callable[[], Any]) -> None:
        self.finish = finish


def _now(partial: Any) -> Any:
    """A partial, finished now if it waits (:class:`~l5dask.core.engine.Later`)."""
    return partial.finish() if isinstance(partial, Later) else partial


@dataclass(frozen=True)
class Member:
    """A pass fused into another (:func:`~l5dask.core.engine.fused_reduction`): its reduction and how it takes its chunks."""

    reduction: Reduction
    blocks: bool
    encoded: bool


def _first_chunk(source: Any, start: int) -> int:
    """The stored chunk whose first row is ``start`` (a search of the chunks' bounds)."""
    lo, hi = 0, source.nchunks
    while lo < hi:
        mid = (lo + hi) // 2
        if source.chunk_bounds(mid)[0] < start:
            lo = mid + 1
        else:
            hi = mid
    return lo


def fused_chunk(members: tuple[Member, ...], source: Any, data: Any, start: int, parent: Any) -> tuple:
    """The partials of every member of a fused pass over one block (read once: records, or the
    stored chunks not decoded), each handed what its own pass would have been: the block whole
    (``blocks``), else one stored chunk at a time (or, encoded, the groups ``source.iter_encoded``
    makes: ``data.pieces()``, or ``data`` itself when streamed already); records where the member takes no encoded chunks (decoded once).
    A streaming member whose reduction is ``exact`` and declares its ``reads`` takes the block
    whole when the block serves the members' gathers (gathered once for the whole block: its
    pieces would only add calls and combines). The members that make per-row columns others read
    (``Reduction.provides``) run first; a partial that waits for what another member leaves in the
    block (:class:`~l5dask.core.engine.Later`) is finished after them all."""
    encoded = hasattr(data, "records")
    shared = encoded and hasattr(data, "expect") and sum(m.encoded for m in members) > 1
    if shared:
        for m in members:  # (what each will gather of the block, gathered once for all; what it leaves)
            if m.encoded and m.reduction.reads is not None:
                data.expect(*m.reduction.reads)
            if m.encoded and m.reduction.leaves and hasattr(data, "leave"):
                data.expect(leaves=m.reduction.leaves)
    out: list = [None] * len(members)
    pieces = None  # (made once: every streaming member takes the same pieces, and what they keep)
    for k in sorted(range(len(members)), key=lambda k: not members[k].reduction.provides):
        m = members[k]
        red = m.reduction
        if m.blocks or (shared and m.encoded and red.exact and red.reads is not None):
            # (an exact member whose gathers the block serves takes the block whole: the same bits
            # as its pieces combined, one call and no combine)
            p = red.chunk(data if m.encoded or not encoded else data.records(), start, parent)
        elif m.encoded and encoded:
            p = None
            if pieces is None:  # (a streamed piece that has none of its own, a view's chunk: itself)
                pieces = data.pieces() if hasattr(data, "pieces") else [(start, data)]
            for lo, piece in pieces:
                q = _now(red.chunk(piece, lo, parent))
                p = q if p is None else red.combine(p, q)
        else:
            records = data.records() if encoded else data
            p, i = None, _first_chunk(source, start)
            while i < source.nchunks and source.chunk_bounds(i)[0] < start + len(records):
                a, b = source.chunk_bounds(i)
                q = _now(red.chunk(records[a - start : b - start], a, parent))
                p = q if p is None else red.combine(p, q)
                i += 1
        out[k] = red.identity() if p is None else p
    return tuple(_now(p) for p in out)  # (in the members' order: what waited takes what the others left)


def _fused_combine(reductions: tuple[Reduction, ...], a: tuple, b: tuple) -> tuple:
    return tuple(r.combine(x, y) for r, x, y in zip(reductions, a, b))


def _fused_identity(reductions: tuple[Reduction, ...]) -> tuple:
    return tuple(r.identity() for r in reductions)


def fused_reduction(members: Sequence[Member], source: Any) -> Reduction:
    """One reduction of several over the same chunks: its partial is the tuple of theirs (each
    combined by its own ``combine``, in the same order), its ``finalize`` leaves it as it is (each
    member's result is ``members[i].reduction.finalize(partial[i])``)."""
    members = tuple(members)
    reds = tuple(m.reduction for m in members)
    return Reduction(
        "fused(" + ",".join(r.name for r in reds) + ")",
        functools.partial(fused_chunk, members, source),
        functools.partial(_fused_combine, reds),
        functools.partial(_fused_identity, reds),
        exact=all(r.exact for r in reds),
        cache_token=functools.partial(_fused_token, members),
    )


def _fused_token(members: tuple[Member, ...], parent: Any) -> tuple:
    """What a task of a fused pass computes (for the cache's keys): each member's token (given the
    task's parent rows when it depends on them) and how it takes its chunks."""
    out = []
    for m in members:
        red = m.reduction
        token = red.cache_token(parent) if callable(red.cache_token) else cachelib.reduction_token(red)
        if token is None:
            raise TypeError(f"{red.name}: no token")
        out.append((token, m.blocks, m.encoded))
    return ("fused", out)


def merged_rows(fns: tuple[Callable, ...], data: Any, start: int, parent: Any) -> Rows:
    """The rows every member of a fused pass keeps for its children, as one :class:`Rows` (a column
    two members keep under one name is one column: it must be the same)."""
    return merge_rows([fn(data, start, parent) for fn in fns])


def merge_rows(blocks: Sequence[Rows]) -> Rows:
    """Columns of the same parent rows kept by several passes, as one :class:`Rows`."""
    cols: dict[str, np.ndarray] = {}
    for rows in blocks:
        if rows.offset != blocks[0].offset or len(rows) != len(blocks[0]):
            raise ValueError("fused passes keep rows of different parent rows")
        for k, v in rows.cols.items():
            if k in cols:
                floats = cols[k].dtype.kind in "fc" and v.dtype.kind in "fc"  # (NaN where NaN: the same)
                if not np.array_equal(cols[k], v, equal_nan=floats):
                    raise ValueError(f"fused passes keep two different columns named {k!r}")
                continue
            cols[k] = v
    return Rows(blocks[0].offset, cols)


class InMemory:
    """A source this job has read whole (:meth:`~l5dask.core.engine.Job.read`), as a source again: its passes take the
    records held here instead of reading its chunks again (records, never encoded chunks)."""

    def __init__(self, source: Any, data: Any) -> None:
        self.source, self.data, self.name = source, data, source.name

    @property
    def nchunks(self) -> int:
        return self.source.nchunks

    def chunk_bounds(self, index: int) -> tuple[int, int]:
        return self.source.chunk_bounds(index)

    def iter_chunks(self, first: int, n: int) -> Iterator[tuple[int, Any]]:
        for i in range(first, first + n):
            a, b = self.source.chunk_bounds(i)
            yield a, self.data[a:b]

    def read(self, first: int, n: int) -> Any:
        if n == 0:
            return self.data[:0]
        return self.data[self.source.chunk_bounds(first)[0] : self.source.chunk_bounds(first + n - 1)[1]]

    def chunk_identities(self) -> list:
        """Its source's (the records held here are those chunks' rows): see :mod:`l5dask.core.cache`."""
        return self.source.chunk_identities()

    @property
    def store(self) -> Any:
        return getattr(self.source, "store", None)

    def __dask_tokenize__(self):
        return ("l5dask.InMemory", tokenize(self.source))


@dataclass
class Plan:
    """One analysis, declared for :meth:`~l5dask.core.engine.Job.run`: the passes whose results ``final`` takes
    (``final(*args, *results)``, one task where the partials are; without ``final``, the tuple
    of results). A pass's parent may be another declared pass (``Link(pass, start, interval)``):
    it is persisted first (its intervals checked), and listed in ``passes`` too when its own result
    is wanted. ``size_for``: the stored chunks of the pass that dominates the plan's work (as
    :class:`Job`'s): each pass is grouped into tasks as if the plan ran alone."""

    passes: Sequence[Pass]
    final: Callable | None = None
    args: tuple = ()
    name: str = "l5-result"
    size_for: int | None = None


@dataclass(eq=False)
class _Unit:
    """Passes fused into one: their source, the parent link they share, their groups."""

    passes: list[Pass]
    source: Any
    link: Any  # ("rows", start, Rows) | ("pass", interval, unit index) | None
    groups: list[tuple[int, int]] | None
    parent: bool = False  # some member keeps rows for children: persisted first

    def spec(self, own: dict[int, list[tuple[int, int]]], link: Link | None) -> Pass:
        """The one pass of these passes."""
        groups = self.groups if self.groups is not None else own[id(self.passes[0])]
        if len(self.passes) == 1:
            return _replace(self.passes[0], source=self.source, parent=link, groups=groups)
        reds = [p for p in self.passes if p.reduction is not None]
        rows = [p.rows for p in self.passes if p.rows is not None]
        intervals: dict[str, int] = {}
        for p in self.passes:
            for f, n in p.intervals.items():
                if intervals.setdefault(f, n) != n:
                    raise ValueError(f"fused passes check {f!r} against {intervals[f]} and {n} rows")
        encoded = any(p.encoded for p in reds) and not rows and not intervals and hasattr(self.source, "read_encoded")
        members = [Member(p.reduction, p.blocks, p.encoded) for p in reds]  # type: ignore[arg-type]
        # members that all stream encoded pieces: the pass streams them too (each piece read, gathered
        # once for all of them and reduced by each in turn), not a block held whole
        stream = encoded and all(m.encoded and not m.blocks for m in members)
        return Pass(
            self.source,
            fused_reduction(members, windowed(self.source, 0, 0)) if members else None,  # (its chunking only)
            parent=link,
            rows=(rows[0] if len(rows) == 1 else functools.partial(merged_rows, tuple(rows))) if rows else None,
            intervals=intervals,
            blocks=not stream,
            encoded=encoded,
            priority=max(p.priority for p in self.passes),
            name="+".join(dict.fromkeys(p.label for p in self.passes)),
            groups=groups,
        )

    def member(self, p: Pass) -> int | None:
        """``p``'s place in the fused partial (``None``: the unit is ``p`` alone)."""
        if len(self.passes) == 1:
            return None
        return [q for q in self.passes if q.reduction is not None].index(p)


def _replace(spec: Pass, **kw: Any) -> Pass:
    import dataclasses

    return dataclasses.replace(spec, **kw)


def _fuse(passes: Sequence[Pass], own: dict[int, list], links: dict[int, Any], parents: set[int]) -> list[_Unit]:
    """Passes over one source with one parent link, as few units as can run as one pass and give
    each member's result bit for bit: the members whose reductions are not ``exact`` keep their
    own groups of chunks (two that differ are two units); a pass without parent joins any."""
    units: list[_Unit] = []
    for p in passes:
        token = tokenize(p.source)
        link = links.get(id(p))
        strict = p.reduction is not None and not p.reduction.exact
        for u in units:
            if tokenize(u.source) != token:
                continue
            if link is not None and u.link is not None:
                if link[0] != u.link[0] or link[1] != u.link[1]:
                    continue
                if link[0] == "pass" and link[2] != u.link[2]:
                    continue
            if strict and u.groups is not None and u.groups != own[id(p)]:
                continue
            break
        else:
            u = _Unit([], p.source, None, None)
            units.append(u)
        u.passes.append(p)
        if strict:
            u.groups = own[id(p)]
        if link is not None:
            if u.link is None:
                u.link = link
            elif link[0] == "rows":
                u.link = ("rows", link[1], merge_rows([u.link[2], link[2]]))
        if id(p) in parents:
            u.parent = True
    for u in units:
        if u.groups is None:
            # none keeps its own groups: a parent's (spread for its children), else the first's
            first = next((p for p in u.passes if id(p) in parents), u.passes[0])
            u.groups = own[id(first)]
    return units


# --- the job -------------------------------------------------------------------------------
class Job:
    """Where and how passes run: the embedded default (local threads) or a cluster.

    Parameters
    ----------
    scheduler : optional
        Where to run, the package's one convention (as ``dask.compute``'s ``scheduler=``): a
        ``distributed.Client`` or its address (``"tcp://host:8786"``), ``"threads"``, ``"sync"``,
        ``"processes"``...; by default the active dask.distributed client if there is one, else
        local threads (see :func:`~l5dask.core.policy.resolve_scheduler`). ``client=`` is its old
        name (one release, with a ``FutureWarning``).
    chunks_per_task : int, optional
        Stored chunks per task of every pass (default: sized for the scheduler, per pass).
    size_for : int, optional
        The stored chunks of the pass that dominates the work: every pass is then sized for it
        (as a tree reduction is sized for its largest input).
    progress : bool
        A progress bar on stderr.
    cache : str, path or l5dask.core.cache.Cache, optional
        Keep each task's partial in this cache of partials, and take from it those already kept
        (:mod:`l5dask.core.cache`); default: dask config ``l5dask.cache`` (none).
    """

    @where_keywords
    def __init__(
        self,
        scheduler: Any = None,
        chunks_per_task: int | None = None,
        progress: bool = False,
        size_for: int | None = None,
        cache: Any = None,
    ) -> None:
        if isinstance(scheduler, Job):  # (where another job runs, sized and shown as this one asks)
            self.client, scheduler = scheduler.client, scheduler.kw.get("scheduler")
        else:
            self.client, scheduler = resolve_scheduler(scheduler)
        if self.client is None and scheduler is None and dask.config.get("scheduler", None) is None:
            # the embedded default: local threads, named by the function itself, since dask imports
            # distributed (0.2 s) to look for a client whenever the scheduler is left to it
            from dask.threaded import get as threaded_get

            scheduler = threaded_get
        self.kw = {"scheduler": scheduler} if scheduler is not None else {}
        self.scheduler_kind = "distributed" if self.client is not None else "threads"
        self.threads = worker_threads(self.client)
        self.chunks_per_task = chunks_per_task or config.get("chunks-per-task")
        # (else every pass sized for the one that dominates the work: small passes get few tasks)
        self.size_for = size_for
        self.progress = progress
        self._read: dict[str, Any] = {}  # (sources read whole by this job: each once)
        self.cache = cachelib.open_cache(cache)
        self._ids: dict[int, tuple[Any, list | None]] = {}  # source -> its chunks' identities
        self._id_reprs: dict[int, tuple[list, list[str]]] = {}  # identities -> their reprs
        self._present: dict[str, dict[str, str]] = {}  # cache folder -> its entries' names by key
        self._aliases: dict[str, set[tuple[int, int]]] = {}  # cache folder -> the chunks of its aliases
        self._keys: dict[tuple, tuple[Pass, list[str] | None, list[str]]] = {}  # a pass's groups -> their keys
        self._events_since = time.time()

    @classmethod
    def of(cls, scheduler: Any = None, chunks_per_task: int | None = None, progress: bool = False) -> Job:
        """The job of a public function's ``scheduler=``: a :class:`Job` handed on by the package's
        own callers as it is (its sizing and progress with it), else ``Job(scheduler,
        chunks_per_task, progress)``."""
        if isinstance(scheduler, Job):
            return scheduler
        return cls(scheduler, chunks_per_task=chunks_per_task, progress=progress)

    def per_task(self, spec: Pass) -> int:
        """Stored chunks per task of ``spec`` (before a parent's spread and the guided end): sized
        for the next power of two of its chunks, so that the size does not change as a dataset
        grows (the tasks of a cached pass are then the same over the chunks that were there)."""
        if self.chunks_per_task:
            return int(self.chunks_per_task)
        kind = self.scheduler_kind
        if kind == "threads" and (spec.encoded or not spec.blocks) and not getattr(spec.source, "remote", False):
            kind = "threads-streaming"
        return auto_chunks_per_task(_pow2(self.size_for or spec.source.nchunks), self.threads, kind)

    def groups(self, spec: Pass, guided: bool = True) -> list[tuple[int, int]]:
        """The tasks of a pass: groups of whole chunks, sized for the scheduler (and for the job's
        dominant pass when it has one); ``guided``: smaller as the end nears (a persisted pass is
        followed by more work, so its last tasks idle no thread: it needs no guided end).

        A pass whose chunks can be identified (the ones a cache keeps) runs in groups aligned to
        multiples of one size (no guided end), cached or not: stable as the dataset grows (the
        tasks over the chunks that were there before are the same, and found in the cache), and
        the same with and without a cache, so that a result's floating-point sums are grouped
        alike and its bits are the same (issue 48: every cached result bit for bit the uncached
        one)."""
        if spec.groups is not None:
            return list(spec.groups)
        n = spec.source.nchunks
        per_task = self.per_task(spec)
        if spec.rows is not None:
            # a parent's rows place its child tasks: spread them over the workers
            per_task = min(
                per_task,
                auto_chunks_per_task(
                    _pow2(n), self.threads, self.scheduler_kind, tasks_per_thread=PARENT_TASKS_PER_THREAD
                ),
            )
        aligned = hasattr(spec.source, "chunk_identities")
        if spec.rows is not None or not guided or aligned:
            return [(f, min(per_task, n - f)) for f in range(0, n, per_task)]
        return task_groups(n, per_task, self.threads)

    # -- the cache ---------------------------------------------------------------------------
    def _chunk_ids(self, source: Any) -> list[str] | None:
        """The identity of each of ``source``'s chunks (a digest of its ``chunk_identities()``,
        asked once a job); ``None`` when it has none."""
        got = self._ids.get(id(source))
        if got is None:
            ids = source.chunk_identities() if hasattr(source, "chunk_identities") else None
            try:  # (strings are taken as they are: an L5Kit array's, one a chunk, made to be cheap)
                digests = None if ids is None else [i if isinstance(i, str) else cachelib.digest(i) for i in ids]
            except TypeError:
                digests = None
            got = self._ids[id(source)] = (source, digests)
        return got[1]

    def group_ids(
        self, spec: Pass, groups: Sequence[tuple[int, int]], keep: str = "all", prefixes: list[str] | None = None
    ) -> list[str] | None:
        """The identity of what each task of ``spec`` computes (``keep`` as :meth:`leaves`): the
        cache's key (:mod:`l5dask.core.cache`); ``None`` when the pass cannot be cached.
        ``prefixes``: filled with each key's parts before its parent's (``ByRows``). Made once
        a job for a pass's groups (a rerun asks for them for its tasks, then for its pass whole)."""
        if self.cache is None:
            return None
        memo = (id(spec), keep, tuple(groups))
        got = self._keys.get(memo)
        if got is None or got[0] is not spec:
            made: list[str] = []
            got = self._keys[memo] = (spec, self._group_ids(spec, groups, keep, made), made)
        if prefixes is not None and got[1] is not None:
            prefixes += got[2]
        return got[1]

    def _group_ids(
        self, spec: Pass, groups: Sequence[tuple[int, int]], keep: str, prefixes: list[str]
    ) -> list[str] | None:
        source, link = spec.source, spec.parent
        ids = self._chunk_ids(source)
        if ids is None or (link is not None and isinstance(link.parent, Held)):
            return None
        red = spec.reduction if keep != "rows" else None
        per_group = red is not None and callable(red.cache_token)  # (a token of the parent rows given)
        token = cachelib.reduction_token(red) if red is not None and not per_group else None
        if red is not None and not per_group and token is None:
            return None
        rows = None
        if keep == "rows" or (keep == "all" and spec.rows is not None):
            rows = cachelib.function_token(spec.rows)
            if rows is None:
                return None
        what = (
            cachelib.FORMAT,
            cachelib.version(),
            "bounds and parent rows a chunk",  # (keys before it: a blocks pass's bounds a block)
            "a task's parent rows those overlapping its own",  # (keys before it: whole parent blocks)
            keep,
            token,
            rows,
            sorted(spec.intervals) if keep != "rows" else [],  # (their children's lengths: _still_valid)
            spec.blocks,
            spec.encoded,
            link.start if link is not None else None,
        )
        # each key is cachelib.digest(what, own, ids[first : first + n], parent), its repr made of
        # the reprs of the chunks' and parent chunks' identities made once (not once a group and
        # piece: 60% of a rerun's keys after growth)
        try:
            head = f"({what!r}, "
        except Exception:  # noqa: BLE001 - a token that cannot be made: not cached
            return None
        reprs = self._reprs(ids)
        held = link is not None and isinstance(link.parent, Persisted) and link.parent.row_ids is not None
        parent_reprs = self._reprs(link.parent.row_ids) if held else None  # type: ignore[union-attr]
        out = []
        for first, n in groups:
            lo, hi = source.chunk_bounds(first)[0], source.chunk_bounds(first + n - 1)[1]
            parent: Any = None
            got = None
            if link is not None and isinstance(link.parent, Rows):
                got = link.parent.overlapping(lo, hi, link.start)
                parent = repr(cachelib.rows_digest(got.offset, got.cols))
            elif link is not None:
                chunks = link.parent.chunks(link.interval or "", lo, hi)
                if chunks is None or parent_reprs is None:
                    return None
                parent = f"[{', '.join([parent_reprs[k] for k in chunks.tolist()])}]"
            try:
                own = red.cache_token(got) if per_group and red is not None else None
                prefix = f"{head}{own!r}, [{', '.join(reprs[first : first + n])}], "
                out.append(cachelib.digest_repr(f"{prefix}{parent})"))
            except Exception:  # noqa: BLE001 - a token that cannot be made: not cached
                return None
            prefixes.append(prefix)
        return out

    def by_rows(self, spec: Pass) -> bool:
        """Whether the tasks of ``spec`` are also found by their parent rows (``ByRows``): those
        given a persisted parent's rows, whose keys name the parent's stored chunks (a chunk that
        grew, its earlier rows maybe rewritten, changes them), while a task computes with the rows
        that overlap its own alone (``task_parent``). Rows handed in memory are in the key
        already (a hash of them)."""
        link = spec.parent
        return link is not None and isinstance(link.parent, Persisted) and link.parent.row_ids is not None

    def _aliased(self, folder: str) -> set[tuple[int, int]]:
        """The runs of chunks ``(first, n)`` that have an alias in ``folder`` (from its listing)."""
        got = self._aliases.get(folder)
        if got is None:
            got = self._aliases[folder] = cachelib.alias_ranges(self._present[folder])
        return got

    def _reprs(self, ids: list[str]) -> list[str]:
        """The ``repr`` of each identity in ``ids`` (a source's chunks' or a persisted pass's rows'),
        made once a job."""
        got = self._id_reprs.get(id(ids))
        if got is None or got[0] is not ids:
            got = self._id_reprs[id(ids)] = (ids, [repr(i) for i in ids])
        return got[1]

    def _folder(self, spec: Pass) -> str:
        assert self.cache is not None
        source = spec.source
        store = getattr(source, "store", None)
        dataset = store.location if isinstance(store, Store) else ""
        name = f"{dataset.rstrip('/').rsplit('/', 1)[-1]}-{source.name}"
        folder = self.cache.folder_of(f"{cachelib.slug(name, 40)}-{cachelib.digest(dataset, source.name)[:12]}")
        if folder not in self._present:
            self._present[folder] = {cachelib.key_of(f): f for f in self.cache.present(folder)}
            self.cache.describe(folder, {"dataset": dataset, "source": source.name})
        return folder

    def _cached_tasks(self, spec: Pass, groups: list, keep: str, name: str, graph: dict, skip: int = 0) -> None:
        """Each task of ``spec`` in ``graph`` made a cached one: its block loaded from the cache when
        it is there (no read of its chunks, nor of its parent rows), else computed and kept. The
        first ``skip`` are not in ``graph`` (found in a prefix: counted as hits)."""
        if (
            keep == "rows"
            or (keep == "all" and spec.rows is not None)
            or (spec.reduction is None and not spec.intervals)
        ):
            return  # (rows are not kept: they would grow with the dataset)
        by_rows = self.by_rows(spec)
        prefixes: list[str] | None = [] if by_rows else None
        ids = self.group_ids(spec, groups, keep, prefixes)
        if ids is None:
            return
        folder = self._folder(spec)
        cache = self.cache
        assert cache is not None
        present = self._present[folder]
        aliased = self._aliased(folder) if by_rows else set()
        red_name = spec.reduction.name if spec.reduction is not None else "intervals"
        link = spec.parent
        hits = skip
        fresh = not self._may_hold_pieces(spec, keep, groups, ids, present, red_name)
        for i, ((first, n), ident) in enumerate(zip(groups, ids)):
            if i < skip:
                continue
            by = ByRows(prefixes[i], (first, n) in aliased) if prefixes is not None else None
            key = (name, i)
            args = graph[key].args  # (stage, first, n, link_rows, *refs) of run_group
            entry = cachelib.Entry(
                cache,
                posixpath.join(folder, present.get(ident) or cache.entry_name(red_name, ident)),
                {"source": spec.source.name, "reduction": red_name, "chunks": [first, n]},
            )
            pieces = (
                self._pieces(spec, first, n, keep, present, folder, red_name, fresh) if ident not in present else None
            )
            if pieces is not None:  # (an exact reduction: parts of it found, or the end kept in parts)
                hits += all(hit for _, hit, _, _, _ in pieces)
                # (a pass's last task shorter than the others is kept in its pieces alone: its whole entry
                # and alias would never be read again. A rerun over the same data reads the pass's entry,
                # and a grown one its pieces, as the task grows with the dataset's last chunks)
                last = i == len(groups) - 1 and n < groups[0][1]
                graph[key] = Task(key, run_pieces, None if last else entry, by, pieces, *args)
            elif ident in present:
                hits += 1
                remake: list[tuple] = []
                refs: tuple = ()
                if link is not None and isinstance(link.parent, Persisted):
                    lo, hi = spec.source.chunk_bounds(first)[0], spec.source.chunk_bounds(first + n - 1)[1]
                    if link.parent.remake is not None and link.parent.remake_calls is not None:
                        calls, interval = link.parent.remake_calls, link.interval or ""
                        remake = [calls[k] for k in link.parent.overlapping(interval, lo, hi)]
                    else:
                        refs = tuple(args[4:])
                graph[key] = Task(key, load_group, entry, remake, args[0], first, n, args[3], *refs)
            else:
                graph[key] = Task(key, run_group_cached, entry, by, *args)
        cachelib.count(hits=hits, misses=len(groups) - hits)

    def _may_hold_pieces(
        self, spec: Pass, keep: str, groups: list, ids: list[str], present: dict, red_name: str
    ) -> bool:
        """Whether a cache folder (``present``: its entries' names by key) may hold a piece of a task
        of this pass not found whole, other than the aligned nodes a first run keeps a task in: an
        entry of its reduction that is none of its tasks or their nodes (a piece, a task of the
        dataset before it grew), or an alias but those of tasks found whole. A run killed part
        way and started again finds only these: then, as in a first run, no node inside a task is
        keyed (1.03 G agents killed at 20 CPU-s: 51,257 keys of the 814 tasks it computed)."""
        assert self.cache is not None
        head = self.cache.entry_name(red_name, "")[: -len(cachelib.SUFFIX)]  # ("<reduction>.")
        found = {g for g, ident in zip(groups, ids) if ident in present}
        # (the nodes of the tasks that are not one node: the last one of a pass, mostly; a first run
        # keeps such a task in its nodes, then whole)
        nodes = [node for f, n in groups for node in _aligned_nodes(f, n) if node != (f, n)]
        node_ids = self.group_ids(spec, nodes, keep) if nodes else []
        if node_ids is None:
            return True
        tasks = set(ids) | set(node_ids)
        for key, name in present.items():
            if key in tasks or not name.startswith(head):
                continue
            aliased = cachelib.alias_ranges([key])
            if not aliased or not aliased <= found:
                return True
        return False

    def _pieces(
        self,
        spec: Pass,
        first: int,
        n: int,
        keep: str,
        present: dict,
        folder: str,
        red_name: str,
        fresh: bool = False,
    ) -> list[tuple[cachelib.Entry, bool, int, int, ByRows | None]] | None:
        """A task of an exact reduction (its partial the same bits however its chunks are grouped)
        not in the cache, as aligned pieces of it (runs of ``2**k`` chunks starting at a multiple
        of ``2**k``): those in the cache read (by their keys, or by their parent rows when an alias
        of their chunks is there: ``ByRows``), the others computed and kept, so that the last
        task of a dataset, kept in pieces, is mostly read again when the dataset grows and fills it.
        ``None``: one piece (the task computed and kept whole). ``fresh``: the folder holds no
        piece of it (:meth:`_may_hold_pieces`)."""
        red = spec.reduction
        if red is None or not red.exact or n < 2 or self.cache is None:
            return None
        nodes = _aligned_nodes(first, n)
        prefixes: list[str] | None = [] if self.by_rows(spec) else None
        if not present or fresh:
            # (a folder with no entry, as a first run's and a killed run's first process find it, or
            # with this pass's whole tasks only, as a killed run's restart: no piece is there, and
            # the task is kept in its nodes; the nodes inside them are not keyed)
            if len(nodes) == 1:
                return None
            ids = self.group_ids(spec, nodes, keep, prefixes)
            if ids is None:
                return None
            known = dict(zip(nodes, ids))
            by = dict(zip(nodes, prefixes)) if prefixes is not None else {}
            out = [(f, m, known[(f, m)] in present, False) for f, m in nodes]  # (a killed run's nodes found)
        else:
            got = self._cover(first, n, nodes, spec, keep, present, folder, prefixes)
            if got is None:
                return None
            out, known, by = got
        if len(out) == 1:
            return None
        assert self.cache is not None
        return [
            (
                cachelib.Entry(
                    self.cache,
                    posixpath.join(
                        folder, present.get(known[(f, m)]) or self.cache.entry_name(red_name, known[(f, m)])
                    ),
                    {"source": spec.source.name, "reduction": red_name, "chunks": [f, m]},
                ),
                hit,
                f,
                m,
                ByRows(by[(f, m)], look) if (f, m) in by else None,
            )
            for f, m, hit, look in out
        ]

    def _cover(
        self,
        first: int,
        n: int,
        nodes: list[tuple[int, int]],
        spec: Pass,
        keep: str,
        present: dict,
        folder: str,
        prefixes: list[str] | None,
    ) -> tuple[list[tuple[int, int, bool, bool]], dict[tuple[int, int], str], dict[tuple[int, int], str]] | None:
        """The pieces of a task (``(first, n, found, worth a look by its parent rows)``: see
        :meth:`_pieces`) over the aligned ``nodes`` of its chunks, the key of each node inside it and
        (``prefixes``: a pass found by its parent rows) each one's ``ByRows`` prefix; ``None``
        when not cached."""
        # every aligned node inside the task, keyed in one call (a call a node was 40 us of overhead
        # each, 245 calls a rerun after growth)
        inside = [
            (f, size)
            for size in (1 << k for k in range(max(m for _, m in nodes).bit_length()))
            for f in range(-(-first // size) * size, first + n - size + 1, size)
        ]
        ids = self.group_ids(spec, inside, keep, prefixes)
        if ids is None:
            return None
        known = dict(zip(inside, ids))
        by = dict(zip(inside, prefixes)) if prefixes is not None else {}
        aliased = self._aliased(folder) if prefixes is not None else set()

        def cover(f: int, m: int) -> list[tuple[int, int, bool, bool]]:
            if known[(f, m)] in present:
                return [(f, m, True, False)]
            if (f, m) in aliased or m == 1:
                return [(f, m, False, (f, m) in aliased)]
            half = m // 2
            inner = cover(f, half) + cover(f + half, m - half)
            return inner if any(hit or look for _, _, hit, look in inner) else [(f, m, False, False)]

        out = [piece for f, m in nodes for piece in (cover(f, m) if m & (m - 1) == 0 else [(f, m, False, False)])]
        return out, known, by

    def token(self, spec: Pass) -> str:
        return tokenize(
            spec.source,
            spec.reduction,
            spec.label,
            self.per_task(spec),
            self.threads,
            self.scheduler_kind,
            sorted(spec.intervals.items()),
            spec.rows,
            str(spec.parent.parent.key) if spec.parent is not None and isinstance(spec.parent.parent, Held) else None,
            None if spec.groups is None else tuple(spec.groups),
        )

    def leaves(
        self, spec: Pass, name: str, guided: bool = True, keep: str = "all", skip: int = 0
    ) -> tuple[dict, list, list[tuple[int, int]]]:
        """The tasks of a pass (a dict), the collections they depend on, and their groups.
        ``keep``: what its tasks do, ``"all"``, ``"no rows"`` (its reduction and checks),
        ``"rows"`` (its rows alone) or ``"held rows"`` (all, kept in the cache as ``"no rows"``:
        a task read from the cache has no rows, one computed has them). ``skip``: the first tasks
        left out (their partials combined already: a prefix read from the cache, ``Job._prefix``)."""
        groups = self.groups(spec, guided)
        stage = spec.stage()
        if keep == "no rows":
            stage = stage._replace(rows=None)
        elif keep == "rows":
            stage = stage._replace(reduction=None, intervals={})
        graph, deps = {}, []
        link = spec.parent
        persisted = link is not None and isinstance(link.parent, Persisted | Held)
        if link is not None and isinstance(link.parent, Persisted):
            if link.parent.remake is None or any(t is None for t in link.parent.remake):
                deps = link.parent.collections
        if link is not None and isinstance(link.parent, Held):
            graph.update(link.parent.graph)
        windows = hasattr(spec.source, "window")
        for i, (first, n) in enumerate(groups):
            if i < skip:
                continue
            lo = spec.source.chunk_bounds(first)[0]
            hi = spec.source.chunk_bounds(first + n - 1)[1]
            key = (name, i)
            if windows:  # (each task carries the part of the source's tables its chunks use)
                stage = stage._replace(source=windowed(spec.source, first, n))
            if link is None:
                graph[key] = Task(key, run_group, stage, first, n, None)
            elif persisted:
                # only the parent blocks whose child ranges overlap these rows
                graph.update(link.parent.tasks(link.interval, lo, hi))
                graph[key] = Task(key, run_group, stage, first, n, None, *link.parent.refs(link.interval, lo, hi))
            else:
                graph[key] = Task(key, run_group, stage, first, n, link.parent.overlapping(lo, hi, link.start))
        if self.cache is not None:
            self._cached_tasks(spec, groups, "no rows" if keep == "held rows" else keep, name, graph, skip)
            needed = set().union(*(t.dependencies for t in graph.values())) | {k for k in graph if k[0] == name}
            graph = {k: t for k, t in graph.items() if k in needed}  # (the parent rows only hits' tasks needed)
        return graph, deps, groups

    # -- running ---------------------------------------------------------------------------
    def read(self, source: Any) -> Any:
        """A whole (small) source, read now by this process: what it returns is wanted here (the
        scenes a report keeps a row of each), and its stored bytes are fewer to move than its
        records. On a cluster a task on a worker read it before, a round trip through the scheduler
        to a worker still warming up: 0.08-0.21 s of the report through the 50 ms endpoint on 2
        worker processes, against 0.05-0.06 s here. Once a job: the plans of one run share it.
        With a cache, the records are kept there too (read again only when a chunk changed)."""
        key = tokenize(source)
        if key not in self._read:
            self._read[key] = self._read_whole(source)
        return self._read[key]

    def _read_whole(self, source: Any) -> Any:
        if self.cache is None or not hasattr(source, "chunk_identities"):
            return source.read(0, source.nchunks)
        ids = self._chunk_ids(source)
        if ids is None:
            return source.read(0, source.nchunks)
        ident = cachelib.digest(cachelib.FORMAT, cachelib.version(), "read", ids)
        folder = self._folder(Pass(source))
        present = self._present[folder]
        entry = cachelib.Entry(
            self.cache,
            posixpath.join(folder, present.get(ident) or self.cache.entry_name("read", ident)),
            {"source": source.name, "reduction": "read", "chunks": [0, source.nchunks]},
        )
        if ident in present:
            ok, got = cachelib.load(entry)
            if ok and isinstance(got, np.ndarray):
                cachelib.count(hits=1)
                return got
        cachelib.count(misses=1)
        got = source.read(0, source.nchunks)
        cachelib.store(entry, got)
        return got

    def hold(self, spec: Pass) -> Held:
        """``spec`` (a pass that keeps ``rows``) declared into a graph for lazy collections, not run:
        nothing is computed until a child task is (see :class:`Held`)."""
        name = f"l5-{spec.label}-held-{self.token(spec)}"
        graph, _, _ = self.leaves(spec, f"{name}-block", guided=False)
        blocks = [k for k in graph if isinstance(k, tuple) and k[0] == f"{name}-block"]
        key = (name,)  # a tuple, as every other key of the graph (collections sort their keys)
        graph[key] = Task(key, hold_blocks, spec.source.name, dict(spec.intervals), *[TaskRef(k) for k in blocks])
        return Held(key, graph)

    def persist(self, *specs: Pass, check: bool = True, problems: list | None = None) -> list[Persisted]:
        """Run these passes' tasks together and keep their blocks; then fetch the interval bounds
        of the passes that declare ``intervals`` and (``check``) raise on the first problem row.

        A pass's ``rows`` are not held (they would grow with the dataset: 32 bytes a frame, 1.1 GB
        for train_full's frames): the blocks keep their partials and bounds, and each child task
        depends on tasks that read the parent blocks it overlaps again and make their rows, in the
        child's own graph, so that each is released once its last child task has run; on local
        threads a block keeps its rows within its share of ``HELD_ROWS_BYTES`` (with a cache, a
        block computed does; one read from the cache has none). (A pass whose own parent is
        persisted or held keeps its rows.)
        """
        built, remakes = [], []
        collections: list = []
        for spec in specs:
            name = f"l5-{spec.label}-pass-{self.token(spec)}"
            remake, keep, calls = self._remakes(spec, name)
            hold = remake is not None and self.client is None
            if hold:  # (with a cache, the blocks computed hold their rows; those read from it, none)
                keep = "all" if self.cache is None else "held rows"
            graph, deps, groups = self.leaves(spec, name, guided=False, keep=keep)
            if hold:  # (each block keeps its rows within its share of HELD_ROWS_BYTES: see _held_rows)
                share = HELD_ROWS_BYTES // max(1, len(groups))
                graph = {
                    k: Task(k, rows_within, share, t.func, *t.args) if k[0] == name else t for k, t in graph.items()
                }
            row_ids = self._row_ids(spec)
            remakes.append((remake, row_ids, calls))
            with dask.annotate(priority=spec.priority):
                hlg = HighLevelGraph.from_collections(name, graph, dependencies=deps)
            built.append((spec, [Delayed(k, hlg, layer=name) for k in graph], groups))
            collections += built[-1][1]
        remote = any(getattr(spec.source, "remote", False) for spec in specs)
        done = persist(
            collections,
            client=self.client,
            progress=self.progress,
            threads=remote_threads(remote),
            label=passes_label(spec.label for spec in specs),
            **self.kw,
        )
        out: list[Persisted] = []
        i = 0
        for spec, parts, groups in built:
            held = done[i : i + len(parts)]
            i += len(parts)
            remake, row_ids, calls = remakes[len(out)]
            if remake is not None and self.client is None:
                remake = _held_rows(held, remake)
            out.append(
                Persisted(spec, [p.key for p in held], held, groups, remake=remake, row_ids=row_ids, remake_calls=calls)
            )
        found = self._bounds(out)
        if problems is not None:
            problems += found
        if check:
            raise_first(found)
        return out

    def _row_ids(self, spec: Pass) -> list[str] | None:
        """The identity of the rows of each stored chunk of a pass that keeps rows (its chunk, and
        its parent rows): a pass's ``rows`` makes each row from its own record and parent rows."""
        if spec.rows is None:
            return None
        return self.group_ids(spec, [(c, 1) for c in range(spec.source.nchunks)], "rows")

    def _remakes(self, spec: Pass, name: str) -> tuple[list[Task | None] | None, str, list[tuple] | None]:
        """How a persisted pass keeps its rows: ``(remake tasks, what its tasks keep, their
        arguments)``; its rows are made again by the tasks that need them when its parent is none
        or rows in memory (the reduction and the checks run in the pass, in the same groups)."""
        if _remade(spec):
            again, _, _ = self.leaves(spec, f"{name}-rows", guided=False, keep="rows")
            remake: list[Task | None] = list(again.values())
            return remake, "no rows", [tuple(t.args) for t in again.values()]  # (plain arguments: no reference)
        return None, "all", None

    def pass_entry(self, spec: Pass, groups: list[tuple[int, int]], keep: str) -> tuple[cachelib.Entry, bool] | None:
        """Where the cache keeps ``spec`` whole (its combined partial, and for a persisted pass its
        interval bounds), and whether it is there: an entry keyed by every task's key (so by every
        chunk's identity), read in one go by a rerun instead of an entry a task; ``None`` when the
        pass cannot be cached."""
        if self.cache is None or (keep == "all" and spec.rows is not None):
            return None
        if spec.reduction is None and not spec.intervals:
            return None
        ids = self.group_ids(spec, groups, keep)
        if ids is None:
            return None
        key = cachelib.digest("pass", keep, ids)
        folder = self._folder(spec)
        present = self._present[folder]
        red = spec.reduction.name if spec.reduction is not None else "intervals"
        entry = cachelib.Entry(
            self.cache,
            posixpath.join(folder, present.get(key) or self.cache.entry_name(f"pass-{red}", key)),
            {"source": spec.source.name, "reduction": red, "chunks": [0, spec.source.nchunks], "tasks": len(groups)},
        )
        return entry, key in present

    def _prefix(self, spec: Pass, groups: list[tuple[int, int]]) -> Prefix | None:
        """The combined partial of a pass's first tasks, kept whole so that a rerun after the
        dataset grew reads one entry for them instead of an entry a task (and combines none of
        them): the longest such prefix the cache holds (``found`` tasks, their ``partial``), and
        where to keep this run's (``keep``, its first ``cut`` tasks; ``None`` when it is there
        already). ``None`` for a pass that keeps none: one whose reduction is not ``exact`` (a
        prefix combined apart, then with the rest, is the same bits only for an exact one), that
        checks intervals (a prefix keeps no bounds) or has fewer than three tasks.

        The prefix kept is every task but the last (a dataset's last task takes the chunks appended
        next), and, for a pass whose keys name its parent's stored chunks (``by_rows``), none
        from the first task over the parent's last chunk (it grows too). Its key is a chain of the
        tasks' keys (``digest(previous, key)``, the first ``digest("prefix")``): one digest a task
        finds every prefix a folder may hold."""
        red = spec.reduction
        if self.cache is None or red is None or not red.exact or spec.intervals or len(groups) < 3:
            return None
        ids = self.group_ids(spec, groups, "all")
        if ids is None:
            return None
        chain = [cachelib.digest("prefix")]
        for ident in ids:
            chain.append(cachelib.digest_repr(f"{chain[-1]}{ident}"))
        folder = self._folder(spec)
        present = self._present[folder]
        about = {"source": spec.source.name, "reduction": red.name}
        name = f"prefix-{red.name}"
        found, partial = 0, None
        for j in range(len(groups) - 1, 1, -1):
            if chain[j] in present:
                entry = cachelib.Entry(self.cache, posixpath.join(folder, present[chain[j]]), about)
                ok, got = cachelib.load(entry)
                if ok and isinstance(got, tuple) and len(got) == 2 and got[0] == "prefix":
                    found, partial = j, got[1]
                break
        cut = len(groups) - 1
        link = spec.parent
        if self.by_rows(spec) and link is not None and isinstance(link.parent, Persisted):
            last = len(link.parent.row_ids or ()) - 1
            for i in range(cut - 1, -1, -1):
                first, n = groups[i]
                lo, hi = spec.source.chunk_bounds(first)[0], spec.source.chunk_bounds(first + n - 1)[1]
                chunks = link.parent.chunks(link.interval or "", lo, hi)
                if chunks is None:
                    return None
                if not len(chunks) or int(chunks[-1]) < last:
                    break
                cut = i
        keep = None
        if cut >= 2 and cut > found:
            path = posixpath.join(folder, self.cache.entry_name(name, chain[cut]))
            keep = cachelib.Entry(self.cache, path, {**about, "chunks": [0, groups[cut][0]], "tasks": cut})
        return Prefix(found, partial, keep, cut)

    def _prefix_tree(self, graph: dict, name: str, leaves: list, red: Reduction, head: Prefix) -> Any:
        """The ordered tree of a pass's task ``leaves`` (those after ``head.found``), with the
        prefix the cache held first, and the prefix to keep (``head.keep``) combined apart and
        kept; its root key."""
        if head.found:
            key = (f"{name}-found",)
            graph[key] = DataNode(key, head.partial)
            leaves = [key, *leaves]
        if head.keep is None:
            return tree_reduce(graph, name, leaves, red)
        cut = head.cut - head.found + (1 if head.found else 0)  # (the prefix's leaves)
        left = tree_reduce(graph, f"{name}-prefix", leaves[:cut], red)
        right = tree_reduce(graph, f"{name}-rest", leaves[cut:], red)
        kept = (f"{name}-keep-prefix",)
        graph[kept] = Task(kept, keep_prefix, head.keep, TaskRef(left))
        root = (f"{name}-root",)
        graph[root] = Task(root, combine_many, red, TaskRef(kept), TaskRef(right))
        return root

    def _load_pass(self, spec: Pass, groups: list[tuple[int, int]], keep: str) -> tuple[bool, Any]:
        """``(True, (partial, bounds))`` of ``spec`` whole from the cache (its tasks counted as
        hits); ``(False, None)`` when it is not there, or not sound now (then its tasks run)."""
        found = self.pass_entry(spec, groups, keep)
        if found is None or not found[1]:
            return False, None
        ok, got = cachelib.load(found[0])
        if not ok or not _sound_pass(got, dict(spec.intervals)):
            return False, None
        cachelib.count(hits=len(groups))
        return True, (got[1], got[2])

    def _load_persisted(self, spec: Pass) -> tuple[Persisted, Any] | None:
        """A pass to persist, from the cache whole: its :class:`Persisted` (no block held: its
        bounds, and tasks that make its rows again for the child tasks that run) and its combined
        partial, its interval problems raised as :meth:`persist` raises them; ``None`` if not there."""
        if not _remade(spec):
            return None
        groups = self.groups(spec, guided=False)
        ok, got = self._load_pass(spec, groups, "no rows")
        if not ok:
            return None
        remake, _, calls = self._remakes(spec, f"l5-{spec.label}-pass-{self.token(spec)}")
        partial, bounds = got
        bounds = dict(bounds or {})
        raise_first([p for f, n in spec.intervals.items() for p in check_bounds(bounds[f], spec.source.name, f, n)])
        row_ids = self._row_ids(spec)
        return Persisted(spec, [], [], groups, bounds, remake=remake, row_ids=row_ids, remake_calls=calls), partial

    def _bounds(self, passes: list[Persisted]) -> list[str]:
        """Fetch each pass's interval bounds (small) into it; every problem they show."""
        passes = [p for p in passes if p.spec.intervals]
        if not passes:
            return []
        here = _held_here(passes) if self.client is None else None
        if here is not None:  # (persisted on local threads: the blocks are here, no second compute)
            got = iter(here)
        else:
            got = iter(self._fetch_bounds(passes))
        problems = []
        for p in passes:
            blocks = [next(got) for _ in p.keys]
            for f, child_len in p.spec.intervals.items():
                p.bounds[f] = np.concatenate([b[f] for b in blocks]) if blocks else np.zeros((0, 6), np.int64)
                problems += check_bounds(p.bounds[f], p.spec.source.name, f, child_len)
        return problems

    def _fetch_bounds(self, passes: list[Persisted]) -> list[dict[str, np.ndarray]]:
        """Each block's interval bounds, where the blocks are (on a cluster's workers)."""
        # one small graph: a task per block takes its bounds out where the block is (the block,
        # rows included, never moves), one task gathers them
        name = f"l5-bounds-{tokenize([p.keys for p in passes])}"
        graph: dict[Any, Task] = {}
        deps: list = []
        refs: list[tuple[str, int]] = []
        for p in passes:
            for k in p.keys:
                key = (f"{name}-block", len(refs))
                graph[key] = Task(key, _bounds_of, TaskRef(k))
                refs.append(key)
            deps += p.collections
        graph[name] = Task(name, list, List(*[TaskRef(k) for k in refs]))
        return compute(
            Delayed(name, HighLevelGraph.from_collections(name, graph, dependencies=deps)),
            client=self.client,
            **self.kw,
        )

    def map(self, func: Callable, calls: Sequence[tuple], name: str, remote: bool = False) -> list:
        """``[func(*args) for args in calls]``, one task each, run together (writers' tasks: each
        writes its own output chunks); results in order. Arguments may be dask collections (a
        block of a dask array, a ``Delayed``): their values are passed (``call_graph``).
        ``remote``: the tasks read an object store (see ``l5dask.core.policy.remote_tasks_per_core``)."""
        key = f"{name}-{uuid.uuid4().hex}"  # (run now: a token of the calls would hash their data)
        graph, keys, deps = call_graph(key, func, calls, remote)
        graph[key] = Task(key, list, List(*[TaskRef(k) for k in keys]))
        return compute(
            Delayed(key, HighLevelGraph.from_collections(key, graph, dependencies=deps)),
            client=self.client,
            progress=self.progress,
            threads=remote_threads(remote),
            label=stage_name(name),
            **self.kw,
        )

    def map_reduce(
        self, func: Callable, calls: Sequence[tuple], reduction: Combine | Reduction, name: str, remote: bool = False
    ) -> Any:
        """``reduction``'s finalized combine of ``[func(*args) for args in calls]`` in order: one task
        each, their partials merged by the engine's ordered tree (:func:`tree_reduce`) where they
        ran (on a cluster: on the workers), in one compute; ``reduction.identity()`` for no call.
        ``reduction`` is a :class:`Combine` (a :class:`Reduction`'s ``chunk`` is not used: the calls
        make the partials). ``remote`` as for :meth:`map`."""
        key = f"{name}-{uuid.uuid4().hex}"  # (run now: a token of the calls would hash their data)
        graph, keys, deps = call_graph(key, func, calls, remote)
        root = tree_reduce(graph, f"{key}-combine", keys, reduction)
        fin = f"{key}-finalize"
        graph[fin] = Task(fin, _finalize, reduction, TaskRef(root))
        return compute(
            Delayed(fin, HighLevelGraph.from_collections(fin, graph, dependencies=deps)),
            client=self.client,
            progress=self.progress,
            threads=remote_threads(remote),
            label=stage_name(name),
            **self.kw,
        )

    def run(self, plans: Sequence[Plan]) -> list:
        """Each plan's result (:class:`Plan`), all plans run together: the passes over one source
        with one parent link fused into one pass (each stored chunk read and decoded once for all
        of them, their partials a tuple combined member by member in the same ordered tree), the
        declared parents persisted first (one pass each, their rows the union of the members'),
        then every reduction and every plan's ``final`` in one compute. Each result is bit for bit
        the plan's run alone: a member keeps how its pass takes its chunks and, unless its
        reduction is ``exact``, its own groups of chunks."""
        import copy

        plans = list(plans)
        plan_of: dict[int, Plan] = {}
        roots: list[Pass] = []
        parents: dict[int, Pass] = {}
        for plan in plans:
            for p in plan.passes:
                if id(p) not in plan_of:
                    roots.append(p)
                    plan_of[id(p)] = plan
                if p.parent is not None and isinstance(p.parent.parent, Pass):
                    q = p.parent.parent
                    if q.parent is not None and isinstance(q.parent.parent, Pass):
                        raise ValueError(f"pass {q.label!r}: a declared parent takes rows in memory or a run pass")
                    parents.setdefault(id(q), q)
                    plan_of.setdefault(id(q), plan)
        jobs: dict[Any, Job] = {}

        def job_for(plan: Plan) -> Job:
            size = plan.size_for if plan.size_for is not None else self.size_for
            if size not in jobs:
                jobs[size] = copy.copy(self)
                jobs[size].size_for = size
            return jobs[size]

        everything = list(parents.values()) + [r for r in roots if id(r) not in parents]
        own = {id(p): job_for(plan_of[id(p)]).groups(p, guided=id(p) not in parents) for p in everything}

        # 1. the parents, and the passes over a parent's source not linked to a declared pass
        links: dict[int, Any] = {}
        for p in everything:
            if p.parent is not None and not isinstance(p.parent.parent, Pass):
                pr = p.parent.parent
                links[id(p)] = ("rows", p.parent.start, pr) if isinstance(pr, Rows) else ("run", id(pr), p.parent)
        held_sources = {tokenize(q.source) for q in parents.values()}
        first = [
            p
            for p in everything
            if id(p) in parents
            or tokenize(p.source) in held_sources
            and (p.parent is None or not isinstance(p.parent.parent, Pass))
        ]
        units = _fuse(first, own, links, set(parents))
        self._in_memory(units)

        def link_of(u: _Unit) -> Link | None:
            if u.link is None:
                return None
            return Link(u.link[2], u.link[1]) if u.link[0] == "rows" else u.link[-1]

        held = [u for u in units if u.parent]
        done: dict[int, Persisted] = {}
        loaded: dict[int, Any] = {}  # unit -> its combined partial, read whole from the cache
        for u in held if self.cache is not None else []:
            got = self._load_persisted(u.spec(own, link_of(u)))
            if got is not None:
                done[id(u)], loaded[id(u)] = got
        rest = [u for u in held if id(u) not in done]
        if rest:
            done.update(zip(map(id, rest), self.persist(*[u.spec(own, link_of(u)) for u in rest])))

        # 2. the others, given the persisted unit that holds their declared parent
        unit_at = {id(p): i for i, u in enumerate(units) for p in u.passes}
        firsts = set(map(id, first))
        second = [p for p in everything if id(p) not in firsts]
        for p in second:
            link = p.parent
            if link is None or not isinstance(link.parent, Pass):
                continue
            if link.interval is None:
                raise ValueError(f"pass {p.label!r}: a link to a declared pass names its interval field")
            i = unit_at[id(link.parent)]
            links[id(p)] = ("pass", link.interval, i, done[id(units[i])].link(link.interval, link.start))
        units2 = _fuse(second, own, links, set())
        self._in_memory(units2)

        # 3. one compute: each unit's tree, each member's result, each plan's final
        graph: dict = {}
        deps: list = []
        leaves_of: list[list] = []
        root_of: dict[int, Any] = {}
        spec_of: dict[int, Pass] = {}
        keeps: list[TaskRef] = []  # (the tasks that keep a whole pass in the cache)
        for u in units + units2:
            kept, head = None, None
            if id(u) in done:
                persisted = done[id(u)]
                spec, leaves = persisted.spec, list(persisted.keys)
                deps += persisted.collections
                if id(u) not in loaded and self.cache is not None:
                    kept = self.pass_entry(spec, persisted.groups, "no rows" if _remade(spec) else "all")
            else:
                link = link_of(u)
                spec = u.spec(own, link)
                groups = self.groups(spec)
                ok, got = self._load_pass(spec, groups, "all") if self.cache is not None else (False, None)
                if ok and got is not None:
                    loaded[id(u)] = got[0]
                else:
                    kept = self.pass_entry(spec, groups, "all") if self.cache is not None else None
                    head = self._prefix(spec, groups) if kept is not None else None
                    skip = head.found if head is not None else 0
                    tasks = f"l5-{spec.label}-{self.token(spec)}"
                    g, d, groups = self.leaves(spec, tasks, skip=skip)
                    graph.update(g)
                    deps += d
                    leaves = [(tasks, i) for i in range(skip, len(groups))]
                    leaves_of.append(leaves)
            spec_of[id(u)] = spec
            if spec.reduction is None:
                continue
            if id(u) in loaded:
                root_of[id(u)] = (f"l5-cached-{spec.label}-{uuid.uuid4().hex}",)
                graph[root_of[id(u)]] = DataNode(root_of[id(u)], loaded[id(u)])
                continue
            name = f"l5-combine-{spec.label}-{tokenize(leaves)}"
            if head is not None and (head.found or head.keep is not None):
                root_of[id(u)] = self._prefix_tree(graph, name, leaves, spec.reduction, head)
            else:
                root_of[id(u)] = tree_reduce(graph, name, leaves, spec.reduction)
            if kept is not None:
                k = (f"l5-keep-{spec.label}-{tokenize(root_of[id(u)])}",)
                bounds = dict(done[id(u)].bounds) if id(u) in done and spec.intervals else None
                graph[k] = Task(k, keep_pass, kept[0], bounds, dict(spec.intervals) or None, TaskRef(root_of[id(u)]))
                keeps.append(TaskRef(k))
                root_of[id(u)] = k  # (finalized once kept: the catalog's finalize changes its partial)
        unit_of = {id(p): u for u in units + units2 for p in u.passes}
        for p in roots:
            if p.reduction is None:
                raise ValueError(f"pass {p.label!r} declares no reduction: persist it, or give one")
        if all(id(u) in loaded for u in units + units2):
            # every pass read whole from the cache: no graph, no scheduler, each result made here
            value = {
                id(p): _finalize_member(p.reduction, unit_of[id(p)].member(p), loaded[id(unit_of[id(p)])])
                for p in roots
                if p.reduction is not None
            }
            return [
                plan.final(*plan.args, *[value[id(p)] for p in plan.passes])
                if plan.final is not None
                else tuple(value[id(p)] for p in plan.passes)
                for plan in plans
            ]
        result: dict[int, Any] = {}
        for p in roots:
            u = unit_of[id(p)]
            root, member = root_of[id(u)], u.member(p)
            fin = (f"l5-finalize-{p.label}-{tokenize(root, member)}",)
            graph[fin] = Task(fin, _finalize_member, p.reduction, member, TaskRef(root))
            result[id(p)] = fin
        finals: list[tuple[str]] = []
        for plan in plans:
            refs = [TaskRef(result[id(p)]) for p in plan.passes]
            fin = (f"{plan.name}-{tokenize([result[id(p)] for p in plan.passes], len(finals))}",)
            graph[fin] = (
                Task(fin, plan.final, *plan.args, *refs) if plan.final is not None else Task(fin, tuple, List(*refs))
            )
            finals.append(fin)
        key = f"l5-run-{tokenize(finals)}"
        graph[key] = Task(key, _first_of, List(*[TaskRef(k) for k in finals]), List(*keeps))
        order = interleave(graph, leaves_of)
        with dask.annotate(**({"priority": lambda k: order.get(k, 0)} if order else {})):
            hlg = HighLevelGraph.from_collections(key, graph, dependencies=deps)
        specs = list(spec_of.values())
        out = compute(
            Delayed(key, hlg, layer=key),
            client=self.client,
            progress=self.progress,
            threads=remote_threads(any(getattr(s.source, "remote", False) for s in specs)),
            label=passes_label(s.label for s in specs),
            **self.kw,
        )
        self._worker_counts()
        return out

    def _in_memory(self, units: list[_Unit]) -> None:
        """The units over a source this job has read whole take its records (not read again)."""
        for u in units:
            key = tokenize(u.source)
            if key in self._read:
                u.source = InMemory(u.source, self._read[key])

    def compute(
        self,
        specs: Sequence[Pass | Persisted],
        final: Callable | None = None,
        name: str = "l5-result",
        args: Sequence[Any] = (),
    ) -> Any:
        """Reduce each pass (running those not yet persisted), in one compute.

        Returns each pass's finalized result, or ``final(*args, *results)`` computed as one task
        named ``name`` (where the partials are) when ``final`` is given.
        """
        graph: dict = {}
        deps: list = []
        roots = []
        passes: list[list] = []  # each pass's leaves, to run side by side (interleave)
        for spec in specs:
            if isinstance(spec, Persisted):
                leaves, deps = list(spec.keys), deps + spec.collections
                red, label = spec.spec.reduction, spec.spec.label
            else:
                label, red = spec.label, spec.reduction
                tasks = f"l5-{label}-{self.token(spec)}"
                g, d, groups = self.leaves(spec, tasks)
                graph.update(g)
                deps += d
                leaves = [(tasks, i) for i in range(len(groups))]  # (not the parent rows' tasks)
                passes.append(leaves)
            if red is None:
                raise ValueError(f"pass {label!r} declares no reduction: persist it, or give one")
            root = tree_reduce(graph, f"l5-combine-{label}-{tokenize(leaves)}", leaves, red)
            fin = (f"l5-finalize-{label}-{tokenize(root)}",)
            graph[fin] = Task(fin, _finalize, red, TaskRef(root))
            roots.append(fin)
        key = f"{name}-{tokenize(roots)}"
        graph[key] = (
            Task(key, final, *args, *[TaskRef(r) for r in roots])
            if final is not None
            else Task(key, tuple, List(*[TaskRef(r) for r in roots]))
        )
        order = interleave(graph, passes)
        with dask.annotate(**({"priority": lambda k: order.get(k, 0)} if order else {})):
            hlg = HighLevelGraph.from_collections(key, graph, dependencies=deps)
        sources = [s.spec.source if isinstance(s, Persisted) else s.source for s in specs]
        threads = remote_threads(any(getattr(s, "remote", False) for s in sources))
        labels = [s.spec.label if isinstance(s, Persisted) else s.label for s in specs]
        result = compute(
            Delayed(key, hlg, layer=key),
            client=self.client,
            progress=self.progress,
            threads=threads,
            label=passes_label(labels),
            **self.kw,
        )
        self._worker_counts()
        return result

    def _worker_counts(self) -> None:
        """The cache's counts from the cluster's workers (their events) since the last look."""
        if self.cache is None or self.client is None:
            return
        try:
            events = self.client.get_events("l5dask-cache")
        except Exception:  # noqa: BLE001 - counts are a report, never a failure
            return
        since, totals = self._events_since, cachelib.Stats()
        for stamp, counts in events:
            if stamp > since and isinstance(counts, dict):
                totals.add(**{k: v for k, v in counts.items() if k in cachelib.Stats.__dataclass_fields__})
                self._events_since = max(self._events_since, stamp)
        cachelib.count_remote(totals.as_dict())
