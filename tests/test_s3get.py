"""GETs of S3 objects by presigned URL (``l5dask.core.s3get``): the same bytes as the files, every
answer checked, and s3fs wherever the direct way cannot vouch for an answer."""

from __future__ import annotations

import os

import dask
import numpy as np
import pytest

from l5dask.core import s3get
from l5dask.core.store import Store
from l5dask.errors import ChunkError
from l5dask.prediction.report import compute_report, public

from .test_faults import ERROR_503, FlakyProxy


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    """Each test starts with no bucket proven or turned away, and no proxy variables."""
    for name in list(os.environ):
        if name.lower().endswith("_proxy"):
            monkeypatch.delenv(name)
    s3get.forget()
    yield
    s3get.forget()


@pytest.fixture(scope="module")
def bucket(s3_open, small_ds, tmp_path_factory):
    """``small_ds`` and a 5 MB object of random bytes in s3://l5-direct, on moto without IAM."""
    s3_open.make_bucket("l5-direct")
    fs = s3_open.s3fs()
    fs.put(small_ds, "l5-direct/small.zarr", recursive=True)
    blob = tmp_path_factory.mktemp("blob") / "blob.bin"
    blob.write_bytes(np.random.default_rng(3).integers(0, 256, 5_000_000, dtype=np.uint8).tobytes())
    fs.put(str(blob), "l5-direct/blob.bin")
    return str(blob)


def _options(server, endpoint=None):
    opts = server.storage_options()
    if endpoint:
        opts["client_kwargs"] = dict(opts["client_kwargs"], endpoint_url=endpoint)
    return opts


def _report(path, **kw):
    return {k: v for k, v in public(compute_report(path, **kw)).items() if k != "dataset"}


def test_report_through_direct_gets_is_exact(s3_open, bucket, small_ds):
    proxy = FlakyProxy(s3_open.endpoint)
    try:
        got = _report("s3://l5-direct/small.zarr", storage_options=_options(s3_open, proxy.endpoint))
    finally:
        proxy.close()
    assert got == _report(small_ds)
    # the chunks came by presigned URL, SigV4 (botocore would presign SigV2 in us-east-1)...
    assert proxy.presigned >= 10 and proxy.presigned_v4 == proxy.presigned
    assert (
        "l5-direct" in s3get.buckets()["direct"] and "l5-direct" not in s3get.buckets()["s3fs"]
    )  # ...and none through s3fs


def test_ranges_equal_the_file(s3_open, bucket):
    """Ranges at the edges (first byte, last byte, past the end, open-ended) and long ranges cut
    into parts fetched at once: the file's own bytes."""
    want = open(bucket, "rb").read()
    n = len(want)
    store = Store("s3://l5-direct", _options(s3_open))
    rng = np.random.default_rng(11)
    spans = [(0, 1), (n - 1, n), (n - 10, n + 500), (123, None), (None, None), (0, n), (4_000_000, None)]
    spans += [tuple(sorted(map(int, rng.integers(0, n, 2)))) for _ in range(12)]
    with dask.config.set({"l5dask.part-bytes": 300_000}):  # (the long ones come as parts)
        for start, end in spans:
            if start is not None and end is not None and start >= end:
                continue
            got = store.get("blob.bin", start=start, end=end)
            assert got == want[start:end], (start, end)
        got = list(store.iter_ranges([("blob.bin", a, b) for a, b in spans if a is None or b is None or a < b]))
    assert got == [want[a:b] for a, b in spans if a is None or b is None or a < b]
    assert "l5-direct" in s3get.buckets()["direct"] and "l5-direct" not in s3get.buckets()["s3fs"]


def test_missing_object_is_named(s3_open, bucket):
    store = Store("s3://l5-direct", _options(s3_open))
    store.get("blob.bin", start=0, end=10)  # (the bucket has answered: its 404 is the store's)
    with pytest.raises(ChunkError, match=r"object 'small.zarr/agents/999' is missing"):
        store.get("small.zarr/agents/999", what="agents chunk 999")
    assert "l5-direct" not in s3get.buckets()["s3fs"]


