"""The one way l5dask writes an output, a file or a folder: checked before any work, written
atomically (:func:`~l5dask.core.outputs.atomic_output`).

A local output is written to a temporary file or folder beside it, then renamed into place (a
folder that was there is removed only then). A file on an object store (``s3://...`` or any
fsspec URL) is written to a local temporary file, then put as one object: object stores make an
object visible only once it is whole. Either way a run that fails, for any reason (bad data, a
lost cluster, a full disk), keeps the previous output as it was and leaves no partial one that
looks complete. (A dataset written in place on an object store cannot be renamed: its writer
puts its group metadata last, ``l5dask.prediction.writing.finish``.)
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import secrets
import shutil
import socket
import stat
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from l5dask.core.store import resolved_options
from l5dask.errors import L5DaskError, OutputError, UsageError


def _remote(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def filesystem(path: str, storage_options: dict[str, Any] | None):
    """The fsspec filesystem of a file's URL and its path there (S3 options resolved as the store's)."""
    from fsspec.core import url_to_fs

    return url_to_fs(path, **resolved_options(path, storage_options))


def exists(path: str, storage_options: dict[str, Any] | None = None) -> bool:
    """Whether something is at ``path`` (a local path is looked up without fsspec: a command that
    writes locally never imports it, 0.15 s)."""
    path = os.fspath(path)
    if not _remote(path):
        return os.path.exists(path[len("file://") :] if path.startswith("file://") else path)
    fs, target = filesystem(path, storage_options)
    return bool(fs.exists(target))


def check_writable(path: str, storage_options: dict[str, Any] | None = None) -> str:
    """Fail now, in one line, if ``path`` cannot be written (before any computation); return it."""
    path = os.fspath(path)
    if _remote(path):
        try:
            fs, target = filesystem(path, storage_options)
            parent = target.rstrip("/").rsplit("/", 1)[0] if "/" in target.rstrip("/") else target
            bucket = target.split("/", 1)[0]
            if not fs.exists(bucket):
                raise OutputError(
                    f"{path}: the bucket {bucket!r} does not exist (or is not visible with these credentials)"
                )
            if fs.isfile(parent) and parent != bucket:
                raise OutputError(f"{path}: {parent!r} is a file, not a prefix")
        except L5DaskError:
            raise
        except (OSError, ValueError, ImportError) as exc:
            raise OutputError(
                f"{path}: cannot write there: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__}"
            ) from None
        return path
    path = os.path.abspath(path.removeprefix("file://"))
    if os.path.isdir(path):
        raise OutputError(f"{path}: is a folder; give a file name")
    if streamed(path):  # (a device, a pipe: written through, as it is)
        if not os.access(path, os.W_OK):
            raise OutputError(f"{path}: is not writable")
        return path
    folder = os.path.dirname(os.path.realpath(path))
    if not os.path.isdir(folder):
        what = "is a file, not a folder" if os.path.exists(folder) else "does not exist"
        raise OutputError(f"{path}: the folder {folder} {what}")
    probe_folder(folder, path)
    return path


def streamed(path: str) -> bool:
    """Whether the local ``path`` (its links followed) is there and not a regular file nor a folder:
    a device (``/dev/null``, ``/dev/stdout``'s terminal), a named pipe, a socket. Such an output is
    written through, not replaced: a rename onto ``/dev/null`` would put a regular file in its place."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def folders_to_make(path: str) -> list[str]:
    """The folders above the local ``path`` that are not there yet (outermost first), once the
    nearest one that is there is found to be a folder a file can be made in (else an
    :class:`~l5dask.errors.OutputError` naming ``path``); nothing is made that stays."""
    parent = os.path.dirname(path)
    absent = []
    while not os.path.exists(parent):
        absent.append(parent)
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise OutputError(f"{path}: cannot make its folder: {parent} is a file")
    probe_folder(parent, path)
    return absent[::-1]


def probe_folder(folder: str, path: str) -> None:
    """Refuse (one line naming ``path``) a local ``folder`` a file cannot be made in: a file is made
    there and removed (permissions do not tell: root, ``/proc``, a read-only mount)."""
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"{path}: the folder {folder} is not writable")
    try:
        fd, probe = tempfile.mkstemp(prefix=".l5dask-probe.", dir=folder)
    except OSError as exc:
        raise OutputError(f"{path}: {_why_not_writable(folder, exc)}") from None
    os.close(fd)
    os.unlink(probe)


