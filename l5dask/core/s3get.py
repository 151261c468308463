"""GETs of S3 objects by presigned URL over one aiohttp session, beside s3fs.

What it beats: s3fs's ``_cat_file`` sends each GET through aiobotocore's request pipeline (its
event hooks, a user-agent string rebuilt per request, the parse of every response header into a
dict, dates included). For a 0.56 MB chunk that costs 1.2-1.8 ms of the client's CPU a GET on this
2-core machine; a SigV4 presigned URL (botocore) and a plain aiohttp GET cost 0.7-0.9 ms, the
body's bytes included (``benchmarks/s3_get_cpu.py``; 1,500 agent chunks through
``benchmarks/slow_s3.py``). A pass over train_full makes 135,000 GETs: that is a core-minute or
two, on every worker's cores that also decode.

Everything else stays with s3fs and botocore: credentials and their refresh, the endpoint, the
region and the addressing style (all in the presigned URL), listings, sizes, writes. A GET whose
answer is not one of those it can vouch for (a redirect to another region, a bad request, a
range the object does not have) is made again through s3fs, which then answers or raises as it
always did; so is a GET that fails before the bucket has answered one (an endpoint that does not
take presigned URLs). A bucket that needed s3fs once goes through s3fs for the rest of the
process.
Requests with options of their own (requester pays, customer keys, versions, proxies) go
through s3fs from the start. ``l5dask.s3-direct-get: false`` (dask config) turns this off.

What comes back is checked: a range must come back as ``206`` with the ``Content-Range`` that was
asked for (or the object's end) and exactly that many bytes; a whole object as ``200`` with its
``Content-Length``.
"""

from __future__ import annotations

import asyncio
import atexit
import errno
import functools
import re
import sys
import threading
import weakref
from typing import Any

#: The client's seconds of validity of a presigned URL (each attempt presigns again).
_EXPIRES = 900
#: Buckets whose GETs go through s3fs for the rest of the process (a redirect, a bad request...).
_S3FS_ONLY: set[tuple[str, str]] = set()
#: Buckets that have answered a direct GET: their errors are the store's (before, s3fs asks again).
_PROVEN: set[tuple[str, str]] = set()
#: One aiohttp session per event loop (s3fs runs its requests on fsspec's loop thread).
_SESSIONS: dict[int, tuple[asyncio.AbstractEventLoop, Any]] = {}
_LOCK = threading.Lock()
#: The clients whose presigns are SigV4.
_V4: weakref.WeakSet = weakref.WeakSet()
_RANGE = re.compile(r"bytes ([0-9]{1,19})-([0-9]{1,19})/([0-9]{1,19}|\*)")  # (ASCII digits only)
_LENGTH = re.compile(r"[0-9]{1,19}")
_CODE = re.compile(rb"<Code>([^<]{1,100})</Code>")
_MESSAGE = re.compile(rb"<Message>([^<]{1,300})</Message>")


class Fallback(Exception):
    """This GET is made again through s3fs (an answer this module does not vouch for)."""


def usable(fs: Any, path: str) -> bool:
    """Whether a GET of ``path`` may go the direct way: an s3fs filesystem without per-request
    options of its own, a bucket not marked, and ``l5dask.s3-direct-get`` not false."""
    import dask

    s3fs = sys.modules.get("s3fs")  # (a filesystem of s3fs's: s3fs is imported)
    if not dask.config.get("l5dask.s3-direct-get", True) or s3fs is None or type(fs) is not s3fs.S3FileSystem:
        return False  # (a subclass may read otherwise)
    if getattr(fs, "version_aware", False) or getattr(fs, "req_kw", None) or getattr(fs, "s3_additional_kwargs", None):
        return False
    config = getattr(fs, "config_kwargs", None) or {}
    if _proxied() or config.get("proxies") or config.get("signature_version") not in (None, "s3v4"):
        return False
    verify = (getattr(fs, "client_kwargs", None) or {}).get("verify")
    if verify not in (None, True, False) and not isinstance(verify, str):
        return False
    return where(fs, path) not in _S3FS_ONLY


@functools.lru_cache(maxsize=1)
def _proxied() -> bool:
    """Whether this process has proxy variables (botocore honours them; s3fs then makes the GETs)."""
    import urllib.request

    return bool(urllib.request.getproxies())


def where(fs: Any, path: str) -> tuple[str, str]:
    """A bucket, as the sets of buckets proven or sent to s3fs know it: its endpoint and name."""
    endpoint = (getattr(fs, "client_kwargs", None) or {}).get("endpoint_url") or getattr(fs, "endpoint_url", None)
    return str(endpoint or ""), path.split("/", 1)[0]


def buckets() -> dict[str, set[str]]:
    """The buckets (by name) of this process that have answered a direct GET (``"direct"``) and
    those sent to s3fs (``"s3fs"``)."""
    return {"direct": {b for _, b in _PROVEN}, "s3fs": {b for _, b in _S3FS_ONLY}}


def forget() -> None:
    """Forget the buckets proven or sent to s3fs, and whether this process has proxy variables:
    the next GET of each bucket tries the direct way again."""
    _PROVEN.clear()
    _S3FS_ONLY.clear()
    _proxied.cache_clear()


