"""Dataset surgery (issue #11): ``l5dask concat`` and ``l5dask subset`` against their floor, and
``concat`` against L5Kit's own ``zarr_concat`` (zarr-python 2, one process), in the same run.

    python benchmarks/surgery_benchmark.py [--scenes 1700] [--rounds 3] [--no-l5kit]

- concat: the generated dataset of ``--scenes`` scenes (30 M agents at 1700) and a second one of
  30 scenes (its intervals shifted: its chunks no longer line up with the output's);
- subset: scenes 3:1650 of the first (every output chunk straddles two input chunks);
- floor: read, blosc-decode, blosc-encode and write the same output's stored chunks with all
  cores and nothing else (``copy_floor.py``), measured on each output just written;
- L5Kit: ``zarr_concat`` of the same two inputs (once; it takes minutes), when installed.

Each is a whole process (start-up, imports and planning included). Rounds are interleaved (these
shared machines change speed from one minute to the next); the best time of each is printed and
the median of the per-round ratios to the floor. Outputs are checked value-equal to the inputs'
rows (a plain numpy check) before any figure is printed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import dataset, run  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
L5KIT = """
import sys, types, importlib.util
from pathlib import Path
spec = importlib.util.find_spec("l5kit")
root = Path(list(spec.submodule_search_locations)[0])
for pkg, path in (("l5kit", root), ("l5kit.data", root / "data")):  # its __init__ imports torch
    m = types.ModuleType(pkg); m.__path__ = [str(path)]; sys.modules[pkg] = m
from l5kit.data.zarr_utils import zarr_concat
zarr_concat(sys.argv[1:-1], sys.argv[-1])
"""


def check(out: str, parts: list[tuple[str, int, int]]) -> None:
    """The output's agents are the inputs' agent rows [lo, hi), in order (sampled chunks)."""
    import l5dask

    got = l5dask.open_dataset(out)["agents"]
    pos = 0
    for path, lo, hi in parts:
        src = l5dask.open_dataset(path)["agents"]
        for r in np.linspace(lo, hi - 1, 7).astype(int):
            o = pos + r - lo
            a = got.read_chunk(o // got.meta.chunk_rows)[o % got.meta.chunk_rows]
            b = src.read_chunk(r // src.meta.chunk_rows)[r % src.meta.chunk_rows]
            assert a.tobytes() == b.tobytes(), (out, path, r)
        pos += hi - lo
    assert pos == len(got), (out, pos, len(got))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenes", type=int, default=1700)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-l5kit", action="store_true")
    args = ap.parse_args()
    big, small = dataset(args.scenes), dataset(30)
    import l5dask

    ds = l5dask.open_dataset(big)
    n_agents = len(ds["agents"])
    sc = ds["scenes"].read(0, ds["scenes"].nchunks)["frame_index_interval"]
    fr = ds["frames"]

    def agent_at(frame: int, col: int) -> int:
        return int(fr.read_chunk(frame // fr.meta.chunk_rows)["agent_index_interval"][frame % fr.meta.chunk_rows][col])

    lo_s, hi_s = 3, args.scenes - 50
    sub_rows = (agent_at(int(sc[lo_s][0]), 0), agent_at(int(sc[hi_s - 1][1]) - 1, 1))
    l5 = os.path.join(HERE, "..", ".venv", "bin", "l5dask")
    l5 = l5 if os.path.exists(l5) else "l5dask"
    tmp = tempfile.mkdtemp(prefix="l5dask-surgery-", dir=os.path.join(HERE, "data"))
    out = os.path.join(tmp, "out.zarr")
    ops = {
        "concat": (
            [l5, "concat", big, small, "--output", out, "-q"],
            [(big, 0, n_agents), (small, 0, len(l5dask.open_dataset(small)["agents"]))],
        ),
        "subset": ([l5, "subset", big, "-o", out, "--ranges", f"{lo_s}:{hi_s}", "-q"], [(big, *sub_rows)]),
    }
    times: dict[str, list[float]] = {k: [] for k in ops}
    floors: dict[str, list[float]] = {k: [] for k in ops}
    try:
        for rnd in range(args.rounds):
            for name, (cmd, parts) in ops.items():
                shutil.rmtree(out, ignore_errors=True)
                t, _ = run(cmd)
                if rnd == 0:
                    check(out, parts)
                floor_dir = os.path.join(tmp, "floor")
                shutil.rmtree(floor_dir, ignore_errors=True)
                f, _ = run([sys.executable, os.path.join(HERE, "copy_floor.py"), out, floor_dir])
                times[name].append(t)
                floors[name].append(f)
                print(f"round {rnd + 1}: {name:<7} {t:6.2f} s   floor {f:6.2f} s   ratio {t / f:5.2f}", flush=True)
        l5kit_t = None
        if not args.no_l5kit:
            import importlib.util

            if importlib.util.find_spec("l5kit") is None or importlib.util.find_spec("zarr") is None:
                print("L5Kit (and zarr-python 2) not installed: its zarr_concat is not measured")
            else:
                shutil.rmtree(out, ignore_errors=True)
                l5kit_t, _ = run([sys.executable, "-c", L5KIT, big, small, out])
                check(out, ops["concat"][1])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"\n{n_agents:,} agents ({args.scenes} scenes) + 30 scenes; {os.cpu_count()} cores; "
        f"best of {args.rounds} interleaved rounds, whole processes"
    )
    for name in ops:
        ratios = [t / f for t, f in zip(times[name], floors[name])]
        print(
            f"  l5dask {name:<7} {min(times[name]):6.2f} s   floor {min(floors[name]):6.2f} s   "
            f"median ratio {statistics.median(ratios):4.2f}x (target <= 1.5x)"
        )
    if l5kit_t is not None:
        print(
            f"  L5Kit zarr_concat {l5kit_t:6.2f} s: l5dask concat is {l5kit_t / min(times['concat']):.1f}x "
            f"faster (target >= 10x)"
        )


if __name__ == "__main__":
    main()
