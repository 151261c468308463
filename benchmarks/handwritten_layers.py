"""Each hand-written layer of l5dask beside the maintained library it replaces (issue 46), in one
process, rounds interleaved; the layer stays only where it wins by 10% or more.

    python benchmarks/handwritten_layers.py [--part argmax,metrics,zarr3,tokens] [--rows 200000] [--scenes 400] [--rounds 5]

- ``argmax``: the label argmax of the report (``_argmax.h``, rows read in place from the records)
  against numpy's ``argmax(axis=1)`` of the records' field and of a contiguous copy; one thread,
  20,000 agents (a stored chunk) of 17 labels; the results checked equal.
- ``metrics``: the compiled L5Kit metrics (``l5dask.evaluation._metrics.row_metrics``, a loop
  over the rows) against numpy's vectorised form of L5Kit's same formulas over all rows at once
  (the arrays (rows, modes, steps) it makes on the way); the values are checked equal.
- ``zarr3``: the zarr v3 export's writer (``l5dask.prediction.columnar``, used by
  ``l5dask export --format zarr3``) against zarr-python 3 writing the same field arrays with the
  same shards, chunks and codecs (``zarr.create_array``: sharding, blosc), in a venv of its own
  (``--zarr3-python``, default ``.venv-zarr3/bin/python``: zarr-python 3 cannot be installed
  beside zarr-python 2, which L5Kit's stack needs).
- ``tokens``: the perception tables' token lookups (``l5dask.perception.links``: ``token_index``
  and ``lookup``, the hash table of ``_links.pyx``) against pyarrow's ``pc.index_in``, the link
  column of ``--rows`` rows of 32-hex tokens looked up in a table of as many (5 % not in it); one
  thread; the row indices checked equal.

The other two layers have their own scripts: the compressed gather's LZ4 against numcodecs'
blosc (``benchmarks/compressed_gather.py``) and the reads around the page cache against plain
reads (``benchmarks/direct_reads.py``, as root).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import dataset  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


# --- label argmax ----------------------------------------------------------------------------------
def part_argmax(args) -> None:
    from l5dask.core.lazy import compiled

    k = compiled("l5dask.prediction._gather")
    rng = np.random.default_rng(0)
    n = 20_000
    dt = np.dtype([("centroid", "<f8", (2,)), ("extent", "<f4", (3,)), ("label_probabilities", "<f4", (17,))])
    rec = np.zeros(n, dt)
    rec["label_probabilities"] = rng.random((n, 17)).astype(np.float32)
    flat = np.ascontiguousarray(rec["label_probabilities"])
    buf, off, out = rec.view(np.uint8).reshape(-1), dt.fields["label_probabilities"][1], np.empty(n, np.int8)
    ways = {
        "compiled (_argmax.h)": lambda: k.argmax_rows(buf, n, dt.itemsize, off, 17, out),
        "numpy, the records' field": lambda: rec["label_probabilities"].argmax(axis=1),
        "numpy, a contiguous array": lambda: flat.argmax(axis=1),
    }
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(args.rounds * 20):
        for name, fn in ways.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    assert np.array_equal(out, flat.argmax(axis=1))
    print(f"\nlabel argmax of {n:,} agents (17 labels), one thread, best of {args.rounds * 20} interleaved rounds")
    for name, v in best.items():
        print(f"  {name}: {v / n * 1e9:.2f} ns an agent ({v / best['compiled (_argmax.h)']:.2f}x)")


# --- metrics ------------------------------------------------------------------------------------------
def numpy_metrics(gt, avail, pred, conf) -> dict[str, np.ndarray]:
    """L5Kit's metric formulas (l5kit.evaluation.metrics), vectorised over the rows."""
    err = np.sum(((gt[:, None] - pred) * avail[:, None, :, None]) ** 2, axis=-1)  # (n, M, T)
    with np.errstate(divide="ignore"):
        lg = np.log(conf) - 0.5 * np.sum(err, axis=-1)  # (n, M)
    mx = lg.max(axis=1, keepdims=True)
    nll = -np.log(np.sum(np.exp(lg - mx), axis=-1)) - mx[:, 0]
    prob = np.exp(lg - mx) / np.sum(np.exp(lg - mx), axis=-1, keepdims=True)
    dist = err**0.5
    ade = np.mean(dist, axis=-1)
    fde = dist[:, :, -1]
    return {
        "neg_multi_log_likelihood": nll,
        "rmse": np.sqrt(2 * nll / pred.shape[2]),
        "prob_true_mode": prob,
        "time_displace": np.sum(prob[:, :, None] * dist, axis=1),
        "average_displacement_error_oracle": ade.min(axis=1),
        "average_displacement_error_mean": ade.mean(axis=1),
        "final_displacement_error_oracle": fde.min(axis=1),
        "final_displacement_error_mean": fde.mean(axis=1),
    }


