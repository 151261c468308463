"""Integer columns reduced exactly (min, max and sum in their own dtypes, the sum refused when it
does not fit, mean/var/std from the integers) and an aggregation without ``by`` whose ``where``
keeps no row (one row: count 0, sum 0, the rest NaN), through ``aggregate``, the partial cache,
the dataframe route, ``l5dask agg`` and ``l5dask run``; each against plain numpy/pandas (or exact
fractions) on the same rows."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

import l5dask
from l5dask.errors import UsageError
from l5dask.prediction import format as fmt
from l5dask.prediction.aggregation import aggregate
from l5dask.prediction.groupby import aggregation, combine_parts, empty_part, group_part, one_group, stats_of
from tests.conftest import SMALL_CHUNKS, read_all

ALL = ["count", "sum", "mean", "min", "max", "var", "std", "median", "q10"]
BASE = 2**53 + 1  # (odd offsets from 2**53: no timestamp is a float64, each rounds)


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, str]:
    """``real``: 4 synthetic scenes (nanosecond timestamps near 1.5e18: their sum overflows int64);
    ``odd``: the same with each frame's timestamp ``2**53 + 1 + 14 * i`` (none a float64; the sum of
    all fits int64, its float64 sum and each value's float64 do not equal them)."""
    root = tmp_path_factory.mktemp("exact")
    real = str(root / "real.zarr")
    l5dask.synthesize(real, num_scenes=4, seed=0, chunk_rows=SMALL_CHUNKS)
    arrays = read_all(real)
    frames = arrays[fmt.FRAMES].copy()
    frames["timestamp"] = BASE + 14 * np.arange(len(frames), dtype=np.int64)
    arrays[fmt.FRAMES] = frames
    odd = str(root / "odd.zarr")
    l5dask.write_dataset(odd, arrays, chunk_rows=SMALL_CHUNKS)
    return {"real": real, "odd": odd}


def frames_ref(path: str) -> pd.DataFrame:
    a = read_all(path)
    siv = a[fmt.SCENES]["frame_index_interval"].reshape(-1, 2)
    scene = np.repeat(np.arange(len(siv)), siv[:, 1] - siv[:, 0])
    return pd.DataFrame({"scene_index": scene, "timestamp": a[fmt.FRAMES]["timestamp"]})


def exact_mean_var(x: np.ndarray) -> tuple[float, float]:
    s = sum(Fraction(int(v)) for v in x)
    m = s / len(x)
    return float(m), float(sum((Fraction(int(v)) - m) ** 2 for v in x) / (len(x) - 1))


def test_the_odd_timestamps_round_as_float64(paths):
    """(The data reaches the edge: float64 min, max and sum of these integers are wrong.)"""
    ts = frames_ref(paths["odd"]).timestamp.to_numpy()
    assert (ts.astype(np.float64).astype(np.int64) != ts).all()
    assert int(ts.astype(np.float64).sum()) != int(ts.sum()) and sum(map(int, ts)) == int(ts.sum()) < 2**63


@pytest.mark.parametrize("by", [["scene_index"], []])
@pytest.mark.parametrize("chunks_per_task", [None, 1])
def test_integer_reductions_are_exact_and_keep_their_dtypes(paths, by, chunks_per_task, tmp_path):
    ref = frames_ref(paths["odd"])
    groups = [g for _, g in ref.groupby("scene_index")] if by else [ref]
    want = (
        ref.groupby(by).timestamp.agg(["count", "sum", "min", "max"]).reset_index()
        if by
        else ref.timestamp.agg(["count", "sum", "min", "max"]).to_frame().T.reset_index(drop=True)
    )
    for cache in (None, tmp_path / "cache", tmp_path / "cache"):  # off, then written, then read
        got = aggregate(
            paths["odd"],
            "frames",
            by=by,
            values={"timestamp": ALL},
            chunks_per_task=chunks_per_task,
            cache=None if cache is None else str(cache),
            quantile_bits=52,  # (at 12 bits these integers' quantiles are refused: below)
        )
        for r in ("count", "sum", "min", "max"):
            assert got[f"timestamp_{r}"].dtype == np.int64, r
            assert got[f"timestamp_{r}"].tolist() == [int(v) for v in want[r]], r
        for r in ("mean", "var", "std", "median", "q10"):
            assert got[f"timestamp_{r}"].dtype == np.float64, r
        for i, g in enumerate(groups):
            x = g.timestamp.to_numpy()
            m, v = exact_mean_var(x)
            # the mean: the exact one correctly rounded (numpy's float mean of the int64 values
            # rounds each value first: within 1e-15 of it, relatively)
            assert got.timestamp_mean[i] == m
            assert abs(got.timestamp_mean[i] - np.mean(x)) <= 1e-15 * abs(m)
            np.testing.assert_allclose(got.timestamp_var[i], v, rtol=1e-12)
            np.testing.assert_allclose(got.timestamp_std[i], np.sqrt(v), rtol=1e-12)
            # the quantiles: numpy's of the float64 values, to the bit (each bucket one float64)
            assert got.timestamp_median[i] == np.quantile(x.astype(np.float64), 0.5)
            assert got.timestamp_q10[i] == np.quantile(x.astype(np.float64), 0.1)
    with pytest.raises(UsageError, match=r"the q10 of timestamp cannot be exact.*quantile_bits=52"):
        aggregate(paths["odd"], "frames", by=by, values={"timestamp": ["q10"]}, chunks_per_task=chunks_per_task)


