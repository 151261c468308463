"""The cache of partial results, keyed by content: what a task of a pass computes, kept across runs.

A pass's task (``l5dask.core.engine.run_group``) turns some stored chunks into a partial. With
a cache (``cache=`` on a :class:`~l5dask.core.engine.Job` and on the functions that pass over a
dataset, ``--cache`` on the commands, dask config ``l5dask.cache``), the partial is stored under a
**key made of what the task computes**:

- the reduction's token (``reduction_token``: its ``cache_token`` when it declares one, else
  its name and its functions with their bound arguments, tokenized deterministically), the
  checks the task runs (its interval fields) and how it is handed its chunks;
- the identity of each stored chunk it reads, from the source (``chunk_identities()``: for an
  L5Kit array, the object's path, its rows, its size and the store's ETag, or its mtime, ctime and
  inode on a local disk; a hash of its bytes where the store gives neither);
- for a pass given parent rows, the identity of those rows (a hash of the rows held in memory,
  or the identity of the parent blocks, and their own parents, the rows are made from);
  a task given the rows of a persisted parent is also found by the rows themselves (an *alias*
  entry keyed by a hash of the parent rows it was given, naming the entry that holds its
  partial): a parent chunk that changed only in rows the task does not take (the frames' last
  chunk grown as scenes are appended) leaves it found (``follow``);
- the cache format (``FORMAT``) and l5dask's version.

A rerun over unchanged data then reads the metadata and the cached partials, no chunk; after the
dataset grows, only the tasks over new or changed chunks run (a cached pass's tasks are aligned
groups of chunks, ``Job.groups``, stable as the dataset grows), and the tasks before them are read
as one entry (a ``prefix-`` entry: the combined partial of a pass's first tasks, keyed by a chain of
their keys, ``Job._prefix``) for a pass whose partials are the same bits however grouped; a run killed part way
computes, when started again, only what was not stored. A partial is loaded as it was stored: the
result is bit for bit the one computed over the same tasks without a cache.

Entries are never pickled: a partial is encoded as a small JSON manifest (nested tuples, lists,
dicts, sets of numbers or strings, NamedTuples and dataclasses of l5dask's own modules, scalars,
and for each numpy array its dtype as numpy's ``.npy`` describes it, its shape and offset) and the
arrays' bytes; what cannot be encoded is not cached (``Unencodable``). (Not an ``.npz``: its
``.npy`` headers are parsed by ``ast.literal_eval``, 0.3-0.5 ms an array, 2 ms an entry of the
report's, more than the rest of a rerun's work; the manifest is one ``json.loads``.) An entry is
``MAGIC | format | blake2b digest | manifest length | manifest | arrays``, written to a temporary
name and renamed into place (on an object store, one PUT), so that no reader ever sees half of one.
Its manifest names the entry (its file name, the key in it): a sound entry found under another
name (copied or renamed over another task's) is not that task's partial. An entry that is damaged,
truncated, of another format or under another's name is ignored (the first of a process
with one warning), counted (:class:`Stats`), and its task computed again. A cache that cannot be written is one
warning, and the run goes on without it; a location l5dask cannot write at all is a
:class:`~l5dask.errors.UsageError`.

Layout: ``ROOT/l5dask-cache-v6/<source>/<reduction>.<key>.l5c``, one folder a source (a dataset's
array: its ``source.json`` names it), so that a task's lookups are one listing a source.
``l5dask cache info|prune`` reads and trims it (``info``, ``prune``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import posixpath
import re
import struct
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np

from l5dask.core import config
from l5dask.core.outputs import atomic_output, folders_to_make
from l5dask.core.store import Store
from l5dask.core.version import __version__
from l5dask.errors import OutputError, StoreError, UsageError

#: The cache format: part of every key, and checked in every entry read.
FORMAT = 6  # (2: a set of strings kept as one array; 3: a child task given only its parent rows, found by them;
# 4: integer columns' aggregation partials exact, their sums in two int64 limbs; 5: each entry names
# itself, checked on reading; 6: a NaN speed or distance in no bin of the report's partials, a float
# group's m2 NaN where it holds an infinity)
#: The folder of this format's entries under the cache's root.
FOLDER = f"l5dask-cache-v{FORMAT}"
MAGIC = b"L5DCACHE"
SUFFIX = ".l5c"
_HEAD = struct.Struct("<8sI16s")  # magic, format, blake2b-128 digest of the npz that follows
log = logging.getLogger("l5dask.cache")


class Unencodable(TypeError):
    """A partial the cache cannot store without pickle (it is then not cached)."""


class Damaged(ValueError):
    """An entry that is not a whole, sound entry of this format."""


# --- counting ---------------------------------------------------------------------------------
@dataclasses.dataclass
class Stats:
    """What the cache did: tasks found (``hits``) and not found (``misses``), entries ``damaged``
    (recomputed), ``written``, writes that failed (``write_failures``), and the entries' bytes."""

    hits: int = 0
    misses: int = 0
    damaged: int = 0
    written: int = 0
    write_failures: int = 0
    bytes_read: int = 0
    bytes_written: int = 0

    def add(self, **counts: int) -> None:
        for k, v in counts.items():
            setattr(self, k, getattr(self, k) + int(v))

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


