"""The zarr v3 columnar layout of an L5Kit dataset: written by ``l5dask export --format zarr3``,
read back by :func:`l5dask.open_dataset <l5dask.prediction.dataset.open_dataset>` with the same :class:`~l5dask.prediction.dataset.L5Dataset` API.

Layout (zarr v3, opened natively by zarr-python 3 and ``xr.open_datatree(..., engine="zarr")``)::

    OUT/zarr.json                      group; attributes: labels, format_version, l5dask layout
    OUT/agents/zarr.json               group; attributes: the L5Kit dtype, rows per chunk
    OUT/agents/centroid/zarr.json      array (agents, 2) float64, dims (agent_index, xy)
    OUT/agents/centroid/c/0/0          one shard: 32 chunks of 20 000 rows and their index
    ...                                one array per field, plus the join columns
                                       (scene_index, frame_index, timestamp on agents and
                                       faces; scene_index on frames)

Every field is its own array, sharded (``sharding_indexed``: a shard holds 32 chunks, each the
rows of one L5Kit chunk, so tasks line up with the original's), with dimension names. Numbers
are blosc with byte shuffle by element size, zstd (one-hot label probabilities shrink 100x, track
ids 60x, velocities 2.6x) but lz4 for float64 (world coordinates shrink 1.3x with either: their
last bytes are noise, and lz4 encodes 6x faster); strings ``vlen-utf8`` then zstd. A reader that needs four fields of the agents (the report) reads those four arrays
only: two ranged reads per shard and field (the shard's index, then the chunks' bytes).

Only what this module writes is read back (the codecs above; never a pickle or object codec).

Why not zarr-python 3: l5dask cannot depend on it. L5Kit's own stack, which l5dask's users have
beside it, needs zarr-python 2, and the two cannot be installed in one environment; what zarr-python
3 reads (it opens this layout natively: ``tests/prediction/test_exports.py`` checks it in a venv of its own) is
what matters. The writer is the shard layout's ~60 lines around numcodecs' codecs, and it is
faster: every field of 7.0 M agents (816 MB) from memory, the same shards, chunks and codecs, all
cores: 13.3 s against 19.8 s for zarr-python 3.1.6 (1.49x; ``python benchmarks/handwritten_layers.py
--part zarr3 --scenes 400 --rounds 3``, 2026-11-27). When to delete it: when l5dask can depend on
zarr-python 3 (L5Kit's stack moves to it) and that benchmark shows it within 10%.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from l5dask.core.codec import check_blosc, decode_blosc, typesize_of
from l5dask.core.outputs import json_text
from l5dask.core.store import Store
from l5dask.errors import FormatError, L5DaskError
from l5dask.prediction import format as fmt
from l5dask.prediction.columns import INDEX
from l5dask.prediction.reading import L5Array, project

LAYOUT = "l5kit-columnar"
LAYOUT_VERSION = 1
#: Stored chunks per shard (640 k agents: 43 MB of label probabilities decoded, 30 MB of centroids).
CHUNKS_PER_SHARD = 32
CLEVEL = 5
#: Join columns written beside the fields, by array.
JOINS = {
    fmt.AGENTS: ("scene_index", "frame_index", "timestamp"),
    fmt.TL_FACES: ("scene_index", "frame_index", "timestamp"),
    fmt.FRAMES: ("scene_index",),
    fmt.SCENES: (),
}
_EMPTY = 2**64 - 1


@functools.cache
def _strings() -> tuple[Any, Any]:
    """The string columns' codecs (numcodecs imported when first used: see ``codec._decoder``)."""
    from numcodecs import VLenUTF8, Zstd

    return VLenUTF8(), Zstd(level=CLEVEL)


