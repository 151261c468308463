"""Dataset surgery: concatenate, subset and split L5Kit datasets, chunk-parallel, in L5Kit's format.

Every operation is one plan: the output is a list of **runs**, each a contiguous range of scenes
of one input, carried with its frames, agents, traffic-light faces and agent masks, and with its
interval fields rebased as L5Kit's ``_append_zarr_subset`` does (``+ output offset - input
offset``). A run of scenes ``[s0, s1)`` covers the frames ``[f0, f1)`` of its scenes' intervals,
the agents ``[frames[f0].start, frames[f1 - 1].end)`` and the faces likewise. The frames' rows
at each scene's ends (and their timestamps, for time ranges) come from one pass over the frames
that also checks their intervals: a dataset whose intervals are broken is refused, not copied.

Writing: each output array is cut into tasks of whole output chunks; a task reads only the input
chunks its rows come from (after a shift, output and input chunks do not line up), adds the
shifts to the interval fields, and encodes and stores its chunks through the one writer
(:mod:`l5dask.prediction.writing`). Nothing holds a whole array. The group metadata (``.zgroup``) of every
output is written last, once all chunks of all outputs are stored; a failed run removes what it
wrote, so that nothing is left that opens as a dataset.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import os
import posixpath
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from dask.base import tokenize

from l5dask.core.engine import Job, Pass, Reduction
from l5dask.core.intervals import check_intervals
from l5dask.core.outputs import atomic_output
from l5dask.core.policy import auto_chunks_per_task, where_keywords
from l5dask.core.store import Store, archive_kind, nesting, output_folder
from l5dask.errors import OutputError, UsageError
from l5dask.prediction import format as fmt
from l5dask.prediction.dataset import L5Dataset, open_dataset
from l5dask.prediction.reading import L5Array
from l5dask.prediction.scenes import OUT_CHUNK_ROWS, NoScenesError
from l5dask.prediction.writing import finish, prepare_target, write_chunks

#: L5Kit's gigabyte (``zarr_utils.GIGABYTE``): 1024 ** 3 bytes.
GIGABYTE = 1024**3


# --- what each scene covers -------------------------------------------------------------------
@dataclass
class SceneTable:
    """Per scene of one dataset: its frames ``[f0, f1)``, agents ``[a0, a1)``, faces ``[t0, t1)``,
    host and first frame's timestamp (``-1`` for a scene without frames)."""

    f0: np.ndarray
    f1: np.ndarray
    a0: np.ndarray
    a1: np.ndarray
    t0: np.ndarray
    t1: np.ndarray
    host: np.ndarray
    timestamp: np.ndarray

    def __len__(self) -> int:
        return len(self.f0)


def _pick_chunk(wanted: np.ndarray, fields: tuple[str, ...], data: np.ndarray, start: int, parent: Any) -> tuple:
    lo, hi = np.searchsorted(wanted, [start, start + len(data)])
    idx = wanted[lo:hi] - start
    return wanted[lo:hi], {f: np.ascontiguousarray(data[f][idx]) for f in fields}


def _pick_combine(a: tuple, b: tuple) -> tuple:
    return np.concatenate([a[0], b[0]]), {f: np.concatenate([a[1][f], b[1][f]]) for f in a[1]}


def _pick_identity(fields: tuple[str, ...]) -> tuple:
    return np.zeros(0, np.int64), {
        f: np.zeros((0, 2), np.int64) if f.endswith("interval") else np.zeros(0, np.int64) for f in fields
    }


def pick_rows(
    array: L5Array, wanted: np.ndarray, fields: tuple[str, ...], job: Job, intervals: dict[str, int] | None = None
) -> dict[str, np.ndarray]:
    """``fields`` of the rows ``wanted`` (sorted, unique) of ``array``, in one pass over it that
    also checks ``intervals`` (``{field: child length}``) on every row."""
    token = tokenize(wanted, fields)
    red = Reduction(
        f"pick-{token}",
        functools.partial(_pick_chunk, wanted, fields),
        _pick_combine,
        functools.partial(_pick_identity, fields),
    )
    spec = Pass(array, red, intervals=dict(intervals or {}), blocks=True, name=f"{array.name}-rows")
    done = job.persist(spec) if intervals else [spec]
    rows, values = job.compute(done)[0]
    if not np.array_equal(rows, wanted):
        raise AssertionError("pick_rows lost rows")
    return values


