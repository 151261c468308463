"""L5Kit's ground-truth (GT) and prediction (PRED) CSV files: headers, writers, parallel readers.

The layout is L5Kit 1.5.0's (``l5kit/evaluation/csv_utils.py``):

- GT: ``timestamp,track_id,avail_0..avail_{T-1},coord_x00,coord_y00,...,coord_x0{T-1},coord_y0{T-1}``
- PRED: ``timestamp,track_id,conf_0..conf_{M-1}``, then per mode m: ``coord_x{m}0,coord_y{m}0,...``

**Writing** produces exactly L5Kit's bytes (its ``csv.DictWriter`` ends lines with ``\\r\\n``,
whatever a description of the format says): coordinates as ``f"{v:.5f}"``, every other value as numpy
prints it. Rows are formatted in chunk-parallel tasks, vectorized (a coordinate is rounded as an
integer of 1e-5 m and printed by Arrow; the few within rounding distance of a tie, and values
too large for that, are printed by Python itself), and the parts are appended in order to a
temporary file that replaces the output only when whole (:func:`l5dask.core.outputs.atomic_write`).

**Reading** is two parallel passes over byte ranges of the file: a *row scan* (every line's start
and its ``(timestamp, track_id)`` key, by numpy on the raw bytes: no float is parsed) and the
*parse* of any row range (compiled, for L5Kit's plain layout; pyarrow's CSV reader for anything
else, and to say what is wrong), which a caller runs where the rows are needed
(the metrics parse each GT range with the PRED rows joined to it). Neither holds a file in memory.

From an object store, every byte would come over the network twice (scan, then parse). So the
scan (:func:`scanned`, which :func:`l5dask.evaluation.metrics.evaluate` runs around its pass) on
local threads (or a cluster on this machine) gives the files a *spill* folder: each scan task
keeps the bytes it fetched there (``spill``, one file per scan block), and the parse reads its
ranges from them; a range not all there is fetched again. The folder is removed when the pass
ends, however it ends. The bytes are the same either way, and so are the results.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from l5dask.core.cluster import on_this_machine
from l5dask.core.engine import Job, lazy_map
from l5dask.core.lazy import compiled
from l5dask.core.outputs import atomic_output, atomic_write, check_writable
from l5dask.core.policy import where_keywords
from l5dask.core.store import file_store, resolved_options
from l5dask.errors import ChunkError, L5DaskError, NotADatasetError, StoreError

_compiled = compiled("l5dask.evaluation._csvrows")
parse_csv_rows = _compiled.parse_csv_rows
scan_keys = _compiled.scan_keys

#: L5Kit's ``MAX_MODES``.
MAX_MODES = 3
#: Bytes per task of the row scan.
SCAN_BLOCK = 8 << 20
#: Bytes of a line's start where its key must fit (two integers of up to 20 digits and commas).
KEY_WINDOW = 48


class CSVError(L5DaskError, ValueError):
    """A GT or PRED file that is not what L5Kit writes, or a pair that does not match."""


# --- headers -----------------------------------------------------------------------------------
def coords_keys(future_len: int, mode: int = 0) -> list[str]:
    """``coord_x{mode}{i}, coord_y{mode}{i}`` for each step (L5Kit's ``_generate_coords_keys``)."""
    return [f"coord_{a}{mode}{i}" for i in range(future_len) for a in "xy"]


def gt_header(future_len: int) -> list[str]:
    return ["timestamp", "track_id"] + [f"avail_{i}" for i in range(future_len)] + coords_keys(future_len)


def pred_header(future_len: int, max_modes: int = MAX_MODES) -> list[str]:
    names = ["timestamp", "track_id"] + [f"conf_{m}" for m in range(max_modes)]
    for m in range(max_modes):
        names += coords_keys(future_len, m)
    return names


def _first_difference(got: list[str], want: list[str]) -> str:
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return f"column {i + 1} is {g!r}, L5Kit's is {w!r}"
    return f"{len(got)} columns, L5Kit's has {len(want)}"


def _named_difference(names: list[str], want: list[str], kind: str, where: str, hint: str = "") -> None:
    """Refuse a header whose column count fits no future length by its first name that differs from
    L5Kit's header of the nearest length, when there is one (a column missing from the start or
    the middle); a column missing at the end leaves the count to say it."""
    for i, (g, w) in enumerate(zip(names, want)):
        if g != w:
            raise CSVError(f"{where}: not L5Kit's {kind}: column {i + 1} is {g!r}, L5Kit's is {w!r}{hint}")


def check_header(names: list[str], kind: str, max_modes: int = MAX_MODES, where: str = "") -> int:
    """The future length T of a file whose header is ``names`` (after checking every name and its
    position against L5Kit's), else a :class:`CSVError` that says what differs."""
    n = len(names)
    if kind == "gt":
        t = (n - 2) / 3
        if n < 5 or t != int(t):
            _named_difference(names, gt_header(max(1, round(t))), "GT header", where)
            raise CSVError(f"{where}: not a GT file: {n} columns give no integer future length T = (columns - 2) / 3")
        want = gt_header(int(t))
    else:
        modes = sum(1 for x in names if x.startswith("conf_"))
        if modes > max_modes:
            raise CSVError(f"{where}: {modes} modes (conf_0..conf_{modes - 1}), more than --max-modes {max_modes}")
        t = (n - 2 - max_modes) / (2 * max_modes)
        if n < 2 + 3 * max_modes or t != int(t):
            hint = ""
            if (
                0 < modes < max_modes
                and names[2 : 2 + modes] == [f"conf_{m}" for m in range(modes)]
                and (n - 2 - modes) % (2 * modes) == 0
            ):
                hint = f" (a file of {modes} modes: --max-modes {modes} reads it)"
            _named_difference(
                names, pred_header(max(1, round(t)), max_modes), f"PRED header of {max_modes} modes", where, hint
            )
            raise CSVError(
                f"{where}: not a PRED file with {max_modes} modes: {n} columns give no integer future "
                f"length T = (columns - 2 - M) / (2 M)"
            )
        want = pred_header(int(t), max_modes)
    if names != want:
        raise CSVError(f"{where}: not L5Kit's {kind.upper()} header: {_first_difference(names, want)}")
    return int(t)


# --- files -------------------------------------------------------------------------------------
@dataclass
class CSVFile:
    """One GT or PRED file: where it is, its header and, after :func:`scan`, its rows.

    ``starts`` holds each row's first byte (and the file's size last), ``timestamps`` and
    ``track_ids`` each row's key.
    """

    path: str
    kind: str  # "gt" or "pred"
    future_len: int
    max_modes: int
    names: list[str]
    size: int
    header_bytes: int
    storage_options: dict | None = None
    # (until the rows are scanned: no rows; ``starts`` ends with the end of the last row)
    starts: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64), repr=False)
    timestamps: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    track_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    #: a local folder where the row scan keeps the bytes it fetched, for the parse (see above)
    spill: str | None = None

    def __len__(self) -> int:
        return len(self.starts) - 1

    def bare(self) -> CSVFile:
        """The file without its row tables: what a parse task carries, with the byte span of its
        rows (:func:`parse_rows`), in place of the tables (24 bytes a row)."""
        empty = np.zeros(0, np.int64)
        return dataclasses.replace(self, starts=np.zeros(1, np.int64), timestamps=empty, track_ids=empty)

    def span(self, lo: int, hi: int) -> tuple[int, int]:
        """The bytes of rows ``[lo, hi)``."""
        return int(self.starts[lo]), int(self.starts[hi])

    @property
    def modes(self) -> int:
        return 1 if self.kind == "gt" else self.max_modes

    def read_range(self, lo: int, hi: int) -> bytes:
        """Bytes ``[lo, hi)`` of the file (see :meth:`read_ranges`)."""
        return next(self.read_ranges([(lo, hi)]))

    def read_ranges(self, spans: list[tuple[int, int]], depth: int | None = None):
        """The bytes of each ``(lo, hi)`` span in order, through the file's folder's store (retries,
        one-line errors), or from the spill folder when the scan kept them all there. On an object
        store the first ``depth`` (default: all) are asked for at once, now, and each later one
        when the caller takes one (:meth:`l5dask.core.store.Store.iter_ranges`)."""
        kept = [self._spill_parts(a, b) if self.spill is not None else None for a, b in spans]
        store, key = file_store(self.path, self.storage_options)
        fetch = [(key, a, b) for (a, b), k in zip(spans, kept) if k is None]
        fetched = store.iter_ranges(fetch, {key: f"the {self.kind.upper()} file"}, depth or len(fetch) or 1)
        return self._checked(spans, kept, fetched)

    def _checked(self, spans: list[tuple[int, int]], kept: list, fetched):
        for (lo, hi), parts in zip(spans, kept):
            data = _read_parts(parts) if parts is not None else next(fetched)
            if len(data) != hi - lo:
                raise CSVError(
                    f"{self.path}: the file changed while it was read ({len(data)} of {hi - lo} bytes at {lo})"
                )
            yield data

    def _scan_bytes(self, k: int) -> tuple[int, int]:
        """The bytes of scan block ``k`` that its task keeps in the spill folder: from the byte
        before its first row's start (as the scan reads them) to its end."""
        return max(k * SCAN_BLOCK, self.header_bytes) - 1, min((k + 1) * SCAN_BLOCK, self.size)

    def keep(self, k: int, data: bytes) -> None:
        """Keep scan block ``k``'s bytes (``data`` starts with them) in the spill folder, whole or
        not at all (a file that cannot be written, a full disk: the parse fetches them again)."""
        if self.spill is None:
            return
        a, b = self._scan_bytes(k)
        try:
            with atomic_output(os.path.join(self.spill, str(k)), checked=True) as tmp, open(tmp, "wb") as out:
                out.write(memoryview(data)[: b - a])
        except OSError:  # (an OutputError too)
            pass

    def _spill_parts(self, lo: int, hi: int) -> list[tuple[str, int, int]] | None:
        """Where bytes ``[lo, hi)`` are in the spill folder (``(file, offset, length)`` each), or
        ``None`` unless its files hold them all."""
        assert self.spill is not None
        parts, at = [], lo
        while at < hi:
            k = at // SCAN_BLOCK
            a, b = self._scan_bytes(k)
            path = os.path.join(self.spill, str(k))
            if not a <= at < b or not os.path.exists(path) or os.path.getsize(path) != b - a:
                return None
            parts.append((path, at - a, min(hi, b) - at))
            at = min(hi, b)
        return parts

    @property
    def remote(self) -> bool:
        """Whether each read is a request to a server (an object store)."""
        return file_store(self.path, self.storage_options)[0].remote

    def __dask_tokenize__(self):
        return ("l5dask-csv", self.path, self.kind, self.size, self.max_modes)


