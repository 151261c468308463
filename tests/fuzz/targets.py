"""The fuzz targets: each entry point that parses untrusted bytes, with what it may answer.

A target takes one input (bytes) and returns normally when the input was accepted or refused
the way l5dask promises (one of its errors, with the same verdict as the reference where there is
one); anything else (another exception, a crash of the process, a differential disagreement)
is a finding. ``seeds()`` makes each target's starting inputs.
"""

from __future__ import annotations

import io
import json
import logging
import os
import tempfile
from collections.abc import Callable

import numpy as np
from numcodecs import Blosc

from l5dask.errors import L5DaskError
from l5dask.prediction import format as fmt
from l5dask.prediction.kernels import Gather
from tests.gather_reference import gather_verdict

# --- blosc chunks: the compiled gather against numcodecs -----------------------------------------------
SMALL = np.dtype([("a", "<u2"), ("p", "<f4", (2,)), ("b", "u1"), ("c", "i1")])  # 12 bytes: split streams
#: (dtype, chunk rows, rows holding data): L5Kit's agents, and small records (split streams, padding)
CONFIGS = [
    (fmt.AGENT_DTYPE, 2000, 2000),
    (fmt.AGENT_DTYPE, 2000, 700),
    (SMALL, 3000, 3000),
    (SMALL, 3000, 1000),
    (fmt.TL_FACE_DTYPE, 2000, 2000),
    (fmt.TL_FACE_DTYPE, 2000, 333),
]


def _plan(dtype: np.dtype) -> Gather:
    if dtype == fmt.AGENT_DTYPE:
        return Gather(
            dtype,
            [("centroid", (0,)), ("velocity", (1,)), ("track_id", ()), ("yaw", ())],
            ["label_probabilities"],
            "track_id",
        )
    if dtype == fmt.TL_FACE_DTYPE:  # (the report's faces: the statuses' argmax, the distinct face ids)
        return Gather(dtype, [], ["traffic_light_face_status"], "face_id")
    return Gather(dtype, [("a", ()), ("p", (1,)), ("b", ()), ("c", ())], ["p"], "p")


def blosc(data: bytes) -> None:
    """First byte: the configuration; the rest: one chunk. The compiled gather is run unchecked
    (it must be safe on its own); numcodecs only on chunks the header rule accepts (c-blosc reads
    past the end of others). Gather status 0 must mean numcodecs decodes the same numbers, -1
    that numcodecs refuses; every path through :class:`~l5dask.prediction.reading.Encoded` says ChunkError."""
    if not data:
        return
    dtype, chunk_rows, rows = CONFIGS[data[0] % len(CONFIGS)]
    raw = data[1:]
    gather_verdict(_plan(dtype), raw, chunk_rows, rows)


def _blosc_seeds() -> list[bytes]:
    rng = np.random.default_rng(0)
    out = []
    for i, (dtype, chunk_rows, rows) in enumerate(CONFIGS):
        rec = np.zeros(chunk_rows, dtype)
        for name in dtype.names:
            sub = dtype.fields[name][0]
            shape = (chunk_rows, *sub.shape)
            rec[name] = (rng.normal(0, 3, shape) if sub.base.kind == "f" else rng.integers(0, 5, shape)).astype(
                sub.base
            )
        rec[rows:] = np.zeros(1, dtype)
        for codec in (
            Blosc("lz4", 5, Blosc.SHUFFLE, 0),
            Blosc("lz4", 5, Blosc.SHUFFLE, 4096),
            Blosc("lz4", 1, Blosc.NOSHUFFLE, 0),
            Blosc("zstd", 3, Blosc.SHUFFLE, 0),
        ):
            out.append(bytes([i]) + codec.encode(rec))
    return out


# --- part of a blosc chunk: read_chunk_rows against the whole chunk decoded ----------------------------
#: (dtype, chunk rows, rows holding data, chunk index): L5Kit's four records, small ones (split
#: streams), a short last chunk, a chunk past the first (its rows numbered from its start)
PARTIAL_CONFIGS = [
    (fmt.AGENT_DTYPE, 2000, 2000, 0),
    (fmt.AGENT_DTYPE, 2000, 700, 1),
    (fmt.FRAME_DTYPE, 1000, 1000, 2),
    (fmt.SCENE_DTYPE, 500, 77, 0),
    (SMALL, 3000, 1000, 0),
    (fmt.TL_FACE_DTYPE, 2000, 333, 1),
]


