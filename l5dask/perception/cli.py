"""``l5dask perception ...``: the perception commands, a group of their own, sharing ``l5dask``'s one
error path (a user's mistake is one line on stderr and exit 2) and its atomic outputs."""

from __future__ import annotations

import time

import click

from l5dask.core.commands import (
    check_outputs,
    echo_answer,
    num_scenes_option,
    parse_storage_options,
    scene_count,
    shared,
)

lidar_option = click.option("--no-lidar", is_flag=True, help="leave out the lidar.* keys (no listing of the sweeps)")
boxes_option = click.option(
    "--points-in-boxes", is_flag=True, help="also count lidar points in every box (reads the key-frame sweeps)"
)


def pass_options(func):
    """The own options of a command that runs the report's pass (stats, report)."""
    for option in (boxes_option, lidar_option):
        func = option(func)
    return func


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def perception() -> None:
    """The Lyft perception dataset (nuScenes-style JSON tables, lidar sweeps, images)."""


def _run(data, storage_options, scheduler, quiet, no_lidar, points_in_boxes):
    from l5dask.core.cluster import connect
    from l5dask.perception import open_perception
    from l5dask.perception.report import perception_report

    opts = parse_storage_options(storage_options)
    t0 = time.perf_counter()
    with connect(scheduler, quiet=True) as client:
        job = None  # on this machine without the lidar pass, no dask engine (its imports cost 0.3 s)
        if client or points_in_boxes:
            from l5dask.core.engine import Job

            job = Job(client, progress=not quiet and points_in_boxes)
        ds = open_perception(data, opts, scheduler=job)
        report = perception_report(ds, lidar=not no_lidar, points_in_boxes=points_in_boxes)
    took = time.perf_counter() - t0
    if not quiet:  # (one line a stage, named, as the passes' progress in a log)
        click.echo(f"l5dask: tables: the 13 tables of {ds.url} in {took:.1f} s", err=True)
    return report, took, opts


@perception.command()
@click.argument("data")
@pass_options
@shared(output="write the report (JSON) here: a path or a URL", scheduler=True)
def stats(data, output, no_lidar, points_in_boxes, quiet, scheduler, storage_options) -> None:
    """The perception report of DATA (a folder, .zip, .tar or URL) from one parallel pass."""
    from l5dask.core.outputs import write_json
    from l5dask.perception.report import summary

    check_outputs(storage_options, output, inputs=(data,))
    report, _, opts = _run(data, storage_options, scheduler, quiet, no_lidar, points_in_boxes)
    if output:
        write_json(report, output, opts)
    echo_answer(summary(report), quiet, output)


@perception.command()
@click.argument("data")
@click.option("--json", "json_path", help="also write the report (JSON) here")
@pass_options
@shared(output="write the HTML report here: a path or a URL", output_required=True, scheduler=True)
def report(data, output, json_path, no_lidar, points_in_boxes, quiet, scheduler, storage_options) -> None:
    """A self-contained HTML report of DATA (figures inlined), from the same pass as stats."""
    from l5dask.core.outputs import write_json
    from l5dask.core.page import write_page
    from l5dask.perception.html import render_perception

    check_outputs(storage_options, output, json_path, inputs=(data,))
    rep, took, opts = _run(data, storage_options, scheduler, quiet, no_lidar, points_in_boxes)
    write_page(render_perception(rep, data, took), output, opts)
    if json_path:
        write_json(rep, json_path, opts)
    click.echo(f"wrote {output}")