def open_csv(path: str, kind: str, max_modes: int = MAX_MODES, storage_options: dict | None = None) -> CSVFile:
    """Open a GT (``kind="gt"``) or PRED file and check its header; rows are not read."""
    path = os.fspath(path)
    try:
        store, key = file_store(path, storage_options)
        size = store.size(key)
        head = store.get(key, start=0, end=min(size, 1 << 20), what=f"the {kind.upper()} file") if size else b""
    except ChunkError:
        raise CSVError(f"{path}: no such file") from None
    except (NotADatasetError, StoreError) as exc:
        raise CSVError(f"{path}: cannot read: {exc}") from None
    end = head.find(b"\n")
    if end < 0:
        if size > len(head) or not head:
            raise CSVError(f"{path}: no header line")
        end = len(head)
    line = head[:end].rstrip(b"\r")
    if line.startswith(b"\xef\xbb\xbf"):  # (L5Kit's csv reader takes it into the first column's name too)
        raise CSVError(f"{path}: the file starts with a UTF-8 byte order mark; write it without one (as L5Kit does)")
    try:
        names = line.decode("ascii").split(",")
    except UnicodeDecodeError:
        raise CSVError(f"{path}: the header is not text") from None
    t = check_header(names, kind, max_modes, where=path)
    # the options as resolved here travel with the file to the tasks (workers may not share this
    # process's AWS environment)
    options = resolved_options(path, storage_options)
    return CSVFile(path, kind, t, max_modes, names, size, min(end + 1, size), options)