def partial_ranges(selector: int, rows: int, start: int) -> list[tuple[int, int]]:
    """The sorted row ranges (array rows) ``selector`` (a byte) picks in a chunk whose ``rows``
    rows holding data start at ``start``: its first row, its last rows (the short last block
    alone), or one to three ranges anywhere."""
    import random

    rng = random.Random(selector)
    mode = rng.randrange(4)
    if mode == 0:
        cuts = [0, 1]
    elif mode == 1:
        cuts = [max(0, rows - rng.choice([1, 3, 40])), rows]
    else:
        cuts = sorted(rng.sample(range(rows + 1), 2 * rng.randint(1, 3)))
    return [(start + a, start + b) for a, b in zip(cuts[::2], cuts[1::2])]


def _partial_case(data: bytes) -> tuple[bytes, fmt.ArrayMeta, int, list[tuple[int, int]]]:
    dtype, chunk_rows, rows, index = PARTIAL_CONFIGS[data[0] % len(PARTIAL_CONFIGS)]
    meta = fmt.ArrayMeta("arr", dtype, index * chunk_rows + rows, chunk_rows)
    return data[1:], meta, index, partial_ranges(data[0], rows, index * chunk_rows)


def chunk_rows(data: bytes) -> None:
    """First byte: the configuration and the row ranges; the rest: one stored chunk (damaged,
    truncated, random). ``read_chunk_rows`` refuses it in one line of l5dask's errors, or reads
    rows of the ranges' lengths, and where the whole chunk decodes (the one rule, numcodecs),
    exactly its rows (``tests/partial_reference.py``)."""
    from tests.partial_reference import partial_verdict

    if not data:
        return
    partial_verdict(*_partial_case(data))


def chunk_rows_gather(data: bytes) -> None:
    """As :func:`chunk_rows`, the columns gathered straight from the blocks read (a restricted
    dataset's pass, :class:`~l5dask.prediction.scenes.ViewChunk`): refused in one line, or where
    the whole chunk decodes, the numbers, argmaxes, maxima, distinct values and codes of its rows
    (``tests/partial_reference.py``)."""
    from tests.partial_reference import partial_gather_verdict, plan_for

    if not data:
        return
    raw, meta, index, ranges = _partial_case(data)
    names = fmt.names_of(meta.dtype)
    partial_gather_verdict(raw, meta, index, ranges, plan_for(meta.dtype, names[data[0] % len(names)]))


def chunk_read_part(data: bytes) -> None:
    """As :func:`chunk_rows`, the chunk's reads made at once by the compiled reader
    (``l5dask.core._pread.read_part``: open, header, its own plan of the blocks from the header,
    the last byte, close) held to the Python path's reads one at a time: the same rows or the same
    one-line refusal, each piece read the file's bytes at its place, a sound chunk's reads exactly
    the Python path's. Through the page cache or around it, cold or cached, by the input's length
    (``tests/partial_reference.py``)."""
    from tests.partial_reference import compiled_read_verdict

    if not data:
        return
    raw, meta, index, ranges = _partial_case(data)
    compiled_read_verdict(raw, meta, index, ranges, direct=bool(len(raw) & 1), cold=bool(len(raw) & 2))


def _partial_seeds() -> list[bytes]:
    rng = np.random.default_rng(2)
    out = []
    for i, (dtype, chunk_rows, rows, _) in enumerate(PARTIAL_CONFIGS):
        rec = np.zeros(chunk_rows, dtype)
        rec.view(np.uint8)[:] = rng.integers(0, 4, rec.nbytes, dtype=np.uint8)  # (compressible)
        rec[rows:] = np.zeros(1, dtype)
        for j, codec in enumerate(
            (
                Blosc("lz4", 5, Blosc.SHUFFLE, 0),
                Blosc("lz4", 5, Blosc.SHUFFLE, 2048),  # (more than 64 blocks: their starts read again)
                Blosc("zstd", 3, Blosc.BITSHUFFLE, 8192),
                Blosc("blosclz", 1, Blosc.NOSHUFFLE, 4096),
                Blosc("lz4", 0, Blosc.NOSHUFFLE, 0),  # (memcpyed: the rows' bytes read in place)
            )
        ):
            out.append(bytes([i + len(PARTIAL_CONFIGS) * (7 * j % 41)]) + codec.encode(rec))
    return out


