"""Reading part of a stored chunk held to reading it whole: what the fuzz target and the property
test of :func:`~l5dask.prediction.reading.read_chunk_rows` both check (``tests/fuzz/targets.py``,
``tests/test_properties.py``)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence

import numpy as np

from l5dask.core.codec import check_blosc
from l5dask.core.store import Store
from l5dask.errors import L5DaskError
from l5dask.prediction import format as fmt
from l5dask.prediction.reading import decode_chunk, read_chunk_rows


def partial_verdict(
    raw: bytes, meta: fmt.ArrayMeta, index: int, ranges: Sequence[tuple[int, int]]
) -> tuple[list[np.ndarray] | None, np.ndarray | None]:
    """``(rows, whole)``: ``read_chunk_rows`` of ``ranges`` in stored chunk ``index`` (``raw``, put
    in a store of its own), or ``None`` where it refused; and the whole chunk decoded by the one
    rule and numcodecs (:func:`~l5dask.prediction.reading.decode_chunk`), or ``None`` where it is
    refused. Asserts that a refusal is one line of l5dask's errors; that a chunk the one rule
    refuses whole (its header, or its size: cut short) is refused; that the rows read are of the
    ranges' lengths and the array's dtype, and, where the whole chunk decodes, its rows bit for
    bit. (Where only numcodecs refuses the whole chunk, a block the rows are not in may be what
    it refuses: the rows read are those of the blocks that hold them, which decode.)"""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, meta.key(index))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(raw)
        try:
            got = read_chunk_rows(Store(tmp), meta, index, ranges)
        except L5DaskError as exc:
            assert "\n" not in str(exc), f"a refusal of more than one line: {exc}"
            got = None
    try:
        whole = decode_chunk(raw, meta, True, str(index))
    except L5DaskError:
        whole = None
    why = check_blosc(raw, meta.chunk_nbytes, meta.typesize)
    assert why is None or got is None, f"rows read from a chunk the one rule refuses whole: {why}"
    if got is not None:
        start = meta.chunk_bounds(index)[0]
        assert len(got) == len(ranges), "not one answer a range"
        for (lo, hi), rows in zip(ranges, got):
            assert rows.dtype == meta.dtype and rows.shape == (hi - lo,), "rows of another dtype or length"
            if whole is not None:
                assert rows.tobytes() == whole[lo - start : hi - start].tobytes(), "rows other than the whole chunk's"
    return got, whole
