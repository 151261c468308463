"""The evaluation commands (``evaluate``, ``select-agents``, ``gt``, ``chop``), added to ``l5dask``'s
command line with its one error path: a user's mistake is one line on stderr and exit 2."""

from __future__ import annotations

import time

import click

from l5dask.core.commands import check_outputs, echo_answer, parse_storage_options, shared

threshold_option = click.option(
    "--threshold",
    default=0.5,
    show_default=True,
    type=click.FloatRange(0, 1),
    help="label filter: summed agent-like label probability must be above it",
)


def _job(client, quiet: bool, chunks_per_task=None):
    from l5dask.core.engine import Job

    return Job(client, progress=not quiet, chunks_per_task=chunks_per_task)


@click.command()
@click.argument("gt")
@click.argument("pred")
@click.option(
    "--max-modes", default=3, show_default=True, type=click.IntRange(1), help="modes of the PRED file (L5Kit's M)"
)
@click.option("--dataset", help="the dataset the GT comes from: adds breakdowns by label and by scene")
@click.option("--html", "html_path", help="also write a self-contained HTML page with plots")
@shared(output="write the metrics (JSON) here: a path or a URL; they are printed too, unless -q", scheduler=True)
def evaluate(gt, pred, max_modes, dataset, html_path, quiet, output, scheduler, storage_options) -> None:
    """L5Kit's eight metrics of the prediction file PRED against the ground truth GT (rows joined
    on (timestamp, track_id)), in one parallel pass over both files, printed (and written to
    OUTPUT if given)."""
    from l5dask.core.cluster import connect
    from l5dask.core.outputs import write_json
    from l5dask.evaluation.metrics import METRICS
    from l5dask.evaluation.metrics import evaluate as run

    check_outputs(storage_options, output, html_path, inputs=[p for p in (gt, pred, dataset) if p])
    opts = parse_storage_options(storage_options)
    t0 = time.perf_counter()
    with connect(scheduler, quiet=True) as client:
        result = run(gt, pred, max_modes, dataset=dataset, storage_options=opts, scheduler=_job(client, quiet))
    took = time.perf_counter() - t0
    if output:
        write_json(result, output, opts)
    if html_path:
        from l5dask.core.page import write_page
        from l5dask.evaluation.html import render_evaluation

        write_page(render_evaluation(result, gt, pred, took), html_path, opts)
    written = ", ".join(p for p in (output, html_path) if p)
    done = f"{result['rows']:,} rows in {took:.1f} s" + (f": {written}" if written else "")
    table = "\n".join(f"{k:<36} {_shown(k, result[k])}" for k in METRICS)
    echo_answer(table if output else f"{table}\n{done}", quiet, output, done)  # (done: said once)


def _shown(name: str, v) -> str:
    """A metric's mean as the summary prints it; ``prob_true_mode``: each mode's (a row's modes'
    probabilities add up to 1, so their mean is always 1/M and says nothing)."""
    if v is None or isinstance(v, float):
        return "none" if v is None else f"{v:.6g}"
    if name == "prob_true_mode":
        return " ".join("none" if x is None else f"{x:.4g}" for x in v) + "  (each mode's, in the file's order)"
    known = [x for x in v if x is not None]
    return f"[{len(v)} values, mean {sum(known) / len(known):.4g}]" if known else f"[{len(v)} values, none]"