def _why_not_writable(folder: str, exc: OSError) -> str:
    """Why no file can be made in the (existing) ``folder``, from the error of making one."""
    if exc.errno in (errno.ENOENT, errno.ENOTSUP, errno.EOPNOTSUPP):  # (/proc, /sys: the folder is there)
        return f"the folder {folder} takes no new files (a virtual filesystem such as /proc or /sys)"
    if exc.errno == errno.EROFS:
        return f"the folder {folder} is on a read-only filesystem"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"the folder {folder} is not writable"
    return f"cannot write in the folder {folder}: {exc.strerror or exc}"


@contextlib.contextmanager
def atomic_output(
    path: str, storage_options: dict[str, Any] | None = None, folder: bool = False, checked: bool = False
) -> Iterator[str]:
    """A temporary local path to write the output ``path`` at (a file, or with ``folder`` a folder
    made empty), moved into place whole when the block ends without an error.

    A file goes to ``path`` by a rename beside it (a link's target is replaced, the link kept), or
    on an object store as one object put; a device or a named pipe (``/dev/null``) is written
    through once the file is whole, never replaced. A
    folder (local only) replaces ``path``, whose previous content is removed only then. An error
    in the block (a full disk, Ctrl-C...) removes the temporary file or folder and keeps any
    previous ``path``; an ``OSError`` is raised as an :class:`~l5dask.errors.OutputError` that
    names ``path``. ``checked``: the caller checked ``path`` already (else
    ``check_writable`` does, for a file).
    """
    path = os.fspath(path)
    if folder:
        if _remote(path):
            raise UsageError(f"{path}: a folder is written whole only on a local disk")
        path = os.path.abspath(path.removeprefix("file://"))
    elif not checked:
        path = check_writable(path, storage_options)
    remote = _remote(path)
    through = not folder and not remote and streamed(path)
    if not folder and not remote and not through:
        path = os.path.realpath(path)  # (a link to a file: the file is replaced, the link kept)
    parent = None if remote or through else os.path.dirname(path)
    name = path.rstrip("/").rsplit("/", 1)[-1]
    try:
        tmp = _temporary(parent, name, folder)
    except OSError as exc:  # (said of the output: its temporary name is no user's concern)
        raise OutputError(f"{path}: {_why_not_writable(str(parent), exc)}") from None
    try:
        yield tmp
        if remote:
            fs, target = filesystem(path, storage_options)
            fs.put_file(tmp, target)  # one object, visible only once whole
        elif through:  # (a device or a pipe: its bytes, once whole, written into it)
            with open(tmp, "rb") as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst)
        else:
            if folder and os.path.isdir(path):
                shutil.rmtree(path)
            os.replace(tmp, path)
    except BaseException as exc:
        _remove(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, L5DaskError):
            what = "folder" if folder else "file"
            raise OutputError(
                f"{path}: writing failed, the previous {what} (if any) is kept: {exc.strerror or exc}"
            ) from exc
        raise
    finally:
        if remote or through:
            _remove(tmp)


def _temporary(parent: str | None, name: str, folder: bool) -> str:
    """A new, empty temporary file (or folder) ``.NAME.<random>.partial`` in ``parent`` (the system's
    temporary folder when ``None``), made with the output's usual mode (0666, or 0777 for a folder,
    less the umask: the kernel applies it, so that the process's umask is never changed, which
    would give a file another thread makes meanwhile the mode 0666). Its name is new (``O_EXCL``).
    (``tempfile.mkstemp`` and a ``chmod`` after it, and reading the umask by setting it twice:
    0.11-0.42 ms of CPU a 20 KB cache entry, against 0.05-0.08 ms.)"""
    parent = parent if parent is not None else tempfile.gettempdir()
    owner = ""
    if folder:  # (a folder's says whose it is: a later run removes it if its process is gone)
        _remove_stale(parent, name)
        owner = f"{os.getpid()}@{_HOST}."
    for _ in range(100):
        tmp = os.path.join(parent, f".{name}.{owner}{secrets.token_hex(6)}.partial")
        try:
            if folder:
                os.mkdir(tmp, 0o777)
            else:
                os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666))
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(errno.EEXIST, "no new temporary name", parent)


