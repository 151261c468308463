"""The prediction data's analyses a job file can run (``l5dask run``, :mod:`l5dask.core.jobfile`):
``report``, ``catalog``, ``aggregate`` and ``export``, each declared once (its keys, its check
before any pass, how it runs and writes its outputs) and registered in the job's registry.

The report, the catalog and the aggregations of one dataset run together, in one pass
(``l5dask.prediction.analyses.analyze``): each stored chunk is read and decoded once
whatever their number. An export writes as it reads: it runs alone."""

from __future__ import annotations

import functools
import time
from typing import Any

from l5dask.core.engine import Job
from l5dask.core.jobfile import Key, Kind, at_key, register
from l5dask.core.outputs import table_format, write_json, write_table
from l5dask.core.policy import thread_pool
from l5dask.core.runs import one_line
from l5dask.errors import L5DaskError, UsageError
from l5dask.prediction import format as fmt
from l5dask.prediction.aggregation import MAX_GROUPS, check_arguments, parse_values, where_columns
from l5dask.prediction.analyses import Aggregate, Catalog, Report, analyze
from l5dask.prediction.catalog import (
    DEFAULT_TZ,
    catalog_table,
    check_tz,
    empty_catalog,
    fingerprint,
    with_fingerprint,
    write_catalog,
)
from l5dask.prediction.columns import Table
from l5dask.prediction.dataset import open_dataset
from l5dask.prediction.exports import FORMATS, export
from l5dask.prediction.exports import check_output as export_output
from l5dask.prediction.groupby import QUANTILE_BITS
from l5dask.prediction.html import write_html
from l5dask.prediction.report import write_scene_table
from l5dask.prediction.scenes import evaluate, query_indices, read_catalog, scenes_digest
from l5dask.prediction.where import names_in, reworded


def open_l5(url: str, storage_options: dict) -> Any:
    """A job's dataset: an L5Kit zarr dataset (its metadata read; refused if there is none)."""
    return open_dataset(url, storage_options=storage_options)


def _pass_kw(ctx: Any) -> dict:
    return {"scheduler": ctx.client, "chunks_per_task": ctx.chunks_per_task, "progress": ctx.progress}


def _cached_kw(ctx: Any) -> dict:
    """A pass's keywords, with the run's cache (``False``: none, not dask config's)."""
    return {**_pass_kw(ctx), "cache": ctx.cache if ctx.cache is not None else False}


def _suffix(params: dict, key: str, allowed: tuple[str, ...]) -> None:
    """The output ``params[key]`` (if given) names a file of one of the ``allowed`` suffixes
    (said at the key's line)."""
    path = params[key]
    with at_key(key):
        if path and not any(path.lower().endswith(e) for e in allowed):
            raise UsageError(f"{key} {path!r}: name the file {' or '.join('*' + e for e in allowed)}")


def run_fingerprint(ds: Any, ctx: Any) -> dict:
    """The dataset's :func:`~l5dask.prediction.catalog.fingerprint` for the run record, its scenes'
    digest taken of the scenes as the run's passes read them (``Job.read``: with a cache, from its
    entry while no scene chunk changed, so that a warm rerun reads no data chunk)."""
    if ctx.cache is None:
        return fingerprint(ds)
    memo = ("scenes-read", id(ds))
    if memo not in ctx.memo:
        ctx.memo[memo] = Job(cache=ctx.cache).read(ds[fmt.SCENES])
    return fingerprint(ds, scenes_digest(ctx.memo[memo]))


# --- a part of the scenes ---------------------------------------------------------------------
SCENE_KEYS = (
    Key(
        "scenes",
        "str",
        "only the scenes where this holds over the scene catalog's columns, e.g. ``\"turn == 'left'\"``",
    ),
    Key(
        "scene-catalog",
        "str",
        "the catalog Parquet ``scenes`` reads; default: the catalog this run writes of the dataset, else one computed",
    ),
)


