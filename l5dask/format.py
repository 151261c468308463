"""The L5Kit zarr v2 on-disk format: the one place for its constants and dtype rules.

Everything here is pure: no I/O. It follows L5Kit 1.5.0's ``ChunkedDataset`` (``l5kit/data/zarr_dataset.py``, ``labels.py``).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import FormatError

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

    def chunk_bounds(self, index: int) -> tuple[int, int]:
        """The row range ``[start, stop)`` of stored chunk ``index`` that holds data."""
        start = index * self.chunk_rows
        return start, min(start + self.chunk_rows, self.length)


def safe_dtype(text: str, kinds: set[str], what: str, why: str) -> np.dtype:
    """The numpy dtype spelled ``text``, refused unless its kind is one of ``kinds`` (never an
    object dtype: nothing read from a store is unpickled); errors start with ``what``."""
    try:
        dt = np.dtype(text)
    except TypeError as exc:
        raise FormatError(f"{what} an unknown dtype {text!r}") from exc
    if dt.kind not in kinds:
        raise FormatError(f"{what} dtype {text!r}, {why}")
    return dt


def dtype_from_descr(descr: Any, where: str) -> np.dtype:
    """Build a numpy dtype from a zarr v2 ``dtype`` entry, refusing anything unsafe.

    Object dtypes (which zarr decodes with pickle or other object codecs) and
    anything that is not a plain structured dtype of numbers and fixed strings
    are refused: data from a store is never unpickled.
    """
    if not isinstance(descr, list):
        raise FormatError(f"{where}: dtype {descr!r} is not a structured dtype (a list of fields)")
    fields = []
    for entry in descr:
        if not (isinstance(entry, list) and len(entry) in (2, 3) and isinstance(entry[0], str)):
            raise FormatError(f"{where}: malformed dtype field {entry!r}")
        name, base = entry[0], entry[1]
        if not isinstance(base, str):
            raise FormatError(f"{where}: field {name!r} has a nested or unsupported dtype {base!r}")
        base_dt = safe_dtype(base, _ALLOWED_KINDS, f"{where}: field {name!r} has",
                             "which would need object/pickle decoding; refusing to read it")
        if len(entry) == 3:
            shape = entry[2]
            if not (isinstance(shape, list) and all(isinstance(s, int) and s >= 0 for s in shape)):
                raise FormatError(f"{where}: field {name!r} has a malformed shape {shape!r}")
            fields.append((name, base_dt, tuple(shape)))
        else:
            fields.append((name, base_dt))
    try:
        return np.dtype(fields)
    except (TypeError, ValueError) as exc:
        raise FormatError(f"{where}: invalid dtype: {exc}") from exc


def descr_from_dtype(dtype: np.dtype) -> list[list[Any]]:
    """The zarr v2 JSON ``dtype`` entry of a structured dtype (as zarr-python 2 writes it)."""
    out: list[list[Any]] = []
    for name in dtype.names or ():
        sub = dtype.fields[name][0]
        if sub.subdtype is not None:
            base, shape = sub.subdtype
            out.append([name, base.str, list(shape)])
        else:
            out.append([name, sub.str])
    return out


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
        if field not in expected.names:
            continue
        got, want = dtype.fields[field][0], expected.fields[field][0]
        if got.shape != want.shape or got.base.kind != want.base.kind:
            raise FormatError(
                f"{where}: field {name}.{field} has dtype {got.base.str}{list(got.shape)}, "
                f"expected {want.base.str}{list(want.shape)}"
            )


def _load_zarray(raw: bytes, where: str) -> dict:
    """A ``.zarray``'s JSON object, refused unless it is zarr v2 metadata."""
    try:
        meta = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FormatError(f"{where}: .zarray is not valid JSON ({exc})") from exc
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
    if not (isinstance(shape[0], int) and shape[0] >= 0 and isinstance(chunks[0], int) and chunks[0] > 0):
        raise FormatError(f"{where}: invalid shape {shape!r} or chunks {chunks!r}")
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
    return ArrayMeta(name, dtype, int(shape[0]), int(chunks[0]))


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
    shape, chunks = meta.get("shape"), meta.get("chunks")
    ok = (isinstance(shape, list) and isinstance(chunks, list) and len(shape) == len(chunks) >= 1
          and all(isinstance(v, int) and v >= 0 for v in shape + chunks) and chunks[0] > 0)
    if not ok or list(chunks[1:]) != list(shape[1:]):
        raise FormatError(f"{where}: expected chunks along the first axis only, got shape {shape!r} chunks {chunks!r}")
    comp = meta.get("compressor")
    if meta.get("filters") or meta.get("order", "C") != "C" or (
            comp is not None and (not isinstance(comp, dict) or comp.get("id") != "blosc")):
        raise FormatError(f"{where}: only blosc-compressed C-order arrays without filters are supported")
    tail = tuple(shape[1:])
    dtype = np.dtype([("value", base, tail)]) if tail else np.dtype([("value", base)])
    return ArrayMeta(name, dtype, int(shape[0]), int(chunks[0]), tail, meta.get("dimension_separator", "."))


def zarray_json(dtype: np.dtype, length: int, chunk_rows: int, tail: tuple[int, ...] = ()) -> bytes:
    """The ``.zarray`` that zarr-python 2 (hence L5Kit) writes for such an array (for an N-D array
    of one number type, ``tail``: its records are its trailing dimensions, as L5Kit's masks)."""
    meta = {
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
        base = dtype.fields["value"][0].base
        meta.update(chunks=[chunk_rows, *tail], shape=[length, *tail], dtype=base.str,
                    fill_value=0 if base.kind in "biu" else 0.0)
    return json.dumps(meta, indent=4, sort_keys=True, ensure_ascii=True).encode()


def zattrs_json(labels: tuple[str, ...] = LABELS) -> bytes:
    return json.dumps({"format_version": FORMAT_VERSION, "labels": list(labels)}, indent=4).encode()


ZGROUP_JSON = json.dumps({"zarr_format": 2}, indent=4).encode()