_STATS_LOCK = threading.Lock()
_COUNTERS: list[Stats] = []
#: This process's totals (on a worker: what its tasks did).
TOTAL = Stats()


def count(**counts: int) -> None:
    """Add to this process's totals and to every :func:`counting` block open; on a
    dask.distributed worker, also an event (``l5dask-cache``) the client's job collects."""
    worker = None
    dist = sys.modules.get("distributed")
    if dist is not None:
        try:
            worker = dist.get_worker()
        except ValueError:
            worker = None
    with _STATS_LOCK:
        TOTAL.add(**counts)
        if worker is None:  # (a worker's counts reach the client as events: counted there once)
            for c in _COUNTERS:
                c.add(**counts)
    if worker is not None:
        with contextlib.suppress(Exception):
            worker.log_event("l5dask-cache", dict(counts))


def count_remote(counts: dict[str, int]) -> None:
    """Counts that a job collected from its workers' events: into the open blocks only."""
    with _STATS_LOCK:
        for c in _COUNTERS:
            c.add(**counts)


@contextlib.contextmanager
def counting() -> Iterator[Stats]:
    """The cache's counts for what runs inside the block (in this process, and on a cluster's
    workers through the jobs run from here): ``with counting() as stats: ...; stats.as_dict()``."""
    stats = Stats()
    with _STATS_LOCK:
        _COUNTERS.append(stats)
    try:
        yield stats
    finally:
        with _STATS_LOCK:
            _COUNTERS.remove(stats)


# --- encoding ---------------------------------------------------------------------------------
def _float_bits(x: float) -> str:
    return struct.pack("<d", x).hex()


#: The classes an entry may hold, by name: only those declared with :func:`partial_type`. An entry
#: names its classes; the decoder builds only these (it imports nothing and looks up no attribute
#: an entry names: a cache folder anyone can write to must not choose what code runs).
_TYPES: dict[str, type] = {}


def partial_type(cls: type) -> type:
    """Declare a NamedTuple or dataclass of l5dask as one a cache entry may hold (a class decorator).

    Partials of any other class are not cached (:class:`Unencodable`), and an entry naming a class
    not declared here (in this process: its module imported) is refused as damaged."""
    if not ((issubclass(cls, tuple) and hasattr(cls, "_fields")) or dataclasses.is_dataclass(cls)):
        raise TypeError(f"{_name(cls)} is neither a NamedTuple nor a dataclass")
    _TYPES[_name(cls)] = cls
    return cls


def _allowed(cls: type) -> bool:
    return _TYPES.get(_name(cls)) is cls


def _class(name: str) -> type:
    cls = _TYPES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise Damaged(f"an entry names a class l5dask does not keep in a cache ({str(name)[:80]!r})")
    return cls


def _name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


class _Encoder:
    def __init__(self) -> None:
        self.arrays: list[np.ndarray] = []

    def array(self, a: np.ndarray) -> dict:
        if a.dtype.hasobject:
            raise Unencodable(f"an array of Python objects ({a.dtype})")
        # (not np.ascontiguousarray: it makes a 0-d array one of shape (1,); the property test found it)
        self.arrays.append(a if a.flags.c_contiguous else np.array(a, order="C"))
        return {"t": "nd", "i": len(self.arrays) - 1}

    def __call__(self, x: Any) -> Any:
        if isinstance(x, np.generic):  # (first: numpy's str_ is a str, its float64 a float)
            if x.dtype.hasobject:
                raise Unencodable("a numpy object scalar")
            held = np.asarray(x)  # (its dtype: a str_ scalar's own says 0 bytes when it is empty)
            return {"t": "np", "d": _descr(held.dtype), "v": held.tobytes().hex()}
        if x is None or isinstance(x, (bool, str)):
            return x if not isinstance(x, str) else {"t": "s", "v": x}
        if isinstance(x, np.ndarray):
            return self.array(x)
        if isinstance(x, int):
            return {"t": "i", "v": str(int(x))}
        if isinstance(x, float):
            return {"t": "f", "v": _float_bits(x)}
        if isinstance(x, tuple) and hasattr(type(x), "_fields"):
            if not _allowed(type(x)):
                raise Unencodable(f"a NamedTuple not declared a partial_type ({_name(type(x))})")
            return {"t": "nt", "c": _name(type(x)), "v": [self(v) for v in x]}
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            if not _allowed(type(x)):
                raise Unencodable(f"a dataclass not declared a partial_type ({_name(type(x))})")
            return {
                "t": "dc",
                "c": _name(type(x)),
                "v": {f.name: self(getattr(x, f.name)) for f in dataclasses.fields(x)},
            }
        if type(x) in (tuple, list):
            return {"t": "tu" if type(x) is tuple else "li", "v": [self(v) for v in x]}
        if type(x) is dict:
            return {"t": "di", "k": [self(k) for k in x], "v": [self(v) for v in x.values()]}
        if type(x) in (frozenset, set):
            items = list(x)
            kinds = {type(v) for v in items}
            if kinds <= {str} and items:
                # (a set of strings: one "<U" array, when none ends with a NUL, which numpy drops: their
                # lengths add up to the array's. 34,000 face ids: 8 ms to encode and 2.5 ms to decode,
                # against 39 and 16 ms as a list in the manifest. Sorted by numpy, in the order
                # ``list.sort`` gives (code points; a string before those it begins, as no string ends
                # with a NUL): the same bytes in every process, 1.4 ms against 2.3 sorted in Python)
                strings = np.array(items, dtype=str)
                if sum(map(len, items)) == int(np.strings.str_len(strings).sum(dtype=np.int64)):
                    strings.sort()
                    return {"t": "fs" if type(x) is frozenset else "se", "k": "u", "i": self.array(strings)["i"]}
            if kinds <= {int} or kinds <= {str}:
                items.sort()  # (the same bytes in every process: a set of strings iterates by their hashes)
            if kinds <= {int} and items and -(2**63) <= min(items) and max(items) < 2**63:
                # (a set of numbers: one array)
                arr = np.array(items, dtype=np.int64)
                return {"t": "fs" if type(x) is frozenset else "se", "k": "i", "i": self.array(arr)["i"]}
            return {"t": "fs" if type(x) is frozenset else "se", "v": [self(v) for v in items]}
        raise Unencodable(f"a {type(x).__module__}.{type(x).__qualname__}")