def test_the_real_timestamps_max_is_numpys_and_the_dataframes(paths):
    ref = frames_ref(paths["real"])
    want = ref.groupby("scene_index").timestamp.max()
    got = l5dask.aggregate(paths["real"], "frames", by=["scene_index"], values={"timestamp": ["max"]})
    assert got.timestamp_max.tolist() == want.tolist()
    assert any(int(float(v)) != v for v in want)  # (float64 would have been wrong)
    df = l5dask.open_dataset(paths["real"]).to_dask_dataframe("frames", columns=["timestamp"], joins=["scene_index"])
    for name in ("max", "min", "sum", "count"):
        lazy = getattr(df.groupby("scene_index").timestamp, name)()
        pd.testing.assert_series_equal(lazy.compute(), getattr(ref.groupby("scene_index").timestamp, name)())


def test_an_unsigned_column_sums_as_uint64_and_keeps_its_dtype(paths):
    agents = read_all(paths["real"])[fmt.AGENTS]
    got = aggregate(paths["real"], "agents", values={"track_id": ["sum", "min", "max", "mean"]})
    s = pd.Series(agents["track_id"])
    assert got.track_id_sum.dtype == np.uint64 and got.track_id_sum[0] == s.sum()
    assert got.track_id_min.dtype == np.uint64 and got.track_id_min[0] == s.min()
    assert got.track_id_max.dtype == np.uint64 and got.track_id_max[0] == s.max()
    assert got.track_id_mean[0] == float(Fraction(sum(map(int, s)), len(s)))


@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.int8, np.int16, np.uint16, np.int32, np.uint64, np.int64])
def test_int_stats_sums_are_exact_at_the_dtypes_extremes(dtype):
    """``int_stats``'s sums per group (booleans and 8/16-bit integers through a weighted bincount,
    the wider through two limbs) equal Python's integer sums: groups of the dtype's least and
    greatest values only, a group of both, a group of one row and a group of none."""
    from l5dask.prediction.groupby import int_stats

    info = np.iinfo(dtype) if dtype is not np.bool_ else None
    lo, hi = (False, True) if info is None else (info.min, info.max)
    n = 200_000
    rng = np.random.default_rng(11)
    codes = np.r_[np.zeros(n, np.int64), np.ones(n, np.int64), rng.integers(2, 4, n), [4]]
    values = np.r_[np.full(n, lo), np.full(n, hi), rng.choice([lo, hi], n), [hi]].astype(dtype)
    stats = int_stats(codes, values, 6, {"sum"})
    got = [int(h) * 2**32 + int(lo_) for h, lo_ in zip(stats["sum_hi"], stats["sum_lo"])]
    want = [sum(int(v) for v in values[codes == g]) for g in range(6)]
    assert got == want and all(0 <= int(x) < 2**32 for x in stats["sum_lo"])
    assert stats["n"].tolist() == np.bincount(codes, minlength=6).tolist()