# --- one field array: metadata and chunk codecs -----------------------------------------------------
@dataclass(frozen=True)
class FieldMeta:
    """One array of the layout: its key, element type, trailing shape, chunk and shard rows."""

    key: str
    dtype: np.dtype  # the element type (numbers), or <U.. for strings
    tail: tuple[int, ...]
    length: int
    chunk_rows: int
    shard_chunks: int

    @property
    def strings(self) -> bool:
        return self.dtype.kind == "U"

    def shard_key(self, shard: int) -> str:
        return f"{self.key}/c/{shard}" + "/0" * len(self.tail)

    @property
    def nchunks(self) -> int:
        return -(-self.length // self.chunk_rows) if self.length else 0


def dims_of(array: str, field: str, ndim: int) -> list[str]:
    """Dimension names: the table's row index, then the field's own (``xy``, ``label``...)."""
    own = list(fmt.FIELD_DIMS.get(field, ((),))[0])
    if len(own) != ndim:
        own = [f"{field}_dim_{i}" for i in range(ndim)]
    return [INDEX[array], *own]


def cname_of(dtype: np.dtype) -> str:
    """The blosc compressor of a number field: lz4 for float64 (world coordinates, rotations: their
    low bytes are noise, zstd gains 1 % on them at 6x the encoding time), zstd for the others
    (one-hot probabilities, ids, small velocities: 2-4x smaller than lz4)."""
    return "lz4" if dtype == np.float64 else "zstd"


def _blosc(dtype: np.dtype) -> dict:
    return {
        "name": "blosc",
        "configuration": {
            "cname": cname_of(dtype),
            "clevel": CLEVEL,
            "shuffle": "shuffle",
            "typesize": dtype.itemsize,
            "blocksize": 0,
        },
    }


def array_json(array: str, field: str, m: FieldMeta, attrs: dict | None = None) -> bytes:
    """The ``zarr.json`` of one field array (zarr v3, sharded, with dimension names)."""
    fill: str | float
    if m.strings:
        data_type, fill, inner = (
            "string",
            "",
            [{"name": "vlen-utf8"}, {"name": "zstd", "configuration": {"level": CLEVEL, "checksum": False}}],
        )
    else:
        data_type = m.dtype.name  # int64, float32, uint64...
        fill = 0.0 if m.dtype.kind == "f" else 0
        inner = [{"name": "bytes", "configuration": {"endian": "little"}}, _blosc(m.dtype)]
    meta = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [m.length, *m.tail],
        "data_type": data_type,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [m.chunk_rows * m.shard_chunks, *m.tail]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": fill,
        "codecs": [
            {
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": [m.chunk_rows, *m.tail],
                    "codecs": inner,
                    "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                    "index_location": "end",
                },
            }
        ],
        "attributes": attrs or {},
        "dimension_names": dims_of(array, field, len(m.tail)),
    }
    return json_text(meta, indent=1).encode()


def group_json(attrs: dict) -> bytes:
    return json_text({"zarr_format": 3, "node_type": "group", "attributes": attrs}, indent=1).encode()


def encode_chunk(values: np.ndarray, m: FieldMeta) -> bytes:
    """One inner chunk: padded to ``chunk_rows`` with the fill value, then its codecs."""
    if len(values) < m.chunk_rows:
        full = (
            np.zeros((m.chunk_rows, *m.tail), dtype=values.dtype)
            if not m.strings
            else np.full(m.chunk_rows, "", dtype=values.dtype)
        )
        full[: len(values)] = values
        values = full
    if m.strings:
        vlen, zstd = _strings()
        return zstd.encode(vlen.encode(np.asarray(values, dtype=object)))
    from numcodecs import Blosc

    blosc = Blosc(cname=cname_of(m.dtype), clevel=CLEVEL, shuffle=Blosc.SHUFFLE, blocksize=0)
    return blosc.encode(np.ascontiguousarray(values, dtype=m.dtype.newbyteorder("<")))


def decode_chunk(raw: bytes, m: FieldMeta, where: str) -> np.ndarray:
    try:
        if m.strings:
            vlen, zstd = _strings()
            return vlen.decode(zstd.decode(raw)).astype(m.dtype)
        shape = (m.chunk_rows, *m.tail)
        why = check_blosc(
            memoryview(raw).cast("B"), int(np.prod(shape)) * m.dtype.itemsize, typesize_of(m.dtype.itemsize)
        )
        if why is not None:  # checked before the buffer is sized by the metadata
            raise ValueError(why)
        return decode_blosc(raw, np.empty(shape, dtype=m.dtype))
    except (RuntimeError, ValueError, TypeError) as exc:
        raise FormatError(f"{where}: truncated or corrupt chunk ({exc})") from None


