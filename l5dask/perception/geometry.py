"""The geometry of 3D boxes as the Lyft SDK's ``Box3D`` computes it, vectorised: volume, ground
corners and area, and for pairs of boxes their height, ground and volume intersections and IoU.

Two geometries (``geometry=``), which differ in one line of the SDK:

- ``"corrected"`` (the default): the SDK's source since lyft/nuscenes-devkit PR #64 (2019-11-03),
  ``sin = R[1, 0]`` of the box's rotation matrix: a box's ground rectangle turns with its yaw;
- ``"sdk-0.0.8"``: the last PyPI release, ``sin = R[0, 1]``, minus the sine of the yaw: every box
  is drawn with its yaw mirrored. Two 2 x 4 m boxes at yaw 30 degrees offset by (0.5, 0.5) m have
  IoU 0.6043 in the first and 0.4581 in the second.

``R`` is pyquaternion's rotation matrix of the box's quaternion (w, x, y, z; normalised), the
ground corners ``centre +- length / 2 (cos, sin) +- width / 2 (sin, -cos)`` in the SDK's order.

Boxes are a :class:`~l5dask.perception.boxes.Boxes` or a triple ``(translation, size, rotation)``
of arrays (n, 3), (n, 3), (n, 4), or one box's (3,), (3,), (4,). They are checked as
:func:`~l5dask.perception.detection.evaluate` checks its files: finite numbers, positive sizes,
rotations of 4 numbers and a norm that is not 0; the first bad box is named in one line.

Pairs are element-wise (``a[k]`` with ``b[k]``; one side may be a single box) or, with
``outer=True``, every pair (``len(a) x len(b)``, a sample's boxes against another's). The pairs are
computed by a compiled loop (``box_pairs`` in ``_geometry.pyx``: in float64, the second box's
rectangle taken into the first's axes and its edges integrated against the first's rectangle),
within 1e-12 of GEOS's (the SDK's shapely) relative to the boxes' areas and volumes; an IoU within ``EPS`` (1e-9) of one of
``thresholds`` is computed again with the SDK's own arithmetic (pyquaternion and shapely), so that
``iou(a, b) > t`` is decided as the SDK (and ``evaluate``) decides it.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from l5dask.core.lazy import compiled
from l5dask.core.policy import thread_pool
from l5dask.errors import FormatError, UsageError

__all__ = [
    "DEFAULT_GEOMETRY",
    "EPS",
    "GEOMETRIES",
    "THRESHOLDS",
    "area_intersection",
    "check_geometry",
    "ground_area",
    "ground_corners",
    "height_intersection",
    "intersection",
    "iou",
    "volume",
]

_compiled = compiled("l5dask.perception._geometry")

#: The geometries a box's ground rectangle can be drawn in (see the module's text).
GEOMETRIES = ("corrected", "sdk-0.0.8")
#: The SDK's source since PR #64 (``sin = R[1, 0]``).
DEFAULT_GEOMETRY = "corrected"
#: The competition's IoU thresholds.
THRESHOLDS = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
#: IoUs closer than this to a threshold (or to each other, where a match's choice turns on it) are
#: computed with the SDK's own arithmetic. The compiled IoU differs from GEOS's by about 1e-15.
EPS = 1e-9

#: Pairs a call of the compiled loop computes at most (all pairs: in blocks of whole rows); the blocks
#: run on the cores' threads.
_BLOCK_PAIRS = 1 << 18


def check_geometry(geometry: str) -> str:
    """``geometry`` if it is one of :data:`GEOMETRIES`, else a one-line error listing them."""
    if geometry not in GEOMETRIES:
        raise UsageError(f"unknown geometry {geometry!r}: use {' or '.join(GEOMETRIES)}")
    return geometry


def check_values(xyz: np.ndarray, size: np.ndarray, rotation: np.ndarray, at, rotation_name: str = "rotation") -> None:
    """Finite numbers, positive sizes, rotations whose norm is not 0: else an error naming the
    first bad box (``at(i)``, e.g. ``"pred.json: row 3"``) and the field, in one line."""
    for name, values in (("translation", xyz), ("size", size), (rotation_name, rotation)):
        bad = ~np.isfinite(values).all(axis=1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise FormatError(f"{at(i)}: {name} is not finite ({values[i].tolist()})")
    bad = ~(size > 0).all(axis=1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise FormatError(f"{at(i)}: size must be positive, got {size[i].tolist()}")
    if rotation.shape[1] == 4:
        bad = ~(np.sqrt((rotation * rotation).sum(axis=1)) > 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise FormatError(f"{at(i)}: rotation {rotation[i].tolist()} has norm 0 (it is no rotation)")


def columns(boxes: Any, name: str = "boxes", check: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(translation, size, rotation)`` of boxes given as a ``Boxes`` or a triple of arrays,
    as float64 (n, 3), (n, 3), (n, 4); with ``check``, their values checked (:func:`check_values`)."""
    if _is_boxes(boxes):
        out = [np.ascontiguousarray(boxes.xyz), np.ascontiguousarray(boxes.size), np.ascontiguousarray(boxes.rotation)]
    else:
        if not isinstance(boxes, (tuple, list)) or len(boxes) != 3:
            raise UsageError(f"{name}: expected a Boxes or (translation, size, rotation), got {type(boxes).__name__}")
        out = []
        for field, want, values in zip(("translation", "size", "rotation"), (3, 3, 4), boxes):
            try:
                arr = np.asarray(values, dtype=np.float64)
            except (TypeError, ValueError):
                raise UsageError(f"{name}: {field} is not an array of numbers") from None
            if arr.ndim == 1:
                arr = arr[None, :]
            if arr.ndim != 2 or arr.shape[1] != want:
                raise UsageError(f"{name}: {field} has shape {np.shape(values)}, expected (n, {want}) or ({want},)")
            if out and len(arr) != len(out[0]):
                raise UsageError(f"{name}: {field} has {len(arr)} boxes, translation {len(out[0])}")
            out.append(np.ascontiguousarray(arr))
    if check:
        _check(boxes, name, out[0], out[1], out[2])
    return out[0], out[1], out[2]


