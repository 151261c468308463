"""The core's commands: ``l5dask cache info|prune``, the cache of partial results
(:mod:`l5dask.core.cache`), added to ``l5dask``'s command line with its one error path."""

from __future__ import annotations

import datetime as _dt

import click

from l5dask.core.commands import parse_storage_options, shared


@click.group()
def cache() -> None:
    """The cache of partial results (--cache): its size and entries, and trimming it."""


def _open(location: str, storage_options):
    from l5dask.core.cache import Cache, require_cache
    from l5dask.errors import UsageError

    try:
        return require_cache(Cache(location, parse_storage_options(storage_options)))
    except UsageError as exc:  # (said of the location given, not of --cache)
        raise UsageError(str(exc).removeprefix("--cache ")) from None


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n} B"


@cache.command()
@click.argument("location")
@click.option("--json", "as_json", is_flag=True, help="print it as JSON")
@shared()
def info(location: str, as_json: bool, quiet: bool, storage_options) -> None:
    """Print the size and entries of the cache at LOCATION, by dataset, array and reduction."""
    from l5dask.core.cache import info as describe
    from l5dask.core.outputs import json_text

    got = describe(_open(location, storage_options))
    if as_json:
        click.echo(json_text(got))
        return
    when = lambda t: _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")  # noqa: E731
    click.echo(f"{got['cache']}: {got['entries']:,} entries, {_size(got['bytes'])}")
    if got["entries"]:
        click.echo(f"  written from {when(got['oldest'])} to {when(got['newest'])}")
    rows = got["by"]
    w = {k: max((len(str(r[k])) for r in rows), default=0) for k in ("dataset", "source", "reduction")}
    for row in rows:  # (columns as wide as their longest value: traffic_light_faces)
        click.echo(
            f"  {row['dataset']:<{w['dataset']}}  {row['source']:<{w['source']}}  {row['reduction']:<{w['reduction']}}  "
            f"{row['entries']:>7,} entries  {_size(row['bytes']):>10}"
        )


@cache.command()
@click.argument("location")
@click.option(
    "--max-size",
    required=True,
    metavar="SIZE",
    help="remove the oldest entries until the cache holds at most this much (500MB, 10GB, 2GiB; 0: all)",
)
@shared()
def prune(location: str, max_size: str, quiet: bool, storage_options) -> None:
    """Remove the oldest entries of the cache at LOCATION until it holds at most --max-size."""
    from l5dask.core.cache import parse_size
    from l5dask.core.cache import prune as trim

    limit = parse_size(max_size)
    removed, freed = trim(_open(location, storage_options), limit)
    click.echo(f"removed {removed:,} entries ({_size(freed)}) from {location}")


COMMANDS = [cache]
