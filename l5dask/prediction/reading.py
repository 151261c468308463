"""Reading L5Kit datasets lazily: one dask task reads and decodes one stored chunk.

The graph of an array is a single layer, one task per stored chunk (or per group of
``chunks_per_task`` consecutive stored chunks). A task returns a structured numpy
array holding only the requested fields, so all fields (and all xarray variables) of
one array share a single decode per chunk in a computation.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from dask.base import tokenize

from l5dask.core import diskread
from l5dask.core.codec import MAX_OVERHEAD, check_blosc, decode_blosc
from l5dask.core.store import LocalFile, Store, open_store
from l5dask.errors import ChunkError, FormatError, StoreError, UsageError
from l5dask.prediction import format as fmt
from l5dask.prediction.kernels import Gather

if TYPE_CHECKING:
    import dask.array as da


def sorted_unique(a: np.ndarray) -> np.ndarray:
    """``np.unique(a)`` of a 1-d array of numbers (no NaN), without ``np.unique``'s import of
    ``numpy.ma`` (8 ms of a filtered command's start)."""
    a = np.sort(a)
    return a[np.concatenate(([True], a[1:] != a[:-1]))] if len(a) else a


def project(records: np.ndarray, fields: Sequence[str] | None) -> np.ndarray:
    """A packed copy of ``records`` with only ``fields`` (all of them when ``None``)."""
    if fields is None or tuple(fields) == fmt.names_of(records.dtype):
        return records
    out = np.empty(records.shape, dtype=np.dtype([(f, fmt.fields_of(records.dtype)[f][0]) for f in fields]))
    for f in fields:
        out[f] = records[f]
    return out


def check_chunk(raw, meta: fmt.ArrayMeta, compressed: bool, key: str) -> None:
    """The one rule every path applies to a stored chunk before decoding it or sizing anything by
    it (:mod:`l5dask.core.codec`): its header agrees with the array's metadata. ``ChunkError`` naming
    the array, the chunk and what is wrong otherwise."""
    if compressed:
        why = check_blosc(
            raw if isinstance(raw, (bytes, bytearray)) else memoryview(raw).cast("B"), meta.chunk_nbytes, meta.typesize
        )
    else:
        why = None if len(raw) == meta.chunk_nbytes else f"holds {len(raw)} bytes, expected {meta.chunk_nbytes}"
    if why is not None:
        raise ChunkError(chunk_fault(meta, key, why))


def decode_chunk(
    raw: bytes, meta: fmt.ArrayMeta, compressed: bool, key: str, out: np.ndarray | None = None
) -> np.ndarray:
    """Decode the bytes of one stored chunk into ``meta.chunk_rows`` records (into ``out`` if
    given: all of its rows are written, or ``ChunkError``); the chunk is checked
    (``check_chunk``) before anything is allocated for it."""
    if out is None or not compressed:
        check_chunk(raw, meta, compressed, key)  # (compressed, into ``out``: decode_blosc checks it)
    if out is None:
        out = np.empty(meta.chunk_rows, dtype=meta.dtype)
    if out.nbytes != meta.chunk_nbytes or not out.flags.c_contiguous:
        raise ValueError(f"decode_chunk: a contiguous buffer of {meta.chunk_rows} records is needed")
    if compressed:
        try:
            decode_blosc(raw, out, meta.typesize)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise ChunkError(chunk_fault(meta, key, str(exc))) from None
    else:
        out.view(np.uint8)[:] = np.frombuffer(raw, dtype=np.uint8)
    return out


#: A blosc chunk's header and block starts read at first by :func:`read_chunk_rows` (enough for 64
#: blocks: an L5Kit chunk has 10 to 18, of about 128 KB decoded each).
_HEAD_BYTES = MAX_OVERHEAD + 4 * 64
#: What :func:`read_chunk_rows` learned of each array's stored chunks in this process, from the last
#: header it read: ``(store url, array, decoded bytes, typesize) -> (blosc block size, stored bytes
#: per decoded byte)``. On an object store it places the blocks of the next chunk read in part.
_LAYOUTS: dict[tuple, tuple[int, float]] = {}
#: A guessed range of blocks that starts this close to the header is read with it, in one GET ...
_JOIN_BELOW = 64 * 1024
#: ... and each is widened by this many blocks' stored bytes on each side (the chunks of an array
#: compress alike, not the same). Through ``benchmarks/partial_reads.py`` (agents chunks of 2.3 MB,
#: 18 blocks, 50 ms latency): 64 KB and 0.5 missed no block in 79 reads and read 1.27x the bytes of
#: header-then-blocks; 256 KB and 1 block 1.70x (fewer GETs: 0.53x against 0.77x); 0.25 blocks
#: missed 8 of 79 (each one more round trip).
_MARGIN_BLOCKS = 0.5


def _guessed_range(layout: tuple[int, float], nbytes: int, first: int, last: int) -> tuple[int, int]:
    """The stored bytes that should hold decoded bytes ``[first, last)`` of a chunk whose blocks are
    ``layout`` (the block size, stored bytes per decoded byte): the blocks holding them, placed as
    if each compressed alike, :data:`_MARGIN_BLOCKS` blocks' stored bytes more on each side (and
    4 KB)."""
    bs, ratio = layout
    top = MAX_OVERHEAD + 4 * -(-nbytes // bs)
    b0, b1 = first // bs, -(-last // bs)
    a = top + ratio * (b0 - _MARGIN_BLOCKS) * bs - 4096
    b = top + ratio * (b1 + _MARGIN_BLOCKS) * bs + 4096
    return max(0, int(a)), int(b) + 1


class ChunkPart(NamedTuple):
    """What :func:`read_chunk_part` read of a stored chunk for some ranges of its rows: a blosc
    chunk (``raw``, of ``nbytes`` decoded bytes: the blocks that hold the rows, or the whole
    chunk) and where each range's first row is among its decoded bytes (``at``); or, for a chunk
    stored without compression, the rows themselves (``rows``, ``raw`` ``None``)."""

    raw: bytes | bytearray | None
    nbytes: int
    at: list[int]
    rows: list[np.ndarray] | None = None

    def decode(self, meta: fmt.ArrayMeta, index: int, ranges: Sequence[tuple[int, int]]) -> list[np.ndarray]:
        """The rows of each range: ``raw`` decoded by numcodecs once it passes the one rule
        (:func:`~l5dask.core.codec.check_blosc`); ``ChunkError`` naming the chunk otherwise."""
        if self.rows is not None:
            return self.rows
        out = np.empty(self.nbytes, np.uint8)
        try:
            decode_blosc(self.raw, out, meta.typesize)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise ChunkError(chunk_fault(meta, str(index), str(exc))) from None
        item = meta.dtype.itemsize
        return [out[a : a + (hi - lo) * item].view(meta.dtype) for a, (lo, hi) in zip(self.at, ranges)]


def read_chunk_rows(
    store: Store, meta: fmt.ArrayMeta, index: int, ranges: Sequence[tuple[int, int]]
) -> list[np.ndarray]:
    """The rows ``[lo, hi)`` of each of ``ranges`` (sorted, within stored chunk ``index``; row
    numbers of the array), reading only the blosc blocks that hold them
    (:func:`read_chunk_part`), decoded by numcodecs."""
    return read_chunk_part(store, meta, index, ranges).decode(meta, index, ranges)


def read_chunk_part(store: Store, meta: fmt.ArrayMeta, index: int, ranges: Sequence[tuple[int, int]]) -> ChunkPart:
    """The blosc blocks that hold the rows ``[lo, hi)`` of each of ``ranges`` (sorted, within
    stored chunk ``index``; row numbers of the array), read alone: the chunk's header and block
    starts, then the bytes of those blocks (a ranged read per run of them). The blocks are made
    into a blosc chunk of their own (the header's sizes and the block starts rebased, the blocks'
    bytes as stored), which passes the one rule (:func:`~l5dask.core.codec.check_blosc`) and is
    decoded by numcodecs (:meth:`ChunkPart.decode`), or gathered from by the compressed gather,
    as any chunk. A chunk stored without compression (blosc's memcpyed flag) is read at those
    rows' bytes. The chunk's last byte is read too, at once with
    the blocks: a chunk cut short is refused, as reading it whole refuses it, even where the rows'
    blocks are before the cut (on an object store, not where the guessed GETs brought every block:
    a GET for it alone would be one more round trip).

    On an object store, a GET is a round trip: once a chunk of the array was read here, the
    blocks' bytes are guessed from its layout (:data:`_LAYOUTS`) and asked for with the header, in
    one GET when they start near it, else in two at once; a guess that misses some bytes is
    completed by a GET of those. (Before: the header, then the blocks, two round trips a chunk;
    ``benchmarks/partial_reads.py`` measures both.)

    On a local disk, the file is opened once for all its reads (:meth:`~l5dask.core.store.Store.open_file`:
    no read ahead of them either), and the blocks' starts are worked with as Python's ints (a
    chunk has 10 to 18 blocks): 47 us of CPU a chunk read in part in the page cache (121 M agents,
    5% of the scenes spread), against 89 us through a read of the store each and numpy's small
    arrays. Its reads are made at once as it is opened, by one compiled call that plans the blocks
    from the header as this function does (``l5dask.core._pread.read_part``, the GIL let go once:
    open, header, blocks, last byte, close); this function then takes them from it and checks,
    refuses and rebuilds as it would have (``tests/test_properties.py`` holds the two to the same
    reads and the same outcome)."""
    key = meta.key(index)
    what = f"array {meta.name!r}, chunk {str(index)!r}"
    if store.local:
        start, item = index * meta.chunk_rows, meta.dtype.itemsize
        cuts = np.array([((lo - start) * item, (hi - start) * item) for lo, hi in ranges], np.int64).ravel()
        with store.open_file(key, what=what, part=(cuts, meta.chunk_nbytes, _HEAD_BYTES)) as file:
            return _read_part(store, meta, index, ranges, key, what, file)
    return _read_part(store, meta, index, ranges, key, what, None)


def _read_part(
    store: Store,
    meta: fmt.ArrayMeta,
    index: int,
    ranges: Sequence[tuple[int, int]],
    key: str,
    what: str,
    file: LocalFile | None,
) -> ChunkPart:
    """:func:`read_chunk_part`, its local reads through ``file`` (``None``: the store's)."""
    import struct

    start = index * meta.chunk_rows
    item, ts, nbytes = meta.dtype.itemsize, meta.typesize, meta.chunk_nbytes
    learned = (store.url, meta.name, nbytes, ts)
    layout = _LAYOUTS.get(learned) if store.remote else None
    known: list[tuple[int, memoryview]] = []  # (bytes read so far: where each piece starts, its bytes)
    if file is not None:
        head = file.read(0, _HEAD_BYTES)
    elif layout is None:
        head = store.get(key, what=what, start=0, end=_HEAD_BYTES)
    else:
        top = max(_HEAD_BYTES, MAX_OVERHEAD + 4 * -(-nbytes // layout[0]))
        guesses: list[list[int]] = []  # (a guessed range a run of rows, those that touch merged)
        for lo, hi in ranges:
            a, b = _guessed_range(layout, nbytes, (lo - start) * item, (hi - start) * item)
            if guesses and a <= guesses[-1][1]:
                guesses[-1][1] = max(guesses[-1][1], b)
            else:
                guesses.append([a, b])
        first = (0, top)
        if guesses[0][0] <= top + _JOIN_BELOW:  # (the header and the first blocks after it: one GET)
            first = (0, max(top, guesses.pop(0)[1]))
        got = store.iter_ranges(
            [(key, *first), *((key, a, b) for a, b in guesses)], {key: what}, depth=1 + len(guesses)
        )  # (all asked for at once)
        head = next(got)
        known.append((0, memoryview(head)))
        for a, _ in guesses:
            try:
                known.append((a, memoryview(next(got))))
            except StoreError:  # (a guess that starts past the chunk's end: its blocks are read below)
                break

    def have(a: int, b: int) -> Any:
        """Bytes ``[a, b)`` of the chunk if read already, else ``None``."""
        for at, piece in known:
            if at <= a and b <= at + len(piece):
                return piece[a - at : b - at]
        return None

    def read(spans: list[tuple[int, int]], cbytes: int) -> list:
        """Bytes of each span: from what was read, the others in GETs at once; and last, the
        chunk's last byte by its header's size ``cbytes`` (empty if it lacks it), read with them
        (on an object store where all came with the guessed GETs: no GET for it alone, ``b"?"``)."""
        got = [have(a, b) for a, b in spans]
        end = have(cbytes - 1, cbytes)
        if end is None and store.remote and all(g is not None for g in got):
            end = b"?"
        spans, got = [*spans, (cbytes - 1, cbytes)], [*got, end]
        need = [i for i, g in enumerate(got) if g is None]
        if file is not None:
            for first, last, data in _coalesced(file, [spans[i] for i in need]):
                a = spans[need[first]][0]
                for i in need[first : last + 1]:
                    x, y = spans[i]
                    got[i] = data if (x, y) == (a, a + len(data)) else data[x - a : y - a]
            return got
        for i, data in zip(need, store.iter_ranges([(key, *spans[i]) for i in need], {key: what})):
            got[i] = data
        return got

    why = check_blosc(head, nbytes, ts, header_only=True)
    if why is not None:
        raise ChunkError(chunk_fault(meta, str(index), why))
    flags, blocksize, cbytes = head[2], *struct.unpack_from("<ii", head, 8)
    if flags & 0x02:  # (memcpyed: the decoded bytes follow the header)
        if store.remote:  # (placed as blocks of 64 KB stored as they are)
            _LAYOUTS[learned] = (min(nbytes, 1 << 16), 1.0)
        cuts = [(MAX_OVERHEAD + (lo - start) * item, MAX_OVERHEAD + (hi - start) * item) for lo, hi in ranges]
        got = read(cuts, cbytes)
        _check_end(meta, index, cbytes, got.pop())
        found: list[np.ndarray] = []
        for (a, b), raw in zip(cuts, got):
            if len(raw) != b - a:
                raise ChunkError(chunk_fault(meta, str(index), f"holds {a + len(raw)} bytes, too few"))
            found.append(np.frombuffer(raw, meta.dtype).copy())
        return ChunkPart(None, 0, [], found)
    if store.remote and 0 < blocksize <= nbytes and cbytes > 0:
        _LAYOUTS[learned] = (blocksize, cbytes / nbytes)
    nblocks = -(-nbytes // blocksize)
    if len(head) < MAX_OVERHEAD + 4 * nblocks:
        head = (
            file.read(0, MAX_OVERHEAD + 4 * nblocks)
            if file is not None
            else store.get(key, what=what, start=0, end=MAX_OVERHEAD + 4 * nblocks)
        )
    if len(head) < MAX_OVERHEAD + 4 * nblocks:
        raise ChunkError(chunk_fault(meta, str(index), f"{len(head)} bytes, too few for its {nblocks} block starts"))
    starts = struct.unpack_from(f"<{nblocks}i", head, MAX_OVERHEAD)
    if min(starts) < MAX_OVERHEAD + 4 * nblocks or max(starts) >= cbytes:
        raise ChunkError(chunk_fault(meta, str(index), "a block starts outside its bytes"))
    # the blocks wanted, in order; each ends where the next stored one starts (any order)
    wanted = sorted(
        {
            b
            for lo, hi in ranges
            for b in range(((lo - start) * item) // blocksize, ((hi - start) * item - 1) // blocksize + 1)
        }
    )
    if wanted[-1] == nblocks - 1 and nbytes % blocksize and len(wanted) == 1:
        # (the last, short block alone: blosc splits it otherwise than a whole one)
        raw = have(0, cbytes)
        if raw is not None:
            raw = bytes(raw)
        else:
            raw = file.read() if file is not None else store.get(key, what=what)
        return ChunkPart(raw, nbytes, [(lo - start) * item for lo, _ in ranges])
    ordered = sorted({*starts, cbytes})
    firsts = [starts[w] for w in wanted]
    ends = [ordered[bisect.bisect_right(ordered, a)] for a in firsts]
    # the byte ranges to read: the wanted blocks' bytes, those that touch merged
    spans: list[list[int]] = []
    for a, b in sorted(zip(firsts, ends)):
        if spans and a <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], b)
        else:
            spans.append([a, b])
    pieces = read([(a, b) for a, b in spans], cbytes)
    _check_end(meta, index, cbytes, pieces.pop())
    n = len(wanted)
    top = MAX_OVERHEAD + 4 * n
    at, pos = [], top  # where each span's bytes go in the new chunk
    for (a, b), data in zip(spans, pieces):
        if len(data) != b - a:
            raise ChunkError(chunk_fault(meta, str(index), f"holds {a + len(data)} bytes, its header says {cbytes}"))
        at.append(pos)
        pos += b - a
    size = n * blocksize - (blocksize - nbytes % blocksize if wanted[-1] == nblocks - 1 and nbytes % blocksize else 0)
    chunk = bytearray(pos)
    chunk[:4] = head[:4]
    struct.pack_into("<iii", chunk, 4, size, blocksize, pos)
    span_starts = [a for a, _ in spans]
    moved = []  # (each wanted block's start in the new chunk: in its span, from where the span goes)
    for a in firsts:
        k = bisect.bisect_right(span_starts, a) - 1
        moved.append(a - span_starts[k] + at[k])
    struct.pack_into(f"<{n}i", chunk, MAX_OVERHEAD, *moved)
    for (a, b), data, p in zip(spans, pieces, at):
        chunk[p : p + b - a] = data
    offsets = []
    for lo, _ in ranges:
        b_lo = (lo - start) * item
        offsets.append(bisect.bisect_left(wanted, b_lo // blocksize) * blocksize + b_lo % blocksize)
    return ChunkPart(chunk, size, offsets)


def _coalesced(file: LocalFile, spans: list[tuple[int, int]]) -> Iterator[tuple[int, int, bytes]]:
    """Reads of a local file for ``spans`` (sorted by their starts): those less than 4 KB apart
    (``diskread.ALIGN``, at most a page) in one read, ``(first, last, bytes)`` of each (spans
    ``first .. last``, the bytes from the first's start to the last's end). A disk reads whole
    4 KB pieces (``O_DIRECT``'s, the page cache's pages): two reads less than 4 KB apart read no
    piece fewer than one read of both (often one piece twice), and each is one more wait on it. A chunk read in part from the disk was three reads (its header, its blocks,
    its last byte), the last two often less than 4 KB apart: at 1 G agents, 5% of the scenes spread
    (``l5dask stats --scenes``, cold), 32,593 reads against 36,426, 2.139 GB from the disk against
    2.154."""
    i = 0
    while i < len(spans):
        j, (a, b) = i, spans[i]
        while j + 1 < len(spans) and spans[j + 1][0] - b < diskread.ALIGN:
            j += 1
            b = max(b, spans[j][1])
        yield i, j, file.read(a, b)
        i = j + 1


def _check_end(meta: fmt.ArrayMeta, index: int, cbytes: int, last: Any) -> None:
    """``last``, what was read of a chunk's last byte by its header's size: refused if missing."""
    if len(last) != 1:
        raise ChunkError(chunk_fault(meta, str(index), f"holds fewer bytes than the {cbytes} its header says"))


def chunk_fault(meta: fmt.ArrayMeta, key: str, why: str) -> str:
    """The one line that says what is wrong with stored chunk ``key`` (its index) of an array."""
    return f"array {meta.name!r}, chunk {key!r}: truncated or corrupt chunk ({why})"


def header_faults(store: Store, meta: fmt.ArrayMeta, compressed: bool) -> tuple[list[str], list[int]]:
    """Every stored chunk of an array checked against its ``.zarray`` without decoding it: stored,
    and its size and blosc header what the metadata says (:mod:`l5dask.core.codec`): one listing
    of the array's folder and a 16-byte read a chunk, ``l5dask.requests-in-flight`` at a time.
    Returns the faults (a line each) and the chunks found sound."""
    keys = [meta.key(i) for i in range(meta.nchunks)]
    sizes = store.sizes(meta.name) if meta.nchunks else {}
    faults: list[tuple[int, str]] = []
    present = []
    for i, key in enumerate(keys):
        if key.rsplit("/", 1)[-1] in sizes:
            present.append(i)
        else:
            faults.append((i, f"array {meta.name!r}, chunk {str(i)!r}: object {key!r} is missing"))
    size_of = {i: sizes[keys[i].rsplit("/", 1)[-1]] for i in present}
    read = [i for i in present if size_of[i]] if compressed else []  # (S3 answers a range of nothing 416)
    heads = store.iter_ranges(
        [(keys[i], 0, min(MAX_OVERHEAD, size_of[i])) for i in read],
        {keys[i]: f"array {meta.name!r}, chunk {str(i)!r}" for i in read},
    )
    sound = []
    for i in present:
        size = size_of[i]
        if compressed:
            why = check_blosc(
                next(heads) if size else b"", meta.chunk_nbytes, meta.typesize, header_only=True, stored=size
            )
        else:
            why = None if size == meta.chunk_nbytes else f"holds {size} bytes, expected {meta.chunk_nbytes}"
        if why is None:
            sound.append(i)
        else:
            faults.append((i, chunk_fault(meta, str(i), why)))
    return [line for _, line in sorted(faults)], sound


def decode_faults(store: Store, meta: fmt.ArrayMeta, compressed: bool, indices: Sequence[int]) -> list[str]:
    """Each of the chunks ``indices`` read and decoded whole (a task's share of ``validate
    --full``): a line for each one a reader refuses."""
    faults = []
    scratch = np.empty(meta.chunk_rows, dtype=meta.dtype)
    keys = [meta.key(i) for i in indices]
    raws = store.iter_many(keys, {k: f"array {meta.name!r}, chunk {str(i)!r}" for k, i in zip(keys, indices)})
    for i, raw in zip(indices, raws):
        try:
            decode_chunk(raw, meta, compressed, str(i), scratch)
        except ChunkError as exc:
            faults.append(str(exc))
    return faults


class Arriving(Sequence):
    """``(index, stored bytes)`` of a block's chunks, in order, each there when it has come: what
    :func:`fetch_chunks` asked for, taken as its reader gets to it. A fused pass's first gather
    goes through its block's chunks in order (:meth:`Encoded.gather`), so it works on the first
    chunks while the later ones are read, where it waited for the whole block: the run of five
    analyses on 1 G agents, cold, kept its two cores busy while the disk read (see docs/scale.md).
    The chunks' numbers (``indices``) are known at once; a read that failed raises where its
    chunk is taken. Threads may take from one at once (a view's block, read by the tasks of
    several of its variables); it travels (pickled) as the list of its chunks, all taken."""

    __slots__ = ("indices", "_raws", "_got", "_lock")

    def __init__(self, indices: Sequence[int], raws: Iterator[bytes]) -> None:
        self.indices = list(indices)
        self._raws = iter(raws)
        self._got: list[tuple[int, bytes]] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.indices)

    def __reduce__(self) -> tuple:
        return (list, (list(self),))

    def _upto(self, n: int) -> None:
        if len(self._got) >= n:
            return
        with self._lock:
            while len(self._got) < n:
                self._got.append((self.indices[len(self._got)], next(self._raws)))

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            lo, hi, step = k.indices(len(self))
            self._upto(max(lo, hi) if step > 0 else lo + 1)
            return self._got[k]
        k = range(len(self))[k]  # (an IndexError past the end, as a list's)
        self._upto(k + 1)
        return self._got[k]

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        for k in range(len(self)):
            self._upto(k + 1)
            yield self._got[k]


def fetch_chunks(store: Store, meta: fmt.ArrayMeta, first_chunk: int, nchunks: int) -> Arriving:
    """The stored bytes of ``nchunks`` chunks from ``first_chunk`` on, all asked for at once
    (as ``get_many``), each taken as it comes (:class:`Arriving`)."""
    indices = range(first_chunk, first_chunk + nchunks)
    keys = [meta.key(index) for index in indices]
    what = {k: f"array {meta.name!r}, chunk {str(i)!r}" for k, i in zip(keys, indices)}
    raws = store.iter_many(keys, what, depth=len(keys))
    hint_next(store, meta, first_chunk, nchunks)  # (after: its own reads go first)
    return Arriving(indices, raws)


def touch(url: str, storage_options: dict | None = None) -> None:
    """A worker's first read of a dataset, ahead of its tasks (``l5dask.core.cluster.warm_workers``):
    this module's imports (the kernels the tasks run), the store's filesystem and a first request
    (``.zgroup``)."""
    open_store(url, storage_options)


def hint_next(store: Store, meta: fmt.ArrayMeta, first_chunk: int, nchunks: int) -> None:
    """Tell a local disk that the chunks of the tasks next to this one (chunks ``first_chunk ..
    first_chunk + nchunks - 1``) are read soon: cold, a task then finds its first chunks read.
    Both sides: dask's order runs a pass's tasks from the last chunks to the first (the report's
    agent tasks, on local threads), or the other way; the store skips what was read already."""
    if store.local:
        before = range(max(0, first_chunk - nchunks), first_chunk)
        after = range(first_chunk + nchunks, min(first_chunk + 2 * nchunks, meta.nchunks))
        store.will_need([meta.key(i) for i in [*before, *after]])


def iter_chunks(
    store: Store,
    meta: fmt.ArrayMeta,
    compressed: bool,
    first_chunk: int,
    nchunks: int,
    scratch: np.ndarray | None = None,
):
    """Yield ``(start row, records)`` for ``nchunks`` stored chunks from ``first_chunk`` on.

    The objects are fetched ahead (concurrently on object stores, while the earlier ones are
    decoded: :meth:`Store.iter_many`); each chunk is decoded once into ``scratch`` (one chunk of
    records, reused: valid until the next chunk).
    """
    for index, raw in iter_stored(store, meta, first_chunk, nchunks):
        start, stop = meta.chunk_bounds(index)
        scratch = decode_chunk(raw, meta, compressed, str(index), out=scratch)
        yield start, scratch[: stop - start]


def iter_stored(store: Store, meta: fmt.ArrayMeta, first_chunk: int, nchunks: int):
    """Yield ``(index, stored bytes)`` of ``nchunks`` chunks from ``first_chunk`` on, the later
    ones fetched while the caller works on the earlier (:meth:`Store.iter_many`), the chunks next
    to them hinted (:func:`hint_next`: the next tasks' chunks when every chunk is read; a dataset
    restricted to some scenes reads its chunks otherwise, with no hint of their neighbours:
    ``SceneView``)."""
    indices = range(first_chunk, first_chunk + nchunks)
    keys = [meta.key(index) for index in indices]
    raws = store.iter_many(keys, what={k: f"array {meta.name!r}, chunk {str(i)!r}" for k, i in zip(keys, indices)})
    hint_next(store, meta, first_chunk, nchunks)  # (after: its own reads go first)
    yield from zip(indices, raws)


#: Rows of stored chunks a streaming pass hands its chunk function at a time (whole chunks, at
#: least one: ``piece_chunks``; :meth:`L5Array.iter_encoded`): what a call costs besides its
#: compiled loops (the gather's plan and outputs, the partial and its combine: about 45 us for a
#: report's chunk of 20,000 agents, 0.4 ms in all) is paid once for them, and the two threads wait
#: less for each other's Python. The report on 30 M agents, as a whole process: 1.33x the
#: read-and-decode floor with two chunks of 20,000 agents a call, 1.37x with 4 or 1 (medians of 21
#: interleaved rounds, 2026-11-26; within one process, 0.474 s with 2 and 0.497 s with 1). More
#: rows' columns no longer stay in a core's cache. Counted in rows, not chunks: the faces' chunks
#: of 10,000 rows (and L5Kit's) came two at a time, 270 calls of each of the report's and the
#: catalog's faces on 30 M agents where 135 do.
PIECE_ROWS = 40_000


def piece_chunks(meta: fmt.ArrayMeta) -> int:
    """Stored chunks of ``meta``'s array a streaming pass takes at a time (``PIECE_ROWS``)."""
    return max(1, PIECE_ROWS // max(1, meta.chunk_rows))


class Encoded:
    """Stored chunks (``first`` to ``first + n - 1``) of one array, fetched but not decoded: what a pass
    with ``encoded=True`` hands its chunk function (:class:`l5dask.core.engine.Pass`).

    ``records()`` decodes them (once, as ``read_block``); ``gather`` makes number columns and
    label argmaxes straight from the compressed bytes, one compiled pass per chunk that never
    makes the records (``l5dask/_blosc.h``; 1.2-1.4x faster than decoding and gathering on one
    thread, ``benchmarks/compressed_gather.py``, and the block's records are never held). A chunk
    the compiled reader does not take (another codec, a corrupt chunk) is decoded by numcodecs,
    which says what is wrong with it.
    """

    def __init__(self, meta: fmt.ArrayMeta, compressed: bool, chunks: Sequence[tuple[int, bytes]]) -> None:
        self.meta, self.compressed, self.chunks = meta, compressed, chunks
        # (the chunks' numbers, known before their bytes come: ``Arriving``)
        self.indices = chunks.indices if isinstance(chunks, Arriving) else [i for i, _ in chunks]
        self.start = meta.chunk_bounds(self.indices[0])[0] if self.indices else 0
        self.stop = meta.chunk_bounds(self.indices[-1])[1] if self.indices else 0
        self._records: np.ndarray | None = None
        # what the readers of a fused pass will gather (expect), what was gathered for them, and
        # the block a piece belongs to (its gathers are the block's, sliced)
        self._expected: dict[tuple, None] = {}
        self._shared: dict[tuple, np.ndarray] = {}
        self._base: tuple[Encoded, int] | None = None
        # a piece of a fused pass's block (pieces()) keeps its gathers of distinct values for the
        # next reader that asks the same (the report's and the catalog's faces: their ids, codes
        # and statuses, from one pass over the bytes)
        self._distinct: dict[tuple, tuple] | None = None
        # per-row columns one member of a fused pass makes anyway and others would make again
        # (the report's speeds and distances to the ego): the block's, filled by its pieces
        self._derived: dict[str, np.ndarray] = {}
        self._filled: dict[str, int] = {}
        # results of rows one member of a fused pass makes anyway and leaves for the others (the
        # catalog's distinct tracks of each scene's run, which the report counts): by (name, rows)
        self._left: dict[tuple[str, int, int], Any] = {}

    def __len__(self) -> int:
        return self.stop - self.start

    def pieces(self) -> list[tuple[int, Encoded]]:
        """``(start row, Encoded)`` of these chunks in the groups :meth:`L5Array.iter_encoded`
        hands a streaming pass (``piece_chunks`` at a time): what a pass fused with others
        (:func:`l5dask.core.engine.fused_chunk`) hands a member that streams, from one block."""
        out = []
        step = piece_chunks(self.meta)
        for i in range(0, len(self.chunks), step):
            group = self.chunks[i : i + step]
            piece = Encoded(self.meta, self.compressed, group)
            if self._records is not None:  # (decoded already: its rows, not decoded again)
                piece._records = self._records[piece.start - self.start : piece.stop - self.start]
            if self._expected:  # (its gathers served by the block's one pass)
                piece._base = (self, piece.start - self.start)
            piece._distinct = {}
            out.append((piece.start, piece))
        return out

    def expect(
        self,
        elements: Sequence[tuple[str, tuple[int, ...]]] = (),
        argmax: Sequence[str] = (),
        maxima: Sequence[str] = (),
        derived: Sequence[str] = (),
        leaves: Sequence[str] = (),
    ) -> None:
        """Numbers, argmaxes and maxima (``values`` of :meth:`gather`) that readers of these chunks
        will gather (the members of a fused pass, :func:`l5dask.core.engine.fused_chunk`): the
        first gather makes all that are expected in one pass over the bytes (each chunk
        decompressed once for all of them), the others are served from it (read-only arrays).
        ``derived``: per-row columns a reader would make of them (``speed``, ``distance_to_ego``),
        which a member that makes them anyway writes out for it (:meth:`derived_out`); ``leaves``:
        results of rows a member will leave here for the others (:meth:`leave`)."""
        for f, idx in elements:
            self._expected[("e", f, tuple(idx))] = None
        for f in argmax:
            self._expected[("m", f)] = None
        for f in maxima:
            self._expected[("m", f)] = None
            self._expected[("v", f)] = None
        for name in derived:
            self._expected[("d", name)] = None
        for name in leaves:
            self._expected[("k", name)] = None

    def leaves(self, name: str) -> bool:
        """Whether a member of the fused pass these rows are read for will leave the result
        ``name`` of them (:meth:`leave`): one that would make it too may wait for it
        (``l5dask.core.engine.Later``)."""
        block = self._base[0] if self._base is not None else self
        return ("k", name) in block._expected

    def leave(self, name: str, value: Any) -> None:
        """Leave the result ``name`` of these rows for the other members of the fused pass (kept
        with the block while it is read: read-only by convention)."""
        block = self._base[0] if self._base is not None else self
        if ("k", name) in block._expected:
            block._left[(name, self.start, self.stop)] = value

    def left(self, name: str) -> Any:
        """The result ``name`` of exactly these rows another member left (:meth:`leave`), or ``None``."""
        block = self._base[0] if self._base is not None else self
        return block._left.get((name, self.start, self.stop))

    def derived_out(self, name: str) -> np.ndarray | None:
        """Where a member of a fused pass that makes the per-row column ``name`` anyway writes it
        for the others (these rows' slots of the block's array, float64; its caller fills them
        all): ``None`` when no reader of the block expects it (:meth:`expect`)."""
        block, at = self._base if self._base is not None else (self, 0)
        if ("d", name) not in block._expected:
            return None
        out = block._derived.get(name)
        if out is None:
            out = block._derived[name] = np.empty(len(block), np.float64)
        block._filled[name] = block._filled.get(name, 0) + len(self)
        return out[at : at + len(self)]

    def derived(self, name: str) -> np.ndarray | None:
        """The per-row column ``name`` of these rows made by another member of the fused pass
        (:meth:`derived_out`; read-only), or ``None`` when it was not made for all of them."""
        block, at = self._base if self._base is not None else (self, 0)
        out = block._derived.get(name)
        if out is None or block._filled.get(name, 0) < len(block):
            return None
        out.flags.writeable = False
        return out[at : at + len(self)]

    def _gather_shared(
        self,
        elements: Sequence[tuple[str, tuple[int, ...]]],
        argmax: Sequence[str],
        values: list[np.ndarray] | None = None,
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """:meth:`gather` served by one gather of everything expected (see :meth:`expect`)."""
        if self._base is not None:
            base, at = self._base
            vals: list[np.ndarray] | None = [] if values is not None else None
            outs, maxes = base._gather_shared(elements, argmax, vals)
            n = len(self)
            if values is not None and vals is not None:
                values.extend(v[at : at + n] for v in vals)
            return [o[at : at + n] for o in outs], [m[at : at + n] for m in maxes]
        keys: list[tuple] = [("e", f, tuple(i)) for f, i in elements] + [("m", f) for f in argmax]
        maxima: list[tuple] = [("v", f) for f in argmax] if values is not None else []
        if any(k not in self._shared for k in keys + maxima):
            todo = [k for k in {**self._expected, **dict.fromkeys(keys + maxima)} if k not in self._shared]
            for k in todo:  # (a field's maxima come with its argmax)
                if k[0] == "v" and ("m", k[1]) not in todo:
                    todo.append(("m", k[1]))
            els = [(k[1], k[2]) for k in todo if k[0] == "e"]
            maxed = [k[1] for k in todo if k[0] == "m"]
            want_values = any(k[0] == "v" for k in todo)
            saved, self._expected = self._expected, {}
            found_values: list[np.ndarray] = []
            try:
                outs, maxes = self.gather(els, maxed, values=found_values if want_values else None)
            finally:
                self._expected = saved
            made = [k for k in todo if k[0] == "e"] + [k for k in todo if k[0] == "m"]
            made += [("v", f) for f in maxed] if want_values else []
            for k, v in zip(made, outs + maxes + found_values):
                v.flags.writeable = False  # (one array for every reader: none may write into it)
                self._shared.setdefault(k, v)
        got = [self._shared[k] for k in keys]
        if values is not None:
            values.extend(self._shared[k] for k in maxima)
        return got[: len(elements)], got[len(elements) :]

    def spans(self) -> list[tuple[int, int]]:
        """Each stored chunk's rows ``[a, b)`` among these rows, in order."""
        out = []
        for index in self.indices:
            lo, hi = self.meta.chunk_bounds(index)
            out.append((lo - self.start, hi - self.start))
        return out

    @property
    def dtype(self) -> np.dtype:
        return self.meta.dtype

    def records(self) -> np.ndarray:
        """The records (decoded on first use, each chunk once)."""
        if self._records is None:
            self.check()  # before sizing anything by the metadata
            self._records = self.records_into(np.empty(len(self), self.meta.dtype), self.start, self.stop)
        return self._records

    def check(self) -> None:
        """Every chunk's header against the array's metadata (``check_chunk``)."""
        for index, raw in self.chunks:
            check_chunk(raw, self.meta, self.compressed, str(index))

    def records_into(self, out: np.ndarray, lo: int, hi: int) -> np.ndarray:
        """Rows ``[lo, hi)`` (within these chunks) into ``out`` (``hi - lo`` records): each chunk
        decoded once, straight into ``out`` when all its rows fit there (no copy), else through one
        chunk of scratch."""
        meta, rows = self.meta, self.meta.chunk_rows
        scratch = None
        for index, raw in self.chunks:
            start, stop = meta.chunk_bounds(index)
            if start >= lo and start + rows <= hi:
                decode_chunk(raw, meta, self.compressed, str(index), out=out[start - lo : start - lo + rows])
                continue
            a, b = max(lo, start), min(hi, stop)
            if a >= b:
                continue
            if scratch is None:
                scratch = np.empty(rows, dtype=meta.dtype)
            decode_chunk(raw, meta, self.compressed, str(index), out=scratch)
            # as bytes: a memcpy (a structured copy goes field by field, 3x slower)
            out[a - lo : b - lo].view(np.uint8)[:] = scratch[a - start : b - start].view(np.uint8)
        return out

    def gather(
        self,
        elements: Sequence[tuple[str, tuple[int, ...]]],
        argmax: Sequence[str] = (),
        distinct: str | None = None,
        found: list[np.ndarray] | None = None,
        values: list[np.ndarray] | None = None,
        codes: list[np.ndarray] | None = None,
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """As ``l5dask.prediction.kernels.gather`` of ``records()``, without making them; with
        ``distinct``, the distinct values of that field (each chunk's, as arrays of the field's
        dtype: a value may be in several) are appended to ``found``, and with a list ``codes``,
        each row's value as an index into the concatenation of the arrays appended (int32); with
        a list ``values``, the maximum of each ``argmax`` field's row (float32) is appended to it."""

        if distinct is None and (self._expected or self._base is not None):
            return self._gather_shared(elements, argmax, values)
        if self._distinct is not None and distinct is not None and found is not None and values is None:
            key = (tuple((f, tuple(i)) for f, i in elements), tuple(argmax), distinct)
            if key not in self._distinct:
                added: list[np.ndarray] = []
                made: list[np.ndarray] = []
                outs, maxes = self._gather(elements, argmax, distinct, added, None, made)
                for a in (*outs, *maxes, *added, *made):
                    a.flags.writeable = False  # (one array for every reader: none may write into it)
                self._distinct[key] = (outs, maxes, added, made)
            outs, maxes, added, made = self._distinct[key]
            found.extend(added)
            if codes is not None:
                codes.extend(made)
            return list(outs), list(maxes)
        return self._gather(elements, argmax, distinct, found, values, codes)

    def _gather(
        self,
        elements: Sequence[tuple[str, tuple[int, ...]]],
        argmax: Sequence[str],
        distinct: str | None,
        found: list[np.ndarray] | None,
        values: list[np.ndarray] | None,
        codes: list[np.ndarray] | None,
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """:meth:`gather`, each chunk's compressed bytes read."""
        plan = Gather.of(self.meta.dtype, elements, argmax, distinct)
        outs, maxes = plan.outputs(len(self))
        vals = plan.value_outputs(len(self)) if values is not None else None
        out_codes = np.empty(len(self), np.int32) if codes is not None and distinct is not None else None
        if self._records is not None or not self.compressed:
            plan.records(self.records(), outs, maxes, 0, found, vals, out_codes)
        else:
            blocks, scratch = np.empty(0, np.uint8), None
            before = len(found) if found is not None else 0
            for index, raw in self.chunks:
                lo, hi = self.meta.chunk_bounds(index)
                check_chunk(raw, self.meta, self.compressed, str(index))
                done, blocks = plan.blosc(
                    raw, self.meta.chunk_rows, hi - lo, outs, maxes, lo - self.start, blocks, found, vals, out_codes
                )
                if not done:
                    if scratch is None:
                        scratch = np.empty(self.meta.chunk_rows, self.meta.dtype)
                    decode_chunk(raw, self.meta, self.compressed, str(index), out=scratch)
                    plan.records(scratch[: hi - lo], outs, maxes, lo - self.start, found, vals, out_codes)
                if out_codes is not None and found is not None and len(found) > before + 1:
                    # (a chunk's codes count from its own values: after those of the chunks before)
                    out_codes[lo - self.start : hi - self.start] += sum(len(x) for x in found[before:-1])
        if values is not None and vals is not None:
            values.extend(vals)
        if codes is not None and out_codes is not None:
            codes.append(out_codes)
        return outs, maxes


def read_block(
    store: Store,
    meta: fmt.ArrayMeta,
    compressed: bool,
    first_chunk: int,
    nchunks: int,
    fields: tuple[str, ...] | None,
) -> np.ndarray:
    """Read ``nchunks`` stored chunks from ``first_chunk`` on, each once, keeping ``fields``.

    Full chunks of all fields are decoded straight into the output (no copy, see
    :meth:`Encoded.records`); a padded last chunk, or a projection, goes through one chunk-sized
    scratch buffer.
    """
    if fields is None:
        return Encoded(meta, compressed, fetch_chunks(store, meta, first_chunk, nchunks)).records()
    start, _ = meta.chunk_bounds(first_chunk)
    _, stop = meta.chunk_bounds(first_chunk + nchunks - 1)
    out = np.empty(stop - start, dtype=project(np.empty(0, meta.dtype), fields).dtype)
    for lo, records in iter_chunks(store, meta, compressed, first_chunk, nchunks):
        for f in fields:
            out[f][lo - start : lo - start + len(records)] = records[f]
    return out


def _read_block_id(array, chunks_per_task, fields, block_id=None) -> np.ndarray:
    first = block_id[0] * chunks_per_task
    return array.read(first, min(chunks_per_task, array.meta.nchunks - first), fields)


class L5Array:
    """One stored structured array of a dataset, read lazily.

    Parameters
    ----------
    store : Store
        Where the dataset lives.
    meta : ArrayMeta
        The parsed ``.zarray``.
    compressed : bool
        Whether chunks are blosc-compressed (always, for L5Kit's writer).
    """

    def __init__(self, store: Store, meta: fmt.ArrayMeta, compressed: bool = True) -> None:
        self.store, self.meta, self.compressed = store, meta, compressed

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def dtype(self) -> np.dtype:
        return self.meta.dtype

    def __len__(self) -> int:
        return self.meta.length

    # the engine's ChunkSource ---------------------------------------------------------
    @property
    def nchunks(self) -> int:
        return self.meta.nchunks

    def chunk_bounds(self, index: int) -> tuple[int, int]:
        return self.meta.chunk_bounds(index)

    @property
    def remote(self) -> bool:
        """Whether each chunk is a request to a server (an object store): the engine then runs
        more tasks at once on local threads (``l5dask.remote-tasks-per-core``)."""
        return self.store.remote

    def iter_chunks(self, first: int, n: int):
        """``(start row, records)`` of stored chunks ``first .. first + n - 1``, each decoded once
        into one reused buffer (valid until the next chunk)."""
        return iter_chunks(self.store, self.meta, self.compressed, first, n)

    def iter_encoded(self, first: int, n: int):
        """``(start row, Encoded)`` of stored chunks ``first .. first + n - 1``, up to
        ``piece_chunks`` at a time, fetched ahead as :meth:`iter_chunks`, never decoded here
        (see :class:`Encoded`)."""
        group: list[tuple[int, bytes]] = []
        step = piece_chunks(self.meta)
        for index, raw in iter_stored(self.store, self.meta, first, n):
            group.append((index, raw))
            if len(group) == step:
                yield self.meta.chunk_bounds(group[0][0])[0], Encoded(self.meta, self.compressed, group)
                group = []
        if group:
            yield self.meta.chunk_bounds(group[0][0])[0], Encoded(self.meta, self.compressed, group)

    def read_encoded(self, first: int, n: int) -> Encoded:
        """Stored chunks ``first .. first + n - 1`` fetched, not decoded (see :class:`Encoded`)."""
        return Encoded(self.meta, self.compressed, fetch_chunks(self.store, self.meta, first, n) if n else [])

    def chunk_identities(self) -> list:
        """What identifies each stored chunk's bytes without reading them, for the cache of partials
        (:mod:`l5dask.core.cache`): the array's record layout, the chunk's path and rows, and its
        size with the store's ETag or mtime (one listing of the array's folder,
        ``Store.identities``); a chunk the listing says nothing trusted about, a hash of its
        bytes (read for it)."""
        import hashlib

        meta = self.meta
        # (what every chunk shares, once: the array's record layout and folder; then each chunk's
        # name, rows and identity, one string a chunk)
        layout = repr((meta.name, str(meta.dtype.descr), meta.chunk_rows, self.compressed, self.store.location))
        prefix = hashlib.blake2b(layout.encode(), digest_size=10).hexdigest()
        n, rows, length = meta.nchunks, meta.chunk_rows, meta.length
        tail = "".join(meta.separator + "0" for _ in meta.tail)
        if "/" in tail:  # (an N-D array's chunks in folders of their own: "mask/3/0")
            return self._identities_by_folder(prefix)
        # (every chunk is in the array's folder, named f"{i}{tail}": its pieces made once, not a
        # call each; 51,316 chunks at 1 G agents: 0.04 CPU-s against 0.09)
        if not n:
            return []
        folder = meta.key(0).rpartition("/")[0]
        idents = self.store.identities(folder)
        head = f"{prefix}|{self.store.path(folder)}/"
        out = []
        for i in range(n):
            name = f"{i}{tail}"
            ident = idents.get(name)
            if ident is None:
                ident = self._hashed(i)
            a = i * rows
            out.append(f"{head}{name}|{a}:{min(a + rows, length)}|{ident}")
        return out

    def _hashed(self, i: int) -> str:
        """A chunk's identity from its bytes (read for it): where the store says nothing trusted of it."""
        import hashlib

        data = self.store.get(self.meta.key(i), what=f"array {self.meta.name!r}, chunk {str(i)!r}")
        return f"blake2b:{len(data)}:{hashlib.blake2b(data, digest_size=20).hexdigest()}"

    def _identities_by_folder(self, prefix: str) -> list:
        meta = self.meta
        listed: dict[str, tuple[str, dict[str, str]]] = {}
        out = []
        for i in range(meta.nchunks):
            folder, _, name = meta.key(i).rpartition("/")
            if folder not in listed:
                listed[folder] = (self.store.path(folder), self.store.identities(folder))
            path, idents = listed[folder]
            ident = idents.get(name)
            if ident is None:
                ident = self._hashed(i)
            a, b = meta.chunk_bounds(i)
            out.append(f"{prefix}|{path}/{name}|{a}:{b}|{ident}")
        return out

    def read(self, first: int, n: int, fields: Sequence[str] | str | None = None) -> np.ndarray:
        """Stored chunks ``first .. first + n - 1`` as one array of records (each decoded once)."""
        if n == 0:
            return np.empty(0, self.dtype if fields is None else project(np.empty(0, self.dtype), fields).dtype)
        return read_block(self.store, self.meta, self.compressed, first, n, self._fields(fields))

    def __dask_tokenize__(self):
        return (
            "l5dask.L5Array",
            self.store.__dask_tokenize__(),
            self.meta.name,
            self.meta.length,
            self.meta.chunk_rows,
            self.meta.dtype.descr,
            self.compressed,
        )

    def _fields(self, fields: Sequence[str] | str | None) -> tuple[str, ...] | None:
        if fields is None:
            return None
        if isinstance(fields, str):
            fields = (fields,)
        unknown = [f for f in fields if f not in fmt.names_of(self.dtype)]
        if unknown:
            raise UsageError(
                f"array {self.name!r} has no field(s) {', '.join(unknown)}; it has {', '.join(fmt.names_of(self.dtype))}"
            )
        return tuple(fields)

    def select(self, fields: Sequence[str]) -> L5Array:
        """This array for a reader that needs only ``fields``: itself (a chunk of records is
        decoded whole; a columnar layout reads only those fields)."""
        self._fields(fields)
        return self

    def read_rows(self, lo: int, hi: int, out: np.ndarray) -> np.ndarray:
        """Rows ``[lo, hi)`` (all fields) into ``out`` (``hi - lo`` records): each stored chunk read
        and decoded once, straight into ``out`` when all its rows fit there (no copy), else
        through one chunk of scratch."""
        if hi <= lo:
            return out
        rows = self.meta.chunk_rows
        return self.read_encoded(lo // rows, (hi - 1) // rows + 1 - lo // rows).records_into(out, lo, hi)

    def read_ranges(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """The rows of the sorted, disjoint ranges ``[lo[i], hi[i])``, one after the other; each
        stored chunk holding any of them read and decoded once (a run of chunks fetched together)."""
        lo, hi = np.asarray(lo, np.int64), np.asarray(hi, np.int64)
        keep = hi > lo
        lo, hi = lo[keep], hi[keep]
        offset = np.concatenate([[0], np.cumsum(hi - lo)])
        out = None
        rows = self.meta.chunk_rows
        first, last = lo // rows, (hi - 1) // rows
        # runs of consecutive chunks that hold wanted rows
        chunks = (
            sorted_unique(np.concatenate([np.arange(a, b + 1) for a, b in zip(first, last)]))
            if len(lo)
            else np.zeros(0, np.int64)
        )
        breaks = np.flatnonzero(np.diff(chunks) > 1) + 1
        for run in np.split(np.asarray(chunks, np.int64), breaks) if len(chunks) else []:
            for start, records in self.iter_chunks(int(run[0]), len(run)):
                if out is None:
                    out = np.empty(int(offset[-1]), records.dtype)
                stop = start + len(records)
                for i in range(int(np.searchsorted(hi, start, "right")), int(np.searchsorted(lo, stop, "left"))):
                    a, b = max(int(lo[i]), start), min(int(hi[i]), stop)
                    at = int(offset[i]) + a - int(lo[i])
                    out[at : at + b - a].view(np.uint8)[:] = records[a - start : b - start].view(np.uint8)
        return out if out is not None else np.empty(0, self.dtype)

    def read_chunk(self, index: int, fields: Sequence[str] | str | None = None) -> np.ndarray:
        """Read and decode one stored chunk (eagerly, in this process)."""
        return self.read(index, 1, fields)

    def to_dask(self, fields: Sequence[str] | str | None = None, chunks_per_task: int = 1) -> da.Array:
        """The array as a 1-D dask array of records, one task per stored chunk.

        Parameters
        ----------
        fields : sequence of str, optional
            Keep only these fields (each chunk is still decoded once).
        chunks_per_task : int
            Group this many consecutive stored chunks per task (fewer, larger tasks).
        """
        import dask.array as da

        fields = self._fields(fields)
        if chunks_per_task < 1:
            raise UsageError("chunks_per_task must be >= 1")
        meta = self.meta
        dtype = meta.dtype if fields is None else project(np.empty(0, meta.dtype), fields).dtype
        firsts = list(range(0, meta.nchunks, chunks_per_task))
        if not firsts:
            return da.from_array(np.empty(0, dtype=dtype), chunks=(0,))
        chunks = tuple(
            meta.chunk_bounds(min(f + chunks_per_task, meta.nchunks) - 1)[1] - meta.chunk_bounds(f)[0] for f in firsts
        )
        token = tokenize(self, fields, chunks_per_task)
        # A blockwise layer with no inputs: one task per block, fused cheaply with
        # per-field getitem layers by dask's blockwise optimisation.
        return da.map_blocks(
            _read_block_id,
            self,
            chunks_per_task,
            fields,
            chunks=(chunks,),
            dtype=dtype,
            meta=np.empty(0, dtype=dtype),
            name=f"l5-read-{meta.name}-{token}",
        )

    def __repr__(self) -> str:
        return f"<L5Array {self.name} len={len(self)} chunks={self.meta.nchunks}x{self.meta.chunk_rows}>"


def check_last_chunk(store: Store, meta: fmt.ArrayMeta, compressed: bool) -> None:
    """That the last chunk the metadata implies is stored, and that its header agrees with the
    metadata's record and chunk sizes (one read of its first 16 bytes, before any graph is built):
    a shape larger than what was written, or a ``.zarray`` whose records or chunks are larger or
    smaller than what is stored, is refused here, in one line."""
    if not meta.nchunks:
        return
    key = meta.key(meta.nchunks - 1)
    try:
        head = store.get(key, start=0, end=16) if compressed else None
    except ChunkError:
        head = None
        if compressed:
            raise FormatError(
                f"{store.url}: array {meta.name!r}: its .zarray says {meta.length:,} rows in "
                f"{meta.nchunks:,} chunks of {meta.chunk_rows:,}, but the last chunk "
                f"({key!r}) is not stored"
            ) from None
    if head is not None:
        why = check_blosc(head, meta.chunk_nbytes, meta.typesize, header_only=True)
        if why is not None:
            raise FormatError(
                f"{store.url}: array {meta.name!r}: its last chunk ({key!r}) does not match its "
                f".zarray ({meta.chunk_rows:,} rows of {meta.dtype.itemsize:,} bytes): {why}"
            )
    elif not store.exists(key):
        raise FormatError(
            f"{store.url}: array {meta.name!r}: its .zarray says {meta.length:,} rows in "
            f"{meta.nchunks:,} chunks of {meta.chunk_rows:,}, but the last chunk ({key!r}) is not stored"
        )