def _read_parts(parts: list[tuple[str, int, int]]) -> bytes:
    out = []
    for path, offset, length in parts:
        with open(path, "rb") as f:
            f.seek(offset)
            out.append(f.read(length))
    return out[0] if len(out) == 1 else b"".join(out)


# --- the row scan --------------------------------------------------------------------------------
def _parse_keys(window: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, str]:
    """The two leading integers of each line (a row of ``window``: bytes from the line start);
    and the first row whose key is not two integers (``-1`` if none) and its column."""
    n, w = window.shape
    out = []
    pos = np.zeros(n, np.int64)
    rows = np.arange(n)
    for column in ("timestamp", "track_id"):
        acc = np.zeros(n, np.uint64)
        ndig = np.zeros(n, np.int64)
        done = np.zeros(n, bool)
        for k in range(20):
            c = window[rows, np.minimum(pos + k, w - 1)]
            isdig = (c >= 48) & (c <= 57) & ~done
            acc = np.where(isdig, acc * np.uint64(10) + (c - 48).astype(np.uint64), acc)
            ndig += isdig
            done |= ~isdig
        sep = window[rows, np.minimum(pos + ndig, w - 1)]
        bad = (ndig == 0) | (ndig > 19) | (sep != 44) | (acc > np.uint64(2**63 - 1))
        if bad.any():
            # anything odd (a sign, a long number) goes to Python's int, which says what is wrong
            for i in np.flatnonzero(bad):
                cells = bytes(window[i]).split(b",")
                try:
                    value = int(cells[0 if column == "timestamp" else 1])
                    if len(cells) < 3 or not -(2**63) <= value < 2**63:
                        raise ValueError
                except ValueError:
                    return acc, acc, int(i), column
                acc[i] = np.uint64(value % 2**64)
                ndig[i] = len(cells[0 if column == "timestamp" else 1])
        out.append(acc.view(np.int64))
        pos = pos + ndig + 1
    return out[0], out[1], -1, ""


def _scan_span(f: CSVFile, lo: int, hi: int) -> tuple[int, int] | None:
    """The bytes the scan of block ``[lo, hi)`` reads: from the byte before it (a row starts after
    a newline) to a key's width past its end; ``None`` for a block inside the header."""
    lo = max(lo, f.header_bytes)
    return (lo - 1, min(hi + KEY_WINDOW, f.size)) if lo < hi else None


def scan_blocks(f: CSVFile, blocks: list[tuple[int, int]]) -> list[tuple]:
    """The row scans (:func:`_scan_block`) of byte blocks of ``f``, in order: a task's. On an object
    store the next block is being fetched while one is scanned."""
    spans = [_scan_span(f, lo, hi) for lo, hi in blocks]
    data = f.read_ranges([s for s in spans if s is not None], depth=2)
    return [_scan_block(f, lo, hi, next(data) if s is not None else b"") for (lo, hi), s in zip(blocks, spans)]