def _is_boxes(boxes: Any) -> bool:
    """A :class:`~l5dask.perception.boxes.Boxes` (known by its columns: boxes.py imports this module)."""
    return all(hasattr(boxes, f) for f in ("xyz", "size", "rotation", "at"))


def _check(boxes: Any, name: str, xyz: np.ndarray, size: np.ndarray, rotation: np.ndarray, first: int = 0) -> None:
    """:func:`check_values` of boxes ``first`` on, named as their source names them (a file's row),
    or as ``name: box i`` (a usage error)."""
    if _is_boxes(boxes):
        check_values(xyz[first:], size[first:], rotation[first:], lambda i: boxes.at(first + i))
        return
    try:
        check_values(xyz[first:], size[first:], rotation[first:], lambda i: f"{name}: box {first + i}")
    except FormatError as exc:
        raise UsageError(str(exc)) from None


def cos_sin(rotation: np.ndarray, geometry: str = DEFAULT_GEOMETRY) -> tuple[np.ndarray, np.ndarray]:
    """``R[0, 0]`` and ``R[1, 0]`` (corrected) or ``R[0, 1]`` (sdk-0.0.8) of each normalised
    quaternion's rotation matrix (a zero quaternion gives 0, 0, as pyquaternion's does)."""
    check_geometry(geometry)
    norm = np.sqrt((rotation * rotation).sum(axis=1))
    q = rotation / np.where(norm > 0, norm, 1.0)[:, None]
    w, x, y, z = q.T
    cos = 1.0 - 2.0 * (y * y + z * z)
    cos = np.where(norm > 0, cos, 0.0)
    sin = 2.0 * (x * y + w * z) if geometry == "corrected" else 2.0 * (x * y - w * z)
    return cos, sin


