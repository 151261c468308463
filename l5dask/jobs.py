"""Scheduled jobs: a job file (TOML or YAML) of datasets, analyses, outputs, a cluster and a cache,
checked whole, then run (``l5dask run JOB``; the schema: ``docs/jobs.md``).

>>> record = l5dask.jobs.run_job("nightly.toml")          # doctest: +SKIP
>>> [a["status"] for a in record["analyses"]]             # doctest: +SKIP

The core reads and checks the file and runs the plan (:mod:`l5dask.core.jobfile`,
:mod:`l5dask.core.runs`); the analyses are the systems' (:mod:`l5dask.prediction.jobs`,
:mod:`l5dask.evaluation.jobs`), registered when this module is imported.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from typing import Any

from l5dask.core import cache as cachelib
from l5dask.core import config, jobfile, runs
from l5dask.core.jobfile import Job
from l5dask.core.store import read_counts
from l5dask.errors import UsageError
from l5dask.evaluation import jobs as evaluation_jobs
from l5dask.prediction import jobs as prediction_jobs

#: The systems whose analyses a job can run (imported: they register their kinds).
SYSTEMS = (prediction_jobs, evaluation_jobs)


def load_job(path: str | os.PathLike) -> Job:
    """The job file at ``path``, read and checked (a :class:`~l5dask.core.jobfile.JobError`, one
    line naming the file and the line, for the first fault)."""
    return jobfile.check(jobfile.load(path))


def run_job(
    job: str | os.PathLike | Job,
    *,
    scheduler: str | None = None,
    record: str | None = None,
    cache: str | None = None,
    chunks_per_task: int | None = None,
    progress: bool = False,
    now: datetime.datetime | None = None,
    say: Callable[[str], None] = lambda line: None,
    fail: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Run a job: check it whole (datasets opened, outputs checked), then run its analyses; return
    the run record (a dict; also written at ``record`` or the job's ``[run] record``).

    ``scheduler``, ``cache`` and ``chunks_per_task`` override the job's (without a cache in the
    job or here, dask config ``l5dask.cache``'s); ``say`` and ``fail`` are
    given one line for each analysis written and each failed."""
    job = job if isinstance(job, Job) else load_job(job)
    since = read_counts()  # (the run's reads: from its plan's, which opens the datasets)
    cache_url = cache or (job.cache or {}).get("url") or config.get("cache") or None
    in_job = not cache and bool((job.cache or {}).get("url"))
    try:  # (a location l5dask cannot write a cache at is refused before anything runs)
        # (from dask config: opened as None is, so that a refusal names l5dask.cache)
        store = cachelib.open_cache(cache_url if cache or in_job else None, job.storage_options) if cache_url else None
    except UsageError as exc:
        if not in_job:
            raise
        raise job.source.error(("cache", "url"), f"[cache] url: {exc}") from None
    p = runs.plan(job, now=now, record=record)
    chunks = chunks_per_task or job.cluster["chunks-per-task"]
    with runs.cluster(job, scheduler) as client, cachelib.counting() as counts:
        ctx = runs.Context(client, chunks, progress, dict(job.storage_options), cache=store)

        def cache_counts() -> dict:
            return {"url": cache_url, "writable": store is not None, **counts.as_dict()}

        return runs.execute(p, ctx, say=say, fail=fail, cache=cache_counts if cache_url else None, since=since)