def check_scenes(ds: Any, params: dict, options: dict | None = None) -> None:
    if params["scene-catalog"] is not None and params["scenes"] is None:
        with at_key("scene-catalog"):
            raise UsageError("scene-catalog is read by scenes: give scenes too")
    if params["scene-catalog"] is not None:  # (there, and of this dataset)
        with at_key("scene-catalog"):
            with read_catalog(params["scene-catalog"], ds, options, "scene-catalog") as t:
                table = t.schema_arrow.empty_table()  # (its columns: the file closed)
    elif params["scenes"] is not None:
        table = empty_catalog(ds)  # (the catalog's columns: known before it is made)
    if params["scenes"] is not None:
        try:
            names_in(params["scenes"])  # (its syntax, before any pass)
            # (its columns, and that it is a condition: over no row)
            # (the names compared with text columns: checked once the catalog is read, not over no row)
            evaluate(
                params["scenes"],
                table.schema_arrow.empty_table() if hasattr(table, "schema_arrow") else table,
                values=False,
            )
        except UsageError as exc:  # (said with the job's key)
            err = UsageError(reworded(str(exc), params["scenes"], f"scenes {params['scenes']!r}"))
            err.job_key = "scenes"  # type: ignore[attr-defined]
            raise err from None


def scene_part(params: dict) -> Any:
    """The scenes an analysis reads (``None``: all)."""
    return None if params["scenes"] is None else (params["scenes"], params["scene-catalog"])


def restrict_scenes(ds: Any, key: tuple, ctx: Any, written: dict) -> Any:
    """``ds`` restricted to the scenes where the expression holds over its catalog: the one given,
    else the one this run wrote of the dataset, else one computed once for the run."""
    expr, table = key
    if table is None and written.get("catalog"):
        table = written["catalog"][0]["output"]
    if table is None:
        memo = ("scene-catalog", id(ds))
        if memo not in ctx.memo:
            try:
                ctx.memo[memo] = catalog_table(ds, **_cached_kw(ctx))
            except L5DaskError as exc:  # (said as such, once for the run: each such analysis fails with it)
                said = f"its scenes are chosen over the dataset's scene catalog, which failed: {one_line(exc)}"
                ctx.memo[memo] = (type(exc), said)  # (its class: what a caller catches is the cause's)
        table = ctx.memo[memo]
        if isinstance(table, tuple):
            raise table[0](table[1])
    keep = query_indices(ds, expr, table, ctx.storage_options, key="scenes")  # (said with the job's key)
    return ds.isel(keep, scheduler=ctx.client, progress=ctx.progress)


# --- the report ---------------------------------------------------------------------------------
def check_report(ds: Any, params: dict) -> None:
    check_scenes(ds, params)
    _suffix(params, "output", (".json",))
    _suffix(params, "html", (".html", ".htm"))
    _suffix(params, "scenes-table", (".parquet",))


def write_report(report: dict, params: dict, outputs: dict, ctx: Any, seconds: float) -> dict:
    options = ctx.storage_options
    if "output" in outputs:
        write_json(report, outputs["output"], options)
    if "html" in outputs:
        write_html(report, outputs["html"], elapsed_s=seconds, storage_options=options)
    if "scenes-table" in outputs:
        write_scene_table(report, outputs["scenes-table"], options)
    result = {"agents": report["counts"]["agents"], "scenes": report["counts"]["scenes"]}
    if params["scenes"] is not None and "scenes-table" in outputs:
        result["note"] = RENUMBERED_NOTE.format(columns="scenes-table's scene indices")
    return result


# --- the catalog --------------------------------------------------------------------------------
def check_catalog(ds: Any, params: dict) -> None:
    _suffix(params, "output", (".parquet",))
    with at_key("tz"):
        check_tz(params["tz"])


def write_catalog_output(table: Any, params: dict, outputs: dict, ctx: Any, seconds: float) -> dict:
    write_catalog(table, outputs["output"], ctx.storage_options, overwrite=True)
    return {"scenes": len(table)}