# --- metadata ------------------------------------------------------------------------------------------
def _little_endian(dtype: np.dtype) -> None:
    """Every number of an accepted dtype is read in the byte order the compiled readers read."""
    for name in fmt.names_of(dtype):
        base = fmt.fields_of(dtype)[name][0].base
        assert base.str[0] in "<|", f"field {name!r} of dtype {base.str} accepted"


def zarray(data: bytes) -> None:
    try:
        meta = fmt.parse_zarray("agents", data, "fuzz")
    except L5DaskError:
        return
    assert 0 < meta.chunk_nbytes <= fmt.MAX_CHUNK_NBYTES and meta.nchunks <= fmt.MAX_CHUNKS
    _little_endian(meta.dtype)


def zarray_nd(data: bytes) -> None:
    try:
        meta = fmt.parse_nd_zarray("agents_mask/0.5", data, "fuzz")
    except L5DaskError:
        return
    assert 0 < meta.chunk_nbytes <= fmt.MAX_CHUNK_NBYTES and meta.nchunks <= fmt.MAX_CHUNKS
    _little_endian(meta.dtype)


def zattrs(data: bytes) -> None:
    try:
        attrs = fmt.parse_zattrs(data, "fuzz")
    except L5DaskError:
        return
    labels = attrs.get("labels")
    assert labels is None or (len(set(labels)) == 17 and all(isinstance(x, str) for x in labels))


def _metadata_seeds() -> list[bytes]:
    seeds = [
        fmt.zarray_json(d, 12345, r)
        for d, r in ((fmt.AGENT_DTYPE, 20000), (fmt.SCENE_DTYPE, 10000), (fmt.TL_FACE_DTYPE, 10000))
    ]
    return seeds + [seeds[0].replace(b'"<f4"', b'">f4"', 1), seeds[0].replace(b'"<f8"', b'">f8"', 1)]


# --- L5Kit's CSV files ---------------------------------------------------------------------------------
def csv(data: bytes) -> None:
    """A ground-truth CSV (T = 2): read, and its numbers equal Python's ``float`` of each cell."""
    from l5dask.evaluation.csvfiles import read_gt_csv

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "gt.csv")
        with open(path, "wb") as f:
            f.write(data)
        try:
            parsed = read_gt_csv(path)
            coords = np.asarray(parsed.coords.compute(scheduler="sync"), np.float64)
        except L5DaskError:
            return
    import csv as csvmodule

    try:  # the reference: Python's csv module (L5Kit's reader) and float()
        rows = list(csvmodule.reader(io.StringIO(data.decode())))[1:]
        want = np.array([[float(c) for c in r[4:]] for r in rows if r], np.float64)
    except (ValueError, csvmodule.Error):
        return  # l5dask read what the reference cannot: only a full comparison below says anything
    if want.size == coords.size:
        assert want.reshape(coords.shape).tobytes() == coords.tobytes(), "a number parsed otherwise than float()"


def _csv_seeds() -> list[bytes]:
    from l5dask.evaluation.csvfiles import gt_header

    rng = np.random.default_rng(1)
    lines = [",".join(gt_header(2))]
    for i in range(30):
        v = rng.normal(0, 100, 4)
        cells = [repr(float(x)) if i % 3 else f"{x:.5f}" for x in v]
        lines.append(f"{1000 + i},{i},1.0,{i % 2}.0," + ",".join(cells))
    return [("\n".join(lines) + "\n").encode()]


