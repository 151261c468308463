"""Where a job runs: the embedded default, or an existing dask.distributed cluster.

The embedded default is dask's threaded scheduler on this machine's cores: see the
README ("Where it runs") for the measurement behind that choice. With a scheduler
address (``--scheduler``, ``DASK_SCHEDULER_ADDRESS`` or dask's ``scheduler-address``
config) the same graph runs on that cluster; workers read chunks from the store
themselves, so no chunk bytes pass through the scheduler (the client reads the metadata and
the small sources it keeps, such as the scenes: ``Job.read``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, ContextManager

from l5dask.core.store import CANCELLED, cancel_reads
from l5dask.errors import ClusterError, L5DaskError

#: Environment for dask worker processes (set it on the nanny, or in ``cluster/dask.yaml``).
#: dask's default ``MALLOC_TRIM_THRESHOLD_=65536`` switches off glibc's adaptive mmap
#: threshold, so every multi-MB chunk and temporary becomes a fresh mmap that page-faults:
#: the report ran 3.5x slower per worker process here. These keep allocations under 64 MB on
#: the heap, give back freed heap above 8 MB, and hold two heaps ("arenas") per process instead
#: of one per thread: each arena kept up to its trim threshold of freed chunk buffers, and the
#: report's peak RSS at 1 G agents went from 274 MB to 191 MB (128 MB trim threshold and as many
#: arenas as threads before), with the same speed (`benchmarks/scale_benchmark.py`).
WORKER_ENV = {
    "MALLOC_TRIM_THRESHOLD_": str(8 * 2**20),
    "MALLOC_MMAP_THRESHOLD_": str(64 * 2**20),
    "MALLOC_ARENA_MAX": "2",
}


def on_this_machine(client: Any) -> bool:
    """Whether every worker of ``client`` (a ``distributed.Client``) runs on this machine (a local
    cluster: loopback addresses), so that a folder of this process's is theirs too."""
    try:
        workers = client.scheduler_info()["workers"]
    except Exception:  # noqa: BLE001 - unknown: no
        return False
    hosts = {str(w.get("host", "")) for w in workers.values()}
    return bool(hosts) and hosts <= {"127.0.0.1", "localhost", "::1"}


def tune_malloc() -> bool:
    """:data:`WORKER_ENV`'s two settings for this process (glibc's ``mallopt``), unless the
    environment sets them: the CLI's embedded default reads multi-MB blocks (CSV ranges, chunk
    runs), each a fresh mmap that page-faults when above glibc's threshold (1.3 GB of CSV read in
    32 MB blocks: 1-1.6 GB/s; in 8 MB blocks, from a reused heap: 4-10 GB/s). Returns whether it
    applied them."""
    import ctypes
    import os

    if any(k in os.environ for k in WORKER_ENV):
        return False
    try:
        # this process's own symbols, libc's among them (ctypes.util.find_library runs ldconfig: 3 ms)
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    params = {"MALLOC_TRIM_THRESHOLD_": -1, "MALLOC_MMAP_THRESHOLD_": -3, "MALLOC_ARENA_MAX": -8}  # <malloc.h>
    return all([bool(mallopt(params[k], int(v))) for k, v in WORKER_ENV.items()])


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


#: dask configuration for the workers (also in ``cluster/dask.yaml``): their statistical profiler
#: samples every thread 100 times a second, 8% of a worker's CPU on the report here.
WORKER_CONFIG = {"distributed.worker.profile.enabled": False}


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
    import dask

    dist = sys.modules.get("distributed")  # (not imported: no worker runs this)
    if dist is None or not dask.config.get("l5dask.secede-on-wait", True):
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


def scheduler_address(address: str | None = None) -> str | None:
    """The address to use: the argument, else dask's config (``DASK_SCHEDULER_ADDRESS``)."""
    import dask

    return address or dask.config.get("scheduler-address", None) or None


@contextlib.contextmanager
def connect(address: str | None = None, quiet: bool = False) -> Iterator[Any]:
    """A ``distributed.Client`` for ``address`` (None: no client, the embedded default).

    Connection failures and a scheduler lost mid-job become :class:`L5DaskError`;
    ``quiet`` silences distributed's own logging of them (the CLI says it in one line).
    """
    address = scheduler_address(address)
    if not address:
        yield None
        return
    import dask
    from distributed import Client

    if quiet:
        for name in [n for n in logging.root.manager.loggerDict if n.startswith("distributed")] + ["distributed"]:
            logging.getLogger(name).setLevel(logging.CRITICAL)

    try:
        # how long to wait: dask's distributed.comm.timeouts.connect (cluster/dask.yaml, or
        # DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT)
        client = Client(address, timeout=dask.config.get("distributed.comm.timeouts.connect"), set_as_default=True)
    except (OSError, TimeoutError) as exc:
        raise ClusterError(f"cannot connect to the dask scheduler at {address}: {_short(exc)}") from None
    try:
        yield client
    except L5DaskError:
        raise
    except Exception as exc:  # noqa: BLE001 - classify what distributed raised
        if _lost(client, exc):
            raise ClusterError(
                f"lost the connection to the dask scheduler at {address} ({type(exc).__name__}); no output was written"
            ) from None
        raise
    finally:
        with contextlib.suppress(Exception):
            client.close(timeout=5)


