"""The one way l5dask writes an output file: checked before any work, written atomically.

A run that fails, for any reason (bad data, a lost cluster, a full disk), leaves the previous
file as it was and no partial file that looks complete.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

from .errors import L5DaskError


def check_writable(path: str) -> str:
    """Fail now, in one line, if ``path`` cannot be written (before any computation); return it absolute."""
    path = os.path.abspath(os.fspath(path))
    folder = os.path.dirname(path)
    if os.path.isdir(path):
        raise L5DaskError(f"{path}: is a folder; give a file name")
    if not os.path.isdir(folder):
        what = "is not a folder" if os.path.exists(folder) else "does not exist"
        raise L5DaskError(f"{path}: the folder {folder} {what}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise L5DaskError(f"{path}: the folder {folder} is not writable")
    return path


def atomic_write(path: str, write: Callable[[str], None]) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it into place.

    An error while writing (a full disk...) removes the temporary file, keeps any previous
    ``path``, and is raised as an :class:`~l5dask.errors.L5DaskError` that names ``path``.
    """
    path = check_writable(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".partial", dir=os.path.dirname(path))
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, L5DaskError):
            raise L5DaskError(f"{path}: writing failed, the previous file (if any) is kept: "
                              f"{exc.strerror or exc}") from exc
        raise
