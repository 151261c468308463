"""Reading part of a stored chunk held to reading it whole: what the fuzz targets and the property
tests of :func:`~l5dask.prediction.reading.read_chunk_rows` and of the compressed gather from the
blocks it reads (:class:`~l5dask.prediction.scenes.ViewChunk`) check (``tests/fuzz/targets.py``,
``tests/test_properties.py``)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from l5dask.core.codec import check_blosc
from l5dask.core.store import Store
from l5dask.errors import L5DaskError
from l5dask.prediction import format as fmt
from l5dask.prediction.kernels import Gather
from l5dask.prediction.reading import decode_chunk, read_chunk_rows


def _verdict(raw: bytes, meta: fmt.ArrayMeta, index: int, read: Callable[[Store], Any], what: str) -> tuple[Any, Any]:
    """``(read's answer, or None where it refused; the whole chunk decoded, or None)`` of ``raw``
    put in a store of its own as stored chunk ``index``: a refusal must be one line of l5dask's
    errors, and a chunk the one rule refuses whole must be refused."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, meta.key(index))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(raw)
        try:
            got = read(Store(tmp))
        except L5DaskError as exc:
            assert "\n" not in str(exc), f"a refusal of more than one line: {exc}"
            got = None
    try:
        whole = decode_chunk(raw, meta, True, str(index))
    except L5DaskError:
        whole = None
    why = check_blosc(raw, meta.chunk_nbytes, meta.typesize)
    assert why is None or got is None, f"{what} from a chunk the one rule refuses whole: {why}"
    return got, whole


def partial_verdict(
    raw: bytes, meta: fmt.ArrayMeta, index: int, ranges: Sequence[tuple[int, int]]
) -> tuple[list[np.ndarray] | None, np.ndarray | None]:
    """``(rows, whole)``: ``read_chunk_rows`` of ``ranges`` in stored chunk ``index`` (``raw``, put
    in a store of its own), or ``None`` where it refused; and the whole chunk decoded by the one
    rule and numcodecs (:func:`~l5dask.prediction.reading.decode_chunk`), or ``None`` where it is
    refused. Asserts that a refusal is one line of l5dask's errors; that a chunk the one rule
    refuses whole (its header, or its size: cut short) is refused; that the rows read are of the
    ranges' lengths and the array's dtype, and, where the whole chunk decodes, its rows bit for
    bit. (Where only numcodecs refuses the whole chunk, a block the rows are not in may be what
    it refuses: the rows read are those of the blocks that hold them, which decode.)"""
    got, whole = _verdict(raw, meta, index, lambda store: read_chunk_rows(store, meta, index, ranges), "rows read")
    if got is not None:
        start = meta.chunk_bounds(index)[0]
        assert len(got) == len(ranges), "not one answer a range"
        for (lo, hi), rows in zip(ranges, got):
            assert rows.dtype == meta.dtype and rows.shape == (hi - lo,), "rows of another dtype or length"
            if whole is not None:
                assert rows.tobytes() == whole[lo - start : hi - start].tobytes(), "rows other than the whole chunk's"
    return got, whole


def plan_for(dtype: np.dtype, distinct: str | None = None) -> Gather:
    """A gather of every number field of ``dtype`` (a field's first and last elements), the
    argmax of its float32 vectors, and the distinct values of ``distinct``."""
    elements, argmax = [], []
    for name in fmt.names_of(dtype):
        sub = fmt.fields_of(dtype)[name][0]
        if sub.base.kind not in "biuf":
            continue
        if sub.shape:
            elements += [(name, (0,) * len(sub.shape)), (name, tuple(k - 1 for k in sub.shape))]
            if sub.base == np.dtype("<f4") and len(sub.shape) == 1 and sub.shape[0] <= 127:
                argmax.append(name)
        else:
            elements.append((name, ()))
    return Gather(dtype, elements, argmax, distinct)


def partial_gather_verdict(
    raw: bytes, meta: fmt.ArrayMeta, index: int, ranges: Sequence[tuple[int, int]], plan: Gather
) -> tuple[tuple | None, np.ndarray | None]:
    """``(gathered, whole)``: the columns ``plan`` gathers (numbers, argmaxes and their maxima,
    distinct values and each row's code) from the blocks :func:`~l5dask.prediction.reading.read_chunk_part`
    reads of ``ranges`` in stored chunk ``index`` (``raw``), one range after the other, as a
    restricted dataset's pass gathers them (:class:`~l5dask.prediction.scenes.ViewChunk`), or
    ``None`` where refused; and the whole chunk decoded, or ``None``. Asserts as
    :func:`partial_verdict` does: a refusal in one line, a chunk the one rule refuses whole
    refused, and where the whole chunk decodes, the columns of its rows sliced, gathered from
    records (and the chunk's records too, bit for bit)."""
    from l5dask.prediction.reading import read_chunk_part
    from l5dask.prediction.scenes import ViewChunk, part_sources

    n = sum(hi - lo for lo, hi in ranges)
    found: list[np.ndarray] = []
    values: list[np.ndarray] = []
    codes: list[np.ndarray] = []

    def gather(store: Store) -> tuple:
        part = read_chunk_part(store, meta, index, ranges)
        entries, at = [], 0
        for (lo, hi), (src, row) in zip(ranges, part_sources(part, meta, index, ranges)):
            entries.append((src, row, hi - lo, at, 0))
            at += hi - lo
        chunk = ViewChunk(meta.dtype, n, entries, {})
        outs, maxes = chunk.gather(plan.elements, plan.argmax, plan.distinct, found, values, codes)
        return outs, maxes, values, found, codes, ViewChunk(meta.dtype, n, entries, {}).records()

    got, whole = _verdict(raw, meta, index, gather, "columns gathered")
    if got is not None and whole is not None:
        start = meta.chunk_bounds(index)[0]
        want = np.concatenate([whole[lo - start : hi - start] for lo, hi in ranges]) if ranges else whole[:0]
        outs, maxes, values, found, codes, records = got
        assert records.tobytes() == want.tobytes(), "records other than the whole chunk's"
        w_found: list[np.ndarray] = []
        w_outs, w_maxes = plan.outputs(n)
        w_values = plan.value_outputs(n)
        plan.records(want, w_outs, w_maxes, 0, w_found if plan.distinct else None, w_values)
        for a, b in zip([*outs, *maxes, *values], [*w_outs, *w_maxes, *w_values]):
            assert a.tobytes() == b.tobytes(), "columns other than those of the whole chunk's rows"
        if plan.distinct is not None:
            width = meta.dtype[plan.distinct].itemsize
            as_bytes = lambda a: np.ascontiguousarray(a).view(np.uint8).reshape(-1, width)  # noqa: E731
            seen = np.concatenate([as_bytes(v) for v in found]) if found else np.zeros((0, width), np.uint8)
            rows = as_bytes(want[plan.distinct])
            assert len(codes) == 1 and len(codes[0]) == n
            assert np.array_equal(seen[codes[0]], rows), "a row's code is not its value"
            assert {bytes(r) for r in seen} == {bytes(r) for r in rows}, "distinct values other than the rows'"
    return got, whole


def _same_part(a: Any, b: Any) -> bool:
    """Two outcomes of reading part of a chunk (a ``ChunkPart``, or a refusal's line) alike."""
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    rows = lambda p: None if p.rows is None else [r.tobytes() for r in p.rows]  # noqa: E731
    return (None if a.raw is None else bytes(a.raw)) == (None if b.raw is None else bytes(b.raw)) and (
        a.nbytes,
        a.at,
        rows(a),
    ) == (b.nbytes, b.at, rows(b))


def compiled_read_verdict(
    raw: bytes, meta: fmt.ArrayMeta, index: int, ranges: Sequence[tuple[int, int]], direct: bool, cold: bool
) -> tuple[Any, str]:
    """``(outcome, how)``: a local chunk read in part (``read_chunk_part``) with its reads made at
    once by the compiled reader (``l5dask.core._pread.read_part``: open, header, the blocks it
    plans from the header, the last byte, close), held to the same reads made by the Python path
    one at a time (``reading._read_part`` through a plain ``diskread.File``). ``raw`` is put in a
    store of its own as stored chunk ``index``, read around the page cache when not in it
    (``direct``), out of the page cache first (``cold``). Asserts: the same outcome (the same
    ``ChunkPart``, or the same one-line refusal); every piece the compiled reader kept is the file's
    bytes at its place, the header first; and where the chunk is sound and its block starts come
    with the header (stored without compression, or 64 blocks at most), its pieces are exactly
    the Python path's reads (no read more, no byte more) and the file is opened once. ``outcome``:
    the ``ChunkPart`` or the refusal; ``how``: what the compiled reader did (for the tests' events)."""
    import struct

    import dask

    from l5dask.core import diskread
    from l5dask.core.codec import MAX_OVERHEAD
    from l5dask.core.lazy import compiled
    from l5dask.core.store import LocalFile
    from l5dask.prediction import reading

    compiled("l5dask.core._pread")  # (built: the compiled reader is what is tested)
    key, what = meta.key(index), f"array {meta.name!r}, chunk {str(index)!r}"
    start, item = meta.chunk_bounds(index)[0], meta.dtype.itemsize
    cuts = np.array([((lo - start) * item, (hi - start) * item) for lo, hi in ranges], np.int64).ravel()
    with tempfile.TemporaryDirectory() as tmp, dask.config.set({"l5dask.direct-reads": direct}):
        path = os.path.join(tmp, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())  # (clean pages: evicted when asked)
        store = Store(tmp)
        assert diskread.wanted(store.large) == direct

        def evict() -> None:
            if cold:
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)

        reads: list[tuple[int, int]] = []
        opened = [0]
        real_read, real_open = diskread.File.read, diskread.File._open

        def read(self, a=None, b=None):
            reads.append(diskread.span(a, b, self.size))
            return real_read(self, a, b)

        def reopen(self, random):
            opened[0] += 1
            return real_open(self, random)

        def outcome(part: bool) -> Any:
            reads.clear()
            opened[0] = 0
            evict()
            diskread.File.read, diskread.File._open = read, reopen  # type: ignore[method-assign]
            try:
                if part:
                    return reading.read_chunk_part(store, meta, index, ranges)
                with LocalFile(store, key, what, diskread.File(path, direct)) as file:
                    return reading._read_part(store, meta, index, ranges, key, what, file)
            except L5DaskError as exc:
                assert "\n" not in str(exc), f"a refusal of more than one line: {exc}"
                return str(exc)
            finally:
                diskread.File.read, diskread.File._open = real_read, real_open  # type: ignore[method-assign]

        python = outcome(False)
        python_reads = list(reads)
        together = outcome(True)
        assert _same_part(python, together), f"the compiled reader's outcome {together!r}, Python's {python!r}"
        reopened = opened[0]
        evict()
        with diskread.File(path, direct, part=(cuts, meta.chunk_nbytes, reading._HEAD_BYTES)) as file:
            pieces = list(file.pieces)
    head = raw[: reading._HEAD_BYTES]
    for at, data in pieces:
        assert data == raw[at : at + len(data)], f"a piece at {at} that is not the file's bytes there"
    planned = bool(ranges) and not diskread._REFUSED and (not direct or bool(diskread._CACHESTAT))
    if not planned:
        return together, "not planned here"
    assert pieces and pieces[0] == (0, head), "the header not read first"
    sound = check_blosc(raw, meta.chunk_nbytes, meta.typesize) is None
    if sound:
        flags, nbytes, blocksize = raw[2], *struct.unpack_from("<ii", raw, 4)
        if not flags & 0x02 and MAX_OVERHEAD + 4 * -(-nbytes // blocksize) > len(head):
            assert len(pieces) == 1 and reopened == 1, "more than 64 blocks: the header read, the rest as before"
            return together, "the header alone (more than 64 blocks)"
        assert [(at, at + len(data)) for at, data in pieces] == python_reads, (pieces, python_reads)
        assert reopened == 0, "a read the compiled reader did not make"
        return together, f"{len(pieces)} reads at once, as Python's"
    return together, f"damaged: {len(pieces)} pieces, {reopened} opened again"
