"""A checked job (:mod:`l5dask.core.jobfile`) run: its plan made and checked whole before the first
pass, then its analyses run dataset by dataset, and its run record.

The plan (:func:`plan`) expands the datasets' globs and opens each dataset (its metadata only: a
dataset that does not exist is refused here), asks each analysis' kind to check it against each
dataset, expands the outputs' templates, refuses two analyses writing one file, and checks every
output can be written (a file is made and removed in its folder; nothing is left: a local output's
missing folders are made when the run starts). Only then does :func:`execute` run the
analyses: all of one dataset together when their system declares how (``Kind.together``: one pass
over its chunks), the others one after the other. When a pass of several analyses fails, each of
them is run alone (what the fault does not touch is written). An analysis that fails is one line
and one entry of the record; the others are written. Every output is written whole or not at all (each kind writes
through :func:`l5dask.core.outputs.atomic_output`).

The run record (strict JSON, ``l5dask.core.outputs.json_text``) says what ran on what: the job, the
start and end, each input with its fingerprint, each analysis' outputs, status and time, the bytes
read by every process that read (the store's counters, :func:`l5dask.core.store.read_counts`) and
the cache's counts.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import glob
import os
import posixpath
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from l5dask.core import store as store_mod
from l5dask.core.cluster import connect
from l5dask.core.jobfile import Analysis, Job, JobError, expand, record_problem
from l5dask.core.outputs import atomic_write, check_writable, filesystem, folders_to_make, json_text
from l5dask.errors import L5DaskError, OutputError

#: The run record's format.
RECORD_VERSION = 1


@dataclass
class Task:
    """One analysis on one dataset: its outputs expanded."""

    analysis: Analysis
    dataset: str
    outputs: dict[str, str]


@dataclass
class Input:
    name: str
    url: str
    storage_options: dict
    ds: Any
    line: tuple
    fingerprint: Callable[[Any, Any], dict] | None = None


@dataclass
class Plan:
    job: Job
    started: datetime.datetime
    inputs: dict[str, Input]
    tasks: list[Task]
    record: str | None
    fields: dict[str, str]
    #: the local folders the outputs need, missing when checked: made when the run starts
    folders: list[str] = field(default_factory=list)


@dataclass
class Context:
    """What the analyses run with: the client (``None``: local threads), the chunks a task, whether
    progress is shown, the storage options of the outputs."""

    client: Any = None
    chunks_per_task: int | None = None
    progress: bool = False
    storage_options: dict = field(default_factory=dict)
    cache: Any = None
    #: what the kinds keep for the rest of the run (a dataset's scene catalog...)
    memo: dict = field(default_factory=dict)


def _options(job: Job, extra: dict | None = None) -> dict:
    return {**job.storage_options, **(extra or {})}


_GLOB = set("*?[")


def _stem(url: str) -> str:
    name = posixpath.basename(url.rstrip("/"))
    for ext in (".zip", ".zarr"):
        name = name.removesuffix(ext)
    return name


def expand_datasets(job: Job) -> list[tuple[str, str, dict, tuple]]:
    """``(name, url, storage options, line path)`` of every dataset, globs expanded (sorted; each
    match named by its file name without ``.zarr``/``.zip``)."""
    out = []
    for d in job.datasets.values():
        options = _options(job, d.storage_options)
        if not (_GLOB & set(d.path)):
            out.append((d.name, d.path, options, d.line))
            continue
        if "://" in d.path and not d.path.startswith("file://"):
            try:
                fs, pattern = filesystem(d.path, options)
                protocol = d.path.split("://", 1)[0]
                matches = [f"{protocol}://{m}" for m in sorted(fs.glob(pattern))]
            except (OSError, ValueError) as exc:
                raise job.source.error(d.line, f"[datasets.{d.name}] path: {d.path}: cannot list: {exc}") from None
        else:
            matches = sorted(glob.glob(d.path.removeprefix("file://")))
        if not matches:
            raise job.source.error(d.line, f"[datasets.{d.name}] path: {d.path!r} matches nothing")
        out.extend((_stem(m), m, options, d.line) for m in matches)
    seen: dict[str, str] = {}
    for name, url, _, line in out:
        if name in seen:
            raise job.source.error(line, f"two datasets are named {name!r} ({seen[name]} and {url}): rename one")
        seen[name] = url
    return out


def _check_output(path: str, folder: bool, options: dict, missing: list[str], apart: Callable[[], None]) -> None:
    """Refuse (one line) an output that cannot be written, making nothing: a local output's missing
    folders are added to ``missing`` (made when the run starts) once the nearest existing one is
    found to be a folder a file can be made in. ``apart``: the check that it is apart from what the
    run reads, made before a file is made and removed to test the folder (a refused output's
    folder, a dataset's, is not touched)."""
    remote = "://" in path and not path.startswith("file://")
    if not remote:
        path = os.path.abspath(path.removeprefix("file://"))
        if os.path.isdir(path) and not folder:
            raise JobError(f"{path}: is a folder; give a file name")
        if folder and os.path.exists(path) and not os.path.isdir(path):
            raise JobError(f"{path}: is a file, not a folder")
        apart()
        try:
            absent = folders_to_make(path)
        except OutputError as exc:
            raise JobError(str(exc)) from None
        missing.extend(f for f in absent if f not in missing)
        return
    apart()
    if folder:
        check_writable(path.rstrip("/") + "/.l5dask", options)
        return
    check_writable(path, options)


def _apart_from_inputs(path: str, options: dict, inputs: Any, files: Sequence[tuple[str, str]] = ()) -> None:
    """Refuse an output that is an input, holds one (a folder replaced whole would delete it), or
    lies inside one (a file among a dataset's own files: its metadata replaced, or a stray file
    that a later ``--overwrite`` of it would refuse). ``files``: ``(what, path)`` of the other files
    the run reads (the job file itself, a scene catalog an analysis reads), refused alike (a
    ``--record`` naming the job file replaced it with the record: a new user's trial)."""
    out = store_mod.Store(path, options)
    for inp in inputs:
        how = store_mod.nesting(out, store_mod.Store(inp.url, inp.storage_options))
        if how is not None:
            raise JobError(f"{path}: the output {how} the dataset {inp.name} ({inp.url}); write elsewhere")
    for what, file in files:
        how = store_mod.nesting(out, store_mod.Store(file, options))
        if how is not None:
            raise JobError(f"{path}: the output {how} {what} ({file}), which the run reads; write elsewhere")


def plan(job: Job, *, now: datetime.datetime | None = None, record: str | None = None) -> Plan:
    """The job's plan, checked whole before anything runs (one :class:`~l5dask.core.jobfile.JobError` for the first
    fault: the file and the line where it is said)."""
    src = job.source
    problem = record_problem(record) if record is not None else None
    if problem is not None:  # (a template as [run] record is: {date}, {time}, {job})
        raise JobError(f"--record {record}: {problem}")
    started = datetime.datetime.now(datetime.timezone.utc)  # (the record's: when it ran, whatever {date} says)
    clock = now or started  # (the templates' {date} and {time}: ``now``, e.g. the command line's --date)
    fields = {
        "date": job.run["date"] or clock.strftime("%Y-%m-%d"),
        "time": clock.strftime("%H%M%S"),
        "job": job.name,
    }
    inputs: dict[str, Input] = {}
    by_job_name: dict[str, list[str]] = {}
    for name, url, options, line in expand_datasets(job):
        inputs[name] = Input(name, url, options, None, line)
        by_job_name.setdefault(line[1], []).append(name)
    tasks = []
    for a in job.analyses.values():
        for d in a.datasets:
            for name in by_job_name[d]:
                values = {**fields, "dataset": name, "analysis": a.name}
                outputs = {k: expand(a.params[k], values) for k in a.kind.outputs if a.params.get(k)}
                tasks.append(Task(a, name, outputs))
    # the datasets, opened (their metadata) by the kind of their analyses, and each analysis checked
    openers: dict[tuple[str, Callable], Any] = {}
    for t in tasks:
        inp = inputs[t.dataset]
        opener = (t.dataset, t.analysis.kind.open)
        if opener not in openers:
            try:
                openers[opener] = t.analysis.kind.open(inp.url, inp.storage_options)
            except L5DaskError as exc:
                raise src.error(inp.line, f"dataset {t.dataset}: {exc}") from None
            except OSError as exc:
                raise src.error(inp.line, f"dataset {t.dataset}: {inp.url}: {exc.strerror or exc}") from None
        inp.ds = openers[opener]
        inp.fingerprint = inp.fingerprint or t.analysis.kind.fingerprint
        if t.analysis.kind.check is not None:
            try:
                t.analysis.kind.check(inp.ds, t.analysis.params)
            except L5DaskError as exc:
                key = getattr(exc, "job_key", None)  # (jobfile.at_key: the line of that key)
                line = (*t.analysis.line, key) if key else t.analysis.line
                raise src.error(line, f"[analyses.{t.analysis.name}] on {t.dataset}: {exc}") from None
    # the outputs: no two the same (however spelled: store_mod.location), each writable
    written: dict[str, str] = {}
    by: dict[str, tuple[str, str] | None] = {}  # place -> (analysis, dataset) that writes it; None: the record
    said: dict[str, str] = {}  # place -> who writes it
    record_path = (
        expand(record, fields) if record else (expand(job.run["record"], fields) if job.run["record"] else None)
    )
    if record_path:
        written[record_path] = "--record" if record else "the run record"
        said[store_mod.location(record_path)] = written[record_path]
        by[store_mod.location(record_path)] = None
    for t in tasks:
        for key, path in t.outputs.items():
            where = f"[analyses.{t.analysis.name}] {key} on {t.dataset}"
            place = store_mod.location(path)
            if place in said:
                other = by[place]
                if other is None:
                    hint = "give the run record another path"
                elif other[0] == t.analysis.name:  # (one analysis on two datasets)
                    hint = "put {dataset} in the template"
                elif other[1] == t.dataset:  # (two analyses of one dataset)
                    hint = "put {analysis} in the template, or give each its own path"
                else:
                    hint = "put {dataset} (or {analysis}) in the template"
                raise src.error((*t.analysis.line, key), f"{where}: {path} is also written by {said[place]}: {hint}")
            written[path] = said[place] = where
            by[place] = (t.analysis.name, t.dataset)
    # the files the run reads besides its datasets: the job file, the scene catalogs analyses read
    reads = [("the job file", src.name)] if os.path.isfile(src.name) else []
    reads += [
        (f"[analyses.{t.analysis.name}] {key}", t.analysis.params[key])
        for t in tasks
        for key in t.analysis.kind.reads
        if t.analysis.params.get(key)
    ]
    folders: list[str] = []
    for path, where in written.items():
        t_folder = any(path == t.outputs.get(k) for t in tasks for k in t.analysis.kind.folders)
        try:
            _check_output(
                path,
                t_folder,
                job.storage_options,
                folders,
                functools.partial(_apart_from_inputs, path, job.storage_options, inputs.values(), reads),
            )
            for t in tasks:
                for key, p in t.outputs.items():
                    if p == path and t.analysis.kind.check_output is not None:
                        t.analysis.kind.check_output(key, path, job.storage_options)
        except L5DaskError as exc:
            # (the command line's --record: no line of the file said it)
            if by[store_mod.location(path)] is None and record:
                raise JobError(f"--record {path}: {exc}") from None
            line = ("run", "record")
            for t in tasks:
                for key, p in t.outputs.items():
                    if p == path:
                        line = (*t.analysis.line, key)
            raise src.error(line, f"{where}: {exc}") from None
    return Plan(job, started, inputs, tasks, record_path, fields, folders)


# --- running ----------------------------------------------------------------------------------
def _read_counts(client: Any) -> dict[str, dict[str, Any]]:
    """The store's read counters of this process and of each worker of ``client``."""
    out = {"local": store_mod.read_counts()}
    if client is not None:
        try:
            out.update(client.run(store_mod.read_counts))
        except Exception:  # noqa: BLE001 - a worker lost while asked: its reads are not known
            pass
    return out


def _reads_between(before: dict, after: dict) -> dict[str, Any]:
    """What was read between two snapshots (by process: a process restarted since counts from zero)."""
    total: dict[str, Any] = {k: 0 for k in store_mod.read_counts() if k != "by_folder"}
    folders: dict[str, list[int]] = {}
    for who, counts in after.items():
        was = before.get(who, {})
        fresh = any(v < was.get(k, 0) for k, v in counts.items() if k != "by_folder")
        for k, v in counts.items():
            if k == "by_folder":
                for name, (n, b) in v.items():
                    n0, b0 = (0, 0) if fresh else was.get(k, {}).get(name, (0, 0))
                    got = folders.setdefault(name, [0, 0])
                    got[0] += n - n0
                    got[1] += b - b0
            else:
                total[k] += v if fresh else v - was.get(k, 0)
    total["by_folder"] = {k: {"objects": n, "bytes": b} for k, (n, b) in sorted(folders.items()) if n}
    return total


@contextlib.contextmanager
def cluster(job: Job, scheduler: str | None = None, quiet: bool = True) -> Iterator[Any]:
    """The client the job runs on: ``scheduler`` (the command line's), else the job's
    ``[cluster] scheduler``, else a local cluster of ``[cluster] workers`` processes, else the
    default (``DASK_SCHEDULER_ADDRESS``, else local threads: ``None``)."""
    c = job.cluster
    if scheduler is None and c["scheduler"] is None and c["workers"]:
        from distributed import Client, LocalCluster

        kw = {"memory_limit": c["memory-limit"]} if c["memory-limit"] else {}
        with (
            LocalCluster(
                n_workers=c["workers"],
                threads_per_worker=c["threads-per-worker"],
                processes=True,
                dashboard_address=None,
                host="127.0.0.1",
                **kw,
            ) as local,
            Client(local, set_as_default=False) as client,
        ):
            yield client
        return
    with connect(scheduler or c["scheduler"], quiet=quiet) as client:
        yield client


def execute(
    p: Plan,
    ctx: Context,
    *,
    say: Callable[[str], None] = print,
    fail: Callable[[str], None] = print,
    cache: Callable[[], dict] | None = None,
    since: dict | None = None,
) -> dict:
    """Run the plan's analyses; return the run record (also written where the plan says).

    ``say`` is told each analysis written, ``fail`` each failure (one line each); ``cache``, when
    given, returns the cache's counts for the record; ``since``: this process's read counts when
    the run began (:func:`l5dask.core.store.read_counts` before its plan opened the datasets)."""
    t0 = time.perf_counter()
    for folder in p.folders:
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as exc:
            raise JobError(f"{folder}: cannot make this folder: {exc.strerror or exc}") from None
    before = _read_counts(ctx.client)
    if since is not None:
        before["local"] = since
    entries: list[dict] = []
    try:
        _run_inputs(p, ctx, entries, say, fail)
    except KeyboardInterrupt:  # (Ctrl-C, SIGTERM: the record says the day is incomplete, and what was written)
        done = {(e["analysis"], e["dataset"]) for e in entries}
        for t in p.tasks:
            if (t.analysis.name, t.dataset) not in done:
                entries.append(
                    {
                        "analysis": t.analysis.name,
                        "kind": t.analysis.kind.name,
                        "dataset": t.dataset,
                        "outputs": t.outputs,
                        "status": "interrupted",
                    }
                )
        if p.record:
            try:
                _finish_record(p, ctx, entries, t0, before, cache, "interrupted")
            except Exception:  # noqa: BLE001 - the interruption is what is said; the record is a courtesy
                pass
        raise
    return _finish_record(p, ctx, entries, t0, before, cache)


def _run_inputs(p: Plan, ctx: Context, entries: list[dict], say: Callable, fail: Callable) -> None:
    """Run each dataset's analyses, adding an entry to ``entries`` for each."""
    for name, inp in p.inputs.items():
        tasks = [t for t in p.tasks if t.dataset == name]
        if not tasks:
            continue
        results = _run_dataset(inp, tasks, ctx)
        # each pass's analyses said together (a pass of several: its time once, after its last
        # analysis), the passes in the order of their first analysis; the record in the job's
        firsts: dict[int, int] = {}
        for i, (_, _, shared) in enumerate(results):
            firsts.setdefault(shared or -1 - i, i)
        said = sorted(range(len(tasks)), key=lambda i: (firsts[results[i][2] or -1 - i], i))
        last = {shared: i for i, (_, _, shared) in enumerate(results) if shared}
        lines: dict[int, list[tuple[Callable, str]]] = {}
        for i, (t, (result, seconds, shared)) in enumerate(zip(tasks, results)):
            out = lines.setdefault(i, [])
            entry: dict[str, Any] = {
                "analysis": t.analysis.name,
                "kind": t.analysis.kind.name,
                "dataset": name,
                "outputs": t.outputs,
                "seconds": round(seconds, 3),
            }
            if isinstance(result, BaseException):
                entry.update(status="failed", error=one_line(result))
                out.append((fail, f"{t.analysis.name} on {name}: {one_line(result)}"))
            else:
                entry.update(status="written", **({"result": result} if result else {}))
                own = "" if shared else f" ({seconds:.1f} s)"
                wrote = ", ".join(t.outputs.values()) or "into the dataset"  # (select-agents' mask, no output)
                out.append((say, f"{t.analysis.name} on {name}: wrote {wrote}{own}"))
                if isinstance(result, dict) and result.get("note"):  # (what the output's reader must know)
                    out.append((say, f"{t.analysis.name} on {name}: {result['note']}"))
            entries.append(entry)
            if shared and last[shared] == i:
                n = sum(r[2] == shared for r in results)
                out.append((say, f"{n} analyses on {name} in one pass: {seconds:.1f} s"))  # (its last)
        for i in said:
            for write, line in lines.get(i, []):
                write(line)


def _finish_record(
    p: Plan, ctx: Context, entries: list[dict], t0: float, before: dict, cache: Callable | None, status: str = ""
) -> dict:
    """The run record of ``entries`` (written where the plan says): ``status`` ``written`` when
    every analysis was, ``failed`` when one was not, or as given (``interrupted``)."""
    finished = datetime.datetime.now(datetime.timezone.utc)
    # (the cache's counts are the passes': taken before the fingerprints, whose scenes a run with a
    # cache reads from the entry its pass wrote; counted, a first run on an empty cache said 1 hit)
    counts = cache() if cache is not None else None
    record = {
        "version": RECORD_VERSION,
        "job": {
            "name": p.job.name,
            "file": os.path.abspath(p.job.source.name),
            **{k: v for k, v in p.fields.items() if k != "job"},  # (the template's {job}: its name)
        },
        "started": p.started.isoformat(timespec="seconds"),
        "finished": finished.isoformat(timespec="seconds"),
        "seconds": round(time.perf_counter() - t0, 3),
        "status": status or ("written" if all(e["status"] == "written" for e in entries) else "failed"),
        "inputs": [
            {"dataset": inp.name, "url": inp.url, "fingerprint": _fingerprint(inp, ctx)} for inp in p.inputs.values()
        ],
        "analyses": entries,
        "reads": _reads_between(before, _read_counts(ctx.client)),
        "cache": counts,
    }
    if p.record:
        write_record(record, p.record, p.job.storage_options)
    return record


def _fingerprint(inp: Input, ctx: Context) -> Any:
    """What identifies a dataset (its analyses' kind says, with the run's cache), else its URL."""
    return inp.fingerprint(inp.ds, ctx) if inp.fingerprint is not None else {"url": inp.url}


def _run_dataset(inp: Input, tasks: list[Task], ctx: Context) -> list[tuple[Any, float, int]]:
    """Each task's record (or the exception that failed it) and its seconds: the tasks whose kinds
    run together (the same ``Kind.together``) in one call, the others one after the other; the
    tasks on a part of the dataset (``Kind.restriction``) after those on the whole of it, those of
    one part together."""
    results: dict[int, tuple[Any, float, int]] = {}
    parts: dict[Any, list[int]] = {}
    for i, t in enumerate(tasks):
        key = t.analysis.kind.restriction(t.analysis.params) if t.analysis.kind.restriction else None
        parts.setdefault(None if key is None else (t.analysis.kind.restrict, key), []).append(i)
    written: dict[str, list[dict]] = {}
    for part, members in sorted(parts.items(), key=lambda kv: kv[0] is not None):
        ds = inp.ds
        if part is not None:
            restrict, key = part
            t0 = time.perf_counter()
            try:
                ds = restrict(inp.ds, key, ctx, written)
            except (KeyboardInterrupt, SystemExit):
                raise
            except Exception as exc:  # noqa: BLE001 - the part cannot be read: its analyses fail
                results.update(dict.fromkeys(members, (exc, time.perf_counter() - t0, 0)))
                continue
        results.update(_run_part(ds, inp, {i: tasks[i] for i in members}, ctx))
        if part is None:
            for i in members:
                if not isinstance(results[i][0], BaseException):
                    written.setdefault(tasks[i].analysis.kind.name, []).append(tasks[i].outputs)
    return [results[i] for i in range(len(tasks))]


def _run_part(ds: Any, inp: Input, tasks: dict[int, Task], ctx: Context) -> dict[int, tuple[Any, float, int]]:
    """Each task's result, seconds and pass (a number, the same for the tasks of one pass of
    several: their seconds are the pass's; 0 for a task run alone)."""
    results: dict[int, tuple[Any, float, int]] = {}
    groups: dict[Any, list[int]] = {}
    for i, t in tasks.items():
        groups.setdefault(t.analysis.kind.together or ("alone", i), []).append(i)
    for key, members in groups.items():
        t0 = time.perf_counter()
        if callable(key):
            try:
                got = key(
                    ds, [(tasks[i].analysis.kind, tasks[i].analysis.params, tasks[i].outputs) for i in members], ctx
                )
            except (KeyboardInterrupt, SystemExit):
                raise
            except Exception as exc:  # noqa: BLE001 - the pass failed: each analysis is run alone,
                # so that those the fault does not touch (another array's) are written
                got = [exc] if len(members) == 1 else [_alone(ds, tasks[i], ctx) for i in members]
        else:
            got = [_alone(ds, tasks[members[0]], ctx)]
        took = time.perf_counter() - t0
        shared = min(members) + 1 if len(members) > 1 and callable(key) and len(got) == len(members) else 0
        if shared and any(isinstance(r, BaseException) for r in got):
            shared = 0  # (the pass failed: each was run alone after it)
        for i, r in zip(members, got):
            results[i] = (r, took, shared)
    return results


def _alone(ds: Any, t: Task, ctx: Context) -> Any:
    try:
        return t.analysis.kind.run(ds, t.analysis.params, t.outputs, ctx)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # noqa: BLE001 - said in the record and in one line
        return exc


def one_line(exc: BaseException) -> str:
    """An analysis' failure in one line (an error that is not a user's says its type too)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, L5DaskError):
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def write_record(record: dict, path: str, storage_options: dict | None = None) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(json_text(record, indent=1))

    atomic_write(path, write, storage_options)
