"""The ``l5dask`` command line: users' mistakes are one line on stderr and a non-zero exit."""

from __future__ import annotations

import os
import sys

# The commands' passes run on dask's threads (a cluster's workers get the same from distributed's
# nanny): OpenBLAS's own threads, started with numpy, would only spin beside them (3-6 % of a pass's
# CPU on 2 cores). Set before numpy is imported; a user's setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# A command given a local cache: its dataset's chunk identities and the cache's folders read from
# the disk while the imports below are (l5dask.core.prefetch: a rerun is little more than both).
from l5dask.core import prefetch  # noqa: E402

prefetch.start(sys.argv[1:])

import click  # noqa: E402

from l5dask.core.commands import EXIT_USER_ERROR, shared, stop_on_sigterm  # noqa: E402

#: Each system's commands live in its subpackage (they share this module's error path), imported
#: only when one of them runs or is listed (``l5dask info`` took 0.32 s instead of 0.36 s here).
SYSTEMS = {
    **{
        c: "prediction"
        for c in (
            "agg",
            "catalog",
            "concat",
            "demo",
            "export",
            "info",
            "report",
            "split",
            "stats",
            "subset",
            "synth",
            "validate",
        )
    },
    "evaluate": "evaluation",
    "select-agents": "evaluation",
    "gt": "evaluation",
    "chop": "evaluation",
    "perception": "perception",
    "cache": "core",
}


class _Commands(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *SYSTEMS})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in SYSTEMS and name not in self.commands:
            import importlib

            module = importlib.import_module(f".{SYSTEMS[name]}.cli", __package__)
            for command in module.COMMANDS:
                self.add_command(command)
        command = super().get_command(ctx, name)
        if command is not None and not getattr(command, "_once", False):
            once(command)
        return command


#: What to do instead of repeating an option that takes one value.
_ONCE_HINTS = {
    "scenes": "join the conditions with and",
    "where": "join the conditions with and",
    "by": "give the keys comma-separated",
}


def once(command: click.Command) -> None:
    """Refuse an option that takes one value given twice (click keeps the last: ``--scenes A
    --scenes B`` filtered by B alone, ``--by label --by host`` grouped by host alone)."""
    single: dict[str, click.Option] = {}
    for p in command.params:
        if isinstance(p, click.Option) and not (p.multiple or p.count or p.is_flag):
            single.update({o: p for o in (*p.opts, *p.secondary_opts)})
    parse = command.parse_args

    def parse_args(ctx: click.Context, args: list[str]) -> list[str]:
        seen: dict[str, str] = {}
        for a in args:
            if a == "--":
                break
            opt = single.get(a.split("=", 1)[0] if a.startswith("--") else a[:2])
            if opt is None or opt.name is None:
                continue
            if opt.name in seen:
                hint = _ONCE_HINTS.get(opt.name, "give it once")
                raise click.UsageError(f"{seen[opt.name]} is given more than once: {hint}", ctx)
            seen[opt.name] = max(opt.opts, key=len) if opt.opts else a
        return parse(ctx, args)

    command.parse_args = parse_args  # type: ignore[method-assign]
    command._once = True  # type: ignore[attr-defined]


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="l5dask")
def main() -> None:
    """Lazy, distributed analytics for Lyft Level 5 (L5Kit) datasets."""
    import warnings

    from l5dask.core.policy import tune_arrow, tune_gc, tune_malloc

    tune_malloc()
    tune_gc()
    tune_arrow()
    warnings.formatwarning = _one_line
    click.get_current_context().meta["l5dask.on-cache"] = _count_cache


def _count_cache(ctx: click.Context) -> None:
    """A command given ``--cache``: what the cache does is counted, said once it is done (:func:`_notes`)."""
    from l5dask.core import cache as cachelib

    ctx.meta["l5dask.cache-counts"] = (ctx, ctx.with_resource(cachelib.counting()))


def cache_line(hits: int, misses: int, damaged: int = 0) -> str:
    """The line on stderr of what the cache did, for a run and a command given ``--cache`` (not with
    ``-q``): with the damaged entries, every one (the cache's warning names the first of a process)."""
    line = f"l5dask: cache: {hits:,} of {hits + misses:,} tasks read from the cache"
    if damaged:
        line += f"; {damaged:,} damaged entr{'y' if damaged == 1 else 'ies'} ignored and computed again"
    return line


_formatwarning = __import__("warnings").formatwarning


def _one_line(message, category, filename, lineno, line=None) -> str:  # type: ignore[no-untyped-def]
    """A deprecation (``FutureWarning``: an old name that still works) and a warning raised in
    l5dask's own code (an older dataset format; numpy's of a user's ``where``: a division by 0)
    are one line on stderr, as the commands' other lines; other libraries' as Python says them."""
    import os

    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    if issubclass(category, FutureWarning) or os.path.abspath(str(filename)).startswith(here):
        return f"l5dask: warning: {message}\n"
    return _formatwarning(message, category, filename, lineno, line)


@main.result_callback()
def _notes(result: object) -> object:
    """The lines a command left to say on stderr once it is done (``ctx.meta["l5dask.notes"]``)."""
    meta = click.get_current_context().meta
    for line in meta.get("l5dask.notes", ()):
        click.echo(line, err=True)
    if "l5dask.cache-counts" in meta:  # (a command given --cache: said unless -q)
        command, counts = meta["l5dask.cache-counts"]
        if not command.params.get("quiet"):
            click.echo(cache_line(counts.hits, counts.misses, counts.damaged), err=True)
    return result


