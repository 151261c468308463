"""Detection files as columns of boxes: the SDK's JSON list and the competition's CSV, read whole
or, for JSON at scale, in blocks of whole boxes that tasks read on their own.

Whole (:func:`read_boxes`): every box parsed at once (DuckDB's JSON reader beside the compiled type
scan; Python's ``csv`` for the competition's CSV), checked, and any fault named in one line (the
file, the row or line, the field).

In blocks (:class:`Blocks`): a JSON file is cut at *seams*, a ``}``, a comma and a ``{`` with only
whitespace between, found by a compiled scan (``json_seams`` in ``_jsonscan.pyx``) from
each block's nominal offset, so that each task finds its own two ends. A seam is a guess, not a
parse: one inside a string cuts a box in two. But each block is parsed strictly on its own
(``[`` + block + ``]``), and blocks that each parse as a list of values, joined by the commas of
their seams, are the whole file's list (JSON's grammar composes): a wrong cut fails a parse, never
gives another answer. The ground truth's index (:class:`GroundIndex`) guesses each box's
``sample_token`` the same way (the one ``"sample_token":`` string of its segment) and keeps only
runs of boxes of one sample (bytes, count); whoever parses a run checks every box's token against
the guess, and every run is parsed once. Any fault, or any guess that does not hold, sends the
caller back to the whole read, which names the fault.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from l5dask.core import config
from l5dask.core.lazy import compiled
from l5dask.core.store import file_store, resolved_options
from l5dask.errors import FormatError
from l5dask.perception import joins, tables
from l5dask.perception.geometry import check_values

_compiled = compiled("l5dask.perception._jsonscan")

_JSON_GT = {
    "sample_token": "VARCHAR",
    "translation": tables.VEC,
    "size": tables.VEC,
    "rotation": tables.VEC,
    "name": "VARCHAR",
}
_JSON_PRED = {**_JSON_GT, "score": "DOUBLE"}


@dataclass
class Boxes:
    """Boxes of one file (or dataset), as columns: ``sample`` codes into ``samples`` (tokens),
    ``cls`` codes into ``classes`` (names), ``xyz``, ``size`` (width, length, height), ``rotation``
    (w, x, y, z), ``score`` (predictions), ``row`` (each box's JSON index or CSV line, for messages)."""

    where: str
    samples: np.ndarray
    sample: np.ndarray
    classes: np.ndarray
    cls: np.ndarray
    xyz: np.ndarray
    size: np.ndarray
    rotation: np.ndarray
    score: np.ndarray | None
    row: np.ndarray
    row_kind: str = "row"
    #: every sample the source lists (a CSV's rows, a dataset's samples); None: only those with boxes
    universe: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.sample)

    def at(self, i: int) -> str:
        return f"{self.where}: {self.row_kind} {int(self.row[i])}"


# --- reading -----------------------------------------------------------------------------------
def read_boxes(path: str, kind: str, storage_options: dict | None = None) -> Boxes:
    """The boxes of a detection file: the SDK's JSON list (``sample_token``, ``translation``,
    ``size``, ``rotation``, ``name``, and ``score`` for predictions) or the competition's CSV
    (``Id,PredictionString``; ``score x y z width length height yaw name`` a box, no score in
    ground truth). ``kind``: ``"gt"`` or ``"pred"``. Anything else is a one-line error naming the
    file, the row (JSON index or CSV line) and the field."""
    store, key = file_store(path, storage_options)
    if store.local:  # parsed in place (DuckDB reads the file; the type scan maps it)
        local = store.path(key)
        with open(local, "rb") as f:
            head = f.read(4096).lstrip()[:1]
        if head == b"[":
            return _from_json(local, path, kind)
        _not_an_object(head, path)
    data = store.get(key, what="the detection file")
    if data.lstrip()[:1] == b"[":
        return _from_json(data, path, kind)
    _not_an_object(data.lstrip()[:1], path)
    return _from_csv(data, path, kind)


