"""The job file of ``l5dask run``: read (TOML or YAML), checked against its schema with the line of
each key, its output templates expanded. It knows no dataset format: the analyses a job can run
are declared by the systems (:class:`Kind`, registered in ``ANALYSES`` by their ``jobs`` modules:
prediction's the report, the catalog, the aggregations and the exports, evaluation's
``select-agents``).

A job is refused before anything runs, in one line that names the file and the line: an unknown
key (with the keys that exist there), a value of the wrong type, an unknown analysis kind, a
template naming an unknown field, two outputs that would be the same file. The reference page of
the schema is ``docs/jobs.md``.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import string
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from l5dask.core.cache import check_location
from l5dask.errors import L5DaskError, UsageError

#: A key's path in the job: ("analyses", "speeds", "by").
Path = tuple[str, ...]


class JobError(UsageError):
    """A job file that cannot run: one line naming the file and the line."""


@dataclass(frozen=True)
class Key:
    """One key of a table of the job file.

    ``type``: ``str``, ``int``, ``float``, ``bool``, ``strings`` (a string or a list of strings),
    ``table`` (any table: storage options), ``reductions`` (a table of column = a reduction or a
    list of them), ``template`` (a string with ``{date}``, ``{dataset}``... fields: an output's path).
    """

    name: str
    type: str
    doc: str
    required: bool = False
    default: Any = None
    choices: tuple[str, ...] = ()
    minimum: float | None = None


@dataclass(frozen=True)
class Kind:
    """An analysis a job can run, declared by a system.

    ``keys``: its own keys (besides ``kind`` and ``datasets``); the ``template`` keys are its
    outputs (files; a folder when its name is in ``folders``). ``open(url, storage_options)``
    opens a dataset (reading its metadata only); ``check(ds, params)`` refuses what cannot run on
    that dataset (a column that is not there...) before any pass, raising a
    :class:`~l5dask.errors.UsageError`; ``run(ds, params, outputs, context)`` computes the
    analysis and writes its outputs (each atomically), and returns what the run record says of
    it (a small dict); ``fingerprint(ds, context)`` what identifies the dataset (the run record's; ``context``: the
    run's ``l5dask.core.runs.Context``, its cache).
    ``needs_output``: the analysis must be given one of its outputs. ``together``, when set, runs several analyses of one dataset in one pass:
    ``together(ds, [(kind, params, outputs), ...], context)`` returns, in order, each one's
    record or the exception that failed it.

    ``restriction(params)``, when set, says what part of the dataset the analysis reads (a
    hashable key, ``None``: all of it); the analyses of one part run together, after those of the
    whole dataset, on ``restrict(ds, key, context, written)`` (``written``: the outputs of the
    analyses of the whole dataset written in this run, by kind).

    ``check_output(key, path, storage_options)``, when set, refuses (raising an
    :class:`~l5dask.errors.L5DaskError`) an output that the run would refuse: a folder holding
    what the analysis does not write, which replacing it would delete.

    ``reads``: its keys that name a file it reads (a scene catalog): no output of the job may be
    one, nor hold one.
    """

    name: str
    doc: str
    keys: tuple[Key, ...]
    open: Callable[[str, dict], Any]
    run: Callable[[Any, dict, dict, Any], dict]
    check: Callable[[Any, dict], None] | None = None
    folders: tuple[str, ...] = ()
    together: Callable[[Any, list, Any], list] | None = None
    fingerprint: Callable[[Any, Any], dict] | None = None
    needs_output: bool = True
    restriction: Callable[[dict], Any] | None = None
    restrict: Callable[[Any, Any, Any, dict], Any] | None = None
    check_output: Callable[[str, str, dict], None] | None = None
    reads: tuple[str, ...] = ()

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.keys if k.type == "template")


#: The analyses a job can run, by kind (filled by the systems' ``jobs`` modules).
ANALYSES: dict[str, Kind] = {}


@contextlib.contextmanager
def at_key(key: str) -> Iterator[None]:
    """In a kind's ``check``: a fault raised in the block is said at the line of the analysis' key
    ``key`` (not its table's)."""
    try:
        yield
    except L5DaskError as exc:
        exc.job_key = key  # type: ignore[attr-defined]
        raise


def register(kind: Kind) -> Kind:
    ANALYSES[kind.name] = kind
    return kind


# --- the schema of the job's own tables ---------------------------------------------------------
RUN_KEYS = (
    Key("name", "str", "the job's name (the run record's and the ``{job}`` field of templates)", default="job"),
    Key("record", "template", "write the run record (JSON) here; fields as the outputs' (not ``{dataset}``)"),
    Key("date", "str", "the run's date (``YYYY-MM-DD``) for ``{date}``; default: today's (UTC)"),
)
CLUSTER_KEYS = (
    Key("scheduler", "str", "a dask.distributed scheduler's address (``tcp://host:8786``)"),
    Key("workers", "int", "start a local cluster of this many worker processes", minimum=1),
    Key("threads-per-worker", "int", "threads of each local worker (with ``workers``)", default=1, minimum=1),
    Key("memory-limit", "str", "memory of each local worker (with ``workers``), e.g. ``4GB``"),
    Key("chunks-per-task", "int", "stored chunks per task (default: sized for the scheduler)", minimum=1),
)
CACHE_KEYS = (Key("url", "str", "the cache: a local folder or a bucket's prefix (``s3://bucket/cache``)", True),)
DATASET_KEYS = (
    Key("path", "str", "a folder, a ``.zip``, an ``s3://`` URL, or a glob of them (``data/*.zarr``)", True),
    Key("storage-options", "table", "fsspec options of this dataset's store (over the job's)"),
)
COMMON_ANALYSIS_KEYS = (
    Key("kind", "str", "what the analysis is", True),
    Key("datasets", "strings", "the datasets it runs on (names of ``[datasets]``); default: every one"),
)
TOP = {
    "run": RUN_KEYS,
    "cluster": CLUSTER_KEYS,
    "cache": CACHE_KEYS,
    "storage-options": None,
    "datasets": None,
    "analyses": None,
}
#: The fields of templates.
FIELDS = {
    "date": "the run's date, YYYY-MM-DD",
    "time": "the run's start time (UTC), HHMMSS",
    "job": "the job's name",
    "dataset": "the dataset's name",
    "analysis": "the analysis' name",
}


# --- reading, with the line of each key ---------------------------------------------------------
@dataclass
class Source:
    """The job file's text, its values, and the line of each key's path."""

    name: str
    data: dict
    lines: dict[Path, int] = field(default_factory=dict)

    def line(self, path: Path) -> int:
        while path and path not in self.lines:
            path = path[:-1]
        return self.lines.get(path, 1)

    def error(self, path: Path, message: str) -> JobError:
        return JobError(f"{self.name}:{self.line(path)}: {message}")


def load(path: str | os.PathLike) -> Source:
    """The job file at ``path`` (``.toml``, ``.yaml``/``.yml``), with the line of each key."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise JobError(f"{path}: no such job file") from None
    except OSError as exc:
        raise JobError(f"{path}: cannot read the job file: {exc.strerror or exc}") from None
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise JobError(f"{path}: the job file is not UTF-8 text") from None
    ext = os.path.splitext(path)[1].lower()
    if ext == ".toml":
        return parse_toml(text, path)
    if ext in (".yaml", ".yml"):
        return parse_yaml(text, path)
    raise JobError(f"{path}: a job file is TOML (.toml) or YAML (.yaml, .yml)")


def parse_toml(text: str, name: str = "job.toml") -> Source:
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = re.search(r"\(at line (\d+), column \d+\)|at line (\d+)", msg)
        line = next((g for g in (m.groups() if m else ()) if g), None)
        msg = re.sub(r"\s*\(at line \d+, column \d+\)", "", msg)
        raise JobError(f"{name}:{line or 1}: not valid TOML: {msg}") from None
    return Source(name, data, toml_lines(text))


_BARE = r"[A-Za-z0-9_-]+"
_KEY = rf'(?:{_BARE}|"[^"]*"|\'[^\']*\')'
_DOTTED = rf"{_KEY}(?:\s*\.\s*{_KEY})*"
_HEADER = re.compile(rf"^\s*(\[\[?)\s*({_DOTTED})\s*\]\]?")
_ASSIGN = re.compile(rf"\s*({_DOTTED})\s*=")


def _split_key(dotted: str) -> Path:
    return tuple(p.strip().strip("\"'") for p in re.findall(_KEY, dotted))


def toml_lines(text: str) -> dict[Path, int]:
    """The line of each key's path in TOML ``text`` (tables, arrays of tables as their index,
    dotted keys, the keys of one-line inline tables). Only lines are looked for: the values are
    tomllib's."""
    lines: dict[Path, int] = {}
    table: Path = ()
    counts: dict[Path, int] = {}
    in_string = None
    for n, line in enumerate(text.splitlines(), 1):
        if in_string:
            if in_string in line:
                in_string = None
            continue
        for quote in ('"""', "'''"):
            if line.count(quote) % 2 == 1:
                in_string = quote
        m = _HEADER.match(line)
        if m:
            path = _split_key(m.group(2))
            if m.group(1) == "[[":
                counts[path] = counts.get(path, -1) + 1
                for i in range(1, len(path)):
                    lines.setdefault(path[:i], n)
                lines.setdefault(path, n)
                path = (*path, str(counts[path]))
            for i in range(1, len(path) + 1):
                lines.setdefault(path[:i], n)
            table = path
            continue
        m = _ASSIGN.match(line)
        if not m:
            continue
        key = (*table, *_split_key(m.group(1)))
        for i in range(len(table) + 1, len(key) + 1):
            lines.setdefault(key[:i], n)
        rest = line[m.end() :]
        # one-line inline tables: their keys, nested as the braces say
        stack = [key]
        pos = 0
        while pos < len(rest):
            ch = rest[pos]
            if ch in "\"'":
                end = rest.find(ch, pos + 1)
                pos = len(rest) if end < 0 else end + 1
                continue
            if ch == "#":
                break
            if ch == "{":
                inner = _ASSIGN.match(rest, pos + 1)
                stack.append(stack[-1])
                if inner:
                    stack[-1] = (*stack[-2], *_split_key(inner.group(1)))
                    lines.setdefault(stack[-1], n)
                    pos = inner.end()
                    continue
            elif ch == "}":
                stack.pop() if len(stack) > 1 else None
            elif ch == "," and len(stack) > 1:
                inner = _ASSIGN.match(rest, pos + 1)
                if inner:
                    stack[-1] = (*stack[-2], *_split_key(inner.group(1)))
                    lines.setdefault(stack[-1], n)
                    pos = inner.end()
                    continue
            pos += 1
    return lines


def parse_yaml(text: str, name: str = "job.yaml") -> Source:
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark is not None else 1
        what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise JobError(f"{name}:{line}: not valid YAML: {what}") from None
    lines: dict[Path, int] = {}

    def walk(n: Any, path: Path) -> None:
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                p = (*path, str(k.value))
                if p in lines:  # (YAML keeps the last of two; TOML refuses them)
                    raise JobError(
                        f"{name}:{k.start_mark.line + 1}: {'.'.join(p)} is given twice (first at line {lines[p]})"
                    )
                lines[p] = k.start_mark.line + 1
                walk(v, p)
        elif isinstance(n, yaml.SequenceNode):
            for i, v in enumerate(n.value):
                lines.setdefault((*path, str(i)), v.start_mark.line + 1)
                walk(v, (*path, str(i)))

    if node is not None:
        walk(node, ())
    try:
        data = yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
        # (a value YAML reads as a date that is none, 2026-02-30: its constructor's ValueError)
        line, value = _unbuilt_scalar(node, yaml)
        raise JobError(f"{name}:{line}: {value!r} is not a value YAML can read ({exc})") from None
    if data is None:
        data = {}
    return Source(name, data, lines)


def _unbuilt_scalar(node: Any, yaml: Any) -> tuple[int, str]:
    """The line and text of the first scalar of ``node`` that YAML's safe loader cannot build."""
    constructor = yaml.SafeLoader("")
    todo = [node]
    while todo:
        n = todo.pop(0)
        if isinstance(n, yaml.ScalarNode):
            try:
                constructor.construct_object(n, deep=True)
            except Exception:  # noqa: BLE001 - the one it cannot build
                return n.start_mark.line + 1, n.value
        elif isinstance(n, yaml.MappingNode):
            todo.extend(x for kv in n.value for x in kv)
        elif isinstance(n, yaml.SequenceNode):
            todo.extend(n.value)
    return 1, ""


# --- the checked job ----------------------------------------------------------------------------
@dataclass
class Dataset:
    name: str
    path: str
    storage_options: dict
    line: Path


@dataclass
class Analysis:
    name: str
    kind: Kind
    params: dict
    datasets: list[str]
    line: Path


@dataclass
class Job:
    """A job file, checked: its tables with defaults filled in."""

    source: Source
    run: dict
    cluster: dict
    cache: dict | None
    storage_options: dict
    datasets: dict[str, Dataset]
    analyses: dict[str, Analysis]

    @property
    def name(self) -> str:
        return str(self.run["name"])


def _type_name(v: Any) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a table",
        datetime.datetime: "a date-time",
        datetime.date: "a date",
        datetime.time: "a time",
    }.get(type(v), type(v).__name__)


def _shown(v: Any) -> str:
    """A value of the file as the file writes it: a TOML or YAML date, time or date-time in ISO form
    (not Python's ``datetime.datetime(2026, 1, 2, 10, 0)``), else its ``repr``."""
    if isinstance(v, (datetime.date, datetime.time)):
        return v.isoformat()
    return repr(v)


def _checked_table(src: Source, path: Path, value: Any, keys: tuple[Key, ...], what: str) -> dict:
    """``value`` (a table) checked against ``keys``: unknown keys, types, required keys; defaults set."""
    if not isinstance(value, Mapping):
        raise src.error(path, f"{what} must be a table, not {_type_name(value)}")
    known = {k.name: k for k in keys}
    for k in value:
        if k not in known:
            names = ", ".join(sorted(known))
            raise src.error((*path, str(k)), f"unknown key {k!r} in {what}; the keys are: {names}")
    out = {}
    for key in keys:
        p = (*path, key.name)
        if key.name not in value:
            if key.required:
                raise src.error(path, f"{what} has no {key.name!r} ({key.doc.replace('``', '')})")
            out[key.name] = key.default
            continue
        out[key.name] = _checked_value(src, p, value[key.name], key, what)
    return out


def _checked_value(src: Source, path: Path, v: Any, key: Key, what: str) -> Any:
    def bad(expected: str) -> JobError:
        return src.error(path, f"{what} {key.name}: expected {expected}, not {_type_name(v)} {_shown(v)}")

    t = key.type
    if t in ("str", "template"):
        if not isinstance(v, str):
            raise bad("a string")
        if not v.strip():  # (`path = ""` listed the current folder; `url = ""` was no cache, silently)
            leave = "" if key.required else ", or leave the key out"
            raise src.error(path, f"{what} {key.name}: is empty; give {key.doc.replace('``', '')}{leave}")
        if key.choices and v not in key.choices:
            raise src.error(path, f"{what} {key.name}: {v!r} is not one of {', '.join(key.choices)}")
        if t == "template":
            check_template(src, path, v, f"{what} {key.name}")
        return v
    if t == "int":
        if isinstance(v, bool) or not isinstance(v, int):
            raise bad("an integer")
    elif t == "float":
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise bad("a number")
        v = float(v)
    elif t == "bool":
        if not isinstance(v, bool):
            raise bad("true or false")
    elif t == "strings":
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
            raise bad("a string or a list of strings")
        return list(v)
    elif t == "table":
        if not isinstance(v, Mapping):
            raise bad("a table")
        return dict(v)
    elif t == "reductions":
        if not isinstance(v, Mapping) or not v:
            raise bad('a table of column = reductions (e.g. speed = ["mean", "max"])')
        out = {}
        for col, reds in v.items():
            reds = [reds] if isinstance(reds, str) else reds
            if not isinstance(reds, list) or not reds or not all(isinstance(r, str) for r in reds):
                raise src.error((*path, str(col)), f"{what} {key.name}.{col}: expected a reduction or a list of them")
            out[str(col)] = list(reds)
        return out
    if key.minimum is not None and v < key.minimum:
        raise src.error(path, f"{what} {key.name}: {v} is less than {key.minimum:g}")
    return v


def template_problem(text: str) -> str | None:
    """What is wrong with ``text`` as a path template (:data:`FIELDS`), said in words; ``None``: nothing."""
    try:
        parts = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(text) if f is not None]
    except ValueError as exc:
        return f"{text!r} is not a template ({exc})"
    for f, spec, conv in parts:
        if f not in FIELDS:
            return f"unknown field {{{f}}}; the fields are: {', '.join(FIELDS)}"
        if spec or conv:  # (the fields are text: {date} is YYYY-MM-DD, never reformatted)
            given = "{" + f + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "") + "}"
            return f"{given} takes no format or conversion; write {{{f}}} ({{date}} is YYYY-MM-DD)"
    return None


