"""The command line's shared parts, for every system's commands: the storage and scheduler options,
the one error path (a user's mistake is one line on stderr and exit code 2) and the check of the
outputs before any work."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import sys
from collections.abc import Sequence
from typing import Any

import click

from l5dask.core import config
from l5dask.core.outputs import check_writable
from l5dask.core.store import Store, nesting
from l5dask.errors import ChunkError, L5DaskError, OutputError, UsageError

EXIT_USER_ERROR = 2


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's stop, Kubernetes ending a pod), raised in the main thread as Ctrl-C
    is: the command unwinds the same way (temporary outputs removed, a run's record written)."""


def stop_on_sigterm() -> None:
    """From now on SIGTERM interrupts the main thread as Ctrl-C does (:class:`Terminated`); its
    default ended the process at once, leaving a half-written folder and no run record."""

    def terminate(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # (a second SIGTERM ends the process at once)
        raise Terminated()

    signal.signal(signal.SIGTERM, terminate)


def parse_storage_options(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs to fsspec storage options; dotted keys nest, values parse as JSON if they can (one that starts with ``{`` or ``[`` must: a one-line error)."""
    options: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise UsageError(f"--storage-option {pair!r}: expected KEY=VALUE")
        key, value = pair.split("=", 1)
        try:
            parsed: Any = json.loads(value)
        except ValueError as exc:
            if value.lstrip().startswith(("{", "[")):  # (meant as JSON: never taken as a string)
                raise UsageError(
                    f"--storage-option {pair!r}: its value starts as JSON but does not parse ({exc}); "
                    "a string that starts so is written as JSON, in double quotes"
                ) from None
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
            if any(k.startswith("DASK_L5DASK") for k in os.environ):  # (settings checked first, in one line)
                config.check_all()
            return func(*args, **kwargs)
        except L5DaskError as exc:
            code = getattr(exc, "exit_code", EXIT_USER_ERROR)
            line = str(exc)
            # (a damaged chunk met by a pass names its array and chunk; the command's dataset too,
            # as a missing one's line does)
            dataset = kwargs.get("dataset")
            if isinstance(exc, ChunkError) and isinstance(dataset, str) and not line.startswith(dataset):
                line = f"{dataset}: {line}"
            # (an answer such as "no scene", exit 1, is said as what it is, not as an error)
            click.echo(f"l5dask: {'' if code == 1 else 'error: '}{line}", err=True)
            sys.exit(code)
        except KeyboardInterrupt:
            # the main thread has unwound (its outputs are atomic: nothing half-written is left);
            # end now: an interpreter exit would wait for the worker threads' reads in flight,
            # a stalled one up to its read timeout
            terminated = isinstance(sys.exc_info()[1], Terminated)
            click.echo(f"l5dask: {'terminated' if terminated else 'interrupted'}", err=True)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(128 + (signal.SIGTERM if terminated else signal.SIGINT))
        except BrokenPipeError:
            # the answer's reader closed it (``| head -1``): nothing more can be said, as when
            # l5dask.cli.run's last flush meets a closed pipe (exit 1); what is left to print goes
            # nowhere, not to a second error at that flush
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)
        except OSError as exc:
            click.echo(f"l5dask: error: {exc}", err=True)
            sys.exit(EXIT_USER_ERROR)
        except Exception as exc:
            # an object store's endpoint that cannot be reached, met by a writer that goes through
            # the store's client itself (botocore's and aiohttp's errors are no OSError): one line
            if type(exc).__name__ not in _UNREACHABLE:
                raise
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            click.echo(f"l5dask: error: could not reach the object store's endpoint ({first})", err=True)
            sys.exit(EXIT_USER_ERROR)

    return wrapper


#: the object stores' clients' errors for an endpoint that cannot be reached
_UNREACHABLE = {"EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError", "ConnectionClosedError"}


# --- the one convention --------------------------------------------------------------------
#: Every command's shared options, by parameter name: the same flags and the same meaning in every
#: command (tests/test_cli.py walks every command against it). Letters as most tools read them:
#: ``-o`` is where the answer goes, ``-q`` silences progress (and the answer's printed summary once
#: ``-o`` wrote the answer: :func:`echo_answer`; printed, the answer never), storage options
#: have a long name; a command's output (a file or a folder) is always ``-o/--output``, never an
#: argument; its inputs are its arguments.
CONVENTION: dict[str, tuple[str, ...]] = {
    "output": ("--output", "-o"),
    "quiet": ("--quiet", "-q"),
    "overwrite": ("--overwrite",),
    "storage_options": ("--storage-option", "-s"),
    "scheduler": ("--scheduler",),
    "chunks_per_task": ("--chunks-per-task",),
    "scenes": ("--scenes",),
    "scenes_from": ("--scenes-from",),
    "catalog_file": ("--catalog",),
    "cache": ("--cache",),
}

# (a storage option that an old command line gives with -o, e.g. anon=true or
# client_kwargs.endpoint_url=http://...: refused as an output rather than written to a file so named)
_LOOKS_LIKE_OPTION = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*=")


def _checked_output(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    # (click 8.5 calls the callback of a required option that was not given with None instead of
    # refusing the command line: refused here, before anything is written)
    if value is None and param.required:
        raise click.UsageError("Missing option '--output' / '-o': the output is given as -o/--output", ctx=ctx)
    # (year=2020/part.parquet is an output; anon=true and client_kwargs.endpoint_url=http://... are not)
    if value is not None and _LOOKS_LIKE_OPTION.match(value) and ("/" not in value or "://" in value):
        raise click.BadParameter(
            f"{value!r} looks like a storage option (KEY=VALUE): -o is the output, storage options are "
            f"-s/--storage-option (for an output so named, write ./{value})",
            ctx=ctx,
            param=param,
        )
    return value


def output_option(help: str, required: bool = False, default: str | None = None) -> Any:
    """The command's output, ``-o/--output`` (a file or a folder: ``help`` says which)."""
    return click.option(
        *CONVENTION["output"],
        "output",
        required=required,
        default=default,
        show_default=default is not None,
        callback=_checked_output,
        help=help,
    )


def _quiet(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    """``-q``: the store's retries (``l5dask.store`` warnings, on stderr) are not said either."""
    if value:
        import logging

        logging.getLogger("l5dask.store").setLevel(logging.ERROR)
    return value


quiet_option = click.option(
    *CONVENTION["quiet"],
    "quiet",
    is_flag=True,
    callback=_quiet,
    help="no progress on stderr, nor the store's retries; the answer is still printed, unless -o wrote it "
    "(then one line says where)",
)


def echo_answer(text: str, quiet: bool, written: str | None, line: str | None = None) -> None:
    """Print a command's answer (``text``) on stdout, then, once the answer was written to a file
    (``written``: the command's ``-o``), one line saying where (``line``, default ``wrote FILE``);
    with ``-q``, that line only: ``-q -o FILE`` is quiet but for it, as ``agg -q -o`` always was."""
    if not quiet or not written:
        click.echo(text)
    if written:
        click.echo(line if line is not None else f"wrote {written}")


storage_option = click.option(
    *CONVENTION["storage_options"],
    "storage_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="fsspec storage option (repeatable), e.g. -s client_kwargs.endpoint_url=http://127.0.0.1:5000",
)


def overwrite_option(what: str = "what exists at the output") -> Any:
    return click.option(*CONVENTION["overwrite"], "overwrite", is_flag=True, help=f"replace {what}")


scheduler_option = click.option(
    *CONVENTION["scheduler"],
    "scheduler",
    metavar="ADDRESS",
    default=None,
    help="run on this dask.distributed scheduler (tcp://host:8786); default: DASK_SCHEDULER_ADDRESS, "
    "else the embedded default (local threads)",
)


chunks_option = click.option(
    *CONVENTION["chunks_per_task"],
    "chunks_per_task",
    default=None,
    type=click.IntRange(1),
    help="stored chunks per task [default: sized for the scheduler: up to 8 on local threads, 64 on a cluster]",
)


#: The scene filters of the commands that read a dataset: plain strings here, read by the system
#: that knows the dataset (``l5dask.prediction.cli.scene_filter``).
scene_options = [
    click.option(
        *CONVENTION["scenes"],
        "scenes",
        default=None,
        metavar="EXPR",
        help="only the scenes where EXPR holds over the scene catalog's columns (the where language of agg), "
        "e.g. \"turn == 'left' and local_hour >= 19\"",
    ),
    click.option(
        *CONVENTION["scenes_from"],
        "scenes_from",
        default=None,
        metavar="FILE",
        help="only the scenes listed in FILE (scene indices, one a line) or flagged by the one boolean column of "
        "a catalog Parquet of the dataset, or the rows of a catalog of some of its scenes (catalog --scenes ... -o FILE)",
    ),
    click.option(
        *CONVENTION["catalog_file"],
        "catalog_file",
        default=None,
        metavar="FILE",
        help="the scene catalog --scenes reads (l5dask catalog DATASET -o FILE); default: computed on the fly",
    ),
]


def num_scenes_option(default: int, minimum: int = 0, help: str = "scenes to generate") -> Any:
    """The generators' (``synth``, ``demo``, ``perception synth``) count of scenes: ``-n/--num-scenes``.
    ``--scenes N``, its old spelling, works until the next release (hidden, one warning line on
    stderr: ``--scenes`` is the scene filter of the commands that read a dataset); the command reads
    both through :func:`num_scenes`."""

    def apply(func: Any) -> Any:
        func = click.option("--scenes", "old_num_scenes", type=click.IntRange(minimum), default=None, hidden=True)(func)
        return click.option(
            "--num-scenes",
            "-n",
            "num_scenes",
            type=click.IntRange(minimum),
            default=default,
            show_default=True,
            help=help,
        )(func)

    return apply


def scene_count(given: int, old: int | None) -> int:
    """The count of scenes :func:`num_scenes_option` read: ``-n`` (or its default), else the old
    ``--scenes N`` (said on stderr)."""
    if old is None:
        return given
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.get_parameter_source("num_scenes") == click.core.ParameterSource.COMMANDLINE:
        raise UsageError("give -n/--num-scenes only (--scenes N is its old spelling)")
    click.echo(
        f"l5dask: warning: --scenes {old} is -n/--num-scenes {old} since l5dask 0.1.0 (--scenes is the scene "
        "filter of the commands that read a dataset): the old spelling goes in the next release",
        err=True,
    )
    return old


def _cache_given(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--cache``: what the cache does is counted for the command line to say once the command is
    done (``ctx.meta["l5dask.on-cache"]``: set by the command line, ``l5dask.cli``)."""
    if value is not None and "l5dask.on-cache" in ctx.meta:
        ctx.meta["l5dask.on-cache"](ctx)
    return value


cache_option = click.option(
    *CONVENTION["cache"],
    "cache",
    metavar="DIR_OR_URL",
    default=None,
    callback=_cache_given,
    help="a cache of partial results (a folder or a bucket's URL, with the -s options): what the pass "
    "computed before over the same stored chunks is read from it, the rest is kept there; default: dask "
    "config l5dask.cache (none)",
)


def shared(
    *,
    output: str | None = None,
    output_required: bool = False,
    output_default: str | None = None,
    overwrite: str | None = None,
    storage: bool = True,
    scheduler: bool = False,
    chunks: bool = False,
    scenes: bool = False,
    cache: bool = False,
) -> Any:
    """Every command's one declaration of its shared options (after its own) and of the one error
    path (:func:`friendly`): ``-q/--quiet`` always; ``-o/--output`` with ``output`` as its help;
    ``--overwrite`` with ``overwrite`` saying what it replaces; ``-s/--storage-option`` unless
    ``storage`` is false (a command that writes only local files); ``--scheduler`` and
    ``--chunks-per-task`` for the commands that run passes; ``--cache`` for those whose passes
    reduce a dataset (:mod:`l5dask.core.cache`); ``--scenes``, ``--scenes-from`` and
    ``--catalog`` (``scenes``) for the commands that read a dataset."""

    def apply(func: Any) -> Any:
        func = friendly(func)
        options = [quiet_option]
        if output is not None:
            options.append(output_option(output, required=output_required, default=output_default))
        if overwrite is not None:
            options.append(overwrite_option(overwrite))
        if scenes:
            options.extend(scene_options)
        if chunks:
            options.append(chunks_option)
        if cache:
            options.append(cache_option)
        if scheduler:
            options.append(scheduler_option)
        if storage:
            options.append(storage_option)
        for option in reversed(options):  # (click lists options in the order they are declared)
            func = option(func)
        return func

    return apply


def check_outputs(storage_options, *paths: str | None, inputs: Sequence[str] = ()) -> None:
    """Check every output before any work: a missing folder or bucket fails now, not after the
    computation; one that is, or lies inside, one of the ``inputs`` (``stats d.zarr -o
    d.zarr/.zattrs`` replaced the dataset's metadata) is refused. Outputs on an object store use
    the same storage options (``-s``) as the dataset."""
    options = parse_storage_options(storage_options)
    for p in paths:
        if p:
            check_writable(p, options)
            for url in inputs:
                how = nesting(Store(p, options), Store(url, options))
                if how is not None:
                    raise OutputError(f"{p}: the output {how} the input ({url}); write elsewhere")