def warm_workers(client: Any, fn: Callable[..., Any], *args: Any) -> list:
    """Start ``fn(*args)`` once on each worker of ``client`` (None: nothing), not waited for: what a
    worker's first task of a job pays (its imports, a store's filesystem and its first connections)
    paid while this process still opens what the job reads.

    On 2 worker processes and an S3 endpoint that answers after 50 ms, the report's first task
    (the scenes) took 0.42-0.64 s, then 0.08-0.27 s with this. Keep the futures until the job's
    own tasks are submitted (a future let go before its task ran cancels it). Errors are ignored:
    the job's own tasks meet them again and say them."""
    if client is None:
        return []
    import uuid

    try:
        workers = list(client.scheduler_info()["workers"])
        return [
            client.submit(
                _quietly, fn, *args, key=f"l5-warm-{uuid.uuid4().hex}", workers=[w], allow_other_workers=False
            )
            for w in workers
        ]
    except (OSError, KeyError, TimeoutError):
        return []  # (the job's own calls say what is wrong with the cluster)


def _quietly(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - only a warm-up: the job's tasks say what is wrong
        pass


def dashboard_link(client: Any) -> str | None:
    """The scheduler's dashboard link as dask gives it (None if it cannot say)."""
    try:
        return client.dashboard_link
    except (KeyError, AttributeError, OSError):
        return None


def _lost(client: Any, exc: BaseException) -> bool:
    from concurrent.futures import CancelledError

    from distributed.comm.core import CommClosedError

    return isinstance(exc, (CommClosedError, CancelledError, OSError, TimeoutError)) or client.status != "running"


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


@contextlib.contextmanager
def _local_pool(kw: dict, threads: int | None) -> Iterator[dict]:
    """``kw`` with a pool of this run's own for dask's threaded scheduler (``threads`` threads,
    else one a core), shut down before the run returns or raises: when a task fails no other task
    is still running (writing an output the caller is about to remove); Ctrl-C stops the reads in
    flight and the tasks not started. Other schedulers: ``kw`` as it is."""
    from dask.threaded import get as threaded_get

    if kw.get("scheduler") is not threaded_get or "pool" in kw:
        yield kw
        return
    import os
    from concurrent.futures import ThreadPoolExecutor

    if _FREEZE_GC:
        import gc

        gc.collect(1)  # (the young garbage first: what is frozen is never collected)
        gc.freeze()
    CANCELLED.clear()
    pool = ThreadPoolExecutor(threads or os.cpu_count() or 1)
    try:
        yield {**kw, "pool": pool}
    except KeyboardInterrupt:
        # stop the reads in flight and the tasks not started; the running ones end at once
        cancel_reads()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=True)


@contextlib.contextmanager
def _progress_bar(progress: bool) -> Iterator[None]:
    """dask's progress bar on stderr around a local run, if asked for."""
    if not progress:
        yield
        return
    from dask.diagnostics import ProgressBar

    with ProgressBar(out=sys.stderr, dt=0.5):
        yield


def persist(
    collections: list, client: Any = None, progress: bool = False, threads: int | None = None, **kw: Any
) -> list:
    """Persist on ``client`` if given (results stay on the workers), else locally on the threads
    of :func:`compute` (there, persisting runs the tasks before it returns)."""
    import dask

    if not collections:
        return []
    if client is not None:
        return list(client.persist(collections))
    with _local_pool(kw, threads) as kw, _progress_bar(progress):
        return list(dask.persist(*collections, **kw))


def compute(collection: Any, client: Any = None, progress: bool = False, threads: int | None = None, **kw: Any) -> Any:
    """Compute on ``client`` if given (with a progress bar on stderr), else with dask's scheduler.

    On local threads the tasks run in a pool of this call's own (``threads`` of them, else one a
    core): see ``_local_pool``."""
    import dask

    if client is None:
        with _local_pool(kw, threads) as kw, _progress_bar(progress):
            return dask.compute(collection, **kw)[0]
    futures = client.compute(collection)
    if progress:
        from distributed import progress as show

        with contextlib.redirect_stdout(sys.stderr):
            show(futures)
            print(file=sys.stderr)
    return client.gather(futures)
