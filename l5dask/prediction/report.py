"""The standard statistics report, declared over the engine (:mod:`l5dask.core.engine`): which
reductions (:mod:`l5dask.prediction.stats`) run over which arrays, and what each needs of its parent."""

from __future__ import annotations

from typing import Any

import numpy as np

from l5dask.core.cache import open_cache
from l5dask.core.cluster import connect, scheduler_address
from l5dask.core.engine import Job, Link, Pass, Plan
from l5dask.core.intervals import check_intervals
from l5dask.core.outputs import public, write_json, write_table  # noqa: F401 (public, write_json: their home was here)
from l5dask.core.policy import default_client, where_keywords
from l5dask.prediction import format as fmt
from l5dask.prediction.dataset import L5Dataset, open_dataset, warm_up
from l5dask.prediction.joins import scene_rows
from l5dask.prediction.stats import (
    AGENT_FIELDS,
    FRAME_FIELDS,
    TL_FACES,
    agents_reduction,
    finalize,
    frame_rows,
    frames_reduction,
)

#: Scenes whose agents-per-frame series the report keeps for its plots.
SAMPLE_SCENES = 4


def sample_scenes(n: int) -> np.ndarray:
    """The scenes (of ``n``) whose frames the report's plots show: spread evenly over the first
    ``2**k`` scenes, the largest power of two up to ``n``, so that they stay where they are as scenes
    are appended (until the count doubles): the frames tasks that hold them are then the same and
    read from a cache of partials (after 5% of scenes were appended to 30 M agents, 2 of the 6
    frames tasks were computed again when the samples were spread over all ``n``)."""
    span = 1 << (n.bit_length() - 1) if n else 0
    samples = np.linspace(0, span - 1, min(SAMPLE_SCENES, span)).astype(np.int64)
    return samples[np.diff(samples, prepend=-1) != 0]  # (sorted: np.unique imports numpy.ma, 35 ms)


@where_keywords
def compute_report(
    dataset: Any,
    *,
    storage_options: dict | None = None,
    chunks_per_task: int | None = None,
    progress: bool = False,
    scheduler: Any = None,
    cache: Any = None,
) -> dict[str, Any]:
    """The standard statistics report of a dataset, as a dict (contract version 1).

    Parameters
    ----------
    dataset : str, path or L5Dataset
    chunks_per_task : int, optional
        Stored chunks per task. By default sized for the scheduler by the engine
        (:func:`l5dask.core.policy.auto_chunks_per_task`): each task still decodes each chunk once.
    progress : bool
        Show a progress bar on stderr.
    scheduler : optional
        Where to run, as ``dask.compute``'s ``scheduler=``: a ``distributed.Client`` or its
        address (``"tcp://host:8786"``), ``"threads"``, ``"sync"``, ``"processes"``...; by default
        an active ``distributed.Client``, else the cluster at ``DASK_SCHEDULER_ADDRESS``
        (connected for this call, then closed), else local threads. (``client=``, its old name,
        works until the next release, with a ``FutureWarning``.)
    cache : str, path or l5dask.core.cache.Cache, optional
        A cache of partial results (a folder or a bucket's URL, opened with ``storage_options``):
        what was computed before over the same chunks is read from it, what is computed is kept
        there (:mod:`l5dask.core.cache`). Default: dask config ``l5dask.cache`` (none).
    """
    if scheduler is None and scheduler_address():
        if default_client() is None:
            with connect() as own:  # DASK_SCHEDULER_ADDRESS: the API runs there too, as the CLI does
                return compute_report(
                    dataset,
                    storage_options=storage_options,
                    chunks_per_task=chunks_per_task,
                    progress=progress,
                    scheduler=own,
                    cache=cache,
                )
    warming = warm_up(dataset, storage_options, scheduler)
    ds = dataset if isinstance(dataset, L5Dataset) else open_dataset(dataset, storage_options=storage_options)
    agents = ds[fmt.AGENTS]
    job = Job(
        scheduler,
        chunks_per_task=chunks_per_task,
        progress=progress,
        size_for=agents.nchunks,  # the agents are most of the work
        cache=open_cache(cache, storage_options),
    )
    (report,) = job.run([report_plan(ds, job)])
    report["dataset"] = ds.url
    del warming  # (held until the job's tasks were submitted)
    return report


