"""The Lyft perception dataset (nuScenes-style JSON tables, lidar sweeps, images): lazy columnar
tables with tokens as row indices, vectorized joins, a parallel report, lidar at scale and a bridge
into L5Kit's format. Contract: ``../shared/spec/perception.md``."""

from l5dask.perception.dataset import PerceptionDataset, Table, open_perception
from l5dask.perception.report import perception_report

__all__ = ["PerceptionDataset", "Table", "open_perception", "perception_report"]