class _Decoder:
    def __init__(self, arrays: Any) -> None:
        self.arrays = arrays

    def array(self, i: Any) -> np.ndarray:
        return self.arrays[int(i)]

    def __call__(self, x: Any) -> Any:
        if x is None or isinstance(x, bool):
            return x
        if not isinstance(x, dict):
            raise Damaged("an entry's manifest holds an unknown value")
        t = x.get("t")
        if t == "s":
            return str(x["v"])
        if t == "nd":
            return self.array(x["i"])
        if t == "np":
            dtype, raw = _dtype(x["d"]), bytes.fromhex(x["v"])
            if len(raw) != dtype.itemsize:
                raise Damaged("a numpy scalar of another size than its dtype's")
            return np.zeros((), dtype)[()] if not raw else np.frombuffer(raw, dtype)[0]
        if t == "i":
            return int(x["v"])
        if t == "f":
            return struct.unpack("<d", bytes.fromhex(x["v"]))[0]
        if t == "nt":
            cls = _class(x["c"])
            if not (issubclass(cls, tuple) and hasattr(cls, "_fields")):
                raise Damaged(f"{x['c']} is no NamedTuple")
            return cls(*[self(v) for v in x["v"]])
        if t == "dc":
            cls = _class(x["c"])
            if not dataclasses.is_dataclass(cls):
                raise Damaged(f"{x['c']} is no dataclass")
            values = {k: self(v) for k, v in x["v"].items()}
            fields = {f.name: f for f in dataclasses.fields(cls)}
            if set(values) != set(fields):
                raise Damaged(f"{x['c']}'s fields are not the entry's")
            obj = cls(**{k: v for k, v in values.items() if fields[k].init})
            for k, v in values.items():
                if not fields[k].init:
                    object.__setattr__(obj, k, v)
            return obj
        if t in ("tu", "li"):
            items = [self(v) for v in x["v"]]
            return tuple(items) if t == "tu" else items
        if t == "di":
            return {self(k): self(v) for k, v in zip(x["k"], x["v"], strict=True)}
        if t in ("fs", "se"):
            if "i" in x:
                arr = self.array(x["i"])
                if (x.get("k"), arr.dtype.kind, arr.ndim) not in (("i", "i", 1), ("u", "U", 1)):
                    raise Damaged("a set kept in an array of another kind than integers or strings")
                items = arr.tolist()
            else:
                items = [self(v) for v in x["v"]]
            return frozenset(items) if t == "fs" else set(items)
        raise Damaged(f"an entry's manifest holds an unknown kind {t!r}")


def _descr(dtype: np.dtype) -> Any:
    """A dtype as JSON (numpy's ``.npy`` description of it)."""
    return np.lib.format.dtype_to_descr(dtype)


def _dtype(descr: Any) -> np.dtype:
    """The dtype a JSON description names (numpy's ``descr_to_dtype``: never an object dtype)."""

    def tuples(x: Any) -> Any:
        if isinstance(x, list) and x and all(isinstance(f, list) for f in x):
            return [tuple(tuples(v) if i == 1 else (tuple(v) if i == 2 else v) for i, v in enumerate(f)) for f in x]
        return x

    dtype = np.lib.format.descr_to_dtype(tuples(descr))
    if dtype.hasobject:
        raise Damaged("an entry's array holds Python objects")
    return dtype


