"""An object store that fails: a flaky HTTP proxy between s3fs and the S3 endpoint (moto server)."""

from __future__ import annotations

import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

import numpy as np
import pytest

from l5dask.errors import StoreError
from l5dask.prediction.report import compute_report, public
from tests.conftest import ctrl_c_reaches_it, free_port

ERROR_503 = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>ServiceUnavailable</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
#: A 503 that s3fs does not retry (it retries only "reduce your request rate" and "SlowDown").
ERROR_503_PLAIN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>ServiceUnavailable</Code>'
    b"<Message>The service is unavailable.</Message></Error>"
)


class FlakyProxy:
    """Forwards to ``upstream``; fails chosen chunk GETs with a 503 or a dropped connection."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urlparse(upstream)
        self.every = 0  # fail every n-th chunk GET (0: never)
        self.always = None  # fail every GET whose path ends with this
        self.drops = True  # fail half of the time by dropping the connection (else always a 503)
        self.body = ERROR_503
        self.stall = None  # GETs whose path ends with this get no answer (a stalled read)...
        self.stall_times = 10**9  # ... this many times
        self.tamper = None  # (method, path, headers) -> headers sent upstream instead
        self.delay = 0.0  # seconds each chunk GET waits before it is forwarded (a first-byte latency)
        self.watch = ""  # the chunk GETs counted in flight: those whose path holds this
        self.in_flight = 0  # chunk GETs being answered now...
        self.most_in_flight = 0  # ... and the most at once
        # watched GETs held until this many are in flight at once (then each waits ``delay``): the
        # overlap a test looks for does not hang on a sleep outlasting the other tasks' start on a
        # busy machine; if it is not reached within ``hold_timeout`` s, holding stops (the test's
        # count then says how many overlapped)
        self.hold = 0
        self.hold_timeout = 3.0
        self.presigned = 0  # requests that came with a presigned URL (query-string signature)...
        self.presigned_v4 = 0  # ... signed with SigV4
        self.stalled = 0
        self.closing = threading.Event()
        self.count = 0
        self.failures = 0
        self.lock = threading.Lock()
        self.in_flight_changed = threading.Condition(self.lock)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                chunk = (
                    self.command == "GET"
                    and not self.path.split("?")[0].rsplit("/", 1)[-1].startswith(".")
                    and self.headers.get("Range") != "bytes=0-15"
                )  # (opening reads each last chunk's header)
                with proxy.lock:
                    proxy.count += chunk
                    n = proxy.count
                fail = chunk and (
                    (proxy.always and self.path.split("?")[0].endswith(proxy.always))
                    or (proxy.every and n % proxy.every == 0)
                )
                if chunk and proxy.stall and self.path.split("?")[0].endswith(proxy.stall):
                    with proxy.lock:
                        stall = proxy.stalled < proxy.stall_times
                        proxy.stalled += stall
                    if stall:
                        proxy.closing.wait(60)  # no byte, until the client gives up (or the proxy closes)
                        self.close_connection = True
                        return
                if fail:
                    with proxy.lock:
                        proxy.failures += 1
                    if n % 2 and not proxy.always and proxy.drops:  # a dropped connection, no response at all
                        self.close_connection = True
                        self.connection.shutdown(2)
                        return
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(proxy.body)))
                    self.end_headers()
                    self.wfile.write(proxy.body)
                    return
                if chunk and proxy.watch in self.path:
                    with proxy.in_flight_changed:
                        proxy.in_flight += 1
                        proxy.most_in_flight = max(proxy.most_in_flight, proxy.in_flight)
                        proxy.in_flight_changed.notify_all()
                        reached = lambda: proxy.most_in_flight >= proxy.hold  # noqa: E731
                        if not proxy.in_flight_changed.wait_for(reached, proxy.hold_timeout):
                            proxy.hold = 0  # (not reached: no more holding)
                            proxy.in_flight_changed.notify_all()
                    try:
                        time.sleep(proxy.delay)
                        self._send(body)
                    finally:
                        with proxy.lock:
                            proxy.in_flight -= 1
                    return
                self._send(body)

            def _send(self, body):
                headers = dict(self.headers)
                if "Signature=" in self.path:
                    with proxy.lock:
                        proxy.presigned += 1
                        proxy.presigned_v4 += "X-Amz-Algorithm=AWS4-HMAC-SHA256" in self.path
                if proxy.tamper is not None:
                    headers = proxy.tamper(self.command, self.path, headers)
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=30)
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                length = resp.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))  # (HEAD: the object's size)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def close(self):
        self.closing.set()
        self.server.shutdown()


@pytest.fixture
def proxy(s3):
    p = FlakyProxy(s3.endpoint)
    yield p
    p.close()


def _options(s3, proxy):
    opts = s3.storage_options()
    opts["client_kwargs"] = dict(opts["client_kwargs"], endpoint_url=proxy.endpoint)
    opts["config_kwargs"] = {"retries": {"max_attempts": 2, "mode": "standard"}}
    return opts


def test_flaky_store_is_retried_and_report_exact(s3, s3_small, small_ds, proxy):
    expected = {k: v for k, v in public(compute_report(small_ds)).items() if k != "dataset"}
    proxy.every = 3
    got = compute_report(s3_small, storage_options=_options(s3, proxy))
    assert proxy.failures >= 5
    assert {k: v for k, v in public(got).items() if k != "dataset"} == expected


def test_transient_errors_only_l5dasks_own_retries_absorb(s3, s3_small, small_ds, proxy, monkeypatch):
    """botocore retries nothing here (total_max_attempts 1: its ``max_attempts`` counts retries) and
    s3fs does not retry this 503 (it retries only throttling messages): the failed GETs are saved by l5dask's own retries, and only by them."""
    import l5dask.core.store

    expected = {k: v for k, v in public(compute_report(small_ds)).items() if k != "dataset"}
    opts = _options(s3, proxy)
    opts["config_kwargs"] = {"retries": {"total_max_attempts": 1, "mode": "standard"}}
    proxy.every, proxy.drops, proxy.body = 4, False, ERROR_503_PLAIN
    got = compute_report(s3_small, storage_options=opts)
    assert proxy.failures >= 5
    assert {k: v for k, v in public(got).items() if k != "dataset"} == expected
    monkeypatch.setattr(l5dask.core.store, "_RETRIES", 0)  # without them, the same store fails the report
    with pytest.raises(StoreError, match="failed after 1 attempt"):
        compute_report(s3_small, storage_options=dict(opts, skip_instance_cache=True))


