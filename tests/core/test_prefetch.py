"""The read-ahead of a command given a cache (``l5dask.core.prefetch``): the identities it makes
of a dataset's chunk files are those ``Store.identities`` makes, taken once, and never once the
folder changed."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from l5dask.core import _stat, prefetch
from l5dask.core.store import Store


@pytest.fixture
def fresh(monkeypatch):
    """The module as a new process finds it."""
    monkeypatch.setattr(prefetch, "_FOLDERS", {})
    monkeypatch.setattr(prefetch, "_REGISTERED", threading.Event())
    monkeypatch.setattr(prefetch, "_STARTED", False)
    return prefetch


ARRAYS = ("agents", "frames", "scenes", "traffic_light_faces")


def test_nothing_is_read_ahead_without_a_local_cache(fresh, small_ds):
    assert fresh.start(["stats", small_ds]) is None
    assert fresh.start(["stats", small_ds, "--cache", "s3://bucket/cache"]) is None
    assert fresh.take(os.path.join(small_ds, "agents")) is None  # (none started: listed by the caller)


@pytest.mark.parametrize("flag", ["--cache", "--cache="])
def test_the_identities_read_ahead_are_the_listing_s_and_taken_once(fresh, small_ds, tmp_path, flag):
    cache = str(tmp_path / "cache")
    args = ["stats", small_ds, "-q", flag, cache] if flag == "--cache" else ["stats", small_ds, f"--cache={cache}"]
    thread = fresh.start(args)
    assert thread is not None
    thread.join(60)
    for name in ARRAYS:
        folder = os.path.join(small_ds, name)
        got = fresh.take(folder)
        assert got is not None and got == _stat.identities(folder, 1)
        assert fresh.take(folder) is None  # (once: a second listing is made again)


def test_a_folder_changed_after_the_read_ahead_is_listed_again(fresh, small_ds, tmp_path):
    data = tmp_path / "d.zarr"
    subprocess.run(["cp", "-a", small_ds, str(data)], check=True)
    thread = fresh.start(["stats", str(data), "--cache", str(tmp_path / "cache")])
    assert thread is not None
    thread.join(60)
    time.sleep(0.05)  # (past the file system's clock tick)
    folder = str(data / "agents")
    first = sorted(n for n in os.listdir(folder) if not n.startswith("."))[0]
    with open(os.path.join(folder, ".new"), "wb") as f:  # a chunk written anew, as zarr writes one: a rename
        f.write(b"\0" * 7)
    os.replace(os.path.join(folder, ".new"), os.path.join(folder, first))
    assert fresh.take(folder) is None
    # and the store lists it again: the new chunk's identity, not the one read ahead
    assert Store(str(data)).identities("agents")[first].split(":")[1] == "7"
    assert fresh.take(str(data / "frames")) == _stat.identities(str(data / "frames"), 1)


def test_a_rerun_of_the_command_line_is_the_uncached_report(small_ds, tmp_path):
    """End to end, in processes that read ahead: the rerun reads every task from the cache, and
    its report is the uncached one, byte for byte."""
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "l5dask.cli", "stats", small_ds, *a], capture_output=True, text=True
    )
    cache = str(tmp_path / "cache")
    for name, extra in (("plain", ["-q"]), ("cold", ["-q", "--cache", cache]), ("warm", ["--cache", cache])):
        got = run("-o", str(tmp_path / f"{name}.json"), *extra)
        assert got.returncode == 0, got.stderr
    hits = [line.split() for line in got.stderr.splitlines() if "tasks read from the cache" in line]
    assert len(hits) == 1 and hits[0][2] == hits[0][4], got.stderr  # ("l5dask: cache: N of N tasks ...")
    assert (tmp_path / "plain.json").read_bytes() == (tmp_path / "cold.json").read_bytes()
    assert (tmp_path / "plain.json").read_bytes() == (tmp_path / "warm.json").read_bytes()
