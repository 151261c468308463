"""The identities of a local folder's files (``l5dask/core/_stat.pyx``, ``Store.identities``): what
``os.scandir`` and ``DirEntry.stat`` in Python made, for every kind of entry a folder can hold."""

from __future__ import annotations

import os
import sys

import pytest

from l5dask.core import _stat
from l5dask.core.store import Store
from l5dask.errors import ChunkError, StoreError

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
from stat_benchmark import python_identities as scandir_identities  # noqa: E402  (the definition)


@pytest.fixture
def folder(tmp_path):
    d = tmp_path / "chunks"
    d.mkdir()
    # more files than one thread's run (256), in an order unlike their names' and their inodes'
    for i in reversed(range(700)):
        (d / str(i)).write_bytes(bytes(i % 37))
    (d / ".zarray").write_text("{}")
    (d / "empty").write_bytes(b"")
    (d / "sub").mkdir()  # a folder: not a file
    (d / "sub" / "inner").write_bytes(b"x")  # (not listed: not directly in the folder)
    os.symlink(d / "3", d / "link-to-file")  # a link to a file: the file's stat
    os.symlink(d / "sub", d / "link-to-folder")  # not a file
    os.symlink(d / "nowhere", d / "broken-link")  # leads nowhere: not a file
    os.mkfifo(d / "fifo")  # not a regular file
    name = os.fsdecode(b"caf\xe9-\xff")  # a name that is not UTF-8 (surrogate-escaped)
    with open(os.path.join(os.fsencode(str(d)), b"caf\xe9-\xff"), "wb") as f:
        f.write(b"12345")
    # times of every sign and nanoseconds, and the far future (past int64 nanoseconds' range at 2262)
    os.utime(d / "1", ns=(0, -1_234_567_891))
    os.utime(d / "2", ns=(0, 1_700_000_000_123_456_789))
    os.utime(d / "4", ns=(0, 0))
    os.utime(d / "5", ns=(0, 9_999_999_999 * 10**9 + 7))
    return str(d), name


@pytest.mark.parametrize("threads", [1, 2, 4, 64])
def test_the_compiled_listing_is_the_python_one(folder, threads):
    path, odd = folder
    got = _stat.identities(path, threads)
    want = scandir_identities(path)
    assert got == want
    assert {"link-to-file", odd, ".zarray", "empty", "5"} <= set(got)
    assert not {"sub", "link-to-folder", "broken-link", "fifo", "inner"} & set(got)
    st = os.stat(os.path.join(path, "1"))
    assert got["1"] == f"stat:1:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}" and st.st_mtime_ns == -1_234_567_891
    assert got["5"].split(":")[2] == str(9_999_999_999 * 10**9 + 7)
    assert got["link-to-file"] == want["3"] and got["link-to-file"].startswith("stat:3:")


def test_an_empty_folder_and_a_bytes_path(tmp_path):
    assert _stat.identities(str(tmp_path)) == {}
    (tmp_path / "a").write_bytes(b"ab")
    assert _stat.identities(os.fsencode(str(tmp_path))) == scandir_identities(str(tmp_path))


def test_the_folders_errors_are_os_scandirs(tmp_path):
    (tmp_path / "file").write_bytes(b"x")
    for name, kind in (("missing", FileNotFoundError), ("file", NotADirectoryError)):
        with pytest.raises(kind) as compiled:
            _stat.identities(str(tmp_path / name))
        with pytest.raises(kind) as python:
            os.scandir(str(tmp_path / name))
        assert str(compiled.value) == str(python.value)
    # and through the store: the same one-line errors as the Python listing gave
    store = Store(str(tmp_path))
    with pytest.raises(ChunkError) as missing:
        store.identities("missing")
    assert str(missing.value) == f"{tmp_path}: missing: object 'missing' is missing"
    with pytest.raises(StoreError) as not_a_folder:
        store.identities("file")
    assert str(not_a_folder.value) == (
        f"{tmp_path}: reading 'file' failed after 1 attempt(s): [Errno 20] Not a directory: '{tmp_path}/file'"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any folder")
def test_a_folder_that_cannot_be_read(tmp_path):
    d = tmp_path / "closed"
    d.mkdir()
    d.chmod(0)
    try:
        with pytest.raises(PermissionError):
            _stat.identities(str(d))
    finally:
        d.chmod(0o755)


def test_the_store_gives_them(folder):
    path, _ = folder
    parent, name = os.path.split(path)
    assert Store(parent).identities(name) == scandir_identities(path)