# --- perception tables ---------------------------------------------------------------------------------
def perception_table(data: bytes) -> None:
    """A sample_annotation table: parsed with its types vouched for, or one FormatError; the
    compiled type scan agrees with ``json`` wherever it claims an answer."""
    from l5dask.perception._jsonscan import json_types

    from l5dask.perception import tables

    columns = tables.SCHEMA["sample_annotation"]
    kinds = np.array([tables.KINDS[t] for t in columns.values()], np.int64)
    status, row, key, element, _, _ = json_types(np.frombuffer(data, np.uint8), [c.encode() for c in columns], kinds)
    twice = []

    def pairs(items: list) -> dict:
        keys = [k for k, _ in items]
        twice.extend(k for k in set(keys) if k in columns and keys.count(k) > 1)
        return dict(items)

    if status in (0, 1):
        try:
            json.loads(data, object_pairs_hook=pairs)
            valid = True
        except (ValueError, RecursionError):
            valid = False
        if valid and not twice:  # (a key twice: json keeps the last, DuckDB refuses; the scan says so)
            py = tables._python_types(data, tables.SCHEMA["sample_annotation"], "fuzz")
            if status == 0:
                assert py is None, f"the type scan passed what json finds of another type: {py}"
            else:
                assert py is not None and py[:3] == (row, key, element), f"scan {row, key, element}, json {py}"
    try:
        tables.parse(data, "sample_annotation", "fuzz")
    except L5DaskError:
        return
    assert status != 4 and not twice, "a table with a key twice in an object was read"
    json.loads(data)  # read: json must read it too (an array cut after a comma was read)


def _perception_seeds() -> list[bytes]:
    rows = [
        {
            "token": f"{i:032x}",
            "sample_token": "s",
            "instance_token": "i",
            "attribute_tokens": ["a", "b"],
            "visibility_token": "4",
            "translation": [1.5, -2.0, 3e2],
            "size": [1, 2, 3],
            "rotation": [1, 0, 0, 0],
            "prev": "",
            "next": "",
            "num_lidar_pts": 3,
        }
        for i in range(5)
    ]
    return [json.dumps(rows).encode(), json.dumps(rows, indent=2).encode()]


# --- 3D-detection files ---------------------------------------------------------------------------
def detection(data: bytes) -> None:
    """A predictions file, the SDK's JSON or the competition's CSV: read into boxes, or one
    FormatError. What is read must be what ``json`` (strict: no NaN) or Python's ``csv`` and
    ``float`` read, number for number, in the same order."""
    import csv as csvmodule
    import math

    from l5dask.perception.detection import read_boxes

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "pred")
        with open(path, "wb") as f:
            f.write(data)
        try:
            boxes = read_boxes(path, "pred")
        except L5DaskError:
            return
    if len(boxes) == 0:
        return
    if data.lstrip()[:1] == b"[":

        def refuse(word: str):
            raise ValueError(word)

        doc = json.loads(data, parse_constant=refuse)  # l5dask accepted it: json must parse it
        want = np.array([[*r["translation"], *r["size"], *r["rotation"], r["score"]] for r in doc], np.float64)
        got = np.c_[boxes.xyz, boxes.size, boxes.rotation, boxes.score]
        assert want.tobytes() == got.tobytes(), "a JSON number read otherwise than json reads it"
        return
    csvmodule.field_size_limit(2**31 - 1)  # (as the reader: a sample's row may pass 128 KB)
    rows = list(csvmodule.reader(io.StringIO(data.decode("utf-8"), newline="")))[1:]
    tokens = [t for r in rows if r for t in r[1].split()]
    want = np.array([float(t) for i, t in enumerate(tokens) if i % 9 != 8], np.float64).reshape(-1, 8)
    assert want[:, [0, 1, 2, 3, 4, 5, 6]].tobytes() == np.c_[boxes.score, boxes.xyz, boxes.size].tobytes(), (
        "a CSV number read otherwise than float() reads it"
    )
    assert all(math.isfinite(v) for v in want.ravel())


def detection_blocks(data: bytes) -> None:
    """A JSON file evaluated as predictions against itself as ground truth, read in small blocks
    (cut at guessed seams, the ground truth indexed by guessed tokens) and read whole: the same
    metrics, or the same one-line error."""
    from l5dask.perception import detection as det

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "boxes.json")
        with open(path, "wb") as f:
            f.write(data)
        outcomes = []
        for how in ("blocks", "whole"):
            try:
                if how == "blocks":
                    r = det.evaluate(path, path, block_bytes=64 + len(data) % 97, iou_thresholds=(0.1, 0.5, 0.9))
                else:
                    r = det.evaluate(
                        det.read_boxes(path, "pred"), det.read_boxes(path, "gt"), iou_thresholds=(0.1, 0.5, 0.9)
                    )
                keys = ("classes", "ap", "map", "gt_boxes", "predictions", "samples")
                outcomes.append(json.dumps({k: r[k] for k in keys}, sort_keys=True))
            except L5DaskError as exc:
                outcomes.append(f"error: {exc}")
    assert outcomes[0] == outcomes[1], f"in blocks {outcomes[0][:300]} but whole {outcomes[1][:300]}"