@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.int8, np.int16, np.uint16, np.int32, np.uint64, np.int64])
def test_partials_of_small_integers_and_booleans_equal_pandas_over_any_split(dtype):
    rng = np.random.default_rng(5)
    n = 3_000
    key = rng.integers(0, 30, n)
    if dtype is np.bool_:
        x = rng.random(n) < 0.3
    else:
        info = np.iinfo(dtype)
        # (64-bit: values past 2**53, each float64 rounding, their sums of ~100 a group fitting)
        lo, hi = (info.min // 2, info.max // 4) if info.bits < 64 else (-(2**55) if info.min else 2**54, 2**55)
        x = rng.integers(lo, hi, n, dtype=dtype, endpoint=True)
    frame = pd.DataFrame({"k": key, "v": x})
    reds = ["count", "sum", "min", "max", "mean", "var", "std"]
    needs = {"v": {s for r in reds for s in aggregation(r).needs}}
    want = frame.groupby("k").v
    for cuts in ([], [1, 1_500], sorted(rng.integers(0, n, 7))):
        edges = [0, *cuts, n]
        part = empty_part(1, needs, {"v": x.dtype})
        for a, b in zip(edges, edges[1:]):
            part = combine_parts(part, group_part([key[a:b]], {"v": x[a:b]}, needs, 12))
        stats = stats_of(part, "v", 12)
        for r in ("count", "sum", "min", "max"):
            exp = getattr(want, r)()
            got = aggregation(r).finalize(stats)
            assert got.dtype == exp.dtype, (r, got.dtype, exp.dtype)
            assert got.tolist() == exp.tolist(), r
        for r in ("mean", "var", "std"):
            np.testing.assert_allclose(aggregation(r).finalize(stats), getattr(want, r)(), rtol=1e-12, err_msg=r)


def test_a_sum_that_does_not_fit_is_refused(paths, tmp_path):
    with pytest.raises(UsageError, match=r"^the sum of timestamp does not fit int64 in 1 group\(s\) \(e\.g\. "):
        aggregate(paths["real"], "frames", values={"timestamp": ["sum"]})
    out = tmp_path / "s.csv"
    p = _cli("agg", paths["real"], "--array", "frames", "--value", "timestamp:sum,max", "-o", str(out), "-q")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("l5dask: error: the sum of timestamp does not fit int64")
    assert p.stderr.count("\n") == 1
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cache", [False, True])
def test_no_by_and_no_row_kept_is_one_row_as_pandas(paths, tmp_path, cache):
    """Each reduction of a float, an int64 and a uint64 column without ``by``, ``where`` keeping
    no row: one row, as pandas' ``s[mask].agg([...])`` (count 0, sum 0 in the sum's dtype, the rest
    NaN; an integer's min and max NaN as float64, as pandas); with ``by``: no row, as pandas'
    groupby."""
    kw = {"cache": str(tmp_path / "c")} if cache else {}
    for _ in range(2 if cache else 1):
        got = aggregate(
            paths["odd"],
            "agents",
            values={"speed": ALL, "timestamp": ALL, "track_id": ALL},
            where="distance_to_ego < 0",
            **kw,
        )
        assert len(got) == 1
        for col, sum_dtype in (("speed", np.float64), ("timestamp", np.int64), ("track_id", np.uint64)):
            empty = pd.Series([], dtype=np.float64 if col == "speed" else sum_dtype)
            want = empty.agg(["count", "sum", "mean", "min", "max", "var", "std", "median"])
            assert got[f"{col}_count"].dtype == np.int64 and got[f"{col}_count"][0] == want["count"] == 0
            assert got[f"{col}_sum"].dtype == sum_dtype and got[f"{col}_sum"][0] == want["sum"] == 0
            for r in ("mean", "min", "max", "var", "std", "median", "q10"):
                assert got[f"{col}_{r}"].dtype == np.float64 and np.isnan(got[f"{col}_{r}"][0]), (col, r)
                assert r == "q10" or np.isnan(want[r])
    by = aggregate(paths["odd"], "agents", by=["label"], values={"speed": ALL}, where="distance_to_ego < 0", **kw)
    assert by.shape == (0, 1 + len(ALL))


def test_cli_no_by_and_no_row_kept_prints_and_writes_one_row(paths, tmp_path):
    args = ("agg", paths["odd"], "--value", "speed:count,sum,mean", "--value", "timestamp:count,sum,min,max")
    p = _cli(*args, "--where", "distance_to_ego < 0", "-q")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].split() == [
        "speed_count",
        "speed_sum",
        "speed_mean",
        "timestamp_count",
        "timestamp_sum",
        "timestamp_min",
        "timestamp_max",
    ]
    assert lines[1].split() == ["0", "0.0", "NaN", "0", "0", "NaN", "NaN"] and len(lines) == 2
    out = tmp_path / "e.csv"
    p = _cli(*args, "--where", "distance_to_ego < 0", "-o", str(out), "-q")
    assert p.returncode == 0, p.stderr
    assert pd.read_csv(out).shape == (1, 7) and pd.read_csv(out).iloc[0].tolist()[:2] == [0, 0]