def record_problem(text: str) -> str | None:
    """What is wrong with ``text`` as the run record's path (``[run] record``, ``--record``): a
    template's faults, and the fields that have no value for the one record of a run."""
    problem = template_problem(text)
    if problem is None and any(f"{{{f}}}" in text for f in ("dataset", "analysis")):
        problem = "one record is written for the whole run, so {dataset} and {analysis} cannot be in its path"
    return problem


def check_template(src: Source, path: Path, text: str, what: str) -> None:
    problem = template_problem(text)
    if problem is not None:
        raise src.error(path, f"{what}: {problem}")


def expand(template: str, fields: Mapping[str, str]) -> str:
    """A template with its fields given (:data:`FIELDS`)."""
    return template.format_map(dict(fields))


def _is_date(text: str) -> bool:
    """Whether ``text`` is a day of the calendar written ``YYYY-MM-DD`` (not 2026-13-45)."""
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
        return False
    try:
        datetime.date.fromisoformat(text)
    except ValueError:
        return False
    return True


def check(src: Source) -> Job:
    """The job, checked (one :class:`~l5dask.core.jobfile.JobError` naming the file and the line for the first fault)."""
    data = src.data
    if not isinstance(data, Mapping):
        raise src.error((), "a job file is a table of tables (run, cluster, cache, datasets, analyses)")
    for k in data:
        if k not in TOP:
            raise src.error((str(k),), f"unknown key {k!r}; the keys are: {', '.join(TOP)}")
    raw_run = data.get("run", {})
    if isinstance(raw_run, Mapping) and type(raw_run.get("date")) is datetime.date:
        # a date written unquoted (TOML's and YAML's date) is that date
        raw_run = {**raw_run, "date": raw_run["date"].isoformat()}
    run = _checked_table(src, ("run",), raw_run, RUN_KEYS, "[run]")
    if run["date"] is not None and not _is_date(run["date"]):
        raise src.error(("run", "date"), f"[run] date: {run['date']!r} is not a date YYYY-MM-DD")
    problem = record_problem(run["record"]) if run["record"] else None
    if problem is not None:  # (the template's own faults were said by its check: this is the rest)
        raise src.error(("run", "record"), f"[run] record: {problem}")
    cluster = _checked_table(src, ("cluster",), data.get("cluster", {}), CLUSTER_KEYS, "[cluster]")
    if cluster["memory-limit"] is not None:
        from dask.utils import parse_bytes

        try:
            parse_bytes(cluster["memory-limit"])
        except (ValueError, TypeError):
            raise src.error(
                ("cluster", "memory-limit"),
                f"[cluster] memory-limit: {cluster['memory-limit']!r} is not an amount of memory (4GB, 512 MiB)",
            ) from None
    if cluster["scheduler"] is not None and cluster["workers"] is not None:
        raise src.error(("cluster", "workers"), "[cluster]: give a scheduler or local workers, not both")
    cache = None
    if "cache" in data:
        raw = data["cache"]
        if isinstance(raw, str):
            raw = {"url": raw}
        cache = _checked_table(src, ("cache",), raw, CACHE_KEYS, "[cache]")
        if cache.get("url"):
            try:
                check_location(str(cache["url"]), "[cache] url:")
            except UsageError as exc:
                raise src.error(("cache", "url"), str(exc)) from None
    options = data.get("storage-options", {})
    if not isinstance(options, Mapping):
        raise src.error(("storage-options",), "storage-options must be a table of fsspec options")
    datasets = _datasets(src, data.get("datasets"))
    analyses = _analyses(src, data.get("analyses"), datasets)
    return Job(src, run, cluster, cache, dict(options), datasets, analyses)