def test_store_that_keeps_failing_names_the_object(s3, s3_small, proxy, monkeypatch):
    import l5dask.core.store

    monkeypatch.setattr(l5dask.core.store, "_RETRIES", 4)  # (8 by default: 21 s of backoff)
    proxy.always, proxy.body = "/agents/2", ERROR_503_PLAIN  # (s3fs and botocore retry nothing: quicker)
    opts = _options(s3, proxy)
    opts["config_kwargs"] = {"retries": {"total_max_attempts": 1, "mode": "standard"}}
    with pytest.raises(StoreError, match=r"reading 'agents/2' failed after 5 attempt"):
        compute_report(s3_small, storage_options=opts)
    assert proxy.failures == 5  # one request an attempt: nothing under l5dask retried it


def test_the_default_s3_options_make_one_request_an_attempt(s3, s3_small, proxy, monkeypatch):
    """Without options of the user's, botocore and s3fs retry nothing: l5dask's attempts are the
    endpoint's requests (botocore's ``max_attempts: 1`` made two requests an attempt)."""
    import l5dask.core.store

    monkeypatch.setattr(l5dask.core.store, "_RETRIES", 2)
    proxy.always, proxy.body = "/agents/2", ERROR_503_PLAIN
    opts = s3.storage_options()
    opts["client_kwargs"] = dict(opts["client_kwargs"], endpoint_url=proxy.endpoint)
    with pytest.raises(StoreError, match=r"reading 'agents/2' failed after 3 attempt"):
        compute_report(s3_small, storage_options=opts)
    assert proxy.failures == 3


def test_store_errors_that_may_pass_are_retried_whatever_their_message():
    """s3fs turns a 503 into OSError(EBUSY, 'The service is unavailable.'): no status code in the text."""
    import errno

    from l5dask.core.store import _is_transient

    assert _is_transient(OSError(errno.EBUSY, "The service is unavailable."))
    assert _is_transient(OSError(121, "We encountered an internal error."))
    assert not _is_transient(FileNotFoundError(errno.ENOENT, "no such key"))
    assert not _is_transient(OSError(errno.EACCES, "Access Denied"))


def test_csv_files_on_s3_are_read_through_the_store(s3, proxy, tmp_path):
    """L5Kit's CSVs are read through the store as chunks are (ranged reads, retries, one-line
    errors): the same rows with every other request failing (s3fs retries ranged reads too)."""
    from l5dask.evaluation.csvfiles import read_gt_csv, write_gt_csv

    rng = np.random.default_rng(5)
    n, t = 3000, 4
    coords, avails = rng.normal(0, 50, (n, t, 2)), (rng.random((n, t)) > 0.2).astype(np.float64)
    path = tmp_path / "gt.csv"
    write_gt_csv(str(path), np.arange(n), np.arange(n) % 97, coords, avails)
    s3.make_bucket("l5-csv")
    s3.s3fs().put(str(path), "l5-csv/gt.csv")
    want = read_gt_csv(str(path)).coords.compute(scheduler="sync")
    opts = _options(s3, proxy)
    opts["config_kwargs"] = {"retries": {"total_max_attempts": 1, "mode": "standard"}}
    proxy.every, proxy.drops, proxy.body = 2, False, ERROR_503_PLAIN
    got = read_gt_csv("s3://l5-csv/gt.csv", storage_options=opts).coords.compute(scheduler="sync")
    assert proxy.failures >= 1
    np.testing.assert_array_equal(got, want)