def encode(partial: Any, about: dict[str, Any] | None = None) -> bytes:
    """An entry's bytes: ``partial`` as a JSON manifest and its arrays' bytes (no pickle), with its
    digest; ``about`` (JSON) is kept in the manifest. :class:`Unencodable` if it cannot be."""
    enc = _Encoder()
    tree = enc(partial)
    arrays, offset = [], 0
    for a in enc.arrays:
        arrays.append({"dtype": _descr(a.dtype), "shape": list(a.shape), "offset": offset})
        offset += a.nbytes
    manifest = json.dumps(
        {"format": FORMAT, "about": about or {}, "arrays": arrays, "tree": tree}, separators=(",", ":")
    ).encode()
    body = b"".join([struct.pack("<I", len(manifest)), manifest, *(a.tobytes() for a in enc.arrays)])
    return _HEAD.pack(MAGIC, FORMAT, hashlib.blake2b(body, digest_size=16).digest()) + body


def manifest_of(data: bytes) -> dict[str, Any]:
    """An entry's manifest, the entry checked whole (:class:`Damaged` otherwise)."""
    return _open(data)[0]


def _manifest_format(body: memoryview) -> Any:
    """The format a sound entry's manifest says (``None`` when it says none)."""
    try:
        (size,) = struct.unpack_from("<I", body)
        manifest = json.loads(bytes(body[4 : 4 + size]))
    except Exception:  # noqa: BLE001 - any fault of the bytes: no format said
        return None
    return manifest.get("format") if isinstance(manifest, dict) else None


def _open(data: bytes) -> tuple[dict[str, Any], list[np.ndarray]]:
    if len(data) < _HEAD.size + 4:
        raise Damaged("truncated (shorter than its header)")
    magic, fmt, digest = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise Damaged("not an l5dask cache entry")
    body = memoryview(data)[_HEAD.size :]
    if hashlib.blake2b(body, digest_size=16).digest() != digest:
        raise Damaged("its checksum does not match (damaged or truncated)")
    if fmt != FORMAT:
        # (another format's entry says its format in its manifest too; a header whose field was
        # changed alone, a bit flipped, is damaged: it once said "of cache format 65542")
        raise Damaged(
            f"of cache format {fmt}, not {FORMAT}"
            if _manifest_format(body) == fmt
            else "its header does not match its contents (damaged)"
        )
    try:
        (size,) = struct.unpack_from("<I", body)
        manifest = json.loads(bytes(body[4 : 4 + size]))
        payload = bytearray(body[4 + size :])  # (one copy: the arrays are writable, as computed ones)
        arrays = []
        for a in manifest["arrays"]:
            dtype, shape = _dtype(a["dtype"]), tuple(int(n) for n in a["shape"])
            count = int(np.prod(shape, dtype=np.int64))
            start = int(a["offset"])
            if start < 0 or start + count * dtype.itemsize > len(payload):
                raise Damaged("an array runs past the entry's end")
            arrays.append(np.frombuffer(payload, dtype, count, start).reshape(shape))
    except Damaged:
        raise
    except Exception as exc:  # noqa: BLE001 - any fault of the bytes is a damaged entry
        raise Damaged(f"unreadable ({type(exc).__name__})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise Damaged("its manifest is not of this format")
    return manifest, arrays


def decode(data: bytes, name: str | None = None) -> Any:
    """The partial an entry holds (:class:`Damaged` if it is not a sound entry of this format);
    ``name``: the entry's file name, which its manifest must give as its own (:func:`store`)."""
    manifest, arrays = _open(data)
    if name is not None:
        about = manifest.get("about")
        own = about.get("entry") if isinstance(about, dict) else None
        if own != name:
            raise Damaged(f"it is the entry {str(own)[:80]!r}, filed under another name")
    try:
        return _Decoder(arrays)(manifest["tree"])
    except Damaged:
        raise
    except Exception as exc:  # noqa: BLE001 - a manifest that does not decode is damaged
        raise Damaged(f"its manifest does not decode ({type(exc).__name__}: {exc})") from None


# --- keys -------------------------------------------------------------------------------------
def digest(*parts: Any) -> str:
    """A stable hex digest of parts made of strings, numbers, bytes, ``None``, booleans, tuples,
    lists and dicts of them: their ``repr``, the same in every process (a ``TypeError`` for an
    object whose ``repr`` holds its address)."""
    return digest_repr(repr(parts))


def digest_repr(text: str) -> str:
    """:func:`digest` of parts whose ``repr`` is ``text`` (made by the caller from the ``repr`` of
    pieces it made once: ``Job.group_ids``, a key a task)."""
    if " at 0x" in text or "object at" in text:
        raise TypeError("cannot digest an object without a stable repr")
    return hashlib.blake2b(text.encode(), digest_size=20).hexdigest()


def key_of(name: str) -> str:
    """The key in an entry's file name (``<reduction>.<key>.l5c``)."""
    return name[: -len(SUFFIX)].rsplit(".", 1)[-1]


def rows_digest(offset: int, cols: dict[str, np.ndarray]) -> str:
    """The identity of rows held in memory: their offset, and each column's name, dtype, shape and bytes."""
    h = hashlib.blake2b(digest_size=20)
    h.update(str(offset).encode())
    for name in sorted(cols):
        c = np.ascontiguousarray(cols[name])
        h.update(f"|{name}|{c.dtype.str}|{c.shape}|".encode())
        h.update(c.view(np.uint8).reshape(-1).data if c.size else b"")
    return h.hexdigest()


def reduction_token(reduction: Any) -> str | None:
    """What a reduction computes, apart from its data: its ``cache_token`` if it declares one,
    else its name and its ``chunk``, ``combine`` and ``identity`` (functions with their bound
    arguments) tokenized deterministically; ``None`` when they cannot be (it is then not cached)."""
    import dask
    from dask.base import tokenize

    declared = getattr(reduction, "cache_token", None)
    if callable(declared):
        return None  # (a token a task: see l5dask.core.engine.Job.group_ids)
    got = _TOKENS.get(id(reduction))
    if got is not None and got[0] is reduction:  # (asked for each task's key: tokenized once)
        return got[1]
    try:
        with dask.config.set({"tokenize.ensure-deterministic": True}):
            if declared is not None:
                token = tokenize("declared", reduction.name.split("-")[0], declared)
            else:
                token = tokenize(reduction.name, reduction.chunk, reduction.combine, reduction.identity)
    except Exception:  # noqa: BLE001 - not deterministic: not cached
        token = None
    with _WARN_LOCK:
        if len(_TOKENS) > 256:
            _TOKENS.clear()
        _TOKENS[id(reduction)] = (reduction, token)  # (held: its id is not another's while here)
    return token


#: Reductions' tokens, by the reduction's id (the reduction held with its token).
_TOKENS: dict[int, tuple[Any, str | None]] = {}


def function_token(fn: Any) -> str | None:
    """A function (with its bound arguments) tokenized deterministically; ``None`` when it cannot be."""
    import dask
    from dask.base import tokenize

    try:
        with dask.config.set({"tokenize.ensure-deterministic": True}):
            return tokenize(fn)
    except Exception:  # noqa: BLE001 - not deterministic: not cached
        return None


def version() -> str:
    """l5dask's version: part of every key (another version's entries are not read)."""
    return __version__


def slug(text: str, most: int = 48) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:most].strip("._") or "x"


