"""An S3 endpoint with the costs of a real one, over a local folder: it waits a first-byte latency
before every answer, can cap each connection's bandwidth, and can answer a share of requests with
503 SlowDown or not at all (a stalled read), so that the cost of waiting shows.

    python benchmarks/slow_s3.py --root DIR --port 5001 --latency-ms 50

Bucket ``bench`` is the folder ``DIR``. It answers what s3fs asks of a dataset: HEAD and GET of an
object (with a ``Range``: 206), and ListObjectsV2 (prefix, delimiter; one page). Signatures are
not checked. Objects are sent by the kernel (sendfile) unless the bandwidth is capped, so that the
endpoint itself costs little CPU: the fetch floor of ``benchmarks/s3_latency_benchmark.py`` reads
876 MB through it in about 2 s on this 2-core machine, moto's server took 8-9 s.

``GET /__stats`` returns its request counts by method (JSON); ``POST /__stats`` zeroes them.
``start()`` runs one in a child process.
"""

from __future__ import annotations

import argparse
import asyncio
import email.utils
import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from xml.sax.saxutils import escape

_SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
_NOKEY = b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>NoSuchKey</Code><Message>no such key</Message></Error>'


def _list(root: str, prefix: str, delimiter: str) -> bytes:
    keys = []
    for r, _, files in os.walk(root, followlinks=True):
        for f in files:
            key = os.path.relpath(os.path.join(r, f), root).replace(os.sep, "/")
            if key.startswith(prefix):
                keys.append(key)
    keys.sort()
    contents, prefixes = [], set()
    for k in keys:
        rest = k[len(prefix) :]
        if delimiter and delimiter in rest:
            prefixes.add(prefix + rest.split(delimiter)[0] + delimiter)
            continue
        st = os.stat(os.path.join(root, k))
        modified = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(st.st_mtime))
        contents.append(
            f"<Contents><Key>{escape(k)}</Key><LastModified>{modified}</LastModified>"
            f'<ETag>"{int(st.st_mtime)}-{st.st_size}"</ETag><Size>{st.st_size}</Size>'
            "<StorageClass>STANDARD</StorageClass></Contents>"
        )
    common = "".join(f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>" for p in sorted(prefixes))
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        f"<Name>bench</Name><Prefix>{escape(prefix)}</Prefix><KeyCount>{len(contents) + len(prefixes)}</KeyCount>"
        f"<MaxKeys>100000</MaxKeys><Delimiter>{escape(delimiter)}</Delimiter><IsTruncated>false</IsTruncated>"
        f"{''.join(contents)}{common}</ListBucketResult>"
    )
    return body.encode()


def serve(root: str, port: int, latency: float, bandwidth: float, fail_rate: float, stall_rate: float) -> None:
    from aiohttp import web

    counts: Counter = Counter()
    rng = random.Random(0)

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.path == "/__stats":
            if request.method == "POST":
                counts.clear()
            return web.json_response(dict(counts))
        counts[request.method] += 1
        draw = rng.random()
        await asyncio.sleep(latency)
        if draw < stall_rate:
            counts["stalled"] += 1
            await asyncio.sleep(3600)
        if draw < stall_rate + fail_rate:
            counts["503"] += 1
            return web.Response(status=503, body=_SLOWDOWN, content_type="application/xml")
        bucket, _, key = request.path.lstrip("/").partition("/")
        if bucket != "bench":
            return web.Response(status=404, body=_NOKEY, content_type="application/xml")
        if not key:  # the bucket: ListObjectsV2
            q = request.query
            return web.Response(
                body=_list(root, q.get("prefix", ""), q.get("delimiter", "")), content_type="application/xml"
            )
        path = os.path.join(root, *key.split("/"))
        if not os.path.isfile(path):
            return web.Response(status=404, body=_NOKEY, content_type="application/xml")
        st = os.stat(path)
        headers = {
            "Last-Modified": email.utils.formatdate(st.st_mtime, usegmt=True),
            "ETag": f'"{int(st.st_mtime)}-{st.st_size}"',
            "Accept-Ranges": "bytes",
        }
        if request.method == "HEAD":
            resp = web.StreamResponse(headers=headers)
            resp.content_length = st.st_size
            await resp.prepare(request)
            await resp.write_eof()
            return resp
        if not bandwidth:
            return web.FileResponse(path, headers=headers)  # (Range handled, sent by the kernel)
        lo, hi = 0, st.st_size
        rng_h = request.headers.get("Range", "")
        if rng_h.startswith("bytes="):
            a, _, b = rng_h[6:].partition("-")
            lo, hi = (int(a), min(hi, int(b) + 1 if b else hi)) if a else (max(0, hi - int(b)), hi)
        with open(path, "rb") as f:
            f.seek(lo)
            data = f.read(hi - lo)
        resp = web.StreamResponse(status=206 if rng_h else 200, headers=headers)
        if rng_h:
            resp.headers["Content-Range"] = f"bytes {lo}-{hi - 1}/{st.st_size}"
        resp.content_length = len(data)
        await resp.prepare(request)
        step = 65536
        for i in range(0, len(data), step):
            await asyncio.sleep(min(step, len(data) - i) / bandwidth)
            await resp.write(data[i : i + step])
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def start(
    root: str, latency_ms: float, bandwidth_mb: float = 0.0, fail_rate: float = 0.0, stall_rate: float = 0.0
) -> tuple[subprocess.Popen, str]:
    """An endpoint in a child process: (the process, its URL)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [sys.executable, os.path.abspath(__file__), "--root", root, "--port", str(port)]
    args += ["--latency-ms", str(latency_ms), "--bandwidth-mb", str(bandwidth_mb)]
    args += ["--fail-rate", str(fail_rate), "--stall-rate", str(stall_rate)]
    proc = subprocess.Popen(args)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(f"{url}/__stats", timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the slow S3 endpoint did not start")


def stats(url: str, reset: bool = False) -> dict:
    req = urllib.request.Request(f"{url}/__stats", method="POST" if reset else "GET")
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True, help="the folder served as bucket 'bench'")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--bandwidth-mb", type=float, default=0.0, help="per connection, MB/s (0: none)")
    p.add_argument("--fail-rate", type=float, default=0.0, help="share of requests answered 503 SlowDown")
    p.add_argument("--stall-rate", type=float, default=0.0, help="share of requests never answered")
    a = p.parse_args()
    serve(a.root, a.port, a.latency_ms / 1000, a.bandwidth_mb * 1e6, a.fail_rate, a.stall_rate)
