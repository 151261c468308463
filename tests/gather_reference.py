"""The compressed gather held to numcodecs' verdict on one chunk: what the fuzz target and the
property test both check (``tests/fuzz/targets.py``, ``tests/test_properties.py``)."""

from __future__ import annotations

import numpy as np

from l5dask.core.codec import check_blosc, decode_blosc, typesize_of
from l5dask.prediction.kernels import Gather


def gather_verdict(
    plan: Gather, raw: bytes, chunk_rows: int, rows: int
) -> tuple[int, str | None, bool | None, np.ndarray | None]:
    """``(status, why, accepted, records)``: the compiled gather's status on ``raw`` (run unchecked:
    it must be safe on its own), the header rule's refusal, and numcodecs' verdict and records
    (``None`` where the rule refuses: c-blosc reads past the end of such chunks). Asserts that the
    readers agree: status 0, numcodecs reads the same numbers bit for bit; -1, numcodecs refuses."""
    dtype = plan.dtype
    outs, maxes = plan.outputs(rows)
    found: list[np.ndarray] = []
    status, _ = plan.blosc_status(raw, chunk_rows, rows, outs, maxes, 0, np.empty(0, np.uint8), found)
    why = check_blosc(raw, chunk_rows * dtype.itemsize, typesize_of(dtype.itemsize))
    if why is not None:
        return status, why, None, None
    ref = np.empty(chunk_rows, dtype)
    try:
        decode_blosc(raw, ref)
        accepted = True
    except (RuntimeError, ValueError):
        accepted = False
    if status == 0:
        assert accepted, "the compiled gather read a chunk numcodecs refuses"
        want, wmax = plan.outputs(rows)
        plan.records(ref[:rows], want, wmax, 0, [])
        for got, exp in zip([*outs, *maxes], [*want, *wmax]):
            assert got.tobytes() == exp.tobytes(), "the compiled gather and numcodecs disagree"
        if plan.distinct is not None:  # the distinct values, as bytes: numpy's unique rows of the field
            width = dtype[plan.distinct].itemsize
            field = np.ascontiguousarray(ref[:rows][plan.distinct]).view(np.uint8).reshape(rows, width)
            got_rows = sorted(bytes(v) for v in found[0].view(np.uint8).reshape(-1, width)) if found else []
            assert got_rows == sorted(map(bytes, np.unique(field, axis=0))), "distinct values disagree"
            assert len(found) == 1
    else:
        assert not found, "values found in a chunk the compiled gather did not read"
    if status == -1:
        assert not accepted, "the compiled gather refused a chunk numcodecs reads"
    return status, why, accepted, ref if accepted else None
