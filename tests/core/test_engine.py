"""The engine itself, with toy reductions: order, one decode per chunk, O(chunks) tasks, parent
rows routed only to the child tasks that overlap them, threads against a real cluster, task
sizing, and the job's map and map_reduce."""

from __future__ import annotations

import os

import dask
import numpy as np
import pytest
from distributed import Client
from hypothesis import given, settings
from hypothesis import strategies as st

import l5dask
from l5dask.core import engine
from l5dask.core.engine import Combine, Job, Link, Pass, Reduction, Rows
from l5dask.prediction import format as fmt
from tests.conftest import read_all


def _cat(a, b):
    return a + b


#: Non-commutative: the chunk starts, in the order the combines saw them.
STARTS = Reduction("starts", lambda data, start, parent: [(start, len(data))], _cat, list)


def _frame_rows(frames, offset, parent):
    return Rows(
        offset,
        {"start": np.ascontiguousarray(frames["agent_index_interval"][:, 0]), "timestamp": frames["timestamp"].copy()},
    )


def _agent_ts(agents, lo, frames: Rows):
    """Per agent: its frame's timestamp, found in the parent rows handed to the task."""
    return [frames["timestamp"][frames.locate(lo, lo + len(agents), "start")]]


AGENT_TS = Reduction("agent-ts", _agent_ts, _cat, list, finalize=lambda parts: np.concatenate(parts))


@pytest.mark.parametrize("chunks_per_task,split_every", [(1, 2), (3, 3), (None, None)])
def test_ordered_combine_is_in_row_order(small_ds, chunks_per_task, split_every):
    import dask

    ds = l5dask.open_dataset(small_ds)
    agents = ds[fmt.AGENTS]
    want = [agents.chunk_bounds(i) for i in range(agents.nchunks)]
    with dask.config.set(split_every=split_every):
        got = Job(chunks_per_task=chunks_per_task).compute([Pass(agents, STARTS)])[0]
    assert [(s, s + n) for s, n in got] == want


def _counting(monkeypatch):
    import l5dask.prediction.reading as reading

    calls = []
    original = reading.decode_chunk
    monkeypatch.setattr(reading, "decode_chunk", lambda *a, **kw: calls.append((a[1].name, a[3])) or original(*a, **kw))
    return calls


@pytest.mark.parametrize("held", [True, False])
def test_parent_pass_routes_rows_and_decodes_each_chunk_once(small_ds, monkeypatch, held):
    if not held:  # (rows over the budget: made again by the agent tasks that need them)
        monkeypatch.setattr(engine, "HELD_ROWS_BYTES", 0)
    ds = l5dask.open_dataset(small_ds)
    ref = read_all(small_ds)
    calls = _counting(monkeypatch)
    job = Job(chunks_per_task=2)
    frames = Pass(ds[fmt.FRAMES], STARTS, rows=_frame_rows, intervals={"agent_index_interval": len(ds[fmt.AGENTS])})
    (done,) = job.persist(frames)
    child = Pass(ds[fmt.AGENTS], AGENT_TS, parent=done.link("agent_index_interval", "start"))
    frame_starts, got = job.compute([done, child])
    fiv = ref["frames"]["agent_index_interval"]
    want = np.repeat(ref["frames"]["timestamp"], fiv[:, 1] - fiv[:, 0])
    np.testing.assert_array_equal(got, want)
    assert [s for s, _ in frame_starts] == [ds[fmt.FRAMES].chunk_bounds(i)[0] for i in range(ds[fmt.FRAMES].nchunks)]
    # agents decoded once; frames once when the pass holds its rows (within the budget), else
    # twice: by the pass, and again for the rows each agent task needs
    names = (fmt.FRAMES, fmt.AGENTS) + (() if held else (fmt.FRAMES,))
    expected = sorted((n, str(i)) for n in names for i in range(ds[n].nchunks))
    assert sorted(calls) == expected
    blocks = dask.compute(*done.collections)
    if held:
        assert done.remake is None and all(b.rows is not None for b in blocks)
    else:
        assert done.remake is not None and all(b.rows is None for b in blocks)