# --- the cache --------------------------------------------------------------------------------
_WARNED: set[str] = set()
#: The local folders of entries this process made (or found there).
_MADE: set[str] = set()
_WARN_LOCK = threading.Lock()


def warn_once(what: str, message: str) -> None:
    """One warning a process for each kind of trouble (``what``)."""
    with _WARN_LOCK:
        if what in _WARNED:
            return
        _WARNED.add(what)
    log.warning("l5dask: cache: %s", message)


config.on_reset(_WARNED.clear)
config.on_reset(_TOKENS.clear)

#: Protocols whose filesystems l5dask can write a cache to.
WRITABLE = {"file", "local", "s3", "s3a", "gs", "gcs", "abfs", "az", "memory"}


def check_location(url: str, key: str = "--cache") -> str:
    """Refuse (a :class:`~l5dask.errors.UsageError`, one line naming ``key``) a location l5dask cannot
    write a cache at (an archive, a chained URL, a read-only protocol); return its protocol."""
    if not url:
        raise UsageError("the cache's location is empty")
    if "::" in url or url.rstrip("/").lower().endswith((".zip", ".tar", ".tgz", ".tar.gz")):
        raise UsageError(f"{key} {url}: l5dask cannot write a cache there (an archive or a chained URL)")
    proto = url.split("://", 1)[0].lower() if "://" in url else "file"
    if proto not in WRITABLE:
        raise UsageError(
            f"{key} {url}: l5dask cannot write a cache on {proto}:// (a local folder, s3://, gs:// or "
            "abfs:// can hold one)"
        )
    if proto == "file":
        path = os.path.abspath(url.removeprefix("file://"))
        if os.path.isfile(path):
            raise UsageError(f"{key} {url}: is a file; a cache is a folder")
        while True:  # (the folder or one it is in)
            if os.path.isfile(os.path.join(path, ".zgroup")) or os.path.isfile(os.path.join(path, ".zarray")):
                raise UsageError(f"{key} {url}: is in a dataset ({path}); a cache is a folder of its own")
            parent = os.path.dirname(path)
            if parent == path:
                break
            path = parent
    return proto


def cannot_write(url: str) -> str | None:
    """Why a local cache at ``url`` could not be written (what a run would warn of, then go on
    without it), found making nothing that stays: ``None`` when it can be, or when it is not local
    (a bucket is probed by writing, which a check does not do)."""
    if "://" in url and not url.startswith("file://"):
        return None
    path = os.path.abspath(url.removeprefix("file://"))
    try:  # (the cache's folders are made in the nearest one that is there, as an output's)
        folders_to_make(os.path.join(path, FOLDER))
    except OutputError as exc:
        return str(exc).split(": ", 1)[1]
    return None


