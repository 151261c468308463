"""Errors that l5dask raises for users' mistakes and bad data.

The CLI prints any :class:`L5DaskError` as one line and exits non-zero.
"""

from __future__ import annotations


class L5DaskError(Exception):
    """Base class of the errors a user can cause or fix (bad path, bad data, bad options)."""


class NotADatasetError(L5DaskError):
    """The location holds no L5Kit dataset."""


class FormatError(L5DaskError, ValueError):
    """Metadata or chunk bytes that do not follow the L5Kit zarr format."""


class ChunkError(FormatError):
    """A stored chunk is missing, truncated or corrupt."""


class StoreError(L5DaskError, OSError):
    """The store could not be reached: credentials, bucket, network."""


class IntervalError(FormatError):
    """Index intervals that are not contiguous, not increasing, or out of range."""