def report_plan(ds: L5Dataset, job: Job) -> Plan:
    """The report declared (:class:`~l5dask.core.engine.Plan`), to run alone or with other analyses
    of the dataset in one pass (:func:`l5dask.analyze <l5dask.prediction.analyses.analyze>`): the
    scenes read whole, the frames pass (persisted: its partials and interval bounds; the rows agents
    need of their frames are made again by the tasks that need them, see ``Job.persist``), the
    agents (each task given only the frame rows it overlaps) and the traffic-light faces (their
    partials combined as they come, never held all at once: 150 MB of face ids at 1 G agents);
    the combines and the report, one compute. Its result lacks ``dataset``."""
    frames, agents = ds[fmt.FRAMES], ds[fmt.AGENTS].select(AGENT_FIELDS)
    frames = frames.select([f for f in FRAME_FIELDS if f in fmt.names_of(frames.dtype)])
    counts = ds.counts()
    has_tl = ds.has(fmt.TL_FACES) and "traffic_light_faces_index_interval" in fmt.names_of(frames.dtype)

    scenes = job.read(ds[fmt.SCENES])  # whole: the report holds a row per scene anyway
    siv = scenes["frame_index_interval"].reshape(-1, 2)
    check_intervals(siv, fmt.SCENES, "frame_index_interval", counts["frames"])
    samples = sample_scenes(len(siv))
    intervals = {"agent_index_interval": counts["agents"]}
    if has_tl:
        intervals["traffic_light_faces_index_interval"] = counts["tl_faces"]
    frame_pass = Pass(
        frames,
        frames_reduction(has_tl, samples, frames.meta.chunk_rows),
        parent=Link(scene_rows(scenes), "start"),
        rows=frame_rows,
        intervals=intervals,
        blocks=True,
    )
    tl = [Pass(ds[fmt.TL_FACES], TL_FACES, encoded=True)] if ds.has(fmt.TL_FACES) else []
    agent_pass = Pass(
        agents,
        agents_reduction(agents.dtype["label_probabilities"].shape[0]),
        parent=Link(frame_pass, "agent_start", "agent_index_interval"),
        encoded=True,  # the columns it needs gathered from each chunk's bytes, no records made
    )
    return Plan(
        [frame_pass, agent_pass, *tl],
        final=finalize,
        args=(counts, list(ds.labels), scenes),
        name="l5-report",
        size_for=agents.nchunks,
    )


def write_scene_table(report: dict[str, Any], path: str, storage_options: dict | None = None) -> None:
    """The per-scene table as Parquet (built from per-scene partials, never from the agents)."""
    write_table({k: np.asarray(v) for k, v in report["_scene_table"].items()}, path, storage_options, ".parquet")


def summary_rows(report: dict[str, Any]) -> tuple[list[str], list[str], list[tuple[str, int, float]], str]:
    """L5Kit's summary (its column names and values), the label mix (name, agents, %), one more line."""
    c, s = report["counts"], report["summary"]
    head = [
        "Num Scenes",
        "Num Frames",
        "Num Agents",
        "Num TR lights",
        "Total Time (hr)",
        "Avg Frames per Scene",
        "Avg Agents per Frame",
        "Avg Scene Time (sec)",
        "Avg Frame frequency",
    ]
    vals = [
        f"{c['scenes']:,}",
        f"{c['frames']:,}",
        f"{c['agents']:,}",
        f"{c['tl_faces']:,}",
        f"{s['total_time_hours']:.2f}",
        f"{s['avg_frames_per_scene']:.2f}",
        f"{s['avg_agents_per_frame']:.2f}",
        f"{s['avg_scene_time_s']:.2f}",
        f"{s['frame_frequency_hz']:.2f}",
    ]
    total = max(c["agents"], 1)
    labels = [
        (name, n, 100 * n / total)
        for name, n in sorted(report["agents"]["label_counts"].items(), key=lambda kv: -kv[1])
        if n
    ]
    extra = (
        f"Distinct tracks: {report['tracks']['count']:,}   "
        f"mean agent speed: {report['agents']['speed_mps']['mean']:.2f} m/s   "
        f"ego distance: {report['ego']['total_distance_km']:.1f} km"
    )
    return head, vals, labels, extra


def summary_text(report: dict[str, Any]) -> str:
    """L5Kit's summary table and the label mix, for people (a terminal)."""
    head, vals, labels, extra = summary_rows(report)
    widths = [max(len(h), len(v)) for h, v in zip(head, vals)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    row = lambda cells: "|" + "|".join(f" {x:>{w}} " for x, w in zip(cells, widths)) + "|"  # noqa: E731
    out = [line, row(head), line, row(vals), line, "", "Label mix (most probable label):"]
    out += [f"  {name:<40} {n:>14,}  {share:6.2f} %" for name, n, share in labels]
    out.append(extra)
    return "\n".join(out)
