"""The analyses :func:`l5dask.analyze <l5dask.prediction.analyses.analyze>` runs together in one pass: ``Report``, ``Catalog``,
``Aggregate`` (defined in :mod:`l5dask.prediction.analyses`)."""

from __future__ import annotations

from l5dask.prediction.analyses import Aggregate, Analysis, Catalog, Report, analyze

__all__ = ["Aggregate", "Analysis", "Catalog", "Report", "analyze"]