def encode_shard(values: np.ndarray, m: FieldMeta) -> bytes:
    """The rows of one shard (at most ``shard_chunks`` chunks), its index at the end."""
    parts, index = [], np.full((m.shard_chunks, 2), _EMPTY, dtype="<u8")
    pos = 0
    for i in range(0, len(values), m.chunk_rows):
        b = encode_chunk(values[i : i + m.chunk_rows], m)
        index[i // m.chunk_rows] = (pos, len(b))
        parts.append(b)
        pos += len(b)
    return b"".join(parts) + index.tobytes()


# --- reading ------------------------------------------------------------------------------------------
def read_field(store: Store, m: FieldMeta, first: int, n: int) -> np.ndarray:
    """Stored chunks ``first .. first + n - 1`` of one field: per shard, its index, then one ranged
    read of the chunks' bytes."""
    rows = []
    chunk = first
    while chunk < first + n:
        shard, k0 = divmod(chunk, m.shard_chunks)
        k1 = min(m.shard_chunks, k0 + first + n - chunk)
        key = m.shard_key(shard)
        index = np.frombuffer(store.get(key, start=-16 * m.shard_chunks), dtype="<u8").reshape(-1, 2)
        sel = index[k0:k1]
        if (sel[:, 0] == _EMPTY).any():
            raise FormatError(f"{store.url}: {key}: chunks {k0}..{k1 - 1} are missing from the shard")
        lo, hi = int(sel[0, 0]), int(sel[-1, 0] + sel[-1, 1])
        raw = store.get(key, start=lo, end=hi)
        for off, size in sel:
            rows.append(decode_chunk(raw[int(off) - lo : int(off + size) - lo], m, f"{store.url}: {key}"))
        chunk += k1 - k0
    out = np.concatenate(rows) if len(rows) > 1 else rows[0]
    end = min((first + n) * m.chunk_rows, m.length) - first * m.chunk_rows
    return out[:end]


class ColumnarArray(L5Array):
    """One table of the zarr v3 layout, with :class:`~l5dask.prediction.reading.L5Array`'s API: chunks of
    L5Kit records, of only the fields :meth:`select`-ed (the others are never read)."""

    def __init__(
        self, store: Store, meta: fmt.ArrayMeta, fields: dict[str, FieldMeta], selected: tuple[str, ...] | None = None
    ) -> None:
        super().__init__(store, meta, True)
        self.fields, self.selected = fields, selected

    def select(self, fields: Sequence[str]) -> ColumnarArray:
        """This array reading only ``fields`` (records of those fields)."""
        return ColumnarArray(self.store, self.meta, self.fields, self._fields(fields))

    @property
    def record_dtype(self) -> np.dtype:
        return project(np.empty(0, self.meta.dtype), self.selected).dtype if self.selected else self.meta.dtype

    def read(self, first: int, n: int, fields: Sequence[str] | str | None = None) -> np.ndarray:
        names = self._fields(fields) or self.selected or fmt.names_of(self.meta.dtype)
        dtype = project(np.empty(0, self.meta.dtype), names).dtype
        lo, hi = self.meta.chunk_bounds(first)[0], self.meta.chunk_bounds(first + n - 1)[1] if n else 0
        out = np.empty(max(hi - lo, 0), dtype=dtype)
        for f in names:
            out[f] = read_field(self.store, self.fields[f], first, n).reshape(out[f].shape)
        return out

    def iter_chunks(self, first: int, n: int):
        block = self.read(first, n)
        start = self.meta.chunk_bounds(first)[0]
        for i in range(first, first + n):
            a, b = self.meta.chunk_bounds(i)
            yield a, block[a - start : b - start]

    def iter_encoded(self, first: int, n: int):
        """As :meth:`iter_chunks`: this layout stores columns, not record chunks to gather from
        (a pass that takes stored chunks takes records too)."""
        return self.iter_chunks(first, n)

    def read_encoded(self, first: int, n: int) -> np.ndarray:  # type: ignore[override]
        """As :meth:`read` (see :meth:`iter_encoded`)."""
        return self.read(first, n)

    def read_rows(self, lo: int, hi: int, out: np.ndarray) -> np.ndarray:
        if hi <= lo:
            return out
        rows = self.meta.chunk_rows
        c0 = lo // rows
        block = self.read(c0, (hi - 1) // rows + 1 - c0)
        out[...] = block[lo - c0 * rows : hi - c0 * rows]
        return out

    def __dask_tokenize__(self):
        return (
            "l5dask.ColumnarArray",
            self.store.__dask_tokenize__(),
            self.meta.name,
            self.meta.length,
            self.meta.chunk_rows,
            self.selected,
        )


def _field_meta(store: Store, key: str, where: str) -> FieldMeta:
    raw = store.get_metadata(f"{key}/zarr.json")
    if raw is None:
        raise FormatError(f"{where}: {key}/zarr.json is missing")
    meta = fmt.load_json(raw, where, f"{key}/zarr.json")
    try:
        shard = meta["codecs"][0]
        if shard["name"] != "sharding_indexed" or meta["zarr_format"] != 3:
            raise KeyError("codecs")
        inner = shard["configuration"]["codecs"]
        names = [c["name"] for c in inner]
        shape, outer = meta["shape"], meta["chunk_grid"]["configuration"]["chunk_shape"]
        chunk = shard["configuration"]["chunk_shape"]
    except (ValueError, KeyError, TypeError, IndexError):
        raise FormatError(f"{where}: {key}/zarr.json is not an array of l5dask's columnar layout") from None
    if not (
        isinstance(shape, list)
        and 1 <= len(shape) <= 8
        and all(fmt.is_count(v) for v in shape)
        and isinstance(outer, list)
        and isinstance(chunk, list)
        and len(outer) == len(chunk) == len(shape)
        and fmt.is_count(chunk[0], 1)
        and fmt.is_count(outer[0], 1)
        and outer[0] % chunk[0] == 0
        and outer[0] // chunk[0] <= fmt.MAX_CHUNKS
        and list(chunk[1:]) == list(shape[1:])
        and int(np.prod(chunk, dtype=object)) * 64 <= fmt.MAX_CHUNK_NBYTES
    ):
        raise FormatError(
            f"{where}: {key}/zarr.json: shape {shape!r}, shards {outer!r} and chunks {chunk!r} "
            "are not whole numbers of rows that l5dask reads"
        )
    if meta["data_type"] == "string":
        if names != ["vlen-utf8", "zstd"]:
            raise FormatError(f"{where}: {key}: unsupported codecs {names}")
        dtype = np.dtype("<U16")
    else:
        if names != ["bytes", "blosc"]:
            raise FormatError(f"{where}: {key}: unsupported codecs {names}")
        try:
            dtype = np.dtype(meta["data_type"])
        except TypeError:
            raise FormatError(f"{where}: {key}: unknown data type {meta['data_type']!r}") from None
        if dtype.kind not in "biuf":
            raise FormatError(f"{where}: {key}: data type {meta['data_type']!r} is not a number type")
    return FieldMeta(key, dtype, tuple(shape[1:]), int(shape[0]), int(chunk[0]), int(outer[0]) // int(chunk[0]))


def is_columnar(store: Store) -> bool:
    """Whether ``store`` holds l5dask's zarr v3 columnar layout."""
    try:
        raw = store.get_metadata("zarr.json")
    except L5DaskError:  # a file, not a folder...
        return False
    if raw is None:
        return False
    try:
        return json.loads(raw).get("attributes", {}).get("l5dask", {}).get("layout") == LAYOUT
    except (ValueError, AttributeError, RecursionError):
        return False


def columnar_arrays(store: Store) -> tuple[dict[str, L5Array], dict]:
    """The arrays and attributes of a zarr v3 columnar export (metadata read here, chunks lazily),
    for :class:`~l5dask.prediction.dataset.L5Dataset`."""
    root = fmt.load_json(store.get("zarr.json"), store.url, "zarr.json")
    attrs = root.get("attributes", {}) if isinstance(root, dict) else {}
    if not isinstance(attrs, dict):
        raise FormatError(f"{store.url}: zarr.json attributes are not a JSON object")
    fmt.parse_zattrs(json_text({k: v for k, v in attrs.items() if k == "labels"}).encode(), store.url)
    arrays: dict[str, L5Array] = {}
    for name in fmt.ARRAY_NAMES:
        raw = store.get_metadata(f"{name}/zarr.json")
        if raw is None:
            if name == fmt.TL_FACES:
                continue
            raise FormatError(f"{store.url}: the export has no {name!r} group")
        g = fmt.load_json(raw, store.url, f"{name}/zarr.json")
        g = g.get("attributes", {}) if isinstance(g, dict) else {}
        try:
            dtype = fmt.dtype_from_descr(g["l5kit_dtype"], f"{store.url}: {name}")
            length, rows = g["length"], g["chunk_rows"]
        except (KeyError, TypeError, AttributeError):
            raise FormatError(f"{store.url}: {name}/zarr.json lacks l5dask's attributes") from None
        if not (fmt.is_count(length) and fmt.is_count(rows, 1)):
            raise FormatError(f"{store.url}: {name}/zarr.json: length {length!r} or chunk_rows {rows!r} out of range")
        fields = {f: _field_meta(store, f"{name}/{f}", store.url) for f in fmt.names_of(dtype)}
        for f, m in fields.items():
            sub = fmt.fields_of(dtype)[f][0]
            want = sub.base if sub.base.kind != "U" else np.dtype("<U16")
            if m.tail != sub.shape or m.dtype != want or m.length != length:
                raise FormatError(f"{store.url}: {name}/{f} does not match the table's dtype and length")
            if m.strings:
                object.__setattr__(m, "dtype", sub.base)
        arrays[name] = ColumnarArray(
            store, fmt.check_size(fmt.ArrayMeta(name, dtype, length, rows), f"{store.url}: {name}"), fields
        )
    return arrays, {k: v for k, v in attrs.items() if k != "l5dask"}