def part_metrics(args) -> None:
    from l5dask.evaluation.metrics import row_metrics

    rng = np.random.default_rng(0)
    n, m, t = args.rows, 3, 50
    gt = rng.normal(0, 20, (n, t, 2))
    pred = gt[:, None] + rng.normal(0, 2, (n, m, t, 2))
    avail = (rng.random((n, t)) > 0.1).astype(np.float64)
    conf = rng.dirichlet(np.ones(m), n)
    a, b = row_metrics(gt, avail, pred, conf), numpy_metrics(gt, avail, pred, conf)
    worst = max(float(np.max(np.abs(a[k] - b[k]) / np.maximum(np.abs(b[k]), 1e-300))) for k in a)
    times: dict[str, list[float]] = {"compiled": [], "numpy": []}
    for _ in range(args.rounds):
        for name, fn in (("compiled", row_metrics), ("numpy", numpy_metrics)):
            t0 = time.perf_counter()
            fn(gt, avail, pred, conf)
            times[name].append(time.perf_counter() - t0)
    c, p = min(times["compiled"]), min(times["numpy"])
    print(f"\nmetrics of {n:,} rows (M={m}, T={t}), one thread, best of {args.rounds} interleaved rounds")
    print(f"  compiled row loop: {c:.3f} s   numpy vectorised: {p:.3f} s   numpy / compiled: {p / c:.2f}x")
    print(f"  largest relative difference of a value: {worst:.2e}")
    print(f"  medians: {statistics.median(times['compiled']):.3f} s, {statistics.median(times['numpy']):.3f} s")


# --- zarr v3 writer -----------------------------------------------------------------------------------
ZARR3_WRITER = r"""
import json, os, sys, time
import numpy as np
import zarr
from zarr.codecs import BloscCodec, BloscShuffle
src, out, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
spec = json.load(open(os.path.join(src, "spec.json")))
cols = {k: np.load(os.path.join(src, k + ".npy")) for k in spec}
times = []
for _ in range(rounds):
    if os.path.exists(out):
        import shutil; shutil.rmtree(out)
    t0 = time.perf_counter()
    root = zarr.open_group(out, mode="w", zarr_format=3)
    for k, s in spec.items():
        a = cols[k]
        arr = root.create_array(k, shape=a.shape, dtype=a.dtype, chunks=(s["chunk"],) + a.shape[1:],
                                shards=(s["shard"],) + a.shape[1:],
                                compressors=BloscCodec(cname=s["cname"], clevel=s["clevel"],
                                                       shuffle=BloscShuffle.shuffle, typesize=a.dtype.itemsize))
        arr[...] = a
    times.append(time.perf_counter() - t0)
print(json.dumps(times))
"""