def scan_calls(f: CSVFile, job: Job) -> list[tuple]:
    """The row scan's tasks over ``f``: runs of ``SCAN_BLOCK`` blocks, 8 tasks a thread."""
    bounds = list(range(0, f.size, SCAN_BLOCK)) + [f.size]
    blocks = list(zip(bounds[:-1], bounds[1:]))
    per = max(1, -(-len(blocks) // (8 * max(1, job.threads))))
    return [(f, blocks[i : i + per]) for i in range(0, len(blocks), per)]


def _scan_block(f: CSVFile, lo: int, hi: int, data: bytes) -> tuple:
    """The rows starting in bytes ``[lo, hi)`` (after the header), from ``data``, the bytes of
    :func:`_scan_span`: first bytes, keys, and the first bad key's (row in block, column) if any."""
    lo = max(lo, f.header_bytes)
    empty = np.zeros(0, np.int64)
    if lo >= hi:
        return empty, empty, empty, -1, ""
    f.keep((hi - 1) // SCAN_BLOCK, data)
    buf = np.frombuffer(data, np.uint8)

    plain = scan_keys(buf, hi - lo)  # compiled; None when a row needs the general scan below
    if plain is not None:
        return (lo - 1 + plain[0]).astype(np.int64), plain[1], plain[2], -1, ""
    starts = np.flatnonzero(buf[: hi - lo] == 10) + 1  # a row starts after a newline; offsets into buf
    padded = np.concatenate([buf, np.zeros(KEY_WINDOW, np.uint8)])
    window = padded[starts[:, None] + np.arange(KEY_WINDOW)]
    blank = (window[:, 0] == 10) | (window[:, 0] == 0) | ((window[:, 0] == 13) & (window[:, 1] == 10))
    if blank.any():  # blank lines are not rows; one is an error unless only blank lines follow
        after = lo - 1 + starts[blank]
        tail = f.read_range(int(after[0]), f.size) if f.size - after[0] < (1 << 16) else b"x"
        if tail.strip():
            return empty, empty, empty, int(np.flatnonzero(blank)[0]), "(an empty line)"
        starts, window = starts[~blank], window[~blank]
    ts, tid, bad, column = _parse_keys(window)
    return (lo - 1 + starts).astype(np.int64), ts, tid, bad, column


@where_keywords
def scan(f: CSVFile, scheduler: Any = None) -> CSVFile:
    """Find every row of ``f`` (its first byte and its key) in parallel byte blocks; return ``f``.
    ``scheduler``: where the tasks run (a ``distributed.Client`` or its address, ``"threads"``...;
    default: the active client, else local threads; ``job=`` is its old name, until the next release)."""

    job = Job.of(scheduler)
    calls = scan_calls(f, job)
    parts = job.map(scan_blocks, calls, name=f"l5-scan-{f.kind}", remote=f.remote) if calls else []
    return collect_scan(f, [p for task in parts for p in task])


def scan_all(files: Sequence[CSVFile], job: Job) -> None:
    """The row scans of several files (:func:`scan`), as one set of parallel tasks."""
    calls = [c for f in files for c in scan_calls(f, job)]
    remote = any(f.remote for f in files)
    parts = job.map(scan_blocks, calls, name="l5-scan", remote=remote) if calls else []
    for f in files:
        collect_scan(f, [p for (owner, _), task in zip(calls, parts) if owner is f for p in task])


@contextlib.contextmanager
def scanned(files: Sequence[CSVFile], job: Job) -> Iterator[None]:
    """The files' rows found (:func:`scan_all`) for a pass that parses them inside the block.

    From an object store on local threads or a cluster on this machine, the scan keeps the bytes
    it fetched in a spill folder of its own, which the parse reads (each byte fetched once) and
    which is removed when the block ends, however it ends. On a cluster of other machines each
    task fetches its own bytes."""
    here = job.scheduler_kind == "threads" or on_this_machine(job.client)
    folder = tempfile.mkdtemp(prefix="l5dask-spill-") if here and any(f.remote for f in files) else None
    try:
        if folder is not None:
            for i, f in enumerate(files):
                f.spill = os.path.join(folder, f"{i}-{f.kind}")
                os.mkdir(f.spill)
        scan_all(files, job)
        yield
    finally:
        if folder is not None:
            for f in files:
                f.spill = None
            shutil.rmtree(folder, ignore_errors=True)


def collect_scan(f: CSVFile, parts: list[tuple]) -> CSVFile:
    """Put the row scan's blocks (in file order) into ``f``; the first bad key is an error."""
    before = 0
    for starts, _ts, _tid, bad, column in parts:
        if bad >= 0:
            line = before + bad + 2
            if column == "(an empty line)":
                raise CSVError(f"{f.path}: line {line} is empty")
            raise CSVError(
                f"{f.path}: line {line}, column {column!r}: not an integer of int64's range, -2**63 to 2**63-1, "
                "written plainly (digits, a '-' first; no quotes, '+', spaces or decimal point; or a short row)"
            )
        before += len(starts)
    f.starts = np.concatenate([p[0] for p in parts] + [np.array([f.size], np.int64)])
    f.timestamps = np.concatenate([p[1] for p in parts] + [np.zeros(0, np.int64)])
    f.track_ids = np.concatenate([p[2] for p in parts] + [np.zeros(0, np.int64)])
    return f


# --- parsing rows ------------------------------------------------------------------------------
@dataclass
class Rows:
    """Parsed rows of a GT (``avails`` (n, T), ``coords`` (n, T, 2)) or PRED file (``confs``
    (n, M), ``coords`` (n, M, T, 2))."""

    timestamps: np.ndarray
    track_ids: np.ndarray
    coords: np.ndarray
    avails: np.ndarray | None = None
    confs: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.timestamps)


def _locate_bad(f: CSVFile, data: bytes, first_row: int) -> str:
    """Where a range that pyarrow refused is wrong: the line and the column, in one line."""
    lines = data.split(b"\n")
    for i, raw in enumerate(lines):
        line = raw.rstrip(b"\r")
        if not line:
            continue
        cells = line.split(b",")
        where = f"{f.path}: line {first_row + i + 2}"
        if len(cells) != len(f.names):
            return f"{where}: {len(cells)} values, the header has {len(f.names)} columns (a ragged row)"
        for j, c in enumerate(cells):
            if not _arrow_reads(c, j < 2):
                return f"{where}, column {j + 1} ({f.names[j]!r}): not a number: {c[:24].decode(errors='replace')!r}"
    return f"{f.path}: rows {first_row + 2}..: cannot be parsed"


#: Numbers written plainly, which Arrow's parser reads (the cells of a row that are not are asked
#: of Arrow itself: ``+10`` and ``1_0`` are Python's numbers, not Arrow's).
_PLAIN_INT = re.compile(rb"-?[0-9]+")
_PLAIN_FLOAT = re.compile(rb"-?[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?")


def _arrow_reads(cell: bytes, integer: bool) -> bool:
    """Whether Arrow's CSV reader takes ``cell`` as an int64 (``integer``) or a float64: the cast
    of a string that its CSV conversion makes (the same parser)."""
    if (_PLAIN_INT if integer else _PLAIN_FLOAT).fullmatch(cell):
        return not integer or -(2**63) <= int(cell) < 2**63
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        pc.cast(pa.array([cell.decode("utf-8", errors="replace")]), pa.int64() if integer else pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    return True


def _arrow_rows(f: CSVFile, data: bytes, lo: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` rows parsed by pyarrow's CSV reader: the general parser, which says what is wrong."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    types = {name: pa.float64() for name in f.names[2:]}
    types.update(timestamp=pa.int64(), track_id=pa.int64())
    try:
        table = pcsv.read_csv(
            io.BytesIO(data),
            read_options=pcsv.ReadOptions(
                column_names=f.names, use_threads=False, block_size=max(len(data) + 1, 1 << 20)
            ),
            parse_options=pcsv.ParseOptions(newlines_in_values=False),
            convert_options=pcsv.ConvertOptions(
                column_types=types, strings_can_be_null=False, quoted_strings_can_be_null=False, null_values=[]
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        raise CSVError(_locate_bad(f, data, lo)) from None
    if table.num_rows != n:
        raise CSVError(
            _locate_bad(f, data, lo) if table.num_rows > n else f"{f.path}: rows {lo}..{lo + n}: expected {n} rows"
        )
    cols = [c.to_numpy() for c in table.columns]
    values = np.empty((n, len(cols) - 2), np.float64)
    for j, c in enumerate(cols[2:]):
        values[:, j] = c
    return cols[0], cols[1], values


def parse_rows(f: CSVFile, lo: int, hi: int, span: tuple[int, int] | None = None, data: bytes | None = None) -> Rows:
    """Rows ``[lo, hi)`` of a scanned file, or of a bare one given their bytes' ``span`` (one ranged
    read, or their ``data`` already read), parsed by a compiled reader of L5Kit's plain layout (numbers correctly rounded, as Python's ``float`` and Arrow's parser round them);
    a range holding anything else (``nan``, spaces, a bad cell) goes to pyarrow's CSV reader."""

    n = hi - lo
    t, m = f.future_len, f.modes
    if n == 0:
        return _empty_rows(f)
    if data is None:
        data = f.read_range(*(span or f.span(lo, hi)))
    ts, tid = np.empty(n, np.int64), np.empty(n, np.int64)
    values = np.empty((n, len(f.names) - 2), np.float64)
    if parse_csv_rows(np.frombuffer(data, np.uint8), ts, tid, values) != n:  # (all finite when it takes them)
        ts, tid, values = _arrow_rows(f, data, lo, n)
        bad = ~np.isfinite(values)
        if bad.any():
            r, c = np.argwhere(bad)[0]
            raise CSVError(
                f"{f.path}: line {lo + r + 2}, column {c + 3} ({f.names[c + 2]!r}): "
                f"{values[r, c]} is not a finite number"
            )
    if f.kind == "gt":
        return Rows(ts, tid, values[:, t:].reshape(n, t, 2), avails=values[:, :t])
    return Rows(ts, tid, values[:, m:].reshape(n, m, t, 2), confs=values[:, :m])


def _empty_rows(f: CSVFile) -> Rows:
    t, m = f.future_len, f.modes
    e = np.zeros(0, np.int64)
    if f.kind == "gt":
        return Rows(e, e, np.zeros((0, t, 2)), avails=np.zeros((0, t)))
    return Rows(e, e, np.zeros((0, m, t, 2)), confs=np.zeros((0, m)))


def row_groups(f: CSVFile, target_bytes: int = 16 << 20) -> list[tuple[int, int]]:
    """Row ranges of about ``target_bytes`` each, for parse tasks."""
    n = len(f)
    if n == 0:
        return []
    cuts = np.searchsorted(f.starts, np.arange(f.starts[0], f.size, target_bytes)[1:])
    edges = np.unique(np.concatenate([[0], cuts, [n]]))
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


# --- the readers (L5Kit's names) ---------------------------------------------------------------
@dataclass
class ParsedFile:
    """A scanned GT or PRED file whose columns are dask arrays (one chunk per row group)."""

    file: CSVFile
    timestamps: Any
    track_ids: Any
    coords: Any
    avails: Any = None
    confs: Any = None

    def __len__(self) -> int:
        return len(self.file)


def _to_dask(f: CSVFile, groups: list[tuple[int, int]]) -> ParsedFile:
    """The columns of ``f``'s row groups as dask arrays: a lazy parse a group and a block of each
    column taken out of it, both the engine's lazy calls (:func:`~l5dask.core.engine.lazy_map`)."""
    import dask.array as da

    bare = f.bare()
    parts = lazy_map(parse_rows, [(bare, lo, hi, f.span(lo, hi)) for lo, hi in groups], "parse_rows")
    t, m = f.future_len, f.modes

    def col(name: str, shape: tuple, dtype) -> Any:
        blocks = [
            da.from_delayed(p, shape=(hi - lo,) + shape, dtype=dtype)
            for p, (lo, hi) in zip(lazy_map(getattr, [(p, name) for p in parts], "getattr"), groups)
        ]
        return da.concatenate(blocks) if blocks else da.zeros((0,) + shape, dtype=dtype)

    if f.kind == "gt":
        return ParsedFile(
            f,
            col("timestamps", (), np.int64),
            col("track_ids", (), np.int64),
            col("coords", (t, 2), np.float64),
            avails=col("avails", (t,), np.float64),
        )
    return ParsedFile(
        f,
        col("timestamps", (), np.int64),
        col("track_ids", (), np.int64),
        col("coords", (m, t, 2), np.float64),
        confs=col("confs", (m,), np.float64),
    )


@where_keywords
def read_gt_csv(csv_path: str, storage_options: dict | None = None, scheduler: Any = None) -> ParsedFile:
    """A GT file as dask arrays (``timestamps``, ``track_ids``, ``avails`` (N, T), ``coords``
    (N, T, 2)): the header is checked and the rows are found now (a parallel scan, run on
    ``scheduler``); values are parsed when computed, a task per byte range. L5Kit's returns an
    iterator of dicts. ``scheduler``: where the tasks run (a ``distributed.Client`` or its address, ``"threads"``...;
    default: the active client, else local threads; ``job=`` is its old name, until the next release)."""
    f = scan(open_csv(csv_path, "gt", storage_options=storage_options), scheduler)
    return _to_dask(f, row_groups(f))


@where_keywords
def read_pred_csv(
    csv_path: str, max_modes: int = MAX_MODES, storage_options: dict | None = None, scheduler: Any = None
) -> ParsedFile:
    """A PRED file as dask arrays (``confs`` (N, M), ``coords`` (N, M, T, 2)); see
    :func:`~l5dask.evaluation.csvfiles.read_gt_csv`."""
    f = scan(open_csv(csv_path, "pred", max_modes, storage_options), scheduler)
    return _to_dask(f, row_groups(f))


# --- the writers -------------------------------------------------------------------------------
# Rows are formatted as byte matrices: every cell of a column group gets a fixed-width slot, with
# a mask of the bytes it uses; the line is the slots side by side, the file the masked bytes in
# row-major order (one boolean take). No Python object per value.
_DIGITS = 20  # an int64 has at most 19 digits and a sign


def _digits(r: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Decimal digits of non-negative ints ``r`` right-aligned in ``width`` bytes, and how many
    are significant (at least 1)."""
    r = r.astype(np.uint64, copy=True)
    out = np.empty(r.shape + (width,), np.uint8)
    for i in range(width - 1, -1, -1):
        out[..., i] = (r % np.uint64(10)).astype(np.uint8) + 48
        r //= np.uint64(10)
    sig = width - np.argmax(out != 48, axis=-1)
    sig = np.where((out == 48).all(axis=-1), 1, sig)
    return out, sig


def _slots(chars: np.ndarray, used: np.ndarray, sep: int = 44) -> tuple[np.ndarray, np.ndarray]:
    """Cells (n, k, w) with the mask of their used bytes, each followed by a separator byte."""
    n, k, w = chars.shape
    c = np.empty((n, k, w + 1), np.uint8)
    c[..., :w] = chars
    c[..., w] = sep
    m = np.ones((n, k, w + 1), bool)
    m[..., :w] = used
    return c.reshape(n, k * (w + 1)), m.reshape(n, k * (w + 1))


def _int_cells(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``str()`` of integers (n, k), as slots."""
    v = values.astype(np.int64)
    neg = v < 0
    mag = np.where(neg, -(v + 1), v).astype(np.uint64) + neg.astype(np.uint64)  # |v| without overflow
    d, sig = _digits(mag, _DIGITS - 1)
    chars = np.concatenate([np.where(neg, 45, 32).astype(np.uint8)[..., None], d], axis=-1)
    pos = np.arange(_DIGITS)
    used = pos >= (_DIGITS - sig)[..., None]
    used[..., 0] = neg
    return _slots(chars, used)


def _str_cells(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``str()`` of each numpy scalar (what ``csv.DictWriter`` writes), by its distinct values."""
    if values.dtype.kind in "iu":
        return _int_cells(values)
    uniq, inverse = np.unique(values.reshape(-1), return_inverse=True)
    text = [str(u).encode() for u in uniq]
    w = max(len(t) for t in text)
    table = np.frombuffer(b"".join(t.ljust(w, b" ") for t in text), np.uint8).reshape(len(text), w)
    lengths = np.array([len(t) for t in text])
    inv = inverse.reshape(values.shape)
    return _slots(table[inv], np.arange(w) < lengths[inv][..., None])


def _f5_cells(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``f"{v:.5f}"`` of floats (n, k), as slots. Exact: a value whose rounding is within reach
    of a tie (or too large for the integer path) is printed by Python itself."""
    v = np.asarray(values, np.float64)
    neg = np.signbit(v)
    a = np.abs(v)
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = a * 1e5
        frac = scaled - np.floor(scaled)
        python = ~(a < 1e9) | (np.abs(frac - 0.5) <= 8 * np.spacing(scaled) + 1e-9)
    r = np.rint(np.where(python, 0.0, scaled)).astype(np.uint64)
    d, sig = _digits(r, 14)  # 9 integer digits, 5 decimals
    nint = np.maximum(sig - 5, 1)
    w = 16
    chars = np.empty(v.shape + (w,), np.uint8)
    chars[..., 0] = np.where(neg, 45, 32)
    chars[..., 1:10] = d[..., :9]
    chars[..., 10] = 46
    chars[..., 11:] = d[..., 9:]
    pos = np.arange(w)
    used = (pos >= 10 - nint[..., None]) & (pos >= 1)
    used[..., 0] = neg
    if python.any():
        for idx in zip(*np.nonzero(python)):
            t = f"{v[idx]:.5f}".encode()
            if len(t) > w:
                raise _TooWide
            chars[idx] = np.frombuffer(t.rjust(w, b" "), np.uint8)
            used[idx] = pos >= w - len(t)
    return _slots(chars, used)


class _TooWide(Exception):
    """A value too wide for its slot (|v| >= 1e10): the block is printed by Python."""


def _lines(groups: list[tuple[np.ndarray, np.ndarray]]) -> bytes:
    """Slots side by side, the last separator of each line made ``\\r\\n``: the file's bytes."""
    chars = np.concatenate([g[0] for g in groups] + [np.full((len(groups[0][0]), 1), 10, np.uint8)], axis=1)
    used = np.concatenate([g[1] for g in groups] + [np.ones((len(groups[0][0]), 1), bool)], axis=1)
    chars[:, -2] = 13
    return chars[used].tobytes()


def _python_lines(rows) -> bytes:
    return b"".join((",".join(r) + "\r\n").encode() for r in rows)


def gt_bytes(timestamps, track_ids, coords, avails) -> bytes:
    """GT rows formatted as L5Kit's ``write_gt_csv`` writes them (no header)."""
    n, t, _ = coords.shape
    if n == 0:
        return b""
    ts, tid, av = np.asarray(timestamps), np.asarray(track_ids), np.asarray(avails).reshape(n, t)
    xy = np.asarray(coords, np.float64).reshape(n, 2 * t)
    try:
        return _lines([_str_cells(ts[:, None]), _str_cells(tid[:, None]), _str_cells(av), _f5_cells(xy)])
    except _TooWide:
        return _python_lines(
            [str(a), str(b)] + [str(x) for x in c] + [f"{x:.5f}" for x in d] for a, b, c, d in zip(ts, tid, av, xy)
        )


def pred_bytes(timestamps, track_ids, coords, confs, max_modes: int = MAX_MODES) -> bytes:
    """PRED rows (coords (n, modes, T, 2), confs (n, modes)) padded to ``max_modes`` as L5Kit does."""
    n, modes, t, _ = coords.shape
    if n == 0:
        return b""
    coords_p = np.zeros((n, max_modes, t, 2), dtype=coords.dtype)
    coords_p[:, :modes] = coords
    confs_p = np.zeros((n, max_modes), dtype=confs.dtype)
    confs_p[:, :modes] = confs
    ts, tid = np.asarray(timestamps), np.asarray(track_ids)
    xy = coords_p.astype(np.float64, copy=False).reshape(n, max_modes * t * 2)
    try:
        return _lines([_str_cells(ts[:, None]), _str_cells(tid[:, None]), _str_cells(confs_p), _f5_cells(xy)])
    except _TooWide:
        return _python_lines(
            [str(a), str(b)] + [str(x) for x in c] + [f"{x:.5f}" for x in d] for a, b, c, d in zip(ts, tid, confs_p, xy)
        )


#: Rows per formatting task of the writers.
WRITE_ROWS = 10_000
#: Formatting tasks held at once (their bytes wait in memory to be appended in order).
WRITE_WINDOW = 8


def write_ordered(path: str, header: list[str], parts, storage_options: dict | None = None) -> None:
    """Write a CSV atomically: ``header``, then the bytes that the iterable ``parts`` yields, in
    order (a caller computes them in windows of parallel tasks, so only a window is in memory)."""

    def write(tmp: str) -> None:
        with open(tmp, "wb") as out:
            out.write((",".join(header) + "\r\n").encode())
            for b in parts:
                out.write(b)

    atomic_write(path, write, storage_options)


def windows(job: Any, func, calls: list[tuple], name: str, window: int | None = None):
    """``func(*call)`` of each call, yielded in order, computed ``window`` tasks at a time (calls
    may hold dask arrays' slices: :meth:`~l5dask.core.engine.Job.map` passes their values)."""
    window = window or max(WRITE_WINDOW, 2 * job.threads)
    for w in range(0, len(calls), window):
        yield from job.map(func, calls[w : w + window], name=name)


def _write_blocks(
    path: str, header: list[str], func, arrays: list[Any], extra: tuple, scheduler: Any, storage_options: dict | None
) -> None:
    """Format row blocks of ``arrays`` (numpy or dask) in parallel tasks, appended in order, atomically."""
    import dask.array as da

    check_writable(path, storage_options)
    job = Job.of(scheduler)
    n = arrays[0].shape[0]
    bounds = [(lo, min(lo + WRITE_ROWS, n)) for lo in range(0, n, WRITE_ROWS)]
    lazy = any(isinstance(a, da.Array) for a in arrays)  # (a window of 8 whatever the threads, as before)
    calls = [tuple(a[lo:hi] for a in arrays) + extra for lo, hi in bounds]
    parts = windows(job, func, calls, "l5-csv-format", WRITE_WINDOW if lazy else None)
    write_ordered(path, header, parts, storage_options)


def _arrays(*xs):
    """Each of ``xs`` as an array: numpy's and dask's as they are, anything else (a list, a tuple)
    through ``np.asarray``."""
    return tuple(x if hasattr(x, "shape") else np.asarray(x) for x in xs)


def _check_rows(timestamps, track_ids, n: int) -> None:
    if timestamps.shape != (n,) or track_ids.shape != (n,):
        raise CSVError(f"timestamps {timestamps.shape} and track_ids {track_ids.shape} must both be ({n},)")


@where_keywords
def write_gt_csv(
    csv_path: str, timestamps, track_ids, coords, avails, storage_options: dict | None = None, scheduler: Any = None
) -> None:
    """Write a GT file with exactly L5Kit's bytes (``write_gt_csv``), from numpy or dask arrays,
    in parallel, atomically. ``coords`` (N, T, 2), ``avails`` (N, T). ``scheduler``: where the tasks run (a ``distributed.Client`` or its address, ``"threads"``...;
    default: the active client, else local threads; ``job=`` is its old name, until the next release)."""
    timestamps, track_ids, coords, avails = _arrays(timestamps, track_ids, coords, avails)
    if len(coords.shape) != 3 or coords.shape[2] != 2:
        raise CSVError(f"coords must be (examples, future_len, 2), got {coords.shape}")
    n, t, _ = coords.shape
    _check_rows(timestamps, track_ids, n)
    if avails.shape != (n, t):
        raise CSVError(f"avails must be {(n, t)}, got {avails.shape}")
    _write_blocks(
        csv_path, gt_header(t), gt_bytes, [timestamps, track_ids, coords, avails], (), scheduler, storage_options
    )


@where_keywords
def write_pred_csv(
    csv_path: str,
    timestamps,
    track_ids,
    coords,
    confs=None,
    max_modes: int = MAX_MODES,
    storage_options: dict | None = None,
    scheduler: Any = None,
) -> None:
    """Write a PRED file with exactly L5Kit's bytes (``write_pred_csv``): ``coords`` (N, modes, T, 2)
    with ``confs`` (N, modes) summing to 1 per row, or single-mode ``coords`` (N, T, 2) and no confs.
    ``scheduler``: where the tasks run (a ``distributed.Client`` or its address, ``"threads"``...;
    default: the active client, else local threads; ``job=`` is its old name, until the next release)."""
    import dask.array as da

    timestamps, track_ids, coords = _arrays(timestamps, track_ids, coords)
    if confs is not None:
        (confs,) = _arrays(confs)
    if len(coords.shape) == 3:
        if confs is not None:
            raise CSVError("single-mode coords (N, T, 2) take no confs (L5Kit writes confidence 1)")
        coords = coords[:, None] if isinstance(coords, da.Array) else np.expand_dims(coords, 1)
        confs = (
            da.ones((coords.shape[0], 1), chunks=(coords.chunks[0], 1))
            if isinstance(coords, da.Array)
            else np.ones((len(coords), 1))
        )
    if len(coords.shape) != 4 or coords.shape[3] != 2:
        raise CSVError(f"coords must be (examples, modes, future_len, 2), got {coords.shape}")
    n, modes, t, _ = coords.shape
    _check_rows(timestamps, track_ids, n)
    if confs is None or confs.shape != (n, modes):
        raise CSVError(f"confs must be {(n, modes)}, got {None if confs is None else confs.shape}")
    if modes > max_modes:
        raise CSVError(f"{modes} modes, more than max_modes {max_modes}")
    if not isinstance(confs, da.Array):
        sums = np.sum(confs, axis=-1)
        if not np.allclose(sums, 1.0):
            i = int(np.flatnonzero(~np.isclose(sums, 1.0))[0])
            raise CSVError(f"confs of row {i} sum to {float(sums[i])!r}, not 1")
        if (np.asarray(confs) < 0).any():
            i, j = (int(k[0]) for k in np.nonzero(np.asarray(confs) < 0))
            raise CSVError(f"confs of row {i}: {float(confs[i, j])!r} is negative (a confidence is in [0, 1])")
    _write_blocks(
        csv_path,
        pred_header(t, max_modes),
        pred_bytes,
        [timestamps, track_ids, coords, confs],
        (max_modes,),
        scheduler,
        storage_options,
    )
