"""Helpers shared by the benchmarks: generated datasets, the decode floor, peak memory."""

from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import NamedTuple

from numcodecs import Blosc

DATA = Path(__file__).parent / "data"


def _precompile() -> None:
    """Byte-compile l5dask's source tree once, as installing a wheel does: a process that finds no
    ``.pyc`` compiles every module it imports (50 ms of each command's start here, where
    ``PYTHONDONTWRITEBYTECODE`` is set), a cost no installed user pays."""
    import compileall

    compileall.compile_dir(str(Path(__file__).parent.parent / "l5dask"), quiet=1)


_precompile()


def dataset(scenes: int, seed: int = 0) -> str:
    """A generated dataset under benchmarks/data, made once and reused."""
    import l5dask  # here, so that the decode floor's own process imports only numcodecs

    path = DATA / f"synth-{scenes}-{seed}.zarr"
    if not (path / ".zgroup").exists():
        t = time.perf_counter()
        counts = l5dask.synthesize(path, num_scenes=scenes, seed=seed, overwrite=True)
        print(f"generated {path}: {counts} in {time.perf_counter() - t:.1f} s", flush=True)
    return str(path)


def decode_floor(path: str, arrays: tuple[str, ...]) -> tuple[float, int]:
    """Read and blosc-decode every chunk file of ``arrays`` in one plain loop: (seconds, decoded bytes)."""
    codec = Blosc()
    t = time.perf_counter()
    total = 0
    for name in arrays:
        folder = os.path.join(path, name)
        for key in os.listdir(folder):
            if key.startswith("."):
                continue
            with open(os.path.join(folder, key), "rb") as f:
                total += len(codec.decode(f.read()))
    return time.perf_counter() - t, total


def best_of(n: int, fn):
    """The fastest of n runs (shared, noisy machines): (seconds, result)."""
    best = None
    for _ in range(n):
        t = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t
        if best is None or dt < best[0]:
            best = (dt, out)
    return best


#: Runs a command as its own child and writes (status, seconds, peak RSS in KB, CPU seconds, blocks
#: read from the disk) to a file; with a positive third argument, kills it (SIGKILL) after that many
#: seconds. The command's peak must be measured from a small parent: the kernel counts into a
#: child's peak RSS the memory it shared with its parent before exec (a benchmark that has just
#: generated 3 GB of data reported 3.14 GB for every command it ran).
_RUN_SHIM = """
import os, subprocess, sys, threading, time
t = time.perf_counter()
with open(sys.argv[2], "w") as out:
    p = subprocess.Popen(sys.argv[4:], stdout=out)
    timer = threading.Timer(float(sys.argv[3]), p.kill)
    if float(sys.argv[3]) > 0:
        timer.start()
    _, status, usage = os.wait4(p.pid, 0)
    timer.cancel()
with open(sys.argv[1], "w") as f:
    f.write(f"{status} {time.perf_counter() - t} {usage.ru_maxrss} {usage.ru_utime + usage.ru_stime} {usage.ru_inblock}")
"""


class Usage(NamedTuple):
    """What a whole process took: its exit status (``os.wait4``'s), wall and CPU seconds (user +
    system, all threads), peak RSS (GB), the bytes it read from the disk (GB: ``ru_inblock``, the
    kernel's count of 512-byte blocks; 0 for what came from the page cache) and its stdout."""

    status: int
    wall: float
    cpu: float
    rss_gb: float
    read_gb: float
    stdout: str