def part_zarr3(args) -> None:
    from concurrent.futures import ThreadPoolExecutor

    import l5dask
    from l5dask.prediction import columnar
    from l5dask.prediction import format as fmt

    py = args.zarr3_python
    if not os.path.exists(py):
        print(f"\nzarr3: {py} is missing (python3 -m venv .venv-zarr3 && .venv-zarr3/bin/pip install 'zarr>=3')")
        return
    src = dataset(args.scenes)
    agents = l5dask.open_dataset(src)[fmt.AGENTS]
    rows = agents.meta.chunk_rows
    records = agents.read(0, agents.meta.nchunks)
    work = tempfile.mkdtemp(prefix="l5-zarr3-")
    try:
        spec, metas, cols = {}, {}, {}
        for f in fmt.names_of(records.dtype):
            a = np.ascontiguousarray(records[f])
            np.save(os.path.join(work, f + ".npy"), a)
            shard = rows * columnar.CHUNKS_PER_SHARD
            spec[f] = {"chunk": rows, "shard": shard, "cname": columnar.cname_of(a.dtype), "clevel": columnar.CLEVEL}
            metas[f] = columnar.FieldMeta(f, a.dtype, a.shape[1:], len(a), rows, columnar.CHUNKS_PER_SHARD)
            cols[f] = a
        with open(os.path.join(work, "spec.json"), "w") as fh:
            json.dump(spec, fh)
        del records
        mb = sum(a.nbytes for a in cols.values()) / 1e6

        def ours(out: str) -> None:
            def one(job):
                f, s = job
                m = metas[f]
                raw = columnar.encode_shard(
                    cols[f][s * m.chunk_rows * m.shard_chunks : (s + 1) * m.chunk_rows * m.shard_chunks], m
                )
                path = os.path.join(out, m.shard_key(s))
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as fh:
                    fh.write(raw)

            jobs = [(f, s) for f, m in metas.items() for s in range(-(-m.nchunks // m.shard_chunks))]
            with ThreadPoolExecutor(os.cpu_count()) as pool:
                list(pool.map(one, jobs))

        mine, theirs = [], []
        for _ in range(args.rounds):
            out = os.path.join(work, "ours.zarr")
            shutil.rmtree(out, ignore_errors=True)
            t0 = time.perf_counter()
            ours(out)
            mine.append(time.perf_counter() - t0)
            r = subprocess.run(
                [py, "-c", ZARR3_WRITER, work, os.path.join(work, "theirs.zarr"), "1"],
                capture_output=True,
                text=True,
                check=True,
            )
            theirs.append(json.loads(r.stdout)[0])
        print(f"\nzarr v3 writer: every field of the agents of {src} ({mb:.0f} MB) from memory to a local folder,")
        print(f"the same shards, chunks and codecs, all cores, best of {args.rounds} interleaved rounds")
        print(f"  l5dask's writer (columnar.encode_shard): {min(mine):.2f} s   zarr-python 3: {min(theirs):.2f} s")
        print(f"  zarr-python 3 / l5dask: {min(theirs) / min(mine):.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def part_tokens(args) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc

    from l5dask.perception.links import lookup, token_index

    rng = np.random.default_rng(0)
    n = args.rows
    table = pa.array([rng.bytes(16).hex() for _ in range(n)])
    picks = rng.integers(0, n, n)
    values = [table[int(i)].as_py() if rng.random() > 0.05 else f"{int(i):032x}" for i in picks]
    values = pa.array(values)
    ours, theirs = [], []
    for _ in range(args.rounds):
        t = time.thread_time()
        got = lookup(values, token_index(table))
        ours.append(time.thread_time() - t)
        t = time.thread_time()
        want = pc.index_in(values, value_set=table).to_numpy(zero_copy_only=False)
        theirs.append(time.thread_time() - t)
    want = np.where(np.isnan(want.astype(float)), -1, want).astype(np.int64)
    assert (got == want).all()
    print(f"tokens: {n:,} lookups in a table of {n:,} (best of {args.rounds}, one thread's CPU)")
    print(f"  l5dask (token_index + lookup): {min(ours) * 1e3:.1f} ms")
    print(f"  pyarrow pc.index_in: {min(theirs) * 1e3:.1f} ms -> {min(theirs) / min(ours):.2f}x l5dask's time")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", default="argmax,metrics,zarr3")
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--scenes", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--zarr3-python", default=os.path.join(os.path.dirname(HERE), ".venv-zarr3", "bin", "python"))
    args = ap.parse_args()
    for part in args.part.split(","):
        {"argmax": part_argmax, "metrics": part_metrics, "zarr3": part_zarr3, "tokens": part_tokens}[part](args)


if __name__ == "__main__":
    main()