def test_a_local_persist_takes_the_interval_bounds_from_its_blocks(small_ds, monkeypatch):
    """Persisted on local threads, a pass's blocks are held here: their interval bounds are taken
    from them, without a compute (and a thread pool) of its own; the same bounds as fetched where
    the blocks are (on a cluster), and a bad interval still refused."""
    ds = l5dask.open_dataset(small_ds)
    computes = []
    compute = engine.compute
    monkeypatch.setattr(engine, "compute", lambda *a, **kw: computes.append(a) or compute(*a, **kw))
    job = Job(chunks_per_task=2)
    spec = Pass(ds[fmt.FRAMES], STARTS, rows=_frame_rows, intervals={"agent_index_interval": len(ds[fmt.AGENTS])})
    (done,) = job.persist(spec)
    assert computes == []
    fetched = job._fetch_bounds([done])
    assert len(fetched) == len(done.keys) and len(computes) == 1
    np.testing.assert_array_equal(
        done.bounds["agent_index_interval"], np.concatenate([b["agent_index_interval"] for b in fetched])
    )
    assert len(done.bounds["agent_index_interval"]) == ds[fmt.FRAMES].nchunks
    short = Pass(ds[fmt.FRAMES], STARTS, intervals={"agent_index_interval": len(ds[fmt.AGENTS]) - 1})
    with pytest.raises(l5dask.IntervalError, match="agent_index_interval"):
        job.persist(short)


@pytest.mark.parametrize("held", [True, False])
def test_child_tasks_depend_on_exactly_the_overlapping_parent_blocks(small_ds, monkeypatch, held):
    """Each child task's dependencies are the parent blocks whose agent ranges overlap its rows
    (held, or the tasks that make their rows again), computed here from the reference arrays; the
    graph has O(chunks) tasks."""
    if not held:
        monkeypatch.setattr(engine, "HELD_ROWS_BYTES", 0)
    ds = l5dask.open_dataset(small_ds)
    fiv = read_all(small_ds)["frames"]["agent_index_interval"]
    job = Job(chunks_per_task=1)
    frames = Pass(ds[fmt.FRAMES], rows=_frame_rows, intervals={"agent_index_interval": len(ds[fmt.AGENTS])})
    (done,) = job.persist(frames)
    child = Pass(ds[fmt.AGENTS], AGENT_TS, parent=done.link("agent_index_interval", "start"))
    graph, _, groups = job.leaves(child, "child")
    block_rows = [ds[fmt.FRAMES].chunk_bounds(f) for f, _ in done.groups]
    # each parent block's rows made once, or held
    assert len(graph) == len(groups) + (0 if held else len(done.keys))
    for i, (first, n) in enumerate(groups):
        lo, hi = ds[fmt.AGENTS].chunk_bounds(first)[0], ds[fmt.AGENTS].chunk_bounds(first + n - 1)[1]
        keys = done.keys if held else [t.key for t in done.remake]
        want = {keys[k] for k, (a, b) in enumerate(block_rows) if b > a and fiv[a, 0] < hi and fiv[b - 1, 1] > lo}
        assert set(graph[("child", i)].dependencies) == want and len(want) < len(done.keys)
    reduce_graph: dict = {}
    root = engine.tree_reduce(reduce_graph, "r", [("child", i) for i in range(len(groups))], AGENT_TS, split_every=4)
    assert root in reduce_graph and len(reduce_graph) <= len(groups) // 3 + 2
    assert all(len(t.dependencies) <= 4 for t in reduce_graph.values())


def test_rows_in_memory_reach_only_their_slice(small_ds):
    """A parent held in memory (the scenes) is sliced per task: each task carries only its rows."""
    ds = l5dask.open_dataset(small_ds)
    ref = read_all(small_ds)
    siv = ref["scenes"]["frame_index_interval"]
    rows = Rows(0, {"start": siv[:, 0].copy(), "scene": np.arange(len(siv))})

    def scene_of(frames, lo, scenes):
        return [scenes["scene"][scenes.locate(lo, lo + len(frames), "start")]]

    red = Reduction("scene-of", scene_of, _cat, list, finalize=np.concatenate)
    spec = Pass(ds[fmt.FRAMES], red, parent=Link(rows, "start"))
    job = Job(chunks_per_task=1)
    graph, _, groups = job.leaves(spec, "t")
    for task in graph.values():
        (arg,) = [a for a in task.args if isinstance(a, Rows)]
        assert 0 < len(arg) < len(siv)  # a slice of the scenes, not all of them
    (got,) = job.compute([spec])
    np.testing.assert_array_equal(got, np.repeat(np.arange(len(siv)), siv[:, 1] - siv[:, 0]))