def require_cache(cache: Cache) -> Cache:
    """``cache``, refused in one line (a :class:`~l5dask.errors.UsageError`) if its location is not
    an l5dask cache: missing, or holding other things and no ``l5dask-cache-vN`` folder (the mark
    of a cache and of its format, made with its first entry). An empty folder is an empty cache."""
    store, url = cache.store, cache.url
    if store.local:
        root = store.path("")
        if not os.path.exists(root):
            raise UsageError(f"{url}: no such cache (the folder does not exist)")
        names = [n for n in os.listdir(root) if n != ".DS_Store"]
    else:
        fs = store.fs
        base = store.path("").rstrip("/")
        fs.invalidate_cache(base)
        try:
            names = [posixpath.basename(n.rstrip("/")) for n in fs.ls(base, detail=False)] if fs.exists(base) else []
        except (OSError, ValueError):
            names = []
        if not names:
            raise UsageError(f"{url}: no such cache (nothing is there)")
    if not names or FOLDER in names:
        return cache
    other = sorted(n for n in names if n.startswith("l5dask-cache-v"))
    if other:
        raise UsageError(f"{url}: a cache of another format ({', '.join(other)}); this l5dask reads {FOLDER}")
    raise UsageError(f"{url}: not an l5dask cache (it holds no {FOLDER} folder)")


class Cache:
    """A cache of partials at ``url`` (a local folder or a bucket's prefix), read through a
    :class:`~l5dask.core.store.Store` (on S3, its GETs through obstore) and written with one
    atomic step an entry. Picklable: tasks carry it to the workers, which read and write entries."""

    def __init__(self, url: str | os.PathLike, storage_options: dict[str, Any] | None = None) -> None:
        url = os.fspath(url)
        proto = check_location(url)
        self.url = url
        self.storage_options = dict(storage_options or {}) if proto != "file" else {}
        self.store = Store(url, self.storage_options)
        self.writable = True

    def __reduce__(self):
        return (_rebuild_cache, (self.url, self.storage_options, self.writable))

    def __dask_tokenize__(self):
        return ("l5dask.Cache", self.url)

    def __repr__(self) -> str:
        return f"Cache({self.url!r})"

    # -- where entries are ------------------------------------------------------------------
    @staticmethod
    def folder_of(source_id: str) -> str:
        return posixpath.join(FOLDER, source_id)

    @staticmethod
    def entry_name(reduction: str, key: str) -> str:
        """An entry's file name: the reduction's name (without the dask tokens that may hold the
        dataset's own, which changes as it grows: at its end, or a fused pass's members' inside
        ``fused(...)``), then its key. The key says what it computes; the name is what aliases
        are found by (a fused pass with an aggregation missed them all after an append)."""
        return f"{slug(re.sub(r'-[0-9a-f]{32}(?![0-9a-zA-Z])', '', reduction))}.{key}{SUFFIX}"

    def present(self, folder: str) -> set[str]:
        """The entries in ``folder`` (one listing); none when it cannot be listed."""
        try:
            if self.store.local:
                path = self.store.path(folder)
                return {n for n in os.listdir(path) if n.endswith(SUFFIX)} if os.path.isdir(path) else set()
            if not self.store.fs.exists(self.store.path(folder)):
                return set()
            return {n for n in self.store.sizes(folder) if n.endswith(SUFFIX)}
        except (OSError, StoreError) as exc:
            warn_once("list", f"{self.url}: cannot list the cache ({exc}); computing without it")
            return set()

    # -- reading and writing ----------------------------------------------------------------
    def read(self, path: str) -> bytes | None:
        """An entry's bytes, ``None`` when it is not there."""
        try:
            if self.store.local:
                with open(self.store.path(path), "rb") as f:
                    return f.read()
            return self.store.get(path)
        except FileNotFoundError:
            return None
        except Exception as exc:  # noqa: BLE001 - missing or unreadable: recomputed
            if "missing" in str(exc) or isinstance(exc, FileNotFoundError):
                return None
            warn_once("read", f"{self.url}: cannot read {path} ({exc}); computing it again")
            return None

    def write(self, path: str, data: bytes) -> bool:
        """Put an entry whole, in one atomic step (:func:`~l5dask.core.outputs.atomic_output`: a
        rename beside it; on an object store, one PUT)."""
        if not self.writable:
            return False
        try:
            self.write_plain(path, data)
        except Exception as exc:  # noqa: BLE001 - a cache that cannot be written: the run goes on
            warn_once("write", f"{self.url}: cannot write to the cache ({_one_line(exc)}); going on without it")
            count(write_failures=1)
            return False
        count(written=1, bytes_written=len(data))
        return True

    def write_plain(self, path: str, data: bytes) -> None:
        """``data`` at ``path`` (under the cache's root), whole or not at all."""
        if self.store.local:
            full = self.store.path(path)
            folder = os.path.dirname(full)
            if folder not in _MADE:  # (a folder made once a process: a makedirs a write was 2 syscalls more)
                os.makedirs(folder, exist_ok=True)
                _MADE.add(folder)
        else:
            full = f"{self.url.rstrip('/')}/{path}"
        try:
            with atomic_output(full, self.storage_options, checked=True) as tmp:
                with open(tmp, "wb") as f:
                    f.write(data)
        except OutputError:
            if not self.store.local or os.path.isdir(os.path.dirname(full)):
                raise
            _MADE.discard(os.path.dirname(full))  # (removed since it was made: made again, once)
            self.write_plain(path, data)

    def remove(self, path: str) -> None:
        if self.store.local:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.store.path(path))
        else:
            self.store.fs.rm_file(self.store.path(path))

    def probe(self) -> bool:
        """Whether an entry can be written here (a small object written and removed)."""
        name = posixpath.join(FOLDER, f".probe-{uuid.uuid4().hex}")
        try:
            if self.store.local:
                full = self.store.path(name)
                os.makedirs(os.path.dirname(full), exist_ok=True)
                with open(full, "wb") as f:
                    f.write(b"probe")
                os.unlink(full)
            else:
                self.store.fs.pipe_file(self.store.path(name), b"probe")
                self.store.fs.rm_file(self.store.path(name))
        except Exception as exc:  # noqa: BLE001 - one warning, then the run goes on uncached
            warn_once("probe", f"{self.url}: cannot write to the cache ({_one_line(exc)}); going on without it")
            count(write_failures=1)
            return False
        return True

    def describe(self, folder: str, about: dict[str, Any]) -> None:
        """``folder/source.json``: what the folder's entries were read from (for ``cache info``)."""
        path = posixpath.join(folder, "source.json")
        if self.store.local and os.path.exists(self.store.path(path)):
            return
        with contextlib.suppress(Exception):  # (a cache that cannot be written is said by its entries)
            self.write_plain(path, json.dumps(about).encode())

    # -- the entries whole (info, prune) ----------------------------------------------------
    def entries(self) -> list[dict[str, Any]]:
        """Every entry: its path, folder, reduction, size and time written."""
        out = []
        root = self.store.path(FOLDER)
        if self.store.local:
            if not os.path.isdir(root):
                return []
            for folder in sorted(os.listdir(root)):
                sub = os.path.join(root, folder)
                if not os.path.isdir(sub):
                    continue
                with os.scandir(sub) as it:
                    for e in it:
                        if e.name.endswith(SUFFIX) and e.is_file():
                            st = e.stat()
                            out.append(_entry(folder, e.name, st.st_size, st.st_mtime))
            return out
        fs = self.store.fs
        fs.invalidate_cache(root)
        if not fs.exists(root):
            return []
        for info in fs.find(root, detail=True).values():
            rel = info["name"][len(root.rstrip("/")) + 1 :] if info["name"].startswith(root.rstrip("/")) else ""
            folder, _, name = rel.partition("/")
            if not name.endswith(SUFFIX) or "/" in name:
                continue
            when = info.get("LastModified") or info.get("mtime") or info.get("last_modified")
            stamp = when.timestamp() if hasattr(when, "timestamp") else float(when or 0)
            out.append(_entry(folder, name, int(info["size"]), stamp))
        return out

    def sources(self) -> dict[str, dict[str, Any]]:
        """Each folder's ``source.json`` (what its entries were read from)."""
        out: dict[str, dict[str, Any]] = {}
        for folder in {e["folder"] for e in self.entries()}:
            raw = self.read(posixpath.join(FOLDER, folder, "source.json"))
            try:
                out[folder] = json.loads(raw) if raw else {}
            except ValueError:
                out[folder] = {}
        return out