def measure(cmd: list[str], kill_after: float = 0.0) -> Usage:
    """Run a command, measured by a small parent process of its own (see ``_RUN_SHIM``); with
    ``kill_after``, killed (SIGKILL) after that many seconds if still running. A failure is not
    raised: see ``Usage.status``."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        res, out = os.path.join(tmp, "result"), os.path.join(tmp, "stdout")
        subprocess.run([sys.executable, "-c", _RUN_SHIM, res, out, str(kill_after), *cmd], check=True)
        with open(res) as f:
            status, wall, rss, cpu, blocks = f.read().split()
        with open(out) as f:
            stdout = f.read()
    return Usage(int(status), float(wall), float(cpu), int(rss) / 1e6, int(blocks) * 512 / 1e9, stdout)


def run_output(cmd: list[str]) -> tuple[str, float, float]:
    """Run a command to completion: (its stdout, wall seconds, peak RSS in GB of that process),
    measured by a small parent process of its own (see ``_RUN_SHIM``)."""
    stdout, wall, rss, _ = run_measured(cmd)
    return stdout, wall, rss


def run_measured(cmd: list[str]) -> tuple[str, float, float, float]:
    """:func:`run_output` and the CPU seconds (user + system, all threads) the process used: on a
    machine shared by many, the wall time of a process depends on its share of the cores, and
    its CPU time much less."""
    u = measure(cmd)
    if u.status != 0:
        raise SystemExit(f"failed ({u.status}): {' '.join(cmd)[:200]}")
    return u.stdout, u.wall, u.rss_gb, u.cpu


def drop_caches() -> bool:
    """Drop the page cache (after a sync), so that what is read next comes from the disk: False
    where this user may not (it needs root)."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def evict(*paths: str) -> int:
    """Put the files under ``paths`` (files or folders) out of the page cache, and only them
    (``POSIX_FADV_DONTNEED`` on each: no root needed, other users' pages stay where they are, unlike
    ``drop_caches``): what is read of them next comes from the disk. The bytes of them still in
    the page cache afterwards (pages mapped or dirty, which the kernel keeps): 0 when all went."""
    import mmap

    left = 0
    for path in paths:
        files = [path] if os.path.isfile(path) else [os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs]
        for name in files:
            fd = os.open(name, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                left += cached_pages(fd) * mmap.PAGESIZE
            finally:
                os.close(fd)
    return left


def cached_pages(fd: int) -> int:
    """Pages of the open file ``fd`` in the page cache (``mincore`` of a mapping of it: nothing is
    read by asking)."""
    import mmap

    size = os.fstat(fd).st_size
    if size == 0:
        return 0
    lib = ctypes.CDLL(None, use_errno=True)
    lib.mmap.restype = ctypes.c_void_p
    lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    addr = lib.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if addr is None or addr == ctypes.c_void_p(-1).value:
        raise OSError("mmap failed")
    try:
        pages = -(-size // mmap.PAGESIZE)
        vec = (ctypes.c_ubyte * pages)()
        if lib.mincore(addr, size, vec) != 0:
            raise OSError("mincore failed")
        return sum(b & 1 for b in bytes(vec))
    finally:
        lib.munmap(addr, size)


def run(cmd: list[str]) -> tuple[float, float]:
    """Run a command to completion: (wall seconds, peak RSS in GB of that process)."""
    _, wall, rss = run_output(cmd)
    return wall, rss


def moto_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1)
            break
        except OSError:
            time.sleep(0.2)
    return proc, f"http://127.0.0.1:{port}"


def moto_bucket(endpoint: str, bucket: str = "bench") -> dict:
    """Make ``bucket`` on the moto server at ``endpoint``; the storage options that reach it."""
    import boto3

    boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    ).create_bucket(Bucket=bucket)
    return {
        "key": "x",
        "secret": "x",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        "skip_instance_cache": True,
    }


def record(stem: str, command: str, figures: dict, note: str = "") -> Path:
    """Write a benchmark's figures to docs/figures/{stem}.json, where the docs and the README take
    them from (docs/measured.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "docs"))
    try:
        import measured
    finally:
        sys.path.pop(0)
    return measured.record(stem, command, figures, note)


def checkouts(before: str | None) -> dict[str, str]:
    """The source trees a ``--before`` comparison runs: this checkout as ``after``, and ``before``'s
    first when given."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return {"after": here} if not before else {"before": os.path.abspath(before), "after": here}


def child_json(script: str, tree: str, *args: str) -> dict:
    """Run ``script --child ARGS`` in a process of ``tree`` (first on ``PYTHONPATH``): the JSON
    object its last line prints."""
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run(
        [sys.executable, os.path.abspath(script), "--child", *args], env=env, capture_output=True, text=True
    )
    if out.returncode:
        raise SystemExit(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def print_means(title: str, got: dict[str, list[dict[str, float]]], width: int = 24) -> None:
    """A table of each key's mean over the rounds, one column a checkout."""
    keys = sorted({k for runs in got.values() for r in runs for k in r})
    print(title)
    print(f"{'':{width}}" + "".join(f"{n:>10}" for n in got))
    for k in keys:
        print(f"{k:{width}}" + "".join(f"{sum(r.get(k, 0.0) for r in got[n]) / len(got[n]):10.3f}" for n in got))