def table(xyz: np.ndarray, size: np.ndarray, rotation: np.ndarray, geometry: str, origin=None) -> np.ndarray:
    """The 12 numbers of each box that ``match_boxes`` takes: ground corners (relative to ``origin``,
    (n, 2), or 0), z min, z max, volume, the corners' circle radius."""
    cos, sin = cos_sin(rotation, geometry)
    wid, length, height = size.T
    cx, cy = (xyz[:, 0], xyz[:, 1]) if origin is None else (xyz[:, 0] - origin[:, 0], xyz[:, 1] - origin[:, 1])
    lc, ls, wc, ws = length / 2 * cos, length / 2 * sin, wid / 2 * cos, wid / 2 * sin
    out = np.empty((len(xyz), 12))
    out[:, 0], out[:, 1] = cx + lc + ws, cy + ls - wc
    out[:, 2], out[:, 3] = cx + lc - ws, cy + ls + wc
    out[:, 4], out[:, 5] = cx - lc - ws, cy - ls + wc
    out[:, 6], out[:, 7] = cx - lc + ws, cy - ls - wc
    out[:, 8] = xyz[:, 2] - height / 2
    out[:, 9] = xyz[:, 2] + height / 2
    out[:, 10] = wid * length * height
    out[:, 11] = np.hypot(wid, length) / 2 * np.maximum(1.0, np.hypot(cos, sin))
    return out


def volume(boxes: Any) -> np.ndarray:
    """Each box's volume, ``width * length * height`` (the SDK's ``np.prod(size)``)."""
    _, size, _ = columns(boxes)
    return size[:, 0] * size[:, 1] * size[:, 2]


def ground_corners(boxes: Any, geometry: str = DEFAULT_GEOMETRY) -> np.ndarray:
    """Each box's 4 ground corners (n, 4, 2), x and y, in the order of the SDK's polygon."""
    xyz, size, rotation = columns(boxes)
    return table(xyz, size, rotation, check_geometry(geometry))[:, :8].reshape(-1, 4, 2)


def ground_area(boxes: Any, geometry: str = DEFAULT_GEOMETRY) -> np.ndarray:
    """Each box's ground polygon's area: ``width * length`` for a box turned about z only (a tilted
    quaternion's ``R[0, 0]`` and sine do not make a unit vector, and the SDK's polygon scales)."""
    xyz, size, rotation = columns(boxes)
    cos, sin = cos_sin(rotation, geometry)
    return size[:, 0] * size[:, 1] * (cos * cos + sin * sin)