def _not_an_object(head: bytes, where: str) -> None:
    """Refuse a file that opens a JSON object (no CSV header starts with ``{``): it was read as a
    CSV, and said that its header was not ``Id,PredictionString``."""
    if head == b"{":
        raise FormatError(
            f"{where}: a JSON object, not the SDK's JSON list of boxes ([{{...}}, ...]) nor the competition's "
            "CSV (Id,PredictionString)"
        )


def _codes(values: Any) -> tuple[np.ndarray, np.ndarray]:
    """A string column as (its distinct values, sorted; each row's code into them)."""
    import pyarrow.compute as pc

    enc = pc.dictionary_encode(values).combine_chunks()
    names = np.asarray(enc.dictionary.to_pylist(), dtype=object)
    order = np.argsort(names, kind="stable")
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    return names[order], rank[np.asarray(enc.indices, np.int64)] if len(names) else np.zeros(len(values), np.int64)


def _from_json(data: bytes | str, where: str, kind: str, threads: int | None = None) -> Boxes:
    import os

    import pyarrow.compute as pc

    columns = _JSON_PRED if kind == "pred" else _JSON_GT
    table = tables.parse(data, "detection", where, columns, threads=threads or os.cpu_count() or 1)
    n = table.num_rows
    for col in columns:
        values = table.column(col)
        if values.null_count:
            row = int(np.flatnonzero(np.asarray(values.is_null()))[0])
            raise FormatError(f"{where}: row {row}: no {col} (a {'prediction' if kind == 'pred' else 'box'} needs one)")
    vec = {}
    for col, want in (("translation", 3), ("size", 3), ("rotation", 4)):
        values = table.column(col)
        lengths = np.asarray(pc.list_value_length(values).fill_null(-1))
        bad = np.flatnonzero(lengths != want)
        if len(bad):
            raise FormatError(f"{where}: row {int(bad[0])}: {col} has {lengths[bad[0]]} numbers, expected {want}")
        flat = pc.list_flatten(values)
        if flat.null_count:
            row = int(np.flatnonzero(np.asarray(flat.is_null()))[0] // want)
            raise FormatError(f"{where}: row {row}: {col} holds a null")
        vec[col] = np.asarray(flat, np.float64).copy().reshape(n, want)  # (a view would keep the whole parse)
    samples, sample = _codes(table.column("sample_token"))
    classes, cls = _codes(table.column("name"))
    score = np.asarray(table.column("score"), np.float64).copy() if kind == "pred" else None
    boxes = Boxes(
        where,
        samples,
        sample,
        classes,
        cls,
        vec["translation"],
        vec["size"],
        vec["rotation"],
        score,
        np.arange(n, dtype=np.int64),
    )
    check_boxes(boxes)
    return boxes


def _from_csv(data: bytes, where: str, kind: str) -> Boxes:
    import csv

    per = 9 if kind == "pred" else 8
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not text.strip():  # (an empty .json as much as an empty .csv: both forms named)
        raise FormatError(
            f"{where}: empty: expected the SDK's JSON list of boxes ([{{...}}, ...]) or the competition's "
            "CSV (Id,PredictionString)"
        )
    ids, counts, tokens, lines = [], [], [], []
    limit = csv.field_size_limit()
    csv.field_size_limit(2**31 - 1)  # (a sample's PredictionString may pass csv's 128 KB)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        try:
            header = next(reader)
        except StopIteration:
            raise FormatError(f"{where}: empty (expected the header Id,PredictionString)") from None
        if [h.strip() for h in header] != ["Id", "PredictionString"]:
            raise FormatError(f"{where}: line 1: the header is {','.join(header)[:60]!r}, expected Id,PredictionString")
        for row in reader:
            line = reader.line_num
            if not row:
                continue
            if len(row) != 2:
                raise FormatError(f"{where}: line {line}: {len(row)} fields, expected 2 (Id,PredictionString)")
            parts = row[1].split()
            if len(parts) % per:
                raise FormatError(
                    f"{where}: line {line}: PredictionString has {len(parts)} tokens, not a multiple of {per} "
                    f"({'score x y z width length height yaw class' if per == 9 else 'x y z width length height yaw class'})"
                )
            ids.append(row[0].strip())
            counts.append(len(parts) // per)
            tokens += parts
            lines.append(line)
    except csv.Error as exc:
        raise FormatError(f"{where}: line {reader.line_num}: not a CSV row ({exc})") from None
    finally:
        csv.field_size_limit(limit)
    universe = np.asarray(ids, dtype=object)
    dup = _first_duplicate(universe)
    if dup is not None:
        raise FormatError(f"{where}: the sample {dup} has two rows")
    counts_a = np.asarray(counts, np.int64)
    n = int(counts_a.sum())
    grid = np.asarray(tokens, dtype=object).reshape(n, per) if n else np.zeros((0, per), object)
    numbers = np.empty((n, per - 1), np.float64)
    names_of = ("score", "x", "y", "z", "width", "length", "height", "yaw")[9 - per :]
    box_line = np.repeat(np.asarray(lines, np.int64), counts_a)
    for j in range(per - 1):
        try:
            numbers[:, j] = np.asarray(grid[:, j], dtype=np.float64)
        except ValueError:
            for i in range(n):
                try:
                    float(grid[i, j])
                except ValueError:
                    raise FormatError(
                        f"{where}: line {box_line[i]}: box {i - _first_of_line(box_line, i)}: "
                        f"{names_of[j]} is {str(grid[i, j])[:30]!r}, not a number"
                    ) from None
    off = 1 if per == 9 else 0
    yaw = numbers[:, off + 6]
    samples, sample = (
        np.unique(np.repeat(universe, counts_a), return_inverse=True) if n else (universe[:0], np.zeros(0, np.int64))
    )
    classes, cls = (
        np.unique(grid[:, per - 1].astype(object), return_inverse=True) if n else (universe[:0], np.zeros(0, np.int64))
    )
    boxes = Boxes(
        where,
        samples,
        sample.astype(np.int64),
        classes,
        cls.astype(np.int64),
        numbers[:, off : off + 3].copy(),
        numbers[:, off + 3 : off + 6].copy(),
        yaw_quaternions(yaw),
        numbers[:, 0].copy() if per == 9 else None,
        box_line,
        "line",
        universe,
    )
    check_boxes(boxes, yaw)
    return boxes


def _first_of_line(box_line: np.ndarray, i: int) -> int:
    return int(np.searchsorted(box_line, box_line[i], side="left"))


def _first_duplicate(tokens: np.ndarray) -> str | None:
    if len(tokens) == 0:
        return None
    uniq, counts = np.unique(tokens, return_counts=True)
    return str(uniq[np.flatnonzero(counts > 1)[0]]) if (counts > 1).any() else None


def yaw_quaternions(yaw: np.ndarray) -> np.ndarray:
    """``Quaternion(axis=[0, 0, 1], angle=yaw).elements`` of each yaw, as the SDK's
    ``kaggle2nuscenes`` converts the competition's CSV (pyquaternion's own arithmetic)."""
    out = np.zeros((len(yaw), 4))
    for i, a in enumerate(yaw.tolist()):
        if not math.isfinite(a):  # (refused by check_boxes, which names the box; sin(inf) raises)
            out[i] = math.nan
            continue
        theta = a / 2.0
        s = math.sin(theta)
        out[i] = (math.cos(theta), 0.0 * s, 0.0 * s, 1.0 * s)
    return out


def check_boxes(b: Boxes, yaw: np.ndarray | None = None) -> None:
    """Finite numbers, positive sizes, rotations of norm not 0, scores in [0, 1], names present:
    the first bad box named."""
    if yaw is None:
        check_values(b.xyz, b.size, b.rotation, b.at)
    else:
        check_values(b.xyz, b.size, yaw[:, None], b.at, "yaw")
    if b.score is not None:
        bad = ~np.isfinite(b.score)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise FormatError(f"{b.at(i)}: score is not finite ({[float(b.score[i])]})")
        bad = (b.score < 0) | (b.score > 1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise FormatError(f"{b.at(i)}: score {float(b.score[i])!r} is outside [0, 1]")
    if "" in b.classes.tolist():
        i = int(np.flatnonzero(b.cls == b.classes.tolist().index(""))[0])
        raise FormatError(f"{b.at(i)}: the class name is empty")
    nul = [k for k, c in enumerate(b.classes.tolist()) if "\x00" in str(c)]
    if nul:  # (numpy's fixed-width strings drop trailing NULs: 'a\x00' and 'a' would be one class)
        i = int(np.flatnonzero(np.isin(b.cls, nul))[0])
        raise FormatError(f"{b.at(i)}: the class name {str(b.classes[b.cls[i]])!r} holds a NUL character")


def boxes_of_dataset(pds) -> tuple[Boxes, dict[str, np.ndarray]]:
    """The ground truth of a perception dataset (its ``sample_annotation`` rows, named by their
    instances' categories, as the SDK's loader gives them), every sample of the dataset as the
    samples it lists, and each sample's ego position (its key-frame ``LIDAR_TOP`` pose)."""
    ann = pds.table("sample_annotation")
    tokens = np.asarray(pds.table("sample").strings("token"), dtype=object)
    frame = pds.frame("sample_annotation", ["sample", "category_name"])
    sample = frame["sample"].to_numpy(np.int64)
    boxes = Boxes(
        f"{pds.url} (sample_annotation.json)",
        tokens,
        sample,
        *np.unique(frame["category_name"].to_numpy(object), return_inverse=True),
        ann.vectors("translation").astype(np.float64),
        ann.vectors("size").astype(np.float64),
        ann.vectors("rotation").astype(np.float64),
        None,
        np.arange(len(sample), dtype=np.int64),
        universe=tokens,
    )
    check_boxes(boxes)
    _, ego = joins.ego_of_samples(pds)
    return boxes, {"tokens": tokens, "ego": ego}


def take(b: Boxes, idx: np.ndarray) -> Boxes:
    """The boxes ``idx`` of ``b`` (indices, in that order, or a mask), same samples and classes."""
    return Boxes(
        b.where,
        b.samples,
        b.sample[idx],
        b.classes,
        b.cls[idx],
        b.xyz[idx],
        b.size[idx],
        b.rotation[idx],
        None if b.score is None else b.score[idx],
        b.row[idx],
        b.row_kind,
        b.universe,
    )


def concat(parts: list[Boxes], where: str) -> Boxes:
    """Boxes of several reads as one (their samples and classes in one code space, rows kept)."""
    parts = [b for b in parts if len(b)]
    if not parts:
        z = np.zeros(0, np.int64)
        return Boxes(
            where,
            np.zeros(0, object),
            z,
            np.zeros(0, object),
            z,
            np.zeros((0, 3)),
            np.zeros((0, 3)),
            np.zeros((0, 4)),
            None,
            z,
        )
    samples = np.unique(np.concatenate([b.samples for b in parts]))
    classes = np.unique(np.concatenate([b.classes for b in parts]))
    scores = [b.score for b in parts]
    return Boxes(
        where,
        samples,
        np.concatenate([np.searchsorted(samples, b.samples)[b.sample] for b in parts]),
        classes,
        np.concatenate([np.searchsorted(classes, b.classes)[b.cls] for b in parts]),
        np.concatenate([b.xyz for b in parts]),
        np.concatenate([b.size for b in parts]),
        np.concatenate([b.rotation for b in parts]),
        None if any(s is None for s in scores) else np.concatenate(scores),  # type: ignore[arg-type]
        np.concatenate([b.row for b in parts]),
    )


# --- JSON in blocks ------------------------------------------------------------------------------
MAX_BLOCKS = 1024
_WS = b" \t\r\n"


class Unsure(Exception):
    """A block or a guess of the index that does not hold (a seam inside a string, a box of another
    sample than guessed): read the files whole instead."""


@dataclass(frozen=True)
class Blocks:
    """A JSON detection file (a list of boxes) cut into ``n`` blocks of whole boxes.

    Block ``k`` runs from the seam at or after its nominal offset ``first + k * block_bytes`` to the
    next block's; block 0 starts after the ``[``, the last ends at the closing ``]`` (``stop``)."""

    path: str
    storage_options: dict | None
    kind: str
    first: int
    stop: int
    block_bytes: int

    @property
    def n(self) -> int:
        return max(1, -(-(self.stop - self.first) // self.block_bytes))

    def nominal(self, k: int) -> int:
        return self.stop if k >= self.n else self.first + k * self.block_bytes

    def store(self) -> tuple[Any, str]:
        return file_store(self.path, self.storage_options)


def plan(path: str, kind: str, storage_options: dict | None = None, block_bytes: int | None = None) -> Blocks | None:
    """The blocks of a JSON detection file; ``None`` when it is not a list (``[`` ... ``]``): read it
    whole (a CSV, or a fault the whole read names)."""
    block_bytes = int(block_bytes or config.get("detection.block-bytes"))
    store, key = file_store(path, storage_options)
    size = store.size(key)
    head = store.get(key, start=0, end=min(size, 4096), what="the detection file")
    h = head.lstrip(_WS)
    if not h.startswith(b"["):
        return None
    tail = store.get(key, start=max(0, size - 4096), what="the detection file")
    t = tail.rstrip(_WS)
    first, stop = len(head) - len(h) + 1, size - (len(tail) - len(t)) - 1
    if not t.endswith(b"]") or stop < first:
        return None
    # at least 64 bytes a block, and at most MAX_BLOCKS blocks (a task each)
    options = resolved_options(path, storage_options)  # (they travel with the blocks to the tasks)
    return Blocks(path, options, kind, first, stop, max(64, block_bytes, -(-(stop - first) // MAX_BLOCKS)))


def _start(bl: Blocks, store: Any, key: str, k: int) -> int | None:
    """Where block ``k`` starts: the ``{`` of the first seam whose ``}`` is at its nominal offset or
    after; ``None`` when that ``}`` is not before the next block's nominal offset (``k`` is empty:
    its seam starts a later block)."""
    if k == 0:
        return bl.first
    at, limit = bl.nominal(k), bl.nominal(k + 1) - bl.nominal(k)
    look = 256
    while at < bl.stop:
        end = min(bl.stop, at + limit + look)
        buf = store.get(key, start=at, end=end, what="the detection file")
        ends, starts, undecided = _compiled.json_seams(np.frombuffer(buf, np.uint8))
        if len(starts):
            return at + int(starts[0]) if ends[0] - 1 < limit else None
        if end >= bl.stop or undecided < 0 or undecided >= limit:
            return None
        look *= 4  # a "}" before the limit, whitespace after it to the end of what was read
    return None


def _end(bl: Blocks, store: Any, key: str, k: int) -> int:
    """Where block ``k`` ends: the ``{`` of the first seam whose ``}`` is at the next block's
    nominal offset or after (the start of the next block that is not empty), or the end."""
    if k + 1 >= bl.n:
        return bl.stop
    at = bl.nominal(k + 1)
    look = 256
    while True:
        end = min(bl.stop, at + look)
        buf = store.get(key, start=at, end=end, what="the detection file")
        _, starts, _ = _compiled.json_seams(np.frombuffer(buf, np.uint8))
        if len(starts):
            return at + int(starts[0])
        if end >= bl.stop:
            return bl.stop
        look *= 4


def block_text(bl: Blocks, k: int) -> tuple[memoryview, int]:
    """Block ``k``'s boxes (``b"{...}, ..., {...}"``, the seam after the last taken off) and the
    file offset of its first byte."""
    store, key = bl.store()
    lo = _start(bl, store, key, k)
    if lo is None:
        return memoryview(b""), bl.nominal(k)
    hi = _end(bl, store, key, k)
    if hi <= lo:
        return memoryview(b""), lo
    text = memoryview(store.get(key, start=lo, end=hi, what="the detection file"))
    end = _rstrip(text, len(text))
    if hi < bl.stop:  # cut at a seam: the block ends with "}", whitespace, ",", whitespace
        if end == 0 or text[end - 1] != 44:
            raise Unsure(f"{bl.path}: no comma before byte {hi}")
        end = _rstrip(text, end - 1)
    return text[:end], lo


def _rstrip(text: memoryview, end: int) -> int:
    """``end`` less the whitespace before it."""
    while end and text[end - 1] in _WS:
        end -= 1
    return end


def parse_text(parts: list, bl: Blocks) -> Boxes:
    """The boxes of a block's (or runs') text, the ``parts`` joined by commas, parsed strictly on
    one thread; any fault: Unsure. (DuckDB reads the list from a temporary file: from a Python
    buffer it holds the GIL while it reads, and two tasks' parses took turns.)"""
    import os
    import tempfile

    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    fd, path = tempfile.mkstemp(suffix=".json", prefix="l5dask-boxes-", dir=shm)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(b"[")
            for i, part in enumerate(parts):
                if i:
                    f.write(b",")
                f.write(part)
            f.write(b"]")
        return _from_json(path, bl.path, bl.kind, threads=1)
    except FormatError as exc:
        raise Unsure(str(exc)) from None
    finally:
        os.unlink(path)


def read_block(bl: Blocks, k: int) -> Boxes:
    """The boxes of block ``k`` (rows numbered within the block)."""
    return parse_text([block_text(bl, k)[0]], bl)


def _token_array(buf: np.ndarray, vs: np.ndarray, ve: np.ndarray) -> np.ndarray:
    """The byte strings ``buf[vs[i]:ve[i]]`` as a fixed-width bytes array (gathered, not sliced)."""
    lengths = ve - vs
    width = int(lengths.max()) if len(lengths) else 1
    cols = np.arange(max(width, 1))
    mat = np.zeros((len(vs), max(width, 1)), np.uint8)
    inside = cols[None, :] < lengths[:, None]
    mat[inside] = buf[(vs[:, None] + cols[None, :])[inside]]
    return mat.view(f"S{max(width, 1)}").ravel()


def encode_tokens(tokens: np.ndarray) -> np.ndarray:
    """Sample tokens (str) as the index keeps them: UTF-8 bytes, a fixed-width array."""
    return np.array([t.encode() for t in tokens.tolist()], dtype=bytes) if len(tokens) else np.zeros(0, "S1")


@dataclass
class Runs:
    """Runs of consecutive boxes of one sample: ``token`` (bytes), the file bytes ``[start, end)``,
    ``count`` boxes, and ``seg`` the ordinal of the run's first box in the file."""

    token: np.ndarray
    start: np.ndarray
    end: np.ndarray
    count: np.ndarray
    seg: np.ndarray

    def __len__(self) -> int:
        return len(self.token)

    def take(self, idx: np.ndarray) -> Runs:
        return Runs(self.token[idx], self.start[idx], self.end[idx], self.count[idx], self.seg[idx])


def index_block(bl: Blocks, k: int) -> Runs:
    """Block ``k``'s runs, guessed from its bytes (``seg`` numbered within the block)."""
    text, base = block_text(bl, k)
    buf = np.frombuffer(text, np.uint8)
    if not len(text):
        z = np.zeros(0, np.int64)
        return Runs(np.zeros(0, "S1"), z, z, z, z)
    ends, starts, _ = _compiled.json_seams(buf)
    seg_lo = np.concatenate([[0], starts]).astype(np.int64)
    seg_hi = np.concatenate([ends, [len(text)]]).astype(np.int64)
    vs, ve, bad = _compiled.json_key_spans(buf, seg_lo, seg_hi, b"sample_token")
    if bad >= 0:
        raise Unsure(f"{bl.path}: no plain sample_token in the box at byte {base + int(seg_lo[bad])}")
    tok = _token_array(buf, vs, ve)
    first = np.flatnonzero(np.concatenate([[True], tok[1:] != tok[:-1]]))
    last = np.concatenate([first[1:], [len(tok)]]) - 1
    return Runs(tok[first], base + seg_lo[first], base + seg_hi[last], last - first + 1, first.astype(np.int64))


@dataclass
class GroundIndex:
    """The ground truth's runs, by sample: ``tokens`` (sorted, bytes) and each one's runs
    ``runs[at[i]:at[i + 1]]`` in file order."""

    blocks: Blocks
    tokens: np.ndarray
    at: np.ndarray
    runs: Runs = field(repr=False)

    @classmethod
    def merge(cls, bl: Blocks, parts: list[Runs]) -> GroundIndex:
        base = np.cumsum([0] + [int(p.count.sum()) for p in parts])
        width = max([p.token.dtype.itemsize for p in parts] + [1])

        def cat(f: str) -> np.ndarray:
            return np.concatenate([getattr(p, f) for p in parts]) if parts else np.zeros(0, np.int64)

        runs = Runs(
            np.concatenate([p.token.astype(f"S{width}") for p in parts]) if parts else np.zeros(0, "S1"),
            cat("start"),
            cat("end"),
            cat("count"),
            np.concatenate([p.seg + b for p, b in zip(parts, base)]) if parts else np.zeros(0, np.int64),
        )
        order = np.argsort(runs.token, kind="stable")  # by sample, then file order
        runs = runs.take(order)
        tokens, first = np.unique(runs.token, return_index=True)
        return cls(bl, tokens, np.concatenate([first, [len(runs)]]).astype(np.int64), runs)

    def find(self, tokens: np.ndarray) -> np.ndarray:
        """Each token's sample in the index (-1: none)."""
        want = np.asarray(tokens, dtype=bytes) if len(tokens) else np.zeros(0, self.tokens.dtype)
        pos = np.searchsorted(self.tokens, want)  # (not cut to the index's width: 's10' is not 's1')
        ok = pos < len(self.tokens)
        ok[ok] = self.tokens[pos[ok]] == want[ok]
        return np.where(ok, pos, -1)

    def runs_of(self, samples: np.ndarray) -> Runs:
        """The runs of these samples (indices into ``tokens``), in file order."""
        samples = samples[samples >= 0]
        counts = self.at[samples + 1] - self.at[samples]
        idx = (
            np.repeat(self.at[samples], counts)
            + np.arange(int(counts.sum()))
            - np.repeat(np.cumsum(counts) - counts, counts)
        )
        picked = self.runs.take(idx.astype(np.int64))
        return picked.take(np.argsort(picked.seg, kind="stable"))

    def read(self, samples: np.ndarray) -> Boxes:
        """The ground-truth boxes of these samples, parsed from their runs (adjacent runs in one
        read) and checked against the guesses: Unsure if a box's sample is not its run's."""
        runs = self.runs_of(samples)
        bl = self.blocks
        if not len(runs):
            return concat([], bl.path)
        store, key = bl.store()
        cut = np.flatnonzero(runs.seg[1:] != runs.seg[:-1] + runs.count[:-1]) + 1
        lo, hi = np.concatenate([[0], cut]), np.concatenate([cut, [len(runs)]])
        texts = [
            store.get(key, start=int(runs.start[a]), end=int(runs.end[b - 1]), what="the detection file")
            for a, b in zip(lo, hi)
        ]
        got = parse_text(texts, bl)
        want = np.repeat(runs.token, runs.count)
        have = encode_tokens(got.samples)[got.sample] if len(got) else want[:0]
        width = f"S{max(have.dtype.itemsize, want.dtype.itemsize, 1)}"  # (never truncated to compare)
        if len(have) != len(want) or not (have.astype(width) == want.astype(width)).all():
            raise Unsure(f"{bl.path}: the boxes of a run are not the sample guessed")
        return got