def _detection_seeds() -> list[bytes]:
    box = {
        "sample_token": "abc",
        "translation": [1.5, -2.25, 0.1],
        "size": [1.9, 4.6, 1.7],
        "rotation": [0.9, 0.0, 0.0, 0.43],
    }
    boxes = [dict(box, name=n, score=s) for n, s in (("car", 0.9), ("pedestrian", 0.25), ("car", 0.5))]
    csv_text = "Id,PredictionString\nabc,0.9 1.5 -2.25 0.1 1.9 4.6 1.7 0.3 car 0.5 3 4 5 1 2 1 -1.2 truck\ndef,\n"
    return [json.dumps(boxes).encode(), csv_text.encode()]


def _detection_block_seeds() -> list[bytes]:
    def box(tok: str, name: str, x: float, score: float) -> dict:
        return {
            "sample_token": tok,
            "translation": [x, 0.5, 0.0],
            "size": [1.9, 4.6, 1.7],
            "rotation": [0.9, 0.0, 0.0, 0.43],
            "name": name,
            "score": score,
        }

    grouped = [
        box(t, n, x, s)
        for t in ("s1", "s2", "s3")
        for n, x, s in (("car", 0.0, 0.9), ("car", 0.3, 0.4), ("bus", 9.0, 0.5))
    ]
    return [
        json.dumps(grouped).encode(),
        json.dumps(grouped, indent=1).encode(),
        json.dumps([grouped[i] for i in (0, 4, 1, 7, 2)]).encode(),
        json.dumps([dict(b, name="a}, {b") for b in grouped]).encode(),
    ]


# --- the cache's entries ---------------------------------------------------------------------------------
#: (an entry names itself: ``e.l5c``, the file ``load`` reads it from)
_ABOUT = {"source": "agents", "reduction": "fuzz", "chunks": [0, 4], "entry": "e.l5c"}


def _cache_known() -> dict[bytes, object]:
    """Each seed partial by the digest its entry's header holds (what an accepted entry must hold)."""
    from l5dask.core import cache as cachelib
    from tests.cache_data import sample_partials

    return {cachelib.encode(p, _ABOUT)[12:28]: p for p in sample_partials()}


_KNOWN: dict[bytes, object] = {}


def cache_entry(data: bytes) -> None:
    """First byte even: the rest is an entry as read from a cache; odd: the rest is an entry's body
    (manifest length, manifest, arrays), signed here with a valid checksum, so that the manifest's
    and the arrays' parser is reached. The decoder, and ``load`` through a cache folder, either
    refuse in one line (``Damaged``: ``load`` then says not found) or return a value: for an entry
    as read, bit for bit the partial of the seed whose digest it holds (a fuzzer forges no BLAKE2b);
    for a signed body (or an entry of the corpus), a value that the encoder keeps bit for bit.
    ``load`` says each refusal in one warning of one line."""
    import hashlib

    from l5dask.core import cache as cachelib
    from tests.cache_data import same_bits

    if not data:
        return
    if not _KNOWN:
        _KNOWN.update(_cache_known())
    raw = data[1:]
    signed = bool(data[0] % 2)
    if signed:
        raw = cachelib._HEAD.pack(cachelib.MAGIC, cachelib.FORMAT, hashlib.blake2b(raw, digest_size=16).digest()) + raw
    accepted, value = True, None
    try:
        value = cachelib.decode(raw, _ABOUT["entry"])
    except cachelib.Damaged as exc:
        assert str(exc) and "\n" not in str(exc), f"a refusal of more than one line: {exc!r}"
        accepted = False
    want = _KNOWN.get(raw[12:28], _KNOWN) if accepted and not signed else _KNOWN
    if want is not _KNOWN:
        assert same_bits(value, want), "an entry read as another value than was stored"
    elif accepted:  # (signed here, or of the corpus: a value the encoder keeps)
        assert same_bits(cachelib.decode(cachelib.encode(value)), value), "a value the encoder does not keep"
    said = _said()
    said.clear()
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "e.l5c"), "wb") as f:
            f.write(raw)
        cachelib.reset_warnings()
        ok, got = cachelib.load(cachelib.Entry(cachelib.Cache(tmp), _ABOUT["entry"], _ABOUT))
    assert ok == accepted and (same_bits(got, value) if ok else got is None), "load disagrees with decode"
    assert len(said) == (0 if ok else 1) and all("\n" not in m for m in said), f"load said {said}"