# --- aggregations -------------------------------------------------------------------------------
def check_aggregate(ds: Any, params: dict) -> None:
    check_scenes(ds, params)
    with at_key("output"):
        table_format(params["output"])
    with at_key("array"):
        table = Table(ds, params["array"])
    with at_key("by"):
        table.resolve(params["by"], "group column")
    with at_key("values"):
        parse_values(params["values"], table)
    if params["where"] is not None:
        with at_key("where"):
            where_columns(params["where"], table)
    with at_key("quantile-bits"):
        if not 0 <= params["quantile-bits"] <= 52:
            raise UsageError(f"quantile-bits must be from 0 to 52, not {params['quantile-bits']}")
    with at_key("by"):  # (the rest a plan asks: columns to group by of integers or categories, none twice)
        check_arguments(
            table,
            params["by"],
            params["values"],
            params["where"],
            params["max-groups"],
            params["quantile-bits"],
            bound=False,
        )


class AggregateTable(Aggregate):
    """An aggregation whose result is its Arrow table (what ``l5dask agg -o`` writes)."""

    def result(self, ds: Any, out: Any) -> Any:
        (result,) = out
        return result.to_arrow()


class CatalogTable(Catalog):
    """The catalog as its Arrow table, fingerprinted (what ``l5dask catalog`` writes: no pandas
    imported, 0.45 s of a run's CPU)."""

    def result(self, ds: Any, out: Any) -> Any:
        return with_fingerprint(out, ds)


#: What a run record says of an aggregation of some scenes grouped by a column of
#: ``fmt.RENUMBERED`` (its values are those of the subset, counted from 0).
RENUMBERED_NOTE = (
    "its {columns} are those of the chosen scenes (counted from 0, as in the subset l5dask subset writes), "
    "not the stored ones: the catalog of the same scenes maps each scene to its stored_scene_index"
)


def write_aggregate(table: Any, params: dict, outputs: dict, ctx: Any, seconds: float) -> dict:
    write_table(table, outputs["output"], ctx.storage_options)
    result: dict = {"groups": table.num_rows}
    by = [params["by"]] if isinstance(params["by"], str) else list(params["by"])
    renumbered = [c for c in by if c in fmt.RENUMBERED]
    if params["scenes"] is not None and renumbered:  # (said, as the command line says it)
        result["note"] = RENUMBERED_NOTE.format(columns=", ".join(renumbered))
    return result


def analysis(kind: str, params: dict) -> Any:
    """The analysis (:mod:`l5dask.prediction.analyses`) a job's ``[analyses.NAME]`` declares."""
    if kind == "report":
        return Report()
    if kind == "catalog":
        return CatalogTable(tz=params["tz"])
    return AggregateTable(
        params["array"],
        params["by"],
        params["values"],
        params["where"],
        max_groups=params["max-groups"],
        quantile_bits=params["quantile-bits"],
    )


#: How each analysis run together writes its result.
WRITERS = {"report": write_report, "catalog": write_catalog_output, "aggregate": write_aggregate}


def run_together(ds: Any, members: list, ctx: Any) -> list:
    """The job's report, catalog and aggregations of one dataset in one pass; each one's record
    (or what failed its writing)."""
    t0 = time.perf_counter()
    named = {str(i): analysis(kind.name, params) for i, (kind, params, _) in enumerate(members)}
    results = analyze(ds, named, **_cached_kw(ctx))
    seconds = time.perf_counter() - t0
    writes = [
        functools.partial(WRITERS[kind.name], results[str(i)], params, outputs, ctx, seconds)
        for i, (kind, params, outputs) in enumerate(members)
    ]
    if len(writes) == 1:
        return [_written(writes[0])]
    # (the outputs written at once, each atomically: a bucket's uploads wait on the network, and
    # Parquet's encoding releases the GIL; the records in the members' order)
    with thread_pool(min(len(writes), WRITE_THREADS), "l5dask-write") as pool:
        return [f.result() for f in [pool.submit(_written, w) for w in writes]]


#: Outputs of one pass written at once.
WRITE_THREADS = 4


