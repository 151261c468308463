"""The client's CPU per GET of a chunk: s3fs's ``_cat_file`` against l5dask's GET through obstore
(``l5dask.core.objects``), interleaved.

    python benchmarks/s3_get_cpu.py [--scenes 1700] [--chunks 1500] [--rounds 4]

The first ``--chunks`` agent chunks of the generated dataset (about 0.56 MB each) are fetched
from ``benchmarks/slow_s3.py`` (no added latency), 64 at once, in this process, by each way in
turn. Printed per round: wall seconds and this process's CPU (user + system) per GET; the endpoint
runs in a process of its own and is not counted. Both ways must give the same bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import slow_s3  # noqa: E402
from common import dataset  # noqa: E402


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenes", type=int, default=1700)
    parser.add_argument("--chunks", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    root = dataset(args.scenes)
    proxy, url = slow_s3.start(os.path.dirname(root), 0)
    os.environ.update(AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x", AWS_DEFAULT_REGION="us-east-1")
    import fsspec.asyn

    from l5dask.core import objects
    from l5dask.core.store import Store

    keys = sorted((k for k in os.listdir(os.path.join(root, "agents")) if not k.startswith(".")), key=int)
    store = Store(f"s3://bench/{os.path.basename(root)}", {"client_kwargs": {"endpoint_url": url}})
    fs, paths = store.fs, [store.path(f"agents/{k}") for k in keys[: args.chunks]]

    async def fetch(direct: bool) -> tuple[float, float, str]:
        get = (lambda p: objects.cat(fs, p)) if direct else (lambda p: fs._cat_file(p))
        await get(paths[0])  # (sessions and connections made before the clock starts)
        limit = asyncio.Semaphore(64)

        async def one(p: str) -> bytes:
            async with limit:
                return await get(p)

        c0, t0 = cpu(), time.perf_counter()
        out = await asyncio.gather(*map(one, paths))
        wall, used = time.perf_counter() - t0, cpu() - c0
        return wall, used, hashlib.sha256(b"".join(out)).hexdigest()

    try:
        print(f"{len(paths)} chunk GETs, 64 at once; CPU of this process per GET")
        digests = set()
        for r in range(args.rounds):
            for direct in (False, True):
                wall, used, digest = fsspec.asyn.sync(fs.loop, fetch, direct)
                digests.add(digest)
                name = "obstore (l5dask.core.objects)" if direct else "s3fs _cat_file"
                print(f"  round {r + 1}  {name:28s} {wall:5.2f} s  {used * 1000 / len(paths):5.2f} ms CPU a GET")
        assert len(digests) == 1, "the two ways gave different bytes"
    finally:
        proxy.kill()


if __name__ == "__main__":
    main()