def scene_table(ds: L5Dataset, job: Job) -> SceneTable:
    """What each scene of ``ds`` covers: scenes read whole (small), frames in one checked pass."""
    scenes = job.read(ds[fmt.SCENES])
    counts = ds.counts()
    iv = scenes["frame_index_interval"].reshape(-1, 2)
    check_intervals(iv, fmt.SCENES, "frame_index_interval", counts["frames"])
    f0, f1 = iv[:, 0].astype(np.int64), iv[:, 1].astype(np.int64)
    frames = ds[fmt.FRAMES]
    has_tl = tl_field(ds) is not None
    fields = ("timestamp", "agent_index_interval") + (("traffic_light_faces_index_interval",) if has_tl else ())
    intervals = {"agent_index_interval": counts["agents"]}
    if has_tl:
        intervals["traffic_light_faces_index_interval"] = counts["tl_faces"]
    nonempty = f1 > f0
    has_first = f0 < counts["frames"]  # an empty scene's agents start where its next frame's do
    wanted = np.unique(np.concatenate([f0[has_first], f1[nonempty] - 1]))
    got = pick_rows(frames, wanted, fields, job, intervals)

    def at(rows: np.ndarray, f: str, col: int | None) -> np.ndarray:
        v = got[f] if col is None else got[f].reshape(-1, 2)[:, col]
        return v[np.searchsorted(wanted, rows)]

    def span(f: str, total: int) -> tuple[np.ndarray, np.ndarray]:
        start = np.full(len(f0), total, np.int64)
        start[has_first] = at(f0[has_first], f, 0)
        end = start.copy()
        end[nonempty] = at(f1[nonempty] - 1, f, 1)
        return start, end

    a0, a1 = span("agent_index_interval", counts["agents"])
    t0, t1 = (
        span("traffic_light_faces_index_interval", counts["tl_faces"])
        if has_tl
        else (np.zeros(len(f0), np.int64), np.zeros(len(f0), np.int64))
    )
    ts = np.full(len(f0), -1, np.int64)
    ts[nonempty] = at(f0[nonempty], "timestamp", None)
    return SceneTable(f0, f1, a0, a1, t0, t1, np.asarray(scenes["host"]), ts)


def tl_field(ds: L5Dataset) -> str | None:
    """The frames' face interval field, when the dataset has traffic lights."""
    f = "traffic_light_faces_index_interval"
    return f if ds.has(fmt.TL_FACES) and f in fmt.names_of(ds[fmt.FRAMES].dtype) else None


# --- plans ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Piece:
    """Rows ``[lo, hi)`` of an input array, written at output row ``out``, ``shifts`` added to fields."""

    source: Any  # an L5Array, or rows in memory (anything with ``read``, ``chunk_bounds``)
    lo: int
    hi: int
    out: int
    shifts: tuple[tuple[str, int], ...] = ()


@dataclass
class Output:
    """One output dataset: where, and the pieces of each of its arrays."""

    store: Store
    labels: tuple[str, ...]
    pieces: dict[str, list[Piece]] = field(default_factory=dict)
    dtypes: dict[str, np.dtype] = field(default_factory=dict)
    tails: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def length(self, name: str) -> int:
        p = self.pieces[name]
        return p[-1].out + p[-1].hi - p[-1].lo if p else 0


def runs_of(scenes: np.ndarray) -> list[tuple[int, int]]:
    """Consecutive scene indices (in the given order) as ``[s0, s1)`` runs."""
    scenes = np.asarray(scenes, np.int64)
    if not len(scenes):
        return []
    cut = np.flatnonzero(np.diff(scenes) != 1) + 1
    starts, ends = np.r_[0, cut], np.r_[cut, len(scenes)]
    return [(int(scenes[a]), int(scenes[b - 1]) + 1) for a, b in zip(starts, ends)]