def _entry(folder: str, name: str, size: int, mtime: float) -> dict[str, Any]:
    return {
        "path": posixpath.join(FOLDER, folder, name),
        "folder": folder,
        "reduction": name.rsplit(".", 2)[0],
        "size": size,
        "mtime": mtime,
    }


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:200]


def _rebuild_cache(url: str, storage_options: dict[str, Any], writable: bool) -> Cache:
    c = Cache.__new__(Cache)
    c.url, c.storage_options, c.writable = url, storage_options, writable
    c.store = Store(url, storage_options)
    return c


def open_cache(cache: Any = None, storage_options: dict[str, Any] | None = None) -> Cache | None:
    """The cache to use: ``cache`` (a :class:`~l5dask.core.cache.Cache`, or a folder or URL), else dask config
    ``l5dask.cache``; ``None`` for none. A URL on S3 takes ``storage_options`` (the dataset's).
    A cache that cannot be written is one warning and ``None`` (the run goes on without it); a
    location l5dask cannot write at all is a :class:`~l5dask.errors.UsageError`."""
    if isinstance(cache, Cache):
        return cache if cache.writable else None
    said = "--cache"
    if cache is None or cache is True:
        cache, said = config.get("cache"), "l5dask.cache (DASK_L5DASK__CACHE or a config file):"
    if cache is None or cache is False or cache == "":
        return None
    url = os.fspath(cache)
    check_location(url, said)  # (refused naming where it was said: no --cache was given)
    remote = "://" in url and not url.startswith("file://")
    got = Cache(url, storage_options if remote else None)
    if not got.probe():
        got.writable = False
        return None
    return got


