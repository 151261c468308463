"""l5dask: lazy, distributed analytics for the Lyft Level 5 (L5Kit) datasets."""

from __future__ import annotations

from l5dask.core.lazy import attach
from l5dask.core.version import __version__
from l5dask.errors import (
    ChunkError,
    FormatError,
    IntervalError,
    L5DaskError,
    NotADatasetError,
    StoreError,
)

#: Imported on first use: a command starts faster without the imports it does not need (the
#: reader's pandas and dask cost 0.3 s; the perception commands need neither).
_LAZY = {
    "synthesize": "prediction.synth",
    "write_dataset": "prediction.writing",
    "concat": "prediction.surgery",
    "subset": "prediction.surgery",
    "split": "prediction.surgery",
    "open_dataset": "prediction.dataset",
    "L5Dataset": "prediction.dataset",
    "L5Array": "prediction.reading",
    "aggregate": "prediction.aggregation",
    "catalog": "prediction.catalog",
    "analyze": "prediction.analyses",
    "analyses": "analyses",
}


__getattr__, __dir__, _names = attach(__name__, _LAZY)


__all__ = [
    "ChunkError",
    "FormatError",
    "IntervalError",
    "L5Array",
    "L5DaskError",
    "L5Dataset",
    "NotADatasetError",
    "StoreError",
    "aggregate",
    "analyses",
    "analyze",
    "catalog",
    "concat",
    "open_dataset",
    "split",
    "subset",
    "synthesize",
    "write_dataset",
    "__version__",
]