def plan(store: Store, parts: Sequence[tuple[L5Dataset, SceneTable, np.ndarray]], masks: Sequence[str] = ()) -> Output:
    """The output made of the scenes ``selected`` of each ``(dataset, its table, selected)``, in
    order, with the agent masks ``masks`` (which every dataset holds)."""
    first = parts[0][0]
    out = Output(store, first.labels)
    names = [fmt.SCENES, fmt.FRAMES, fmt.AGENTS] + ([fmt.TL_FACES] if first.has(fmt.TL_FACES) else [])
    for name in names:
        out.pieces[name], out.dtypes[name], out.tails[name] = [], first[name].dtype, ()
    for m in masks:
        key = f"{fmt.MASKS}/{m}"
        out.pieces[key], out.dtypes[key], out.tails[key] = [], first.masks[m].dtype, first.masks[m].meta.tail
    pos = dict.fromkeys(["scenes", "frames", "agents", "faces"], 0)
    tl = tl_field(first)
    for ds, t, selected in parts:
        for s0, s1 in runs_of(selected):
            f0, f1 = int(t.f0[s0]), int(t.f1[s1 - 1])
            a0, a1 = int(t.a0[s0]), int(t.a1[s1 - 1])
            c0, c1 = int(t.t0[s0]), int(t.t1[s1 - 1])
            add = out.pieces
            add[fmt.SCENES].append(
                Piece(ds[fmt.SCENES], s0, s1, pos["scenes"], (("frame_index_interval", pos["frames"] - f0),))
            )
            shifts = (
                (("agent_index_interval", pos["agents"] - a0),) + ((tl, pos["faces"] - c0),)
                if tl
                else (("agent_index_interval", pos["agents"] - a0),)
            )
            add[fmt.FRAMES].append(Piece(ds[fmt.FRAMES], f0, f1, pos["frames"], shifts))
            add[fmt.AGENTS].append(Piece(ds[fmt.AGENTS], a0, a1, pos["agents"]))
            if tl:
                add[fmt.TL_FACES].append(Piece(ds[fmt.TL_FACES], c0, c1, pos["faces"]))
            for m in masks:
                add[f"{fmt.MASKS}/{m}"].append(Piece(ds.masks[m], a0, a1, pos["agents"]))
            pos["scenes"] += s1 - s0
            pos["frames"] += f1 - f0
            pos["agents"] += a1 - a0
            pos["faces"] += c1 - c0
    for name in out.pieces:  # an empty piece writes nothing
        out.pieces[name] = [p for p in out.pieces[name] if p.hi > p.lo]
    return out


# --- writing ------------------------------------------------------------------------------------
def copy_rows(store: Store, meta: fmt.ArrayMeta, first: int, n: int, pieces: tuple[Piece, ...]) -> int:
    """The task that writes output chunks ``first .. first + n - 1`` of one array: reads the input
    chunks its rows come from (each once), shifts interval fields, encodes and stores."""
    lo = first * meta.chunk_rows
    hi = min(lo + n * meta.chunk_rows, meta.length)
    out = np.empty(hi - lo, dtype=meta.dtype)
    for p in pieces:
        a, b = max(p.lo, lo - p.out + p.lo), min(p.hi, hi - p.out + p.lo)  # input rows this task takes
        if b <= a:
            continue
        seg = p.source.read_rows(a, b, out[p.out + a - p.lo - lo : p.out + b - p.lo - lo])
        for f, shift in p.shifts:
            if shift:
                seg[f] += shift
    return write_chunks(store, meta, first, out)


