"""What a command's progress costs (issue 49): short commands with and without it, whole processes.

    python benchmarks/progress_benchmark.py [--scenes 200] [--rounds 7] [--tree CHECKOUT]

On the dataset ``l5dask demo`` makes (200 scenes, 3.6 M agents): ``chop``, ``agg`` (the README's
q1) and ``stats``, each run three ways in every round, in an order that turns: ``-q`` (no
progress), progress to a log (stderr a file) and progress to a terminal (stderr a pseudo-terminal,
read as it comes). Printed: the best and the median time of each, the cost of progress (best
against best, and the median of the rounds' differences) and the goal: at most 2 % of the command
or 50 ms, whichever is larger. ``--tree``: the checkout to run (default this one; its compiled
modules built in place), e.g. an older one to see what its progress cost.
"""

from __future__ import annotations

import argparse
import os
import pty
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from aggregate_queries import CLI  # noqa: E402
from common import dataset  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("quiet", "log", "terminal")


def commands(path: str) -> dict[str, list[str]]:
    """Each command (``{tmp}``: the run's temporary folder); long option names, which older
    checkouts read the same way."""
    return {
        "chop": ["chop", path, "--frames", "100", "--future-frames", "50", "--min-future", "10", "--output", "{tmp}/c"],
        "agg": ["agg", path, *CLI["q1"], "--output", "{tmp}/q1.parquet"],
        "stats": ["stats", path, "--output", "{tmp}/r.json"],
    }


def _drain(fd: int, into: list[bytes]) -> None:
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            return
        if not chunk:
            return
        into.append(chunk)


def run(args: list[str], mode: str, tree: str) -> tuple[float, str]:
    """One whole process of ``l5dask ARGS``: (wall seconds, what it wrote on stderr)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "l5dask.cli", *[a.format(tmp=tmp) for a in args]]
        if mode == "quiet":
            cmd.append("--quiet")
        env = {**os.environ, "PYTHONPATH": tree + os.pathsep + os.environ.get("PYTHONPATH", "")}
        got: list[bytes] = []
        if mode == "terminal":
            master, slave = pty.openpty()
            reader = threading.Thread(target=_drain, args=(master, got), daemon=True)
            reader.start()
            t = time.perf_counter()
            p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=slave, env=env, cwd=tmp)
            wall = time.perf_counter() - t
            os.close(slave)
            reader.join(5)
            os.close(master)
        else:
            with open(os.path.join(tmp, "stderr"), "w+b") as err:
                t = time.perf_counter()
                p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=tmp)
                wall = time.perf_counter() - t
                err.seek(0)
                got.append(err.read())
        text = b"".join(got).decode(errors="replace")
        if p.returncode != 0:
            raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{text}")
    return wall, text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tree", default=ROOT, help="the checkout to run (default: this one)")
    parser.add_argument("--commands", default="chop,agg,stats")
    opts = parser.parse_args()
    path = dataset(opts.scenes)
    jobs = {k: v for k, v in commands(path).items() if k in opts.commands.split(",")}
    for args in jobs.values():  # (a first run of each: the page cache, .pyc files)
        run(args, "quiet", opts.tree)
    times: dict[tuple[str, str], list[float]] = {}
    logs: dict[str, str] = {}
    for r in range(opts.rounds):
        for job, args in jobs.items():
            for mode in MODES[r % 3 :] + MODES[: r % 3]:
                wall, text = run(args, mode, opts.tree)
                times.setdefault((job, mode), []).append(wall)
                if mode == "log":
                    logs[job] = text
    print(f"{opts.tree}: whole processes, {opts.rounds} interleaved rounds, {path}")
    for job in jobs:
        q = times[(job, "quiet")]
        goal = max(0.02 * min(q), 0.05)
        print(
            f"  {job:<6} -q {min(q):6.2f} s (median {statistics.median(q):.2f})   goal: progress <= {goal * 1e3:.0f} ms"
        )
        for mode in MODES[1:]:
            t = times[(job, mode)]
            diffs = [a - b for a, b in zip(t, q)]
            print(
                f"         {mode:<8} {min(t):6.2f} s (median {statistics.median(t):.2f})   costs: best-best "
                f"{(min(t) - min(q)) * 1e3:+5.0f} ms, median of rounds {statistics.median(diffs) * 1e3:+5.0f} ms"
            )
    print("what a log gets (stderr not a terminal):")
    for job, text in logs.items():
        print(f"  {job}:")
        for line in text.splitlines():
            print(f"    {line}")


if __name__ == "__main__":
    main()