#: This machine's name, as a temporary folder's name holds it (no dot: the name's fields are split on dots).
_HOST = socket.gethostname().replace(".", "-") or "host"


def _remove_stale(parent: str, name: str) -> None:
    """Remove the temporary folders ``.NAME.PID@HOST.<random>.partial`` in ``parent`` that a
    process of this machine made and that is gone (killed by SIGKILL or the OOM killer part way:
    nothing else removes them, 50 MB and more each). Another machine's, or a live process's, are
    left alone."""
    prefix = f".{name}."
    try:
        names = [n for n in os.listdir(parent) if n.startswith(prefix) and n.endswith(".partial")]
    except OSError:
        return
    for n in names:
        owner = n[len(prefix) :].split(".", 1)[0]
        pid, _, host = owner.partition("@")
        if host != _HOST or not pid.isdigit() or _alive(int(pid)):
            continue
        shutil.rmtree(os.path.join(parent, n), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # (EPERM: another user's, alive)
        return True
    return True


def _remove(tmp: str) -> None:
    if os.path.isdir(tmp):
        shutil.rmtree(tmp, ignore_errors=True)
    elif os.path.exists(tmp):
        os.unlink(tmp)


@contextlib.contextmanager
def made_folder(path: str) -> Iterator[None]:
    """A local output folder made (with its missing parents) for the block's writes; when the block
    fails, the folders made here are removed again if they are empty (the block's own cleanup
    removed what it wrote): a failed command leaves no empty folder behind. A folder that was
    there is left as it was."""
    path = os.path.abspath(path)
    top = path
    while not os.path.exists(os.path.dirname(top)) and os.path.dirname(top) != top:
        top = os.path.dirname(top)  # (the highest missing one)
    made = not os.path.exists(path)
    if made:
        try:
            os.makedirs(path)
        except OSError as exc:  # (one line: where and why, not errno's own words alone)
            raise OutputError(f"{path}: cannot make the output folder ({exc.strerror or exc})") from None
    try:
        yield
    except BaseException:
        if made:
            folder = path
            while True:
                try:
                    os.rmdir(folder)  # (only an empty one)
                except OSError:
                    break
                if folder == top:
                    break
                folder = os.path.dirname(folder)
        raise


def atomic_write(path: str, write: Callable[[str], None], storage_options: dict[str, Any] | None = None) -> None:
    """Call ``write(tmp)`` on a local temporary file, then move it into place at ``path`` whole
    (:func:`atomic_output`)."""
    with atomic_output(path, storage_options) as tmp:
        write(tmp)


def arrow_array(values, type: Any = None):
    """A numpy array (numbers: zero-copy; strings) as an Arrow array (``pa.array`` would import pandas, 0.4 s);
    numbers as ``type`` where given, one of their width (int64 nanoseconds as a timestamp: no
    cast, which imports pyarrow.compute, 28 ms)."""
    import numpy as np
    import pyarrow as pa

    values = np.ascontiguousarray(values)
    if values.dtype.kind in "US":
        return arrow_strings(values.tolist())
    if values.dtype == np.dtype(bool):  # (Arrow's booleans are bits, numpy's bytes: packed)
        return pa.Array.from_buffers(
            pa.bool_(), len(values), [None, pa.py_buffer(np.packbits(values, bitorder="little"))]
        )
    typ = pa.from_numpy_dtype(values.dtype) if type is None else type
    if typ.bit_width != 8 * values.dtype.itemsize:
        raise ValueError(f"arrow_array: {values.dtype} values cannot be {typ} ones")
    return pa.Array.from_buffers(typ, len(values), [None, pa.py_buffer(values)])


def valid_rows(values) -> Any:
    """Per row of an Arrow array (or chunked array), whether it is not null (bool numpy; read from
    the validity bitmap)."""
    import numpy as np
    import pyarrow as pa

    if isinstance(values, pa.ChunkedArray):
        return np.concatenate([valid_rows(c) for c in values.chunks]) if values.num_chunks else np.zeros(0, bool)
    n = len(values)
    if values.null_count == 0:
        return np.ones(n, bool)
    bits = np.frombuffer(values.buffers()[0], np.uint8)
    return np.unpackbits(bits, count=values.offset + n, bitorder="little")[values.offset :].astype(bool)


def numpy_array(values, missing=0) -> Any:
    """An Arrow array (or chunked array) of numbers or booleans as numpy, nulls as ``missing``: read
    from its buffers (Arrow's ``to_numpy`` imports pandas, 0.25 s)."""
    import numpy as np
    import pyarrow as pa

    if isinstance(values, pa.ChunkedArray):
        parts = [numpy_array(c, missing) for c in values.chunks]
        if parts:
            return np.concatenate(parts)
        return np.zeros(0, bool if pa.types.is_boolean(values.type) else values.type.to_pandas_dtype())
    n = len(values)
    if pa.types.is_boolean(values.type):
        out = (
            np.unpackbits(np.frombuffer(values.buffers()[1], np.uint8), count=values.offset + n, bitorder="little")[
                values.offset :
            ].astype(bool)
            if n
            else np.zeros(0, bool)
        )
    else:
        dtype = np.dtype(values.type.to_pandas_dtype())
        out = (
            np.frombuffer(values.buffers()[1], dtype, count=n, offset=values.offset * dtype.itemsize)
            if n
            else np.zeros(0, dtype)
        )
    return np.where(valid_rows(values), out, missing) if values.null_count else out


def arrow_strings(names, valid: Any = None) -> Any:
    """Python strings as an Arrow string array (without importing pandas), null where ``valid``
    (bools, a name each) is False."""
    import numpy as np
    import pyarrow as pa

    data = [str(n).encode() for n in names]
    offsets = np.zeros(len(data) + 1, np.int64)
    np.cumsum([len(b) for b in data], out=offsets[1:])
    if offsets[-1] >= 2**31:  # (a string array's offsets are int32)
        raise ValueError(f"arrow_strings: {offsets[-1]} bytes of strings, more than a string array holds")
    mask = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
    nulls = 0 if valid is None else int(len(valid) - np.count_nonzero(valid))
    buffers = [mask, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(data))]
    return pa.Array.from_buffers(pa.string(), len(data), buffers, null_count=nulls)


