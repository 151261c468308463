"""The one rule for a stored chunk's bytes: what a blosc chunk must be before any decoder sees it.

Every path that reads a chunk (the report's decode, the compressed gather of ``aggregate`` and
the dataframes, the xarray backend, surgery and exports, the zarr v3 reader, ``validate``) calls
:func:`check_blosc` first, with what the array's metadata says the chunk decodes to. A chunk is
accepted only when its 16-byte header agrees with that metadata and with every check c-blosc
1.21 makes before it decodes (``blosc_run_decompression_with_context`` in ``blosc/blosc.c``):

- format version 2 (blosc 1.x) and no flag from the future (bit 3);
- a type size from 1 to 255, never 0: the array's element size (the record size; 1 past 255
  bytes, as blosc stores it), or any other in a chunk that is not shuffled (there it changes no
  decoded byte; zarr-python 2 decodes such chunks). A shuffled chunk of another type size is
  valid (zarr-python 2 unshuffles by it) but refused as not supported: a damaged type size is
  unshuffled the same way, without an error, into other numbers, and nothing tells them apart;
- the decoded size is exactly the chunk's rows times the record size: zarr v2 stores the last
  chunk full size, padded with the fill value, so every chunk decodes to ``chunk_rows`` records.
  numcodecs decodes as many bytes as the header says into a buffer of any larger size and raises
  nothing: without this check a chunk whose header says fewer bytes leaves the rest of the
  buffer as it was (the previous chunk's rows, in a reused buffer);
- the compressed size is at most the object's length (blosc reads as many bytes as the header
  says: past the end of a truncated chunk); bytes after it are never read, as blosc never reads
  them (zarr-python 2 decodes such a chunk);
- a block size in ``(0, decoded size]``, at most blosc's maximum and a whole number of the
  header's elements (c-blosc's compressor makes it so; its decoder would otherwise leave bytes
  of a split block unwritten and return no error); a stored (memcpyed) chunk is
  its header and its bytes; otherwise a codec numcodecs' blosc decodes (blosclz, lz4/lz4hc,
  zlib, zstd) at its format version 1, and room for the block starts.

What happens inside the blocks (each block's start, each stream's size, what LZ4 decodes) is
checked where it is read, the same way by c-blosc and by ``l5dask/_blosc.h``
(``tests/test_properties.py`` holds them to the same verdict on damaged chunks, and l5dask to
zarr-python 2's answer on every encoding it decodes).
"""

from __future__ import annotations

import functools
import struct
from typing import Any

import numpy as np

#: blosc 1.x's frame constants (``blosc.h``).
VERSION_FORMAT = 2
MAX_TYPESIZE = 255
MAX_OVERHEAD = 16
MAX_BUFFERSIZE = 2**31 - 1 - MAX_OVERHEAD
MAX_BLOCKSIZE = (2**31 - 1 - MAX_TYPESIZE * 4) // 3
SHUFFLE, MEMCPYED, BITSHUFFLE, FUTURE = 0x01, 0x02, 0x04, 0x08
#: compressor formats (header flags' top 3 bits) that numcodecs' c-blosc decodes: all at version 1
CODECS = {0: "blosclz", 1: "lz4", 3: "zlib", 4: "zstd"}

_HEADER = struct.Struct("<BBBBiii")


@functools.cache
def _decoder() -> Any:
    """numcodecs' blosc (decoding reads the header only), imported when a chunk is first decoded:
    a rerun from a cache decodes none, and numcodecs' import (with wrapt's and asyncio's, 30 ms
    warm, more cold) was a tenth of its process's start."""
    from numcodecs import Blosc

    return Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE, blocksize=0)


def typesize_of(itemsize: int) -> int:
    """The type size blosc stores for elements of ``itemsize`` bytes (1 past its maximum, 255)."""
    return itemsize if 0 < itemsize <= MAX_TYPESIZE else 1


def check_blosc(raw, nbytes: int, typesize: int, header_only: bool = False, stored: int | None = None) -> str | None:
    """Why the blosc chunk ``raw`` is not one of ``nbytes`` decoded bytes of elements of
    ``typesize`` bytes (as blosc stores it: ``typesize_of``), or ``None`` when it may be decoded.
    Reads the 16-byte header only. ``header_only``: ``raw`` is the chunk's first bytes, not all of
    it, and ``stored`` the object's length (``None``: unknown, not checked)."""
    size = len(raw) if not header_only else stored
    if len(raw) < MAX_OVERHEAD:
        return f"{len(raw)} bytes, shorter than a blosc header (16)"
    version, versionlz, flags, ts, decoded, blocksize, cbytes = _HEADER.unpack_from(raw)
    if version != VERSION_FORMAT:
        return f"blosc format version {version} in its header, not {VERSION_FORMAT}"
    if flags & FUTURE:
        return f"header flags 0x{flags:02x} hold a bit blosc does not know"
    if ts == 0:
        return f"type size 0 in its header, {typesize} for the array's elements"
    if decoded != nbytes:
        return f"its header says {decoded} bytes decoded, the array's metadata {nbytes}"
    if size is not None and cbytes > size:
        return f"it holds {size} bytes, its header says {cbytes}"
    if cbytes < MAX_OVERHEAD:
        return f"compressed size {cbytes} in its header, shorter than the header"
    if ts != typesize and flags & (SHUFFLE | BITSHUFFLE) and not flags & MEMCPYED:
        return (
            f"type size {ts} in its header, {typesize} for the array's elements: a chunk shuffled by another "
            "type size is valid but not supported (nothing tells it from a damaged header)"
        )
    if not 0 < blocksize <= min(decoded, MAX_BLOCKSIZE):
        return f"block size {blocksize} in its header, outside 1..{min(decoded, MAX_BLOCKSIZE)}"
    if blocksize % ts:
        return f"block size {blocksize} in its header, not a whole number of its {ts}-byte elements"
    if flags & MEMCPYED:
        if cbytes != decoded + MAX_OVERHEAD:
            return f"a stored chunk of {decoded} bytes must hold {decoded + MAX_OVERHEAD}, it holds {cbytes}"
        return None
    codec = CODECS.get(flags >> 5)
    if codec is None:
        return f"compressor {flags >> 5} in its header, which blosc does not decode here"
    if versionlz != 1:
        return f"{codec} format version {versionlz} in its header, not 1"
    nblocks = -(-decoded // blocksize)
    if nblocks > (cbytes - MAX_OVERHEAD) // 4:
        return f"{nblocks} blocks, more than its {cbytes} bytes can start"
    return None


def decode_blosc(raw, out: np.ndarray, typesize: int | None = None) -> np.ndarray:
    """numcodecs' blosc decode of ``raw`` into all of ``out`` (C-contiguous), once
    :func:`check_blosc` accepts it for ``out.nbytes`` bytes of elements of ``typesize`` bytes
    (default: ``out``'s item size, as blosc stores it). ``ValueError`` saying why otherwise."""
    view = raw if isinstance(raw, (bytes, bytearray)) else memoryview(raw).cast("B")
    why = check_blosc(view, out.nbytes, typesize_of(out.dtype.itemsize) if typesize is None else typesize)
    if why is not None:
        raise ValueError(why)
    cbytes = _HEADER.unpack_from(view)[6]
    return _decoder().decode(view if len(view) == cbytes else memoryview(view)[:cbytes], out=out)