def test_a_stalled_read_times_out_is_retried_and_the_report_is_exact(s3, s3_small, small_ds, proxy):
    """The defaults (no retry options): a read that gets no byte within ``l5dask.read-timeout`` is
    transient, retried, and the report is exact."""
    import dask

    expected = {k: v for k, v in public(compute_report(small_ds)).items() if k != "dataset"}
    opts = s3.storage_options()
    opts["client_kwargs"] = dict(opts["client_kwargs"], endpoint_url=proxy.endpoint)
    proxy.stall, proxy.stall_times = "/agents/1", 1
    with dask.config.set({"l5dask.read-timeout": 1.0}):
        got = compute_report(s3_small, storage_options=dict(opts, skip_instance_cache=True))
    assert proxy.stalled == 1
    assert {k: v for k, v in public(got).items() if k != "dataset"} == expected


def test_a_store_that_stays_stalled_is_one_line_naming_the_object_and_nothing_is_written(s3, s3_small, proxy, tmp_path):
    import os
    import subprocess
    import sys
    import time

    proxy.stall = "/agents/1"
    out = tmp_path / "report.json"
    env = dict(os.environ, DASK_L5DASK__READ_TIMEOUT="1")
    cmd = [sys.executable, "-m", "l5dask.cli", "stats", s3_small, "-o", str(out), "-q"]
    for k, v in s3.storage_options().items():
        if k == "client_kwargs":
            cmd += ["-s", f"client_kwargs.endpoint_url={proxy.endpoint}", "-s", "client_kwargs.region_name=us-east-1"]
        elif isinstance(v, str):
            cmd += ["-s", f"{k}={v}"]
    # (the guard: three reads of a second each and their backoff, not botocore's 60 s five times)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2, r.stderr
    assert (
        r.stderr.count("\n") == 1
        and "reading 'agents/1' failed after 3 attempt(s): no byte within the read timeout" in r.stderr
    )
    assert not out.exists() and os.listdir(tmp_path) == []
    # cancelled (Ctrl-C) while a read is stalled: one line, no file, and the reads in flight stop
    proxy.stalled = 0
    env["DASK_L5DASK__READ_TIMEOUT"] = "3600"  # (the exit must not wait for it: communicate's guard)
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=ctrl_c_reaches_it
    )
    for _ in range(200):  # until the stalled read is under way
        if proxy.stalled:
            break
        time.sleep(0.1)
    assert proxy.stalled
    p.send_signal(__import__("signal").SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and err.strip() == "l5dask: interrupted", err
    assert not out.exists() and os.listdir(tmp_path) == []


def test_an_endpoint_that_refuses_the_connection_fails_after_a_few_attempts_each_retry_said(tmp_path):
    """Nothing listens at the endpoint: a refused connection is retried twice (not 8 times, 21 s
    of silence), each retry said on stderr as it happens, then one line naming the object; ``-q``
    says only the error."""
    import os
    import subprocess
    import sys

    port = free_port()  # (bound and closed: nobody listens there)
    env = dict(
        os.environ,
        AWS_ACCESS_KEY_ID="l5dask",
        AWS_SECRET_ACCESS_KEY="l5dask",
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_DEFAULT_REGION="us-east-1",
    )
    out = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "l5dask.cli", "stats", "s3://l5-nowhere/data.zarr", "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 3, r.stderr
    assert lines[0].endswith("; attempt 2 in 0.2 s") and lines[1].endswith("; attempt 3 in 0.4 s"), r.stderr
    assert all("reading '.zgroup' failed (" in line and f"127.0.0.1:{port}" in line for line in lines[:2])
    assert lines[2].startswith(
        "l5dask: error: s3://l5-nowhere/data.zarr: reading '.zgroup' failed after 3 attempt(s): "
    )
    assert not out.exists()
    quiet = subprocess.run(cmd + ["-q"], capture_output=True, text=True, env=env, timeout=120)
    assert quiet.returncode == 2 and quiet.stderr.splitlines() == lines[2:], quiet.stderr


@pytest.mark.parametrize("command", ["synth", "export"])
def test_a_dataset_written_to_an_endpoint_that_refuses_the_connection_is_one_line(command, small_ds, tmp_path):
    """A writer that goes through the store's client itself (botocore's EndpointConnectionError is
    no OSError) printed a traceback of 119 lines: one line, exit 2 (found by a new user's trial)."""
    import os
    import subprocess
    import sys

    port = free_port()
    env = dict(os.environ, AWS_ACCESS_KEY_ID="l5dask", AWS_SECRET_ACCESS_KEY="l5dask", AWS_DEFAULT_REGION="us-east-1")
    env["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{port}"
    args = [command, "-o", "s3://l5-nowhere/out", "-q"] + (["--num-scenes", "2"] if command == "synth" else [small_ds])
    r = subprocess.run([sys.executable, "-m", "l5dask.cli", *args], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120)  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("l5dask: error: ") and f"127.0.0.1:{port}" in r.stderr, r.stderr