# --- info and prune ---------------------------------------------------------------------------
def info(cache: Cache) -> dict[str, Any]:
    """Size and entries of a cache, in all and by source (dataset and array) and reduction."""
    entries = cache.entries()
    sources = cache.sources() if entries else {}
    by: dict[tuple[str, str, str], list[int]] = {}
    for e in entries:
        src = sources.get(e["folder"], {})
        k = (str(src.get("dataset", "?")), str(src.get("source", e["folder"])), e["reduction"])
        got = by.setdefault(k, [0, 0])
        got[0] += 1
        got[1] += e["size"]
    return {
        "cache": cache.url,
        "entries": len(entries),
        "bytes": sum(e["size"] for e in entries),
        "oldest": min((e["mtime"] for e in entries), default=None),
        "newest": max((e["mtime"] for e in entries), default=None),
        "by": [
            {"dataset": d, "source": s, "reduction": r, "entries": n, "bytes": b}
            for (d, s, r), (n, b) in sorted(by.items())
        ],
    }


def prune(cache: Cache, max_size: int) -> tuple[int, int]:
    """Remove the oldest entries until the cache holds at most ``max_size`` bytes; returns the
    entries and bytes removed."""
    entries = sorted(cache.entries(), key=lambda e: (e["mtime"], e["path"]))
    total = sum(e["size"] for e in entries)
    removed = freed = 0
    for e in entries:
        if total <= max_size:
            break
        cache.remove(e["path"])
        total -= e["size"]
        removed += 1
        freed += e["size"]
    return removed, freed


def parse_size(text: str) -> int:
    """``10GB``, ``500M``, ``1.5 GiB``, ``0``... as bytes (powers of 1000, or of 1024 with ``i``)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([kKmMgGtT]?)(i?)[bB]?\s*", text)
    if m is None:
        raise UsageError(f"--max-size {text!r}: expected a size such as 500MB, 10GB or 2GiB")
    base = 1024 if m.group(3) else 1000
    power = " KMGT".index(m.group(2).upper() or " ")
    return int(float(m.group(1)) * base**power)


# --- what a task does with it -----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Entry:
    """Where a task's partial is kept, and what it says of itself."""

    cache: Cache
    path: str
    about: dict[str, Any]


def load(entry: Entry) -> tuple[bool, Any]:
    """``(True, partial)`` from a sound entry; ``(False, None)`` when it is missing or damaged
    (damage is one warning a process and counted)."""
    data = entry.cache.read(entry.path)
    if data is None:
        return False, None
    try:
        value = decode(data, posixpath.basename(entry.path))
    except Damaged as exc:
        warn_once(
            "damaged",
            f"{entry.cache.url}: ignoring a damaged entry {entry.path} ({exc}); computing it again "
            "(the first of this process; all are counted)",
        )
        count(damaged=1)
        return False, None
    count(bytes_read=len(data))
    return True, value


def store(entry: Entry, partial: Any) -> bool:
    """Keep ``partial`` in ``entry`` (what cannot be encoded is not kept); whether it was kept."""
    try:
        data = encode(partial, {**entry.about, "entry": posixpath.basename(entry.path), "written": time.time()})
    except Unencodable as exc:
        warn_once(f"unencodable-{entry.about.get('reduction')}", f"not caching {entry.about.get('reduction')}: {exc}")
        return False
    return entry.cache.write(entry.path, data)


#: The name of an entry an alias may point to: in the alias's own folder, nothing else.
_TARGET = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.[0-9a-f]{40}" + re.escape(SUFFIX))
#: An alias's key: ``r<first>-<n>-<digest>`` (the chunks of the task, then the key proper), so that
#: a listing says which runs of chunks have aliases (worth a read) without reading them.
_ALIAS_KEY = re.compile(r"r([0-9]+)-([0-9]+)-[0-9a-f]{40}")


def alias_key(first: int, n: int, key: str) -> str:
    """The key of an alias entry of the task over chunks ``first .. first + n - 1``."""
    return f"r{int(first)}-{int(n)}-{key}"


def alias_ranges(keys: Any) -> set[tuple[int, int]]:
    """The runs of chunks ``(first, n)`` that have an alias among ``keys`` (a folder's keys)."""
    out = set()
    for k in keys:
        m = _ALIAS_KEY.fullmatch(k) if k[:1] == "r" else None
        if m is not None:
            out.add((int(m.group(1)), int(m.group(2))))
    return out


def keep_alias(alias: Entry, target: Entry) -> bool:
    """Keep in ``alias`` the name of ``target`` (an entry of the same folder): a second key of its partial."""
    if posixpath.dirname(alias.path) != posixpath.dirname(target.path):
        raise ValueError("an alias names an entry of its own folder")
    return store(alias, ("alias", posixpath.basename(target.path)))


def follow(alias: Entry) -> Entry | None:
    """The entry ``alias`` names, ``None`` when the alias is missing or not sound (then its task is
    computed, and the alias written again). An alias names a file of its own folder alone (the
    name checked: never a path a cache's writer chose elsewhere)."""
    ok, got = load(alias)
    if not ok:
        return None
    if not (isinstance(got, tuple) and len(got) == 2 and got[0] == "alias" and isinstance(got[1], str)):
        return None
    if _TARGET.fullmatch(got[1]) is None:
        return None
    return Entry(alias.cache, posixpath.join(posixpath.dirname(alias.path), got[1]), alias.about)


def reset_warnings() -> None:
    """Say each kind of trouble again (its one warning a process)."""
    with _WARN_LOCK:
        _WARNED.clear()
