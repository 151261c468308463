"""A dataset restricted to some of its scenes (``docs/guide/catalog.md``, "finding scenes").

:meth:`L5Dataset.isel(scene=...) <l5dask.prediction.dataset.L5Dataset.isel>` (scene indices, or a
boolean per scene) and :meth:`L5Dataset.query(scene=...) <l5dask.prediction.dataset.L5Dataset.query>`
(the ``where`` language of ``l5dask agg`` over the scene catalog's columns) return the dataset that
``l5dask subset`` (L5Kit's ``_append_zarr_subset``: every interval rebased) would write for those
scenes, read in place. Its arrays are :class:`SceneView` s: the runs of rows of the chosen scenes,
numbered from 0 and cut in L5Kit's chunk sizes, as the written subset's; a task reads only the
stored chunks that hold its rows, each once, so chunks holding none of the chosen scenes' rows
are never read, and every pass, view, join, report and export of the package runs on it unchanged.

Making one reads the scenes array (small) and the frames at the ends of each run of consecutive
chosen scenes (for the agents and faces they cover), nothing else. The catalog an expression
reads is given: a DataFrame (:func:`~l5dask.prediction.catalog.catalog`), or the Parquet ``l5dask catalog`` writes,
checked against the dataset's :func:`fingerprint` (the commands make one when none is given).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
from dask.base import tokenize

from l5dask.core.codec import check_blosc, decode_blosc
from l5dask.core.engine import Job, Pass, Reduction
from l5dask.core.intervals import check_intervals
from l5dask.core.outputs import filesystem
from l5dask.errors import ChunkError, IntervalError, UsageError
from l5dask.prediction import format as fmt
from l5dask.prediction.kernels import Gather
from l5dask.prediction.reading import (
    ChunkPart,
    L5Array,
    chunk_fault,
    decode_chunk,
    project,
    read_chunk_part,
    sorted_unique,
)
from l5dask.prediction.where import evaluate_where, names_in, reworded, where_columns

#: Rows per chunk of a restricted dataset's arrays: those L5Kit writes a subset with (its
#: ``ChunkedDataset`` sizes; 10 000 for agent masks), so that it is chunked as the written subset.
OUT_CHUNK_ROWS = {**fmt.CHUNK_ROWS, fmt.MASKS: 10_000}
#: The key of the dataset's fingerprint in a catalog's Parquet (and Arrow) schema metadata.
CATALOG_KEY = "l5dask.catalog"
#: A stored chunk of which the rows wanted are fewer than this share is read in part: the blosc
#: blocks that hold them (the others whole, fetched ahead with their neighbours).
PARTIAL_BELOW = 0.75
#: The categories of the catalog's string columns that do not depend on the data (L5Kit's turn tags).
KNOWN_CATEGORIES = {"turn": ("left", "right", "straight"), "turn_unwrapped": ("left", "right", "straight")}


class NoScenesError(UsageError):
    """A filter that selects no scene (the CLI exits with code 1: an answer, not a mistake)."""

    exit_code = 1


# --- the view of one array --------------------------------------------------------------------
class SceneView(L5Array):
    """Rows of one stored array: the pieces ``[lo[i], hi[i])`` of ``base`` (sorted, disjoint), one
    after the other from row 0, ``shifts`` (``{field: one value a piece}``) added to interval fields.
    Chunks of ``chunk_rows`` rows of these; a chunk is made from the stored chunks its rows come
    from, each read and decoded once a task."""

    def __init__(
        self,
        base: L5Array,
        lo: np.ndarray,
        hi: np.ndarray,
        shifts: dict[str, np.ndarray] | None = None,
        chunk_rows: int | None = None,
    ) -> None:
        lo, hi = np.asarray(lo, np.int64), np.asarray(hi, np.int64)
        keep = hi > lo
        self.base, self.lo, self.hi = base, lo[keep], hi[keep]
        self.shifts = {f: np.asarray(s, np.int64)[keep] for f, s in (shifts or {}).items() if np.any(s)}
        self.out = np.concatenate([[0], np.cumsum(self.hi - self.lo)]).astype(np.int64)
        meta = base.meta
        rows = chunk_rows or meta.chunk_rows
        super().__init__(
            base.store, fmt.ArrayMeta(meta.name, meta.dtype, int(self.out[-1]), rows, meta.tail), base.compressed
        )

    def select(self, fields: Sequence[str]) -> SceneView:
        view = SceneView.__new__(SceneView)
        view.__dict__.update(self.__dict__)
        view.base = self.base.select(fields)
        return view

    def window(self, first: int, n: int) -> SceneView:
        """The view as a task over its chunks ``first .. first + n - 1`` needs it: only the pieces
        of rows those chunks are made of (the engine's :func:`~l5dask.core.engine.windowed`: on a
        cluster each task's pieces travel with it, not the whole tables: 6,700 runs, 0.2 MB, at 5%
        of train_full's scenes spread over it). ``n`` 0: no piece (the chunking alone)."""
        if n:
            a, b = self.meta.chunk_bounds(first)[0], self.meta.chunk_bounds(first + n - 1)[1]
            p0 = max(0, int(np.searchsorted(self.out, a, "right")) - 1)
            p1 = max(p0, int(np.searchsorted(self.out, b, "left")))
        else:
            p0 = p1 = 0
        view = SceneView.__new__(SceneView)
        view.__dict__.update(self.__dict__)
        view.lo, view.hi = self.lo[p0:p1].copy(), self.hi[p0:p1].copy()
        view.out = self.out[p0 : p1 + 1].copy()
        view.shifts = {f: s[p0:p1].copy() for f, s in self.shifts.items()}
        return view

    def __dask_tokenize__(self):
        return (
            "l5dask.SceneView",
            self.base.__dask_tokenize__(),
            self.meta.chunk_rows,
            tokenize(self.lo, self.hi, self.shifts),
        )

    def chunk_identities(self) -> list[tuple]:
        """What identifies each of the view's chunks, for the cache of partials: the pieces of
        base rows it is made of (their rows and the shifts added to them) and the identities of
        the stored chunks they are read from (:meth:`~l5dask.prediction.reading.L5Array.chunk_identities`). (The base's
        identities of the view's chunk numbers, inherited before, made two restrictions with chunks of
        the same bounds share entries: the second read the first's partials.)"""
        base_ids = self.base.chunk_identities()
        rows = self.base.meta.chunk_rows
        out = []
        for i in range(self.meta.nchunks):
            a, b = self.meta.chunk_bounds(i)
            p0 = int(np.searchsorted(self.out, a, "right")) - 1
            p1 = int(np.searchsorted(self.out, b, "left"))
            blo = self.lo[p0:p1] + np.maximum(0, a - self.out[p0:p1])
            bhi = self.hi[p0:p1] - np.maximum(0, self.out[p0 + 1 : p1 + 1] - b)
            stored = sorted(
                {c for x, y in zip(blo.tolist(), bhi.tolist()) for c in range(x // rows, (y - 1) // rows + 1)}
            )
            shifts = {f: s[p0:p1].tolist() for f, s in sorted(self.shifts.items())}
            out.append(("l5dask.SceneView", (a, b), blo.tolist(), bhi.tolist(), shifts, [base_ids[c] for c in stored]))
        return out

    # reading --------------------------------------------------------------------------------
    def _walk(self, a: int, b: int, step: int, items: Any, put: Any) -> Iterator[tuple[int, int]]:
        """Rows ``[a, b)`` cut at multiples of ``step`` (0: not cut), from the stored chunks they
        come from, in order (``items(chunks, blo, bhi)``: ``(first base row, rows, payload)`` of
        each stored chunk or part of one read, each once): ``put(payload, row, n, at, piece)`` of
        each run of ``n`` rows from the payload's ``row`` on, going to row ``at`` of the view's
        chunk being made, from piece ``piece``; ``(start, stop)`` yielded once a chunk is made."""
        p0 = int(np.searchsorted(self.out, a, "right")) - 1
        p1 = int(np.searchsorted(self.out, b, "left"))
        # the base rows of each piece within [a, b)
        blo = self.lo[p0:p1] + np.maximum(0, a - self.out[p0:p1])
        bhi = self.hi[p0:p1] - np.maximum(0, self.out[p0 + 1 : p1 + 1] - b)
        vat = (self.out[p0:p1] + (blo - self.lo[p0:p1])).tolist()
        base_rows = self.base.meta.chunk_rows
        chunks = sorted_unique(
            np.concatenate([np.arange(x // base_rows, (y - 1) // base_rows + 1) for x, y in zip(blo, bhi)])
        )
        if not step:
            step = b
        cstart, cend = a, min(b, (a // step + 1) * step)
        seg = 0
        los, his = blo.tolist(), bhi.tolist()
        for bstart, length, payload in items(chunks, blo, bhi):
            bstop = bstart + length
            while seg < len(los) and los[seg] < bstop:
                x, y = max(los[seg], bstart), min(his[seg], bstop)
                while x < y:
                    v = vat[seg] + x - los[seg]
                    take = min(y - x, cend - v)
                    put(payload, x - bstart, take, v - cstart, p0 + seg)
                    x += take
                    if v + take == cend:
                        yield cstart, cend
                        cstart, cend = cend, min(b, cend + step)
                if his[seg] <= bstop:
                    seg += 1
                else:
                    break

    def _stream(self, a: int, b: int, step: int = 0, fresh: bool = False) -> Iterator[tuple[int, np.ndarray]]:
        """``(start, records)`` of rows ``[a, b)`` cut at multiples of ``step`` (0: not cut): the stored chunks
        they come from read in order, each once; one buffer reused (a new one each if ``fresh``)."""
        if b <= a:
            return
        size = min(step or b, b - a)
        buf: list[np.ndarray] = []

        def put(recs: np.ndarray, x: int, take: int, at: int, piece: int) -> None:
            if not buf:
                buf.append(np.empty(size, recs.dtype))
            out = buf[0][at : at + take]
            out.view(np.uint8)[:] = recs[x : x + take].view(np.uint8)
            for f, s in self.shifts.items():
                if s[piece]:
                    out[f] += s[piece]

        for cstart, cend in self._walk(a, b, step, self._base_rows, put):
            yield cstart, buf[0][: cend - cstart]
            if fresh and b > cend:
                buf[0] = np.empty(min(size, b - cend), buf[0].dtype)

    def _gatherable(self) -> bool:
        """Whether the base's stored chunks are blosc chunks of records read from its store (the
        compressed gather reads them, and only the blocks of some rows are read)."""
        return type(self.base) is L5Array and self.base.compressed

    def _wanted(self, chunks: np.ndarray, blo: np.ndarray, bhi: np.ndarray) -> Iterator[tuple[int, bool, list]]:
        """``(stored chunk, whole, ranges)`` of ``chunks``: read whole (nearly all of its rows are
        wanted, or the base is not :meth:`_gatherable`), or only the blosc blocks holding the
        wanted rows ``ranges`` (of ``[blo[i], bhi[i])``, :data:`PARTIAL_BELOW`)."""
        meta = self.base.meta
        partial = self._gatherable()
        # (the pieces each chunk overlaps found for all chunks at once, as Python's ints: a numpy
        # search a chunk and numpy's scalars took 4.6 ms against 1.1 ms over the 1,269 chunks of 5%
        # of 121 M agents' scenes spread, about 1% of its filtered report)
        starts = np.asarray(chunks, np.int64) * meta.chunk_rows
        ends = np.minimum(starts + meta.chunk_rows, meta.length)
        first, last = np.searchsorted(bhi, starts, "right").tolist(), np.searchsorted(blo, ends, "left").tolist()
        los, his = blo.tolist(), bhi.tolist()
        limit = PARTIAL_BELOW * meta.chunk_rows
        for c, a, b, i0, i1 in zip(chunks.tolist(), starts.tolist(), ends.tolist(), first, last):
            ranges = [(max(x, a), min(y, b)) for x, y in zip(los[i0:i1], his[i0:i1])]
            yield c, not partial or sum(y - x for x, y in ranges) > limit, ranges

    def _runs(self, chunks: np.ndarray, blo: np.ndarray, bhi: np.ndarray) -> Iterator[tuple[int, int, list]]:
        """:meth:`_wanted` with the stored chunks read whole grouped in runs of consecutive ones
        (fetched together, ahead): ``(first, n, [])``, or ``(chunk, 0, ranges)`` for a part."""
        run: list[int] = []
        for c, whole, ranges in self._wanted(chunks, blo, bhi):
            if whole:
                if run and run[-1] != c - 1:
                    yield run[0], len(run), []
                    run = []
                run.append(c)
                continue
            if run:
                yield run[0], len(run), []
                run = []
            yield c, 0, ranges
        if run:
            yield run[0], len(run), []

    def _reads(self, runs: list[tuple[int, int, list]]) -> Iterator[Any]:
        """What is read of each stored chunk of ``runs`` (:meth:`_runs`), in order: a chunk read
        whole, its bytes; one read in part, what :func:`~l5dask.prediction.reading.read_chunk_part`
        reads of it. On a local disk the next few are read at once, from the task's start on
        (``Store.read_ahead``), while the task works on those it has: a
        task of a few scenes spread over the dataset waited for each (a chunk read in part: its
        header, then its blocks), and a run of chunks read whole started when its turn came."""
        base = self.base
        items: list[tuple[int, list | None]] = []
        for c, n, ranges in runs:
            items.extend([(i, None) for i in range(c, c + n)] if n else [(c, ranges)])
        return base.store.read_ahead(functools.partial(_read_stored, base.store, base.meta), items)

    def _base_rows(self, chunks: np.ndarray, blo: np.ndarray, bhi: np.ndarray) -> Iterator[tuple[int, int, Any]]:
        """``(start, rows, records)`` of the stored ``chunks`` (sorted) of the base, in order: those
        wanted (nearly) whole read whole, of the others only the blosc blocks holding the wanted
        rows ``[blo[i], bhi[i])`` (:func:`~l5dask.prediction.reading.read_chunk_part`), all read
        ahead (:meth:`_reads`); a base of another kind (a view) read by its ``iter_chunks``."""
        base = self.base
        runs = list(self._runs(chunks, blo, bhi))
        if type(base) is not L5Array:  # (not gatherable: every chunk read whole)
            for c, n, _ in runs:
                for start, records in base.iter_chunks(c, n):
                    yield start, len(records), records
            return
        meta = base.meta
        reads = self._reads(runs)
        for c, n, ranges in runs:
            scratch = None  # (a run's chunks decoded into one buffer, in turn)
            for index in range(c, c + n):
                scratch = decode_chunk(next(reads), meta, base.compressed, str(index), out=scratch)
                a, b = meta.chunk_bounds(index)
                yield a, b - a, scratch[: b - a]
            if not n:
                for (x, y), records in zip(ranges, next(reads).decode(meta, c, ranges)):
                    yield x, y - x, records

    def _base_encoded(self, chunks: np.ndarray, blo: np.ndarray, bhi: np.ndarray) -> Iterator[tuple[int, int, Any]]:
        """As :meth:`_base_rows`, the bytes read not decoded: ``(start, rows, (source, row))``, the
        rows from row ``row`` of a :class:`Stored` (a stored chunk, or the blocks of some of its
        rows: :func:`part_sources`), or of records."""
        meta = self.base.meta
        runs = list(self._runs(chunks, blo, bhi))
        reads = self._reads(runs)
        for c, n, ranges in runs:
            for index in range(c, c + n):
                a, b = meta.chunk_bounds(index)
                yield a, b - a, (Stored(meta, index, next(reads), meta.chunk_rows), 0)
            if not n:
                part = next(reads)
                for (x, y), payload in zip(ranges, part_sources(part, meta, c, ranges)):
                    yield x, y - x, payload

    def iter_chunks(self, first: int, n: int):
        a, b = self.meta.chunk_bounds(first)[0], self.meta.chunk_bounds(first + n - 1)[1]
        return self._stream(a, b, self.meta.chunk_rows)

    def iter_encoded(self, first: int, n: int):
        """``(start, ViewChunk)`` of the view's chunks ``first .. first + n - 1``: each a
        ``ViewChunk`` (this module's) of the bytes its rows are read from, not decoded (the stored
        chunks that hold other scenes' rows too: whole, or the blosc blocks of the wanted rows),
        each stored chunk read once; records where the base is not blosc chunks of records read
        from its store (``_gatherable``)."""
        a, b = self.meta.chunk_bounds(first)[0], self.meta.chunk_bounds(first + n - 1)[1]
        if not self._gatherable():
            yield from self._stream(a, b, self.meta.chunk_rows, fresh=True)
            return
        if b <= a:
            return
        entries: list[list] = [[]]

        def put(payload: tuple, x: int, take: int, at: int, piece: int) -> None:
            entries[0].append((payload[0], payload[1] + x, take, at, piece))

        for cstart, cend in self._walk(a, b, self.meta.chunk_rows, self._base_encoded, put):
            yield cstart, ViewChunk(self.dtype, cend - cstart, entries[0], self.shifts)
            entries[0] = []

    def read_encoded(self, first: int, n: int) -> np.ndarray:  # type: ignore[override]
        """As :meth:`read`: records (see :meth:`iter_encoded`)."""
        return self.read(first, n)

    def read(self, first: int, n: int, fields: Sequence[str] | str | None = None) -> np.ndarray:
        names = self._fields(fields)
        dtype = self.dtype if names is None else project(np.empty(0, self.dtype), names).dtype
        if n == 0:
            return np.empty(0, dtype)
        a, b = self.meta.chunk_bounds(first)[0], self.meta.chunk_bounds(first + n - 1)[1]
        out = np.empty(b - a, dtype)
        for start, recs in self._stream(a, b):
            if names is None:
                out[start - a : start - a + len(recs)] = recs
            else:
                for f in names:
                    out[f][start - a : start - a + len(recs)] = recs[f]
        return out

    def read_rows(self, lo: int, hi: int, out: np.ndarray) -> np.ndarray:
        for start, recs in self._stream(lo, hi):
            out[start - lo : start - lo + len(recs)].view(np.uint8)[:] = recs.view(np.uint8)
        return out

    def __repr__(self) -> str:
        return f"<SceneView {self.name} len={len(self)} of {len(self.base)} rows, {len(self.lo)} runs>"


class Stored:
    """A blosc chunk of records read for a view: a stored chunk whole (``rows``: its chunk's), or
    the blocks of some of its rows made into a chunk of their own
    (:func:`~l5dask.prediction.reading.read_chunk_part`); decoded once, if asked."""

    __slots__ = ("meta", "index", "raw", "rows", "_records", "_checked")

    def __init__(self, meta: fmt.ArrayMeta, index: int, raw: Any, rows: int) -> None:
        self.meta, self.index, self.raw, self.rows = meta, index, raw, rows
        self._records: np.ndarray | None = None
        self._checked = False

    def check(self) -> None:
        """The one rule (:func:`~l5dask.core.codec.check_blosc`) for a chunk of ``rows`` records,
        before any reader sees it: ``ChunkError`` naming the stored chunk otherwise."""
        if self._checked:
            return
        why = check_blosc(self.raw, self.rows * self.meta.dtype.itemsize, self.meta.typesize)
        if why is not None:
            raise ChunkError(chunk_fault(self.meta, str(self.index), why))
        self._checked = True

    def records(self) -> np.ndarray:
        """Its records, decoded by numcodecs (once); ``ChunkError`` naming the stored chunk."""
        if self._records is None:
            out = np.empty(self.rows, self.meta.dtype)
            try:
                decode_blosc(self.raw, out, self.meta.typesize)
            except (RuntimeError, ValueError, TypeError) as exc:
                raise ChunkError(chunk_fault(self.meta, str(self.index), str(exc))) from None
            self._records = out
        return self._records


def _read_stored(store: Any, meta: fmt.ArrayMeta, item: tuple[int, list | None]) -> Any:
    """Of ``item``, ``(stored chunk, ranges)``: the chunk's bytes (``ranges`` ``None``: read whole),
    or what :func:`~l5dask.prediction.reading.read_chunk_part` reads of it for ``ranges``."""
    index, ranges = item
    if ranges is None:
        return store.get(meta.key(index), what=f"array {meta.name!r}, chunk {str(index)!r}")
    return read_chunk_part(store, meta, index, ranges)


def part_sources(
    part: ChunkPart, meta: fmt.ArrayMeta, index: int, ranges: Sequence[tuple[int, int]]
) -> list[tuple[Any, int]]:
    """Where the rows of each of ``ranges`` are in what :func:`~l5dask.prediction.reading.read_chunk_part`
    read of stored chunk ``index``: ``(Stored, row)``, the blocks read as a blosc chunk and the
    range's first row in it; or ``(records, 0)`` where the part was read as records (a chunk stored
    without compression) or its blocks are not whole records (decoded by numcodecs here)."""
    item = meta.dtype.itemsize
    if part.rows is not None or part.nbytes % item or any(at % item for at in part.at):
        return [(records, 0) for records in part.decode(meta, index, ranges)]
    stored = Stored(meta, index, part.raw, part.nbytes // item)
    return [(stored, at // item) for at in part.at]


class ViewChunk:
    """A chunk of a view's rows, read but not decoded: what :meth:`SceneView.iter_encoded` hands a
    pass with ``encoded=True`` (as :class:`~l5dask.prediction.reading.Encoded` for a whole
    dataset). ``entries``: ``(source, row, n, at, piece)``, the ``n`` rows from row ``row`` of a
    :class:`Stored` (or of records) go to rows ``at ..`` of the chunk, from the view's piece
    ``piece`` (``shifts``: added to interval fields, a value a piece).

    :meth:`gather` makes number columns, label argmaxes and distinct values straight from the
    compressed bytes, those rows only (:meth:`~l5dask.prediction.kernels.Gather.blosc_ranges`),
    as the full pass does: a filtered pass then costs per byte read what a full one does (before,
    the blocks read were decoded whole and the columns gathered from the records). A source the
    compiled gather does not take is decoded by numcodecs (which says what is wrong with it)."""

    def __init__(self, dtype: np.dtype, n: int, entries: list[tuple], shifts: dict[str, np.ndarray]) -> None:
        self.dtype, self.n, self.entries, self.shifts = dtype, n, entries, shifts
        self._records: np.ndarray | None = None

    def __len__(self) -> int:
        return self.n

    def spans(self) -> list[tuple[int, int]]:
        """The chunk's rows as one span (its rows are the view's, in one chunk)."""
        return [(0, self.n)]

    def records(self) -> np.ndarray:
        """The records (each source decoded once, the shifts added), as the view's records path
        (:meth:`SceneView.iter_chunks`) makes them."""
        if self._records is None:
            out = np.empty(self.n, self.dtype)
            for src, row, take, at, piece in self.entries:
                recs = src if isinstance(src, np.ndarray) else src.records()
                part = out[at : at + take]
                part.view(np.uint8)[:] = recs[row : row + take].view(np.uint8)
                for f, s in self.shifts.items():
                    if s[piece]:
                        part[f] += s[piece]
            self._records = out
        return self._records

    def _shifted(self, names: set[str]) -> bool:
        """Whether a shift is added to any of the fields ``names`` in this chunk's rows."""
        return any(f in names and any(s[piece] for *_, piece in self.entries) for f, s in self.shifts.items())

    def gather(
        self,
        elements: Sequence[tuple[str, tuple[int, ...]]],
        argmax: Sequence[str] = (),
        distinct: str | None = None,
        found: list[np.ndarray] | None = None,
        values: list[np.ndarray] | None = None,
        codes: list[np.ndarray] | None = None,
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """As :meth:`l5dask.prediction.reading.Encoded.gather` (the arrays appended to ``found``:
        each source's distinct values; ``codes``: indices into their concatenation)."""
        plan = Gather.of(self.dtype, elements, argmax, distinct)
        outs, maxes = plan.outputs(self.n)
        vals = plan.value_outputs(self.n) if values is not None else None
        out_codes = np.empty(self.n, np.int32) if codes is not None and distinct is not None else None
        names = {f for f, _ in elements} | set(argmax) | ({distinct} if distinct else set())
        if self._records is not None or not plan.native or self._shifted(names):
            plan.records(self.records(), outs, maxes, 0, found, vals, out_codes)
        else:
            self._gather(plan, outs, maxes, found, vals, out_codes)
        if values is not None and vals is not None:
            values.extend(vals)
        if codes is not None and out_codes is not None:
            codes.append(out_codes)
        return outs, maxes

    def _gather(
        self,
        plan: Gather,
        outs: list[np.ndarray],
        maxes: list[np.ndarray],
        found: list[np.ndarray] | None,
        vals: list[np.ndarray] | None,
        out_codes: np.ndarray | None,
    ) -> None:
        """:meth:`gather` from the sources' bytes: one compiled call a source (its rows' ranges)."""
        scratch = np.empty(0, np.uint8)
        addresses = plan.addresses(outs, maxes, vals)  # (once for every source's call)
        first = len(found) if found is not None else 0
        entries, i = self.entries, 0
        while i < len(entries):
            src = entries[i][0]
            j = i + 1
            while j < len(entries) and entries[j][0] is src:
                j += 1
            group = entries[i:j]
            before = len(found) if found is not None else 0
            status = 1
            if isinstance(src, Stored):
                src.check()
                lo = np.array([e[1] for e in group], np.int64)
                status, scratch = plan.blosc_ranges(
                    src.raw,
                    src.rows,
                    lo,
                    lo + np.array([e[2] for e in group], np.int64),
                    np.array([e[3] for e in group], np.int64),
                    outs,
                    maxes,
                    scratch,
                    found,
                    vals,
                    out_codes,
                    addresses,
                )
            if status != 0:  # (records, or a chunk the compiled gather does not take: numcodecs says why)
                recs = src if isinstance(src, np.ndarray) else src.records()
                for _, row, take, at, _ in group:
                    n0 = len(found) if found is not None else 0
                    plan.records(recs[row : row + take], outs, maxes, at, found, vals, out_codes)
                    if out_codes is not None and found is not None and n0 > first:
                        out_codes[at : at + take] += sum(len(x) for x in found[first:n0])
            elif out_codes is not None and found is not None and before > first:
                # (a source's codes count from its own values: after those of the sources before)
                shift = sum(len(x) for x in found[first:before])
                for _, _, take, at, _ in group:
                    out_codes[at : at + take] += shift
            i = j


# --- the restriction ----------------------------------------------------------------------------
def scene_indices(ds: Any, scenes: Any, what: str = "scenes") -> np.ndarray:
    """``scenes`` (indices, negative ones counting from the end, a slice, or a boolean per scene)
    as sorted, distinct indices of ``ds``'s scenes; out of range, a mask of the wrong length, or
    none selected: one line."""
    n = len(ds[fmt.SCENES])
    if isinstance(scenes, slice):  # (as numpy slices: negative bounds count from the end)
        scenes = np.arange(n)[scenes]
    arr = np.asarray(scenes)
    if arr.dtype == bool:
        if arr.shape != (n,):
            raise UsageError(f"{what}: a boolean mask of {arr.size:,} values; the dataset has {n:,} scenes")
        idx = np.flatnonzero(arr)
    else:
        if arr.size and arr.dtype.kind not in "iu":
            raise UsageError(f"{what}: scene indices are integers (got {arr.dtype} values)")
        idx = arr.astype(np.int64).ravel()
        idx = sorted_unique(np.where((idx < 0) & (idx >= -n), idx + n, idx))  # (negative: from the end, as numpy)
        bad = idx[(idx < 0) | (idx >= n)]
        if len(bad):
            raise UsageError(
                f"{what}: scene index {int(bad[0])} is out of range (the dataset has {n:,} scenes: 0 to {n - 1})"
            )
    if not len(idx):
        raise NoScenesError(f"{what} selects no scene (of {n:,})")
    return idx


def _rows_chunk(fields: tuple[str, ...], data: np.ndarray, start: int, parent: Any) -> dict[str, np.ndarray]:
    return {f: np.ascontiguousarray(data[f]) for f in fields}


def _rows_combine(a: dict, b: dict) -> dict:
    return {f: np.concatenate([a[f], b[f]]) for f in a} if a else b


def _rows_identity() -> dict:
    return {}


def read_rows_checked(view: SceneView, fields: tuple[str, ...], intervals: dict[str, int], job: Job) -> dict:
    """``fields`` of every row of ``view``, in one pass; each row's ``intervals`` (``{field: child
    length}``) checked to lie in its child array (the rows are not consecutive: the full check of
    contiguity is the passes' over the restricted arrays)."""
    red = Reduction(
        f"scene-ends-{'-'.join(fields)}", functools.partial(_rows_chunk, fields), _rows_combine, _rows_identity
    )
    got = job.compute([Pass(view, red, blocks=True, name=f"{view.name}-scene-ends")])[0]
    for f, total in intervals.items():
        iv = got[f].reshape(-1, 2).astype(np.int64)
        bad = np.flatnonzero((iv[:, 0] < 0) | (iv[:, 1] < iv[:, 0]) | (iv[:, 1] > total))
        if len(bad):
            row = int(view.lo[bad[0]])
            raise IntervalError(
                f"{view.name}.{f}: row {row}: [{iv[bad[0], 0]}, {iv[bad[0], 1]}) is not within the {total:,} rows it indexes"
            )
    return got


def interval_field(ds: Any) -> str | None:
    """The frames' face interval field, when the dataset has traffic lights."""
    f = "traffic_light_faces_index_interval"
    return f if ds.has(fmt.TL_FACES) and f in fmt.names_of(ds[fmt.FRAMES].dtype) else None


def _through_the_page_cache(array: L5Array) -> L5Array:
    """``array`` read through the page cache even when its dataset is read around it (``large``:
    :mod:`l5dask.core.diskread`): the blocks of frames at the chosen scenes' ends are nearly all
    the blocks that the pass over the chosen scenes' frames reads next (a block holds ~4 scenes'
    frames), which then finds them in the cache, where it read them from the disk a second time
    (at 1 G agents, cold, 5% of the scenes spread over the dataset: ~660 reads of 16 MB twice)."""
    if not array.store.large:
        return array
    store = copy.copy(array.store)
    store.large = False
    return L5Array(store, array.meta, array.compressed)


def restriction(
    ds: Any, scenes: Any, *, job: Job | None = None, what: str = "scenes"
) -> tuple[dict[str, L5Array], dict[str, L5Array], np.ndarray]:
    """The arrays and agent masks of ``ds`` (a stored dataset) restricted to ``scenes`` (indices,
    or a boolean per scene), and the scenes' indices: the subset's intervals as L5Kit's
    ``_append_zarr_subset`` writes them (``+ output offset - input offset``, a run of consecutive
    scenes at a time). Reads the scenes array and the frames at the chosen scenes' two ends."""
    idx = scene_indices(ds, scenes, what)
    job = job or Job()
    counts = ds.counts()
    scenes_rec = ds[fmt.SCENES].read(0, ds[fmt.SCENES].nchunks, ["frame_index_interval"])
    iv = scenes_rec["frame_index_interval"].reshape(-1, 2).astype(np.int64)
    check_intervals(iv, fmt.SCENES, "frame_index_interval", counts["frames"])
    tl = interval_field(ds)
    fields = ("agent_index_interval",) + ((tl,) if tl else ())
    intervals = {"agent_index_interval": counts["agents"], **({tl: counts["tl_faces"]} if tl else {})}
    # runs of consecutive chosen scenes: their frames [f0, f1), agents [a0, a1), faces [c0, c1)
    cut = np.flatnonzero(np.diff(idx) != 1) + 1
    s0, s1 = idx[np.r_[0, cut]], idx[np.r_[cut, len(idx)] - 1] + 1
    f0, f1 = iv[s0, 0], iv[s1 - 1, 1]
    nonempty = f1 > f0
    has_first = f0 < counts["frames"]  # (an empty run's agents start where its next frame's do)
    wanted = sorted_unique(np.concatenate([f0[has_first], f1[nonempty] - 1]))
    got = (
        read_rows_checked(
            SceneView(_through_the_page_cache(ds[fmt.FRAMES]), wanted, wanted + 1), fields, intervals, job
        )
        if len(wanted)
        else {}
    )

    def span(f: str, total: int) -> tuple[np.ndarray, np.ndarray]:
        start = np.full(len(s0), total, np.int64)
        if len(wanted):
            col = got[f].reshape(-1, 2).astype(np.int64)
            start[has_first] = col[np.searchsorted(wanted, f0[has_first]), 0]
        end = start.copy()
        if len(wanted):
            end[nonempty] = col[np.searchsorted(wanted, f1[nonempty] - 1), 1]
        return start, end

    a0, a1 = span("agent_index_interval", counts["agents"])
    c0, c1 = span(tl, counts["tl_faces"]) if tl else (np.zeros(len(s0), np.int64), np.zeros(len(s0), np.int64))

    def out_starts(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(hi - lo)[:-1]]).astype(np.int64)

    def view(name: str, source: L5Array, lo, hi, shifts=None) -> SceneView:
        return SceneView(source, lo, hi, shifts, OUT_CHUNK_ROWS[name])

    frame_shifts = {"agent_index_interval": out_starts(a0, a1) - a0}
    if tl:
        frame_shifts[tl] = out_starts(c0, c1) - c0
    arrays: dict[str, L5Array] = {
        fmt.SCENES: view(fmt.SCENES, ds[fmt.SCENES], s0, s1, {"frame_index_interval": out_starts(f0, f1) - f0}),
        fmt.FRAMES: view(fmt.FRAMES, ds[fmt.FRAMES], f0, f1, frame_shifts),
        fmt.AGENTS: view(fmt.AGENTS, ds[fmt.AGENTS], a0, a1),
    }
    if ds.has(fmt.TL_FACES):
        arrays[fmt.TL_FACES] = view(fmt.TL_FACES, ds[fmt.TL_FACES], c0, c1)
    masks: dict[str, L5Array] = {name: view(fmt.MASKS, m, a0, a1) for name, m in ds.masks.items()}
    return {k: arrays[k] for k in ds.arrays}, masks, idx


# --- the catalog a filter reads -------------------------------------------------------------------
def _is_text(typ: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    return bool(pa.types.is_string(typ) or pa.types.is_large_string(typ))


def catalog_columns(table: Any, names: Any = None) -> dict[str, tuple[np.ndarray, tuple[str, ...] | None]]:
    """Columns ``names`` (default: all) of a catalog (a pandas DataFrame, an Arrow table, or a
    ``pyarrow.parquet.ParquetFile``: only those columns read) as ``{column: (values, categories)}``
    for the ``where`` language: strings as codes of their sorted values (``-1``: null), times as
    nanoseconds since the epoch (UTC), numbers as they are (null: NaN)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if isinstance(table, pq.ParquetFile):
        t = table.read(columns=[n for n in table.schema_arrow.names if names is None or n in names])
    elif isinstance(table, pa.Table):
        t = table
    else:
        t = pa.Table.from_pandas(table, preserve_index=False)
    out: dict[str, tuple[np.ndarray, tuple[str, ...] | None]] = {}
    for name in t.column_names:
        if names is not None and name not in names:
            continue
        col = t.column(name).combine_chunks()
        typ = col.type
        if pa.types.is_dictionary(typ):
            col = col.cast(typ.value_type)
            typ = col.type
        if _is_text(typ):
            values = col.to_pylist()
            cats = tuple(sorted({v for v in values if v is not None} | set(KNOWN_CATEGORIES.get(name, ()))))
            codes = {c: i for i, c in enumerate(cats)}
            out[name] = (np.array([codes.get(v, -1) if v is not None else -1 for v in values], np.int64), cats)
        elif pa.types.is_timestamp(typ) and typ.unit == "ns":  # (l5dask catalog's: its int64 as they are)
            out[name] = (_numpy(col.view(pa.int64())), None)
        elif pa.types.is_timestamp(typ):  # (a cast: it imports pyarrow.compute, 0.05 CPU-s of a command)
            out[name] = (_numpy(col.cast(pa.timestamp("ns", typ.tz)).cast(pa.int64())), None)
        elif pa.types.is_boolean(typ) or pa.types.is_integer(typ) or pa.types.is_floating(typ):
            out[name] = (_numpy(col), None)
    return out


def _bits(buf: Any, offset: int, n: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(buf, np.uint8), bitorder="little")[offset : offset + n].astype(bool)


def _numpy(col: Any) -> np.ndarray:
    """An Arrow array of numbers or booleans as numpy, nulls as NaN (its buffers read as they
    are: pyarrow's own conversion imports pandas, half a second of a command's start)."""
    import pyarrow as pa

    n, off = len(col), col.offset
    validity, data = col.buffers()[:2]
    if pa.types.is_boolean(col.type):
        values: np.ndarray = _bits(data, off, n)
    else:
        dtype = np.dtype(col.type.to_pandas_dtype())
        values = np.frombuffer(data, dtype, n, off * dtype.itemsize).copy()
    if col.null_count:
        values = np.where(_bits(validity, off, n), values.astype(np.float64), np.nan)
    return values


def _schema(table: Any) -> tuple[list[str], dict[str, np.dtype], set[str], int]:
    """A catalog's column names, their numpy types (times: ``datetime64[ns]``; text and others:
    object), its text columns and its rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if isinstance(table, pq.ParquetFile):
        schema, rows = table.schema_arrow, table.metadata.num_rows
    elif isinstance(table, pa.Table):
        schema, rows = table.schema, table.num_rows
    else:
        schema, rows = pa.Schema.from_pandas(table, preserve_index=False), len(table)
    dtypes: dict[str, np.dtype] = {}
    for f in schema:
        if pa.types.is_timestamp(f.type):
            dtypes[f.name] = np.dtype("datetime64[ns]")
        elif pa.types.is_boolean(f.type) or pa.types.is_integer(f.type) or pa.types.is_floating(f.type):
            dtypes[f.name] = np.dtype(f.type.to_pandas_dtype())
        else:
            dtypes[f.name] = np.dtype(object)
    return schema.names, dtypes, {f.name for f in schema if _is_text(f.type)}, rows


#: The catalog's columns renamed, by their old name: an expression that names the old one reads the
#: new one, with a ``FutureWarning`` (until the next release); one that names the new one over a
#: catalog written before the rename reads the old one.
RENAMED_COLUMNS = {"frames": "num_frames"}


class _Catalog:
    """The catalog's columns, as the ``where`` checks (:func:`~l5dask.prediction.where.where_columns`)
    look at a table's: every column's name and kind; the values of those an expression names."""

    class _Col:
        def __init__(self, categorical: bool, dtype: np.dtype) -> None:
            self.categorical, self.dtype = categorical, dtype

    def __init__(self, table: Any, expr: str) -> None:
        names, dtypes, text, self.rows = _schema(table)
        self.columns = {n: self._Col(n in text, dtypes[n]) for n in names}
        wanted = names_in(expr)
        alias = {}  # (a name the expression says: the column read for it)
        for old, new in RENAMED_COLUMNS.items():
            if old in wanted and old not in self.columns and new in self.columns:
                warnings.warn(
                    f"the catalog's column {old!r} is named {new!r} since l5dask 0.1.0 (as in the report's "
                    f"per-scene table): {old!r} is read as {new!r} until the next release",
                    FutureWarning,
                    stacklevel=4,
                )
                alias[old] = new
            elif new in wanted and new not in self.columns and old in self.columns:  # (a catalog written before)
                alias[new] = old
        for name, column in alias.items():
            self.columns[name] = self.columns[column]
        self.cols = catalog_columns(table, (wanted & set(names)) | set(alias.values()))
        for name, column in alias.items():
            self.cols[name] = self.cols[column]

    def categories(self, name: str) -> tuple[str, ...] | None:
        return self.cols[name][1]

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, name: str) -> np.ndarray:
        return self.cols[name][0]


def evaluate(expr: str, table: Any, values: bool = True) -> np.ndarray:
    """The scenes (a boolean per catalog row) where ``expr`` holds over ``table`` (a pandas
    DataFrame, an Arrow table or a ``ParquetFile``); unknown columns, an expression that is not a
    condition: one line. ``values=False``: the names compared with a text column are not checked
    against its values (over a catalog with no row, before the catalog is made: its hosts are not
    known yet)."""
    cat = _Catalog(table, expr)
    where_columns(expr, cat, what="the catalog", values=values)
    cats = {k: c for k, (_, c) in cat.cols.items() if c is not None}
    return np.asarray(evaluate_where(expr, cat, cats))


def scenes_digest(records: np.ndarray) -> str:
    """The SHA-256 of a dataset's scene records (all their fields, as stored), a part of its :func:`fingerprint`."""
    return hashlib.sha256(np.ascontiguousarray(records).view(np.uint8).tobytes()).hexdigest()


def fingerprint(ds: Any, scenes_sha256: str | None = None) -> dict[str, Any]:
    """What identifies the dataset a catalog was made of: its path, each array's length and chunk
    size, a digest of each array's stored metadata (``.zarray``) and one of its scenes' records
    (``scenes_digest``, small; two datasets of one shape differ there, in their times and
    hosts: ``scenes_sha256`` when the caller has it, else the scenes are read). A catalog is
    checked against all but the path (a dataset copied elsewhere keeps its catalog)."""
    arrays = {}
    for name, arr in ds.arrays.items():
        raw = ds.store.get_metadata(f"{name}/.zarray") or b""
        arrays[name] = {
            "length": len(arr),
            "chunk_rows": arr.meta.chunk_rows,
            "nchunks": arr.meta.nchunks,
            "zarray_sha256": hashlib.sha256(raw).hexdigest(),
        }
    if scenes_sha256 is None:
        scenes = ds[fmt.SCENES]
        scenes_sha256 = scenes_digest(scenes.read(0, scenes.nchunks))
    out = {"dataset": ds.url, "arrays": arrays, "scenes_sha256": scenes_sha256}
    if getattr(ds, "parent", None) is not None and ds.scene_indices is not None:  # (a restricted dataset)
        whole = fingerprint(ds.parent)  # (what the scenes were chosen from: its catalog rows map to it)
        out["restricted"] = {
            "scenes": len(ds.scene_indices),
            "of": len(ds.parent[fmt.SCENES]),
            "whole": {k: whole[k] for k in ("arrays", "scenes_sha256")},
        }
    return out


def scene_records(ds: Any) -> np.ndarray:
    """The records of ``ds``'s scenes (all of them: small, a few MB at 134,622 scenes)."""
    scenes = ds[fmt.SCENES]
    return scenes.read(0, scenes.nchunks)


def check_fingerprint(
    theirs: dict, ds: Any, what: str, records: np.ndarray | None = None, some_scenes: bool = False
) -> bool:
    """A catalog's fingerprint (``theirs``) against ``ds``'s: one line saying what differs (a
    catalog of some of its scenes, of the dataset as it was, of another dataset). ``records``: the
    dataset's scene records, when the caller has read them. ``some_scenes``: a catalog of some of
    ``ds``'s scenes (``l5dask catalog DATASET --scenes ...``) is taken too (``True`` returned for
    it: its ``stored_scene_index`` says its scenes), as ``--scenes-from`` takes it."""
    mine = fingerprint(ds, None if records is None else scenes_digest(records))
    keys = ("arrays", "scenes_sha256", "restricted")
    if all(theirs.get(k) == mine.get(k) for k in keys):
        return False
    src, part = theirs.get("dataset", "?"), theirs.get("restricted")
    whole = {k: mine.get(k) for k in ("arrays", "scenes_sha256")}
    if some_scenes and part and not mine.get("restricted") and part.get("whole") == whole:
        return True
    remake = "make the catalog of the whole dataset: l5dask.catalog(ds), or l5dask catalog DATASET -o FILE"
    if part and not mine.get("restricted"):
        raise UsageError(
            f"{what} was made from {part['scenes']:,} of the {part['of']:,} scenes of {src} (a filtered "
            "catalog); a filter needs the catalog of the whole dataset (l5dask.catalog(ds), or l5dask catalog DATASET -o FILE)"
            + ("" if some_scenes or part.get("whole") is None else "; --scenes-from takes it, to choose its scenes")
        )
    if mine.get("restricted"):
        raise UsageError(
            f"{what} is not the catalog of these scenes of {ds.url}: give the catalog of the whole dataset"
        )
    if src == ds.url:
        raise UsageError(
            f"{what} was made from {src} when it held other data: its fingerprint differs now (make the catalog again: {remake})"
        )
    raise UsageError(f"{what} was made from another dataset ({src}), not {ds.url}: its fingerprint differs ({remake})")


def _open_input(path: str, storage_options: dict | None):
    """A file to read: a local one opened as it is (no fsspec), a URL through fsspec."""
    if "://" not in path:
        return open(path, "rb")
    fs, target = filesystem(path, storage_options)
    return fs.open(target, "rb")


@contextmanager
def read_catalog(
    path: Any,
    ds: Any,
    storage_options: dict | None = None,
    what: str = "the catalog",
    records: np.ndarray | None = None,
    some_scenes: bool = False,
):
    """The catalog Parquet at ``path`` (a ``pyarrow.parquet.ParquetFile``: columns read when asked for), refused in one line if it is no catalog of
    ``ds`` (its fingerprint, written by ``l5dask catalog``, differs, or it has none). A context manager: the file is
    closed when it ends, refused or not. ``records``: ``ds``'s scene records, when the caller has read them."""
    import pyarrow.parquet as pq

    p = os.fspath(path)
    try:
        f = _open_input(p, storage_options)
    except FileNotFoundError:
        raise UsageError(f"{what} {p}: no such file") from None
    with f:
        try:
            t = pq.ParquetFile(f)
        except Exception as exc:  # (pyarrow's ArrowInvalid: not Parquet)
            if not type(exc).__name__.startswith("Arrow"):
                raise
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UsageError(f"{what} {p}: not a Parquet file ({first})") from None
        with t:
            theirs = parquet_fingerprint(t.schema_arrow.metadata or {})
            if theirs is None:
                raise UsageError(
                    f"{what} {p}: no fingerprint of a dataset in its metadata, so it cannot be checked against "
                    f"{ds.url} (written by a tool that drops it?): give the Parquet l5dask catalog writes, or one "
                    "filtered with pandas (read_parquet keeps its fingerprint in DataFrame.attrs, to_parquet writes "
                    "it back), or make it again: l5dask catalog DATASET -o FILE"
                )
            check_fingerprint(theirs, ds, f"{what} {p}", records, some_scenes)
            yield t


def parquet_fingerprint(meta: dict) -> dict | None:
    """The fingerprint in a Parquet's schema metadata: where ``l5dask catalog`` writes it, else in
    the ``attrs`` pandas keeps when it writes a DataFrame of ``l5dask.catalog`` (or one filtered
    from it: ``cat[cat.num_frames > 100].to_parquet(...)``): pandas (2.1 on) under ``PANDAS_ATTRS``,
    pyarrow's ``Table.from_pandas`` in its ``pandas`` metadata (``attributes``)."""
    raw = meta.get(CATALOG_KEY.encode())
    if raw is not None:
        return json.loads(raw)
    try:
        attrs = json.loads(meta[b"PANDAS_ATTRS"]) if b"PANDAS_ATTRS" in meta else None
        if attrs is None and b"pandas" in meta:  # (pyarrow's Table.from_pandas: under "attributes")
            kept = json.loads(meta[b"pandas"])
            attrs = kept.get("attributes") or kept.get("attrs")
    except (ValueError, AttributeError):
        return None
    found = attrs.get("l5dask") if isinstance(attrs, dict) else None
    return found if isinstance(found, dict) and "arrays" in found else None


def _many_flags(what: str, flags: list[str]) -> UsageError:
    """The one line for a catalog given with more than one boolean column (which one chooses?)."""
    return UsageError(
        f"{what}: a catalog with one boolean column says which scenes; it has {len(flags)} ({', '.join(flags)})"
    )


def read_scene_list(path: Any, ds: Any, storage_options: dict | None = None) -> np.ndarray:
    """``--scenes-from``: a text file of scene indices (one a line; blank lines and ``#`` comments
    skipped), or a catalog Parquet of ``ds`` with one boolean column (its true rows), or with
    none (the scenes of its rows, by their ``scene_index``: a catalog filtered with pandas)."""
    p = os.fspath(path)
    n = len(ds[fmt.SCENES])
    what = f"--scenes-from {p}"
    if p.endswith(".parquet"):
        import pyarrow as pa

        records = scene_records(ds)
        with read_catalog(p, ds, storage_options, "--scenes-from", records, some_scenes=True) as t:
            flags = [f.name for f in t.schema_arrow if pa.types.is_boolean(f.type)]
            theirs = parquet_fingerprint(t.schema_arrow.metadata or {}) or {}
            if theirs.get("restricted") and getattr(ds, "scene_indices", None) is None:
                # (a catalog of some scenes, checked against the whole dataset: its stored_scene_index says which)
                return _some_scenes(t, ds, flags, what, records)
            if not flags and "scene_index" in t.schema_arrow.names:  # (rows chosen with pandas: their scenes)
                return scene_indices(ds, catalog_rows(t, ds, what, records), f"{what} (its scene_index)")
            if not flags:  # (no scene_index either: above)
                raise UsageError(
                    f"{what}: a catalog says which scenes by one boolean column, or by its scene_index column "
                    "(its rows chosen with pandas); it has neither"
                )
            if len(flags) != 1:
                raise _many_flags(what, flags)
            rows = catalog_rows(t, ds, what, records)
            col = t.read(columns=flags).column(0)
        keep = np.asarray(col.fill_null(False).to_numpy(zero_copy_only=False), bool)
        return scene_indices(ds, rows[keep], f"{what} (column {flags[0]})")
    try:
        with _open_input(p, storage_options) as f:
            text = f.read().decode("utf-8-sig", "replace")  # (a leading byte order mark taken out)
    except FileNotFoundError:
        raise UsageError(f"{what}: no such file") from None
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            k = int(line)
        except ValueError:
            raise UsageError(f"{what}, line {i}: {line[:40]!r} is not a scene index") from None
        if not 0 <= k < n:
            raise UsageError(
                f"{what}, line {i}: scene index {k} is out of range (the dataset has {n:,} scenes: 0 to {n - 1})"
            )
        out.append(k)
    return scene_indices(ds, np.asarray(out, np.int64), what)


def _some_scenes(t: Any, ds: Any, flags: list[str], what: str, records: np.ndarray) -> np.ndarray:
    """The scenes of ``ds`` a catalog of some of them chooses (all its rows, or those its one
    boolean column flags): each row's ``stored_scene_index``, checked as a ``scene_index`` is
    (:func:`catalog_rows`: in range, once, and its host and times that scene's)."""
    names = t.schema_arrow.names
    if "stored_scene_index" not in names:
        raise UsageError(f"{what}: a catalog of some scenes needs its stored_scene_index column to say which")
    if len(flags) > 1:
        raise _many_flags(what, flags)
    own = [c for c in ("stored_scene_index", "host", "start_time", "end_time", "num_frames") if c in names]
    table = t.read(columns=own + flags)
    table = table.rename_columns(["scene_index" if c == "stored_scene_index" else c for c in table.column_names])
    rows = catalog_rows(table.select([c for c in table.column_names if c not in flags]), ds, what, records)
    if not flags:
        return scene_indices(ds, rows, f"{what} (its stored_scene_index)")
    keep = np.asarray(table.column(flags[0]).fill_null(False).to_numpy(zero_copy_only=False), bool)
    return scene_indices(ds, rows[keep], f"{what} (column {flags[0]})")


def catalog_rows(table: Any, ds: Any, what: str, records: np.ndarray | None = None) -> np.ndarray:
    """The index among ``ds``'s scenes of the scene of each row of a catalog (a pandas DataFrame,
    an Arrow table or a ``ParquetFile``): its ``scene_index``, checked, so that a catalog filtered
    or sorted (with pandas, DuckDB...) says its scenes, never others: each an integer in range and
    in one row only, and the row's own record of its scene (``host``, ``start_time``,
    ``end_time``, ``num_frames``: those it has) that of the scene it says in ``ds`` (``records``:
    its scene records, if read already). One line otherwise. A catalog with no ``scene_index`` but
    a row per scene is read in order, its rows' host and times checked to be the scenes' in that
    order (none of them: refused)."""
    names, _, _, rows = _schema(table)
    n = len(ds[fmt.SCENES])
    identity = [c for c in ("host", "start_time", "end_time", "num_frames") if c in names]
    if "scene_index" not in names:
        # (read in order only when the rows say, by their host and times, that they are the
        # scenes in order: sorted with pandas and the column dropped, they were taken by position)
        if rows != n or not identity:
            raise UsageError(
                f"{what} has {rows:,} rows and no scene_index column"
                + ("" if rows != n else ", nor the scenes' host and times")
                + f": its rows cannot be matched to the {n:,} scenes of {ds.url} (keep its scene_index column)"
            )
    own = [c for c in ("scene_index", *identity) if c in names]
    if not hasattr(table, "schema") and not hasattr(table, "schema_arrow"):  # (a DataFrame: those columns only)
        table = table[own]
    cols = catalog_columns(table, set(own))
    step = _time_steps(table)  # (a time written coarser than ns, by a tool that rewrote it: compared at its unit)
    if "scene_index" in names:
        values, cats = cols["scene_index"]
        if cats is not None or values.dtype.kind not in "iuf" or not np.all(np.isfinite(values) & (values % 1 == 0)):
            raise UsageError(f"{what}: its scene_index column is not scene indices (integers, none missing)")
        idx = values.astype(np.int64)
    else:
        idx = np.arange(n, dtype=np.int64)
    bad = np.flatnonzero((idx < 0) | (idx >= n))
    if len(bad):
        raise UsageError(
            f"{what}: row {bad[0]} has scene_index {idx[bad[0]]}, out of range ({ds.url} has {n:,} scenes: 0 to {n - 1})"
        )
    once, counts = np.unique(idx, return_counts=True)
    if len(once) < len(idx):
        k = int(np.argmax(counts > 1))
        raise UsageError(f"{what}: scene_index {once[k]} is in {counts[k]} rows; a catalog has one row a scene")
    rec = scene_records(ds) if records is None else records
    rec = rec[idx]
    iv = rec["frame_index_interval"].reshape(-1, 2)
    mine = {
        "host": rec["host"].astype(str).astype(object),
        "start_time": rec["start_time"].astype(np.int64) // step.get("start_time", 1) * step.get("start_time", 1),
        "end_time": rec["end_time"].astype(np.int64) // step.get("end_time", 1) * step.get("end_time", 1),
        "num_frames": (iv[:, 1] - iv[:, 0]).astype(np.int64),
    }
    for name in ("start_time", "end_time", "num_frames", "host"):
        if name not in cols:
            continue
        theirs, cats = cols[name]
        if cats is not None:  # (text: its codes back to its values, missing as None)
            theirs = np.array([*cats, None], object)[theirs]
        elif name in ("start_time", "end_time") and theirs.dtype.kind == "f":  # (a missing time: NaN)
            theirs = np.where(np.isfinite(theirs), theirs, -1).astype(np.int64)
        differ = np.flatnonzero(np.asarray(theirs != mine[name], bool))
        if len(differ):
            r = int(differ[0])
            raise UsageError(
                f"{what}: row {r} says it is scene {idx[r]} of {ds.url}, but its {name} is not that scene's "
                f"({theirs[r]} against {mine[name][r]}): "
                + (
                    "a catalog's rows are matched to the scenes by their scene_index, as l5dask catalog wrote it"
                    if "scene_index" in names
                    else "without a scene_index column its rows are read in order (sorted? keep its scene_index column)"
                )
            )
    return idx


def _time_steps(table: Any) -> dict[str, int]:
    """The nanoseconds of the unit of each timestamp column of a catalog (1 for ns)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if isinstance(table, pq.ParquetFile):
        schema = table.schema_arrow
    elif isinstance(table, pa.Table):
        schema = table.schema
    else:
        schema = pa.Schema.from_pandas(table, preserve_index=False)
    ns = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}
    return {f.name: ns[f.type.unit] for f in schema if pa.types.is_timestamp(f.type)}


def query_indices(
    ds: Any,
    expr: str,
    catalog: Any,
    storage_options: dict | None = None,
    cli: bool = False,
    key: str | None = None,
    say: Any = None,
    records: np.ndarray | None = None,
) -> np.ndarray:
    """The indices of ``ds``'s scenes where ``expr`` holds over the columns of ``catalog`` (a
    pandas DataFrame or an Arrow table, or a catalog Parquet of ``ds``); a catalog that holds a
    fingerprint is checked against ``ds``. Its rows are matched to the scenes by their
    ``scene_index`` (``catalog_rows``, checked): a catalog of some of the scenes (filtered
    with pandas, its fingerprint kept) chooses among those. Errors name ``--scenes`` and
    ``--catalog`` when ``cli``, else ``query`` and its ``catalog=``; ``key``: what the expression
    is said as instead (a job's key, ``scenes``). ``say`` (a function of one line) is told when the
    catalog holds some of the scenes only; ``records``: ``ds``'s scene records, if read already."""
    records = scene_records(ds) if records is None else records
    name = "--catalog" if cli else "the catalog"
    what = f"{key} {expr!r}" if key else f"--scenes {expr!r}" if cli else f"query({expr!r})"
    if isinstance(catalog, (str, os.PathLike)):
        with read_catalog(catalog, ds, storage_options, name, records) as t:
            return _chosen(ds, expr, t, f"{name} {os.fspath(catalog)}", what, say, records)
    if getattr(catalog, "attrs", None) and "l5dask" in catalog.attrs:  # (a DataFrame of l5dask.catalog)
        check_fingerprint(catalog.attrs["l5dask"], ds, "the catalog", records)
    elif CATALOG_KEY.encode() in (getattr(getattr(catalog, "schema", None), "metadata", None) or {}):
        check_fingerprint(json.loads(catalog.schema.metadata[CATALOG_KEY.encode()]), ds, "the catalog", records)
    return _chosen(ds, expr, catalog, name, what, say, records)


def _chosen(ds: Any, expr: str, catalog: Any, name: str, what: str, say: Any, records: np.ndarray) -> np.ndarray:
    """:func:`query_indices` once its catalog is checked: ``name`` says the catalog, ``what`` the expression."""
    try:
        keep = np.asarray(evaluate(expr, catalog), bool)
    except UsageError as exc:  # (said as the caller said the expression)
        raise UsageError(reworded(str(exc), expr, what)) from None
    rows = catalog_rows(catalog, ds, name, records)
    n = len(ds[fmt.SCENES])
    if len(rows) < n and say is not None:
        say(f"l5dask: {name} holds {len(rows):,} of the {n:,} scenes (a filtered catalog): {what} chooses among those")
    if len(rows) < n and not keep.any():  # (it chose among the catalog's scenes: said so, not "of n")
        raise NoScenesError(f"{what} selects no scene (of the {len(rows):,} in {name}; the dataset has {n:,})")
    return scene_indices(ds, rows[keep], what)