async def cat(fs: Any, path: str, start: int | None = None, end: int | None = None) -> bytes:
    """Bytes ``[start, end)`` of ``path`` (``None``: from the start, to the end), as
    ``fs._cat_file`` gives them: directly when ``usable``, else (or on an answer not vouched
    for) through s3fs."""
    ranged = start is not None or end is not None
    if (
        (start is not None and start < 0)
        or (end is not None and (end < 0 or (start or 0) >= end))
        or not usable(fs, path)
    ):
        return await fs._cat_file(path, start=start, end=end)
    bucket = where(fs, path)
    try:
        got = await _get(fs, path, start or 0 if ranged else None, end)
    except Fallback:
        _S3FS_ONLY.add(bucket)
        return await fs._cat_file(path, start=start, end=end)
    except Exception:
        if bucket in _PROVEN:
            raise  # (a store that answered before: its error is the store's, retried or named)
        # A bucket that has not yet answered a direct GET goes through s3fs from now on, which
        # asks again (an endpoint that does not take presigned URLs: moto with IAM answers them
        # with a 500; a store that shed this first request only costs the speed-up).
        _S3FS_ONLY.add(bucket)
        return await fs._cat_file(path, start=start, end=end)
    _PROVEN.add(bucket)
    return got


async def _get(fs: Any, path: str, start: int | None, end: int | None) -> bytes:
    client = await fs.set_session()
    _sign_v4(client)
    bucket, key, _ = fs.split_path(path)
    url = await client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=_EXPIRES)
    headers = {}
    if start is not None:
        headers["Range"] = f"bytes={start}-" + ("" if end is None else str(end - 1))
    session = await _session(fs)
    async with session.get(url, headers=headers, allow_redirects=False) as resp:
        status = resp.status
        if status in (200, 206):
            body = await resp.read()
            return vouched(path, status, resp.headers, body, start, end)
        text = await resp.content.read(4096)
    code = _first(_CODE, text)
    message = _first(_MESSAGE, text) or resp.reason or ""
    what = f"{status} {code}: {message}".replace(" : ", ": ")
    if status == 404:
        raise FileNotFoundError(errno.ENOENT, what, path)
    if status == 403:
        raise PermissionError(errno.EACCES, what, path)
    if status >= 500 or code == "SlowDown":
        raise OSError(errno.EBUSY, what, path)  # (transient: retried by the store)
    raise Fallback(what)


def vouched(path: str, status: int, headers: Any, body: bytes, start: int | None, end: int | None) -> bytes:
    """The body of an answer to a GET of bytes ``[start, end)`` (``start`` ``None``: the whole
    object; ``end`` ``None``: to its end), if it is what was asked for; else ``Fallback``."""
    if start is None:
        length = headers.get("Content-Length")
        if status != 200 or length is None or not _LENGTH.fullmatch(length) or int(length) != len(body):
            raise Fallback(f"{path}: a whole object came back as {status} with {len(body)} bytes")
        return body
    if status != 206:
        raise Fallback(f"{path}: a range came back as {status}")
    m = _RANGE.fullmatch(headers.get("Content-Range", ""))
    if m is None or m.group(3) == "*":
        raise Fallback(f"{path}: a range came back without a Content-Range")
    first, last, total = int(m.group(1)), int(m.group(2)), int(m.group(3))
    want_last = (total if end is None else min(end, total)) - 1
    if first != start or last != want_last or len(body) != last - first + 1:
        raise Fallback(f"{path}: asked for bytes {start}-{want_last}, got {first}-{last} ({len(body)} bytes)")
    return body


def _first(pattern: re.Pattern, text: bytes) -> str:
    m = pattern.search(text)
    return m.group(1).decode("utf-8", "replace").strip() if m else ""


def _sign_v4(client: Any) -> None:
    """Presign with SigV4: botocore presigns S3 URLs with SigV2 in the regions that still
    accept it, and S3 refuses SigV2 for buckets made since 2020. (Only a presign asks for
    ``s3v4-query``; the client's own requests are not touched.)"""
    if client in _V4:
        return

    def choose(signature_version: str = "", **kwargs: Any) -> str | None:
        # (botocore asks with "v4-query" for the client's default, SigV4; S3 presigns it as "s3v4-query")
        return "s3v4-query" if signature_version in ("v4-query", "s3v4-query") else None

    client.meta.events.register_first("choose-signer.s3", choose, unique_id="l5dask-presign-v4")
    _V4.add(client)


async def _session(fs: Any) -> Any:
    """This loop's aiohttp session, made on first use with the filesystem's pool size and
    timeouts (botocore's defaults when it has none: l5dask's stores always set them); closed
    when the process exits."""
    loop = asyncio.get_running_loop()
    got = _SESSIONS.get(id(loop))
    if got is not None and got[0] is loop and not got[1].closed:
        return got[1]
    import ssl

    import aiohttp

    config = getattr(fs, "config_kwargs", None) or {}
    verify = (getattr(fs, "client_kwargs", None) or {}).get("verify")
    tls: Any = True
    if verify is False:
        tls = False
    elif isinstance(verify, str):
        tls = ssl.create_default_context(cafile=verify)
    timeout = aiohttp.ClientTimeout(
        total=None,
        sock_connect=float(config.get("connect_timeout", 60)),
        sock_read=float(config.get("read_timeout", 60)),
    )
    connector = aiohttp.TCPConnector(limit=int(config.get("max_pool_connections", 10)), ssl=tls)
    # (no trust_env: it reads the proxy variables and ~/.netrc again for every request, 0.35 ms of
    # CPU each; a process with proxy variables goes through s3fs, see usable)
    session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)
    with _LOCK:
        _SESSIONS[id(loop)] = (loop, session)
    return session


@atexit.register
def close_sessions() -> None:
    """Close the sessions on their loops (else aiohttp warns of unclosed sessions at exit)."""
    with _LOCK:
        sessions = list(_SESSIONS.values())
        _SESSIONS.clear()
    for loop, session in sessions:
        if session.closed or loop.is_closed():
            continue
        try:
            if loop.is_running():
                asyncio.run_coroutine_threadsafe(session.close(), loop).result(2)
            else:
                loop.run_until_complete(session.close())
        except Exception:  # noqa: BLE001, S110 - at exit, a loop already stopping: nothing to save
            pass