@main.command("run")
@click.argument("job")
@click.option(
    "--check", "check_only", is_flag=True, help="check the job (datasets, outputs) and list its plan; run nothing"
)
@click.option(
    "--record",
    default=None,
    help="write the run record (JSON) here, a template as [run] record is: {date}, {time}, {job} (over the job's [run] record)",
)
@click.option(
    "--cache", default=None, metavar="DIR_OR_URL", help="the cache of the passes (over the job's [cache] url)"
)
@click.option(
    "--date", "date", default=None, metavar="YYYY-MM-DD", help="the run's date for {date} (default: today, UTC)"
)
@shared(chunks=True, scheduler=True, storage=False)
def run_command(job, check_only, record, cache, date, quiet, chunks_per_task, scheduler) -> None:
    """Run the analyses of the job file JOB (TOML or YAML: docs/jobs.md), all of one dataset in one
    pass. The job is checked whole first (its datasets, analyses and outputs). Exit 0 when every
    analysis is written, 1 when some failed (each said in one line; the others are written), 2 when
    the job cannot run."""
    import datetime
    import re

    from l5dask import jobs
    from l5dask.core import runs
    from l5dask.errors import UsageError

    now = None
    if date is not None:
        try:
            day = datetime.date.fromisoformat(date)
        except ValueError as exc:
            shaped = re.fullmatch(r"\d{4}-\d{2}-\d{2}", date) is not None  # (2026-13-45: the form, no such day)
            raise UsageError(
                f"--date {date!r}: " + (f"no such day ({exc})" if shaped else "expected YYYY-MM-DD")
            ) from None
        now = datetime.datetime.combine(day, datetime.datetime.now(datetime.timezone.utc).timetz())
    loaded = jobs.load_job(job)
    if check_only:
        from l5dask.core.cache import cannot_write, check_location

        if cache:  # (refused as the run refuses it; the check makes nothing)
            check_location(cache)
        plan = runs.plan(loaded, now=now, record=record)
        where = cache or (loaded.cache or {}).get("url")
        why = cannot_write(str(where)) if where else None
        if why is not None:  # (the run warns of it and goes on uncached: said by the check too)
            click.echo(
                f"l5dask: cache: {where}: cannot write to the cache ({why}); the run will go on without it", err=True
            )
        for t in plan.tasks:
            click.echo(f"{t.analysis.name} on {t.dataset}: {', '.join(t.outputs.values()) or 'into the dataset'}")
        n, d = len(plan.tasks), len(plan.inputs)
        click.echo(f"{job}: {n} analys{'i' if n == 1 else 'e'}s on {d} dataset{'' if d == 1 else 's'}: the job can run")
        return
    rec = jobs.run_job(
        loaded,
        scheduler=scheduler,
        record=record,
        cache=cache,
        chunks_per_task=chunks_per_task,
        progress=not quiet,
        now=now,
        say=click.echo,
        fail=lambda line: click.echo(f"l5dask: failed: {line}", err=True),
    )
    if rec.get("cache") and not quiet:
        c = rec["cache"]
        click.echo(cache_line(c["hits"], c["misses"], c.get("damaged", 0)), err=True)
    failed = sum(a["status"] != "written" for a in rec["analyses"])
    if failed:
        click.echo(f"l5dask: {failed} of {len(rec['analyses'])} analyses failed", err=True)
        sys.exit(1)


#: The flags that 0.1.0's convention renamed (CHANGELOG, "Breaking changes"): named when one is given.
RENAMED = {"-O": "the output is -o/--output (storage options: -s/--storage-option)", "-v": "a value is --value"}


def _renamed(exc: click.UsageError) -> str:
    """What a command line written for the old flags needs, said after click's message."""
    params = exc.ctx.command.params if exc.ctx is not None else []
    if isinstance(exc, click.NoSuchOption) and exc.option_name in RENAMED:
        if exc.option_name != "-v" or any(p.name == "values" for p in params):
            return f": {RENAMED[exc.option_name]}"
    if "unexpected extra argument" in exc.format_message() and any(p.name == "output" for p in params):
        return ": the output is given as -o/--output"
    return ""


def run() -> None:
    """The console entry point: run a command, flush its output, and leave.

    The outputs are complete (written atomically, flushed) when a command returns, so the
    process exits without the interpreter's teardown of its modules (numpy, dask, fsspec...),
    which took 0.12 s here, a tenth of a report of 30 M agents.
    """
    import logging
    import os

    stop_on_sigterm()
    try:
        code = main.main(prog_name="l5dask", standalone_mode=False)
        code = code if isinstance(code, int) else 0
    except click.UsageError as exc:  # click's own usage errors: one line too, with where to look
        where = (
            f"l5dask {exc.ctx.command_path.split(' ', 1)[1]} --help"
            if exc.ctx and " " in exc.ctx.command_path
            else "l5dask --help"
        )
        print(
            f"l5dask: error: {exc.format_message().rstrip('.')}{_renamed(exc)} (see {where})".replace("\n", " "),
            file=sys.stderr,
        )
        code = EXIT_USER_ERROR
    except click.Abort:
        print("l5dask: interrupted", file=sys.stderr)
        code = 130
    except click.ClickException as exc:
        print(f"l5dask: error: {exc.format_message()}", file=sys.stderr)
        code = exc.exit_code
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said
            code = code or 1
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    run()
