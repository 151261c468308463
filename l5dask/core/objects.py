"""Reads of S3 objects through obstore (the Python bindings of the Rust ``object_store`` crate,
as zarr-python 3 and VirtualiZarr read), beside s3fs.

A store's GETs (whole objects and ranges) and sizes (a HEAD) go through one ``obstore`` S3 store
per bucket and options in each process, made from the options the s3fs filesystem was opened
with (``config``): the credentials l5dask resolved from the usual AWS chain
(``l5dask.core.store.resolve_s3_options``) or the user's ``key``/``secret``/``token``,
``anon``, a ``profile``, the endpoint (``endpoint_url``, ``client_kwargs.endpoint_url``,
``AWS_ENDPOINT_URL``) and its region, ``requester_pays``, the addressing style, TLS verification,
the read and connect timeouts. obstore's own retries are off: each attempt of
``Store._retrying`` is one request.

s3fs keeps what other code of l5dask does with ``Store.fs`` as an fsspec filesystem (listings,
``exists``, writes, deletes, archives on S3), and the GETs of filesystems whose options obstore
has no equivalent for (``version_aware``, ``s3_additional_kwargs`` such as customer keys,
``config_kwargs`` proxies or a signature other than SigV4, any option not known here): those go
through fsspec's coroutine API (``fs._cat_file``), as the GETs of any other asynchronous fsspec
filesystem (HTTP, GCS) do.

What comes back is checked: a GET of a range must come back as that range (cut at the object's
end) and as many bytes; a whole object as its size in bytes.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
import weakref
from typing import Any

from l5dask.core import config as settings  # (this module's config() is an S3 client's)

#: Options of s3fs that change nothing a GET or a HEAD sends (or that l5dask maps below).
_HARMLESS = {
    "key",
    "secret",
    "token",
    "anon",
    "profile",
    "endpoint_url",
    "client_kwargs",
    "config_kwargs",
    "requester_pays",
    "skip_instance_cache",
    "use_listings_cache",
    "listings_expiry_time",
    "max_paths",
    "max_concurrency",
    "default_block_size",
    "default_fill_cache",
    "default_cache_type",
    "cache_regions",
    "asynchronous",
    "loop",
    "fixed_upload_size",
    "use_ssl",
    "username",
    "password",
}
_CLIENT_KWARGS = {
    "endpoint_url",
    "region_name",
    "verify",
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
}
_CONFIG_KWARGS = {
    "max_pool_connections",
    "read_timeout",
    "connect_timeout",
    "retries",
    "signature_version",
    "s3",
    "region_name",
    "user_agent_extra",
    "tcp_keepalive",
}

_LOCK = threading.Lock()
#: The obstore stores of this process by bucket and settings...
_STORES: dict[str, Any] = {}
#: ... and by filesystem: (its settings, its stores by bucket).
_MEMO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
settings.on_reset(_STORES.clear)
settings.on_reset(_MEMO.clear)


def usable(fs: Any) -> bool:
    """Whether the GETs of ``fs`` go through obstore: an s3fs filesystem (not a subclass) whose
    options all have an equivalent here, and ``l5dask.obstore`` (dask config) not false."""
    import sys

    s3fs = sys.modules.get("s3fs")
    if s3fs is None or type(fs) is not s3fs.S3FileSystem or not settings.get("obstore"):
        return False
    return _memo(fs)[0] is not None


def _memo(fs: Any) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """``fs``'s obstore settings (:func:`config`) and its stores by bucket, made once a filesystem
    (60-120 us of the client's CPU a GET when made each time)."""
    got = _MEMO.get(fs)
    if got is None:
        with _LOCK:
            got = _MEMO.setdefault(fs, (config(getattr(fs, "storage_options", None) or {}), {}))
    return got


def config(options: dict[str, Any]) -> dict[str, Any] | None:
    """obstore's ``S3Store`` settings (``config``, ``client_options``) for a filesystem opened with
    these s3fs options; ``None`` when one of them has no equivalent (s3fs then makes the GETs)."""
    client_kwargs = dict(options.get("client_kwargs") or {})
    config_kwargs = dict(options.get("config_kwargs") or {})
    if set(options) - _HARMLESS or set(client_kwargs) - _CLIENT_KWARGS or set(config_kwargs) - _CONFIG_KWARGS:
        return None
    if options.get("use_ssl") is False or config_kwargs.get("signature_version") not in (None, "s3v4"):
        return None
    verify = client_kwargs.get("verify")
    if verify not in (None, True, False) and not isinstance(verify, str):
        return None
    s3: dict[str, Any] = {}
    client: dict[str, Any] = {}
    endpoint = options.get("endpoint_url") or client_kwargs.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        s3["endpoint"] = str(endpoint).rstrip("/")
        client["allow_http"] = str(endpoint).startswith("http://")
    region = client_kwargs.get("region_name") or config_kwargs.get("region_name")
    key = options.get("key") or client_kwargs.get("aws_access_key_id")
    secret = options.get("secret") or client_kwargs.get("aws_secret_access_key")
    token = options.get("token") or client_kwargs.get("aws_session_token")
    if options.get("anon"):
        s3["skip_signature"] = True
    elif key or secret:
        s3["access_key_id"], s3["secret_access_key"] = str(key or ""), str(secret or "")
        if token:
            s3["session_token"] = str(token)
    elif options.get("profile"):  # (the profile's credentials and region, as botocore finds them)
        import botocore.session

        session = botocore.session.Session(profile=options["profile"])
        creds = session.get_credentials()
        if creds is not None:
            frozen = creds.get_frozen_credentials()
            s3["access_key_id"], s3["secret_access_key"] = frozen.access_key, frozen.secret_key
            if frozen.token:
                s3["session_token"] = frozen.token
        region = region or session.get_config_variable("region")
    if region:
        s3["region"] = str(region)
    if options.get("requester_pays"):
        s3["request_payer"] = True
    style = (config_kwargs.get("s3") or {}).get("addressing_style")
    if style in ("virtual", "path"):
        s3["virtual_hosted_style_request"] = style == "virtual"
    if verify is False:
        client["allow_invalid_certificates"] = True
    elif isinstance(verify, str):
        client["root_certificate"] = verify
    for name in ("read_timeout", "connect_timeout"):
        if config_kwargs.get(name) is not None:
            client[name] = f"{float(config_kwargs[name])}s"
    client["timeout"] = "86400s"  # (a whole object may take long: a stall is the read timeout's)
    return {"config": s3, "client_options": client}


def s3_store(fs: Any, bucket: str) -> Any:
    """This process's obstore S3 store of ``bucket`` with the settings of ``fs``'s options."""
    settings, stores = _memo(fs)
    got = stores.get(bucket)
    if got is not None:
        return got
    assert settings is not None
    name = json.dumps([bucket, settings], sort_keys=True, default=str)
    got = _STORES.get(name)
    if got is not None:
        stores[bucket] = got
        return got
    from obstore.store import S3Store

    s3: Any = dict(settings["config"])
    if "region" not in s3 and "endpoint" not in s3:
        s3["region"] = _bucket_region(bucket)
    store = S3Store(bucket, config=s3, client_options=settings["client_options"], retry_config={"max_retries": 0})
    with _LOCK:
        stores[bucket] = got = _STORES.setdefault(name, store)
    return got


@functools.lru_cache(maxsize=64)
def _bucket_region(bucket: str) -> str:
    """An AWS bucket's region, as S3 names it to anyone who asks (``x-amz-bucket-region``), when
    neither the options nor the environment say it (s3fs finds it the same way)."""
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        return region
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"https://{bucket}.s3.amazonaws.com/", method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310 - an https URL made here
            return resp.headers.get("x-amz-bucket-region") or "us-east-1"
    except urllib.error.HTTPError as exc:  # (a 403 or a 301 names the region too)
        return exc.headers.get("x-amz-bucket-region") or "us-east-1"
    except OSError:
        return "us-east-1"


settings.on_reset(_bucket_region.cache_clear)


def _split(fs: Any, path: str) -> tuple[str, str]:
    """``(bucket, key)`` of a path of ``fs`` (s3fs's ``split_path`` took 25 us a GET)."""
    bucket, _, key = path.split("://", 1)[-1].lstrip("/").partition("/")
    return bucket, key


async def cat(fs: Any, path: str, start: int | None = None, end: int | None = None) -> bytes:
    """Bytes ``[start, end)`` of ``path`` (``None``: from the start, to the end; a negative
    ``start``: from the end), through obstore when :func:`usable`, else through fsspec."""
    if not usable(fs):
        return await fs._cat_file(path, start=start, end=end)
    import obstore

    bucket, key = _split(fs, path)
    store = s3_store(fs, bucket)
    options: Any = {}
    if start is not None and start < 0:
        if end is not None:
            return await fs._cat_file(path, start=start, end=end)  # (a suffix cut short: rare)
        options["range"] = {"suffix": -start}
    elif end is not None:
        if (start or 0) >= end:
            return b""
        options["range"] = (start or 0, end)
    elif start:
        options["range"] = {"offset": start}
    try:
        got = await obstore.get_async(store, key, options=options or None)
        body = await got.bytes_async()
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise _error(exc, path) from exc
    return vouched(path, start, end, got.range, got.meta["size"], body)


def vouched(path: str, start: int | None, end: int | None, got: tuple[int, int], size: int, body: Any) -> bytes:
    """The body of an answer to a GET of ``[start, end)`` that came back as bytes ``got`` of an
    object of ``size`` bytes, if it is what was asked for; else a ``ValueError`` in one line."""
    if start is not None and start < 0:
        want = (max(0, size + start), size)
    else:
        want = (min(start or 0, size), size if end is None else min(end, size))
    if tuple(got) != want or len(body) != want[1] - want[0]:
        raise ValueError(
            f"{path}: asked for bytes {want[0]}-{want[1]} of {size}, got {got[0]}-{got[1]} ({len(body)} bytes)"
        )
    return bytes(body)


async def size(fs: Any, path: str) -> int:
    """The size of object ``path`` in bytes (a HEAD through obstore: ``fs`` is :func:`usable`)."""
    import obstore

    bucket, key = _split(fs, path)
    try:
        meta = await obstore.head_async(s3_store(fs, bucket), key)
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise _error(exc, path) from exc
    return int(meta["size"])


def _error(exc: BaseException, path: str) -> BaseException:
    """obstore's errors as the store's retries and messages know them: denied access a
    ``PermissionError``; a range past an object's end a ``ValueError``; the rest as they are."""
    import errno

    from obstore.exceptions import PermissionDeniedError, UnauthenticatedError

    full = str(exc)
    text = full.strip().splitlines()[0] if full.strip() else type(exc).__name__
    if isinstance(exc, (PermissionDeniedError, UnauthenticatedError)) or "status code: 403" in text:
        return PermissionError(errno.EACCES, text, path)
    status = re.search(r"non-2xx status code: ([0-9]{3})", text)
    if status is not None:  # (S3's own words: the status, its code and message)
        code = re.search(r"<Code>([^<]{1,100})</Code>", full)
        message = re.search(r"<Message>([^<]{1,300})</Message>", full)
        what = f"{status.group(1)} {code.group(1) if code else ''}: {message.group(1) if message else ''}"
        what = what.replace(" : ", ": ").strip(": ")
        if status.group(1) == "416":
            return OSError(errno.EINVAL, what)
        if status.group(1) >= "500" or (code and code.group(1) == "SlowDown"):
            return OSError(errno.EBUSY, what)  # (transient: retried by the store)
    if " - HTTP error: " in text and "kind: Connect," in full:  # (no connection made: reqwest's)
        m = re.search(r"Error performing (\S+ \S+)", text)
        why = "connection refused" if "ConnectionRefused" in full else "no connection"
        return ConnectionRefusedError(f"could not connect to the endpoint ({why}): {m.group(1) if m else path}")
    return exc