def _said() -> list[str]:
    """The cache's warnings, kept here (not on stderr, a pipe the harness reads only when a worker dies)."""
    import logging

    log = logging.getLogger("l5dask.cache")
    for h in log.handlers:
        if isinstance(h, _Kept):
            return h.messages
    h = _Kept()
    log.addHandler(h)
    log.propagate = False
    return h.messages


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _cache_seeds() -> list[bytes]:
    from l5dask.core import cache as cachelib
    from tests.cache_data import sample_partials

    out = []
    for p in sample_partials():
        entry = cachelib.encode(p, _ABOUT)
        out += [b"\x00" + entry, b"\x01" + entry[cachelib._HEAD.size :]]
    return out


# --- a dataset in a zip or a tar ------------------------------------------------------------------------------
def archive(data: bytes) -> None:
    """First byte even: the rest is a zip of a dataset folder, odd: a tar. Opened as a dataset (its
    metadata, its chunks' headers) and its scenes read: an answer, or one of l5dask's errors (a
    damaged archive said in one line: zipfile's and tarfile's errors reached the user as tracebacks)."""
    import l5dask

    suffix = ".tar" if data[:1] and data[0] % 2 else ".zip"
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "dataset" + suffix)
        with open(path, "wb") as f:
            f.write(data[1:])
        try:
            ds = l5dask.open_dataset(path)
            scenes = ds[fmt.SCENES]
            scenes.read(0, len(scenes))
        except L5DaskError:
            return


def _archive_seeds() -> list[bytes]:
    """A dataset of two scenes (no frame) as a zip and as a tar."""
    import tarfile
    import zipfile

    files = {".zgroup": b'{"zarr_format": 2}', ".zattrs": fmt.zattrs_json()}
    for name in fmt.ARRAY_NAMES:
        files[f"{name}/.zarray"] = fmt.zarray_json(fmt.DTYPES[name], 2 if name == fmt.SCENES else 0, 10)
    scenes = np.zeros(10, fmt.SCENE_DTYPE)
    scenes["host"][:2] = ["host-a", "host-b"]
    files["scenes/0"] = Blosc("lz4", 5, Blosc.SHUFFLE).encode(scenes)
    z, t = io.BytesIO(), io.BytesIO()
    with zipfile.ZipFile(z, "w") as zf:
        for name, body in files.items():
            zf.writestr(name, body)
    with tarfile.open(fileobj=t, mode="w") as tf:
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tf.addfile(info, io.BytesIO(body))
    return [b"\x00" + z.getvalue(), b"\x01" + t.getvalue()]


TARGETS: dict[str, tuple[Callable[[bytes], None], Callable[[], list[bytes]]]] = {
    "blosc": (blosc, _blosc_seeds),
    "chunk_rows": (chunk_rows, _partial_seeds),
    "chunk_rows_gather": (chunk_rows_gather, _partial_seeds),
    "chunk_read_part": (chunk_read_part, _partial_seeds),
    "zarray": (zarray, _metadata_seeds),
    "zarray_nd": (zarray_nd, lambda: [fmt.zarray_json(np.dtype([("value", "<u4", (2,))]), 999, 100, (2,))]),
    "zattrs": (zattrs, lambda: [fmt.zattrs_json()]),
    "csv": (csv, _csv_seeds),
    "perception_table": (perception_table, _perception_seeds),
    "detection": (detection, _detection_seeds),
    "detection_blocks": (detection_blocks, _detection_block_seeds),
    "cache_entry": (cache_entry, _cache_seeds),
    "archive": (archive, _archive_seeds),
}


def selftest(data: bytes) -> None:
    """Not fuzzed: proves the harness sees each kind of finding (``tests/test_fuzz.py``)."""
    if data == b"abort":
        os.abort()
    if data == b"fpe":
        import signal

        os.kill(os.getpid(), signal.SIGFPE)
    if data == b"raise":
        raise RecursionError("planted")
    if data == b"hang":
        import time

        time.sleep(60)


#: targets run only when named
HIDDEN = {"selftest": (selftest, lambda: [b"fine"])}
