"""The prediction data's commands (``stats``, ``report``, ``agg``, ``info``, ``synth``, ``demo``,
``concat``, ``subset``, ``split``, ``export``, ``validate``, ``catalog``), added to ``l5dask``'s command line with
its one error path (:mod:`l5dask.core.commands`)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import click

from l5dask.core.commands import (
    check_outputs,
    echo_answer,
    num_scenes_option,
    parse_storage_options,
    scene_count,
    shared,
)


def inputs_of(dataset: str, scenes_from: Any = None, catalog_file: Any = None) -> list[str]:
    """What a command reads: its dataset and the files its scene filter reads (``--scenes-from``,
    ``--catalog``). An output may be none of them, nor lie inside one (``agg --catalog cat.parquet
    ... -o cat.parquet`` replaced the catalog it read: a new user's trial)."""
    return [os.fspath(p) for p in (dataset, scenes_from, catalog_file) if p]


def scene_filter(
    dataset: str,
    scenes,
    scenes_from,
    catalog_file,
    storage_options,
    quiet: bool = False,
    client: Any = None,
    cache: Any = None,
    renumbered: bool = True,
) -> Any:
    """What a command reads: ``dataset`` as given when no scene filter is, else the dataset
    restricted to the scenes ``--scenes`` and ``--scenes-from`` choose (both: the scenes both
    choose), made before any output is written. ``--scenes`` reads the ``--catalog`` FILE (checked
    against the dataset), else the one kept in the cache (``cache``: ``--cache``, else dask config
    ``l5dask.cache``), else the catalog computed here (and kept in the cache when there is one),
    said on stderr. ``renumbered``: the output holds indices of the chosen scenes (said in a note
    when the command is done)."""
    from l5dask.errors import UsageError

    if scenes is None and scenes_from is None:
        if catalog_file is not None:
            raise UsageError("--catalog is read by --scenes: give --scenes EXPR too")
        return dataset
    import numpy as np

    from l5dask.core.cache import open_cache
    from l5dask.prediction import format as fmt
    from l5dask.prediction.dataset import open_dataset
    from l5dask.prediction.scenes import NoScenesError, evaluate, query_indices, read_scene_list
    from l5dask.prediction.where import reworded

    options = parse_storage_options(storage_options)
    ds = open_dataset(dataset, storage_options=options)
    n = len(ds[fmt.SCENES])
    keep = np.ones(n, bool)
    if scenes_from is not None:
        chosen = np.zeros(n, bool)
        chosen[read_scene_list(scenes_from, ds, options)] = True
        keep &= chosen
    if scenes is not None:
        table: Any = catalog_file
        store = open_cache(cache, options) if table is None else None
        if table is None:  # (the catalog's module imported only to make one)
            from l5dask.prediction.catalog import cached_catalog, empty_catalog
            from l5dask.prediction.catalog import catalog_table as make

            # the expression's syntax and columns, checked before the catalog is made (its columns
            # are known from the metadata, no chunk read): a mistake is said at once
            try:
                evaluate(scenes, empty_catalog(ds), values=False)  # (its hosts: known once it is made)
            except UsageError as exc:  # (said as the command names it)
                raise UsageError(reworded(str(exc), scenes, f"--scenes {scenes!r}")) from None
        say = None if quiet else (lambda line: click.echo(line, err=True))
        if store is not None:
            table = cached_catalog(ds, store, storage_options=options, progress=not quiet, scheduler=client, say=say)
        elif table is None:
            if not quiet:
                click.echo(
                    f"l5dask: no --catalog given: computing the scene catalog of {dataset} for --scenes "
                    "(l5dask catalog DATASET -o FILE makes one to reuse)",
                    err=True,
                )
            table = make(ds, storage_options=options, progress=not quiet, scheduler=client)
        chosen = np.zeros(n, bool)
        chosen[query_indices(ds, scenes, table, options, cli=True, say=None if quiet else _note)] = True
        keep &= chosen
    if not keep.any():
        raise NoScenesError(f"--scenes and --scenes-from together select no scene (of {n:,})")
    if not quiet and renumbered and not keep.all():  # (said when the command is done: a user's error stays one line)
        k = int(keep.sum())
        note = (
            f"l5dask: scene indices in the output are those of the {k:,} chosen scenes (0-{k - 1}), not the stored "
            "ones: the catalog of the chosen scenes (l5dask catalog with the same filter) maps each to its "
            "stored_scene_index"
        )
        _note(note)
    return ds.isel(scene=keep, scheduler=client)


def _note(line: str) -> None:
    """A line for stderr, said when the command is done (a user's error stays one line)."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.meta.setdefault("l5dask.notes", []).append(line)
    else:
        click.echo(line, err=True)


@click.command()
@num_scenes_option(10)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--no-traffic-lights", is_flag=True, help="write the older format, without traffic_light_faces")
@click.option(
    "--label-ties",
    default=0.0,
    type=click.FloatRange(0, 1),
    help="fraction of tracks whose label probabilities tie (for testing numpy's tie rule)",
)
@shared(output="the dataset to write: a folder or a URL", output_required=True, overwrite="a dataset that exists there")
def synth(
    num_scenes: int,
    old_num_scenes: int,
    seed: int,
    no_traffic_lights: bool,
    label_ties: float,
    quiet: bool,
    output: str,
    overwrite: bool,
    storage_options,
) -> None:
    """Generate a realistic L5Kit dataset at OUTPUT (deterministic for a seed)."""
    from l5dask.prediction.synth import synthesize

    start = time.perf_counter()
    counts = synthesize(
        output,
        num_scenes=scene_count(num_scenes, old_num_scenes),
        seed=seed,
        traffic_lights=not no_traffic_lights,
        label_ties=label_ties,
        overwrite=overwrite,
        storage_options=parse_storage_options(storage_options),
    )
    took = time.perf_counter() - start
    click.echo(f"wrote {output}: " + ", ".join(f"{k}={v:,}" for k, v in counts.items()) + f" in {took:.1f} s")


@click.command()
@click.argument("dataset")
@shared()
def info(dataset: str, quiet: bool, storage_options) -> None:
    """Print the arrays of DATASET (lengths, chunks, fields) without reading any chunk."""
    from l5dask.prediction.dataset import open_dataset

    ds = open_dataset(dataset, storage_options=parse_storage_options(storage_options))
    click.echo(f"{ds.url}")
    for name, arr in ds.arrays.items():
        click.echo(
            f"  {name:<20} {len(arr):>14,} rows  {arr.meta.nchunks:>7,} chunks of {arr.meta.chunk_rows:,}"
            f"  {arr.dtype.itemsize} B/row  fields: {', '.join(arr.dtype.names or ())}"
        )


def _report(
    dataset: str, storage_options, chunks_per_task, quiet: bool, scheduler, filters=(None, None, None), cache=None
) -> dict:
    """The report's one pass, on the embedded default or the cluster (its dashboard link on stderr),
    over the scenes ``filters`` (``--scenes``, ``--scenes-from``, ``--catalog``) choose."""
    from l5dask.core.cluster import connect, dashboard
    from l5dask.prediction.report import compute_report

    with connect(scheduler, quiet=True) as client:
        if client is not None and not quiet:
            click.echo(f"l5dask: running on {client.scheduler.address}; dashboard: {dashboard(client)}", err=True)
        return compute_report(
            scene_filter(dataset, filters[0], filters[1], filters[2], storage_options, quiet, client, cache),
            storage_options=parse_storage_options(storage_options),
            chunks_per_task=chunks_per_task,
            progress=not quiet,
            scheduler=client,
            cache=cache,
        )


@click.command()
@click.argument("dataset")
@click.option("--scenes-table", help="write the per-scene table (Parquet) here: a path or a URL")
@shared(
    output="write the report (JSON) here: a path or an s3:// (fsspec) URL",
    chunks=True,
    cache=True,
    scheduler=True,
    scenes=True,
)
def stats(
    dataset: str,
    scenes_table,
    quiet: bool,
    output,
    scenes,
    scenes_from,
    catalog_file,
    chunks_per_task,
    cache,
    scheduler,
    storage_options,
) -> None:
    """Compute the standard statistics report of DATASET (or of the scenes --scenes and
    --scenes-from choose) in one parallel pass."""
    from l5dask.prediction.report import summary_text, write_json, write_scene_table

    check_outputs(storage_options, output, scenes_table, inputs=inputs_of(dataset, scenes_from, catalog_file))
    report = _report(
        dataset, storage_options, chunks_per_task, quiet, scheduler, (scenes, scenes_from, catalog_file), cache
    )
    options = parse_storage_options(storage_options)
    if output:
        write_json(report, output, options)
    if scenes_table:
        write_scene_table(report, scenes_table, options)
    echo_answer(summary_text(report), quiet, output, "wrote " + ", ".join(p for p in (output, scenes_table) if p))


@click.command()
@click.argument("dataset")
@click.option("--json", "json_path", help="also write the report (JSON) here")
@click.option("--scenes-table", help="also write the per-scene table (Parquet)")
@click.option(
    "--no-catalog",
    "no_catalog",
    is_flag=True,
    help="leave out the section of the scene catalog (its pass is fused with the report's: each chunk read once)",
)
@shared(
    output="write the HTML report here: a path or a URL",
    output_required=True,
    chunks=True,
    cache=True,
    scheduler=True,
    scenes=True,
)
def report(
    dataset: str,
    json_path,
    scenes_table,
    no_catalog,
    quiet,
    output,
    scenes,
    scenes_from,
    catalog_file,
    chunks_per_task,
    cache,
    scheduler,
    storage_options,
) -> None:
    """A self-contained HTML report of DATASET (figures inlined), from the same one pass as stats."""
    from l5dask.prediction.html import write_html
    from l5dask.prediction.report import write_json, write_scene_table

    check_outputs(
        storage_options, output, json_path, scenes_table, inputs=inputs_of(dataset, scenes_from, catalog_file)
    )
    start = time.perf_counter()
    table = None
    filters = (scenes, scenes_from, catalog_file)
    if not no_catalog:
        from l5dask.core.cluster import connect
        from l5dask.prediction.analyses import Catalog, Report, analyze

        with connect(scheduler, quiet=True) as client:
            both = analyze(
                scene_filter(dataset, scenes, scenes_from, catalog_file, storage_options, quiet, client, cache),
                {"report": Report(), "catalog": Catalog()},
                storage_options=parse_storage_options(storage_options),
                chunks_per_task=chunks_per_task,
                progress=not quiet,
                scheduler=client,
                cache=cache,
            )
        rep, table = both["report"], both["catalog"]
    else:
        rep = _report(dataset, storage_options, chunks_per_task, quiet, scheduler, filters, cache)
    options = parse_storage_options(storage_options)
    write_html(rep, output, elapsed_s=time.perf_counter() - start, storage_options=options, catalog=table)
    if json_path:
        write_json(rep, json_path, options)
    if scenes_table:
        write_scene_table(rep, scenes_table, options)
    click.echo(f"wrote {', '.join(str(p) for p in (output, json_path, scenes_table) if p)}")


@click.command()
@click.argument("dataset")
@click.option("--array", "-a", default="agents", show_default=True, help="agents, frames, scenes or tl_faces")
@click.option("--by", "-b", default="", help="columns to group by, comma-separated (e.g. scene_index,label)")
@click.option(
    "--value",
    "values",
    multiple=True,
    required=True,
    metavar="COLUMN:REDUCTIONS",
    help="a column and its reductions (repeatable), e.g. speed:mean,max,count or extent_length:q50,q99",
)
@click.option("--where", "-w", default=None, help='keep rows where this holds, e.g. "distance_to_ego < 20"')
@click.option(
    "--max-groups",
    default=None,
    type=click.IntRange(1),
    help="refuse groupings that may make more groups [default: 10,000,000]",
)
@click.option(
    "--quantile-bits",
    default=None,
    type=click.IntRange(0, 52),
    help="mantissa bits of the quantile sketch (52: exact) [default: 12, relative error <= 1.2e-4]",
)
@shared(
    output="write the result here (.parquet or .csv; a path or an s3:// URL); default: print it",
    chunks=True,
    cache=True,
    scheduler=True,
    scenes=True,
)
def agg(
    dataset: str,
    array: str,
    by: str,
    values,
    where,
    max_groups,
    quantile_bits,
    quiet: bool,
    output,
    scenes,
    scenes_from,
    catalog_file,
    chunks_per_task,
    cache,
    scheduler,
    storage_options,
) -> None:
    """Group the rows of one array of DATASET and reduce columns, in one parallel pass.

    Columns (an unknown one is refused with the list of those that exist): stored fields
    (centroid_x, extent_length, velocity_y, track_id, one per label name...), derived (label,
    speed, hour, num_agents...) and joins (scene_index, frame_index, timestamp, host, ego_x,
    ego_y, distance_to_ego). Reductions: count, sum, mean, min, max, var, std, median, q<percent>.
    """
    from l5dask.core.cluster import connect
    from l5dask.core.outputs import table_format, write_table
    from l5dask.prediction import aggregation as agg_mod
    from l5dask.prediction import format as fmt

    options = parse_storage_options(storage_options)
    if output:
        table_format(output)
    check_outputs(storage_options, output, inputs=inputs_of(dataset, scenes_from, catalog_file))
    values_map = agg_mod.parse_value_options(values)
    kw = {k: v for k, v in (("max_groups", max_groups), ("quantile_bits", quantile_bits)) if v is not None}
    by_columns = [b.strip() for b in by.split(",") if b.strip()]
    # (the note on renumbered indices: said where the output has such a column)
    indices = any(c in fmt.RENUMBERED for c in (*by_columns, *values_map))
    with connect(scheduler, quiet=True) as client:
        result = agg_mod.aggregate_result(
            scene_filter(dataset, scenes, scenes_from, catalog_file, storage_options, quiet, client, cache, indices),
            array,
            by=by_columns,
            values=values_map,
            where=where,
            storage_options=options,
            chunks_per_task=chunks_per_task,
            scheduler=client,
            progress=not quiet,
            cache=cache,
            **kw,
        )
    if output:
        table = result.to_arrow()
        write_table(table, output, options)
        click.echo(f"wrote {output}: {table.num_rows:,} group{'' if table.num_rows == 1 else 's'}")
    else:
        import pandas as pd

        frame = result.to_pandas()
        if not len(frame):  # (pandas' repr of it is "Empty DataFrame / Columns: [...] / Index: []")
            click.echo(f"no group: no row is kept (the columns: {', '.join(map(str, frame.columns))})")
            return
        with pd.option_context("display.max_rows", 60, "display.width", 200):
            click.echo(frame.to_string(index=False) if len(frame) <= 60 else frame)


@click.command()
@num_scenes_option(200, minimum=1, help="scenes to generate (200 is about 3.5 M agents)")
@shared(output="the folder for the generated dataset and the report", output_default="l5dask-demo", storage=False)
def demo(num_scenes: int, old_num_scenes: int, quiet: bool, output: str) -> None:
    """The main job on an embedded default: generate a dataset, then its statistics report."""
    scenes = scene_count(num_scenes, old_num_scenes)

    from l5dask.prediction.report import (
        compute_report,
        summary_text,
        write_json,
        write_scene_table,
    )
    from l5dask.prediction.synth import synthesize

    out = output
    if os.path.exists(out) and not os.path.isdir(out):
        from l5dask.errors import OutputError

        raise OutputError(f"{out}: is a file, not a folder")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"synth-{scenes}.zarr")
    if not os.path.exists(os.path.join(path, ".zgroup")):
        start = time.perf_counter()
        counts = synthesize(path, num_scenes=scenes, seed=0, overwrite=True)
        if not quiet:
            click.echo(
                f"generated {path}: {counts['agents']:,} agents in {time.perf_counter() - start:.1f} s", err=True
            )
    start = time.perf_counter()
    report = compute_report(path, progress=not quiet)
    took = time.perf_counter() - start
    from l5dask.prediction.html import write_html

    write_json(report, os.path.join(out, "report.json"))
    write_scene_table(report, os.path.join(out, "scenes.parquet"))
    start = time.perf_counter()
    write_html(report, os.path.join(out, "report.html"), elapsed_s=took)
    drawn = time.perf_counter() - start
    done = (
        f"report of {report['counts']['agents']:,} agents in {took:.1f} s (its page's figures drawn in "
        f"{drawn:.1f} s): {os.path.join(out, 'report.json')}, scenes.parquet, report.html"
    )
    echo_answer(summary_text(report), quiet, out, done)  # (then done)


def _written(ds, seconds: float) -> None:
    counts = ", ".join(f"{n:,} {k}" for k, n in ds.counts().items())
    masks = f"; agent masks {', '.join(ds.masks)}" if ds.masks else ""
    click.echo(f"wrote {ds.url}: {counts}{masks} ({seconds:.1f} s)")


def _surgery(op, *args, scheduler, storage_options, quiet, filters=None, **kw):
    """Run one surgery operation (:mod:`l5dask.prediction.surgery`) on the embedded default or a
    cluster; ``filters`` (``--scenes``, ``--scenes-from``, ``--catalog``): on its first argument, the dataset."""
    from l5dask.core.cluster import connect

    t0 = time.perf_counter()
    with connect(scheduler, quiet=True) as client:
        if filters is not None:
            args = (scene_filter(args[0], *filters, storage_options, quiet, client), *args[1:])
        out = op(
            *args, storage_options=parse_storage_options(storage_options), scheduler=client, progress=not quiet, **kw
        )
    for ds in out.values() if isinstance(out, dict) else [out]:
        _written(ds, time.perf_counter() - t0)
    return out, args[0]


def writer_options(output: str, scenes: bool = True) -> Any:
    """The shared options of the commands that write a dataset or an export (``scenes``: with the
    scene filters, for those that read one dataset)."""
    return shared(
        output=output, output_required=True, overwrite="what exists there", chunks=True, scheduler=True, scenes=scenes
    )


@click.command()
@click.argument("inputs", nargs=-1, required=True)
@writer_options("the concatenated dataset: a folder or a URL", scenes=False)
def concat(inputs, quiet, output, overwrite, chunks_per_task, scheduler, storage_options) -> None:
    """Concatenate the datasets INPUTS into one, as L5Kit's zarr_concat (intervals rebased), in
    parallel; agent masks that every input holds are concatenated too. Inputs that cannot be
    opened, or differ in dtypes or labels, are refused."""
    from l5dask.prediction.dataset import open_dataset
    from l5dask.prediction.surgery import concat as op

    out, _ = _surgery(
        op,
        list(inputs),
        output,
        overwrite=overwrite,
        chunks_per_task=chunks_per_task,
        scheduler=scheduler,
        storage_options=storage_options,
        quiet=quiet,
    )
    options = parse_storage_options(storage_options)
    held = {m for path in inputs for m in open_dataset(path, storage_options=options).masks}
    dropped = sorted(held - set(out.masks))
    if dropped:  # (documented, and said: a mask only some inputs hold has no rows for the others)
        click.echo(
            f"l5dask: note: agent masks {', '.join(dropped)} are not in the output (not every input holds them)",
            err=True,
        )


@click.command()
@click.argument("dataset")
@click.option(
    "--ranges", default=None, metavar="START:END[,...]", help="stored scene indices [START, END), in this order"
)
@click.option("--hosts", default=None, metavar="H1,H2", help="keep the scenes of these hosts")
@click.option(
    "--start",
    default=None,
    metavar="ISO",
    help="keep scenes whose first frame is at or after this time (UTC unless said)",
)
@click.option("--end", default=None, metavar="ISO", help="... and before this time")
@writer_options("the dataset of the scenes kept: a folder or a URL")
def subset(
    dataset,
    ranges,
    hosts,
    start,
    end,
    quiet,
    output,
    overwrite,
    scenes,
    scenes_from,
    catalog_file,
    chunks_per_task,
    scheduler,
    storage_options,
) -> None:
    """Keep some scenes of DATASET (with their frames, agents, faces and agent masks) in OUTPUT,
    intervals rebased as L5Kit's _append_zarr_subset. Filters given together must all hold: a scene
    is kept when it is in --ranges (stored scene indices, as everywhere), of --hosts, in
    --start/--end, and chosen by --scenes and --scenes-from."""
    from l5dask.errors import UsageError
    from l5dask.prediction.surgery import parse_ranges
    from l5dask.prediction.surgery import subset as op

    filters = (scenes, scenes_from, catalog_file)
    if catalog_file is not None and scenes is None:
        raise UsageError("--catalog is read by --scenes: give --scenes EXPR too")
    if scenes is None and scenes_from is None and ranges is None and hosts is None and start is None and end is None:
        raise UsageError("say which scenes to keep: --scenes, --scenes-from, --ranges, --hosts, or --start/--end")
    if ranges is not None:
        parse_ranges(ranges, None)  # (its form, refused before any work; its bounds when the dataset is read)
    _surgery(
        op,
        dataset,
        output,
        filters=filters,
        scenes=ranges,
        hosts=hosts,
        start=start,
        end=end,
        overwrite=overwrite,
        chunks_per_task=chunks_per_task,
        scheduler=scheduler,
        storage_options=storage_options,
        quiet=quiet,
    )
    if ranges is not None or hosts is not None or start is not None or end is not None:
        # (the note counts the scenes the filters chose; the subset holds fewer: its indices are its own)
        click.get_current_context().meta.pop("l5dask.notes", None)


@click.command()
@click.argument("dataset")
@click.option(
    "--part",
    "parts",
    multiple=True,
    required=True,
    metavar="NAME=N|NAME=1.5GB|NAME=rest",
    help="a part written to OUTPUT/NAME: N scenes, a size as L5Kit's zarr_split counts it "
    "(GB of 1024^3 bytes), or the rest (last); repeatable, in order",
)
@writer_options("the folder of the parts (OUTPUT/NAME each): a path or a URL")
def split(
    dataset,
    parts,
    quiet,
    output,
    overwrite,
    scenes,
    scenes_from,
    catalog_file,
    chunks_per_task,
    scheduler,
    storage_options,
) -> None:
    """Split DATASET (or the scenes --scenes and --scenes-from keep) into consecutive parts of
    scenes, each a dataset under OUTPUT."""
    from l5dask.prediction import format as fmt
    from l5dask.prediction.dataset import L5Dataset, open_dataset
    from l5dask.prediction.surgery import split as op

    out, source = _surgery(
        op,
        dataset,
        output,
        list(parts),
        filters=(scenes, scenes_from, catalog_file),
        overwrite=overwrite,
        chunks_per_task=chunks_per_task,
        scheduler=scheduler,
        storage_options=storage_options,
        quiet=quiet,
    )
    if not isinstance(source, L5Dataset):
        source = open_dataset(source, storage_options=parse_storage_options(storage_options))
    n, kept = len(source[fmt.SCENES]), sum(len(part[fmt.SCENES]) for part in out.values())
    if kept < n:  # (L5Kit's zarr_split asks for a last part of the rest: said, not silent)
        click.echo(
            f"l5dask: note: scenes {kept:,} to {n - 1:,} ({n - kept:,} of {n:,}) are in no part (no NAME=rest)",
            err=True,
        )


@click.command()
@click.argument("dataset")
@click.option(
    "--format",
    "-f",
    "format_",
    default="parquet",
    show_default=True,
    metavar="parquet|zarr3",
    help="parquet: a Parquet dataset per array, with join columns (DuckDB, Polars, Spark...); zarr3: "
    "a zarr v3 group, one sharded array per field (zarr-python 3, xarray; l5dask reads it back)",
)
@writer_options("the export: a folder or a URL")
def export(
    dataset,
    format_,
    quiet,
    output,
    overwrite,
    scenes,
    scenes_from,
    catalog_file,
    chunks_per_task,
    scheduler,
    storage_options,
) -> None:
    """Export every array of DATASET (or of the scenes --scenes and --scenes-from keep) to OUTPUT
    (a folder or URL) in a columnar format."""
    from l5dask.core.cluster import connect
    from l5dask.prediction.exports import export as op

    t0 = time.perf_counter()
    with connect(scheduler, quiet=True) as client:
        rows = op(
            scene_filter(dataset, scenes, scenes_from, catalog_file, storage_options, quiet, client),
            output,
            format_,
            storage_options=parse_storage_options(storage_options),
            overwrite=overwrite,
            chunks_per_task=chunks_per_task,
            scheduler=client,
            progress=not quiet,
        )
    click.echo(
        f"wrote {output} ({format_}): "
        + ", ".join(f"{n:,} {k}" for k, n in rows.items())
        + f" ({time.perf_counter() - t0:.1f} s)"
    )


@click.command()
@click.argument("dataset")
@click.option(
    "--full",
    is_flag=True,
    help="decode every stored chunk (by default each chunk's size and blosc header are checked: a 16-byte read each)",
)
@shared(scheduler=True)
def validate(dataset: str, full: bool, quiet: bool, scheduler, storage_options) -> None:
    """Check every stored chunk of DATASET against its .zarray (stored, its size and header) and
    every index interval; print each fault on a line and exit 1 when there is any. Reports, never
    repairs."""
    from l5dask.core.cluster import connect
    from l5dask.errors import FormatError
    from l5dask.prediction.dataset import open_dataset
    from l5dask.prediction.joins import validate as check

    try:
        ds = open_dataset(dataset, storage_options=parse_storage_options(storage_options))
    except FormatError as exc:  # (damaged metadata: a fault of the dataset, said as the others)
        problems = [str(exc)]
    else:
        with connect(scheduler, quiet=True) as client:
            problems = check(ds, full=full, scheduler=client, progress=not quiet)
    for p in problems:
        click.echo(p)
    if problems:
        click.echo(f"{len(problems)} fault(s)", err=True)
        sys.exit(1)
    click.echo(f"{dataset}: no faults ({'every chunk decoded' if full else 'chunk headers and sizes'}, intervals)")


@click.command()
@click.argument("dataset")
@click.option(
    "--tz",
    default="America/Los_Angeles",
    show_default=True,
    help="the time zone (IANA name) of the local hour and weekday columns",
)
@click.option(
    "--html", "html_path", help="also write the catalog's page (HTML: figures, a table that sorts and filters)"
)
@shared(
    output="write the catalog (Parquet) here: a path or a URL",
    output_required=True,
    overwrite="the file that exists at the output",
    chunks=True,
    cache=True,
    scheduler=True,
    scenes=True,
)
def catalog(
    dataset: str,
    tz: str,
    html_path,
    quiet: bool,
    output,
    overwrite: bool,
    scenes,
    scenes_from,
    catalog_file,
    chunks_per_task,
    cache,
    scheduler,
    storage_options,
) -> None:
    """Write the scene catalog of DATASET (a row per scene: time, ego motion, turn, agents near the
    ego, traffic lights) from one parallel pass."""
    from l5dask.core.cluster import connect
    from l5dask.prediction.catalog import catalog_table as make
    from l5dask.prediction.catalog import check_output, check_tz, write_catalog

    options = parse_storage_options(storage_options)
    check_tz(tz)
    check_output(output, options, overwrite)
    check_outputs(storage_options, output, html_path, inputs=inputs_of(dataset, scenes_from, catalog_file))
    t0 = time.perf_counter()
    with connect(scheduler, quiet=True) as client:
        table = make(
            scene_filter(dataset, scenes, scenes_from, catalog_file, storage_options, quiet, client, cache),
            tz=tz,
            storage_options=options,
            chunks_per_task=chunks_per_task,
            progress=not quiet,
            scheduler=client,
            cache=cache,
        )
    write_catalog(table, output, options, overwrite=overwrite)
    if html_path:
        from l5dask.prediction.html import write_catalog_html

        write_catalog_html(table, html_path, dataset, time.perf_counter() - t0, options)
    click.echo(
        f"wrote {output}{' and ' + str(html_path) if html_path else ''}: {len(table):,} scenes, "
        f"{len(table.columns)} columns ({time.perf_counter() - t0:.1f} s)"
    )


COMMANDS = [synth, info, stats, report, agg, demo, concat, subset, split, export, validate, catalog]
