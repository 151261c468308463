"""Partials as the cache of partial results keeps them (``l5dask.core.cache``), and the oracle that
compares two of them bit for bit: for the fuzz target of its entry decoder (``tests/fuzz``) and its
property tests (``tests/test_properties.py``)."""

from __future__ import annotations

import dataclasses
import math
import struct
from typing import Any

import numpy as np

from l5dask.core.engine import Block, Rows
from l5dask.prediction.stats import AgentPart, FramePart, SceneSeries, TLPart


def same_bits(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are the same partial bit for bit: the same types all the way down,
    arrays of the same dtype, shape and bytes, floats of the same bits (NaNs, -0.0), the same keys
    in the same order, the same members of sets."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if a is None or isinstance(a, (bool, int, str)):
        return a == b
    if isinstance(a, (frozenset, set)):
        return a == b
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_bits(x, y) for x, y in zip(a.values(), b.values()))
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same_bits(x, y) for x, y in zip(a, b))
    if dataclasses.is_dataclass(a):
        return all(same_bits(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    raise TypeError(f"cannot compare a {type(a).__name__}")


def sample_partials() -> list[Any]:
    """Partials of each kind the engine's passes keep: the report's three (frames, agents, faces),
    a pass's block with its interval bounds, rows, sets and every kind of scalar and array."""
    structured = np.zeros(3, np.dtype([("id", "<U8"), ("xy", "<f4", (2,)), ("n", "<i8")]))
    structured["id"], structured["xy"], structured["n"] = ["a", "bb", "ccc"], [[1, 2], [3, 4], [5, 6]], [7, 8, 9]
    floats = (0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, 1.0000000000000002)
    bounds = {"agent_index_interval": np.arange(12, dtype=np.int64).reshape(2, 6)}
    return [
        (Block(AgentPart(n=7, speed_sum=floats, labels=np.arange(17, dtype=np.int64)), None, None), {}),
        (
            Block(FramePart(n=3, series=SceneSeries(4, {"x": np.arange(3.0)}), first=(1, 2, 3.5, -0.0)), None, bounds),
            {"agent_index_interval": 1000},
        ),
        TLPart(4, np.array([1, 2, 1]), frozenset({"f1", "f22"})),
        {"records": structured, "empty": np.zeros((0, 6), np.int64), 7: {1, 2}, "big": 2**100},
        (np.float32(1.5), np.int16(-3), np.bool_(True), None, True, "é", [frozenset({-(2**62), 3})]),
        Rows(5, {"agent_start": np.array([0, 4, 9], np.int64), "ego_xy": np.ones((3, 2))}),
    ]
