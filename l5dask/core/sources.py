"""Chunk sources other than L5Kit arrays, for the engine (:mod:`l5dask.core.engine`).

- :class:`ByteRanges`: a text file (a CSV) in blocks of about ``block_bytes``, each starting
  after a line end and ending on one, so that every line is in exactly one chunk (as
  ``dask.bytes.read_bytes`` with a delimiter); ``start`` is the chunk's byte offset.
- :class:`Files`: the files of a folder (lidar sweeps, images), one file a chunk; ``start``
  is the file's position in the sorted listing.
- :class:`TableRows`: the rows of a table held in memory (a pyarrow Table, a pandas DataFrame,
  a numpy array: anything with ``len`` and row slices), in chunks of ``chunk_rows`` rows.

Both read through :class:`l5dask.core.store.Store`: local folders, zips, S3 and any fsspec URL,
with its retries and its errors.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
from collections.abc import Iterator
from typing import Any

from l5dask.core.store import Store
from l5dask.errors import NotADatasetError


def _split(url: str) -> tuple[str, str]:
    url = os.fspath(url)
    head, _, name = url.rstrip("/").rpartition("/")
    return head or ".", name


class ByteRanges:
    """The lines of one text file, in chunks of whole lines of about ``block_bytes`` bytes.

    Parameters
    ----------
    url : str
        A local path or any fsspec URL of the file.
    block_bytes : int
        Nominal bytes per chunk (the last line of a chunk runs on past it).
    header : bool
        The first line is a header: chunk 0 starts after it (see :attr:`header_line`).
    """

    def __init__(
        self,
        url: str,
        block_bytes: int = 64 * 2**20,
        header: bool = False,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        if block_bytes < 1:
            raise ValueError("block_bytes must be at least 1")
        folder, self.key = _split(url)
        self.url, self.store, self.block_bytes, self.header = (
            os.fspath(url),
            Store(folder, storage_options),
            int(block_bytes),
            header,
        )
        try:
            self.size = int(self.store.fs.size(self.store.path(self.key)))
        except FileNotFoundError:
            raise NotADatasetError(f"{self.url}: no such file") from None
        self.name = self.key

    @property
    def nchunks(self) -> int:
        return -(-self.size // self.block_bytes) if self.size else 0

    def chunk_bounds(self, index: int) -> tuple[int, int]:
        """The nominal byte range of chunk ``index`` (its lines are those that start in it)."""
        return index * self.block_bytes, min((index + 1) * self.block_bytes, self.size)

    def _line_start(self, f, offset: int) -> int:
        """The first line start at or after ``offset``."""
        if offset == 0:
            return 0
        f.seek(offset - 1)
        while True:
            buf = f.read(2**16)
            if not buf:
                return self.size
            i = buf.find(b"\n")
            if i >= 0:
                return f.tell() - len(buf) + i + 1

    def _read(self, f, index: int) -> tuple[int, bytes]:
        lo, hi = self.chunk_bounds(index)
        start, stop = self._line_start(f, lo), self._line_start(f, hi)
        if index == 0 and self.header:
            start = self._line_start(f, 1) if self.size else 0
        f.seek(start)
        return start, f.read(max(0, stop - start))

    def iter_chunks(self, first: int, n: int) -> Iterator[tuple[int, bytes]]:
        with self.store.fs.open(self.store.path(self.key), "rb") as f:
            for index in range(first, first + n):
                yield self._read(f, index)

    def read(self, first: int, n: int) -> bytes:
        return b"".join(data for _, data in self.iter_chunks(first, n))

    @property
    def header_line(self) -> bytes:
        """The first line (without its line end)."""
        with self.store.fs.open(self.store.path(self.key), "rb") as f:
            return f.readline().rstrip(b"\r\n")

    def __dask_tokenize__(self):
        return ("l5dask.ByteRanges", self.store.__dask_tokenize__(), self.key, self.size, self.block_bytes, self.header)


class Files:
    """The files of a folder whose names match ``pattern``, sorted by name: one chunk per file.

    Parameters
    ----------
    url : str
        A folder: local, a zip, S3 or any fsspec URL.
    pattern : str
        A glob on the file names (not the folders), e.g. ``"*.bin"``.
    """

    def __init__(self, url: str, pattern: str = "*", storage_options: dict[str, Any] | None = None) -> None:
        self.url, self.store = os.fspath(url), Store(os.fspath(url), storage_options)
        root = self.store.root
        try:
            listed = self.store.fs.find(root or "/", withdirs=False) if root else self.store.fs.find("", withdirs=False)
        except FileNotFoundError:
            raise NotADatasetError(f"{self.url}: no such folder") from None
        rel = sorted(posixpath.relpath(p, root) if root else p for p in listed)
        self.keys = [k for k in rel if fnmatch.fnmatch(posixpath.basename(k), pattern)]
        self.name = posixpath.basename(self.url.rstrip("/")) or self.url

    @property
    def nchunks(self) -> int:
        return len(self.keys)

    def chunk_bounds(self, index: int) -> tuple[int, int]:
        return index, index + 1

    def iter_chunks(self, first: int, n: int) -> Iterator[tuple[int, bytes]]:
        keys = self.keys[first : first + n]
        raws = self.store.get_many(keys, what={k: f"file {k!r}" for k in keys})
        yield from zip(range(first, first + n), raws)

    def read(self, first: int, n: int) -> list[bytes]:
        return [data for _, data in self.iter_chunks(first, n)]

    def __dask_tokenize__(self):
        return ("l5dask.Files", self.store.__dask_tokenize__(), tuple(self.keys))


class TableRows:
    """The rows of an in-memory table, in chunks of ``chunk_rows`` consecutive rows.

    Slices are views where the table type allows (pyarrow, numpy, pandas' ``iloc``): a task
    carries its table, so on a cluster keep such tables small (a parsed JSON table, an index).
    """

    def __init__(self, table: Any, chunk_rows: int = 100_000, name: str = "table") -> None:
        if chunk_rows < 1:
            raise ValueError("chunk_rows must be at least 1")
        self.table, self.chunk_rows, self.name = table, int(chunk_rows), name
        self._len = len(table)

    @property
    def nchunks(self) -> int:
        return -(-self._len // self.chunk_rows)

    def chunk_bounds(self, index: int) -> tuple[int, int]:
        return index * self.chunk_rows, min((index + 1) * self.chunk_rows, self._len)

    def _rows(self, lo: int, hi: int) -> Any:
        t = self.table
        if hasattr(t, "iloc"):
            return t.iloc[lo:hi]
        if hasattr(t, "slice") and hasattr(t, "num_rows"):  # pyarrow
            return t.slice(lo, hi - lo)
        return t[lo:hi]

    def iter_chunks(self, first: int, n: int) -> Iterator[tuple[int, Any]]:
        for index in range(first, first + n):
            lo, hi = self.chunk_bounds(index)
            yield lo, self._rows(lo, hi)

    def read(self, first: int, n: int) -> Any:
        lo, hi = self.chunk_bounds(first)[0], self.chunk_bounds(first + n - 1)[1] if n else self.chunk_bounds(first)[0]
        return self._rows(lo, hi)

    def __dask_tokenize__(self):
        from dask.base import tokenize

        return ("l5dask.TableRows", self.name, self.chunk_rows, tokenize(self.table))
