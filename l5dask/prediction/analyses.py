"""Many analyses of one dataset in one pass: :func:`~l5dask.prediction.analyses.analyze`.

``l5dask.analyze(ds, {"report": Report(), "catalog": Catalog(), "speed": Aggregate(...)})``
declares each analysis (its :class:`~l5dask.core.engine.Plan`: the report's, the catalog's, an
aggregation's) and runs them together (:meth:`l5dask.core.engine.Job.run`): the passes over one
array with one parent are fused into one pass, so each stored chunk is read and decoded once
whatever the number of analyses; the frames' rows that agents and faces need are made by one
frames pass for all of them. Each result is bit for bit the one its own function returns
(:func:`l5dask.prediction.report.compute_report`, :func:`l5dask.catalog <l5dask.prediction.catalog.catalog>`, :func:`l5dask.aggregate <l5dask.prediction.aggregation.aggregate>`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from l5dask.core.cache import open_cache
from l5dask.core.cluster import connect, scheduler_address
from l5dask.core.engine import Job, Plan
from l5dask.core.policy import default_client, where_keywords
from l5dask.errors import UsageError
from l5dask.prediction import format as fmt
from l5dask.prediction.aggregation import MAX_GROUPS, aggregate_plan
from l5dask.prediction.catalog import DEFAULT_TZ, as_frame, catalog_plan, check_tz, with_fingerprint
from l5dask.prediction.dataset import L5Dataset, open_dataset, warm_up
from l5dask.prediction.groupby import QUANTILE_BITS
from l5dask.prediction.report import report_plan

__all__ = ["Aggregate", "Analysis", "Catalog", "Report", "analyze"]


class Analysis(Protocol):
    """What :func:`~l5dask.prediction.analyses.analyze` runs: an analysis declared over a dataset (its plan), and its result
    made of the plan's."""

    def plan(self, ds: L5Dataset, job: Job) -> Plan:
        """The analysis declared over ``ds`` (its arguments checked: a one-line error)."""

    def result(self, ds: L5Dataset, out: Any) -> Any:
        """The analysis's result from its plan's."""


@dataclass(frozen=True)
class Report:
    """The standard statistics report: the dict :func:`l5dask.prediction.report.compute_report`
    returns (contract version 1)."""

    def plan(self, ds: L5Dataset, job: Job) -> Plan:
        return report_plan(ds, job)

    def result(self, ds: L5Dataset, out: Any) -> Any:
        out["dataset"] = ds.url
        return out


@dataclass(frozen=True)
class Catalog:
    """The scene catalog: the DataFrame :func:`l5dask.catalog <l5dask.prediction.catalog.catalog>` returns (a row per scene).

    Parameters
    ----------
    tz : str
        The time zone (IANA name) of ``local_hour`` and ``local_weekday``.
    """

    tz: str = DEFAULT_TZ

    def __post_init__(self) -> None:
        check_tz(self.tz)

    def plan(self, ds: L5Dataset, job: Job) -> Plan:
        return catalog_plan(ds, job, self.tz)

    def result(self, ds: L5Dataset, out: Any) -> Any:
        return as_frame(with_fingerprint(out, ds))


@dataclass(frozen=True)
class Aggregate:
    """An aggregation: the DataFrame :func:`l5dask.aggregate <l5dask.prediction.aggregation.aggregate>` returns with these arguments (a row
    per group that has rows, sorted by the keys).

    Parameters
    ----------
    array : str
        ``agents``, ``frames``, ``scenes`` or ``tl_faces``.
    by : sequence of str
        Integer or categorical columns (``scene_index``, ``label``, ``host``, ``hour``...).
    values : mapping
        ``{column: [reductions]}``, e.g. ``{"speed": ["mean", "max"]}``.
    where : str, optional
        Keep the rows where this holds (see :func:`l5dask.aggregate <l5dask.prediction.aggregation.aggregate>`).
    max_groups, quantile_bits
        As :func:`l5dask.aggregate <l5dask.prediction.aggregation.aggregate>`.
    """

    array: str = "agents"
    by: Sequence[str] | str = ()
    values: Mapping[str, Sequence[str] | str] = field(default_factory=dict)
    where: str | None = None
    max_groups: int = MAX_GROUPS
    quantile_bits: int = QUANTILE_BITS

    def plan(self, ds: L5Dataset, job: Job) -> Plan:
        return aggregate_plan(
            ds,
            job,
            self.array,
            self.by,
            self.values,
            self.where,
            max_groups=self.max_groups,
            quantile_bits=self.quantile_bits,
        )

    def result(self, ds: L5Dataset, out: Any) -> Any:
        (result,) = out
        return result.to_pandas()


@where_keywords
def analyze(
    dataset: Any,
    analyses: Mapping[str, Analysis],
    *,
    storage_options: dict | None = None,
    chunks_per_task: int | None = None,
    progress: bool = False,
    scheduler: Any = None,
    cache: Any = None,
) -> dict[str, Any]:
    """Run several analyses of one dataset together, in one pass over its stored chunks.

    Parameters
    ----------
    dataset : str, path or L5Dataset
    analyses : mapping
        ``{name: analysis}``: :class:`Report`, :class:`Catalog`, :class:`Aggregate` (any number).
        Each is checked (a one-line :class:`~l5dask.errors.UsageError`) before any chunk is read.
    storage_options, chunks_per_task, progress, scheduler, cache
        As :func:`l5dask.prediction.report.compute_report` (a cache's entries of a fused pass are
        its own: they are not shared with the analyses' runs alone).

    Returns
    -------
    dict
        ``{name: result}``, in the order given: each bit for bit what its own function returns
        (the report's dict, the catalog's and each aggregation's DataFrame).

    Each stored chunk of the dataset is read and decoded once whatever the number of analyses
    (the frames, whose rows the agents' and faces' tasks need, once more, as for one analysis).
    """
    if not isinstance(analyses, Mapping) or not analyses:
        raise UsageError("analyze: give the analyses as a non-empty mapping {name: analysis}")
    for name, a in analyses.items():
        if not (hasattr(a, "plan") and hasattr(a, "result")):
            raise UsageError(
                f"analyze: {name!r} is {type(a).__name__}, not an analysis (Report(), Catalog(), Aggregate(...))"
            )
    if scheduler is None and scheduler_address() and default_client() is None:
        with connect() as own:  # DASK_SCHEDULER_ADDRESS: the API runs there too, as the CLI does
            return analyze(
                dataset,
                analyses,
                storage_options=storage_options,
                chunks_per_task=chunks_per_task,
                progress=progress,
                scheduler=own,
                cache=cache,
            )
    warming = warm_up(dataset, storage_options, scheduler)
    ds = dataset if isinstance(dataset, L5Dataset) else open_dataset(dataset, storage_options=storage_options)
    job = Job(
        scheduler,
        chunks_per_task=chunks_per_task,
        progress=progress,
        size_for=ds[fmt.AGENTS].nchunks,
        cache=open_cache(cache, storage_options),
    )
    plans = {name: a.plan(ds, job) for name, a in analyses.items()}
    outs = job.run(list(plans.values()))
    del warming  # (held until the job's tasks were submitted)
    return {name: analyses[name].result(ds, out) for name, out in zip(plans, outs)}