def test_errors_name_the_array_and_chunk(small_ds):
    ds = l5dask.open_dataset(small_ds)

    def boom(data, start, parent):
        if start == ds[fmt.AGENTS].chunk_bounds(3)[0]:
            raise ValueError("bad value")
        return []

    with pytest.raises(ValueError, match="bad value") as info:
        Job(chunks_per_task=1).compute([Pass(ds[fmt.AGENTS], Reduction("boom", boom, _cat, list))])
    assert "of 'agents', chunk 3" in "".join(info.value.__notes__)


def test_same_result_on_threads_and_a_real_cluster(small_ds, dask_cluster):
    ds = l5dask.open_dataset(small_ds)

    def run(job):
        (done,) = job.persist(
            Pass(ds[fmt.FRAMES], STARTS, rows=_frame_rows, intervals={"agent_index_interval": len(ds[fmt.AGENTS])})
        )
        child = Pass(ds[fmt.AGENTS], AGENT_TS, parent=done.link("agent_index_interval", "start"))
        return job.compute([done, child, Pass(ds[fmt.AGENTS], STARTS)])

    local = run(Job())
    with Client(dask_cluster.address, set_as_default=False) as client:
        remote = run(Job(scheduler=client))
        ran = client.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.task_prefixes))
    assert local[0] == remote[0] and local[2] == remote[2]
    np.testing.assert_array_equal(local[1], remote[1])
    assert any(p.startswith("l5-agents") for p in ran) and any(p.startswith("l5-frames-pass") for p in ran)


