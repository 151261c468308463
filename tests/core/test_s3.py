"""Reading and writing through s3fs against a real S3 HTTP endpoint (moto server on 127.0.0.1)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import xarray as xr

import l5dask
from l5dask.errors import NotADatasetError, StoreError
from tests.conftest import read_all


def test_open_s3_matches_local(s3, s3_small, small_ds):
    ds = l5dask.open_dataset(s3_small, storage_options=s3.storage_options())
    ref = read_all(small_ds)
    for name in ref:
        np.testing.assert_array_equal(ds[name].to_dask().compute(), ref[name])


def test_aggregate_and_dataframe_from_s3_equal_local(s3, s3_small, small_ds):
    """The passes that fetch chunks undecoded and gather columns from their bytes, through s3fs."""
    remote = l5dask.open_dataset(s3_small, storage_options=s3.storage_options())
    local = l5dask.open_dataset(small_ds)
    kw = dict(
        by=["host", "label"], values={"speed": ["mean", "max"], "extent_length": ["q50"]}, where="distance_to_ego < 40"
    )
    got, want = l5dask.aggregate(remote, "agents", **kw), l5dask.aggregate(local, "agents", **kw)
    assert len(got) == len(want) > 0
    for c in want.columns:
        np.testing.assert_array_equal(got[c].to_numpy(), want[c].to_numpy(), err_msg=c)
    cols = dict(columns=["label", "speed", "centroid_x"], joins=["scene_index"])
    a = remote.to_dask_dataframe("agents", **cols).compute()
    b = local.to_dask_dataframe("agents", **cols).compute()
    for c in b.columns:
        np.testing.assert_array_equal(np.asarray(a[c]), np.asarray(b[c]), err_msg=c)


def test_a_pass_over_s3_runs_more_tasks_at_once_with_the_same_tasks_and_bits(s3, s3_small, small_ds):
    """On local threads a pass whose chunks are requests runs REMOTE_TASKS_PER_CORE tasks a core at
    once (each waits for its requests most of the time); its tasks, and so the report's bits, are
    those of the same dataset on a local disk."""
    import threading

    import dask

    from l5dask.core.engine import Job, Pass, Reduction
    from l5dask.core.outputs import public
    from l5dask.prediction.report import compute_report

    def threads_of(ds):
        seen = set()

        def chunk(data, start, parent):
            seen.add(threading.get_ident())
            return [(start, len(data))]

        red = Reduction(f"threads-{id(seen)}", chunk, lambda a, b: a + b, list)
        (starts,) = Job(chunks_per_task=1).compute([Pass(ds["agents"], red)])
        computed = set(seen)
        seen.clear()  # persisted (as the report's frames pass is): as many threads
        (done,) = Job(chunks_per_task=1).persist(Pass(ds["agents"], red))
        assert Job().compute([done]) == (starts,)
        return computed, seen, starts

    remote = l5dask.open_dataset(s3_small, storage_options=s3.storage_options())
    local = l5dask.open_dataset(small_ds)
    assert remote["agents"].remote and not local["agents"].remote
    cores = os.cpu_count() or 1
    with dask.config.set({"l5dask.remote-tasks-per-core": 3}):
        (r_threads, r_persist, r_starts), (l_threads, l_persist, l_starts) = threads_of(remote), threads_of(local)
    assert r_starts == l_starts
    assert len(l_threads) <= cores < len(r_threads) <= 3 * cores
    assert len(l_persist) <= cores < len(r_persist) <= 3 * cores
    a = compute_report(s3_small, storage_options=s3.storage_options())
    b = compute_report(small_ds)
    assert {k: v for k, v in public(a).items() if k != "dataset"} == {
        k: v for k, v in public(b).items() if k != "dataset"
    }


def test_xarray_engine_on_s3(s3, s3_small, small_ds):
    x = xr.open_dataset(s3_small, engine="l5kit", group="frames", storage_options=s3.storage_options())
    np.testing.assert_array_equal(x.timestamp.values, read_all(small_ds)["frames"]["timestamp"])
    tree = xr.open_datatree(s3_small, engine="l5kit", storage_options=s3.storage_options())
    assert set(tree.children) == {"scenes", "frames", "agents", "tl_faces"}


def test_credentials_and_endpoint_from_aws_environment(s3, s3_small, small_ds):
    env = s3.environment()
    r = subprocess.run([sys.executable, "-m", "l5dask.cli", "info", s3_small], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert f"{len(read_all(small_ds)['agents']):,} rows" in r.stdout


def test_wrong_credentials(s3, s3_small):
    with pytest.raises(StoreError, match="access denied|InvalidAccessKeyId|Forbidden"):
        l5dask.open_dataset(s3_small, storage_options=s3.storage_options(key="AKIAWRONG", secret="wrong"))


def test_missing_bucket(s3):
    with pytest.raises(NotADatasetError, match="no such file, folder or bucket"):
        l5dask.open_dataset("s3://no-such-bucket/x.zarr", storage_options=s3.storage_options())


def test_cli_wrong_credentials_one_line(s3, s3_small):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "l5dask.cli",
            "info",
            s3_small,
            "-s",
            f"client_kwargs.endpoint_url={s3.endpoint}",
            "-s",
            "key=AKIAWRONG",
            "-s",
            "secret=x",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_synth_and_write_to_s3(s3, tmp_path):
    opts = s3.storage_options()
    s3.make_bucket("l5-out")
    l5dask.synthesize("s3://l5-out/gen.zarr", num_scenes=2, seed=5, storage_options=opts)
    local = tmp_path / "gen.zarr"
    l5dask.synthesize(local, num_scenes=2, seed=5)
    ds = l5dask.open_dataset("s3://l5-out/gen.zarr", storage_options=opts)
    ref = read_all(str(local))
    for name in ref:
        np.testing.assert_array_equal(ds[name].to_dask().compute(), ref[name])
    # and the dask writer to S3, from the S3 copy
    l5dask.write_dataset("s3://l5-out/copy.zarr", {n: ds[n].to_dask() for n in ds.arrays}, storage_options=opts)
    copy = l5dask.open_dataset("s3://l5-out/copy.zarr", storage_options=opts)
    np.testing.assert_array_equal(copy["agents"].to_dask().compute(), ref["agents"])


def _s3_options(s3) -> list[str]:
    return [
        "-s",
        f"key={s3.key}",
        "-s",
        f"secret={s3.secret}",
        "-s",
        f"client_kwargs.endpoint_url={s3.endpoint}",
        "-s",
        "client_kwargs.region_name=us-east-1",
    ]


def test_outputs_to_s3_are_whole_objects(s3, s3_small, small_ds, tmp_path):
    """A batch job writes its report and scene table straight to a bucket (one PUT each)."""
    import json

    import pyarrow.parquet as pq

    s3.make_bucket("l5-out")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "l5dask.cli",
            "stats",
            s3_small,
            "--quiet",
            "--output",
            "s3://l5-out/nightly/r.json",
            "--scenes-table",
            "s3://l5-out/nightly/s.parquet",
            *_s3_options(s3),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    local = tmp_path / "r.json"
    r = subprocess.run(
        [sys.executable, "-m", "l5dask.cli", "stats", small_ds, "--quiet", "--output", str(local)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    fs = s3.s3fs()
    got, want = json.loads(fs.cat("l5-out/nightly/r.json")), json.loads(local.read_text())
    assert {k: v for k, v in got.items() if k != "dataset"} == {k: v for k, v in want.items() if k != "dataset"}
    with fs.open("l5-out/nightly/s.parquet", "rb") as f:
        assert pq.read_table(f).num_rows == want["counts"]["scenes"]
    assert [p for p in fs.ls("l5-out/nightly") if "partial" in p] == []


def test_output_bucket_that_does_not_exist_fails_before_any_read(s3, small_ds, tmp_path):
    import shutil

    dest = tmp_path / "unreadable.zarr"
    shutil.copytree(small_ds, dest)
    for chunk in dest.glob("*/[0-9]*"):
        chunk.write_bytes(b"not blosc")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "l5dask.cli",
            "stats",
            str(dest),
            "--quiet",
            "--output",
            "s3://no-such-bucket/r.json",
            *_s3_options(s3),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "the bucket 'no-such-bucket' does not exist" in r.stderr and "chunk" not in r.stderr


def test_a_long_range_of_an_object_is_fetched_as_parts_at_once(s3, monkeypatch):
    """A range read from an object store longer than l5dask.part-bytes goes as its parts, fetched
    concurrently and joined (each waits S3's first-byte latency once for all): the same bytes."""
    import dask

    from l5dask.core import objects
    from l5dask.core.store import file_store

    s3.make_bucket("l5-parts")
    data = np.random.default_rng(0).integers(0, 256, 20_000, dtype=np.uint8).tobytes()
    s3.s3fs().pipe("l5-parts/blob.bin", data)
    store, key = file_store("s3://l5-parts/blob.bin", s3.storage_options())
    calls = []
    cat = objects.cat

    async def counting(fs, path, start=None, end=None):
        calls.append((start, end))
        return await cat(fs, path, start, end)

    monkeypatch.setattr(objects, "cat", counting)  # (each call: one GET)
    with dask.config.set({"l5dask.part-bytes": 1000}):
        assert store.get(key, start=100, end=5600) == data[100:5600]
        assert sorted(calls) == [(100 + 1000 * i, min(5600, 1100 + 1000 * i)) for i in range(6)]
        calls.clear()
        assert store.get(key, start=100, end=5300) == data[100:5300]  # a short last part joins the one before
        assert sorted(calls)[-1] == (4100, 5300) and len(calls) == 5
        calls.clear()
        assert store.get(key, start=0, end=1500) == data[:1500]  # up to 1.5 parts: one request
        assert store.get(key) == data and store.get(key, start=-700) == data[-700:]
        assert len(calls) == 3


def test_iter_ranges_same_bytes_from_s3_and_a_disk_asked_for_at_once(s3, tmp_path, monkeypatch):
    """Store.iter_ranges yields each (key, start, end) range in order, from a disk or an object
    store alike; on the object store the first ``depth`` are asked for when it is called, before
    the caller takes any (a task starts its reads of two files, then waits)."""
    import threading

    from l5dask.core import store as st

    rng = np.random.default_rng(1)
    blobs = {f"b{i}.bin": rng.integers(0, 256, 3000 + i, dtype=np.uint8).tobytes() for i in range(3)}
    s3.make_bucket("l5-ranges")
    fs = s3.s3fs()
    for name, data in blobs.items():
        (tmp_path / name).write_bytes(data)
        fs.pipe(f"l5-ranges/{name}", data)
    ranges = [("b0.bin", 10, 900), ("b1.bin", None, None), ("b2.bin", -100, None), ("b0.bin", 2000, None)]
    want = [blobs["b0.bin"][10:900], blobs["b1.bin"], blobs["b2.bin"][-100:], blobs["b0.bin"][2000:]]
    assert list(st.Store(str(tmp_path)).iter_ranges(ranges)) == want
    remote = st.Store("s3://l5-ranges", s3.storage_options())
    assert list(remote.iter_ranges(ranges, depth=2)) == want
    asked = []
    started = threading.Event()
    cat = st._cat_parts

    async def counting(fs, path, start, end):
        asked.append((path.rsplit("/", 1)[-1], start, end))
        if len(asked) == 2:
            started.set()
        return await cat(fs, path, start, end)

    monkeypatch.setattr(st, "_cat_parts", counting)
    it = remote.iter_ranges(ranges, depth=2)
    assert started.wait(10) and sorted(asked) == sorted(ranges[:2])  # before any was taken
    assert list(it) == want and sorted(asked) == sorted(ranges)


def test_a_reader_waits_in_the_hook_only_for_reads_not_yet_come(s3, tmp_path, monkeypatch):
    """Within ``while_waiting(hook)``, each wait for an object store's read that has not come is made
    inside ``hook()`` (a worker's task gives its thread back there), a read already come is taken
    at once, and a local disk's reads never enter it; outside, nothing does."""
    import asyncio
    import contextlib
    import threading
    import time

    from l5dask.core import store as st

    s3.make_bucket("l5-waits")
    fs = s3.s3fs()
    blobs = {f"b{i}.bin": bytes([i]) * 1000 for i in range(4)}
    for name, data in blobs.items():
        (tmp_path / name).write_bytes(data)
        fs.pipe(f"l5-waits/{name}", data)
    entered: list[int] = []

    @contextlib.contextmanager
    def hook():
        entered.append(1)
        yield

    cat, came = st._cat_parts, threading.Semaphore(0)

    async def later(fs, path, start, end):  # (b1 comes 1 s late, the others at once)
        if path.endswith("b1.bin"):
            await asyncio.sleep(1.0)
        got = await cat(fs, path, start, end)
        came.release()
        return got

    monkeypatch.setattr(st, "_cat_parts", later)
    remote = st.Store("s3://l5-waits", s3.storage_options())
    keys = sorted(blobs)
    with st.while_waiting(hook):
        it = remote.iter_many(keys, depth=4)
        assert all(came.acquire(timeout=10) for _ in range(3))  # b0, b2 and b3 have come
        time.sleep(0.05)  # (their futures are done a moment after)
        assert list(it) == [blobs[k] for k in keys]
        assert len(entered) == 1  # b1's wait
        entered.clear()
        assert list(st.Store(str(tmp_path)).iter_many(keys)) == [blobs[k] for k in keys]
        assert entered == []
    assert list(remote.iter_many(keys)) == [blobs[k] for k in keys] and entered == []


def test_a_task_waits_out_of_its_workers_threads_only_on_a_worker(dask_cluster):
    """``secede_while_waiting`` gives a hook on a dask.distributed worker's task (the task then
    waits out of the worker's threads: ``distributed.secede``), none elsewhere or when
    ``l5dask.secede-on-wait`` is false on the worker."""
    from distributed import Client

    from l5dask.core.policy import secede_while_waiting

    def inside(off: bool):
        import dask

        with dask.config.set({"l5dask.secede-on-wait": not off}):
            hook = secede_while_waiting(4)
            if hook is None:
                return None
            from distributed.threadpoolexecutor import thread_state

            # (a thread out of the worker's pool does not take its next task: proceed False)
            before = thread_state.proceed
            with hook():
                during = thread_state.proceed
            return before, during, thread_state.proceed

    assert secede_while_waiting(4) is None  # (this process: no worker)
    with Client(dask_cluster.address, set_as_default=False) as client:
        assert client.submit(inside, False, pure=False).result() == (True, False, True)
        assert client.submit(inside, True, pure=False).result() is None


def _waits_given_back() -> bool:
    """In a task: whether its waits for a bucket's bytes are made out of the worker's threads."""
    from l5dask.core import store

    return store._WAIT_HOOK.get() is not None


def test_the_tasks_of_a_map_over_a_bucket_give_their_thread_back_while_they_wait(dask_cluster):
    """``Job.map`` and ``Job.map_reduce`` tasks that read an object store (``evaluate``'s row scan
    and metrics, the perception tables, lidar, detection) wait for its bytes out of the worker's
    threads, as a pass's tasks do; those that do not, and any on local threads, wait in place."""
    from distributed import Client

    from l5dask.core.engine import Job, Reduction

    both = Reduction("both", chunk=None, combine=lambda a, b: a and b, identity=lambda: True)  # type: ignore[arg-type]
    with Client(dask_cluster.address, set_as_default=False) as client:
        job = Job(scheduler=client)
        assert job.map(_waits_given_back, [()] * 3, name="l5-test-waits", remote=True) == [True] * 3
        assert job.map(_waits_given_back, [()] * 3, name="l5-test-waits", remote=False) == [False] * 3
        assert job.map_reduce(_waits_given_back, [()] * 3, both, name="l5-test-waits", remote=True) is True
    assert Job().map(_waits_given_back, [()] * 2, name="l5-test-waits", remote=True) == [False] * 2


def test_overwrite_on_a_bucket_replaces_only_what_l5dask_wrote(s3, s3_small, small_ds):
    """``--overwrite`` of a prefix that holds other objects (a team's prefix, the bucket's root)
    is refused in one line and removes nothing; a prefix holding a dataset or an export is replaced."""
    from click.testing import CliRunner

    from l5dask.cli import main

    opts = s3.storage_options()
    s3.make_bucket("l5-keep")
    fs = s3.s3fs()
    fs.pipe("l5-keep/team/notes.txt", b"keep me")
    fs.pipe("l5-keep/team/old/part.bin", b"keep me too")
    kept = sorted(fs.find("l5-keep"))
    counts = l5dask.open_dataset(small_ds).counts()
    for target in ("s3://l5-keep/team", "s3://l5-keep"):
        for args, message in (
            (["subset", small_ds, "-o", target, "--ranges", "0:2", "--overwrite"], "which is not a dataset's"),
            (["export", small_ds, "-o", target, "--overwrite"], "which is not an export's"),
        ):
            r = CliRunner().invoke(main, [*args, "-q", *_s3_options(s3)])
            lines = [ln for ln in r.output.strip().splitlines() if ln]
            assert r.exit_code != 0 and len(lines) == 1 and message in lines[0], (args, r.output)
            assert "notes.txt" in lines[0] or "team" in lines[0], lines
            fs.invalidate_cache()
            assert sorted(fs.find("l5-keep")) == kept and fs.cat("l5-keep/team/notes.txt") == b"keep me"
    with pytest.raises(l5dask.errors.OutputError, match="which is not a dataset's"):
        l5dask.synthesize("s3://l5-keep/team", num_scenes=2, overwrite=True, storage_options=opts)
    # a dataset and an export on the bucket are replaced with --overwrite (and refused without it)
    for args, kind in (
        (["subset", small_ds, "-o", "s3://l5-keep/ds.zarr", "--ranges", "0:2"], "a dataset already exists"),
        (["export", small_ds, "-o", "s3://l5-keep/ex"], "already exists"),
    ):
        for extra, ok in (([], True), ([], False), (["--overwrite"], True)):
            r = CliRunner().invoke(main, [*args, "-q", *extra, *_s3_options(s3)])
            assert (r.exit_code == 0) if ok else (r.exit_code != 0 and kind in r.output), r.output
            fs.invalidate_cache()
    assert l5dask.open_dataset("s3://l5-keep/ds.zarr", storage_options=opts).counts()["scenes"] == 2
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls("l5-keep/ex")) == [
        "agents",
        "frames",
        "scenes",
        "traffic_light_faces",
    ]
    # an object of a user's one prefix down (ds.zarr/agents/NOTES.md) is never deleted either
    for key, args in (
        ("ds.zarr/agents/NOTES.md", ["subset", small_ds, "-o", "s3://l5-keep/ds.zarr", "--ranges", "0:1"]),
        ("ex/frames/old/mine.txt", ["export", small_ds, "-o", "s3://l5-keep/ex"]),
    ):
        fs.pipe(f"l5-keep/{key}", b"mine")
        fs.invalidate_cache()
        before = sorted(fs.find("l5-keep"))
        for extra in ([], ["--overwrite"]):
            r = CliRunner().invoke(main, [*args, "-q", *extra, *_s3_options(s3)])
            lines = [ln for ln in r.output.strip().splitlines() if ln]
            assert r.exit_code == 2 and len(lines) == 1, r.output
            assert f"holds {key.split('/', 1)[1]}, which is not" in lines[0], lines
            fs.invalidate_cache()
            assert sorted(fs.find("l5-keep")) == before and fs.cat(f"l5-keep/{key}") == b"mine"
    fs.invalidate_cache()
    assert {p for p in fs.find("l5-keep") if p.startswith("l5-keep/team")} == set(kept)
    assert counts == l5dask.open_dataset(small_ds).counts()
