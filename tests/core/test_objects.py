"""Reads of S3 objects through obstore (``l5dask.core.objects``): the same bytes as the files, every
answer checked, the user's storage options mapped onto obstore's, and s3fs where obstore has no
equivalent of an option."""

from __future__ import annotations

import dask
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from l5dask.core import objects
from l5dask.core.store import Store
from l5dask.errors import ChunkError, StoreError
from l5dask.prediction.report import compute_report, public

from .test_faults import ERROR_503, FlakyProxy


@pytest.fixture(scope="module")
def bucket(s3, small_ds, tmp_path_factory):
    """``small_ds`` and a 5 MB object of random bytes in s3://l5-direct (moto with IAM: obstore
    signs each request, as botocore does)."""
    s3.make_bucket("l5-direct")
    fs = s3.s3fs()
    fs.put(small_ds, "l5-direct/small.zarr", recursive=True)
    blob = tmp_path_factory.mktemp("blob") / "blob.bin"
    blob.write_bytes(np.random.default_rng(3).integers(0, 256, 5_000_000, dtype=np.uint8).tobytes())
    fs.put(str(blob), "l5-direct/blob.bin")
    return str(blob)


class Agents:
    """The user agents of the GETs through a proxy (obstore's say ``object_store``)."""

    def __init__(self, proxy: FlakyProxy) -> None:
        self.seen: list[str] = []
        proxy.tamper = self.tamper

    def tamper(self, method, path, headers):
        if method == "GET":
            self.seen.append(headers.get("User-Agent") or headers.get("user-agent") or "")
        return headers

    def obstore(self) -> int:
        return sum("object_store" in a for a in self.seen)


def _options(server, endpoint=None):
    opts = server.storage_options()
    if endpoint:
        opts["client_kwargs"] = dict(opts["client_kwargs"], endpoint_url=endpoint)
    return opts


def _report(path, **kw):
    return {k: v for k, v in public(compute_report(path, **kw)).items() if k != "dataset"}


def test_report_through_obstore_is_exact(s3, bucket, small_ds):
    proxy = FlakyProxy(s3.endpoint)
    agents = Agents(proxy)
    try:
        got = _report("s3://l5-direct/small.zarr", storage_options=_options(s3, proxy.endpoint))
    finally:
        proxy.close()
    assert got == _report(small_ds)
    assert agents.obstore() >= 10 and agents.obstore() == len(agents.seen)  # every GET by obstore


def test_ranges_and_sizes_equal_the_file(s3, bucket):
    """Ranges at the edges (first byte, last byte, past the end, from the end, open-ended) and
    long ranges cut into parts fetched at once: the file's own bytes; sizes by a HEAD."""
    want = open(bucket, "rb").read()
    n = len(want)
    store = Store("s3://l5-direct", _options(s3))
    assert objects.usable(store.fs)
    rng = np.random.default_rng(11)
    spans = [(0, 1), (n - 1, n), (n - 10, n + 500), (123, None), (None, None), (0, n), (4_000_000, None)]
    spans += [(-1, None), (-700, None), (-(n + 5), None), (5, 5)]
    spans += [tuple(sorted(map(int, rng.integers(0, n, 2)))) for _ in range(12)]
    with dask.config.set({"l5dask.part-bytes": 300_000}):  # (the long ones come as parts)
        for start, end in spans:
            assert store.get("blob.bin", start=start, end=end) == want[start:end], (start, end)
        assert list(store.iter_ranges([("blob.bin", a, b) for a, b in spans])) == [want[a:b] for a, b in spans]
    assert store.size("blob.bin") == n and store.size("small.zarr/.zgroup") > 0
    with pytest.raises(ChunkError, match=r"object 'nothing.bin' is missing"):
        store.size("nothing.bin")


def test_missing_object_and_wrong_credentials_are_named(s3, bucket):
    store = Store("s3://l5-direct", _options(s3))
    with pytest.raises(ChunkError, match=r"object 'small.zarr/agents/999' is missing"):
        store.get("small.zarr/agents/999", what="agents chunk 999")
    wrong = Store("s3://l5-direct", s3.storage_options(key="nobody", secret="nothing"))
    with pytest.raises(StoreError, match=r"access denied reading 'blob.bin'"):
        wrong.get("blob.bin", start=0, end=10)


def test_503s_are_retried_through_obstore(s3, bucket, small_ds):
    proxy = FlakyProxy(s3.endpoint)
    proxy.every, proxy.drops, proxy.body = 3, True, ERROR_503
    agents = Agents(proxy)
    try:
        got = _report("s3://l5-direct/small.zarr", storage_options=_options(s3, proxy.endpoint))
    finally:
        proxy.close()
    assert proxy.failures >= 5 and agents.obstore() == len(agents.seen)
    assert got == _report(small_ds)


@pytest.mark.parametrize("tamper", ["shifted", "whole", "short"])
def test_answers_not_asked_for_are_refused_in_one_line(s3_open, bucket, tamper):
    """A range that comes back as other bytes (a shifted range, the whole object, fewer bytes) is
    never taken: one line naming the object (before obstore, s3fs asked again). (moto without IAM:
    it does not check the signature of the range changed on the way.)"""
    s3_open.make_bucket("l5-tamper")
    s3_open.s3fs().put(bucket, "l5-tamper/blob.bin")
    changed = []

    def change(method, path, headers):
        name = next((k for k in headers if k.lower() == "range"), None)
        if name is None:
            return headers
        a, b = map(int, headers.pop(name).removeprefix("bytes=").split("-"))
        changed.append((a, b))
        if tamper == "shifted":
            headers["Range"] = f"bytes={a + 1}-{b + 1}"
        elif tamper == "short":
            headers["Range"] = f"bytes={a}-{b - 1}"
        return headers

    proxy = FlakyProxy(s3_open.endpoint)
    proxy.tamper = change
    try:
        with pytest.raises(StoreError, match=r"reading 'blob.bin' failed after 1 attempt\(s\): ") as err:
            Store("s3://l5-tamper", _options(s3_open, proxy.endpoint)).get("blob.bin", start=1000, end=3000)
    finally:
        proxy.close()
    assert changed == [(1000, 2999)] and "\n" not in str(err.value)