def _pairs(a: Any, b: Any, what: int, outer: bool, geometry: str, thresholds=()) -> tuple[np.ndarray, np.ndarray]:
    """The values of the pairs, and the flat indices of those within ``EPS`` (1e-9) of a threshold."""
    check_geometry(geometry)
    ca, cb = columns(a, "a", check=False), columns(b, "b", check=False)
    na, nb = len(ca[0]), len(cb[0])
    if not outer and na != nb and min(na, nb) != 1:
        raise UsageError(f"pairs of boxes: a has {na} boxes and b {nb} (equal lengths, one box, or outer=True)")
    out: np.ndarray = np.empty((na, nb) if outer else (max(na, nb) if na and nb else 0))
    thr = np.asarray(list(thresholds), np.float64)
    flat = out.reshape(-1)
    near = np.zeros(len(flat) if len(thr) else 0, np.uint8)
    corrected = geometry == "corrected"

    def block(lo: int, hi: int) -> tuple[int, int]:
        """Pairs [lo, hi) (of flat indices; all pairs: whole rows of a), their first bad boxes."""
        xa: list[np.ndarray]
        xb: list[np.ndarray]
        if outer:
            i, j = lo // max(nb, 1), hi // max(nb, 1)
            xa, xb = [x[i:j] for x in ca], list(cb)
        else:
            xa = list(ca) if na == 1 else [x[lo:hi] for x in ca]
            xb = list(cb) if nb == 1 else [x[lo:hi] for x in cb]
        _, bad_a, bad_b = _compiled.box_pairs(
            *xa, *xb, corrected, what, outer, flat[lo:hi], thr, EPS, near[lo:hi] if len(near) else near
        )
        return bad_a, bad_b

    # blocks of at most _BLOCK_PAIRS pairs (all pairs: of whole rows of a), on the cores' threads (the
    # compiled loop lets the GIL go)
    step = max(1, _BLOCK_PAIRS // max(nb, 1)) * max(nb, 1) if outer else _BLOCK_PAIRS
    cuts = list(range(0, len(flat), step)) + [len(flat)]
    spans = list(zip(cuts[:-1], cuts[1:])) or [(0, 0)]
    threads = min(len(spans), os.cpu_count() or 1)
    if threads > 1:
        with thread_pool(threads, "l5-geometry") as pool:
            bads = list(pool.map(lambda span: block(*span), spans))
    else:
        bads = [block(*span) for span in spans]
    if any(ba >= 0 for ba, _ in bads):
        _check(a, "a", *ca)
    if any(bb >= 0 for _, bb in bads):
        _check(b, "b", *cb)
    return out, np.flatnonzero(near)


def height_intersection(a: Any, b: Any, outer: bool = False) -> np.ndarray:
    """The overlap of the boxes' heights (``Box3D.get_height_intersection``), of each pair."""
    return _pairs(a, b, 0, outer, DEFAULT_GEOMETRY)[0]


def area_intersection(a: Any, b: Any, outer: bool = False, geometry: str = DEFAULT_GEOMETRY) -> np.ndarray:
    """The area of the intersection of the boxes' ground polygons (``Box3D.get_area_intersection``)."""
    return _pairs(a, b, 1, outer, geometry)[0]


def intersection(a: Any, b: Any, outer: bool = False, geometry: str = DEFAULT_GEOMETRY) -> np.ndarray:
    """The volume of the boxes' intersection, height overlap times ground intersection area
    (``Box3D.get_intersection``)."""
    return _pairs(a, b, 2, outer, geometry)[0]


def iou(a: Any, b: Any, outer: bool = False, geometry: str = DEFAULT_GEOMETRY, thresholds=THRESHOLDS) -> np.ndarray:
    """The 3D IoU of each pair, intersection over union of the volumes, clipped to [0, 1]
    (``Box3D(a).get_iou(Box3D(b))``). A value within ``EPS`` (1e-9) of one of ``thresholds`` is the
    SDK's own (pyquaternion and shapely), so that comparisons with them decide as the SDK does."""
    out, near = _pairs(a, b, 3, outer, geometry, thresholds)
    flat = out.reshape(-1)
    if len(near):
        ca, cb = columns(a, "a", check=False), columns(b, "b", check=False)
        for k in near.tolist():
            i, j = divmod(k, len(cb[0])) if outer else (min(k, len(ca[0]) - 1), min(k, len(cb[0]) - 1))
            flat[k] = sdk_iou(
                sdk_box(ca[0][i], ca[1][i], ca[2][i], geometry), sdk_box(cb[0][j], cb[1][j], cb[2][j], geometry)
            )
    return out


# --- the SDK's own arithmetic ---------------------------------------------------------------------
def sdk_box(xyz, size, rotation, geometry: str = DEFAULT_GEOMETRY):
    """The SDK's ``Box3D`` geometry of one box, with its own libraries and arithmetic: its ground
    polygon (shapely), z min, z max and volume."""
    from pyquaternion import Quaternion
    from shapely.geometry import Polygon

    rm = Quaternion(list(map(float, rotation))).rotation_matrix
    cos, sin = rm[0, 0], (rm[1, 0] if geometry == "corrected" else rm[0, 1])
    width, length, height = map(float, size)
    cx, cy, cz = map(float, xyz)
    p = [
        (cx + length / 2 * cos + width / 2 * sin, cy + length / 2 * sin - width / 2 * cos),
        (cx + length / 2 * cos - width / 2 * sin, cy + length / 2 * sin + width / 2 * cos),
        (cx - length / 2 * cos - width / 2 * sin, cy - length / 2 * sin + width / 2 * cos),
        (cx - length / 2 * cos + width / 2 * sin, cy - length / 2 * sin - width / 2 * cos),
    ]
    return Polygon([*p, p[0]]), cz - height / 2, cz + height / 2, np.prod([width, length, height])


def sdk_iou(a, b) -> float:
    """``Box3D.get_iou`` of two :func:`sdk_box` geometries."""
    poly_a, lo_a, hi_a, vol_a = a
    poly_b, lo_b, hi_b, vol_b = b
    height = max(0, min(hi_b, hi_a) - max(lo_b, lo_a))
    inter = height * poly_a.intersection(poly_b).area
    return float(np.clip(inter / (vol_a + vol_b - inter), 0, 1))