def test_cli_and_a_job_write_integers_as_integers(paths, tmp_path):
    ref = frames_ref(paths["real"])
    want = ref.groupby("scene_index").timestamp.agg(["min", "max"])
    out = tmp_path / "a.csv"
    p = _cli(
        "agg", paths["real"], "--array", "frames", "--by", "scene_index", "--value", "timestamp:min,max", "-o", str(out)
    )
    assert p.returncode == 0, p.stderr
    rows = out.read_text().splitlines()[1:]
    assert [r.split(",")[1:] for r in rows] == [[str(a), str(b)] for a, b in zip(want["min"], want["max"])]
    job = tmp_path / "job.toml"
    job.write_text(
        textwrap.dedent(
            f"""\
            [datasets]
            real = "{paths["real"]}"

            [analyses.ts]
            kind = "aggregate"
            array = "frames"
            by = "scene_index"
            values = {{ timestamp = ["min", "max"] }}
            output = "{tmp_path}/job.parquet"

            [analyses.none]
            kind = "aggregate"
            values = {{ speed = ["count", "sum"], track_id = ["sum", "max"] }}
            where = "distance_to_ego < 0"
            output = "{tmp_path}/none.csv"
            """
        )
    )
    p = subprocess.run([sys.executable, "-m", "l5dask.cli", "run", str(job), "-q"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    got = pd.read_parquet(tmp_path / "job.parquet")
    assert got.timestamp_min.dtype == np.int64 and got.timestamp_max.tolist() == want["max"].tolist()
    assert got.timestamp_min.tolist() == want["min"].tolist()
    none = (tmp_path / "none.csv").read_text().splitlines()
    assert none[1].split(",")[:3] == ["0", "0", "0"] and len(none) == 2


def test_one_group_leaves_a_keyed_or_nonempty_partial_alone():
    part = group_part([], {"v": np.arange(3)}, {"v": {"n", "sum"}}, 12)
    assert one_group(part) is part
    keyed = empty_part(1, {"v": {"n"}})
    assert one_group(keyed) is keyed


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "l5dask.cli", *args], capture_output=True, text=True)


def test_a_float32_columns_min_and_max_keep_its_dtype_as_pandas(paths):
    """``min`` and ``max`` of a float32 column are float32, as pandas' groupby gives them (they came
    back float64), equal to pandas' value for value; a mean is float64 as the docs say."""
    agents = read_all(paths["real"])[fmt.AGENTS]
    got = aggregate(paths["real"], "agents", by=["scene_index"], values={"yaw": ["min", "max", "mean"]})
    frame = pd.DataFrame({"yaw": agents["yaw"]})
    assert frame.yaw.dtype == np.float32
    ds = l5dask.open_dataset(paths["real"])
    frame["scene_index"] = ds.to_dask_dataframe("agents", columns=["scene_index"]).compute()["scene_index"].values
    want = frame.groupby("scene_index").yaw.agg(["min", "max"])
    for r in ("min", "max"):
        assert got[f"yaw_{r}"].dtype == np.float32 == want[r].dtype
        np.testing.assert_array_equal(got[f"yaw_{r}"].to_numpy(), want[r].to_numpy())
    assert got.yaw_mean.dtype == np.float64


@pytest.mark.parametrize(
    "array,values,exact",
    [
        ("frames", {"num_agents": ["mean", "sum", "min", "max", "q90"], "timestamp": ["count"]}, True),
        ("agents", {"speed": ["count", "median", "q99"], "track_id": ["max", "sum"]}, True),
        ("agents", {"speed": ["mean"]}, False),  # (a float's sum: the order of its additions)
        ("agents", {"extent_length": ["min"]}, False),  # (a float's minimum: -0.0 against 0.0)
        ("frames", {"num_agents": ["var"]}, False),
    ],
)
def test_an_aggregation_declared_exact_is_the_same_bits_in_any_tasks(paths, array, values, exact):
    """An aggregation whose statistics are integers' or counts is declared ``exact`` (a run then
    groups its chunks as the passes it is fused with): its result is the same bits whatever the
    stored chunks per task; the others keep their own groups (their float sums follow them)."""
    from l5dask.prediction.aggregation import Spec, exact_spec
    from l5dask.prediction.columns import Table

    ds = l5dask.open_dataset(paths["real"])
    by = ["scene_index"] if array == "agents" else ["host", "scene_index"]
    table = Table(ds, array)
    parsed = tuple((c, tuple(r)) for c, r in values.items())
    spec = Spec(table.select([*by, *values]), tuple(by), parsed)
    assert exact_spec(spec) is exact
    if not exact:
        return
    got = [aggregate(ds, array, by=by, values=values, chunks_per_task=n) for n in (1, 2, 5)]
    for other in got[1:]:
        pd.testing.assert_frame_equal(other, got[0], check_exact=True)
    assert len(got[0]) > 1
