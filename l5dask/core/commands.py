"""The command line's shared parts, for every system's commands: the storage and scheduler options,
the one error path (a user's mistake is one line on stderr and exit code 2) and the check of the
outputs before any work."""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import Any

import click

from l5dask.core.outputs import check_writable
from l5dask.errors import L5DaskError, UsageError

EXIT_USER_ERROR = 2


def parse_storage_options(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs to fsspec storage options; dotted keys nest, values parse as JSON if they can."""
    options: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise UsageError(f"--storage-option {pair!r}: expected KEY=VALUE")
        key, value = pair.split("=", 1)
        try:
            parsed: Any = json.loads(value)
        except ValueError:
            parsed = value
        node = options
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = parsed
    return options


def friendly(func):
    """Turn expected errors into one line on stderr and exit code 2."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except L5DaskError as exc:
            click.echo(f"l5dask: error: {exc}", err=True)
            sys.exit(EXIT_USER_ERROR)
        except KeyboardInterrupt:
            # the main thread has unwound (its outputs are atomic: nothing half-written is left);
            # end now: an interpreter exit would wait for the worker threads' reads in flight,
            # a stalled one up to its read timeout
            click.echo("l5dask: interrupted", err=True)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)
        except OSError as exc:
            click.echo(f"l5dask: error: {exc}", err=True)
            sys.exit(EXIT_USER_ERROR)

    return wrapper


storage_option = click.option(
    "--storage-option",
    "-o",
    "storage_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="fsspec storage option (repeatable), e.g. -o client_kwargs.endpoint_url=http://127.0.0.1:5000",
)


scheduler_option = click.option(
    "--scheduler",
    "scheduler",
    metavar="ADDRESS",
    default=None,
    help="run on this dask.distributed scheduler (tcp://host:8786); default: DASK_SCHEDULER_ADDRESS, "
    "else the embedded default (local threads)",
)


chunks_option = click.option(
    "--chunks-per-task",
    default=None,
    type=click.IntRange(1),
    help="stored chunks per task [default: sized for the scheduler: up to 8 on local threads, 64 on a cluster]",
)


def check_outputs(storage_options, *paths: str | None) -> None:
    """Check every output before any work: a missing folder or bucket fails now, not after the
    computation. Outputs on an object store use the same ``-o`` storage options as the dataset."""
    for p in paths:
        if p:
            check_writable(p, parse_storage_options(storage_options))