def write_outputs(outputs: Sequence[Output], job: Job) -> None:
    """Write every array of every output (one compute), then each output's metadata, ``.zgroup``
    last; on any failure, remove what was written (nothing is left that opens)."""
    calls, metas = [], []
    for o in outputs:
        m = {}
        for name, pieces in o.pieces.items():
            rows = OUT_CHUNK_ROWS[fmt.MASKS if name.startswith(fmt.MASKS + "/") else name]
            meta = fmt.ArrayMeta(name, o.dtypes[name], o.length(name), rows, o.tails[name])
            m[name] = meta
            per = job.chunks_per_task or auto_chunks_per_task(meta.nchunks, job.threads, job.scheduler_kind)
            outs = np.array([p.out for p in pieces], np.int64)
            ends = outs + np.array([p.hi - p.lo for p in pieces], np.int64)
            for first in range(0, meta.nchunks, per):
                n = min(per, meta.nchunks - first)
                lo, hi = first * rows, min((first + n) * rows, meta.length)
                take = np.flatnonzero((outs < hi) & (ends > lo))
                calls.append((o.store, meta, first, n, tuple(pieces[k] for k in take)))
        metas.append(m)
    remote = any(o.store.remote for o in outputs) or any(
        getattr(p.source, "remote", False) for o in outputs for ps in o.pieces.values() for p in ps
    )
    try:
        job.map(copy_rows, calls, "l5-copy", remote=remote)
        for o, m in zip(outputs, metas):
            finish(o.store, m, o.labels)
    except BaseException:
        for o in outputs:
            remove(o.store)
        raise


def remove(store: Store) -> None:
    """Remove an output (best effort): its ``.zgroup`` first, so that it stops opening at once."""
    try:
        if store.fs.exists(store.path(".zgroup")):
            store.fs.rm(store.path(".zgroup"))
        if store.root and store.fs.exists(store.root):
            store.fs.rm(store.root, recursive=True)
    except OSError:
        pass


# --- inputs and targets -------------------------------------------------------------------------
def check_target(url: Any, inputs: Sequence[L5Dataset], storage_options: dict | None, overwrite: bool) -> None:
    """Refuse (before any work) an output that is one of the inputs, holds one or lies inside one,
    holds anything a dataset does not, or holds a dataset (unless ``overwrite``):
    :func:`~l5dask.prediction.writing.prepare_target`."""
    probe = Store(output_folder(url, "a dataset"), storage_options)
    for ds in inputs:
        how = nesting(probe, ds.store)
        if how is not None:
            raise OutputError(f"{probe.url}: the output {how} an input ({ds.url}); write elsewhere")
    prepare_target(url, storage_options, overwrite, remove=False)


def target(url: Any, inputs: Sequence[L5Dataset], storage_options: dict | None, overwrite: bool) -> Store:
    """The output location, checked (:func:`check_target`) and made ready in place (an old dataset
    removed when ``overwrite``): for a writer that cannot write beside it (:func:`targets` can)."""
    check_target(url, inputs, storage_options, overwrite)
    return prepare_target(url, storage_options, overwrite)


@contextlib.contextmanager
def targets(
    urls: Sequence[Any], inputs: Sequence[L5Dataset], storage_options: dict | None, overwrite: bool
) -> Iterator[list[Store]]:
    """The output locations, checked (:func:`check_target`), as the stores to write: a local
    folder is written beside it and moved into place whole when the block ends without an error,
    the previous dataset (``overwrite``) removed only then (:func:`~l5dask.core.outputs.atomic_output`:
    a run interrupted or failed keeps it; it was removed first); elsewhere the location itself, made
    ready (an old dataset removed when ``overwrite``)."""
    with contextlib.ExitStack() as stack:
        stores = []
        for url in urls:
            check_target(url, inputs, storage_options, overwrite)
            final = Store(os.fspath(url), storage_options)
            if final.local and final.root and archive_kind(final.url) is None:
                os.makedirs(os.path.dirname(os.path.abspath(final.root)), exist_ok=True)
                stores.append(Store(stack.enter_context(atomic_output(final.root, folder=True)), storage_options))
            else:
                stores.append(prepare_target(url, storage_options, overwrite))
        yield stores


def common_masks(inputs: Sequence[L5Dataset]) -> list[str]:
    """The agent masks every input holds, with one dtype (the others cannot be concatenated)."""
    names = set(inputs[0].masks)
    for ds in inputs[1:]:
        names &= set(ds.masks)
    return sorted(n for n in names if len({ds.masks[n].dtype for ds in inputs}) == 1)