def test_task_sizing_by_scheduler():
    """Local threads: many small tasks (scheduling is cheap); dask.distributed: fewer, larger ones;
    always at least one chunk a task, and enough tasks for every thread while chunks last."""
    from l5dask.core.policy import auto_chunks_per_task as size

    assert size(1502, threads=2) == 8 and size(1502, threads=2, scheduler="distributed") == 64
    assert size(133_000, threads=400, scheduler="distributed") == 133_000 // (8 * 400)  # train_full, 400 threads
    assert size(10, threads=8, scheduler="distributed") == 1 and size(0, threads=2) == 1
    for n in (1, 7, 100, 5000):
        for threads in (1, 2, 16):
            for scheduler in ("threads", "distributed"):
                k = size(n, threads=threads, scheduler=scheduler)
                assert 1 <= k <= 64 and (-(-n // k) >= threads or k == 1)


def test_a_pass_streaming_a_local_store_takes_larger_tasks_on_local_threads():
    """On local threads a pass that streams its chunks from a local store, or gathers its columns
    from their compressed bytes, takes up to 32 a task; block tasks of records, a store of
    requests (an object store) and a cluster keep their sizes; an asked size wins; the size is
    part of the tasks' names."""
    from dask.threaded import get

    from l5dask.core.engine import Job, Pass

    class Source:
        name, nchunks = "agents", 1502

        def __init__(self, remote: bool) -> None:
            self.remote = remote

    local, remote = Source(False), Source(True)
    job = Job(scheduler=get)
    job.threads = 2
    assert job.per_task(Pass(local)) == 32 and job.per_task(Pass(local, encoded=True)) == 32
    assert job.per_task(Pass(local, blocks=True)) == 8 and job.per_task(Pass(remote)) == 8
    assert job.per_task(Pass(local, blocks=True, encoded=True)) == 32  # (an aggregation's, a fused pass's)
    assert job.per_task(Pass(remote, blocks=True, encoded=True)) == 8
    eight = Job(scheduler=get, chunks_per_task=8)
    eight.threads = 2
    assert job.token(Pass(local)) != eight.token(Pass(local))  # (keys of tasks of other sizes differ)
    assert job.token(Pass(local, blocks=True)) == eight.token(Pass(local, blocks=True))
    job.scheduler_kind = "distributed"
    assert job.per_task(Pass(local)) == 64 == job.per_task(Pass(remote))
    assert Job(scheduler=get, chunks_per_task=5).per_task(Pass(local)) == 5
    small = Job(scheduler=get, size_for=40)
    small.threads = 2
    # sized for the job's dominant pass, its chunks to the next power of two (stable as it grows)
    assert small.per_task(Pass(local)) == 2  # (64 over 16 tasks a thread on 2 threads)
    small.size_for = 33
    assert small.per_task(Pass(local)) == 2
    small.size_for = 32
    assert small.per_task(Pass(local)) == 1


def test_task_groups_cover_every_chunk_once_and_shrink_at_the_end():
    from l5dask.core.policy import task_groups

    for nchunks, per_task, threads in [(0, 8, 2), (1, 64, 2), (10, 3, 2), (1502, 64, 2), (1502, 8, 2), (777, 9, 3)]:
        groups = task_groups(nchunks, per_task, threads)
        assert [f for f, _ in groups] == list(np.cumsum([0] + [n for _, n in groups])[:-1])
        assert sum(n for _, n in groups) == nchunks
        sizes = [n for _, n in groups]
        assert all(1 <= n <= per_task for n in sizes) and sizes == sorted(sizes, reverse=True) or nchunks == 0
        assert all(n >= max(1, per_task // 8) for n in sizes[:-1])
    assert [n for _, n in task_groups(1502, 64, 2)][:20] == [64] * 20  # full tasks while plenty remain


def test_map_reduce_merges_in_an_ordered_tree_in_one_compute():
    """Job.map_reduce: the tasks' partials combined by the engine's tree (not on the client), in
    order (a non-commutative combine: concatenation), the identity for no call."""
    import dask

    from l5dask.core.engine import Job, Reduction

    red = Reduction("concat", lambda d, s, p: d, lambda a, b: a + b, lambda: [])
    calls = [(i,) for i in range(37)]
    for fan_in in (2, 4, 40):
        with dask.config.set(split_every=fan_in):
            assert Job().map_reduce(lambda i: [i], calls, red, name="t") == list(range(37))
    assert Job().map_reduce(lambda i: [i], [], red, name="t") == []


def test_map_starts_calls_in_the_order_given_on_local_threads():
    import threading

    started: list[int] = []
    lock = threading.Lock()

    def call(i):
        with lock:
            started.append(i)
        return i * i

    calls = [(i,) for i in range(23)]
    with dask.config.set(num_workers=1):  # one thread: the start order is the order
        assert Job(scheduler="threads").map(call, calls, name="order") == [i * i for i in range(23)]
    assert started == list(range(23))
    started.clear()
    total = Job(scheduler="threads").map_reduce(
        call, calls, Reduction("sum", None, lambda a, b: a + b, lambda: 0), name="order"
    )
    assert total == sum(i * i for i in range(23))


def test_map_and_map_reduce_of_remote_reads_run_more_tasks_at_once():
    """``remote=True`` (tasks that read an object store: the evaluation's row scan and parse, the
    perception tables, lidar, detection blocks, surgery's copies) runs REMOTE_TASKS_PER_CORE tasks
    a core at once on local threads, as a pass over a remote source does; results in order."""
    import threading
    import time

    def task(i, seen):
        seen.add(threading.get_ident())
        time.sleep(0.05)  # (waiting, as for a request)
        return [i]

    cores = os.cpu_count() or 1
    calls = 12 * cores
    with dask.config.set({"l5dask.remote-tasks-per-core": 3}):
        for remote in (False, True):
            seen: set = set()
            got = Job().map(task, [(i, seen) for i in range(calls)], "remote-map", remote=remote)
            assert got == [[i] for i in range(calls)]
            assert (cores < len(seen) <= 3 * cores) if remote else len(seen) <= cores
            seen = set()
            red = Reduction("remote-map-reduce", None, lambda a, b: a + b, list)
            total = Job().map_reduce(task, [(i, seen) for i in range(calls)], red, "remote-mr", remote=remote)
            assert total == list(range(calls))
            assert (cores < len(seen) <= 3 * cores) if remote else len(seen) <= cores


def test_job_on_dask_threads_by_name_runs_in_a_pool_of_its_own():
    """``Job(scheduler="threads")`` (dask's name for its threaded scheduler) runs its tasks in a pool
    of the run's own, shut down when the run returns (as the embedded default's: a failed task or
    Ctrl-C leaves nothing running); it ran on dask's shared pool, whose threads outlive the run."""
    import threading

    ran: list[threading.Thread] = []

    def call(i):
        ran.append(threading.current_thread())
        return i

    for scheduler in ("threads", "threading", None):
        ran.clear()
        assert Job(scheduler=scheduler).map(call, [(i,) for i in range(8)], name="own-pool") == list(range(8))
        assert ran and not any(t.is_alive() for t in ran)


def test_local_threads_keep_a_task_submitted_ahead_of_each_thread():
    """On local threads the scheduler keeps ``TASKS_AHEAD`` tasks submitted a thread: a thread that
    finishes a task takes the next from the pool's queue instead of waiting, idle, for the main
    thread to submit it (issue 46). On one thread, the first task runs with the second submitted
    too (dask's ``pretask`` callback: when a task is submitted); with one task a thread, the
    second was submitted only once the first had ended (the first then waited in vain)."""
    import threading

    from dask.callbacks import Callback

    from l5dask.core.policy import TASKS_AHEAD

    both = threading.Event()
    submitted: list = []

    class Submitted(Callback):
        def _pretask(self, key, dsk, state):
            if isinstance(key, tuple) and key[0].startswith("ahead"):
                submitted.append(key)
                if len(submitted) == 2:
                    both.set()

    def task(i):
        return both.wait(timeout=20)

    assert TASKS_AHEAD >= 2
    with dask.config.set(num_workers=1), Submitted():
        assert Job().map(task, [(0,), (1,)], name="ahead") == [True, True]


def _cat_combine():
    return Combine("cat", _cat, list)


def test_tree_combine_merges_lazy_partials_in_order_through_the_engine_tree():
    """Delayed partials merge in order (a non-commutative combine: a list's concatenation), with
    at most ``split_every`` partials a merge, lazily (building computes nothing), the identity for
    none; ``finalize`` applies the combine's finalize once, at the root."""
    from dask.delayed import delayed

    from tests.conftest import raise_if_dask_computes

    parts = [delayed(lambda i: [i])(i) for i in range(37)]
    combine = Combine("cat", _cat, list, finalize=len)
    with raise_if_dask_computes():
        root = engine.tree_combine(parts, combine, split_every=3)
        counted = engine.tree_combine(parts, combine, split_every=3, finalize=True)
        empty = engine.tree_combine([], combine)
    assert root.compute() == list(range(37)) and counted.compute() == 37 and empty.compute() == []
    graph = dict(root.__dask_graph__())
    merges = {k: t for k, t in graph.items() if k not in {p.key for p in parts}}
    assert all(len(t.dependencies) <= 3 for t in merges.values())
    assert len(merges) == 13 + 5 + 2 + 1  # 37 -> 13 -> 5 -> 2 -> 1, one task a merge
    with dask.config.set(split_every=8):
        assert engine.tree_combine(parts, _cat_combine()).compute() == list(range(37))


def test_map_reduce_takes_a_combine_only_object():
    total = Job().map_reduce(lambda i: [i], [(i,) for i in range(20)], Combine("cat", _cat, list, len), name="c")
    assert total == 20
    assert Job().map_reduce(lambda i: [i], [], Combine("cat", _cat, list, len), name="none") == 0


# --- where to run: scheduler= --------------------------------------------------------------------
def test_scheduler_takes_what_dask_compute_takes_and_a_client_or_its_address(small_ds, dask_cluster):
    """``scheduler=`` read as ``dask.compute`` reads it (a local scheduler's name goes to dask, a
    client runs the job there), plus a client's address, connected through ``get_client`` and
    closed here; the same passes give the same results everywhere."""
    from l5dask.core.policy import default_client

    ds = l5dask.open_dataset(small_ds)

    def run(job):
        return job.compute([Pass(ds[fmt.AGENTS], STARTS), Pass(ds[fmt.FRAMES], STARTS)])

    want = run(Job())
    sync = Job("sync")
    assert sync.client is None and sync.kw == {"scheduler": "sync"} and sync.scheduler_kind == "threads"
    assert run(sync) == want
    on_address = Job(dask_cluster.address)
    try:
        assert on_address.client is not None and on_address.client.scheduler.address == dask_cluster.address
        assert on_address.scheduler_kind == "distributed"
        assert run(on_address) == want
        assert Job(on_address.client).client is on_address.client  # (a Client as it is)
        assert Job("distributed").client is on_address.client  # (dask's name: the active client)
    finally:
        on_address.client.close()
    if default_client() is None:  # (unless another test left a default client)
        with pytest.raises(ValueError, match="no dask.distributed client is active"):
            Job("distributed")
    again = Job(sync, chunks_per_task=3)  # a job's place, sized as asked
    assert again.kw == sync.kw and again.chunks_per_task == 3
    assert Job.of(sync) is sync


def test_the_old_where_keywords_warn_and_run_where_they_did(tmp_path):
    """``client=`` and ``job=`` still work for one release: a ``FutureWarning`` names
    ``scheduler=``, and the result is the one ``scheduler=`` gives; ``scheduler`` wins over them."""
    import warnings

    from l5dask.evaluation import read_gt_csv, write_gt_csv

    rng = np.random.default_rng(0)
    n, t = 2500, 5
    ts, tid = np.arange(n, dtype=np.int64) * 7, rng.integers(0, 50, n)
    coords, avails = rng.normal(size=(n, t, 2)), (rng.random((n, t)) > 0.3).astype(np.float64)
    with pytest.warns(FutureWarning, match=r"write_gt_csv: job= is deprecated.*pass scheduler="):
        write_gt_csv(str(tmp_path / "old.csv"), ts, tid, coords, avails, job=Job("sync"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_gt_csv(str(tmp_path / "new.csv"), ts, tid, coords, avails, scheduler="sync")
        new = read_gt_csv(str(tmp_path / "new.csv"), scheduler="sync")
        new = [np.asarray(a) for a in dask.compute(new.timestamps, new.track_ids, new.coords, new.avails)]
    assert (tmp_path / "old.csv").read_bytes() == (tmp_path / "new.csv").read_bytes()
    with pytest.warns(FutureWarning, match=r"read_gt_csv: job= is deprecated"):
        old = read_gt_csv(str(tmp_path / "old.csv"), job=Job())
    old = dask.compute(old.timestamps, old.track_ids, old.coords, old.avails)
    for a, b in zip(old, new):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(new[2], coords.round(5))
    with pytest.warns(FutureWarning, match=r"^Job: client= is deprecated"):
        job = Job(client=None)
    assert job.kw == Job().kw
    with pytest.warns(FutureWarning, match="client= is deprecated"):
        assert Job(scheduler="sync", client=object()).kw == {"scheduler": "sync"}  # (scheduler wins)


def test_fold_exclusive_makes_each_root_one_task_with_the_tasks_only_it_needs():
    """Each root becomes one task running the tasks only it needs; a task two roots need, and a
    task no root needs, stay tasks of their own; the values are those of the graph unfolded; a
    graph holding a task that is not a task spec node is not folded."""
    from dask.task_spec import Task, TaskRef

    def add(*xs):
        return sum(xs)

    graph = {
        "shared": Task("shared", add, 1, 2),
        "a": Task("a", add, 10),
        "b": Task("b", add, TaskRef("a"), TaskRef("shared")),
        "c": Task("c", add, 100, TaskRef("shared")),
        "other": Task("other", add, 5),
        "r1": Task("r1", add, TaskRef("b"), TaskRef("a")),
        "r2": Task("r2", add, TaskRef("c")),
    }
    folded = engine.fold_exclusive(graph, ["r1", "r2"])
    assert set(folded) == {"shared", "other", "r1", "r2"}
    assert set(folded["r1"].dependencies) == {"shared"} and set(folded["r2"].dependencies) == {"shared"}
    want = dask.get(graph, ["r1", "r2"])
    assert dask.get(folded, ["r1", "r2"]) == want == (23, 103)
    assert engine.fold_exclusive({**graph, "legacy": (add, 1)}, ["r1", "r2"]) is None


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 6), st.integers(0, 3), st.integers(0, 40)), min_size=1, max_size=30),
    st.booleans(),
    st.lists(st.tuples(st.integers(-3, 130), st.integers(0, 20)), min_size=1, max_size=10),
)
def test_a_persisted_pass_names_the_chunks_overlapping_rows_as_its_definition(table, ordered, asked):
    """``Persisted.chunks`` (a child task's parent chunks, for its cache key): the chunks with rows
    whose child rows overlap ``[lo, hi)``, as the scan of the bounds table defines it, whether the
    chunks' starts and ends are in order (then found by bisection) or not."""
    if ordered:  # (consecutive child rows, as checked intervals give them)
        starts = np.cumsum([0] + [n for n, _, _ in table[:-1]])
        t = np.array([(s, s + n, rows) for s, (n, rows, _) in zip(starts, table)], dtype=np.int64)
    else:
        t = np.array([(s, s + n, rows) for n, rows, s in table], dtype=np.int64)
    p = engine.Persisted(spec=None, keys=[], collections=[], groups=[], bounds={"i": t}, row_ids=["x"] * len(t))
    for lo, width in asked:
        expected = np.flatnonzero((t[:, 2] > 0) & (t[:, 0] < lo + width) & (t[:, 1] > lo))
        assert p.chunks("i", lo, lo + width).tolist() == expected.tolist()


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 6), min_size=1, max_size=12),
    first=st.integers(0, 8),
    lo=st.integers(0, 40),
    size=st.integers(0, 30),
)
def test_rows_runs_locate_and_spread_agree_with_searchsorted(lengths, first, lo, size):
    """``Rows.runs``: each parent row's child rows within ``[lo, hi)``, in order (parents with no
    child row, a range that starts or ends inside a parent), the positions numpy's
    ``searchsorted(starts, rows, side="right") - 1`` gives, counted; ``None`` where a row has no
    parent among them (before the first one's first child) or the range is empty. ``locate`` and
    ``spread`` are those positions and the values taken at them, either way."""
    starts = first + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    rows = Rows(5, {"start": starts, "v": np.arange(len(starts)) * 10})
    hi = lo + size
    pos = np.searchsorted(starts, np.arange(lo, hi), side="right") - 1
    runs = rows.runs(lo, hi, "start")
    if size == 0 or starts[0] > lo:
        assert runs is None
    else:
        assert runs is not None and (pos >= 0).all()
        np.testing.assert_array_equal(runs, np.bincount(pos, minlength=len(starts)))
    np.testing.assert_array_equal(rows.locate(lo, hi, "start"), pos)
    np.testing.assert_array_equal(rows.spread(lo, hi, "start", rows["v"]), rows["v"][pos])


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_tasks_parent_rows_are_the_overlapping_rows_of_its_blocks_joined(data):
    """``task_parent`` joins, of the parent blocks it is given, only the rows that overlap its own
    child rows: the same rows (offset, columns) as every block joined and then cut to them."""
    sizes = data.draw(st.lists(st.integers(0, 6), min_size=1, max_size=5))
    runs = data.draw(st.lists(st.integers(0, 4), min_size=sum(sizes), max_size=sum(sizes)))
    starts = np.concatenate([[0], np.cumsum(runs)[:-1]]).astype(np.int64) if runs else np.zeros(0, np.int64)
    nchild = int(sum(runs))
    blocks, at = [], 0
    for n in sizes:
        cols = {"start": starts[at : at + n], "v": np.arange(at, at + n, dtype=np.float64)}
        blocks.append(engine.Block(None, Rows(at + 5, cols), None))
        at += n
    if not nchild:
        return
    lo = data.draw(st.integers(0, nchild - 1))
    hi = data.draw(st.integers(lo + 1, nchild))

    class Source:
        def chunk_bounds(self, i):
            return (lo, hi)

    stage = engine.Stage("t", Source(), None, None, {}, False, False, "start")
    got = engine.task_parent(stage, 0, 1, None, tuple(blocks))
    exp = Rows.concat([b.rows for b in blocks]).overlapping(lo, hi, "start")
    assert got.offset == exp.offset
    for k in ("start", "v"):
        np.testing.assert_array_equal(got.cols[k], exp.cols[k])


def test_the_parents_of_child_rows_count_them_and_a_row_before_every_parent_is_refused():
    rows = Rows(10, {"start": np.array([5, 8, 8, 12], np.int64)})
    child = np.array([5, 7, 8, 30, 31])
    counts = rows.parents_of(child, "start")
    np.testing.assert_array_equal(counts, [2, 0, 1, 2])
    np.testing.assert_array_equal(np.repeat(np.arange(4), counts), np.searchsorted(rows["start"], child, "right") - 1)
    np.testing.assert_array_equal(rows.parents_of(np.zeros(0, np.int64), "start"), [0, 0, 0, 0])
    with pytest.raises(ValueError, match="child row 4 has no parent among rows from 10"):
        rows.parents_of(np.array([4, 9]), "start")
