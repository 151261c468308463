"""The Lyft perception dataset (nuScenes-style JSON tables, lidar sweeps, images): lazy columnar
tables with tokens as row indices, vectorized joins, a parallel report, lidar at scale and a bridge
into L5Kit's format. Each public name is imported on first use (the command line lists the
perception commands without importing dask)."""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> its module
_PUBLIC = {
    "PerceptionDataset": "dataset",
    "Table": "dataset",
    "open_perception": "dataset",
    "perception_report": "report",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(f"l5dask.perception.{_PUBLIC[name]}"), name)
    raise AttributeError(f"module 'l5dask.perception' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