def test_503s_are_retried_on_the_direct_way(s3_open, bucket, small_ds):
    proxy = FlakyProxy(s3_open.endpoint)
    proxy.every, proxy.drops, proxy.body = 3, True, ERROR_503
    try:
        Store("s3://l5-direct", _options(s3_open, proxy.endpoint)).get("blob.bin", start=0, end=4)
        got = _report("s3://l5-direct/small.zarr", storage_options=_options(s3_open, proxy.endpoint))
    finally:
        proxy.close()
    assert proxy.failures >= 5 and proxy.presigned >= 10
    assert got == _report(small_ds)
    assert "l5-direct" not in s3get.buckets()["s3fs"]


@pytest.mark.parametrize("tamper", ["shifted", "whole", "short"])
def test_answers_not_asked_for_go_through_s3fs(s3_open, bucket, tamper):
    """A range that comes back as other bytes (a shifted range, the whole object, fewer bytes) is
    not taken: the GET is made again through s3fs, and the bucket stays with s3fs."""
    want = open(bucket, "rb").read()

    def change(method, path, headers):
        if "Signature=" not in path or "Range" not in headers:
            return headers
        a, b = map(int, headers["Range"].removeprefix("bytes=").split("-"))
        if tamper == "shifted":
            headers["Range"] = f"bytes={a + 1}-{b + 1}"
        elif tamper == "whole":
            del headers["Range"]
        else:
            headers["Range"] = f"bytes={a}-{b - 1}"
        return headers

    proxy = FlakyProxy(s3_open.endpoint)
    proxy.tamper = change
    try:
        got = Store("s3://l5-direct", _options(s3_open, proxy.endpoint)).get("blob.bin", start=1000, end=3000)
    finally:
        proxy.close()
    assert proxy.presigned == 1
    assert got == want[1000:3000]
    assert "l5-direct" in s3get.buckets()["s3fs"]


def test_an_endpoint_without_presigned_urls_is_read_through_s3fs(s3, s3_small, small_ds):
    """moto with IAM answers presigned URLs with a 500: the first GET goes through s3fs again, and
    so does every later one; the report is exact."""
    assert _report(s3_small, storage_options=s3.storage_options()) == _report(small_ds)
    assert "l5-test" in s3get.buckets()["s3fs"] and "l5-test" not in s3get.buckets()["direct"]


def test_switched_off_or_per_request_options_use_s3fs(s3_open, bucket):
    want = open(bucket, "rb").read()
    proxy = FlakyProxy(s3_open.endpoint)
    try:
        with dask.config.set({"l5dask.s3-direct-get": False}):
            got = Store("s3://l5-direct", _options(s3_open, proxy.endpoint)).get("blob.bin", start=5, end=50)
        assert got == want[5:50] and proxy.presigned == 0
        opts = dict(_options(s3_open, proxy.endpoint), requester_pays=True)
        got = Store("s3://l5-direct", opts).get("blob.bin", start=5, end=50)
        assert got == want[5:50] and proxy.presigned == 0
    finally:
        proxy.close()
    assert not s3get.buckets()["direct"]


def test_a_bucket_is_known_by_its_endpoint_too(s3, s3_open, tmp_path):
    """The same bucket name on two endpoints: proven on the one that takes presigned URLs, it is
    still new on the one that does not (moto with IAM), which goes through s3fs."""
    blob = tmp_path / "twin.bin"
    blob.write_bytes(b"0123456789" * 100)
    for server in (s3, s3_open):
        server.make_bucket("l5-twin")
        server.s3fs().put(str(blob), "l5-twin/twin.bin")
    assert Store("s3://l5-twin", _options(s3_open)).get("twin.bin", start=3, end=30) == blob.read_bytes()[3:30]
    assert s3get.buckets()["direct"] == {"l5-twin"}
    assert Store("s3://l5-twin", _options(s3)).get("twin.bin", start=5, end=50) == blob.read_bytes()[5:50]
    assert s3get.buckets()["s3fs"] == {"l5-twin"}