def _datasets(src: Source, raw: Any) -> dict[str, Dataset]:
    if not raw:
        raise src.error(("datasets",), "the job has no [datasets] (a name = a path, a URL or a glob)")
    if not isinstance(raw, Mapping):
        raise src.error(("datasets",), "[datasets] must be a table: a name = a path, or [datasets.NAME] path = ...")
    out = {}
    for name, value in raw.items():
        path = ("datasets", str(name))
        if isinstance(value, str):
            value = {"path": value}
            src.lines.setdefault((*path, "path"), src.line(path))
        t = _checked_table(src, path, value, DATASET_KEYS, f"[datasets.{name}]")
        out[str(name)] = Dataset(str(name), t["path"], t["storage-options"] or {}, (*path, "path"))
    return out


def _analyses(src: Source, raw: Any, datasets: Mapping[str, Dataset]) -> dict[str, Analysis]:
    if not raw:
        raise src.error(("analyses",), "the job has no [analyses]")
    if not isinstance(raw, Mapping):
        raise src.error(("analyses",), "[analyses] must be a table: [analyses.NAME] kind = ...")
    out = {}
    for name, value in raw.items():
        path = ("analyses", str(name))
        what = f"[analyses.{name}]"
        if not isinstance(value, Mapping):
            raise src.error(path, f"{what} must be a table, not {_type_name(value)}")
        kind_name = value.get("kind")
        if kind_name is None:
            # a misspelt 'kind' (kidn = ...) is named as the unknown key it is, with its line
            known = {k.name for k in COMMON_ANALYSIS_KEYS} | {k.name for a in ANALYSES.values() for k in a.keys}
            for k in value:
                if k not in known:
                    listed = ", ".join(sorted(known))
                    raise src.error(
                        (*path, str(k)), f"unknown key {k!r} in {what} (it has no 'kind'); the keys are: {listed}"
                    )
            raise src.error(path, f"{what} has no 'kind'; the kinds are: {', '.join(sorted(ANALYSES))}")
        if kind_name not in ANALYSES:
            raise src.error(
                (*path, "kind"),
                f"{what} kind: unknown kind {kind_name!r}; the kinds are: {', '.join(sorted(ANALYSES))}",
            )
        kind = ANALYSES[kind_name]
        params = _checked_table(src, path, value, COMMON_ANALYSIS_KEYS + kind.keys, f"{what} (kind {kind_name})")
        names = params.pop("datasets") or list(datasets)
        for d in names:
            if d not in datasets:
                raise src.error(
                    (*path, "datasets"), f"{what} datasets: no dataset {d!r}; the datasets are: {', '.join(datasets)}"
                )
        params.pop("kind")
        if kind.needs_output and not any(params.get(o) for o in kind.outputs):
            raise src.error(path, f"{what} writes nothing: give {' or '.join(kind.outputs)}")
        out[str(name)] = Analysis(str(name), kind, params, names, path)
    return out


def schema_keys() -> dict[str, tuple[Key, ...]]:
    """Every table of the schema and its keys (the reference page is checked against this)."""
    out: dict[str, tuple[Key, ...]] = {
        "[run]": RUN_KEYS,
        "[cluster]": CLUSTER_KEYS,
        "[cache]": CACHE_KEYS,
        "[datasets.NAME]": DATASET_KEYS,
    }
    for name, kind in sorted(ANALYSES.items()):
        out[f"[analyses.NAME] kind = {name!r}"] = COMMON_ANALYSIS_KEYS + kind.keys
    return out
