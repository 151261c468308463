"""Where a job runs: the embedded default, or an existing dask.distributed cluster (connecting
to it, warming its workers, their environment). How a graph is run there (pools, sizing,
waits, tuning) is :mod:`l5dask.core.policy`'s.

The embedded default is dask's threaded scheduler on this machine's cores: see the
README ("Where it runs") for the measurement behind that choice. With a scheduler
address (``--scheduler``, ``DASK_SCHEDULER_ADDRESS`` or dask's ``scheduler-address``
config) the same graph runs on that cluster; workers read chunks from the store
themselves, so no chunk bytes pass through the scheduler (the client reads the metadata and
the small sources it keeps, such as the scenes: ``Job.read``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

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


#: dask configuration for the workers (also in ``cluster/dask.yaml``): their statistical profiler
#: samples every thread 100 times a second, 8% of a worker's CPU on the report here.
WORKER_CONFIG = {"distributed.worker.profile.enabled": False}


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


#: What serves dask's dashboard, where the scheduler runs (distributed's own requirement, bokeh>=3.1.0).
DASHBOARD_INSTALL = "pip install 'l5dask[dashboard]' (or bokeh>=3.1.0) where the scheduler runs"


def dashboard(client: Any) -> str:
    """Where the scheduler's dashboard is: its link when it serves one, else one line saying why
    not and what to install. (A scheduler without bokeh, or with one older than dask needs, still
    names a link: it opens a page saying "Dask needs bokeh>=3.1.0".)"""

    def serves(dask_scheduler: Any = None) -> tuple[bool, str | None]:  # (run on the scheduler)
        import sys

        if "distributed.dashboard.scheduler" in sys.modules:  # (imported only when it serves)
            return True, None
        try:
            import bokeh
        except ImportError:
            return False, None
        return False, str(bokeh.__version__)

    link = dashboard_link(client)
    try:
        served, bokeh = client.run_on_scheduler(serves)
    except Exception:  # noqa: BLE001 - a scheduler that runs no code of its clients: say the link
        return link or "unknown (the scheduler names none)"
    if served:
        return link or "unknown (the scheduler names none)"
    if bokeh is None:
        return f"none (the scheduler has no bokeh: {DASHBOARD_INSTALL})"
    from distributed.versions import BOKEH_REQUIREMENT

    if not BOKEH_REQUIREMENT.specifier.contains(bokeh, prereleases=True):
        return f"none (the scheduler's bokeh is {bokeh}: {DASHBOARD_INSTALL})"
    return "none (the scheduler serves none: started with --no-dashboard?)"


def _lost(client: Any, exc: BaseException) -> bool:
    from concurrent.futures import CancelledError

    from distributed.comm.core import CommClosedError

    return isinstance(exc, (CommClosedError, CancelledError, OSError, TimeoutError)) or client.status != "running"


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