def check_compatible(inputs: Sequence[L5Dataset]) -> None:
    """Inputs of one concatenation must have the same arrays, dtypes and label lists."""
    first = inputs[0]
    for ds in inputs[1:]:
        if ds.labels != first.labels:
            raise UsageError(f"{ds.url}: its label list differs from {first.url}'s; they cannot be concatenated")
        for name in fmt.ARRAY_NAMES:
            if ds.has(name) != first.has(name):
                has, lacks = (ds, first) if ds.has(name) else (first, ds)
                raise UsageError(f"{has.url} has a {name} array and {lacks.url} does not; they cannot be concatenated")
        for name in fmt.ARRAY_NAMES:
            if ds.has(name) and ds[name].dtype != first[name].dtype:
                raise UsageError(
                    f"{ds.url}: its {name} dtype {ds[name].dtype.descr} differs from {first.url}'s "
                    f"{first[name].dtype.descr}; they cannot be concatenated"
                )


def _open(url: Any, storage_options: dict | None) -> L5Dataset:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # no traffic lights: supported
        return open_dataset(url, storage_options)


# --- the operations -------------------------------------------------------------------------------
@where_keywords
def concat(
    inputs: Sequence[Any],
    output: Any,
    *,
    storage_options: dict | None = None,
    overwrite: bool = False,
    scheduler: Any = None,
    chunks_per_task: int | None = None,
    progress: bool = False,
) -> L5Dataset:
    """Concatenate datasets into ``output``: value-equal to L5Kit's ``zarr_concat`` on the four
    arrays (which skips inputs it cannot open: these are refused here), and the agent masks that
    every input holds are concatenated too.

    Parameters
    ----------
    inputs : sequence of paths, URLs or :class:`~l5dask.prediction.dataset.L5Dataset`
    output : path or URL
        Refused if a dataset is there, unless ``overwrite``.
    scheduler : optional
        Where to run (a ``distributed.Client`` or its address, ``"threads"``...; default: the
        active client, else local threads), as :class:`l5dask.core.engine.Job`; ``client=`` is its
        old name (until the next release, with a ``FutureWarning``).
    """
    if not inputs:
        raise UsageError("concat needs at least one input dataset")
    datasets = [_open(u, storage_options) for u in inputs]
    check_compatible(datasets)
    check_target(output, datasets, storage_options, overwrite)
    job = Job(scheduler, chunks_per_task=chunks_per_task, progress=progress)
    tables = [scene_table(ds, Job(job)) for ds in datasets]
    with targets([output], datasets, storage_options, overwrite) as (store,):
        out = plan(store, [(ds, t, np.arange(len(t))) for ds, t in zip(datasets, tables)], common_masks(datasets))
        write_outputs([out], job)
    return _open(output, storage_options)


def parse_ranges(text: str, nscenes: int | None) -> list[tuple[int, int]]:
    """``"0:100,200:250"`` as scene ranges ``[start, end)``; empty, overlapping or out-of-range
    ranges are refused (``nscenes`` None: their form alone, before the dataset is read)."""
    ranges: list[tuple[int, int]] = []
    known = nscenes is not None
    top = nscenes if nscenes is not None else sys.maxsize
    for part in str(text).split(","):
        m = re.fullmatch(r"\s*(-?\d*)\s*:\s*(-?\d*)\s*", part)
        if not m:
            raise UsageError(f"scene range {part.strip()!r} is not START:END (e.g. 0:100)")
        a = int(m.group(1)) if m.group(1) else 0
        b = int(m.group(2)) if m.group(2) else top
        if a < 0 and not known:
            raise UsageError(f"scene range {part.strip()!r} is out of range: scene indices start at 0")
        if a < 0 or b > top:
            raise UsageError(
                f"scene range {part.strip()!r} is out of range: the dataset has {nscenes} scenes (0:{nscenes})"
            )
        if b <= a:
            raise UsageError(f"scene range {part.strip()!r} is empty (END must be greater than START)")
        for c, d in ranges:
            if a < d and c < b:
                raise UsageError(f"scene ranges {c}:{d} and {a}:{b} overlap")
        ranges.append((a, b))
    return ranges


