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

A :class:`Job` owns the rest: the embedded default (local threads) or a cluster, task sizes for
the scheduler in use and guided groups, priorities, persisting a parent pass and routing its
rows to only the child tasks that overlap it, the interval checks, the ordered tree combines
(fan-in from dask's ``split_every`` config), progress, and errors that name the array and chunk.

Graphs are written with dask's explicit task spec (``Task``/``TaskRef``); a task of a parent
pass returns a :class:`Block` (a NamedTuple), never a positional tuple.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ContextManager, NamedTuple, Protocol

import dask
import numpy as np
from dask.base import tokenize
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph
from dask.task_spec import List, Task, TaskRef

from l5dask.core.cluster import compute, persist, secede_while_waiting
from l5dask.core.intervals import block_bounds, check_bounds, raise_first
from l5dask.core.store import while_waiting
from l5dask.errors import L5DaskError

#: Fan-in of the tree combines, unless dask's ``split_every`` config says otherwise.
SPLIT_EVERY = 16
#: (tasks wanted per thread, most stored chunks in a task), by scheduler. On local threads, a pass
#: that streams its chunks from a local store (one chunk decoded at a time, whatever the task's
#: size) takes up to 32 a task: the report on 30 M agents ran 345 tasks with 8, 1.04 s against
#: 1.11 s as a whole process (medians of 9 interleaved rounds, 2026-11-26); block tasks (which
#: hold their chunks) and tasks that wait for an object store keep 8.
TASK_SIZING = {"threads": (16, 8), "threads-streaming": (16, 32), "distributed": (8, 64)}
#: Tasks per thread of a pass whose rows place child tasks (spread over the workers).
PARENT_TASKS_PER_THREAD = 4
#: On local threads, a pass over a source whose every read is a request to a server (an object
#: store) runs this many tasks a core at once (dask config ``l5dask.remote-tasks-per-core``): a
#: task waits for its requests most of the time, and more tasks keep more requests in flight. The
#: tasks stay the same (sized for the cores), and so do the results' bits. On a dask.distributed
#: worker, as many a thread: the others wait for their bytes beside the running one
#: (``l5dask.core.cluster.secede_while_waiting``). ``stats`` through the 50 ms endpoint, medians
#: of 8 interleaved rounds (2026-11-26): on local threads 3.09 s with 6 and 3.33 s with 4 (peak
#: RSS 173 and 166 MB); on 2 one-thread workers 3.42-3.62 s with 6, 3.64-3.78 s with 4, 3.52 s
#: with 8 and 4.15 s with 2.
REMOTE_TASKS_PER_CORE = 6


def remote_threads(remote: bool) -> int | None:
    """Local threads for a graph whose tasks read an object store (``REMOTE_TASKS_PER_CORE``
    a core, or the dask config's), else ``None``: a thread a core."""
    if not remote:
        return None
    return remote_tasks_per_core() * (os.cpu_count() or 1)


def remote_tasks_per_core() -> int:
    """Tasks a core (on a dask.distributed worker: a thread) runs at once when they read an object
    store: ``l5dask.remote-tasks-per-core``, else ``REMOTE_TASKS_PER_CORE``."""
    return max(1, int(dask.config.get("l5dask.remote-tasks-per-core", None) or REMOTE_TASKS_PER_CORE))


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


def _no_finalize(partial: Any) -> Any:
    return partial


@dataclass(frozen=True)
class Reduction:
    """A reduction over chunks, declared once (flox's ``Aggregation`` shape).

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
    """

    name: str
    chunk: Callable[[Any, int, Any], Any]
    combine: Callable[[Any, Any], Any]
    identity: Callable[[], Any]
    finalize: Callable[[Any], Any] = _no_finalize

    def __dask_tokenize__(self):
        return ("l5dask.Reduction", self.name)


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

    def locate(self, lo: int, hi: int, start: str) -> np.ndarray:
        """Position (in these rows) of the parent of each child row in ``[lo, hi)``: the last row
        whose first child row is at or before it (``searchsorted(..., side="right") - 1``)."""
        starts = self.cols[start]
        if not len(starts) or starts[0] > lo or hi <= lo:
            return np.searchsorted(starts, np.arange(lo, hi), side="right") - 1
        # the same, in one pass over the rows: each parent repeated over its rows in [lo, hi)
        cuts = np.clip(starts, lo, hi)
        return np.repeat(np.arange(len(starts), dtype=np.int64), np.diff(cuts, append=hi))


class Block(NamedTuple):
    """What a task of a pass returns."""

    partial: Any
    rows: Rows | None
    bounds: dict[str, np.ndarray] | None  # per interval field: (chunks, 6) table of block_bounds


@dataclass(frozen=True)
class Link:
    """How a child pass gets its parent rows: from a persisted pass, or from rows in memory."""

    parent: Any  # Persisted | Rows
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
        Per-row columns kept for child passes (the pass is then persisted, spread finer).
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

    def __post_init__(self) -> None:
        if self.encoded and (self.rows is not None or self.intervals):
            raise ValueError("an encoded pass hands its chunks to its reduction only (no rows or intervals)")

    @property
    def label(self) -> str:
        return self.name or self.source.name

    def stage(self) -> Stage:
        return Stage(
            self.label, self.source, self.reduction, self.rows, dict(self.intervals), self.blocks, self.encoded
        )


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
    #: :meth:`Job.persist`); ``None`` when they do.
    remake: list[Task] | None = None

    def link(self, interval: str, start: str) -> Link:
        """Hand child passes the rows of this pass, placed by ``interval`` (checked), found by ``start``."""
        if interval not in self.bounds:
            raise ValueError(f"pass {self.spec.label!r} does not check {interval!r}")
        return Link(self, start, interval)

    def child_range(self, interval: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per block: first child row, child end, parent rows (from the checked bounds)."""
        t = self.bounds[interval]
        if len(t) == len(self.keys):
            return t[:, 0], t[:, 1], t[:, 2]
        # a row per chunk (a pass that is not read in blocks): per block, over its chunks with rows
        cuts = np.cumsum([0] + [n for _, n in self.groups[:-1]])
        has = t[:, 2] > 0
        starts = np.minimum.reduceat(np.where(has, t[:, 0], np.iinfo(np.int64).max), cuts)
        return starts, np.maximum.reduceat(np.where(has, t[:, 1], -1), cuts), np.add.reduceat(t[:, 2], cuts)

    def overlapping(self, interval: str, lo: int, hi: int) -> np.ndarray:
        """The blocks whose child rows (by ``interval``) overlap ``[lo, hi)``."""
        starts, ends, rows = self.child_range(interval)
        return np.flatnonzero((rows > 0) & (starts < hi) & (ends > lo))

    def refs(self, interval: str, lo: int, hi: int) -> list[TaskRef]:
        """References to the rows of only the blocks whose child rows overlap ``[lo, hi)``: the
        blocks themselves, or the tasks that make their rows again (add :meth:`Persisted.tasks` to the graph)."""
        ks = self.overlapping(interval, lo, hi)
        return [TaskRef(self.keys[k] if self.remake is None else self.remake[k].key) for k in ks]

    def tasks(self, interval: str, lo: int, hi: int) -> dict:
        """The graph entries :meth:`refs` needs besides the persisted blocks."""
        if self.remake is None:
            return {}
        return {self.remake[k].key: self.remake[k] for k in self.overlapping(interval, lo, hi)}


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


def _note(exc: BaseException, spec_name: str, source: Any, first: int, n: int, what: str) -> None:
    chunks = f"chunk {first}" if n == 1 else f"chunks {first}..{first + n - 1}"
    exc.add_note(f"l5dask: in {what} of {source.name!r}, {chunks} (pass {spec_name!r})")


def call_task(key: Any, func: Callable, args: Sequence[Any], remote: bool) -> Task:
    """The task ``func(*args)`` of :meth:`Job.map` and :meth:`Job.map_reduce`; ``remote`` (its reads
    are an object store's): on a dask.distributed worker, it gives its thread back at each wait for
    bytes that have not come, as a pass's task does (:func:`run_remote`)."""
    return Task(key, run_remote, func, *args) if remote else Task(key, func, *args)


def run_remote(func: Callable, *args: Any) -> Any:
    """``func(*args)``, each of its waits for an object store's bytes that have not come made out of
    the worker's threads on a dask.distributed worker (:func:`store_waits`)."""
    with store_waits(True):
        return func(*args)


def store_waits(remote: bool) -> ContextManager[None]:
    """Where a task waits for its reads: ``remote`` (an object store's), out of a dask.distributed
    worker's threads at each wait for bytes that have not come, up to ``remote_tasks_per_core()``
    tasks a thread (``secede_while_waiting``); else in place."""
    return while_waiting(secede_while_waiting(remote_tasks_per_core()) if remote else None)


def read_block_of(source: Any, first: int, n: int, encoded: bool = False) -> Any:
    """Chunks ``first .. first + n - 1`` of ``source`` as one block: records, or (``encoded``, from
    sources that can) the stored chunks not yet decoded."""
    return source.read_encoded(first, n) if encoded and hasattr(source, "read_encoded") else source.read(first, n)


def run_group(spec: Stage, first: int, n: int, link_rows: Rows | None, *parent_blocks: Block) -> Block:
    """The task of a pass: read chunks ``first .. first + n - 1`` (each decoded once) and reduce
    them, keep their rows and their interval bounds."""
    source, red = spec.source, spec.reduction
    parent = parent_rows(link_rows, parent_blocks)
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


def _partial(x: Any) -> Any:
    return x.partial if isinstance(x, Block) else x


def combine_many(reduction: Reduction, *parts: Any) -> Any:
    """Combine neighbouring partials (or blocks) in order."""
    out = _partial(parts[0])
    for p in parts[1:]:
        out = reduction.combine(out, _partial(p))
    return out


#: The span of the priorities :func:`interleave` gives a pass's leaves.
PRIORITY_SPAN = 1 << 20


def interleave(graph: dict, passes: Sequence[Sequence[Any]]) -> dict[Any, int]:
    """Scheduling priorities (dask's ``priority`` annotation, higher first) that run the leaves of
    several passes of one graph side by side, each from its first to its last: leaf ``i`` of ``n``
    gets ``-PRIORITY_SPAN * i // n``, and a task a leaf depends on that is no leaf (the parent rows
    a persisted pass makes again) the priority of its first leaf, so that it runs just before it
    and no earlier. The other tasks (the combines) keep 0: each runs as soon as its partials are
    there. Nothing for fewer than two passes.

    dask.distributed ran the report's traffic-light faces after every agent task: the last second
    of a run through the 50 ms endpoint on 2 worker processes had the faces left, each task waiting
    for its first bytes, and a one-thread worker ran 38 agent tasks in a row, then the faces. Local
    threads order by the graph (``dask.order``) and ignore it."""
    if len(passes) < 2:
        return {}
    order: dict[Any, int] = {}
    for leaves in passes:
        for i, key in enumerate(leaves):
            order[key] = -(PRIORITY_SPAN * i // len(leaves))
    for leaves in passes:
        for key in leaves:
            for dep in graph[key].dependencies:
                if dep in graph:
                    order.setdefault(dep, order[key])
    return order


def _finalize(reduction: Reduction, part: Any) -> Any:
    return reduction.finalize(part)


def hold_blocks(parent: str, intervals: dict[str, int], *blocks: Block) -> Block:
    """The task of a :class:`Held` pass: its blocks' interval bounds checked (the first problem
    raised, as :meth:`Job.persist` does), their rows as one block."""
    for f, child_len in intervals.items():
        table = np.concatenate([b.bounds[f] for b in blocks if b.bounds]) if blocks else np.zeros((0, 6), np.int64)
        raise_first(check_bounds(table, parent, f, child_len))
    rows = [b.rows for b in blocks if b.rows is not None]
    return Block(None, Rows.concat(rows) if rows else None, None)


def _bounds_of(block: Block) -> dict[str, np.ndarray]:
    return block.bounds or {}


# --- sizing --------------------------------------------------------------------------------
def default_client(client: Any = None) -> Any:
    """The distributed client the job runs on: ``client``, else the default one if there is one.

    A default client exists only if ``distributed`` was imported; it is not imported here (0.2 s).
    """
    if client is not None:
        return client
    distributed = sys.modules.get("distributed")
    if distributed is not None:
        try:
            return distributed.default_client()
        except ValueError:
            pass
    return None


def worker_threads(client: Any = None) -> int:
    """Threads that will run the tasks: those of the cluster, else local cores."""
    if client is not None:
        try:
            return max(1, sum(client.nthreads().values()))
        except OSError:
            pass
    return os.cpu_count() or 1


def auto_chunks_per_task(
    nchunks: int, threads: int | None = None, scheduler: str = "threads", tasks_per_thread: int | None = None
) -> int:
    """Stored chunks per task: enough tasks per thread to balance the load, few enough to keep
    the scheduling cost small against the work (each task still decodes each chunk once).

    On local threads a task costs about 0.3 ms of scheduling, as much as decoding a chunk:
    16 tasks per thread and up to 8 chunks a task (32 for a pass streaming a local store,
    ``scheduler="threads-streaming"``: see ``TASK_SIZING``). On dask.distributed a task
    costs 1-3 ms (a round between worker and scheduler): 8 tasks per thread and up to 64 chunks
    a task.
    """
    per_thread, most = TASK_SIZING[scheduler]
    threads = threads or worker_threads()
    return int(min(most, max(1, nchunks // ((tasks_per_thread or per_thread) * threads))))


#: Stored chunks per chunk of a dask collection users compute with (a joined view's chunk):
#: 640 k agent rows, 74 MB of records, as dask advises (about 100 MB).
#: Measured on 30 M agents: with 8 chunks a chunk, a DataFrame groupby took twice as long (235
#: partitions: dask then splits its output with a shuffle), an xarray groupby 1.3x.
COLLECTION_CHUNKS = 32
#: The in-memory size of a DataFrame partition (its columns: the records are never held whole),
#: as dask advises; and the fewest partitions per thread, to balance the load.
PARTITION_BYTES = 100_000_000
PARTITIONS_PER_THREAD = 4


def collection_chunks_per_task(
    nchunks: int, threads: int | None = None, row_bytes: int | None = None, chunk_rows: int | None = None
) -> int:
    """Stored chunks per chunk of a user-facing dask collection: ``COLLECTION_CHUNKS``, fewer
    on small arrays so that every thread has a chunk.

    With ``row_bytes`` (the bytes of a row of its columns, ``chunk_rows`` rows a stored chunk), as
    many as make ``PARTITION_BYTES``, but at least ``PARTITIONS_PER_THREAD`` partitions a
    thread. Measured on 30 M agents, a groupby of three columns took 1.2-1.35x as long with 47
    partitions (records-sized, 640 k rows) as with 8-16: dask splits the output of a groupby by
    several keys with a hash shuffle once there are more than 15 partitions.
    """
    threads = threads or worker_threads(default_client())
    most = COLLECTION_CHUNKS
    if row_bytes is not None and chunk_rows:
        most = min(
            max(1, int(PARTITION_BYTES // (max(row_bytes, 1) * chunk_rows))),
            max(1, nchunks // (PARTITIONS_PER_THREAD * threads)),
        )
    return max(1, min(most, -(-nchunks // threads)))


def task_groups(nchunks: int, per_task: int, threads: int) -> list[tuple[int, int]]:
    """``(first chunk, number of chunks)`` of each task: ``per_task`` chunks a task, then smaller
    tasks as the end nears (at most the rest over twice the threads, at least an eighth of
    ``per_task``), so that the job does not end on a few long tasks while other threads have
    nothing left to do ("guided" self-scheduling)."""
    groups, first, smallest = [], 0, max(1, per_task // 8)
    while first < nchunks:
        n = max(smallest, min(per_task, (nchunks - first) // (2 * threads)))
        groups.append((first, min(n, nchunks - first)))
        first += n
    return groups


def tree_reduce(
    graph: dict, name: str, leaves: Sequence[Any], reduction: Reduction, split_every: int | None = None
) -> Any:
    """Add an ordered tree combine of ``leaves`` (keys) to ``graph``, one key name per level
    (``name-0``, ``name-1``...); returns the root key. Fan-in: ``split_every``, else dask's
    ``split_every`` config, else ``SPLIT_EVERY``."""
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


def call_keys(name: str, n: int) -> list[tuple[str, str]]:
    """Keys of ``n`` independent calls that local threads start in the order given (callers put
    the longest first): dask's ordering starts sibling leaves in descending key order, so call
    ``i`` is named ``n - 1 - i``, zero-padded (with ``(name, i)``, 9 ran before 12 and call 0
    last: the largest perception table parsed last cost 0.3-0.5 s of a 2.3 s load);
    ``tests/test_engine.py`` holds the order."""
    return [(name, f"{n - 1 - i:09d}") for i in range(n)]


# --- the job -------------------------------------------------------------------------------
class Job:
    """Where and how passes run: the embedded default (local threads) or a cluster.

    Parameters
    ----------
    client : distributed.Client, optional
        Run there (else the default client if there is one, else local threads).
    scheduler : optional
        A dask scheduler for ``dask.compute`` (overrides the choice above).
    chunks_per_task : int, optional
        Stored chunks per task of every pass (default: sized for the scheduler, per pass).
    size_for : int, optional
        The stored chunks of the pass that dominates the work: every pass is then sized for it
        (as a tree reduction is sized for its largest input).
    progress : bool
        A progress bar on stderr.
    """

    def __init__(
        self,
        client: Any = None,
        scheduler: Any = None,
        chunks_per_task: int | None = None,
        progress: bool = False,
        size_for: int | None = None,
    ) -> None:
        self.client = default_client(client) if scheduler is None else None
        if self.client is None and scheduler is None and dask.config.get("scheduler", None) is None:
            # the embedded default: local threads, named by the function itself, since dask imports
            # distributed (0.2 s) to look for a client whenever the scheduler is left to it
            from dask.threaded import get as threaded_get

            scheduler = threaded_get
        self.kw = {"scheduler": scheduler} if scheduler is not None else {}
        self.scheduler_kind = "distributed" if self.client is not None else "threads"
        self.threads = worker_threads(self.client)
        self.chunks_per_task = chunks_per_task or dask.config.get("l5dask.chunks-per-task", None)
        # (else every pass sized for the one that dominates the work: small passes get few tasks)
        self.size_for = size_for
        self.progress = progress

    def per_task(self, spec: Pass) -> int:
        """Stored chunks per task of ``spec`` (before a parent's spread and the guided end)."""
        if self.chunks_per_task:
            return int(self.chunks_per_task)
        kind = self.scheduler_kind
        if kind == "threads" and not spec.blocks and not getattr(spec.source, "remote", False):
            kind = "threads-streaming"
        return auto_chunks_per_task(self.size_for or spec.source.nchunks, self.threads, kind)

    def groups(self, spec: Pass, guided: bool = True) -> list[tuple[int, int]]:
        """The tasks of a pass: groups of whole chunks, sized for the scheduler (and for the job's
        dominant pass when it has one); ``guided``: smaller as the end nears (a persisted pass is
        followed by more work, so its last tasks idle no thread: it needs no guided end)."""
        n = spec.source.nchunks
        per_task = self.per_task(spec)
        if spec.rows is not None:
            # a parent's rows place its child tasks: spread them over the workers
            per_task = min(
                per_task,
                auto_chunks_per_task(n, self.threads, self.scheduler_kind, tasks_per_thread=PARENT_TASKS_PER_THREAD),
            )
        if spec.rows is not None or not guided:
            return [(f, min(per_task, n - f)) for f in range(0, n, per_task)]
        return task_groups(n, per_task, self.threads)

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
        )

    def leaves(
        self, spec: Pass, name: str, guided: bool = True, keep: str = "all"
    ) -> tuple[dict, list, list[tuple[int, int]]]:
        """The tasks of a pass (a dict), the collections they depend on, and their groups.
        ``keep``: what its tasks do, ``"all"``, ``"no rows"`` (its reduction and checks) or
        ``"rows"`` (its rows alone)."""
        groups = self.groups(spec, guided)
        stage = spec.stage()
        if keep == "no rows":
            stage = stage._replace(rows=None)
        elif keep == "rows":
            stage = stage._replace(reduction=None, intervals={})
        graph, deps = {}, []
        link = spec.parent
        persisted = link is not None and isinstance(link.parent, Persisted | Held)
        if link is not None and isinstance(link.parent, Persisted) and link.parent.remake is None:
            deps = link.parent.collections
        if link is not None and isinstance(link.parent, Held):
            graph.update(link.parent.graph)
        for i, (first, n) in enumerate(groups):
            lo = spec.source.chunk_bounds(first)[0]
            hi = spec.source.chunk_bounds(first + n - 1)[1]
            key = (name, i)
            if link is None:
                graph[key] = Task(key, run_group, stage, first, n, None)
            elif persisted:
                # only the parent blocks whose child ranges overlap these rows
                graph.update(link.parent.tasks(link.interval, lo, hi))
                graph[key] = Task(key, run_group, stage, first, n, None, *link.parent.refs(link.interval, lo, hi))
            else:
                graph[key] = Task(key, run_group, stage, first, n, link.parent.overlapping(lo, hi, link.start))
        return graph, deps, groups

    # -- running ---------------------------------------------------------------------------
    def read(self, source: Any) -> Any:
        """A whole (small) source, read now by this process: what it returns is wanted here (the
        scenes a report keeps a row of each), and its stored bytes are fewer to move than its
        records. On a cluster a task on a worker read it before, a round trip through the scheduler
        to a worker still warming up: 0.08-0.21 s of the report through the 50 ms endpoint on 2
        worker processes, against 0.05-0.06 s here."""
        return source.read(0, source.nchunks)

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
        child's own graph, so that each is released once its last child task has run. (A pass
        whose own parent is persisted or held keeps its rows.)
        """
        built, remakes = [], []
        collections: list = []
        for spec in specs:
            name = f"l5-{spec.label}-pass-{self.token(spec)}"
            remake, keep = None, "all"
            if spec.rows is not None and (spec.parent is None or isinstance(spec.parent.parent, Rows)):
                # the rows alone (the reduction and the checks run in the pass), in the same groups
                again, _, _ = self.leaves(spec, f"{name}-rows", guided=False, keep="rows")
                remake, keep = list(again.values()), "no rows"
            graph, deps, groups = self.leaves(spec, name, guided=False, keep=keep)
            remakes.append(remake)
            with dask.annotate(priority=spec.priority):
                hlg = HighLevelGraph.from_collections(name, graph, dependencies=deps)
            built.append((spec, [Delayed(k, hlg, layer=name) for k in graph], groups))
            collections += built[-1][1]
        remote = any(getattr(spec.source, "remote", False) for spec in specs)
        done = persist(
            collections, client=self.client, progress=self.progress, threads=remote_threads(remote), **self.kw
        )
        out: list[Persisted] = []
        i = 0
        for spec, parts, groups in built:
            held = done[i : i + len(parts)]
            i += len(parts)
            out.append(Persisted(spec, [p.key for p in held], held, groups, remake=remakes[len(out)]))
        found = self._bounds(out)
        if problems is not None:
            problems += found
        if check:
            raise_first(found)
        return out

    def _bounds(self, passes: list[Persisted]) -> list[str]:
        """Fetch each pass's interval bounds (small) into it; every problem they show."""
        passes = [p for p in passes if p.spec.intervals]
        if not passes:
            return []
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
        got = iter(
            compute(
                Delayed(name, HighLevelGraph.from_collections(name, graph, dependencies=deps)),
                client=self.client,
                **self.kw,
            )
        )
        problems = []
        for p in passes:
            blocks = [next(got) for _ in p.keys]
            for f, child_len in p.spec.intervals.items():
                p.bounds[f] = np.concatenate([b[f] for b in blocks]) if blocks else np.zeros((0, 6), np.int64)
                problems += check_bounds(p.bounds[f], p.spec.source.name, f, child_len)
        return problems

    def map(self, func: Callable, calls: Sequence[tuple], name: str, remote: bool = False) -> list:
        """``[func(*args) for args in calls]``, one task each, run together (writers' tasks: each
        writes its own output chunks); results in order. ``remote``: the tasks read an object
        store (see ``REMOTE_TASKS_PER_CORE``)."""
        key = f"{name}-{uuid.uuid4().hex}"  # (run now: a token of the calls would hash their data)
        keys = call_keys(key, len(calls))
        graph: dict[Any, Task] = {k: call_task(k, func, args, remote) for k, args in zip(keys, calls)}
        graph[key] = Task(key, list, List(*[TaskRef(k) for k in keys]))
        return compute(
            Delayed(key, HighLevelGraph.from_collections(key, graph, dependencies=[])),
            client=self.client,
            progress=self.progress,
            threads=remote_threads(remote),
            **self.kw,
        )

    def map_reduce(
        self, func: Callable, calls: Sequence[tuple], reduction: Reduction, name: str, remote: bool = False
    ) -> Any:
        """``reduction``'s finalized combine of ``[func(*args) for args in calls]`` in order: one task
        each, their partials merged by the engine's ordered tree (:func:`tree_reduce`) where they
        ran (on a cluster: on the workers), in one compute; ``reduction.identity()`` for no call.
        ``remote`` as for :meth:`map`."""
        key = f"{name}-{uuid.uuid4().hex}"  # (run now: a token of the calls would hash their data)
        keys = call_keys(key, len(calls))
        graph: dict = {k: call_task(k, func, args, remote) for k, args in zip(keys, calls)}
        root = tree_reduce(graph, f"{key}-combine", keys, reduction)
        fin = f"{key}-finalize"
        graph[fin] = Task(fin, _finalize, reduction, TaskRef(root))
        return compute(
            Delayed(fin, HighLevelGraph.from_collections(fin, graph, dependencies=[])),
            client=self.client,
            progress=self.progress,
            threads=remote_threads(remote),
            **self.kw,
        )

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
        return compute(
            Delayed(key, hlg, layer=key), client=self.client, progress=self.progress, threads=threads, **self.kw
        )