def test_switched_off_or_options_without_an_equivalent_use_s3fs(s3, bucket):
    want = open(bucket, "rb").read()
    proxy = FlakyProxy(s3.endpoint)
    agents = Agents(proxy)
    try:
        with dask.config.set({"l5dask.obstore": False}):
            got = Store("s3://l5-direct", _options(s3, proxy.endpoint)).get("blob.bin", start=5, end=50)
        assert got == want[5:50] and agents.seen and agents.obstore() == 0
        agents.seen.clear()
        opts = dict(_options(s3, proxy.endpoint), version_aware=True)
        got = Store("s3://l5-direct", opts).get("blob.bin", start=5, end=50)
        assert got == want[5:50] and agents.seen and agents.obstore() == 0
        agents.seen.clear()
        opts = dict(_options(s3, proxy.endpoint), requester_pays=True)  # (obstore has it)
        got = Store("s3://l5-direct", opts).get("blob.bin", start=5, end=50)
        assert got == want[5:50] and agents.seen and agents.obstore() == len(agents.seen)
    finally:
        proxy.close()


def test_a_bucket_is_known_by_its_endpoint_too(s3, s3_open, tmp_path):
    """The same bucket name on two endpoints, with other bytes: each store reads its own."""
    for server, fill in ((s3, b"0123456789"), (s3_open, b"abcdefghij")):
        blob = tmp_path / "twin.bin"
        blob.write_bytes(fill * 100)
        server.make_bucket("l5-twin")
        server.s3fs().put(str(blob), "l5-twin/twin.bin")
    assert Store("s3://l5-twin", _options(s3)).get("twin.bin", start=3, end=30) == (b"0123456789" * 100)[3:30]
    assert Store("s3://l5-twin", _options(s3_open)).get("twin.bin", start=5, end=50) == (b"abcdefghij" * 100)[5:50]


def test_storage_options_map_onto_obstores():
    """What users pass (``-o key=value``, ``storage_options``) as obstore's S3 settings; an option
    without an equivalent: ``None`` (s3fs makes the GETs)."""
    got = objects.config(
        {
            "key": "K",
            "secret": "S",
            "token": "T",
            "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000/", "region_name": "eu-west-3"},
            "config_kwargs": {"read_timeout": 7, "connect_timeout": 3, "s3": {"addressing_style": "virtual"}},
            "requester_pays": True,
        }
    )
    assert got == {
        "config": {
            "endpoint": "http://127.0.0.1:9000",
            "access_key_id": "K",
            "secret_access_key": "S",
            "session_token": "T",
            "region": "eu-west-3",
            "request_payer": True,
            "virtual_hosted_style_request": True,
        },
        "client_options": {"allow_http": True, "read_timeout": "7.0s", "connect_timeout": "3.0s", "timeout": "86400s"},
    }
    anon = objects.config({"anon": True, "endpoint_url": "https://s3.example.org", "client_kwargs": {"verify": False}})
    assert anon is not None
    assert anon["config"] == {"endpoint": "https://s3.example.org", "skip_signature": True}
    assert anon["client_options"]["allow_invalid_certificates"] and not anon["client_options"]["allow_http"]
    for other in (
        {"version_aware": True},
        {"s3_additional_kwargs": {"SSECustomerKey": "x"}},
        {"config_kwargs": {"proxies": {"https": "http://proxy"}}},
        {"config_kwargs": {"signature_version": "s3"}},
        {"client_kwargs": {"verify": object()}},
        {"something_new": 1},
    ):
        assert objects.config(other) is None, other


def test_the_aws_environment_reaches_obstore(s3, bucket, monkeypatch):
    """No options: credentials, endpoint and region from the AWS environment (as a user without
    ``-o``), resolved once by l5dask and carried to obstore."""
    want = open(bucket, "rb").read()
    for name, value in s3.environment().items():
        if name.startswith("AWS_"):
            monkeypatch.setenv(name, value)
    store = Store("s3://l5-direct")
    assert objects.usable(store.fs)
    assert store.get("blob.bin", start=10, end=99) == want[10:99]


@given(
    size=st.integers(0, 10_000),
    start=st.one_of(st.none(), st.integers(-12_000, 12_000)),
    end=st.one_of(st.none(), st.integers(0, 12_000)),
    got=st.tuples(st.integers(0, 12_000), st.integers(0, 12_000)),
    extra=st.integers(-2, 2),
)
def test_an_answer_is_taken_only_as_the_bytes_asked_for(size, start, end, got, extra):
    """``vouched``: an answer whose range is the one asked for (cut at the object's end) with that
    many bytes is taken; any other is refused in one line."""
    assume(end is None or start is None or start < 0 or start < end)  # (else no request: b"")
    if start is not None and start < 0:
        want = (max(0, size + start), size)
    else:
        want = (min(start or 0, size), size if end is None else min(end, size))
    for span, n in ((want, want[1] - want[0]), (got, max(0, got[1] - got[0] + extra))):
        body = bytes(n)
        ok = span == want and n == want[1] - want[0]
        if ok:
            assert objects.vouched("b/k", start, end, span, size, body) == body
        else:
            with pytest.raises(ValueError, match=r"^b/k: asked for bytes [0-9]+-[0-9]+ of [0-9]+, got "):
                objects.vouched("b/k", start, end, span, size, body)