def _written(write: Any) -> Any:
    """What ``write`` returns, or the exception that failed it (an output that failed is said; the
    others are written)."""
    try:
        return write()
    except Exception as exc:  # noqa: BLE001 - said in the record and in one line
        return exc


def run_one(ds: Any, params: dict, outputs: dict, ctx: Any, kind: str) -> dict:
    (result,) = run_together(ds, [(KINDS[kind], params, outputs)], ctx)
    if isinstance(result, BaseException):
        raise result
    return result


# --- exports ------------------------------------------------------------------------------------
def run_export(ds: Any, params: dict, outputs: dict, ctx: Any) -> dict:
    rows = export(
        ds, outputs["output"], params["format"], storage_options=ctx.storage_options, overwrite=True, **_pass_kw(ctx)
    )
    return {"rows": rows}


def check_export_output(key: str, path: str, storage_options: dict) -> None:
    export_output(path, storage_options, overwrite=True)


# --- the kinds, registered -------------------------------------------------------------------
REPORT = register(
    Kind(
        "report",
        "the statistics report (``l5dask stats``, ``l5dask report``)",
        (
            Key("output", "template", "the report as JSON (``*.json``)"),
            Key("html", "template", "the report as a self-contained HTML page (``*.html``)"),
            Key("scenes-table", "template", "the per-scene table (``*.parquet``)"),
            *SCENE_KEYS,
        ),
        reads=("scene-catalog",),
        open=open_l5,
        run=functools.partial(run_one, kind="report"),
        together=run_together,
        restriction=scene_part,
        restrict=restrict_scenes,
        check=check_report,
        fingerprint=run_fingerprint,
    )
)


CATALOG = register(
    Kind(
        "catalog",
        "the scene catalog (``l5dask catalog``): a row per scene, as Parquet",
        (
            Key("output", "template", "the catalog (``*.parquet``)", required=True),
            Key("tz", "str", "the time zone (IANA name) of the local hour and weekday", default=DEFAULT_TZ),
        ),
        open=open_l5,
        run=functools.partial(run_one, kind="catalog"),
        together=run_together,
        check=check_catalog,
        fingerprint=run_fingerprint,
    )
)


AGGREGATE = register(
    Kind(
        "aggregate",
        "an aggregation (``l5dask agg``): rows of one array grouped, columns reduced",
        (
            Key("output", "template", "the groups as a table (``*.parquet`` or ``*.csv``)", required=True),
            Key(
                "array",
                "str",
                "the array whose rows are grouped",
                default="agents",
                choices=tuple(fmt.SHORT_NAMES[n] for n in fmt.ARRAY_NAMES),
            ),
            Key("by", "strings", "the columns to group by (``[]``: one group)", default=[]),
            Key("values", "reductions", 'each column and its reductions: ``speed = ["mean", "q99"]``', required=True),
            Key("where", "str", 'keep the rows where this holds, e.g. ``"distance_to_ego < 20"``'),
            Key("max-groups", "int", "refuse groupings that may make more groups", default=MAX_GROUPS, minimum=1),
            Key("quantile-bits", "int", "mantissa bits of the quantile sketch (52: exact)", default=QUANTILE_BITS),
            *SCENE_KEYS,
        ),
        reads=("scene-catalog",),
        open=open_l5,
        run=functools.partial(run_one, kind="aggregate"),
        together=run_together,
        restriction=scene_part,
        restrict=restrict_scenes,
        check=check_aggregate,
        fingerprint=run_fingerprint,
    )
)


EXPORT = register(
    Kind(
        "export",
        "every array in a columnar format (``l5dask export``): Parquet or zarr v3",
        (
            Key("output", "template", "the export's folder", required=True),
            Key("format", "str", "``parquet`` or ``zarr3``", default="parquet", choices=tuple(FORMATS)),
        ),
        open=open_l5,
        run=run_export,
        folders=("output",),
        check_output=check_export_output,
        fingerprint=run_fingerprint,
    )
)

#: The kinds that run together in one pass, by name.
KINDS = {k.name: k for k in (REPORT, CATALOG, AGGREGATE)}