def ranges_argument(scenes: Any) -> str:
    """:func:`subset`'s ``scenes=`` as the text of its ranges; anything but ranges refused in one line."""
    text = None
    if isinstance(scenes, str):
        if all(re.fullmatch(r"\s*-?\d*\s*:\s*-?\d*\s*", part) for part in scenes.split(",")):
            text = scenes
    elif isinstance(scenes, (list, tuple)) and scenes:
        pairs = [p for p in scenes if isinstance(p, (list, tuple)) and len(p) == 2]
        if len(pairs) == len(scenes) and all(isinstance(x, (int, np.integer)) for p in pairs for x in p):
            text = ",".join(f"{int(a)}:{int(b)}" for a, b in pairs)
    if text is None:
        raise UsageError(
            f"subset: scenes={scenes!r} is not START:END ranges: scenes= takes scene ranges of stored scene "
            "indices, 'START:END,...' or [(start, end), ...] (e.g. '0:100,200:250'); to keep given scenes or "
            "those where a condition holds, subset ds.isel(scene=[...]) or ds.query('...')"
        )
    return text


def parse_time(text: Any, what: str) -> int:
    """An ISO date or time (UTC unless it says otherwise) as nanoseconds since the epoch."""
    if isinstance(text, (int, np.integer)):
        return int(text)
    try:
        t = _dt.datetime.fromisoformat(str(text).strip().replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"{what} {text!r} is not an ISO date or time (e.g. 2019-11-01 or 2019-11-01T08:00:00)"
        ) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.timezone.utc)
    delta = t - _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
    return (delta // _dt.timedelta(microseconds=1)) * 1000


def select_scenes(
    t: SceneTable,
    scenes: str | Sequence[tuple[int, int]] | None = None,
    hosts: Sequence[str] | str | None = None,
    start: Any = None,
    end: Any = None,
    stored: np.ndarray | None = None,
    nstored: int = 0,
) -> np.ndarray:
    """The scene indices (rows of ``t``) that pass every filter given: in the ranges (in their
    order), of one of ``hosts``, whose first frame's timestamp is in ``[start, end)``. The ranges
    are stored scene indices: with ``stored`` (the stored index of each row of ``t``, sorted, of
    ``nstored`` stored scenes: ``t`` is a restricted dataset's), those rows that are in them."""
    n = len(t)
    if scenes is None:
        order = np.arange(n)
    else:
        total = n if stored is None else nstored
        ranges = (
            parse_ranges(scenes, total)
            if isinstance(scenes, str)
            else parse_ranges(",".join(f"{a}:{b}" for a, b in scenes), total)
        )
        order = np.concatenate([np.arange(a, b) for a, b in ranges])
        if stored is not None:  # (stored indices: those of the scenes ``t`` holds, at their rows)
            pos = np.minimum(np.searchsorted(stored, order), len(stored) - 1)
            order = pos[stored[pos] == order]
    keep = np.ones(n, bool)
    if hosts is not None:
        hosts = [h.strip() for h in hosts.split(",")] if isinstance(hosts, str) else list(hosts)
        known = sorted(set(t.host.tolist()))
        unknown = [h for h in hosts if h not in known]
        if unknown:
            raise UsageError(f"no scene has host {', '.join(map(repr, unknown))}; the hosts are {', '.join(known)}")
        keep &= np.isin(t.host, hosts)
    if start is not None or end is not None:
        lo = parse_time(start, "--start") if start is not None else np.iinfo(np.int64).min
        hi = parse_time(end, "--end") if end is not None else np.iinfo(np.int64).max
        if hi <= lo:
            raise UsageError(f"the time range [{start}, {end}) is empty")
        keep &= (t.timestamp >= lo) & (t.timestamp < hi) & (t.f1 > t.f0)
    selected = order[keep[order]]
    if not len(selected):
        raise NoScenesError("no scene matches the subset asked for; nothing written")
    return selected


@where_keywords
def subset(
    input: Any,
    output: Any,
    *,
    scenes: str | Sequence[tuple[int, int]] | None = None,
    hosts: Sequence[str] | str | None = None,
    start: Any = None,
    end: Any = None,
    storage_options: dict | None = None,
    overwrite: bool = False,
    scheduler: Any = None,
    chunks_per_task: int | None = None,
    progress: bool = False,
) -> L5Dataset:
    """Keep some scenes of a dataset (with their frames, agents, faces and agent masks): scene
    ranges ``"START:END,..."`` (or ``[(start, end), ...]``) of stored scene indices, hosts, and/or a
    time range ``[start, end)`` of their first frames (ISO, UTC unless said); filters given
    together must all hold. A dataset restricted by :meth:`~l5dask.prediction.dataset.L5Dataset.isel`
    or :meth:`~l5dask.prediction.dataset.L5Dataset.query` is written whole when no filter is given,
    else the scenes of it the filters keep (its ranges still the stored indices); intervals rebased
    as L5Kit's ``_append_zarr_subset``. ``scheduler``: where
    to run, as for :func:`~l5dask.prediction.surgery.concat`."""
    ds = _open(input, storage_options)
    restricted = ds.parent is not None and ds.scene_indices is not None
    if scenes is None and hosts is None and start is None and end is None and not restricted:
        raise UsageError(
            "subset: say which scenes to keep: scenes= (scene ranges), hosts=, or start=/end= "
            "(or give a dataset restricted by ds.isel or ds.query)"
        )
    nstored = len(ds.parent[fmt.SCENES]) if ds.parent is not None and restricted else len(ds[fmt.SCENES])
    if scenes is not None:
        scenes = ranges_argument(scenes)
        parse_ranges(scenes, nstored)  # refused now, before any work
    if start is not None or end is not None:
        parse_time(start, "--start") if start is not None else None
        parse_time(end, "--end") if end is not None else None
    check_target(output, [ds], storage_options, overwrite)
    job = Job(scheduler, chunks_per_task=chunks_per_task, progress=progress)
    t = scene_table(ds, Job(job))
    stored = ds.scene_indices if restricted else None
    selected = select_scenes(t, scenes, hosts, start, end, stored, nstored)
    with targets([output], [ds], storage_options, overwrite) as (store,):
        write_outputs([plan(store, [(ds, t, selected)], sorted(ds.masks))], job)
    return _open(output, storage_options)


def dataset_bytes(ds: L5Dataset) -> int:
    """Bytes of every file of the dataset, as L5Kit's ``_compute_path_size`` counts them."""
    return int(ds.store.fs.du(ds.store.root, total=True) if ds.store.root else ds.store.fs.du("", total=True))


def parse_part(spec: str) -> tuple[str, str]:
    """``NAME=N`` (scenes), ``NAME=1.5GB`` (L5Kit's size-based split) or ``NAME=rest``."""
    name, sep, size = str(spec).partition("=")
    name, size = name.strip(), size.strip()
    if not sep or not name or not size:
        raise UsageError(f"part {spec!r} is not NAME=N, NAME=SIZE_GB (e.g. 1.5GB) or NAME=rest")
    if "/" in name or name in (".", ".."):
        raise UsageError(f"part {spec!r}: the name must be a plain folder name")
    if size != "rest" and not re.fullmatch(r"\d+", size) and not re.fullmatch(r"(\d+(\.\d*)?|\.\d+)\s*[gG][bB]", size):
        raise UsageError(f"part {spec!r}: the size must be a number of scenes (N), of gigabytes (1.5GB) or 'rest'")
    return name, size


def split_counts(parts: Sequence[tuple[str, str]], nscenes: int, nbytes: int) -> list[int]:
    """Scenes per part, in order: ``N``; ``x GB`` as ``zarr_split`` (``int(scenes * x / size in
    GB)``, GB of 1024 ** 3 bytes, the input's size counting every file); ``rest``: the others."""
    names = [n for n, _ in parts]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise UsageError(f"part name(s) {', '.join(sorted(dup))} given twice")
    rest = [i for i, (_, s) in enumerate(parts) if s == "rest"]
    if rest and (len(rest) > 1 or rest[0] != len(parts) - 1):
        raise UsageError("only the last part may be 'rest'")
    counts = []
    for name, size in parts[: len(parts) - len(rest)]:
        if size.lower().endswith("gb"):
            counts.append(int(nscenes * float(size[:-2]) / (nbytes / GIGABYTE)))
        else:
            counts.append(int(size))
        if counts[-1] == 0:
            raise UsageError(
                f"part {name}={size} holds no scene (the dataset has {nscenes} scenes, {nbytes / GIGABYTE:.4g} GB)"
            )
    taken = sum(counts)
    if rest:
        if taken >= nscenes:
            raise UsageError(f"the parts take {taken} of the {nscenes} scenes: nothing is left for {parts[-1][0]}=rest")
        counts.append(nscenes - taken)
    elif taken > nscenes:
        raise UsageError(f"the parts take {taken} scenes; the dataset has {nscenes}")
    return counts


@where_keywords
def split(
    input: Any,
    outdir: Any,
    parts: Sequence[str | tuple[str, str]],
    *,
    storage_options: dict | None = None,
    overwrite: bool = False,
    scheduler: Any = None,
    chunks_per_task: int | None = None,
    progress: bool = False,
) -> dict[str, L5Dataset]:
    """Split a dataset into consecutive parts written to ``outdir/NAME``: ``NAME=N`` scenes,
    ``NAME=1.5GB`` (L5Kit's ``zarr_split``) and a last ``NAME=rest``. Returns the parts' datasets.
    ``scheduler``: where to run, as for :func:`~l5dask.prediction.surgery.concat`."""
    parsed = [parse_part(p) if isinstance(p, str) else (str(p[0]), str(p[1])) for p in parts]
    if not parsed:
        raise UsageError("split needs at least one part (NAME=N, NAME=1.5GB or NAME=rest)")
    ds = _open(input, storage_options)
    nscenes = len(ds[fmt.SCENES])
    sized = [f"{n}={s}" for n, s in parsed if s.lower().endswith("gb")]
    if sized and ds.parent is not None and nscenes < len(ds.parent[fmt.SCENES]):
        # (the size is that of the stored files, as zarr_split counts them: the chosen scenes' own
        # is known only once they are written; the whole dataset's cut 2 of 20 chosen scenes for 7)
        raise UsageError(
            f"part {sized[0]}: a part in GB is cut by the size of a stored dataset's files (L5Kit's "
            f"zarr_split), and these are {nscenes} of its scenes: write them first (l5dask subset) and "
            "split that, or give the parts in scenes (NAME=N)"
        )
    counts = split_counts(parsed, nscenes, dataset_bytes(ds) if sized else 0)
    base = output_folder(outdir, "a split").rstrip("/")
    held = Store(base, storage_options).files()
    if ".zgroup" in held or "zarr.json" in held:  # (its parts would be written inside that dataset)
        raise OutputError(
            f"{base}: is a dataset (or an export); split writes its parts as folders in a folder of their own"
        )
    paths = [posixpath.join(base, name) if "://" in base else os.path.join(base, name) for name, _ in parsed]
    for p in paths:
        check_target(p, [ds], storage_options, overwrite)
    job = Job(scheduler, chunks_per_task=chunks_per_task, progress=progress)
    t = scene_table(ds, Job(job))
    if "://" not in base:
        os.makedirs(base, exist_ok=True)
    edges = np.r_[0, np.cumsum(counts)]
    with targets(paths, [ds], storage_options, overwrite) as stores:
        outputs = [
            plan(s, [(ds, t, np.arange(edges[i], edges[i + 1]))], sorted(ds.masks)) for i, s in enumerate(stores)
        ]
        write_outputs(outputs, job)
    return {name: _open(p, storage_options) for (name, _), p in zip(parsed, paths)}