@perception.command()
@click.argument("pred")
@click.option("--gt", "gt", help="the ground truth: the SDK's JSON or the competition's CSV (a path or a URL)")
@click.option("--dataset", help="or the ground truth of a perception dataset (its sample_annotation)")
@click.option(
    "--iou",
    default=",".join(map(str, (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95))),
    show_default=True,
    help="IoU thresholds, comma-separated",
)
@click.option("--html", "html_path", help="also write a page: precision-recall curves, AP by threshold and distance")
@click.option("--curves", is_flag=True, help="put the precision-recall curves in the JSON too")
@click.option(
    "--geometry",
    default="corrected",
    show_default=True,
    metavar="corrected|sdk-0.0.8",
    help="the boxes' ground rectangles: the SDK's source since its fix of the yaw's sign (PR #64), or its "
    "PyPI release 0.0.8 bit for bit (every yaw mirrored)",
)
@click.option(
    "--allow-unknown-samples",
    is_flag=True,
    help="count predictions on samples the ground truth does not list as false positives (else an error)",
)
@click.option(
    "--allow-unknown-classes",
    is_flag=True,
    help="leave out predictions of classes the ground truth has no box of, as the SDK does (else an error)",
)
@shared(output="write the metrics (JSON) here: a path or a URL; the mAP is printed too, unless -q", scheduler=True)
def evaluate(
    pred,
    gt,
    dataset,
    output,
    iou,
    html_path,
    curves,
    geometry,
    allow_unknown_samples,
    allow_unknown_classes,
    storage_options,
    scheduler,
    quiet,
) -> None:
    """The Lyft SDK's 3D-detection mAP of PRED (the SDK's JSON or the competition's CSV): AP per
    class and IoU threshold, mAP per threshold and their mean, exact, every threshold in one pass."""
    from l5dask.core.cluster import connect
    from l5dask.core.engine import Job
    from l5dask.core.outputs import write_json
    from l5dask.errors import StoreError, UsageError
    from l5dask.perception import detection

    if (gt is None) == (dataset is None):
        raise UsageError("give the ground truth: --gt FILE or --dataset DATA (one of them)")
    try:
        thresholds = [float(t) for t in iou.split(",") if t.strip()]
    except ValueError:
        raise UsageError(f"--iou: {iou!r} is not a comma-separated list of numbers") from None
    if geometry not in detection.GEOMETRIES:
        raise UsageError(f"--geometry: {geometry!r} is not one of {', '.join(detection.GEOMETRIES)}")
    check_outputs(storage_options, output, html_path, inputs=[p for p in (pred, gt, dataset) if p])
    opts = parse_storage_options(storage_options)
    t0 = time.perf_counter()
    with connect(scheduler, quiet=True) as client:
        job = Job(client)
        kw = dict(
            iou_thresholds=thresholds,
            scheduler=job,
            allow_unknown_samples=allow_unknown_samples,
            allow_unknown_classes=allow_unknown_classes,
            geometry=geometry,
        )
        if dataset is not None:  # (the dataset's boxes are in memory: the predictions too, for the bands)
            from l5dask.perception import open_perception

            truth, egos = detection.boxes_of_dataset(open_perception(dataset, opts))
            boxes = detection.read_boxes(pred, "pred", opts)
            result = detection.evaluate(boxes, truth, curves=curves or bool(html_path), **kw)
            result["by_distance"] = detection.by_distance(boxes, truth, egos, **kw)
        else:  # two files: read by the tasks, in blocks where they can be
            try:
                result = detection.evaluate(pred, gt, storage_options=opts, curves=curves or bool(html_path), **kw)
            except StoreError as exc:
                if str(exc) != f"{gt}: a folder, not a file":
                    raise
                raise UsageError(
                    f"--gt {gt}: a folder, not a file (a perception dataset's annotations are given with --dataset)"
                ) from None
    took = time.perf_counter() - t0
    if html_path:
        from l5dask.core.page import write_page
        from l5dask.perception.html import render_detection

        write_page(render_detection(result, pred, took), html_path, opts)
    if not curves:
        result.pop("curves", None)
    if output:
        write_json(result, output, opts)
    for w in result.get("warnings", []):
        click.echo(f"l5dask: warning: {w}", err=True)
    echo_answer(detection.summary(result), quiet, output)  # (the answer: printed with -q, unless -o wrote it)
    if not quiet:  # (one line a stage, named, as the passes' progress in a log)
        click.echo(f"l5dask: detection: every threshold of {pred} in {took:.1f} s", err=True)


@perception.command("to-l5kit")
@click.argument("data")
@shared(
    output="the L5Kit dataset to write: a folder or a URL",
    output_required=True,
    overwrite="a dataset that exists there",
)
def to_l5kit(data, quiet, output, overwrite, storage_options) -> None:
    """Write DATA as an L5Kit dataset at OUTPUT (scenes, frames = samples, agents = annotations)."""
    from l5dask.perception import open_perception
    from l5dask.perception.to_l5kit import to_l5kit as convert

    opts = parse_storage_options(storage_options)
    t0 = time.perf_counter()
    rows = convert(open_perception(data, opts), output, opts, overwrite=overwrite)
    click.echo(
        f"{rows['scenes']:,} scenes, {rows['frames']:,} frames, {rows['agents']:,} agents in "
        f"{time.perf_counter() - t0:.1f} s: {output}"
    )


@perception.command()
@num_scenes_option(2)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--lidar-points",
    default=2000,
    show_default=True,
    type=click.IntRange(0),
    help="points of each sweep (0: no lidar files)",
)
@click.option("--no-images", is_flag=True, help="write no camera files")
@shared(
    output="the dataset's folder (local)",
    output_required=True,
    overwrite="a dataset that exists there",
    storage=False,
)
def synth(num_scenes, old_num_scenes, seed, lidar_points, no_images, quiet, output, overwrite) -> None:
    """Generate a realistic perception dataset at OUTPUT (a local folder) that the Lyft SDK loads."""

    from l5dask.core.outputs import atomic_output

    out = output
    scenes = scene_count(num_scenes, old_num_scenes)
    from l5dask.perception.synth import check_output, generate

    check_output(out, overwrite)
    t0 = time.perf_counter()
    with atomic_output(out, folder=True) as tmp:  # (a folder beside it, in place once whole)
        rows = generate(tmp, num_scenes=scenes, seed=seed, lidar_points=lidar_points, images=not no_images)
    click.echo(
        f"{rows['scene']:,} scenes, {rows['sample']:,} samples, {rows['sample_annotation']:,} annotations "
        f"in {time.perf_counter() - t0:.1f} s: {out}"
    )


COMMANDS = [perception]
