"""Errors that l5dask raises for users' mistakes and bad data: the one place they are defined.

Every error a user's input or data can cause is an :class:`L5DaskError` *and* the builtin a
Python caller expects for it, so that ``except ValueError`` or ``except FileNotFoundError``
written for L5Kit or the Lyft SDK keeps working:

=========================  ===========================  =====================================
class                      also a                       raised for
=========================  ===========================  =====================================
:class:`UsageError`        ``ValueError``               bad values and options (a scene range,
                                                        a part spec, a column name...)
:class:`FormatError`       ``ValueError``               metadata, chunks, tables or CSV rows
                                                        that do not follow their format
:class:`ChunkError`        ``ValueError``               a stored chunk missing, truncated or
                                                        corrupt (a :class:`FormatError`)
:class:`IntervalError`     ``ValueError``               index intervals that do not link
:class:`UnknownNameError`  ``KeyError``                 a table, column or coordinate asked for
                                                        by a name that is not there
:class:`NotADatasetError`  ``FileNotFoundError``        a path that holds no dataset
:class:`StoreError`        ``OSError``                  a store that cannot be reached or read
:class:`OutputError`       ``OSError``                  an output that cannot be written (or
                                                        exists, without ``overwrite``)
:class:`ClusterError`      ``ConnectionError``          a dask scheduler that cannot be reached
:class:`InstallError`      ``ImportError``              a compiled module missing from the
                                                        install (how to rebuild it is said)
=========================  ===========================  =====================================

The CLI prints any :class:`L5DaskError` as one line (``l5dask: error: ...``) and exits with
code 2; messages print plain numbers and name the file, array, chunk, row or field at fault.
"""

from __future__ import annotations


class L5DaskError(Exception):
    """Base class of the errors a user can cause or fix (bad path, bad data, bad options)."""


class UsageError(L5DaskError, ValueError):
    """A value or option that l5dask cannot use (what was given, and what is accepted)."""


class UnknownNameError(L5DaskError, KeyError):
    """A table, column or coordinate asked for by a name that is not there (the names that are)."""

    def __str__(self) -> str:  # the message, not KeyError's repr of it
        return str(self.args[0]) if self.args else ""


class NotADatasetError(L5DaskError, FileNotFoundError):
    """The location holds no dataset (nothing there, or something else)."""


class FormatError(L5DaskError, ValueError):
    """Metadata or chunk bytes that do not follow the L5Kit zarr format."""


class ChunkError(FormatError):
    """A stored chunk is missing, truncated or corrupt."""


class StoreError(L5DaskError, OSError):
    """The store could not be reached: credentials, bucket, network."""


class OutputError(L5DaskError, OSError):
    """An output cannot be written there (missing folder or bucket, no access, already exists)."""


class ClusterError(L5DaskError, ConnectionError):
    """The dask scheduler cannot be reached, or its connection was lost."""


class InstallError(L5DaskError, ImportError):
    """The install is incomplete: a compiled module of l5dask is missing or cannot be loaded."""


class IntervalError(FormatError):
    """Index intervals that are not contiguous, not increasing, or out of range."""
