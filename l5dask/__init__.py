"""l5dask: lazy, distributed analytics for the Lyft Level 5 (L5Kit) datasets."""

from __future__ import annotations

from .errors import ChunkError, FormatError, IntervalError, L5DaskError, NotADatasetError, StoreError
from .reading import L5Array, L5Dataset, open_dataset
from .synth import synthesize
from .writing import write_dataset

__version__ = "0.1.0"

__all__ = [
    "ChunkError",
    "FormatError",
    "IntervalError",
    "L5Array",
    "L5DaskError",
    "L5Dataset",
    "NotADatasetError",
    "StoreError",
    "open_dataset",
    "synthesize",
    "write_dataset",
    "__version__",
]