#: Table formats :func:`write_table` writes, by file extension.
TABLE_FORMATS = (".parquet", ".csv")


def table_format(path: str) -> str:
    """``.parquet`` or ``.csv``, from ``path``'s extension (else a clear error, before any work)."""
    ext = os.path.splitext(os.fspath(path).rstrip("/"))[1].lower()
    if ext not in TABLE_FORMATS:
        raise UsageError(
            f"{path}: unknown table format {ext or '(no extension)'!r}; name the file "
            f"{' or '.join('*' + e for e in TABLE_FORMATS)}"
        )
    return ext


def write_table(table: Any, path: str, storage_options: dict[str, Any] | None = None, ext: str | None = None) -> None:
    """A table (a pandas DataFrame, a dict of arrays or a pyarrow Table) written atomically as
    Parquet or CSV (``ext``, else chosen by ``path``'s extension)."""
    import pyarrow as pa

    ext = ext or table_format(path)
    if not isinstance(table, pa.Table):
        table = (
            pa.Table.from_pandas(table, preserve_index=False)
            if hasattr(table, "to_numpy")
            else pa.Table.from_arrays([arrow_array(v) for v in table.values()], names=list(table))
        )

    def write(tmp: str) -> None:
        if ext == ".parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, tmp)
        else:
            import pyarrow.csv as pc

            pc.write_csv(table, tmp)

    atomic_write(path, write, storage_options)


