"""Planning and running the statistics report: graph building, apart from the maths in
:mod:`l5dask.stats`. Outputs are written atomically."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from operator import getitem
from typing import Any

import functools

import dask
import numpy as np
from dask.base import tokenize
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph

from . import format as fmt
from .errors import L5DaskError
from .joins import block_bounds, check_bounds, interval_problems, raise_first
from .cluster import compute, persist
from .reading import L5Dataset, iter_chunks, open_dataset, read_block
from .stats import AgentStats, FrameColumns, FrameStats, TLStats, finalize

FAN_IN = 16
#: Scenes whose agents-per-frame series the report keeps for its plots.
SAMPLE_SCENES = 4


def tree_keys(graph: dict, name: str, leaves: Sequence[Any], combine: Callable, identity: Callable) -> Any:
    """Add an ordered tree reduction of ``leaves`` (keys) to ``graph``; returns the root key."""
    if not leaves:
        graph[(name, 0, 0)] = (identity,)
        return (name, 0, 0)
    level = 0
    keys = list(leaves)
    while len(keys) > 1 or level == 0:
        nxt = []
        for j in range(0, len(keys), FAN_IN):
            graph[(name, level, j // FAN_IN)] = (_combine_many, combine, *keys[j: j + FAN_IN])
            nxt.append((name, level, j // FAN_IN))
        keys, level = nxt, level + 1
    return keys[0]


def _combine_many(combine: Callable, *parts: Any) -> Any:
    out = parts[0]
    for p in parts[1:]:
        out = combine(out, p)
    return out


def _read_all(store, meta, compressed):
    """A whole (small) array in one task."""
    if not meta.nchunks:
        return np.empty(0, meta.dtype)
    return read_block(store, meta, compressed, 0, meta.nchunks, None)


def _frame_task(store, meta, compressed, first, nchunks, fields, scene_iv, scene_lo, has_tl, n_agents, n_tl,
                sample_scenes):
    """One block of frame chunks, read and reduced: frame partial, compact join columns, and the
    agents/tl interval bounds."""
    block = read_block(store, meta, compressed, first, nchunks, fields)
    offset = meta.chunk_bounds(first)[0]
    part, join = FrameStats.chunk(block, offset, scene_iv, scene_lo, has_tl, sample_scenes)
    agent_bounds = block_bounds(block, "agent_index_interval", offset, n_agents)
    tl_bounds = block_bounds(block, "traffic_light_faces_index_interval", offset, n_tl) if has_tl else None
    return part, join, agent_bounds, tl_bounds


def _fused(chunk, combine, store, meta, compressed, first, n, *args):
    """Read and reduce ``n`` stored chunks in one task: each chunk is decoded once into one
    reused buffer and reduced at once (no decoded intermediate is kept or moved)."""
    part = None
    for lo, records in iter_chunks(store, meta, compressed, first, n):
        p = chunk(records, lo, *args)
        part = p if part is None else combine(part, p)
    return part


def _agent_chunk(records, lo, nlabels, frames):
    return AgentStats.chunk(records, lo, frames, nlabels)


def _agents_task(store, meta, compressed, first, n, nlabels, *frame_passes):
    """A group of agent chunks, reduced, given the passes of the frame blocks it overlaps."""
    frames = FrameColumns.concat([p[1] for p in frame_passes])
    return _fused(_agent_chunk, AgentStats.combine, store, meta, compressed, first, n, nlabels, frames)


def _tl_chunk(records, lo):
    return TLStats.chunk(records)


def _client(client: Any = None) -> Any:
    """The distributed client the job runs on: ``client``, else the default one if there is one.

    A default client exists only if ``distributed`` was imported; it is not imported here (0.2 s)
    unless dask's ``scheduler-address`` is set.
    """
    if client is not None:
        return client
    address = dask.config.get("scheduler-address", None)
    if address:  # DASK_SCHEDULER_ADDRESS: the API runs there too, as the CLI does
        from distributed import Client, default_client

        try:
            return default_client()
        except ValueError:
            return Client(address, set_as_default=True)
    distributed = sys.modules.get("distributed")
    if distributed is not None:
        try:
            return distributed.default_client()
        except ValueError:
            pass
    return None


def worker_threads(client: Any = None) -> int:
    """Threads that will run the tasks: those of the cluster, else local cores."""
    client = _client(client)
    if client is not None:
        try:
            return max(1, sum(client.nthreads().values()))
        except OSError:
            pass
    return os.cpu_count() or 1


#: (tasks wanted per thread, most stored chunks in a task), by scheduler.
TASK_SIZING = {"threads": (16, 8), "distributed": (8, 64)}


def auto_chunks_per_task(nchunks: int, threads: int | None = None, scheduler: str = "threads",
                         tasks_per_thread: int | None = None) -> int:
    """Stored chunks per task: enough tasks per thread to balance the load, few enough to keep
    the scheduling cost small against the work (each task still decodes each chunk once).

    On local threads a task costs about 0.3 ms of scheduling, as much as decoding a chunk:
    16 tasks per thread and up to 8 chunks a task. On dask.distributed a task costs 1-3 ms
    (a round between worker and scheduler): 8 tasks per thread and up to 64 chunks a task.
    """
    per_thread, most = TASK_SIZING[scheduler]
    threads = threads or worker_threads()
    return int(min(most, max(1, nchunks // ((tasks_per_thread or per_thread) * threads))))


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


def _tl_graph(ds: L5Dataset, name: str, chunks_per_task: int) -> dict:
    """Tasks reading and reducing groups of traffic-light face chunks (none without the array)."""
    if not ds.has(fmt.TL_FACES):
        return {}
    tl = ds[fmt.TL_FACES]
    return {(name, i): (_fused, _tl_chunk, TLStats.combine, tl.store, tl.meta, tl.compressed, first,
                        min(chunks_per_task, tl.meta.nchunks - first))
            for i, first in enumerate(range(0, tl.meta.nchunks, chunks_per_task))}


def _agents_graph(agents, name: str, groups: list[tuple[int, int]], nlabels: int, frame_bounds: np.ndarray,
                  frame_keys: list) -> dict:
    """A task per group of stored agent chunks, depending only on the frame blocks its rows overlap.

    ``frame_bounds`` are the blocks' agent ranges (start, end, rows); the passes' keys are plain
    arguments (a list of keys would be a task of its own, and every task costs a round of
    scheduling). A task reads all fields: the report needs 4 of 6, and projecting would copy.
    """
    start, end, rows = frame_bounds[:, 0], frame_bounds[:, 1], frame_bounds[:, 2]
    graph = {}
    for i, (first, n) in enumerate(groups):
        lo, hi = agents.meta.chunk_bounds(first)[0], agents.meta.chunk_bounds(first + n - 1)[1]
        overlapping = np.flatnonzero((rows > 0) & (start < hi) & (end > lo))
        graph[(name, i)] = (_agents_task, agents.store, agents.meta, agents.compressed, first, n, nlabels,
                            *[frame_keys[k] for k in overlapping])
    return graph


def _check_scenes(siv: np.ndarray, n_frames: int) -> None:
    n_bad, first_bad, why = interval_problems(siv, 0, n_frames)
    problems = [f"scenes.frame_index_interval: row {first_bad}: {why}"] if n_bad else []
    if not n_bad and len(siv) and (siv[0, 0] != 0 or siv[-1, 1] != n_frames):
        problems.append(f"scenes.frame_index_interval: row 0: covers frames {siv[0, 0]}..{siv[-1, 1]}, "
                        f"the frames array has {n_frames} rows")
    if not len(siv) and n_frames:
        problems.append(f"scenes.frame_index_interval: no scenes, but {n_frames} frames")
    raise_first(problems)


def compute_report(
    dataset: Any,
    *,
    storage_options: dict | None = None,
    chunks_per_task: int | None = None,
    progress: bool = False,
    scheduler: Any = None,
    client: Any = None,
) -> dict[str, Any]:
    """The standard statistics report of a dataset, as a dict (contract version 1).

    Parameters
    ----------
    dataset : str, path or L5Dataset
    chunks_per_task : int, optional
        Stored chunks per task. By default chosen by :func:`auto_chunks_per_task`:
        each task still decodes each of its chunks once.
    progress : bool
        Show a progress bar on stderr.
    scheduler : optional
        Passed to ``dask.compute``; by default the current dask scheduler (an active
        ``distributed.Client``, else local threads).
    client : distributed.Client, optional
        Run on this cluster (the default client is used anyway when there is one).
    """
    ds = dataset if isinstance(dataset, L5Dataset) else open_dataset(dataset, storage_options=storage_options)
    counts = ds.counts()
    has_tl = ds.has(fmt.TL_FACES) and "traffic_light_faces_index_interval" in ds[fmt.FRAMES].dtype.names
    cluster = _client(client) if scheduler is None else None
    if cluster is None and scheduler is None and dask.config.get("scheduler", None) is None:
        # the embedded default: local threads, named by the function itself, since dask imports
        # distributed (0.2 s) to look for a client whenever the scheduler is left to it or named by a string
        from dask.threaded import get as threaded_get

        scheduler = threaded_get
    kw = {"scheduler": scheduler} if scheduler is not None else {}
    sizing = dict(threads=worker_threads(cluster), scheduler="distributed" if cluster is not None else "threads")
    if chunks_per_task is None:
        chunks_per_task = dask.config.get("l5dask.chunks-per-task", None) or auto_chunks_per_task(
            ds[fmt.AGENTS].meta.nchunks, **sizing)
    token = tokenize(ds.store, counts, chunks_per_task)

    # 1. scenes, whole: the report holds a row per scene anyway.
    sc = ds[fmt.SCENES]
    sname = f"l5-scenes-{token}"
    scenes = compute(Delayed(sname, HighLevelGraph.from_collections(
        sname, {sname: (_read_all, sc.store, sc.meta, sc.compressed)}, dependencies=[])), client=client, **kw)
    siv = scenes["frame_index_interval"].reshape(-1, 2)
    _check_scenes(siv, counts["frames"])

    # 2. the frames pass, persisted: partials + compact join columns, each chunk decoded once.
    fr = ds[fmt.FRAMES]
    frame_fields = ("timestamp", "agent_index_interval", "ego_translation") + (
        ("traffic_light_faces_index_interval",) if has_tl else ())
    # a few scenes, evenly spread, whose agents per frame the plots show
    sample_scenes = np.unique(np.linspace(0, len(siv) - 1, min(SAMPLE_SCENES, len(siv))).astype(np.int64))
    fname = f"l5-frames-pass-{token}"
    graph: dict = {}
    # frames in finer groups: the agent tasks run where their frames' join columns are, so
    # those must be spread over the workers (one frames task held them all on one worker)
    frames_per_task = min(chunks_per_task, auto_chunks_per_task(fr.meta.nchunks, tasks_per_thread=4, **sizing))
    for i, first in enumerate(range(0, fr.meta.nchunks, frames_per_task)):
        nchunks = min(frames_per_task, fr.meta.nchunks - first)
        off, stop = fr.meta.chunk_bounds(first)[0], fr.meta.chunk_bounds(first + nchunks - 1)[1]
        s_lo = int(np.searchsorted(siv[:, 0], off, side="right") - 1)
        s_hi = int(np.searchsorted(siv[:, 0], stop - 1, side="right"))
        samples = sample_scenes[(sample_scenes >= s_lo) & (sample_scenes < s_hi)]
        graph[(fname, i)] = (_frame_task, fr.store, fr.meta, fr.compressed, first, nchunks, frame_fields,
                             siv[s_lo:s_hi], s_lo, has_tl, counts["agents"], counts["tl_faces"], samples)
    hlg = HighLevelGraph.from_collections(fname, graph, dependencies=[])
    # the traffic-light faces need nothing of the frames: they start now, with the frames pass,
    # and keep the workers busy while the client checks the bounds and builds the agent tasks
    tname = f"l5-tlfaces-{token}"
    tl_graph = _tl_graph(ds, tname, chunks_per_task)
    with dask.annotate(priority=-1):  # after the frames, whose bounds the client is waiting for
        tl_hlg = HighLevelGraph.from_collections(tname, tl_graph, dependencies=[])
    started = persist([Delayed(k, hlg, layer=fname) for k in graph] + [Delayed(k, tl_hlg, layer=tname) for k in tl_graph],
                      client=client, progress=progress, **kw)
    passes, tl_parts_done = started[:len(graph)], started[len(graph):]
    # the interval bounds of each frame block (small) come back to the client; one task per block,
    # where the block is, written out as a graph (a Delayed getitem per block cost 2 ms of client time)
    bname = f"l5-frame-bounds-{token}"
    bgraph: dict = {(bname, i): (getitem, p.key, slice(2, 4)) for i, p in enumerate(passes)}
    bgraph[bname] = (list, list(bgraph))
    bounds = compute(Delayed(bname, HighLevelGraph.from_collections(bname, bgraph, dependencies=passes)),
                     client=client, **kw)
    empty = np.zeros((0, 6), np.int64)
    agent_bounds = np.concatenate([b[0] for b in bounds]) if passes else empty
    problems = check_bounds(agent_bounds, "frames", "agent_index_interval", counts["agents"])
    if has_tl:
        problems += check_bounds(np.concatenate([b[1] for b in bounds]) if passes else empty,
                                 "frames", "traffic_light_faces_index_interval", counts["tl_faces"])
    raise_first(problems)

    # 3. agents, each task depending only on the frame blocks it overlaps; tree combines of
    #    the three levels; one compute.
    agents = ds[fmt.AGENTS]
    nlabels = agents.dtype["label_probabilities"].shape[0]
    # a key name per kind of task (frames, faces, agents, combines), so that the scheduler learns
    # each kind's duration
    name = f"l5-report-{token}"
    groups = task_groups(agents.meta.nchunks, chunks_per_task, sizing["threads"])
    graph = _agents_graph(agents, f"l5-agents-{token}", groups, nlabels, agent_bounds, [p.key for p in passes])
    agent_parts = list(graph)
    # the frame partials are read out of the persisted passes inside the combines (inline getitems)
    frame_parts = [(getitem, p.key, 0) for p in passes]
    deps = list(passes) + list(tl_parts_done)
    tl_parts = [p.key for p in tl_parts_done]
    fp = tree_keys(graph, f"l5-combine-frames-{token}", frame_parts, FrameStats.combine, _empty_frame_part)
    ap = tree_keys(graph, f"l5-combine-agents-{token}", agent_parts, AgentStats.combine, functools.partial(_empty_agent_part, nlabels))
    tp = tree_keys(graph, f"l5-combine-tlfaces-{token}", tl_parts, TLStats.combine, _empty_tl_part)
    graph[name] = (finalize, counts, list(ds.labels), scenes, fp, ap, tp)
    final = Delayed(name, HighLevelGraph.from_collections(name, graph, dependencies=deps), layer=name)
    report = compute(final, client=client, progress=progress, **kw)
    report["dataset"] = ds.url
    return report


def _empty_frame_part():
    from .stats import FramePart

    return FramePart()


def _empty_agent_part(nlabels: int = 17):
    from .stats import AgentPart

    return AgentPart(labels=np.zeros(nlabels, np.int64))


def _empty_tl_part():
    from .stats import TLPart

    return TLPart()


def public(report: dict[str, Any]) -> dict[str, Any]:
    """The report without its private per-scene table."""
    return {k: v for k, v in report.items() if not k.startswith("_")}


def atomic_write(path: str, write: Callable[[str], None]) -> None:
    """Write to a temporary file beside ``path``, then rename it into place."""
    path = os.path.abspath(path)
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise L5DaskError(f"{path}: the folder {folder} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".partial", dir=folder)
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(report: dict[str, Any], path: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(public(report), f, indent=1)

    atomic_write(path, write)


def write_scene_table(report: dict[str, Any], path: str) -> None:
    """The per-scene table as Parquet (built from per-scene partials, never from the agents)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({k: np.asarray(v) for k, v in report["_scene_table"].items()})
    atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def summary_text(report: dict[str, Any]) -> str:
    """L5Kit's summary table and the label mix, for people."""
    c, s = report["counts"], report["summary"]
    head = ["Num Scenes", "Num Frames", "Num Agents", "Num TR lights", "Total Time (hr)", "Avg Frames per Scene",
            "Avg Agents per Frame", "Avg Scene Time (sec)", "Avg Frame frequency"]
    vals = [f"{c['scenes']:,}", f"{c['frames']:,}", f"{c['agents']:,}", f"{c['tl_faces']:,}",
            f"{s['total_time_hours']:.2f}", f"{s['avg_frames_per_scene']:.2f}", f"{s['avg_agents_per_frame']:.2f}",
            f"{s['avg_scene_time_s']:.2f}", f"{s['frame_frequency_hz']:.2f}"]
    widths = [max(len(h), len(v)) for h, v in zip(head, vals)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    row = lambda cells: "|" + "|".join(f" {x:>{w}} " for x, w in zip(cells, widths)) + "|"  # noqa: E731
    out = [line, row(head), line, row(vals), line, "", "Label mix (most probable label):"]
    total = max(c["agents"], 1)
    for name, n in sorted(report["agents"]["label_counts"].items(), key=lambda kv: -kv[1]):
        if n:
            out.append(f"  {name:<40} {n:>14,}  {100 * n / total:6.2f} %")
    out.append(f"Distinct tracks: {report['tracks']['count']:,}   "
               f"mean agent speed: {report['agents']['speed_mps']['mean']:.2f} m/s   "
               f"ego distance: {report['ego']['total_distance_km']:.1f} km")
    return "\n".join(out)
