"""The engine's policy: how and where its graphs run, apart from what they declare.

:mod:`l5dask.core.engine` holds the vocabulary (a :class:`~l5dask.core.engine.Reduction`, a
:class:`~l5dask.core.engine.Pass`, :func:`~l5dask.core.engine.tree_reduce`, the
:class:`~l5dask.core.engine.Job`'s ``map``); this module decides what those declarations leave
open, measured on this machine's schedulers:

- **sizing**: stored chunks a task (:func:`auto_chunks_per_task`, ``TASK_SIZING``), a guided end
  (``task_groups``), the chunks of the dask collections users compute with
  (:func:`collection_chunks_per_task`);
- **priorities**: passes of one graph side by side (``interleave``), independent calls started
  longest first (``call_keys``);
- **where it runs**: the one ``scheduler=`` keyword of every public function that runs work
  (:func:`resolve_scheduler`, with ``where_keywords`` keeping the old ``client=``/``job=`` for
  one release), the client (``default_client``), the threads (``worker_threads``),
  and :func:`compute` / ``persist``, the only calls that hand a graph to a scheduler: on local
  threads in a pool of each run's own, which Ctrl-C stops (``threads_scheduler``), with
  ``TASKS_AHEAD`` tasks submitted a thread;
- **waits**: an object store's tasks, more a core on local threads (``remote_threads``) and
  out of a dask.distributed worker's threads while their bytes have not come
  (``secede_while_waiting``, ``store_waits``);
- **tuning** this process: glibc's allocator (``tune_malloc``) and the garbage collector
  (``tune_gc``).

Nothing else in the package starts a thread pool or calls ``dask.compute``: work that needs a few
threads of its own takes them from ``thread_pool``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ContextManager, ParamSpec, TypeVar

from l5dask.core import config
from l5dask.core.cluster import WORKER_ENV
from l5dask.core.progress import Progress, on_cluster
from l5dask.core.store import CANCELLED, cancel_reads, while_waiting
from l5dask.errors import UsageError

# --- sizing ---------------------------------------------------------------------------------
#: (tasks wanted per thread, most stored chunks in a task), by scheduler. On local threads, a pass
#: over a local store that streams its chunks (one chunk decoded at a time, whatever the task's
#: size) or gathers its columns from their compressed bytes (``encoded``: an aggregation's blocks, a
#: fused run's) takes up to 32 a task: the report on 30 M agents ran 345 tasks with 8, 1.04 s against
#: 1.11 s as a whole process (medians of 9 interleaved rounds, 2026-11-26); a fused run of the
#: report, the catalog and three aggregations (``python benchmarks/fused_members.py --repeat 2
#: --breakdown``, one thread, ``DASK_L5DASK__CHUNKS_PER_TASK`` set, 2026-11-29) 2.36-2.55 CPU-s with
#: 32 against 2.61-2.80 with 8, and ``aggregate()`` of the three queries of
#: ``aggregate_benchmark.py`` 12-15% faster as whole processes (peak RSS 190-260 MB against
#: 150-200). That needs the allocator's thresholds of :func:`local_malloc`: under glibc's defaults
#: a block of 32 chunks was given back and faulted in again each task (300 k faults, the fused run
#: 3.72-3.86 CPU-s against 3.27 with 8). Block tasks of records and tasks that wait for an object
#: store keep 8.
TASK_SIZING = {"threads": (16, 8), "threads-streaming": (16, 32), "distributed": (8, 64)}
#: Tasks per thread of a pass whose rows place child tasks (spread over the workers).
PARENT_TASKS_PER_THREAD = 4
#: Bytes of a persisted pass's rows held whole for its child tasks when it runs on local threads
#: (each block keeps its rows if they are at most this over the pass's blocks; the others, and
#: with a cache those of the blocks read from it, are made again by the child tasks that need
#: them, read a second time). The frames'
#: join rows of 30 M agents are ~5 MB: held, the frames are read once (`l5dask agg` q2: see the
#: commit that set it); 2.6 G agents' frames (~12 M) are made again, memory flat in the dataset.
HELD_ROWS_BYTES = 64 << 20


def remote_threads(remote: bool) -> int | None:
    """Local threads for a graph whose tasks read an object store (:func:`remote_tasks_per_core`
    a core), else ``None``: a thread a core."""
    if not remote:
        return None
    return remote_tasks_per_core() * (os.cpu_count() or 1)


def remote_tasks_per_core() -> int:
    """Tasks a core (on a dask.distributed worker: a thread) runs at once when they read an object
    store, ``l5dask.remote-tasks-per-core`` (6, measured in ``l5dask.yaml``): a task waits for its
    requests most of the time, and more tasks keep more requests in flight. The tasks stay the
    same (sized for the cores), and so do the results' bits. On a dask.distributed worker, as many
    a thread: the others wait for their bytes beside the running one (:func:`secede_while_waiting`)."""
    return max(1, int(config.get("remote-tasks-per-core")))


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


#: dask's names for its distributed scheduler: the active client.
DISTRIBUTED_NAMES = ("distributed", "dask.distributed")


def is_client(scheduler: Any) -> bool:
    """Whether ``scheduler`` is a dask.distributed ``Client`` (a subclass too), or recognised as
    dask recognises one; distributed is not imported for it (0.2 s)."""
    distributed = sys.modules.get("distributed")
    if distributed is not None and isinstance(scheduler, distributed.Client):
        return True
    return "Client" in type(scheduler).__name__ and hasattr(scheduler, "get")


def resolve_scheduler(scheduler: Any = None) -> tuple[Any, Any]:
    """``(client, scheduler for dask.compute)`` of the one ``scheduler=`` keyword, read as dask reads
    it, plus an address: ``None``, the active dask.distributed client if there is one (else dask's
    ``scheduler`` config, else local threads); a ``distributed.Client``; its address
    (``"tcp://host:8786"``: the client connected there, through ``distributed.get_client``, which
    reuses the default one when it is that scheduler's); ``"distributed"``, the active client;
    any other name or scheduler dask takes (``"threads"``, ``"sync"``, ``"processes"``, a
    ``get`` function), as given, for ``dask.compute``."""
    if scheduler is None:
        return default_client(), None
    if is_client(scheduler):
        return scheduler, None
    if isinstance(scheduler, str) and "://" in scheduler:
        from distributed import get_client

        return get_client(scheduler), None
    if isinstance(scheduler, str) and scheduler.lower() in DISTRIBUTED_NAMES:
        client = default_client()
        if client is None:
            raise ValueError(f"scheduler={scheduler!r}: no dask.distributed client is active")
        return client, None
    return None, scheduler


def collection_compute_kw(collection: Any, kw: dict) -> dict:
    """``dask.compute``'s keywords ``kw`` for a dask collection of the package's own (its dask
    DataFrames, the arrays of the xarray accessor's results): as given when they name a scheduler; else, when no dask.distributed client can
    exist (``distributed`` not imported) and dask's ``scheduler`` config is unset, the collection's
    own default scheduler named by the function itself: what dask picks then, but found without
    importing ``distributed`` to look for a client (dask imports it whenever the scheduler is left
    to it: 0.15-0.2 s of CPU, 8% of a query over 30 M agents through ``to_dask_dataframe``)."""
    if kw.get("scheduler") is not None or kw.get("get") is not None or "distributed" in sys.modules:
        return kw
    import dask

    if dask.config.get("scheduler", None) is not None or dask.config.get("get", None) is not None:
        return kw
    return {**kw, "scheduler": type(collection).__dask_scheduler__}


class ComputedLocally:
    """``compute()`` and ``persist()`` of the package's own dask collections (its dask DataFrames
    and Series, the dask arrays of the xarray accessor's results; also what ``np.asarray`` and
    xarray's ``.values`` of one compute): where no dask.distributed client can exist, on dask's
    default scheduler for them, found without importing ``distributed``
    (:func:`collection_compute_kw`). A mixin before the dask collection class."""

    def compute(self, *args: Any, **kwargs: Any) -> Any:
        return super().compute(*args, **collection_compute_kw(self, kwargs))  # type: ignore[misc]

    def persist(self, *args: Any, **kwargs: Any) -> Any:
        return super().persist(*args, **collection_compute_kw(self, kwargs))  # type: ignore[misc]


#: The keywords that said where to run before ``scheduler=``: they keep working for one release
#: (0.1.x), with a ``FutureWarning`` naming ``scheduler=``, and go in the next.
OLD_WHERE = ("job", "client")

P = ParamSpec("P")
R = TypeVar("R")


def where_keywords(func: Callable[P, R]) -> Callable[P, R]:
    """``func`` (whose where-to-run keyword is ``scheduler=``) also taking the old ``client=`` and
    ``job=`` for one release: each warns (``FutureWarning``, naming ``scheduler=``) and is passed
    as ``scheduler`` (which takes a client, and a :class:`~l5dask.core.engine.Job` as the
    package's own callers hand theirs on), unless ``scheduler`` is given (then it wins, as it did
    over ``client``); ``job`` before ``client``, as before. The signature shows ``scheduler`` only."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        old = {k: kwargs.pop(k) for k in OLD_WHERE if k in kwargs}
        if old:
            given = ", ".join(f"{k}=" for k in old)
            warnings.warn(
                f"{func.__qualname__.removesuffix('.__init__')}: {given} is deprecated and will be removed in the next release; "
                "pass scheduler= (a dask.distributed Client, its address, 'threads', 'sync', 'processes')",
                FutureWarning,
                stacklevel=2,
            )
            if kwargs.get("scheduler") is None:
                kwargs["scheduler"] = next((v for v in old.values() if v is not None), None)
        return func(*args, **kwargs)

    wrapper.__l5_where__ = True  # type: ignore[attr-defined]
    return wrapper


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
    16 tasks per thread and up to 8 chunks a task (32 for a pass over a local store that
    streams its chunks or gathers its columns from their compressed bytes,
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


# --- priorities -----------------------------------------------------------------------------
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


def call_keys(name: str, n: int) -> list[tuple[str, str]]:
    """Keys of ``n`` independent calls that local threads start in the order given (callers put
    the longest first): dask's ordering starts sibling leaves in descending key order, so call
    ``i`` is named ``n - 1 - i``, zero-padded (with ``(name, i)``, 9 ran before 12 and call 0
    last: the largest perception table parsed last cost 0.3-0.5 s of a 2.3 s load);
    ``tests/core/test_engine.py`` holds the order."""
    return [(name, f"{n - 1 - i:09d}") for i in range(n)]


# --- waits ----------------------------------------------------------------------------------
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


_WAITING: tuple[int, int, threading.BoundedSemaphore] | None = None
_WAITING_LOCK = threading.Lock()


def secede_while_waiting(tasks_per_thread: int = 1) -> Callable[[], ContextManager[None]] | None:
    """On a dask.distributed worker, what a task waits for an object store's bytes in (for
    ``l5dask.core.store.while_waiting``): it gives its thread back (distributed's ``secede``, then
    ``rejoin``), and the worker runs another task meanwhile, one whose bytes have come or a new one
    whose requests then go out. The engine's tasks wait so each time a read they need next has not
    come. Up to ``tasks_per_thread - 1`` tasks a thread wait beside the running one, each with its
    reads ahead (the engine passes ``l5dask.remote-tasks-per-core``, 6, as local threads run 6
    such tasks a core).

    ``stats`` on 2 one-thread workers through the 50 ms endpoint (``benchmarks/s3_latency_
    benchmark.py --cluster``, docs/scale.md): when a task gave its thread back only while it waited
    for its first chunk (one task a thread at most), it kept the thread while it waited for each
    later one (its chunks come at the pace of the worker's connections, which the waiting tasks'
    reads share) and the tasks whose bytes had come waited to rejoin: 3.75 s, median of 8
    interleaved rounds; with every wait, 3.44 s (the fetch floor: 2.95 s). Without any, 8.21-8.61 s
    against 6.88-7.50 s at 100 ms.

    ``None`` elsewhere (not a worker's task), or with ``l5dask.secede-on-wait: false`` (dask
    config, on the workers)."""
    dist = sys.modules.get("distributed")  # (not imported: no worker runs this)
    if dist is None or not config.get("secede-on-wait"):
        return None
    try:
        worker = dist.get_worker()
    except ValueError:  # (not a worker's task)
        return None
    slots = _waiting_slots(worker, max(1, tasks_per_thread - 1))
    return functools.partial(_seceded, slots)


@contextlib.contextmanager
def _seceded(slots: threading.BoundedSemaphore) -> Iterator[None]:
    """Out of the worker's threads while inside, if a slot is free."""
    if not slots.acquire(blocking=False):
        yield
        return
    from distributed import rejoin, secede

    try:
        secede()
        try:
            yield
        finally:
            rejoin()
    finally:
        slots.release()


def _waiting_slots(worker: Any, per_thread: int) -> threading.BoundedSemaphore:
    """The worker's slots for waiting tasks: ``per_thread`` a thread."""
    global _WAITING
    with _WAITING_LOCK:
        n = per_thread * max(1, int(getattr(worker, "nthreads", 1) or 1))
        if _WAITING is None or _WAITING[:2] != (id(worker), n):
            _WAITING = (id(worker), n, threading.BoundedSemaphore(n))
        return _WAITING[2]


@config.on_reset
def _forget_waiting() -> None:
    global _WAITING
    _WAITING = None


# --- tuning ---------------------------------------------------------------------------------
#: glibc's settings for a process that runs passes on its own threads (:func:`tune_malloc`): the
#: workers' (:data:`WORKER_ENV`) but for freed heap given back to the system above 256 MB, not 8 MB.
#: A pass of several analyses (``l5dask run``: the report, the catalog and three aggregations)
#: frees more than 8 MB of temporaries at the end of each task; given back, the next task faulted
#: them in again: 110-170 k page faults and 0.65-0.85 s of system time against 43 k and 0.4-0.5 s,
#: the run 10-15% faster on 30 M agents (``benchmarks/run_benchmark.py --malloc``). glibc's own
#: defaults (a threshold that follows the largest block freed, at most 32 MB, and trims above
#: twice that) faulted a task's block of 32 chunks in again after each task: 300 k faults and
#: 1.0 s of system time a fused run. The cost: the process keeps up to 256 MB a heap of its peak.
#: And one heap for the pass's threads, not two: the second thread's heap, emptied at the end of a
#: task, was given back whole and faulted in again by the next (fresh pages for the columns of a
#: fused pass): the run above 0.43 s of system time against 0.52, 1.63 s against 1.72 (medians of
#: 6 interleaved rounds, 2026-11-30; the report alone unchanged, 1.10 s). Its threads take their
#: blocks and columns in a few large allocations each, so they hardly meet on its lock.
LOCAL_ENV = {**WORKER_ENV, "MALLOC_TRIM_THRESHOLD_": str(256 * 2**20), "MALLOC_ARENA_MAX": "1"}

#: Whether :func:`tune_malloc` ran in this process (its answer), ``None`` before.
_MALLOC: bool | None = None


def tune_malloc(arenas: bool = True) -> bool:
    """:data:`LOCAL_ENV`'s settings for this process (glibc's ``mallopt``), unless the
    environment sets one of them: the CLI's embedded default reads multi-MB blocks (CSV ranges,
    chunk runs), each a fresh mmap that page-faults when above glibc's threshold (1.3 GB of CSV
    read in 32 MB blocks: 1-1.6 GB/s; in 8 MB blocks, from a reused heap: 4-10 GB/s).
    ``arenas=False``: the two thresholds only, the number of heaps left as it is (a library's
    caller's threads keep theirs: :func:`local_malloc`). Returns whether it applied them."""
    import ctypes
    import os

    global _MALLOC
    if any(k in os.environ for k in WORKER_ENV):
        _MALLOC = False
        return False
    try:
        # this process's own symbols, libc's among them (ctypes.util.find_library runs ldconfig: 3 ms)
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        _MALLOC = False
        return False
    params = {"MALLOC_TRIM_THRESHOLD_": -1, "MALLOC_MMAP_THRESHOLD_": -3, "MALLOC_ARENA_MAX": -8}  # <malloc.h>
    settings = {k: v for k, v in LOCAL_ENV.items() if arenas or k != "MALLOC_ARENA_MAX"}
    _MALLOC = all([bool(mallopt(params[k], int(v))) for k, v in settings.items()])
    return _MALLOC


def tune_arrow() -> None:
    """The command line's Arrow buffers from glibc's heap (``ARROW_DEFAULT_MEMORY_POOL=system``,
    unless the environment names a pool; before pyarrow is imported), not mimalloc's: each thread
    that writes a Parquet output made its mimalloc heap in fresh pages, then zeroed them, 1.5% of
    the CPU of a run of five analyses (``perf``, 2026-11-30), where glibc's heap is the pass's, its
    pages in use already. A library leaves its caller's pool alone."""
    import os
    import sys

    if "pyarrow" not in sys.modules:
        os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")


def local_malloc() -> None:
    """When a dataset is opened, and before a pass on this process's threads: :func:`tune_malloc`'s
    thresholds (not its heaps), once a process, unless the command line set them already or
    ``l5dask.tune-malloc`` is false. A pass's tasks take blocks of up to 32 chunks
    (:data:`TASK_SIZING`); under glibc's defaults each task's temporaries were given back and
    faulted in again by the next. A dask collection of a dataset's (an xarray view, a dataframe)
    computed by dask itself reads each chunk into a fresh buffer: the xarray route's three
    queries as whole processes, 1.93, 2.22 and 1.75 s against 2.27, 2.69 and 1.97 s with
    ``DASK_L5DASK__TUNE_MALLOC=false`` (medians of 3 interleaved rounds, 2026-11-29:
    ``python benchmarks/aggregate_queries.py DATASET q1|q2|q3 xarray OUT.parquet``)."""
    if _MALLOC is None and config.get("tune-malloc"):
        tune_malloc(arenas=False)


#: Whether each pass on local threads first puts the objects then alive out of the garbage
#: collector's reach (``tune_gc``).
_FREEZE_GC = False


def tune_gc() -> None:
    """Before each pass on this process's threads, the objects then alive (the command's imports:
    numpy, dask, ~48,000 objects the collector follows) are moved out of the collector's reach
    (``gc.freeze``). A full collection during a pass walked them all, 10-13 ms with the GIL held,
    while the pass's threads waited for it. The report on 30 M agents: 2% faster within one
    process; as a whole process, 1.31x the read-and-decode floor against 1.39x, 1.33x and 1.38x
    without it, and even in a fourth comparison (medians of 15-21 interleaved rounds,
    2026-11-26). For the command line's own process: a library leaves its caller's collector
    alone."""
    global _FREEZE_GC
    _FREEZE_GC = True


# --- running --------------------------------------------------------------------------------
def thread_pool(threads: int, name: str) -> ThreadPoolExecutor:
    """A few threads of the caller's own, outside any graph (``name``: their threads' prefix): work
    that overlaps a few waits or a pipeline of two steps (opening a dataset's metadata objects at
    once, a table parsed beside the others, chunks encoded while the next are generated). Work
    over a dataset's chunks, files or byte ranges is a graph run by :func:`compute` instead. The
    one place besides :func:`compute`'s own pool where the package starts threads (the store's
    read-ahead, :mod:`l5dask.core.diskread`, which this module imports, keeps its own)."""
    return ThreadPoolExecutor(max(1, int(threads)), thread_name_prefix=name)


def threads_scheduler(scheduler: Any) -> Any:
    """``scheduler`` as ``dask.compute`` takes it, dask's threaded scheduler as the function itself
    for its names (``"threads"``, ``"threading"``), so that a run on it takes a pool of its own
    (``_local_pool``); any other scheduler as given."""
    if isinstance(scheduler, str) and scheduler in ("threads", "threading"):
        from dask.threaded import get as threaded_get

        return threaded_get
    return scheduler


@contextlib.contextmanager
def _local_pool(kw: dict, threads: int | None) -> Iterator[dict]:
    """``kw`` with a pool of this run's own for dask's threaded scheduler (``threads`` threads,
    else one a core), shut down before the run returns or raises: when a task fails no other task
    is still running (writing an output the caller is about to remove); Ctrl-C stops the reads in
    flight and the tasks not started. Other schedulers: ``kw`` as it is.

    dask's names for its threaded scheduler (``"threads"``, ``"threading"``) are that scheduler
    (:func:`threads_scheduler`): ``Job(scheduler="threads")`` ran on dask's shared pool, which a
    failed task or Ctrl-C left running. Without ``threads``, dask's ``num_workers`` config sizes the
    pool, as it sizes dask's own."""
    import dask

    local_malloc()  # (tasks run in this process: on its threads, or on its own with "sync")
    kw = {**kw, "scheduler": threads_scheduler(kw["scheduler"])} if "scheduler" in kw else kw
    if kw.get("scheduler") is not threads_scheduler("threads") or "pool" in kw:
        yield kw
        return
    if _FREEZE_GC:
        import gc

        gc.collect(1)  # (the young garbage first: what is frozen is never collected)
        gc.freeze()
    CANCELLED.clear()
    pool = ThreadPoolExecutor(threads or dask.config.get("num_workers", None) or os.cpu_count() or 1)
    try:
        yield {**kw, "pool": _Ahead(pool)}
    except KeyboardInterrupt:
        # stop the reads in flight and the tasks not started; the running ones end at once
        cancel_reads()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)  # (the tasks queued ahead never start)
        raise
    finally:
        pool.shutdown(wait=True)


#: Tasks dask's threaded scheduler keeps submitted per thread of a local run's pool (see
#: :class:`_Ahead`).
TASKS_AHEAD = 2


class _Ahead:
    """A local run's pool as dask's threaded scheduler takes it, with ``TASKS_AHEAD`` tasks
    submitted a thread instead of one: the scheduler keeps as many tasks submitted as the pool's
    ``_max_workers`` (what ``dask.threaded.get`` reads of it), so that with one a thread each
    thread that finishes a task waited, idle, for this process's main thread to take its result
    and submit the next (a wake-up and the GIL, taken from the other threads' Python). py-spy of
    ``l5dask.aggregate`` on 30 M agents on a crowded 2-core machine: each thread idle in the pool's
    queue for stretches of 100-250 ms with one a thread, none of them with two (issue 46); a task
    queued ahead holds nothing until it starts (it reads its chunks then)."""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self.pool = pool
        self._max_workers = pool._max_workers * TASKS_AHEAD

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        return self.pool.submit(fn, *args, **kwargs)


@contextlib.contextmanager
def _progress_bar(progress: bool, label: str) -> Iterator[None]:
    """The progress of a local run on stderr, named ``label``, if asked for (``l5dask.core.progress``)."""
    if not progress:
        yield
        return
    with Progress(label):
        yield


def persist(
    collections: list,
    client: Any = None,
    progress: bool = False,
    threads: int | None = None,
    label: str = "compute",
    **kw: Any,
) -> list:
    """Persist on ``client`` if given (results stay on the workers), else locally on the threads
    of :func:`compute` (there, persisting runs the tasks before it returns, its progress named
    ``label``)."""
    import dask

    if not collections:
        return []
    if client is not None:
        return list(client.persist(collections))
    with _local_pool(kw, threads) as kw, _progress_bar(progress, label):
        return list(dask.persist(*collections, **kw))


def compute(
    collection: Any,
    client: Any = None,
    progress: bool = False,
    threads: int | None = None,
    label: str = "compute",
    **kw: Any,
) -> Any:
    """Compute on ``client`` if given, else with dask's scheduler; ``progress``: on stderr, named
    ``label`` (``l5dask.core.progress``).

    On local threads the tasks run in a pool of this call's own (``threads`` of them, else one a
    core): see ``_local_pool``."""
    import dask

    if client is None:
        with _local_pool(kw, threads) as kw, _progress_bar(progress, label):
            return dask.compute(collection, **kw)[0]
    futures = client.compute(collection)
    if progress:
        on_cluster([futures], label, tasks=len(collection.__dask_graph__()))
    return client.gather(futures)


def renamed_keyword(old: str, new: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """``func`` (whose keyword is ``new``) also taking its old name ``old`` for one release: it
    warns (``FutureWarning``, naming ``new``) and is passed as ``new``; both given are refused in
    one line. The signature shows ``new`` only."""

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        name = func.__qualname__

        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            if old in kwargs:
                if new in kwargs:
                    raise UsageError(f"{name}: give {new}= only ({old}= is its old name)")
                warnings.warn(
                    f"{name}: {old}= is deprecated and will be removed in the next release; pass {new}=",
                    FutureWarning,
                    stacklevel=2,
                )
                kwargs[new] = kwargs.pop(old)
            return func(*args, **kwargs)

        return wrapper

    return decorate