def public(report: dict[str, Any]) -> dict[str, Any]:
    """A report without its private keys (``_...``: what its figures and tables are drawn from)."""
    return {k: v for k, v in report.items() if not k.startswith("_")}


def finite(value: Any) -> Any:
    """``value`` (dicts, lists and tuples of numbers, strings...) with every number that is not
    finite (NaN: a mean of nothing; an infinity) as None: JSON has no such number, and
    ``NaN``/``Infinity`` in a file make strict parsers refuse it."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def json_text(value: Any, **kw: Any) -> str:
    """The one way l5dask makes JSON text: strict JSON (RFC 8259), a number that is not finite
    written ``null`` (:func:`finite`). ``kw``: :func:`json.dumps`'s layout options.

    With ``indent`` alone (a report's layout), the same text as ``json.dumps(finite(value),
    allow_nan=False, indent=indent)``, its lists of plain numbers encoded by json's C encoder:
    json's own encoder is its pure-Python one whenever it indents (a report of 1 G agents, three
    lists of 57,800 scenes: 0.033 CPU-s against 0.072, a sixth of a rerun's work from the cache)."""
    import json

    if set(kw) == {"indent"} and type(kw["indent"]) is int and kw["indent"] >= 0:
        parts: list[str] = []
        try:
            _indented(value, " " * kw["indent"], 0, parts)
        except _Generic:
            pass
        else:
            return "".join(parts)
    return json.dumps(finite(value), allow_nan=False, **kw)


class _Generic(Exception):
    """A value :func:`_indented` leaves to json's own encoder (keys that are not strings, objects
    json does not know: json says what they are)."""


_PLAIN = frozenset((int, float, bool, type(None)))


def _indented(value: Any, indent: str, level: int, parts: list[str]) -> None:
    """``json.dumps(finite(value), allow_nan=False, indent=len(indent))`` appended to ``parts``."""
    import json
    from json.encoder import encode_basestring_ascii

    if isinstance(value, str):
        parts.append(encode_basestring_ascii(value))
    elif value is None:
        parts.append("null")
    elif value is True:
        parts.append("true")
    elif value is False:
        parts.append("false")
    elif isinstance(value, int):
        parts.append(int.__repr__(value))
    elif isinstance(value, float):
        parts.append(float.__repr__(value) if math.isfinite(value) else "null")
    elif isinstance(value, dict):
        if not value:
            parts.append("{}")
            return
        inner = "\n" + indent * (level + 1)
        parts.append("{")
        sep = inner
        for k, v in value.items():
            if not isinstance(k, str):
                raise _Generic
            parts.append(sep)
            parts.append(encode_basestring_ascii(k))
            parts.append(": ")
            _indented(v, indent, level + 1, parts)
            sep = "," + inner
        parts.append("\n" + indent * level + "}")
    elif isinstance(value, (list, tuple)):
        if not value:
            parts.append("[]")
            return
        inner = "\n" + indent * (level + 1)
        parts.append("[" + inner)
        if _PLAIN.issuperset(map(type, value)):
            # (numbers, booleans and nulls only: C-encoded in one call, no ", " inside any of them;
            # a number that is not finite is null, as finite() makes it)
            text = json.dumps(value, allow_nan=True)[1:-1]
            if "N" in text or "I" in text:
                text = text.replace("-Infinity", "null").replace("Infinity", "null").replace("NaN", "null")
            parts.append(text.replace(", ", "," + inner))
        else:
            for i, v in enumerate(value):
                if i:
                    parts.append("," + inner)
                _indented(v, indent, level + 1, parts)
        parts.append("\n" + indent * level + "]")
    else:
        raise _Generic


def write_json(report: dict[str, Any], path: str, storage_options: dict | None = None) -> None:
    """A report (its public keys) as strict JSON (:func:`json_text`), atomically."""

    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(json_text(public(report), indent=1))

    atomic_write(path, write, storage_options)
