"""The Lyft perception dataset (nuScenes-style JSON tables, lidar sweeps, images): lazy columnar
tables with tokens as row indices, vectorized joins, a parallel report, lidar at scale and a bridge
into L5Kit's format. Each public name is imported on first use (the command line lists the
perception commands without importing dask)."""

from __future__ import annotations

from l5dask.core.lazy import attach

#: public name -> its module
_PUBLIC = {
    "PerceptionDataset": "dataset",
    "Table": "dataset",
    "open_perception": "dataset",
    "perception_report": "report",
    "evaluate": "detection",
    "read_boxes": "detection",
}

__getattr__, __dir__, __all__ = attach(__name__, _PUBLIC)
