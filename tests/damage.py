"""Damaged copies of a dataset, one per class of bad input that must be refused in one line.

Each damage edits a copy of a generated dataset in place: a chunk's blosc header or bytes, an
array's ``.zarray``, the root's ``.zattrs``. ``CHUNK`` damages are found when the chunk is read
(by the pass); ``METADATA`` damages when the dataset is opened, before any graph is built. Each
comes with the pattern its one-line message must match. The fuzz harness (``tests/fuzz``) seeds
its corpus from the same functions.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np

#: blosc 1.x header: version, versionlz, flags, typesize, nbytes, blocksize, cbytes
HEADER = struct.Struct("<BBBBiii")


def header(raw: bytes) -> list[int]:
    return list(HEADER.unpack_from(raw))


def with_header(raw: bytes, **changes: int) -> bytes:
    names = ("version", "versionlz", "flags", "typesize", "nbytes", "blocksize", "cbytes")
    values = dict(zip(names, header(raw)))
    values.update(changes)
    return HEADER.pack(*(values[n] for n in names)) + raw[16:]


def _chunk(edit: Callable[[bytes], bytes], array: str = "agents", chunk: str = "0") -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        path = root / array / chunk
        path.write_bytes(edit(path.read_bytes()))

    return damage


def _zarray(edit: Callable[[dict], None], array: str = "agents") -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        path = root / array / ".zarray"
        meta = json.loads(path.read_text())
        edit(meta)
        path.write_text(json.dumps(meta))

    return damage


def _raw(name: str, text: str) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        (root / name).write_text(text)

    return damage


def _zattrs(labels) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        path = root / ".zattrs"
        attrs = json.loads(path.read_text()) if path.exists() else {}
        attrs["labels"] = labels
        path.write_text(json.dumps(attrs))

    return damage


def _fewer_bytes(raw: bytes) -> bytes:
    """The header says 100 records fewer than the chunk holds (numcodecs decodes that many into a
    larger buffer and raises nothing)."""
    h = header(raw)
    return with_header(raw, nbytes=h[4] - 100 * h[3])


def _set_dtype(name: str, base: str) -> Callable[[dict], None]:
    def edit(meta: dict) -> None:
        for field in meta["dtype"]:
            if field[0] == name:
                field[1] = base

    return edit


DEEP = "[" * 5000 + "]" * 5000
SHUFFLED = (
    r"type size {} in its header, 116 for the array's elements: a chunk shuffled by another type size is valid "
    r"but not supported"
)
CHUNK_MESSAGE = r"array 'agents', chunk '0': truncated or corrupt chunk \({}"

#: (name, damage, message pattern) of chunks, refused when read
CHUNK: list[tuple[str, Callable[[Path], None], str]] = [
    (
        "header-says-fewer-bytes",
        _chunk(_fewer_bytes),
        CHUNK_MESSAGE.format(r"its header says \d+ bytes decoded, the array's metadata \d+"),
    ),
    (
        "type-size-0",
        _chunk(lambda r: with_header(r, typesize=0)),
        CHUNK_MESSAGE.format("type size 0 in its header, 116"),
    ),
    (
        "type-size-0-split-flag-clear",
        _chunk(lambda r: with_header(r, typesize=0, flags=header(r)[2] & ~0x10)),
        CHUNK_MESSAGE.format("type size 0 in its header"),
    ),
    ("lz4-version-2", _chunk(lambda r: with_header(r, versionlz=2)), CHUNK_MESSAGE.format("lz4 format version 2")),
    ("blosc-version-3", _chunk(lambda r: with_header(r, version=3)), CHUNK_MESSAGE.format("blosc format version 3")),
    ("future-flag", _chunk(lambda r: with_header(r, flags=header(r)[2] | 0x08)), CHUNK_MESSAGE.format("header flags")),
    ("truncated", _chunk(lambda r: r[: len(r) // 2]), CHUNK_MESSAGE.format(r"it holds \d+ bytes, its header says")),
    ("block-size-0", _chunk(lambda r: with_header(r, blocksize=0)), CHUNK_MESSAGE.format("block size 0")),
    ("stream-zeroed", _chunk(lambda r: r[: len(r) // 2] + bytes(len(r) - len(r) // 2)), CHUNK_MESSAGE.format("")),
    ("empty-chunk", _chunk(lambda r: b""), CHUNK_MESSAGE.format("0 bytes, shorter than a blosc header")),
    # valid (zarr-python 2 unshuffles by the header's type size) but not supported: a damaged type
    # size reads the same way, into other numbers, without an error
    ("type-size-4-shuffled", _chunk(lambda r: _reencoded(4)(r)), CHUNK_MESSAGE.format(SHUFFLED.format(4))),
    ("type-size-1-shuffled", _chunk(lambda r: _reencoded(1)(r)), CHUNK_MESSAGE.format(SHUFFLED.format(1))),
    ("type-size-damaged", _chunk(lambda r: with_header(r, typesize=4)), CHUNK_MESSAGE.format(SHUFFLED.format(4))),
    (
        "missing-chunk",
        lambda root: (root / "agents" / "0").unlink(),
        r"array 'agents', chunk '0': object 'agents/0' is missing",
    ),
]


def _reencoded(itemsize: int, shuffle: int = 1) -> Callable[[bytes], bytes]:
    """The chunk's records compressed again with blosc's type size ``itemsize`` (numcodecs takes
    it from the buffer's item size), not the record size."""

    def edit(raw: bytes) -> bytes:
        from numcodecs import Blosc

        records = np.frombuffer(Blosc().decode(raw), np.uint8)
        return Blosc("lz4", 5, shuffle).encode(records.view(f"V{itemsize}") if itemsize > 1 else records)

    return edit


#: (name, edit) of valid encodings zarr-python 2 decodes that L5Kit does not write: read as
#: zarr-python 2 reads them, the same numbers as the chunk they replace (a type size that is not
#: the record size, in a chunk that is not shuffled, changes no decoded byte)
VALID: list[tuple[str, Callable[[Path], None]]] = [
    ("trailing-bytes", _chunk(lambda r: r + b"\0" * 7)),
    ("type-size-4-no-shuffle", _chunk(_reencoded(4, shuffle=0))),
    ("type-size-1-no-shuffle", _chunk(_reencoded(1, shuffle=0))),
    ("type-size-232-no-shuffle", _chunk(_reencoded(232, shuffle=0))),
    ("type-size-29-no-shuffle", _chunk(_reencoded(29, shuffle=0))),
]

#: (name, damage, message pattern) of metadata, refused when the dataset is opened
METADATA: list[tuple[str, Callable[[Path], None], str]] = [
    (
        "extra-field",
        _zarray(lambda m: m["dtype"].append(["extra", "<f4"])),
        r"array 'agents': its last chunk \('agents/\d+'\) does not match its \.zarray \(5,000 rows of 120 bytes\): "
        r"its header says 580000 bytes decoded, the array's metadata 600000",
    ),
    ("wider-type", _zarray(_set_dtype("yaw", "<f8")), r"does not match its \.zarray \(5,000 rows of 120 bytes\)"),
    (
        "chunks-doubled",
        _zarray(lambda m: m.update(chunks=[m["chunks"][0] * 2])),
        r"does not match its \.zarray \(10,000 rows of 116 bytes\): its header says 580000 bytes decoded, the array's metadata 1160000",
    ),
    ("labels-all-equal", _zattrs(["x"] * 17), r"\.zattrs labels must be distinct; \['x'\] appear more than once"),
    ("labels-not-strings", _zattrs(list(range(17))), r"\.zattrs labels must be 17 names \(strings\)"),
    ("labels-16", _zattrs([f"L{i}" for i in range(16)]), r"\.zattrs labels must be 17 names"),
    ("zarray-nested-deep", _raw("agents/.zarray", DEEP), r"agents/\.zarray: \.zarray is JSON nested too deeply"),
    ("zattrs-nested-deep", _raw(".zattrs", DEEP), r"\.zattrs is JSON nested too deeply"),
    ("zarray-not-json", _raw("agents/.zarray", "{'shape': [1]}"), r"\.zarray is not valid JSON"),
    ("shape-1e30", _zarray(lambda m: m.update(shape=[10**30])), r"invalid shape \[1000000000000000000000000000000\]"),
    ("shape-negative", _zarray(lambda m: m.update(shape=[-5])), r"invalid shape \[-5\]"),
    ("shape-bool", _zarray(lambda m: m.update(shape=[True])), r"invalid shape \[True\]"),
    (
        "chunks-huge",
        _zarray(lambda m: m.update(chunks=[10**12])),
        r"chunks of 1,000,000,000,000 rows of 116 bytes .* more than a blosc chunk holds",
    ),
    ("field-huge", _zarray(lambda m: m["dtype"].append(["big", "<f4", [10**9]])), r"field 'big' has a malformed shape"),
    (
        "faces-4294967296-rows",
        _zarray(lambda m: m.update(shape=[2**32]), "traffic_light_faces"),
        r"array 'traffic_light_faces': its \.zarray says 4,294,967,296 rows in 2,147,484 chunks of 2,000, but the last chunk",
    ),
    ("object-dtype", _zarray(_set_dtype("yaw", "|O")), r"field 'yaw' has dtype '\|O', which would need object/pickle"),
    # big-endian fields: accepted at open, read right by aggregate, a bare ValueError and a
    # traceback from the report's agent pass (found by fuzzing the metadata)
    (
        "big-endian-velocity",
        _zarray(_set_dtype("velocity", ">f4")),
        r"field 'velocity' has dtype '>f4', big-endian: l5dask reads little-endian numbers only \('<f4'",
    ),
    ("big-endian-centroid", _zarray(_set_dtype("centroid", ">f8")), r"field 'centroid' has dtype '>f8', big-endian"),
    # another width of the fields the report's compiled loop reads: accepted at open, and a
    # traceback from the report (a new user's trial)
    (
        "float64-velocity",
        _zarray(_set_dtype("velocity", "<f8")),
        r"field agents\.velocity has dtype <f8\[2\], expected <f4\[2\]",
    ),
    (
        "float32-centroid",
        _zarray(_set_dtype("centroid", "<f4")),
        r"field agents\.centroid has dtype <f4\[2\], expected <f8\[2\]",
    ),
]
