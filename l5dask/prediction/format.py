"""The L5Kit zarr v2 on-disk format: the one place for its constants and dtype rules.

Everything here is pure: no I/O. It follows L5Kit 1.5.0's ``ChunkedDataset`` (``l5kit/data/zarr_dataset.py``, ``labels.py``).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from l5dask.core.codec import MAX_BUFFERSIZE as MAX_CHUNK_NBYTES
from l5dask.core.outputs import json_text
from l5dask.errors import FormatError


def fields_of(dtype: np.dtype) -> Mapping[str, tuple]:
    """The fields of a structured dtype (``dtype.fields``, which numpy types as optional)."""
    fields = dtype.fields
    if fields is None:
        raise TypeError(f"not a structured dtype: {dtype}")
    return fields


def names_of(dtype: np.dtype) -> tuple[str, ...]:
    """The field names of a structured dtype (``dtype.names``, which numpy types as optional)."""
    names = dtype.names
    if names is None:
        raise TypeError(f"not a structured dtype: {dtype}")
    return names


FORMAT_VERSION = 2

#: The four arrays, by their on-disk names.
SCENES, FRAMES, AGENTS, TL_FACES = "scenes", "frames", "agents", "traffic_light_faces"
ARRAY_NAMES: tuple[str, ...] = (SCENES, FRAMES, AGENTS, TL_FACES)
#: Short names used for the xarray groups and the Python attributes.
SHORT_NAMES: dict[str, str] = {
    SCENES: "scenes",
    FRAMES: "frames",
    AGENTS: "agents",
    TL_FACES: "tl_faces",
}

SCENE_DTYPE = np.dtype(
    [
        ("frame_index_interval", np.int64, (2,)),
        ("host", "<U16"),
        ("start_time", np.int64),
        ("end_time", np.int64),
    ]
)
FRAME_DTYPE = np.dtype(
    [
        ("timestamp", np.int64),
        ("agent_index_interval", np.int64, (2,)),
        ("traffic_light_faces_index_interval", np.int64, (2,)),
        ("ego_translation", np.float64, (3,)),
        ("ego_rotation", np.float64, (3, 3)),
    ]
)
#: Frames of datasets written before traffic lights existed.
FRAME_DTYPE_V1 = np.dtype(
    [
        ("timestamp", np.int64),
        ("agent_index_interval", np.int64, (2,)),
        ("ego_translation", np.float64, (3,)),
        ("ego_rotation", np.float64, (3, 3)),
    ]
)
AGENT_DTYPE = np.dtype(
    [
        ("centroid", np.float64, (2,)),
        ("extent", np.float32, (3,)),
        ("yaw", np.float32),
        ("velocity", np.float32, (2,)),
        ("track_id", np.uint64),
        ("label_probabilities", np.float32, (17,)),
    ]
)
TL_FACE_DTYPE = np.dtype(
    [
        ("face_id", "<U16"),
        ("traffic_light_id", "<U16"),
        ("traffic_light_face_status", np.float32, (3,)),
    ]
)

DTYPES: dict[str, np.dtype] = {
    SCENES: SCENE_DTYPE,
    FRAMES: FRAME_DTYPE,
    AGENTS: AGENT_DTYPE,
    TL_FACES: TL_FACE_DTYPE,
}
#: L5Kit's chunk lengths (rows per stored chunk).
CHUNK_ROWS: dict[str, int] = {SCENES: 10_000, FRAMES: 10_000, AGENTS: 20_000, TL_FACES: 10_000}

#: Fields a reader needs in each array; other fields may exist and are kept.
REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    SCENES: ("frame_index_interval", "host", "start_time", "end_time"),
    FRAMES: ("timestamp", "agent_index_interval", "ego_translation", "ego_rotation"),
    AGENTS: ("centroid", "extent", "yaw", "velocity", "track_id", "label_probabilities"),
    TL_FACES: ("face_id", "traffic_light_id", "traffic_light_face_status"),
}

#: Interval fields: (parent array, field, child array).
INTERVALS: tuple[tuple[str, str, str], ...] = (
    (SCENES, "frame_index_interval", FRAMES),
    (FRAMES, "agent_index_interval", AGENTS),
    (FRAMES, "traffic_light_faces_index_interval", TL_FACES),
)

LABELS: tuple[str, ...] = (
    "PERCEPTION_LABEL_NOT_SET",
    "PERCEPTION_LABEL_UNKNOWN",
    "PERCEPTION_LABEL_DONTCARE",
    "PERCEPTION_LABEL_CAR",
    "PERCEPTION_LABEL_VAN",
    "PERCEPTION_LABEL_TRAM",
    "PERCEPTION_LABEL_BUS",
    "PERCEPTION_LABEL_TRUCK",
    "PERCEPTION_LABEL_EMERGENCY_VEHICLE",
    "PERCEPTION_LABEL_OTHER_VEHICLE",
    "PERCEPTION_LABEL_BICYCLE",
    "PERCEPTION_LABEL_MOTORCYCLE",
    "PERCEPTION_LABEL_CYCLIST",
    "PERCEPTION_LABEL_MOTORCYCLIST",
    "PERCEPTION_LABEL_PEDESTRIAN",
    "PERCEPTION_LABEL_ANIMAL",
    "AVRESEARCH_LABEL_DONTCARE",
)
TL_FACE_STATUSES: tuple[str, ...] = ("ACTIVE", "INACTIVE", "UNKNOWN")

COMPRESSOR: dict[str, Any] = {
    "id": "blosc",
    "cname": "lz4",
    "clevel": 5,
    "shuffle": 1,
    "blocksize": 0,
}

#: Coordinates for the extra dimensions of subarray fields: field -> (dim names, coords).
FIELD_DIMS: dict[str, tuple[tuple[str, ...], tuple[tuple[str, ...] | None, ...]]] = {
    "frame_index_interval": (("interval",), (("start", "end"),)),
    "agent_index_interval": (("interval",), (("start", "end"),)),
    "traffic_light_faces_index_interval": (("interval",), (("start", "end"),)),
    "ego_translation": (("xyz",), (("x", "y", "z"),)),
    "ego_rotation": (("row", "col"), (("x", "y", "z"), ("x", "y", "z"))),
    "centroid": (("xy",), (("x", "y"),)),
    "velocity": (("xy",), (("x", "y"),)),
    "extent": (("lwh",), (("length", "width", "height"),)),
    "label_probabilities": (("label",), (LABELS,)),
    "traffic_light_face_status": (("status",), (TL_FACE_STATUSES,)),
}

# numpy kinds a stored field may have: never objects ('O') or void blobs that hide them.
_ALLOWED_KINDS = set("biufUSM m".replace(" ", ""))


@dataclass(frozen=True)
class ArrayMeta:
    """The parsed ``.zarray`` of one 1-D structured array."""

    name: str
    dtype: np.dtype
    length: int
    chunk_rows: int
    #: An N-D array of one numeric type (an agents mask: ``(agents, 2)`` uint32) is read as 1-D
    #: records of its trailing dimensions (same bytes); ``tail`` holds those dimensions, whose
    #: chunk keys carry a ``.0`` each (``"3.0"``), joined by ``separator``.
    tail: tuple[int, ...] = ()
    separator: str = "."

    def key(self, index: int) -> str:
        """The store key of stored chunk ``index``."""
        return (f"{self.name}/" if self.name else "") + f"{index}" + "".join(self.separator + "0" for _ in self.tail)

    @property
    def nchunks(self) -> int:
        return -(-self.length // self.chunk_rows) if self.length else 0

    @property
    def chunk_nbytes(self) -> int:
        """The decoded size of every stored chunk (the last one is stored full size, padded)."""
        return self.chunk_rows * self.dtype.itemsize

    @property
    def typesize(self) -> int:
        """The element size blosc stores in a chunk's header: the record's (an N-D array's number
        type's, for arrays with a ``tail``), 1 past blosc's 255."""
        size = fields_of(self.dtype)["value"][0].base.itemsize if self.tail else self.dtype.itemsize
        return size if size <= 255 else 1

    def chunk_bounds(self, index: int) -> tuple[int, int]:
        """The row range ``[start, stop)`` of stored chunk ``index`` that holds data."""
        start = index * self.chunk_rows
        return start, min(start + self.chunk_rows, self.length)


def safe_dtype(text: str, kinds: set[str], what: str, why: str) -> np.dtype:
    """The numpy dtype spelled ``text``, refused unless its kind is one of ``kinds`` (never an
    object dtype: nothing read from a store is unpickled); errors start with ``what``."""
    try:
        dt = np.dtype(text)
    except (TypeError, ValueError, OverflowError, SyntaxError, MemoryError, RecursionError):
        # (numpy reads a comma string's repeats with ast.literal_eval: "<f4[" raised SyntaxError)
        raise FormatError(f"{what} an unknown dtype {_short(text)}") from None
    if dt.kind not in kinds:
        raise FormatError(f"{what} dtype {text!r}, {why}")
    if dt.str[0] == ">":
        # (L5Kit's arrays, as zarr-python writes numpy's, are little-endian: the compiled
        # readers read numbers in place in that order, and no writer makes another)
        raise FormatError(
            f"{what} dtype {text!r}, big-endian: l5dask reads little-endian numbers only ({'<' + dt.str[1:]!r}, "
            "as L5Kit writes them)"
        )
    return dt


def dtype_from_descr(descr: Any, where: str) -> np.dtype:
    """Build a numpy dtype from a zarr v2 ``dtype`` entry, refusing anything unsafe.

    Object dtypes (which zarr decodes with pickle or other object codecs) and
    anything that is not a plain structured dtype of numbers and fixed strings
    are refused: data from a store is never unpickled.
    """
    if not isinstance(descr, list) or not 0 < len(descr) <= 256:
        raise FormatError(f"{where}: dtype {_short(descr)} is not a structured dtype (a list of 1 to 256 fields)")
    fields: list[tuple] = []
    for entry in descr:
        if not (isinstance(entry, list) and len(entry) in (2, 3) and isinstance(entry[0], str)):
            raise FormatError(f"{where}: malformed dtype field {_short(entry)}")
        name, base = entry[0], entry[1]
        if not isinstance(base, str):
            raise FormatError(f"{where}: field {name!r} has a nested or unsupported dtype {_short(base)}")
        base_dt = safe_dtype(
            base,
            _ALLOWED_KINDS,
            f"{where}: field {name!r} has",
            "which would need object/pickle decoding; refusing to read it",
        )
        if len(entry) == 3:
            shape = entry[2]
            if not (
                isinstance(shape, list)
                and len(shape) <= 8
                and all(is_count(s, 0, MAX_CHUNK_NBYTES) for s in shape)
                and int(np.prod(shape, dtype=object)) * base_dt.itemsize <= MAX_CHUNK_NBYTES
            ):
                raise FormatError(f"{where}: field {name!r} has a malformed shape {_short(shape)}")
            fields.append((name, base_dt, tuple(shape)))
        else:
            fields.append((name, base_dt))
    try:
        dtype = np.dtype(fields)
    except (TypeError, ValueError, OverflowError) as exc:
        raise FormatError(f"{where}: invalid dtype: {exc}") from None
    if dtype.itemsize > MAX_CHUNK_NBYTES:
        raise FormatError(f"{where}: records of {dtype.itemsize:,} bytes are larger than a chunk holds")
    return dtype


def descr_from_dtype(dtype: np.dtype) -> list[list[Any]]:
    """The zarr v2 JSON ``dtype`` entry of a structured dtype (as zarr-python 2 writes it)."""
    out: list[list[Any]] = []
    for name in dtype.names or ():
        sub = fields_of(dtype)[name][0]
        if sub.subdtype is not None:
            base, shape = sub.subdtype
            out.append([name, base.str, list(shape)])
        else:
            out.append([name, sub.str])
    return out


#: Fields whose width the compiled loops read as L5Kit writes it (the report's speeds and
#: distances: float32 velocities, float64 centroids); another width of them is refused when the
#: dataset is opened (the others of the same kind are read at any width).
EXACT_WIDTH = {("agents", "velocity"), ("agents", "centroid")}


def check_fields(name: str, dtype: np.dtype, where: str) -> None:
    """Check that ``dtype`` holds the fields a reader needs, with the expected types."""
    if dtype.names is None:
        raise FormatError(f"{where}: array {name!r} does not have a structured dtype")
    expected = DTYPES.get(name)
    if expected is None:
        return
    missing = [f for f in REQUIRED_FIELDS[name] if f not in dtype.names]
    if missing:
        raise FormatError(f"{where}: array {name!r} lacks the field(s) {', '.join(missing)}")
    for field in dtype.names:
        if field not in names_of(expected):
            continue
        got, want = fields_of(dtype)[field][0], fields_of(expected)[field][0]
        wide = (name, field) in EXACT_WIDTH and got.base.itemsize != want.base.itemsize
        if got.shape != want.shape or got.base.kind != want.base.kind or wide:
            raise FormatError(
                f"{where}: field {name}.{field} has dtype {got.base.str}{list(got.shape)}, "
                f"expected {want.base.str}{list(want.shape)}"
            )


#: Bounds on what metadata may say, checked before anything is sized by it: rows of an array
#: (2**48: far past train_full's 2.6e9 agents), stored chunks of an array (a task graph of 2**24
#: tasks is already beyond any scheduler), bytes of a metadata document (L5Kit's are under 2 KB).
MAX_ROWS = 2**48
MAX_CHUNKS = 2**24
MAX_METADATA_BYTES = 1 << 20


def load_json(raw: bytes | str, where: str, what: str) -> Any:
    """The JSON document ``raw`` (a metadata object, at most ``MAX_METADATA_BYTES``), or one
    ``FormatError`` line: not JSON, not UTF-8, too large, or nested too deeply for the parser."""
    if len(raw) > MAX_METADATA_BYTES:
        raise FormatError(f"{where}: {what} is {len(raw):,} bytes, more than metadata holds ({MAX_METADATA_BYTES:,})")
    try:
        return json.loads(raw)
    except RecursionError:
        raise FormatError(f"{where}: {what} is JSON nested too deeply to be metadata") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise FormatError(f"{where}: {what} is not valid JSON ({exc})") from None


def is_count(value: Any, lo: int = 0, hi: int = MAX_ROWS) -> bool:
    """Whether ``value`` is a JSON integer (not a bool) in ``[lo, hi]``."""
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def check_size(meta: ArrayMeta, where: str) -> ArrayMeta:
    """``meta``, once its rows, chunks and record size are within what a store holds and a chunk
    can decode to (blosc's 2 GB); one ``FormatError`` line otherwise."""
    if meta.dtype.itemsize == 0:
        raise FormatError(f"{where}: records of 0 bytes")
    if meta.chunk_nbytes > MAX_CHUNK_NBYTES:
        raise FormatError(
            f"{where}: chunks of {meta.chunk_rows:,} rows of {meta.dtype.itemsize:,} bytes "
            f"({meta.chunk_nbytes:,} bytes), more than a blosc chunk holds ({MAX_CHUNK_NBYTES:,})"
        )
    if meta.nchunks > MAX_CHUNKS:
        raise FormatError(
            f"{where}: {meta.length:,} rows in {meta.nchunks:,} chunks of {meta.chunk_rows:,}, "
            f"more chunks than l5dask reads ({MAX_CHUNKS:,}); rechunk the array"
        )
    return meta


def _load_zarray(raw: bytes, where: str) -> dict:
    """A ``.zarray``'s JSON object, refused unless it is zarr v2 metadata."""
    meta = load_json(raw, where, ".zarray")
    if not isinstance(meta, dict):
        raise FormatError(f"{where}: .zarray is not a JSON object")
    if meta.get("zarr_format") != 2:
        raise FormatError(f"{where}: zarr_format is {meta.get('zarr_format')!r}, expected 2")
    return meta


def parse_zarray(name: str, raw: bytes, where: str) -> ArrayMeta:
    """Parse and validate the ``.zarray`` JSON of one L5Kit array."""
    meta = _load_zarray(raw, where)
    dtype = dtype_from_descr(meta.get("dtype"), where)
    check_fields(name, dtype, where)
    shape, chunks = meta.get("shape"), meta.get("chunks")
    if not (isinstance(shape, list) and len(shape) == 1 and isinstance(chunks, list) and len(chunks) == 1):
        raise FormatError(f"{where}: expected a 1-D array, got shape {shape!r} chunks {chunks!r}")
    if not (is_count(shape[0]) and is_count(chunks[0], 1)):
        raise FormatError(
            f"{where}: invalid shape {_short(shape)} or chunks {_short(chunks)} "
            f"(whole numbers, rows up to {MAX_ROWS:,}, chunks of at least one row)"
        )
    if meta.get("filters"):
        raise FormatError(f"{where}: filters {meta['filters']!r} are not supported (L5Kit writes none)")
    comp = meta.get("compressor")
    if comp is not None and (not isinstance(comp, dict) or comp.get("id") not in ("blosc",)):
        raise FormatError(
            f"{where}: compressor {comp!r} is not supported; L5Kit datasets use blosc "
            "(object or pickle codecs are refused)"
        )
    if meta.get("order", "C") != "C":
        raise FormatError(f"{where}: order {meta.get('order')!r} is not supported")
    return check_size(ArrayMeta(name, dtype, int(shape[0]), int(chunks[0])), where)


def _short(value: Any) -> str:
    """``repr(value)``, cut to fit one line of an error."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def is_compressed(raw: bytes) -> bool:
    """Whether a ``.zarray`` (already parsed and checked) names a compressor."""
    return json.loads(raw).get("compressor") is not None


#: Where L5Kit's ``select_agents`` writes agent masks: ``agents_mask/{threshold}``.
MASKS = "agents_mask"


def parse_nd_zarray(name: str, raw: bytes, where: str) -> ArrayMeta:
    """Parse the ``.zarray`` of an N-D array of one number type chunked along its first axis only
    (L5Kit's agent masks: uint32, ``(agents, 2)``, chunks ``(10000, 2)``), as 1-D records."""
    meta = _load_zarray(raw, where)
    descr = meta.get("dtype")
    if not isinstance(descr, str):
        raise FormatError(f"{where}: dtype {descr!r} is not a plain number type")
    base = safe_dtype(descr, set("biuf"), f"{where}: it has", "which is not a number type; refusing to read it")
    shape: Any = meta.get("shape")
    chunks: Any = meta.get("chunks")
    ok = (
        isinstance(shape, list)
        and isinstance(chunks, list)
        and 1 <= len(shape) == len(chunks) <= 8
        and all(is_count(v) for v in shape + chunks)
        and chunks[0] > 0
    )
    if not ok or list(chunks[1:]) != list(shape[1:]):
        raise FormatError(
            f"{where}: expected chunks along the first axis only, got shape {_short(shape)} chunks {_short(chunks)}"
        )
    comp = meta.get("compressor")
    if (
        meta.get("filters")
        or meta.get("order", "C") != "C"
        or (comp is not None and (not isinstance(comp, dict) or comp.get("id") != "blosc"))
    ):
        raise FormatError(f"{where}: only blosc-compressed C-order arrays without filters are supported")
    tail = tuple(shape[1:])
    if int(np.prod(tail, dtype=object)) * base.itemsize > MAX_CHUNK_NBYTES:
        raise FormatError(f"{where}: rows of shape {_short(tail)} are larger than a chunk holds")
    separator = meta.get("dimension_separator", ".")
    if separator not in (".", "/"):
        raise FormatError(f"{where}: dimension_separator {_short(separator)} is neither '.' nor '/'")
    dtype = np.dtype([("value", base, tail)]) if tail else np.dtype([("value", base)])
    return check_size(ArrayMeta(name, dtype, int(shape[0]), int(chunks[0]), tail, separator), where)


def zarray_json(dtype: np.dtype, length: int, chunk_rows: int, tail: tuple[int, ...] = ()) -> bytes:
    """The ``.zarray`` that zarr-python 2 (hence L5Kit) writes for such an array (for an N-D array
    of one number type, ``tail``: its records are its trailing dimensions, as L5Kit's masks)."""
    meta: dict[str, Any] = {
        "chunks": [chunk_rows],
        "compressor": dict(COMPRESSOR),
        "dtype": descr_from_dtype(dtype),
        "fill_value": base64.standard_b64encode(np.zeros((), dtype=dtype).tobytes()).decode(),
        "filters": None,
        "order": "C",
        "shape": [length],
        "zarr_format": 2,
    }
    if tail:
        base = fields_of(dtype)["value"][0].base
        meta.update(
            chunks=[chunk_rows, *tail],
            shape=[length, *tail],
            dtype=base.str,
            fill_value=0 if base.kind in "biu" else 0.0,
        )
    return json_text(meta, indent=4, sort_keys=True, ensure_ascii=True).encode()


def parse_zattrs(raw: bytes | None, where: str) -> dict[str, Any]:
    """The dataset's ``.zattrs`` (``{}`` when absent), refused unless its ``labels`` (when given)
    are the names of the 17 label probabilities: 17 distinct non-empty strings."""
    if raw is None:
        return {}
    attrs = load_json(raw, where, ".zattrs")
    if not isinstance(attrs, dict):
        raise FormatError(f"{where}: .zattrs is not a JSON object")
    labels = attrs.get("labels")
    if labels is not None:
        if not (
            isinstance(labels, list) and len(labels) == len(LABELS) and all(isinstance(x, str) and x for x in labels)
        ):
            raise FormatError(
                f"{where}: .zattrs labels must be {len(LABELS)} names (strings), one per label "
                f"probability; found {_short(labels)}"
            )
        if len(set(labels)) != len(labels):
            twice = sorted({x for x in labels if labels.count(x) > 1})
            raise FormatError(f"{where}: .zattrs labels must be distinct; {_short(twice)} appear more than once")
    return attrs


def zattrs_json(labels: tuple[str, ...] = LABELS) -> bytes:
    return json_text({"format_version": FORMAT_VERSION, "labels": list(labels)}, indent=4).encode()


ZGROUP_JSON = json_text({"zarr_format": 2}, indent=4).encode()


# --- what an output folder of each kind holds (anything else is a user's: never replaced) -------
_CHUNK_KEY = re.compile(r"\d+(\.\d+)*")
_ZARR2_META = (".zarray", ".zattrs")


def dataset_key(key: str) -> bool:
    """Whether ``key`` (a file's path in a dataset's folder, ``/`` between names) is one an L5Kit
    dataset holds: the group's ``.zgroup``, ``.zattrs`` (and a consolidated ``.zmetadata``), each
    array's ``.zarray``, ``.zattrs`` and numbered chunks, and the agent masks' group of arrays."""
    parts = key.split("/")
    if len(parts) == 1:
        return parts[0] in (".zgroup", ".zattrs", ".zmetadata")
    if parts[0] in ARRAY_NAMES:
        return len(parts) == 2 and (parts[1] in _ZARR2_META or _CHUNK_KEY.fullmatch(parts[1]) is not None)
    if parts[0] == MASKS:
        if len(parts) == 2:
            return parts[1] in (".zgroup", ".zattrs")
        return len(parts) == 3 and (parts[2] in _ZARR2_META or _CHUNK_KEY.fullmatch(parts[2]) is not None)
    return False


def export_key(key: str) -> bool:
    """Whether ``key`` is one an export holds (:mod:`l5dask.prediction.exports`): Parquet's
    ``ARRAY/part-NNNNNN.parquet``, or the zarr v3 layout's ``zarr.json`` files and
    ``ARRAY/FIELD/c/N[/0...]`` shards."""
    parts = key.split("/")
    if len(parts) == 1:
        return parts[0] == "zarr.json"
    if parts[0] not in ARRAY_NAMES:
        return False
    if len(parts) == 2:
        return parts[1] == "zarr.json" or re.fullmatch(r"part-\d+\.parquet", parts[1]) is not None
    if len(parts) == 3:
        return parts[2] == "zarr.json"
    return parts[2] == "c" and all(p.isdigit() for p in parts[3:])


#: The columns whose values in a part of the scenes (``--scenes``, a job's ``scenes``) are those of
#: the subset, counted from 0 as in the subset ``l5dask subset`` writes.
RENUMBERED = ("scene_index", "frame_index", "agent_index")