@click.command("select-agents")
@click.argument("dataset")
@threshold_option
@click.option("--yaw-degrees", default=30.0, show_default=True, type=float, help="max yaw change between frames")
@click.option("--extent-ratio", default=1.1, show_default=True, type=float, help="max ratio of extent areas")
@click.option("--distance-m", default=50.0, show_default=True, type=float, help="max distance from the ego")
@shared(
    output="write the mask array here instead of into DATASET",
    overwrite="an existing mask",
    chunks=True,
    scheduler=True,
    scenes=True,
)
def select_agents(
    dataset,
    threshold,
    yaw_degrees,
    extent_ratio,
    distance_m,
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
    """Write L5Kit's agents mask agents_mask/THRESHOLD into DATASET (as select_agents) and print
    its report and past/future table."""
    from l5dask.core.cluster import connect
    from l5dask.core.outputs import json_text
    from l5dask.errors import UsageError
    from l5dask.evaluation.agents import mask_name, table_text
    from l5dask.evaluation.agents import select_agents as run
    from l5dask.prediction.cli import scene_filter

    if (scenes is not None or scenes_from is not None) and not output:
        raise UsageError(
            "select-agents with --scenes or --scenes-from writes the mask of those scenes' agents: give -o for it "
            "(it cannot go into DATASET, whose agents are all the scenes')"
        )
    t0 = time.perf_counter()
    with connect(scheduler, quiet=True) as client:
        rep = run(
            scene_filter(dataset, scenes, scenes_from, catalog_file, storage_options, quiet, client),
            threshold,
            yaw_degrees,
            extent_ratio,
            distance_m,
            output=output,
            overwrite=overwrite,
            storage_options=parse_storage_options(storage_options),
            scheduler=_job(client, quiet, chunks_per_task),
        )
    click.echo(json_text({k: v for k, v in rep.items() if k != "past_future"}, indent=1))
    click.echo(table_text(rep))
    where = output or f"{dataset}/{mask_name(threshold)}"
    click.echo(f"wrote {where}: {rep['total_agent_frames']:,} agents in {time.perf_counter() - t0:.1f} s")


@click.command("gt")
@click.argument("dataset")
@click.option("--future-frames", default=50, show_default=True, type=click.IntRange(1), help="T")
@threshold_option
@click.option("--mask", "mask", help="L5Kit's mask.npz (key arr_0), or a .npy of the array: the agents to export")
@click.option("--min-history", default=None, type=click.IntRange(0), help="with the agents mask [default: 10]")
@click.option("--min-future", default=None, type=click.IntRange(0), help="with the agents mask [default: 1]")
@shared(output="the GT CSV: a path or a URL", output_required=True, chunks=True, scheduler=True, scenes=True)
def gt(
    dataset,
    future_frames,
    threshold,
    mask,
    min_history,
    min_future,
    quiet,
    output,
    scenes,
    scenes_from,
    catalog_file,
    chunks_per_task,
    scheduler,
    storage_options,
) -> None:
    """The ground-truth CSV of DATASET (or of the scenes --scenes and --scenes-from keep) as
    L5Kit's export_zarr_to_csv writes it."""
    from l5dask.core.cluster import connect
    from l5dask.errors import UsageError
    from l5dask.evaluation.ground_truth import (
        MIN_FRAME_FUTURE,
        MIN_FRAME_HISTORY,
        export_zarr_to_csv,
    )
    from l5dask.prediction.cli import inputs_of, scene_filter

    if mask and (min_history is not None or min_future is not None):
        raise UsageError("--mask selects the agents itself: give it, or --min-history/--min-future, not both")
    check_outputs(storage_options, output, inputs=inputs_of(dataset, scenes_from, catalog_file))
    t0 = time.perf_counter()
    with connect(scheduler, quiet=True) as client:
        rows = export_zarr_to_csv(
            scene_filter(dataset, scenes, scenes_from, catalog_file, storage_options, quiet, client),
            output,
            future_frames,
            threshold,
            mask,
            min_frame_history=MIN_FRAME_HISTORY if min_history is None else min_history,
            min_frame_future=MIN_FRAME_FUTURE if min_future is None else min_future,
            storage_options=parse_storage_options(storage_options),
            scheduler=_job(client, quiet, chunks_per_task),
        )
    click.echo(f"wrote {output}: {rows:,} rows in {time.perf_counter() - t0:.1f} s")


@click.command()
@click.argument("dataset")
@click.option("--frames", "frames", required=True, type=click.IntRange(1), help="frames kept per scene (N)")
@click.option("--future-frames", default=50, show_default=True, type=click.IntRange(1), help="T of gt.csv")
@click.option(
    "--min-future",
    default=10,
    show_default=True,
    type=click.IntRange(0),
    help="future frames an agent needs in the agents mask",
)
@threshold_option
@shared(
    output="the folder to write the trio into",
    output_required=True,
    overwrite="what exists there",
    chunks=True,
    scheduler=True,
    scenes=True,
)
def chop(
    dataset,
    frames,
    future_frames,
    min_future,
    threshold,
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
    """L5Kit's create_chopped_dataset: OUTPUT/<dataset name> chopped at --frames, mask.npz, gt.csv."""
    from l5dask.core.cluster import connect
    from l5dask.evaluation.chop import create_chopped_dataset
    from l5dask.prediction.cli import scene_filter

    t0 = time.perf_counter()
    with connect(scheduler, quiet=True) as client:
        out = create_chopped_dataset(
            scene_filter(dataset, scenes, scenes_from, catalog_file, storage_options, quiet, client),
            threshold,
            frames,
            future_frames,
            min_future,
            output=output,
            overwrite=overwrite,
            storage_options=parse_storage_options(storage_options),
            scheduler=client,
            progress=not quiet,
            chunks_per_task=chunks_per_task,
        )
    click.echo(f"wrote {out}: the chopped dataset, mask.npz, gt.csv in {time.perf_counter() - t0:.1f} s")


COMMANDS = (evaluate, select_agents, gt, chop)
