"""Users' own aggregations: named columns, dataframes with joins, ``aggregate``, ``l5dask agg``, the
xarray accessor. Every result is compared with plain numpy/pandas on the arrays as zarr-python 2
(L5Kit's reader stack) decodes them, on data built to reach the edges: NaN values, label ties,
groups and scenes across chunk boundaries, several hosts, rows left out by ``where``."""

from __future__ import annotations

import subprocess
import sys

import dask
import numpy as np
import pandas as pd
import pytest

import l5dask
from l5dask.errors import L5DaskError
from l5dask.prediction import format as fmt
from l5dask.prediction import reading
from l5dask.prediction.aggregation import aggregate
from tests.conftest import SMALL_CHUNKS, read_all


@pytest.fixture(scope="module")
def edge_ds(tmp_path_factory) -> str:
    """8 scenes in small chunks, a fifth of the tracks with tied label probabilities, NaN in some
    velocities and extents (read-only)."""
    base = str(tmp_path_factory.mktemp("agg") / "base.zarr")
    l5dask.synthesize(base, num_scenes=8, seed=11, chunk_rows=SMALL_CHUNKS, label_ties=0.2)
    arrays = read_all(base)
    agents = arrays[fmt.AGENTS].copy()
    rng = np.random.default_rng(0)
    agents["velocity"][rng.random(len(agents)) < 0.01, 0] = np.nan
    agents["extent"][rng.random(len(agents)) < 0.01, 0] = np.nan
    arrays[fmt.AGENTS] = agents
    path = str(tmp_path_factory.mktemp("agg") / "edge.zarr")
    l5dask.write_dataset(path, arrays, chunk_rows=SMALL_CHUNKS)
    return path


@pytest.fixture(scope="module")
def ref(edge_ds) -> dict[str, pd.DataFrame]:
    """Each array's columns, computed here with plain numpy from zarr-python 2's arrays."""
    a = read_all(edge_ds)
    scenes, frames, agents, faces = (a[n] for n in fmt.ARRAY_NAMES)
    hosts = np.unique(scenes["host"])
    siv, fiv, tiv = (
        x.reshape(-1, 2)
        for x in (
            scenes["frame_index_interval"],
            frames["agent_index_interval"],
            frames["traffic_light_faces_index_interval"],
        )
    )
    scene_of_frame = np.repeat(np.arange(len(siv)), siv[:, 1] - siv[:, 0])
    frame_of_agent = np.repeat(np.arange(len(fiv)), fiv[:, 1] - fiv[:, 0])
    frame_of_face = np.repeat(np.arange(len(tiv)), tiv[:, 1] - tiv[:, 0])
    labels = list(fmt.LABELS)
    v = agents["velocity"].astype(np.float64)
    ego = frames["ego_translation"][frame_of_agent]
    ag = pd.DataFrame(
        {
            "centroid_x": agents["centroid"][:, 0],
            "centroid_y": agents["centroid"][:, 1],
            "extent_length": agents["extent"][:, 0],
            "velocity_x": agents["velocity"][:, 0],
            "track_id": agents["track_id"],
            "label": pd.Categorical.from_codes(agents["label_probabilities"].argmax(1), categories=labels),
            "speed": np.sqrt(v[:, 0] ** 2 + v[:, 1] ** 2),
            "scene_index": scene_of_frame[frame_of_agent],
            "frame_index": frame_of_agent,
            "timestamp": frames["timestamp"][frame_of_agent],
            "host": pd.Categorical(scenes["host"][scene_of_frame[frame_of_agent]], categories=hosts),
            "ego_x": ego[:, 0],
            "ego_y": ego[:, 1],
            "distance_to_ego": np.sqrt(
                (agents["centroid"][:, 0] - ego[:, 0]) ** 2 + (agents["centroid"][:, 1] - ego[:, 1]) ** 2
            ),
            "hour": (frames["timestamp"][frame_of_agent] // 3_600_000_000_000 % 24).astype(np.int8),
        }
    )
    ag.index.name = "agent_index"
    fr = pd.DataFrame(
        {
            "timestamp": frames["timestamp"],
            "agent_index_start": fiv[:, 0],
            "ego_z": frames["ego_translation"][:, 2],
            "ego_rotation_xy": frames["ego_rotation"][:, 0, 1],
            "num_agents": fiv[:, 1] - fiv[:, 0],
            "scene_index": scene_of_frame,
            "host": pd.Categorical(scenes["host"][scene_of_frame], categories=hosts),
        }
    )
    fr.index.name = "frame_index"
    tl = pd.DataFrame(
        {
            "face_id": faces["face_id"],
            "ACTIVE": faces["traffic_light_face_status"][:, 0],
            "status": pd.Categorical.from_codes(
                faces["traffic_light_face_status"].argmax(1), categories=list(fmt.TL_FACE_STATUSES)
            ),
            "frame_index": frame_of_face,
            "scene_index": scene_of_frame[frame_of_face],
        }
    )
    sc = pd.DataFrame(
        {
            "frame_index_start": siv[:, 0],
            "num_frames": siv[:, 1] - siv[:, 0],
            "host": pd.Categorical(scenes["host"], categories=hosts),
            "start_time": scenes["start_time"],
        }
    )
    return {"agents": ag, "frames": fr, "tl_faces": tl, "scenes": sc}


def _reads(monkeypatch) -> list:
    """``(array, chunk key)`` of each stored chunk read: fetched (then decoded, or its columns
    gathered straight from its bytes); a chunk decoded a second time counts as read again."""
    calls, decoded = [], set()
    fetch, decode = reading.fetch_chunks, reading.decode_chunk

    def fetching(store, meta, first, n):
        calls.extend((meta.name, str(i)) for i in range(first, first + n))
        return fetch(store, meta, first, n)

    def decoding(*a, **kw):
        key = (a[1].name, a[3])
        if key in decoded:
            calls.append(key)
        decoded.add(key)
        return decode(*a, **kw)

    monkeypatch.setattr(reading, "fetch_chunks", fetching)
    monkeypatch.setattr(reading, "decode_chunk", decoding)
    return calls


def _same_frame(got: pd.DataFrame, exp: pd.DataFrame) -> None:
    for c in exp.columns:
        g, e = got[c], exp[c]
        if isinstance(e.dtype, pd.CategoricalDtype):
            assert list(g.cat.categories) == list(e.cat.categories), c
            np.testing.assert_array_equal(g.cat.codes.to_numpy(), e.cat.codes.to_numpy(), err_msg=c)
        else:
            np.testing.assert_array_equal(g.to_numpy(), e.to_numpy(), err_msg=c)


# --- dataframes -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "array,columns,joins",
    [
        (
            "agents",
            ["centroid_x", "centroid_y", "extent_length", "velocity_x", "track_id", "label", "speed"],
            ["scene_index", "frame_index", "timestamp", "host", "ego_x", "ego_y", "distance_to_ego", "hour"],
        ),
        (
            "frames",
            ["timestamp", "agent_index_start", "ego_z", "ego_rotation_xy", "num_agents"],
            ["scene_index", "host"],
        ),
        ("tl_faces", ["face_id", "ACTIVE", "status"], ["frame_index", "scene_index"]),
        ("scenes", ["frame_index_start", "num_frames", "host", "start_time"], []),
    ],
)
def test_dataframe_columns_equal_numpy(edge_ds, ref, array, columns, joins):
    ds = l5dask.open_dataset(edge_ds)
    df = ds.to_dask_dataframe(array, columns=columns, joins=joins, chunks_per_task=2)
    stored = ds[array if array != "tl_faces" else fmt.TL_FACES]
    assert df.known_divisions and df.npartitions == -(-stored.nchunks // 2)
    assert df.divisions[0] == 0 and df.divisions[-1] == len(stored) - 1
    got = df.compute()
    assert list(got.columns) == columns + joins
    assert (
        got.index.name
        == {"agents": "agent_index", "frames": "frame_index", "tl_faces": "tl_face_index", "scenes": "scene_index"}[
            array
        ]
    )
    np.testing.assert_array_equal(got.index.to_numpy(), np.arange(len(stored)))
    _same_frame(got, ref[array][columns + joins])


def test_dataframe_default_columns_and_label_probabilities(edge_ds):
    ds = l5dask.open_dataset(edge_ds)
    df = ds.to_dask_dataframe("agents")
    assert "PERCEPTION_LABEL_CAR" in df.columns and "extent_height" in df.columns and "label" not in df.columns
    part = df.partitions[1].compute()
    raw = ds["agents"].read(0, ds["agents"].nchunks)[df.divisions[1] : df.divisions[1] + len(part)]
    assert part.index[0] == df.divisions[1] and len(part) > 0
    np.testing.assert_array_equal(part["PERCEPTION_LABEL_CAR"].to_numpy(), raw["label_probabilities"][:, 3])


def test_dataframe_is_lazy_and_reads_each_chunk_once(edge_ds, monkeypatch):
    calls = _reads(monkeypatch)
    ds = l5dask.open_dataset(edge_ds)
    df = ds.to_dask_dataframe("agents", columns=["speed", "label", "centroid_x"], joins=["scene_index", "ego_x"])
    assert calls == []  # building reads nothing
    df.compute()
    # each agent chunk once whatever the columns, frames once (the joins' pass), scenes once
    for name in (fmt.AGENTS, fmt.FRAMES, fmt.SCENES):
        got = sorted(k for n, k in calls if n == name)
        assert got == sorted(str(i) for i in range(ds[name].nchunks)), name


@pytest.mark.parametrize("nchunks,threads", [(1502, 2), (131_000, 64), (40, 2), (3, 8)])
def test_dataframe_partitions_are_sized_by_their_columns(nchunks, threads):
    """About PARTITION_BYTES of columns a partition (a records-sized one would hold 640 k rows
    whatever the columns), at least PARTITIONS_PER_THREAD partitions a thread, a chunk each at least."""
    from l5dask.core.policy import PARTITION_BYTES, PARTITIONS_PER_THREAD, collection_chunks_per_task

    rows = 20_000
    sizes = {b: collection_chunks_per_task(nchunks, threads, row_bytes=b, chunk_rows=rows) for b in (17, 150, 2000)}
    for row_bytes, per in sizes.items():
        assert per >= 1
        assert per == 1 or per * rows * row_bytes <= PARTITION_BYTES
        assert per == 1 or -(-nchunks // per) >= PARTITIONS_PER_THREAD * threads
        if nchunks >= PARTITIONS_PER_THREAD * threads * PARTITION_BYTES // (rows * row_bytes):  # bytes decide
            assert per == PARTITION_BYTES // (rows * row_bytes)
    assert sizes[17] >= sizes[150] >= sizes[2000]
    assert sizes[17] > sizes[150] or nchunks < 1000


def test_dataframe_bad_columns(edge_ds):
    ds = l5dask.open_dataset(edge_ds)
    with pytest.raises(L5DaskError, match=r"unknown column 'sped'.*the columns are: .*speed"):
        ds.to_dask_dataframe("agents", columns=["sped"])
    with pytest.raises(L5DaskError, match=r"not a join column of agents: speed; the join columns are: frame_index"):
        ds.to_dask_dataframe("agents", joins=["speed"])
    with pytest.raises(L5DaskError, match=r"unknown array 'agent'; the arrays are scenes, frames, agents, tl_faces"):
        ds.to_dask_dataframe("agent")


def test_dataframe_quantiles_exact_and_within_the_bound_without_a_shuffle(edge_ds, ref, monkeypatch):
    """``quantiles(df, by, column, q)`` on a filtered dask DataFrame, by a categorical and an
    integer column (two keys), against numpy per group: exact with 52 bits, within the stated
    bound with 7; NaN values skipped; each agent chunk read once."""
    from l5dask.prediction.dataframe import quantiles

    calls = _reads(monkeypatch)
    ds = l5dask.open_dataset(edge_ds)
    df = ds.to_dask_dataframe("agents", columns=["label", "extent_length", "speed"], joins=["scene_index"])
    df = df[df.speed > 0.5]
    qs = [0.0, 0.25, 0.5, 0.99, 1.0]
    exact = quantiles(df, ["label", "scene_index"], "extent_length", qs, quantile_bits=52)
    assert sorted(k for n, k in calls if n == fmt.AGENTS) == sorted(str(i) for i in range(ds[fmt.AGENTS].nchunks))
    bits = 7
    approx = quantiles(df, ["label", "scene_index"], "extent_length", qs, quantile_bits=bits)
    a = ref["agents"][ref["agents"].speed > 0.5]
    groups = [(k, g) for k, g in a.groupby(["label", "scene_index"], observed=True) if g.extent_length.notna().any()]
    assert len(exact) == len(approx) == len(groups) > 20
    assert list(exact.index.names) == ["label", "scene_index"] and list(exact.columns) == qs
    for i, ((label, scene), g) in enumerate(groups):
        assert exact.index[i] == (label, scene) and approx.index[i] == (label, scene)
        x = np.sort(g.extent_length.to_numpy(np.float64))
        x = x[~np.isnan(x)]
        for q in qs:
            want = np.quantile(x, q)
            assert exact[q].iloc[i] == want, (label, scene, q)
            h = (len(x) - 1) * q
            bound = 2.0 ** -(bits + 1) * max(abs(x[int(np.floor(h))]), abs(x[min(int(np.floor(h)) + 1, len(x) - 1)]))
            assert abs(approx[q].iloc[i] - want) <= bound, (label, scene, q)
    one = quantiles(df, "label", "extent_length", 0.5)
    assert one.index.name == "label" and isinstance(one.index.dtype, pd.CategoricalDtype)


@pytest.mark.parametrize("by", [["scene_index", "label"], "label", ["host", "hour", "label"], ["frame_index"]])
def test_dataframe_groupby_reductions_are_the_declared_ones_and_equal_pandas(edge_ds, by, monkeypatch):
    """``df.groupby(by, observed=True).speed.mean()`` (count, sum, min, max) of a float64 column:
    the declared aggregations merged by the engine's tree (pandas' groupby of each partition was
    a third of the query's CPU), lazy until computed, the same Series as pandas' groupby of the
    whole frame (NaN speeds skipped, a group of only NaN ones NaN, its count 0); with arguments,
    or by an unobserved category, dask's own."""
    import l5dask.prediction.dataframe as dataframe

    from .test_laziness import raise_if_dask_computes

    parts = []
    original = dataframe.group_part
    monkeypatch.setattr(dataframe, "group_part", lambda *a, **kw: parts.append(1) or original(*a, **kw))
    ds = l5dask.open_dataset(edge_ds)
    df = ds.to_dask_dataframe(
        "agents", columns=["speed", "label", "yaw"], joins=["scene_index", "frame_index", "host", "hour"]
    )
    whole = df.compute()
    assert whole.speed.isna().any()
    for name in dataframe.DECLARED:
        parts.clear()
        with raise_if_dask_computes():
            lazy = getattr(df.groupby(by, observed=True).speed, name)()
        got = lazy.compute()
        assert parts, name  # (the declared partials made it, not pandas)
        want = getattr(whole.groupby(by, observed=True).speed, name)()
        pd.testing.assert_series_equal(got, want, check_exact=False, rtol=1e-12)
    # dask's own: arguments, a float32 column, an unobserved category
    parts.clear()
    got = df.groupby(by, observed=True).speed.sum(min_count=1).compute()
    pd.testing.assert_series_equal(
        got.sort_index(), whole.groupby(by, observed=True).speed.sum(min_count=1), check_exact=False, rtol=1e-12
    )
    pd.testing.assert_series_equal(
        df.groupby(by, observed=True).yaw.mean().compute().sort_index(),
        whole.groupby(by, observed=True).yaw.mean(),
        check_exact=False,
        check_dtype=False,  # (dask's mean of float32 is float64, pandas' float32)
        rtol=1e-4,
    )
    assert not parts


def test_dataframe_declared_groupby_groups_the_stored_chunks_as_made(edge_ds, monkeypatch):
    """The declared groupby of a frame of ``to_dask_dataframe`` (or of some of its columns) groups
    its columns as each partition's stored chunks make them, a few chunks at a time: no partition
    is made (the mean speed per scene and label over 30 M agents, 1.08-1.14 -> 0.88-0.92 s of the
    compute's CPU), the same Series as pandas'. A frame whose column was assigned in place, or
    whose rows a filter chose, groups its partitions."""
    from l5dask.prediction.columns import Selection

    ds = l5dask.open_dataset(edge_ds)
    df = ds.to_dask_dataframe("agents", columns=["speed", "label", "yaw"], joins=["scene_index", "host"])
    whole = df.compute()
    made = []  # (the partitions made: their columns made whole)
    original = Selection.columns_of
    monkeypatch.setattr(Selection, "columns_of", lambda *a: made.append(1) or original(*a))
    for frame, bys in ((df, (["scene_index", "label"], ["host"])), (df[["scene_index", "label", "speed"]], ["label"])):
        for by in bys:
            got = frame.groupby(by, observed=True).speed.mean().compute()
            pd.testing.assert_series_equal(got, whole.groupby(by, observed=True).speed.mean(), rtol=1e-12)
            size = frame.groupby(by, observed=True).size().compute()
            pd.testing.assert_series_equal(size, whole.groupby(by, observed=True).size())
    assert not made
    kept = df[df.speed > 1]
    got = kept.groupby("label", observed=True).speed.max().compute()
    pd.testing.assert_series_equal(got, whole[whole.speed > 1].groupby("label", observed=True).speed.max())
    assert made
    made.clear()
    df["speed"] = df.speed * 2
    got = df.groupby(["scene_index", "label"], observed=True).speed.sum().compute()
    want = (whole.speed * 2).groupby([whole.scene_index, whole.label], observed=True).sum()
    pd.testing.assert_series_equal(got, want.rename("speed"), rtol=1e-12)
    assert made


@pytest.mark.parametrize("by", [["host", "hour", "label"], "label", ["scene_index"]])
def test_dataframe_groupby_size_of_a_filtered_frame_is_declared_and_equals_pandas(edge_ds, by, monkeypatch):
    """``df[df.distance_to_ego < 20].groupby(by, observed=True).size()`` (and a float column's
    mean) of the rows a filter keeps: the declared partials (the filtered frame is still an
    ``L5DataFrame``), lazy until computed, the same Series as pandas' of the whole frame filtered;
    a groupby of a frame derived otherwise (a new column) stays dask's."""
    import l5dask.prediction.dataframe as dataframe

    from .test_laziness import raise_if_dask_computes

    parts = []
    original = dataframe.group_part
    monkeypatch.setattr(dataframe, "group_part", lambda *a, **kw: parts.append(1) or original(*a, **kw))
    ds = l5dask.open_dataset(edge_ds)
    df = ds.to_dask_dataframe(
        "agents", columns=["label", "distance_to_ego", "speed"], joins=["host", "hour", "scene_index"]
    )
    whole = df.compute()
    near = whole[whole.distance_to_ego < 20]
    assert 0 < len(near) < len(whole)
    with raise_if_dask_computes():
        kept = df[df.distance_to_ego < 20]
        assert isinstance(kept, dataframe.L5DataFrame)
        lazy_size = kept.groupby(by, observed=True).size()
        lazy_mean = kept.groupby(by, observed=True).speed.mean()
    pd.testing.assert_series_equal(lazy_size.compute(), near.groupby(by, observed=True).size())
    assert parts
    pd.testing.assert_series_equal(
        lazy_mean.compute(), near.groupby(by, observed=True).speed.mean(), check_exact=False, rtol=1e-12
    )
    parts.clear()
    derived = df.assign(twice=df.speed * 2)
    got = derived[derived.distance_to_ego < 20].groupby(by, observed=True).size().compute()
    pd.testing.assert_series_equal(got.sort_index(), near.groupby(by, observed=True).size())
    assert not parts  # (dask's own)


def test_declared_groupby_of_any_dask_dataframe_equals_pandas():
    """The declared reductions of a dask DataFrame's float64 column by categorical and integer
    keys: groups of only NaN values (mean, min and max NaN, count 0, sum 0), rows with a missing
    category left out, categories without rows absent, as pandas' ``observed=True`` groupby."""
    import dask.dataframe as dd

    from l5dask.prediction.dataframe import DECLARED, declared_groupby
    from l5dask.prediction.groupby import AGGREGATIONS

    rng = np.random.default_rng(3)
    n = 5_000
    cats = pd.CategoricalDtype(["a", "b", "c", "d"])
    frame = pd.DataFrame(
        {
            "k": pd.Categorical.from_codes(rng.integers(-1, 3, n), dtype=cats),  # (-1: missing; "d" never)
            "j": rng.integers(-2, 5, n).astype(np.int32),
            "v": np.where(rng.random(n) < 0.2, np.nan, rng.normal(size=n)),
        }
    )
    frame.loc[frame.j == 4, "v"] = np.nan  # groups of NaN only
    ddf = dd.from_pandas(frame, npartitions=7)
    for by in (["k", "j"], ["j"], ["k"]):
        for name in DECLARED:
            want = getattr(frame.groupby(by, observed=True).v, name)()
            meta = getattr(ddf.groupby(by, observed=True).v, name)()._meta
            got = declared_groupby(ddf, by, "v", AGGREGATIONS[name], meta).compute()
            pd.testing.assert_series_equal(got, want, check_exact=False, rtol=1e-12)


#: A dataframe query and its pandas answer, in a process of its own, which then says whether
#: ``distributed`` was imported.
DATAFRAME_QUERY = """
import sys
import pandas as pd
import l5dask
df = l5dask.open_dataset(sys.argv[1]).to_dask_dataframe(
    "agents", columns=["speed", "label", "distance_to_ego"], joins=["scene_index"]
)
whole = df.compute()
got = df.groupby(["scene_index", "label"], observed=True).speed.mean().compute()
want = whole.groupby(["scene_index", "label"], observed=True).speed.mean()
pd.testing.assert_series_equal(got, want, check_exact=False, rtol=1e-12)
near = df[df.distance_to_ego < 20].groupby("label", observed=True).size().compute()
pd.testing.assert_series_equal(near, whole[whole.distance_to_ego < 20].groupby("label", observed=True).size())
assert near.sum() > 0
print("distributed" in sys.modules)
"""


def test_dataframe_computes_without_importing_distributed_unless_a_client_runs_it(edge_ds, dask_cluster):
    """With no client (``distributed`` never imported, so none can exist) a frame of
    ``to_dask_dataframe``, its declared groupby's Series and a filtered frame's compute on dask's
    threaded scheduler, equal to pandas', without importing ``distributed`` (dask imports it to
    look for a client: 0.15-0.2 s of CPU, 8% of the mean speed per scene and label over 30 M
    agents); with a default client they run on it, with ``scheduler=`` or dask's config where
    they say."""
    from distributed import Client, get_task_stream

    r = subprocess.run([sys.executable, "-c", DATAFRAME_QUERY, edge_ds], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "False"

    df = l5dask.open_dataset(edge_ds).to_dask_dataframe("agents", columns=["speed", "label"], joins=["scene_index"])
    lazy = df.groupby(["scene_index", "label"], observed=True).speed.mean()
    want = lazy.compute(scheduler="sync")
    with Client(dask_cluster.address) as client:
        with get_task_stream(client) as ts:
            got = lazy.compute()
            frame = df.compute()
        assert len(ts.data) >= 2 * df.npartitions  # (the partitions' tasks ran on the cluster)
        pd.testing.assert_series_equal(got, want)
        assert len(frame) == len(df)
    from tests.conftest import raise_if_dask_computes

    with pytest.raises(RuntimeError, match="a dask computation"), raise_if_dask_computes():
        lazy.compute()  # (dask's scheduler config is followed)


#: A query through the xarray view (the declared mean and a quantile of one probability), in a
#: process of its own, which then says whether ``distributed`` was imported.
XARRAY_QUERY = """
import sys
import numpy as np
import l5dask
ds = l5dask.open_dataset(sys.argv[1])
view = ds.joined("agents", chunks_per_task=2)
v = view.velocity.astype("float64")
speed = np.sqrt(v.sel(xy="x") ** 2 + v.sel(xy="y") ** 2)
got = speed.l5.groupby("scene_index", "label").mean().to_series().dropna()
want = l5dask.aggregate(ds, "agents", by=["scene_index", "label"], values={"speed": ["mean"]})
np.testing.assert_allclose(got.to_numpy(), want.speed_mean.to_numpy(), rtol=1e-12)
assert list(got.index.get_level_values("label")) == list(want.label.astype(str))
length = view.extent.sel(lwh="length").astype("float64")
median = length.l5.groupby("label").quantile(0.5, quantile_bits=52)
assert median.dims == ("label",) and median.coords["quantile"].ndim == 0 and float(median["quantile"]) == 0.5
both = length.l5.groupby("label").quantile([0.5, 0.9], quantile_bits=52)
np.testing.assert_array_equal(median.values, both.values[:, 0])
print("distributed" in sys.modules)
"""


def test_xarray_results_compute_without_importing_distributed_unless_a_client_runs_them(edge_ds, dask_cluster):
    """With no client (``distributed`` never imported), the declared reductions and quantiles of
    ``.l5.groupby`` give their values (``.to_series()``, ``.values``) on local threads without
    importing ``distributed`` (dask imports it to look for a client: 0.15-0.2 s of CPU of the mean
    speed per scene and label over 30 M agents); a quantile of one probability is xarray's
    squeeze of the quantiles (a scalar ``quantile`` coordinate). With a default client they run
    on it."""
    from distributed import Client, get_task_stream

    r = subprocess.run([sys.executable, "-c", XARRAY_QUERY, edge_ds], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "False"

    view = l5dask.open_dataset(edge_ds).joined("agents", chunks_per_task=2)
    lazy = view.extent.sel(lwh="length").astype(np.float64).l5.groupby("label").mean()
    want = lazy.data.compute(scheduler="sync")
    with Client(dask_cluster.address) as client:
        with get_task_stream(client) as ts:
            got = lazy.values
        assert len(ts.data) >= view.extent.data.npartitions  # (the blocks' tasks ran on the cluster)
        np.testing.assert_array_equal(got, want)


def test_dataframe_quantiles_bad_input(edge_ds):
    from l5dask.prediction.dataframe import quantiles

    df = l5dask.open_dataset(edge_ds).to_dask_dataframe("agents", columns=["label", "extent_length", "speed"])
    for args, kwargs, message in [
        (("label", "lenght", 0.5), {}, r"no column 'lenght'; the columns are: label, extent_length, speed"),
        (("speed", "extent_length", 0.5), {}, r"cannot group by 'speed' \(float64\)"),
        (("label", "label", 0.5), {}, r"quantiles of 'label' \(category\): a numeric column is needed"),
        (("label", "speed", [0.5, 1.5]), {}, r"probabilities in \[0, 1\]"),
        (("label", "speed", 0.5), {"quantile_bits": 60}, "quantile_bits must be an integer from 0 to 52"),
    ]:
        with pytest.raises(L5DaskError, match=message):
            quantiles(df, *args, **kwargs)


# --- aggregate ------------------------------------------------------------------------------
ALL = ["count", "sum", "mean", "min", "max", "var", "std"]


@pytest.mark.parametrize("chunks_per_task", [1, 3])
def test_aggregate_equals_pandas(edge_ds, ref, chunks_per_task):
    ds = l5dask.open_dataset(edge_ds)
    got = aggregate(
        ds,
        "agents",
        by=["scene_index", "label"],
        values={"speed": ALL, "extent_length": ["mean", "count"]},
        chunks_per_task=chunks_per_task,
    )
    g = ref["agents"].groupby(["scene_index", "label"], observed=True)
    exp = g.speed.agg(ALL).reset_index()
    assert len(got) == len(exp) > 8 * 3  # several labels a scene
    np.testing.assert_array_equal(got.scene_index.to_numpy(), exp.scene_index.to_numpy())
    assert list(got.label.astype(str)) == list(exp.label.astype(str))
    for r in ALL:
        np.testing.assert_allclose(got[f"speed_{r}"].to_numpy(), exp[r].to_numpy(), rtol=1e-9, atol=1e-12, err_msg=r)
    np.testing.assert_allclose(got.extent_length_mean, g.extent_length.mean().to_numpy().astype(np.float64), rtol=1e-6)
    np.testing.assert_array_equal(got.extent_length_count, g.extent_length.count().to_numpy())
    assert ref["agents"].speed.isna().any()  # NaNs were there to be skipped


def test_aggregate_where_and_three_keys(edge_ds, ref):
    ds = l5dask.open_dataset(edge_ds)
    got = aggregate(
        ds,
        "agents",
        by=["host", "hour", "label"],
        values={"speed": ["count"]},
        where="distance_to_ego < 20 and label != 'PERCEPTION_LABEL_UNKNOWN'",
    )
    a = ref["agents"]
    exp = (
        a[(a.distance_to_ego < 20) & (a.label != "PERCEPTION_LABEL_UNKNOWN")]
        .groupby(["host", "hour", "label"], observed=True)
        .speed.count()
        .reset_index()
    )
    assert len(got) == len(exp) > 0
    for c in ("host", "label"):
        assert list(got[c].astype(str)) == list(exp[c].astype(str))
    np.testing.assert_array_equal(got.hour, exp.hour)
    np.testing.assert_array_equal(got.speed_count, exp.speed)
    # counting an integer column (the rows kept in each group; no NaN to skip), with an integer
    # count of a float column beside it that has NaNs
    both = aggregate(
        ds,
        "agents",
        by=["host", "hour", "label"],
        values={"agent_index": ["count"], "speed": ["count"]},
        where="distance_to_ego < 20 and label != 'PERCEPTION_LABEL_UNKNOWN'",
    )
    rows = (
        a[(a.distance_to_ego < 20) & (a.label != "PERCEPTION_LABEL_UNKNOWN")]
        .groupby(["host", "hour", "label"], observed=True)
        .size()
        .to_numpy()
    )
    np.testing.assert_array_equal(both.agent_index_count, rows)
    np.testing.assert_array_equal(both.speed_count, exp.speed)
    assert (both.agent_index_count > both.speed_count).any()
    inlist = aggregate(
        ds,
        "agents",
        values={"track_id": ["count"]},
        where="label in ['PERCEPTION_LABEL_CAR', 'PERCEPTION_LABEL_PEDESTRIAN'] or speed > 10",
    )
    assert (
        inlist.track_id_count[0]
        == ((a.label.isin(["PERCEPTION_LABEL_CAR", "PERCEPTION_LABEL_PEDESTRIAN"])) | (a.speed > 10)).sum()
    )


@pytest.mark.parametrize(
    "by,where",
    [
        (["scene_index"], "distance_to_ego < 20"),
        (["frame_index"], "speed > 3 and label == 'PERCEPTION_LABEL_CAR'"),
        (["host", "scene_index"], "track_id % 7 == 3"),  # (sparse: whole frames and chunks left out)
        (["scene_index"], "distance_to_ego < 0"),  # (no row kept)
        (["timestamp"], "agent_index >= 0"),  # (every row kept)
    ],
)
def test_a_where_spreads_its_parents_keys_and_values_over_the_rows_it_keeps(edge_ds, ref, by, where):
    """The rows a ``where`` keeps get their frame's and scene's columns (keys and values) made for
    them alone: the same groups and statistics as pandas over the rows it keeps."""
    ds = l5dask.open_dataset(edge_ds)
    values = {"ego_x": ["mean", "max"], "timestamp": ["min"], "extent_length": ["count"]}
    got = aggregate(ds, "agents", by=by, values=values, where=where, chunks_per_task=2)
    a = ref["agents"].reset_index()
    kept = a.query(where.replace("track_id % 7", "track_id.mod(7)"), engine="python")
    exp = kept.groupby(by, observed=True).agg(
        ego_x_mean=("ego_x", "mean"),
        ego_x_max=("ego_x", "max"),
        timestamp_min=("timestamp", "min"),
        extent_length_count=("extent_length", "count"),
    )
    exp = exp.reset_index()
    assert len(got) == len(exp)
    assert (len(exp) > 0) == (where != "distance_to_ego < 0")
    for c in by:
        assert list(got[c].astype(str)) == list(exp[c].astype(str)), c
    np.testing.assert_allclose(got.ego_x_mean, exp.ego_x_mean, rtol=1e-12)
    for c in ("ego_x_max", "timestamp_min", "extent_length_count"):
        np.testing.assert_array_equal(got[c], exp[c], err_msg=c)


@pytest.mark.parametrize(
    "where,keep",
    [
        ("label == PERCEPTION_LABEL_CAR", lambda a, p: a.label == "PERCEPTION_LABEL_CAR"),
        (
            "PERCEPTION_LABEL_CAR != label and speed > 1",
            lambda a, p: (a.label != "PERCEPTION_LABEL_CAR") & (a.speed > 1),
        ),
        (
            "label in [PERCEPTION_LABEL_CAR, 'PERCEPTION_LABEL_PEDESTRIAN']",
            lambda a, p: a.label.isin(["PERCEPTION_LABEL_CAR", "PERCEPTION_LABEL_PEDESTRIAN"]),
        ),
        # the label's probability column of the same name, where it is not compared with a label
        ("PERCEPTION_LABEL_CAR > 0.5", lambda a, p: p[:, fmt.LABELS.index("PERCEPTION_LABEL_CAR")] > 0.5),
        # & and | between conditions in parentheses, as pandas' query reads them
        ("(speed > 1) & (speed < 3)", lambda a, p: (a.speed > 1) & (a.speed < 3)),
        (
            "(speed < 1) | (label == PERCEPTION_LABEL_CAR)",
            lambda a, p: (a.speed < 1) | (a.label == "PERCEPTION_LABEL_CAR"),
        ),
    ],
)
def test_where_reads_a_bare_label_name_compared_with_a_label_as_that_label(edge_ds, ref, where, keep):
    """``--where "label == PERCEPTION_LABEL_CAR"`` (unquoted in a shell) answered "PERCEPTION_LABEL_CAR
    is not a label; they are: ... PERCEPTION_LABEL_CAR ...": the name is also the column of that
    label's probability, which a label cannot be compared with, so it can only mean the label."""
    ds = l5dask.open_dataset(edge_ds)
    got = aggregate(ds, "agents", by=["scene_index"], values={"track_id": ["count"]}, where=where)
    a = ref["agents"]
    exp = a[keep(a, read_all(edge_ds)["agents"]["label_probabilities"])].groupby("scene_index").size()
    assert exp.sum() > 0
    np.testing.assert_array_equal(got.scene_index, exp.index)
    np.testing.assert_array_equal(got.track_id_count, exp.to_numpy())
    p = _cli("agg", edge_ds, "--value", "track_id:count", "--where", where, "-q")
    assert p.returncode == 0 and str(exp.sum()) in p.stdout, p.stderr


def test_aggregate_other_arrays_and_no_keys(edge_ds, ref):
    ds = l5dask.open_dataset(edge_ds)
    fr = aggregate(ds, "frames", by=["host"], values={"num_agents": ["sum", "max"]})
    exp = ref["frames"].groupby("host", observed=True).num_agents.agg(["sum", "max"])
    np.testing.assert_array_equal(fr.num_agents_sum, exp["sum"])
    np.testing.assert_array_equal(fr.num_agents_max, exp["max"])
    tl = aggregate(ds, "tl_faces", by=["status"], values={"ACTIVE": ["mean"]})
    exp = ref["tl_faces"].groupby("status", observed=True).ACTIVE.mean()
    assert list(tl.status.astype(str)) == list(exp.index.astype(str))
    np.testing.assert_allclose(tl.ACTIVE_mean, exp.to_numpy(), rtol=1e-6)
    whole = aggregate(ds, "agents", values={"speed": ["mean", "max"]})
    assert len(whole) == 1 and list(whole.columns) == ["speed_mean", "speed_max"]
    np.testing.assert_allclose(whole.speed_mean[0], ref["agents"].speed.mean(), rtol=1e-12)


def test_quantiles_exact_and_within_the_stated_bound(edge_ds, ref):
    ds = l5dask.open_dataset(edge_ds)
    a = ref["agents"]
    qs = [0.0, 0.01, 0.5, 0.9, 0.99, 1.0]
    names = [f"q{q * 100:g}" for q in qs]
    exact = aggregate(
        ds, "agents", by=["label"], values={"extent_length": names, "speed": ["median"]}, quantile_bits=52
    )
    bits = 7
    approx = aggregate(ds, "agents", by=["label"], values={"extent_length": names}, quantile_bits=bits)
    for i, (label, group) in enumerate(a.groupby("label", observed=True)):
        x = group.extent_length.to_numpy(np.float64)
        x = np.sort(x[~np.isnan(x)])
        for q, name in zip(qs, names):
            want = np.quantile(x, q)
            assert exact[f"extent_length_{name}"][i] == want, (label, q)
            h = (len(x) - 1) * q
            bound = 2.0 ** -(bits + 1) * max(abs(x[int(np.floor(h))]), abs(x[min(int(np.floor(h)) + 1, len(x) - 1)]))
            assert abs(approx[f"extent_length_{name}"][i] - want) <= bound, (label, q)
        s = group.speed.to_numpy()
        assert exact.speed_median[i] == np.median(s[~np.isnan(s)])


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_quantile_sketch_negative_values_and_zero():
    from l5dask.prediction.groupby import _sketch, sketch_quantiles

    rng = np.random.default_rng(3)
    x = np.r_[rng.normal(0, 5, 5000), 0.0, -0.0, 1e-300, -np.inf][rng.permutation(5004)]
    for bits in (52, 10):
        sk = _sketch(np.zeros(len(x), np.int64), x, bits)
        for q in (0.0, 0.001, 0.25, 0.5, 0.75, 1.0):
            got, want = sketch_quantiles(sk, 1, q, bits)[0], np.quantile(x, q)
            if q == 0:  # (on one value, -inf: numpy's lerp makes NaN of it, its median and pandas take it)
                want = np.sort(x)[0]
            if bits == 52 or not np.isfinite(want):  # exact
                np.testing.assert_equal(got, want, err_msg=str(q))
            else:
                assert (
                    abs(got - want)
                    <= 2.0 ** -(bits + 1)
                    * np.abs(np.sort(x)[[int((len(x) - 1) * q), min(int((len(x) - 1) * q) + 1, len(x) - 1)]]).max()
                )


@pytest.mark.parametrize("bits", [0, 4, 12, 30])
def test_quantiles_of_subnormals_are_within_the_absolute_bound(bits):
    """Below the smallest normal float64 the sketch's buckets are of one width, 2**-(1022 + bits):
    a quantile is within it of numpy's (the documented bound there, absolute: the bucket at zero
    stands for 0), of either sign and with normal values beside (a new user's trial: -5e-324 came
    back as -2.7e-312, beyond the relative bound the guide gave)."""
    from l5dask.prediction.groupby import _sketch, sketch_quantiles

    rng = np.random.default_rng(bits)
    tiny = np.finfo(np.float64).smallest_normal
    sub = np.r_[5e-324, -5e-324, 1e-310, -1e-310, tiny / 3, -tiny / 2, tiny * (1 - 2.0**-52)]
    for case in range(20):
        x = rng.choice(sub, rng.integers(1, 40))
        if case % 3 == 0:
            x = np.r_[x, rng.normal(0, 1e-300, 5), 0.0]
        sk = _sketch(np.zeros(len(x), np.int64), x, bits)
        for q in (0.0, 0.1, 0.5, 0.9, 1.0):
            got, want = sketch_quantiles(sk, 1, q, bits)[0], np.quantile(x, q)
            order = np.sort(x)[[int((len(x) - 1) * q), min(int((len(x) - 1) * q) + 1, len(x) - 1)]]
            bound = max(2.0 ** -(bits + 1) * np.abs(order).max(), 2.0 ** -(1022 + bits))
            assert abs(got - want) <= bound, (case, q, got, want)


def test_the_sketch_of_a_column_as_it_came_is_that_of_its_float64_buckets():
    """The sketch takes a float32 (or integer) column as it came, and the buckets of values that
    are all >= +0.0 from their bits shifted: the same (group, bucket, count) as the buckets of
    the column widened to float64 (``buckets``), with negative values, -0.0, subnormals, infinities
    and NaN (left out, also under a keep mask), over groups some of which have no rows."""
    from l5dask.prediction.groupby import buckets, group_part

    rng = np.random.default_rng(11)
    tiny = np.float32(1e-45)  # float32's smallest subnormal: a normal float64
    specials = np.array([0.0, -0.0, tiny, -tiny, np.inf, -np.inf, np.nan, 3.5], np.float32)
    for case in range(40):
        n = int(rng.integers(1, 3000))
        x = (rng.normal(0, 10, n) * (1 if case % 2 else -1) ** rng.integers(0, 2, n)).astype(np.float32)
        if case % 3 == 0:
            x = np.abs(x)
        if case % 4 == 0:
            x[rng.integers(0, n, 5)] = rng.choice(specials, 5)
        if case % 5 == 0:
            x = rng.integers(-5, 50, n).astype(np.int32)
        keys = [rng.choice([0, 2, 5, 9], n).astype(np.int64)]
        keep = rng.random(n) < 0.8 if case % 6 == 0 else None
        for bits in (12, 3, 52):
            part = group_part(keys, {"v": x}, {"v": {"sketch", "n"}}, bits, keep=keep)
            wide = x.astype(np.float64)
            ok = ~np.isnan(wide) & (True if keep is None else keep)
            want = {}
            for k, b in zip(keys[0][ok], buckets(wide[ok], bits)):
                want[(int(k), int(b))] = want.get((int(k), int(b)), 0) + 1
            groups = {int(k): i for i, k in enumerate(part.keys[:, 0])}
            g, b, c = part.sketches["v"]
            expect = sorted((groups[k], b, c) for (k, b), c in want.items())
            assert list(zip(g.tolist(), b.tolist(), c.tolist())) == expect, (case, bits)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16, ">f4"])
def test_the_sketchs_compiled_passes_equal_numpy(dtype):
    """``_sketch`` (two compiled passes, ``kernels.sketch_range``/``sketch_counts``, the sorting
    path where the table of (group, bucket) would be large) against the buckets of the rows made
    and counted by numpy: empty input, only NaN, one group, every group, groups without rows, a
    the rows of each group counted in the same pass,
    buckets spanning the whole float64 range; a code out of range refused."""
    from l5dask.prediction.groupby import _sketch, buckets

    rng = np.random.default_rng(17)

    def numpy_sketch(codes, x, bits):
        wide = x.astype(np.float64)
        ok = ~np.isnan(wide)
        pairs = np.stack([codes[ok], buckets(wide[ok], bits)], axis=1)
        if not len(pairs):
            return [], [], []
        uniq, counts = np.unique(pairs, axis=0, return_counts=True)
        return uniq[:, 0].tolist(), uniq[:, 1].tolist(), counts.tolist()

    for case in range(60):
        n = [0, 1, 7, 500, 5000][case % 5]
        ngroups = [1, 3, 40][case % 3]
        codes = rng.integers(0, ngroups, n).astype(np.int64)
        if case % 4 == 1:
            codes[:] = ngroups - 1  # one group, the last
        scale = [1.0, 1e-300, 1e300][case % 3] if np.dtype(dtype).kind == "f" and np.dtype(dtype).itemsize == 8 else 1.0
        x = (rng.normal(0, 10, n) * scale).astype(dtype)
        if np.dtype(dtype).kind == "f" and n:
            x[rng.integers(0, n, max(1, n // 20))] = np.nan
            if case % 7 == 0:
                x[:] = np.nan
            if case % 6 == 0:
                x[rng.integers(0, n, 3)] = rng.choice(np.array([0.0, -0.0, np.inf, -np.inf], dtype), 3)
        for bits in (12, 0, 52):
            rows = np.full(ngroups, 3, np.int64)
            got = _sketch(codes, x, bits, ngroups, rows)
            assert [a.tolist() for a in got] == list(numpy_sketch(codes, x, bits)), (case, bits)
            assert all(a.dtype == np.int64 for a in got)
            np.testing.assert_array_equal(rows, np.bincount(codes, minlength=ngroups) + 3)
            # the same without the group count given, nor rows counted
            if n:
                assert [a.tolist() for a in _sketch(codes, x, bits)] == [a.tolist() for a in got]
    wrong = np.array([0, 1, 5, 1], np.int64)
    for x, rows in ((np.ones(4), None), (np.ones(4), np.zeros(3, np.int64)), (np.array([1.0, np.nan, 2, 3]), None)):
        with pytest.raises(ValueError, match=r"codes must lie in \[0, 3\).* \(row 2 has code 5\)"):
            _sketch(wrong, x, 12, 3, rows=rows)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_keyed_sketch_of_every_exponent_counts_what_numpy_counts(dtype, monkeypatch):
    """A sketch of few groups is made with the table of every float64 sign and exponent (no pass
    for the values' range first): the same (group, bucket) counts as numpy's buckets of the rows,
    and as the table sized by the values' range, over infinities, zeros of both signs,
    subnormals, the largest floats and NaN."""
    from l5dask.prediction import groupby
    from l5dask.prediction.groupby import buckets, group_part

    rng = np.random.default_rng(5)
    info = np.finfo(dtype)
    edge = np.array([np.inf, -np.inf, 0.0, -0.0, info.tiny / 4, -info.tiny / 4, info.max, -info.max, np.nan], dtype)
    for case in range(12):
        n = [6000, 10, 1][case % 3]
        x = (rng.normal(0, 10, n) * [1.0, 1e-30, 1e30][case % 3]).astype(dtype)
        x[rng.integers(0, n, min(n, 9))] = edge[rng.integers(0, len(edge), min(n, 9))]
        keys = [rng.integers(3, 9, n).astype(np.int8)]
        needs = {"v": {"n", "sketch"}}
        with monkeypatch.context() as m:
            if n == 6000:  # (the table of every exponent taken: the values' range never found)
                m.setattr(groupby, "_exponents", None)
            full = group_part(keys, {"v": x}, needs, quantile_bits=7)
        with monkeypatch.context() as m:
            m.setattr(groupby, "FULL_TABLE_PAIRS", 0)  # (the values' range found first)
            ranged = group_part(keys, {"v": x}, needs, quantile_bits=7)
        wide = x.astype(np.float64)
        ok = ~np.isnan(wide)
        pairs, counts = np.unique(np.stack([keys[0][ok], buckets(wide[ok], 7)], 1), axis=0, return_counts=True)
        for part in (full, ranged):
            g, b, c = part.sketches["v"]
            got = sorted(zip(part.keys[g, 0].tolist(), b.tolist(), c.tolist()))
            assert got == sorted(zip(pairs[:, 0].tolist(), pairs[:, 1].tolist(), counts.tolist())), case


def test_quantile_of_many_zeros_is_zero():
    """Speeds are mostly exactly 0 for parked agents: a median of 0 must be 0, not the middle of
    the bucket that holds 0 (found by the demo: 2.7e-312)."""
    from l5dask.prediction.groupby import QUANTILE_BITS, _sketch, sketch_quantiles

    x = np.r_[np.zeros(700), np.linspace(0.1, 9, 300)]
    for bits in (QUANTILE_BITS, 3, 52):
        sk = _sketch(np.zeros(len(x), np.int64), x, bits)
        assert sketch_quantiles(sk, 1, 0.5, bits)[0] == 0.0
        assert sketch_quantiles(sk, 1, 0.0, bits)[0] == 0.0
        h = 0.9 * (len(x) - 1)
        assert (
            abs(sketch_quantiles(sk, 1, 0.9, bits)[0] - np.quantile(x, 0.9))
            <= 2.0 ** -(bits + 1) * np.sort(x)[int(h) + 1]
        )


def test_aggregate_reads_each_chunk_once(edge_ds, monkeypatch):
    calls = _reads(monkeypatch)
    ds = l5dask.open_dataset(edge_ds)
    aggregate(ds, "agents", by=["scene_index"], values={"speed": ["mean"], "extent_length": ["q50"]})
    for name in (fmt.AGENTS, fmt.FRAMES, fmt.SCENES):
        # the frames once too: their pass keeps the join rows the agent tasks take (small, held)
        want = sorted(str(i) for i in range(ds[name].nchunks))
        assert sorted(k for n, k in calls if n == name) == want, name


def test_a_frame_join_reads_the_frames_once_unless_their_rows_are_too_large(edge_ds, monkeypatch):
    """The agents' distance to the ego needs the frames' rows: held from the frames' pass (each
    frames chunk read once); beyond the held-rows budget, each block's rows are made again by the
    agent tasks that need them (each chunk read twice: fetched and decoded again, counted 2), and
    the result is the same bits."""
    from l5dask.core import engine

    ds = l5dask.open_dataset(edge_ds)
    query = {"by": ["scene_index", "label"], "values": {"speed": ["mean", "count"]}, "where": "distance_to_ego < 20"}
    got = {}
    for budget, times in ((engine.HELD_ROWS_BYTES, 1), (0, 3)):
        monkeypatch.setattr(engine, "HELD_ROWS_BYTES", budget)
        calls = _reads(monkeypatch)
        got[budget] = aggregate(ds, "agents", **query)
        want = sorted(str(i) for i in range(ds[fmt.FRAMES].nchunks) for _ in range(times))
        assert sorted(k for n, k in calls if n == fmt.FRAMES) == want, budget
        assert sorted(k for n, k in calls if n == fmt.AGENTS) == sorted(map(str, range(ds[fmt.AGENTS].nchunks)))
    a, b = got.values()
    pd.testing.assert_frame_equal(a, b, check_exact=True)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (
            {"by": ["scene"], "values": {"speed": ["mean"]}},
            r"unknown group column 'scene' for agents; the columns are: agent_index, centroid_x",
        ),
        ({"values": {"sped": ["mean"]}}, r"unknown value column 'sped' for agents; the columns are: .*speed"),
        (
            {"values": {"speed": ["average"]}},
            r"unknown reduction 'average' \(for speed\); they are: count, sum, mean, min, max, var, std, median, q<percent>",
        ),
        ({"values": {"speed": ["q101"]}}, r"'q101': a quantile is between q0 and q100"),
        ({"values": {"label": ["mean"]}}, r"'label' is categorical: only count applies"),
        (
            {"by": ["speed"], "values": {"speed": ["mean"]}},
            r"cannot group by 'speed' \(float64\): group by integer or categorical",
        ),
        ({"values": {}}, r"no values to aggregate"),
        (
            {"values": ["speed"]},
            r"values must map each column to its reductions, e.g. \{'speed': \['mean', 'max'\]\}, not a list",
        ),
        ({"values": {"speed": ["mean"]}, "where": "speed >"}, r"where 'speed >' does not parse: invalid syntax"),
        (
            {"values": {"speed": ["mean"]}, "where": "sped > 3"},
            r"where 'sped > 3' names unknown column 'sped'; the columns of agents are: ",
        ),
        ({"values": {"speed": ["mean"]}, "where": "__import__('os').system('true')"}, r"is not allowed"),
        (
            {"values": {"speed": ["mean"]}, "where": "label == 'CAR'"},
            r"'CAR' is not a label; they are: PERCEPTION_LABEL_NOT_SET",
        ),
        (
            {"values": {"speed": ["mean"]}, "where": "label in [CAR, PERCEPTION_LABEL_VAN]"},
            r"where 'label in \[CAR, PERCEPTION_LABEL_VAN\]': CAR is not a label; they are: PERCEPTION_LABEL_NOT_SET",
        ),
        (
            {"values": {"speed": ["mean"]}, "where": "label == speed"},
            r"where 'label == speed': label is categorical: compare it with its names",
        ),
        (
            {"values": {"speed": ["mean"]}, "where": "label > 'PERCEPTION_LABEL_CAR'"},
            r"label is categorical: compare it with == or in",
        ),
        (
            {"by": ["scene_index", "track_id"], "values": {"speed": ["count"]}, "max_groups": 1000},
            r"grouping agents by scene_index, track_id may make up to [\d,]+ groups, more than the limit of 1,000; raise max_groups",
        ),
        ({"values": {"speed": ["mean"]}, "quantile_bits": 60}, r"quantile_bits must be an integer from 0 to 52"),
        ({"values": {"speed": ["mean"]}, "where": 5}, r"^where must be a string, such as .*, not int 5$"),
        # (a scalar after in: a TypeError traceback during the pass, a new user's trial)
        ({"values": {"speed": ["mean"]}, "where": "speed in 3"}, r"^where 'speed in 3': in takes a list .*, not 3$"),
        (
            {"values": {"speed": ["mean"]}, "where": "track_id not in 7"},
            r"in takes a list of numbers or names \(\[3, 4\]\), not 7$",
        ),
        ({"values": {"speed": ["mean"]}, "where": "speed in speed"}, r"in takes a list .*, not speed$"),
        # (refused before the pass, not by it: a job's --check passed it)
        (
            {"values": {"speed": ["mean"]}, "where": "speed + 1"},
            r"^where 'speed \+ 1' is not a condition \(it gives float64 values\)$",
        ),
        (
            {"values": {"speed": ["mean"]}, "where": "label"},
            r"^where 'label' is not a condition \(it gives label names\)$",
        ),
        # (and, or and not join conditions: `not speed` kept the rows where speed is 0)
        (
            {"values": {"speed": ["mean"]}, "where": "not speed"},
            r"^where 'not speed': speed is not a condition; and, or, not",
        ),
        (
            {"values": {"speed": ["mean"]}, "where": "speed > 1 and scene_index"},
            r"^where 'speed > 1 and scene_index': scene_index is not a condition; and, or, not, & and \| join",
        ),
        ({"values": {"speed": ["mean"]}, "where": ["speed > 1"]}, r"^where must be a string, .*not list"),
        (
            {"values": {"speed": ["mean"]}, "where": "speed > 'x'"},
            r"where \"speed > 'x'\": speed is a number column \(float64\): compare it with a number, not 'x'$",
        ),
        (
            {"values": {"speed": ["mean"]}, "where": "'x' <= speed or track_id in [1, 'y']"},
            r"speed is a number column \(float64\): compare it with a number, not 'x'$",
        ),
        (
            {"values": {"speed": ["mean"]}, "where": "track_id in [1, 'y']"},
            r"track_id is a number column \(uint64\): compare it with a number, not 'y'$",
        ),
        (
            {"array": "tl_faces", "values": {"ACTIVE": ["mean"]}, "where": "face_id > 3"},
            r"where 'face_id > 3': face_id is a text column \(U16\): compare it with a string, not 3$",
        ),
        (
            {"array": "tl_faces", "values": {"ACTIVE": ["mean"]}, "where": "face_id == frame_index"},
            r"face_id is a text column \(U16\): compare it with a string, not frame_index \(a number column\)$",
        ),
        ({"by": 3, "values": {"speed": ["mean"]}}, r"by must be a column name or a list of them.*not 3$"),
        ({"values": {"speed": [1]}}, r"unknown reduction 1 \(for speed\)"),
        ({"values": {"speed": ["q50."]}}, r"unknown reduction 'q50\.' \(for speed\)"),
        ({"values": {"speed": ["mean"]}, "where": "frame_index in [[1, 2]]"}, r"in takes a list of numbers or names"),
        (  # (Python's precedence, not pandas' query's: refused, never another answer)
            {"values": {"speed": ["mean"]}, "where": "speed > 1 & speed < 3"},
            r"& and \| bind before comparisons here; join conditions with and, or",
        ),
        (
            {"values": {"speed": ["mean"]}, "where": "speed < 1 | label == 'PERCEPTION_LABEL_CAR'"},
            r"& and \| bind before comparisons here",
        ),
    ],
)
def test_aggregate_bad_input_is_refused_before_reading(edge_ds, monkeypatch, kwargs, message):
    ds = l5dask.open_dataset(edge_ds)
    calls = _reads(monkeypatch)
    array = kwargs.pop("array", "agents")
    with pytest.raises(L5DaskError, match=message):
        aggregate(ds, array, **kwargs)
    assert calls == []  # said before computing


@pytest.mark.parametrize("more", [{}, {"ACTIVE": ["median"]}])  # (the keyed pass; the one a sketch takes)
def test_count_of_a_text_column_counts_its_rows(edge_ds, ref, tmp_path, more):
    """A text column (face_id) counted: its rows, as pandas' count of a column with no null, with
    and without a where (the kept rows only); by the API and by l5dask agg."""
    tl = ref["tl_faces"]
    first = str(tl["face_id"].iloc[0])
    for where in (None, f"face_id != {first!r}"):
        rows = tl if where is None else tl[tl["face_id"] != first]
        assert len(rows) < len(tl) or where is None
        want = rows.groupby("status", observed=True)["face_id"].count()
        got = aggregate(edge_ds, "tl_faces", by=["status"], values={"face_id": ["count"], **more}, where=where)
        assert got["status"].astype(str).tolist() == [str(s) for s in want.index]
        assert got["face_id_count"].tolist() == want.tolist()
    if not more:
        p = _cli("agg", edge_ds, "-a", "tl_faces", "-b", "status", "--value", "face_id:count", "-o", tmp_path / "c.csv")
        assert p.returncode == 0, p.stderr
        want = tl.groupby("status", observed=True)["face_id"].count()
        assert pd.read_csv(tmp_path / "c.csv")["face_id_count"].tolist() == want.tolist()
        assert p.stdout == f"wrote {tmp_path / 'c.csv'}: {len(want)} group{'s' if len(want) != 1 else ''}\n"
        p = _cli("agg", edge_ds, "-a", "tl_faces", "--value", "face_id:count", "-o", tmp_path / "one.csv")
        assert p.returncode == 0 and p.stdout == f"wrote {tmp_path / 'one.csv'}: 1 group\n", (
            p.stdout
        )  # (not "1 groups")
        p = _cli("agg", edge_ds, "-a", "tl_faces", "--value", "face_id:max", "-q")
        assert p.returncode == 2 and p.stderr == "l5dask: error: 'face_id' is U16: only count applies\n"


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "l5dask.cli", *args], capture_output=True, text=True)


def test_cli_agg_writes_parquet_and_csv_equal_to_the_api(edge_ds, tmp_path):
    ds = l5dask.open_dataset(edge_ds)
    want = aggregate(
        ds,
        "agents",
        by=["scene_index", "label"],
        values={"speed": ["mean", "max", "count"]},
        where="distance_to_ego < 20",
    )
    out = tmp_path / "r.parquet"
    p = _cli(
        "agg",
        edge_ds,
        "--by",
        "scene_index,label",
        "--value",
        "speed:mean,max,count",
        "--where",
        "distance_to_ego < 20",
        "--output",
        str(out),
        "-q",
    )
    assert p.returncode == 0, p.stderr
    got = pd.read_parquet(out)
    pd.testing.assert_frame_equal(
        got.assign(label=got.label.astype(str)), want.assign(label=want.label.astype(str)), check_dtype=False
    )
    p = _cli(
        "agg",
        edge_ds,
        "--array",
        "frames",
        "--by",
        "host",
        "--value",
        "num_agents:sum",
        "-o",
        str(tmp_path / "f.csv"),
        "-q",
    )
    assert p.returncode == 0, p.stderr
    csv = pd.read_csv(tmp_path / "f.csv")
    assert list(csv.columns) == ["host", "num_agents_sum"] and csv.num_agents_sum.sum() == len(ds["agents"])


@pytest.mark.parametrize(
    "args,message",
    [
        (["--value", "speed"], r"--value 'speed': expected COLUMN:REDUCTION\[,REDUCTION...\]"),
        (
            ["--value", "speed:mean", "-o", "{tmp}/r.xlsx"],
            r"unknown table format '.xlsx'; name the file \*.parquet or \*.csv",
        ),
        (["--value", "speed:mean", "-o", "{tmp}/missing/r.parquet"], r"the folder .*missing does not exist"),
        (["--by", "nope", "--value", "speed:mean"], r"unknown group column 'nope' for agents"),
        (["--value", "speed:mean", "--where", "speed >>> 2"], r"does not parse"),
    ],
)
def test_cli_agg_bad_input_one_line(edge_ds, tmp_path, args, message):
    import re

    p = _cli("agg", edge_ds, *[a.replace("{tmp}", str(tmp_path)) for a in args], "-q")
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("l5dask: error: ") and re.search(message, lines[0]), p.stderr
    assert list(tmp_path.iterdir()) == []  # no output, not even a partial one


# --- xarray ---------------------------------------------------------------------------------
def test_xarray_groupby_join_coordinates_without_labels(edge_ds, monkeypatch):
    ds = l5dask.open_dataset(edge_ds)
    view = ds.joined("agents", chunks_per_task=2)
    v = view.velocity.astype(np.float64)
    speed = np.sqrt(v.sel(xy="x") ** 2 + v.sel(xy="y") ** 2)
    with pytest.raises(ValueError, match="labels"):  # xarray alone asks for labels
        speed.groupby("scene_index").mean()
    calls = _reads(monkeypatch)
    got = speed.l5.groupby("scene_index", "label").mean().to_series().dropna()
    # one decode per chunk: agents (the variable and the label coordinate share them), frames, scenes
    for name in (fmt.AGENTS, fmt.FRAMES, fmt.SCENES):
        assert sorted(k for n, k in calls if n == name) == sorted(str(i) for i in range(ds[name].nchunks)), name
    want = aggregate(ds, "agents", by=["scene_index", "label"], values={"speed": ["mean"]})
    np.testing.assert_allclose(got.to_numpy(), want.speed_mean.to_numpy(), rtol=1e-12)
    assert list(got.index.get_level_values("label")) == list(want.label.astype(str))


def test_xarray_quantiles_and_categorical_names(edge_ds, ref):
    ds = l5dask.open_dataset(edge_ds)
    view = ds.joined("agents")
    length = view.extent.sel(lwh="length").astype(np.float64)
    got = length.l5.groupby("label").quantile([0.5, 0.99], quantile_bits=52)
    assert got.dims == ("label", "quantile") and got.label.values[3] == "PERCEPTION_LABEL_CAR"
    for label, group in ref["agents"].groupby("label", observed=True):
        x = group.extent_length.to_numpy(np.float64)
        np.testing.assert_array_equal(got.sel(label=label).values, np.quantile(x[~np.isnan(x)], [0.5, 0.99]))
    near = view.centroid.sel(xy="x") - view.ego_translation.sel(xyz="x")
    by_host = (near > 0).l5.groupby("host", "hour").sum()
    a = ref["agents"]
    exp = (a.centroid_x - a.ego_x > 0).groupby([a.host, a.hour], observed=True).sum()
    np.testing.assert_array_equal(
        by_host.to_series().loc[exp.index.map(lambda k: (str(k[0]), k[1]))].to_numpy(), exp.to_numpy()
    )


def test_xarray_expressions_over_the_view_compute_nothing(edge_ds, ref):
    """The distance to the ego from x and y and a groupby of it stay lazy (no scheduler is called
    until the result is asked for): the operands' coordinates are the same arrays, so xarray has
    nothing to compare (``ego_translation`` as a coordinate made it compute the column twice)."""
    import dask

    def refuse(*args, **kwargs):
        raise AssertionError("computed while building")

    view = l5dask.open_dataset(edge_ds).joined("agents")
    with dask.config.set(scheduler=refuse):
        dx = view.centroid.sel(xy="x") - view.ego_translation.sel(xyz="x")
        dy = view.centroid.sel(xy="y") - view.ego_translation.sel(xyz="y")
        near = np.sqrt(dx * dx + dy * dy) < 20
        lazy = near.l5.groupby("host", "hour", "label").sum()
    a = ref["agents"]
    exp = (
        (np.hypot(a.centroid_x - a.ego_x, a.centroid_y - a.ego_y) < 20)
        .groupby([a.host, a.hour, a.label], observed=True)
        .sum()
    )
    got = lazy.to_series()
    np.testing.assert_array_equal(
        got.loc[exp.index.map(lambda k: (str(k[0]), k[1], str(k[2])))].to_numpy(), exp.to_numpy()
    )
    assert got.sum() == exp.sum()


def test_xarray_declared_reductions_equal_xarrays_own(edge_ds):
    """``.l5.groupby(...).mean()`` (and count, sum, min, max) of a dask-backed float64 or bool
    variable come from the declared aggregations in one pass and the engine's tree: the same
    DataArray as xarray's own groupby (flox) makes, its NaN where xarray's are (a group without
    rows, one whose values are all NaN: count's NaN, sum's 0), names, dims, coordinates and
    attributes alike; lazy until computed; with arguments, xarray's."""
    import xarray as xr

    from l5dask.prediction.accessor import name_categories

    view = l5dask.open_dataset(edge_ds).joined("agents", chunks_per_task=2)
    v = view.velocity.astype(np.float64)
    speed = np.sqrt(v.sel(xy="x") ** 2 + v.sel(xy="y") ** 2)
    speed = speed.where(speed > 0.5)  # groups whose values are all NaN
    for obj, names in ((speed, ("scene_index", "label")), (speed < 1, ("host", "hour", "label")), (speed, ("label",))):
        grouped = obj.l5.groupby(*names)
        for op in ("mean", "sum", "count", "min", "max"):
            if obj.dtype == bool and op in ("min", "max"):
                continue
            with dask.config.set(scheduler=_refuse):
                got = getattr(grouped, op)()
            assert len(dict(got.data.__dask_graph__())) > obj.data.npartitions  # a graph, not a result
            want = name_categories(getattr(obj.groupby(obj.l5.groupers(*names)), op)())
            got, want = got.compute(), want.compute()
            xr.testing.assert_identical(got.isnull(), want.isnull())
            xr.testing.assert_allclose(got, want, rtol=1e-12)
            xr.testing.assert_identical(got.fillna(0) * 0, want.fillna(0) * 0)  # names, coords, attrs
            assert got.dtype == want.dtype, (names, op)
            if obj.dtype == bool:
                np.testing.assert_array_equal(got.values, want.values)
        np.testing.assert_array_equal(
            grouped.sum(skipna=False).values, obj.groupby(obj.l5.groupers(*names)).sum(skipna=False).values
        )


def test_xarray_declared_reductions_make_no_xarray_groupby(edge_ds, monkeypatch):
    """``.l5.groupby(...).mean()`` (a declared reduction) never makes xarray's GroupBy, which
    builds the index of every combination of the groups' labels (0.02-0.07 s for scenes x labels
    over 30 M agents); a reduction with arguments, or one that is not declared, makes it, once."""
    import xarray as xr

    made = []
    original = xr.DataArray.groupby
    monkeypatch.setattr(xr.DataArray, "groupby", lambda self, *a, **kw: made.append(1) or original(self, *a, **kw))
    ds = l5dask.open_dataset(edge_ds)
    view = ds.joined("agents", chunks_per_task=2)
    v = view.velocity.astype(np.float64)
    speed = np.sqrt(v.sel(xy="x") ** 2 + v.sel(xy="y") ** 2)
    grouped = speed.l5.groupby("scene_index", "label")
    got = grouped.mean().to_series().dropna()
    assert not made
    want = aggregate(ds, "agents", by=["scene_index", "label"], values={"speed": ["mean"]})
    np.testing.assert_allclose(got.to_numpy(), want.speed_mean.to_numpy(), rtol=1e-12)
    total = grouped.sum(skipna=False)  # (xarray's own)
    assert len(made) == 1
    assert grouped.std().shape == total.shape
    assert len(made) == 1
    assert "DataArrayGroupBy" in repr(grouped)


def test_xarray_declared_reductions_leave_out_keys_that_are_no_label():
    """Keys outside a coordinate's known values (its CF ``flag_values``, not a range; its
    ``valid_range``) are left out of every group by the declared path, as xarray's groupers leave
    them out: the same results as xarray's own groupby."""
    import dask.array as da
    import xarray as xr

    import l5dask.prediction.accessor  # noqa: F401 - registers .l5 (opening a dataset's views does)

    rng = np.random.default_rng(5)
    n = 20_000
    a, b = rng.integers(-2, 9, n).astype(np.int16), rng.integers(0, 6, n).astype(np.int64)
    x = rng.normal(size=n)
    x[rng.random(n) < 0.1] = np.nan
    obj = xr.DataArray(
        da.from_array(x, chunks=3_000),
        dims="row",
        coords={
            "a": ("row", da.from_array(a, chunks=3_000), {"flag_values": np.array([0, 2, 5, 7])}),
            "b": ("row", da.from_array(b, chunks=3_000), {"valid_range": np.array([1, 4])}),
        },
    )
    for op in ("sum", "count", "mean", "max"):
        got = getattr(obj.l5.groupby("a", "b"), op)().compute()
        want = getattr(obj.groupby(obj.l5.groupers("a", "b")), op)().compute()
        xr.testing.assert_allclose(got, want, rtol=1e-12)
        xr.testing.assert_identical(got.isnull(), want.isnull())
    keep = np.isin(a, [0, 2, 5, 7]) & (b >= 1) & (b <= 4)
    np.testing.assert_allclose(float(obj.l5.groupby("a", "b").sum().sum()), np.nansum(x[keep]), rtol=1e-12)


def _refuse(*args, **kwargs):
    raise AssertionError("computed while building")


def test_declared_aggregations_equal_pandas_over_any_split():
    """Each declared aggregation, finalized from partials of any split of the rows merged in
    order, equals pandas' (or numpy's quantile, with ``quantile_bits=52``) on integer and float
    values with NaN, empty and all-NaN groups."""
    from l5dask.prediction.groupby import AGGREGATIONS, aggregation, combine_parts, group_part, stats_of

    rng = np.random.default_rng(3)
    n = 5_000
    key = rng.integers(0, 40, n)
    key[key == 7] = 8  # a key without rows
    x = rng.normal(size=n) * 10
    x[rng.random(n) < 0.05] = np.nan
    x[key == 9] = np.nan  # a group of NaN only
    names = [*AGGREGATIONS, "q0", "q10", "q99.5", "q100"]
    needs = {"v": {s for r in names for s in aggregation(r).needs}}
    frame = pd.DataFrame({"k": key, "v": x})
    want = frame.groupby("k").v.agg(["count", "sum", "mean", "min", "max", "var", "std", "median"])
    for cuts in ([], [1, 2, 2_500], sorted(rng.integers(0, n, 9))):
        edges = [0, *cuts, n]
        parts = [group_part([key[a:b]], {"v": x[a:b]}, needs, 52) for a, b in zip(edges, edges[1:])]
        part = parts[0]
        for p in parts[1:]:
            part = combine_parts(part, p)
        np.testing.assert_array_equal(part.keys[:, 0], want.index.to_numpy())
        stats = stats_of(part, "v", 52)
        for r in names:
            got = aggregation(r).finalize(stats)
            if r.startswith("q"):
                q = aggregation(r).q
                exp = [np.quantile(g.dropna(), q) if g.notna().any() else np.nan for _, g in frame.groupby("k").v]
                np.testing.assert_array_equal(got, exp, err_msg=r)
            elif r == "count":
                np.testing.assert_array_equal(got, want[r].to_numpy(), err_msg=r)
            else:
                np.testing.assert_allclose(got, want[r].to_numpy(), rtol=1e-9, atol=1e-9, err_msg=r)


def test_keys_come_back_in_their_columns_dtype_and_order_as_pandas_gives_them(tmp_path):
    """Group keys in their column's dtype (``hour`` int8, ``track_id`` uint64), sorted as pandas
    sorts them: a track id from 2**63 on is no negative number sorted first (it was, cast to int64)."""
    base = str(tmp_path / "base.zarr")
    l5dask.synthesize(base, num_scenes=3, seed=2, chunk_rows=SMALL_CHUNKS)
    arrays = read_all(base)
    agents = arrays[fmt.AGENTS].copy()
    big = np.array([2**64 - 1, 2**63, 2**63 + 5, 2**63 - 1], np.uint64)
    agents["track_id"][: len(big) * 50] = np.repeat(big, 50)
    arrays[fmt.AGENTS] = agents
    path = str(tmp_path / "big.zarr")
    l5dask.write_dataset(path, arrays, chunk_rows=SMALL_CHUNKS)
    got = l5dask.aggregate(path, "agents", by=["track_id"], values={"extent_length": ["count"]})
    ref = pd.DataFrame({"t": agents["track_id"], "x": agents["extent"][:, 0]}).groupby("t").x.count()
    assert got["track_id"].dtype == np.uint64
    np.testing.assert_array_equal(got["track_id"].to_numpy(), ref.index.to_numpy())
    np.testing.assert_array_equal(got["extent_length_count"].to_numpy(), ref.to_numpy())
    frames = arrays[fmt.FRAMES]
    got = l5dask.aggregate(path, "frames", by=["hour"], values={"num_agents": ["max"]})
    hour = ((frames["timestamp"] // 3_600_000_000_000) % 24).astype(np.int8)
    ref = pd.DataFrame({"h": hour, "n": np.diff(frames["agent_index_interval"], axis=1)[:, 0]}).groupby("h").n.max()
    assert got["hour"].dtype == ref.index.dtype == np.int8
    np.testing.assert_array_equal(got["hour"].to_numpy(), ref.index.to_numpy())
    np.testing.assert_array_equal(got["num_agents_max"].to_numpy(), ref.to_numpy())


def test_infinities_give_pandas_variance_and_the_order_statistic_quantiles_over_any_split():
    """A group holding an infinity has no variance (NaN, as pandas and numpy: it was inf or 0
    within a chunk, its deviations inf - inf taken as 0); a quantile that falls on one value is
    that value, an infinity too (the median of [1, 2, inf] is 2; numpy's formula makes NaN of
    ``x + inf * 0``), else numpy's linear formula; the same over any split of the rows and at
    any ``quantile_bits`` (an infinity's bucket holds it alone)."""
    import warnings

    from l5dask.prediction.groupby import aggregation, combine_parts, group_part, stats_of

    inf = np.inf
    groups = [[1.0, inf], [inf, inf], [-inf, inf, 1.0], [1.0, 2.0, inf], [-inf, 1.0, 2.0], [3.0, -inf], [inf],
              [-inf], [1.0, 5.0, 2.0], [np.nan, inf, 4.0], [2.0, 2.0, inf, inf]]  # fmt: skip
    key = np.concatenate([np.full(len(g), i) for i, g in enumerate(groups)])
    x = np.concatenate(groups)
    order = np.random.default_rng(1).permutation(len(x))
    key, x = key[order], x[order]
    qs = [0, 0.25, 0.5, 0.75, 1]
    names = ["var", "std", "median", "min", "max", *(f"q{q * 100:g}" for q in qs)]
    needs = {"v": {s for r in names for s in aggregation(r).needs}}
    frame = pd.DataFrame({"k": key, "v": x})
    want = frame.groupby("k").v.agg(["var", "std", "min", "max"])

    def quantile(values: np.ndarray, q: float) -> float:
        v = np.sort(values[~np.isnan(values)])
        h = (len(v) - 1) * q
        lo = int(np.floor(h))
        hi, t = min(lo + 1, len(v) - 1), h - lo
        if t == 0 or v[lo] == v[hi]:
            return v[lo]
        with np.errstate(invalid="ignore"):
            return v[hi] - (v[hi] - v[lo]) * (1 - t) if t >= 0.5 else v[lo] + (v[hi] - v[lo]) * t

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no numpy warning reaches a user for an infinity)
        for bits in (12, 52):
            for cuts in ([], [1, 5], list(range(1, len(x)))):
                edges = [0, *cuts, len(x)]
                part = None
                for a, b in zip(edges, edges[1:]):
                    p = group_part([key[a:b]], {"v": x[a:b]}, needs, bits)
                    part = p if part is None else combine_parts(part, p)
                stats = stats_of(part, "v", bits)
                for r in ("var", "std", "min", "max"):  # (NaN where pandas says NaN; the others close)
                    got, exp = aggregation(r).finalize(stats), want[r].to_numpy()
                    np.testing.assert_array_equal(np.isnan(got), np.isnan(exp), err_msg=(r, bits, cuts))
                    np.testing.assert_allclose(got, exp, rtol=1e-12, err_msg=r)
                for r, q in [("median", 0.5)] + [(f"q{q * 100:g}", q) for q in qs]:
                    exp = [quantile(np.array(g), q) for g in groups]
                    got = aggregation(r).finalize(stats)
                    finite = np.isfinite(exp)
                    np.testing.assert_array_equal(got[~finite], np.array(exp)[~finite], err_msg=(r, bits, cuts))
                    np.testing.assert_allclose(got[finite], np.array(exp)[finite], rtol=2.0**-bits, err_msg=r)


@pytest.mark.parametrize("width", [0, 1, 2, 3])
def test_merge_keys_is_numpys_unique_of_both_tables(width):
    """The combine's union of two partials' sorted keys, and where each row went, equal
    ``np.unique(axis=0)`` of the two tables: negative keys, one side empty, ranges that fit one
    int64 code and ranges that do not (2**62 and more)."""
    from l5dask.prediction.groupby import merge_keys

    rng = np.random.default_rng(width)

    def table(n, hi):
        return np.unique(rng.integers(-hi, hi, (n, width)), axis=0) if width else np.zeros((min(n, 1), 0), np.int64)

    for hi in (2, 1_000, 2**40, 2**62):
        for na, nb in ((0, 5), (7, 0), (1, 1), (300, 200), (50, 400)):
            ka, kb = table(na, hi), table(nb, hi)
            both = np.concatenate([ka, kb])
            if width and len(both):
                want, inv = np.unique(both, axis=0, return_inverse=True)
            else:  # (no keys: one group, if any rows; numpy's unique takes no 0-column table)
                want, inv = np.zeros((min(len(both), 1), width), np.int64), np.zeros(len(both), np.int64)
            keys, ia, ib = merge_keys(ka, kb)
            np.testing.assert_array_equal(keys, want)
            np.testing.assert_array_equal(np.concatenate([ia, ib]), inv.reshape(-1))
            np.testing.assert_array_equal(keys[ia], ka)
            np.testing.assert_array_equal(keys[ib], kb)


def test_declared_aggregations_by_several_keys_over_any_split():
    """Partials grouped by three keys (a small range, negative values, a range past what a
    mixed-radix code holds) merged in order equal pandas' groupby of all rows."""
    from l5dask.prediction.groupby import aggregation, combine_parts, group_part, stats_of

    rng = np.random.default_rng(8)
    n = 6_000
    for third in (rng.integers(0, 3, n), rng.integers(-(2**62), 2**62, n) // 2**58 * 2**58):
        keys = [rng.integers(0, 30, n), rng.integers(-4, 2, n).astype(np.int8), third]
        x = rng.normal(size=n)
        x[rng.random(n) < 0.05] = np.nan
        needs = {"v": {"n", "sum", "min", "max"}}
        frame = pd.DataFrame({"a": keys[0], "b": keys[1], "c": keys[2], "v": x})
        want = frame.groupby(["a", "b", "c"]).v.agg(["size", "count", "sum", "min", "max"])
        for cuts in ([], [1, 3_000], sorted(rng.integers(0, n, 12))):
            edges = [0, *cuts, n]
            parts = [group_part([k[a:b] for k in keys], {"v": x[a:b]}, needs) for a, b in zip(edges, edges[1:])]
            part = parts[0]
            for p in parts[1:]:
                part = combine_parts(part, p)
            np.testing.assert_array_equal(part.keys, np.array(want.index.to_list()))
            np.testing.assert_array_equal(part.rows, want["size"].to_numpy())
            stats = stats_of(part, "v", 12)
            np.testing.assert_array_equal(aggregation("count").finalize(stats), want["count"].to_numpy())
            for r in ("sum", "min", "max"):
                np.testing.assert_allclose(aggregation(r).finalize(stats), want[r].to_numpy(), rtol=1e-12, err_msg=r)


@pytest.mark.parametrize("nkeys", [1, 2, 3, 4])
def test_keyed_reduce_equals_numpy(nkeys):
    """``keyed_reduce`` (the group codes made as the loop goes) against numpy's codes,
    ``np.bincount`` (counts, sums in row order: bit for bit) and ``np.minimum.at``/``np.maximum.at``:
    keys of every integer type (uint64 and bool widened), one to four keys, NaN values, float32 and
    float64 values, no values (rows only), one group, every group, empty input, more rows than the
    kernel's slice of codes; a group out of range refused."""
    from l5dask.prediction.kernels import keyed_reduce

    rng = np.random.default_rng(nkeys)
    types = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, bool]
    for case in range(24):
        n = [0, 1, 9, 3000][case % 4]
        keys, los, spans = [], [], []
        for j in range(nkeys):
            t = types[(case + j) % len(types)]
            lo = 0 if (np.dtype(t).kind in "ub") else int(rng.integers(-5, 5))
            span = 1 if case % 5 == 0 else (2 if t is bool else int(rng.integers(1, 7)))
            keys.append((rng.integers(0, span, n) + lo).astype(t))
            los.append(lo)
            spans.append(span)
        strides = [int(np.prod(spans[j + 1 :])) for j in range(nkeys)]
        ngroups = int(np.prod(spans))
        codes = sum(((k.astype(np.int64) - lo) * st for k, lo, st in zip(keys, los, strides)), np.zeros(n, np.int64))
        size = ngroups
        for dtype in (np.float64, np.float32, None):
            v = None if dtype is None else (rng.normal(size=n) * 100).astype(dtype)
            if v is not None and n:
                v[rng.random(n) < 0.1] = np.nan
            out = (np.zeros(size, np.int64), np.zeros(size), np.full(size, np.inf), np.full(size, -np.inf))
            rows = np.full(size, 2, np.int64)
            keyed_reduce(keys, los, strides, n, out, v, rows)
            np.testing.assert_array_equal(rows, np.bincount(codes, minlength=size) + 2)
            if v is None:
                assert not out[0].any()
                continue
            w = v.astype(np.float64)
            ok = ~np.isnan(w)
            c, x = codes[ok], w[ok]
            lo_, hi_ = np.full(size, np.inf), np.full(size, -np.inf)
            np.minimum.at(lo_, c, x)
            np.maximum.at(hi_, c, x)
            assert out[0].tobytes() == np.bincount(c, minlength=size).astype(np.int64).tobytes()
            assert out[1].tobytes() == np.bincount(c, weights=x, minlength=size).tobytes()
            assert out[2].tobytes() == lo_.tobytes() and out[3].tobytes() == hi_.tobytes()
    keys = [np.array([0, 1, 5, 1], np.int8)]
    with pytest.raises(ValueError, match=r"keyed_reduce: row 2's group is not in \[0, 3\)"):
        keyed_reduce(keys, [0], [1], 4, (np.zeros(3, np.int64), None, None, None), np.ones(4))
    far = np.zeros(5000, np.int16)
    far[4321] = 3  # (in the kernel's third slice of codes: the rows before it counted)
    count = np.zeros(3, np.int64)
    with pytest.raises(ValueError, match=r"keyed_reduce: row 4321's group is not in \[0, 3\)"):
        keyed_reduce([far], [0], [1], 5000, (count, None, None, None), np.ones(5000))
    assert count[0] == 4321
    with pytest.raises(ValueError, match="keyed_reduce: keys and values of 5 rows"):
        keyed_reduce(keys, [0], [1], 5, (np.zeros(3, np.int64), None, None, None))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, bool])
def test_the_codes_of_one_dense_key_are_made_in_one_compiled_pass(dtype):
    """One key of a small range (a quantile's ``label``): its codes ``k - lo`` made by one compiled
    pass (``kernels.range_codes``, where numpy made four arrays of the rows), numpy's codes and key
    table; two keys, and a key too sparse for dense codes, keep numpy's path (the same codes)."""
    from l5dask.prediction import groupby, kernels

    rng = np.random.default_rng(12)
    n = 5_003
    lo = 0 if dtype is bool or np.dtype(dtype).kind == "u" else -3
    k = rng.integers(lo, 2 if dtype is bool else 17, n).astype(dtype)
    calls = []
    with pytest.MonkeyPatch.context() as m:
        m.setattr(groupby, "range_codes", lambda *a: calls.append(a[1:]) or kernels.range_codes(*a))
        codes, ngroups, table = groupby.encode([k], n)
        two = groupby.encode([k, k], n)
        sparse = groupby.encode([k.astype(np.int64) * 10**6], n)
    wide = k.astype(np.int64)
    assert calls == [(int(wide.min()), int(wide.max()) - int(wide.min()) + 1)]
    assert codes.dtype == np.int64 and codes.tobytes() == (wide - wide.min()).tobytes()
    assert ngroups == int(wide.max()) - int(wide.min()) + 1
    np.testing.assert_array_equal(table[:, 0], np.arange(wide.min(), wide.max() + 1))
    np.testing.assert_array_equal(two[2][two[0]], np.stack([wide, wide], 1))
    np.testing.assert_array_equal(sparse[2][sparse[0], 0], wide * 10**6)


def test_group_part_of_dense_keys_equals_numpy_bit_for_bit():
    """A partial of dense keys (``keyed_reduce``, no group codes made) against numpy's groups of
    the same rows: NaN values, rows left out by ``keep``, an integer column only counted, a float
    column only counted, no value column; the same partial as the codes' path (a grouping too
    sparse for dense codes: the same keys spread apart) where both apply."""
    from l5dask.prediction import groupby

    rng = np.random.default_rng(8)
    n = 5_003
    keys = [rng.integers(3, 40, n), rng.integers(-2, 3, n).astype(np.int8)]
    x = rng.normal(size=n) * 1e3
    x[rng.random(n) < 0.05] = np.nan
    values = {"x": x, "y": (x * 7).astype(np.float32), "i": np.zeros(0, np.int64)}
    needs = {"x": {"n", "sum", "min", "max"}, "y": {"n"}, "i": {"n"}}
    for keep in (None, rng.random(n) < 0.8):
        ok = np.ones(n, bool) if keep is None else keep
        table, codes = np.unique(np.stack(keys, 1)[ok], axis=0, return_inverse=True)
        codes = codes.reshape(-1)
        for vals in (values, {}):
            calls = []
            original = groupby._group_part_keyed
            with pytest.MonkeyPatch.context() as m:
                m.setattr(groupby, "_group_part_keyed", lambda *a: calls.append(1) or original(*a))
                got = groupby.group_part(keys, vals, {k: needs[k] for k in vals}, keep=keep, n=n)
            assert calls == [1]
            np.testing.assert_array_equal(got.keys, table)
            assert got.rows.tobytes() == np.bincount(codes).astype(np.int64).tobytes()
            assert got.stats.keys() == vals.keys()
            if vals:
                xs = x[ok]
                good = ~np.isnan(xs)
                c, v = codes[good], xs[good]
                lo, hi = np.full(len(table), np.inf), np.full(len(table), -np.inf)
                np.minimum.at(lo, c, v)
                np.maximum.at(hi, c, v)
                assert got.stats["x"]["n"].tobytes() == np.bincount(c, minlength=len(table)).tobytes()
                assert got.stats["x"]["sum"].tobytes() == np.bincount(c, v, minlength=len(table)).tobytes()
                assert got.stats["x"]["min"].tobytes() == lo.tobytes()
                assert got.stats["x"]["max"].tobytes() == hi.tobytes()
                assert got.stats["y"]["n"].tobytes() == got.stats["x"]["n"].tobytes()
                assert got.stats["i"]["n"].tobytes() == got.rows.tobytes()
            # the codes' path (keys too sparse to be dense): the same partial, keys apart
            sparse = [keys[0] * 10**6, keys[1]]
            other = groupby.group_part(sparse, vals, {k: needs[k] for k in vals}, keep=keep, n=n)
            np.testing.assert_array_equal(other.keys[:, 0], got.keys[:, 0] * 10**6)
            assert other.rows.tobytes() == got.rows.tobytes()
            for name, stats in got.stats.items():
                for k, a in stats.items():
                    assert other.stats[name][k].tobytes() == a.tobytes(), (name, k)


def test_group_reduce_adds_to_its_outputs():
    """``group_reduce(out=...)`` over two halves equals one call over all rows, bit for bit; bad
    outputs are refused."""
    from l5dask.prediction.kernels import group_reduce

    rng = np.random.default_rng(4)
    codes, values = rng.integers(0, 9, 3_000), rng.normal(size=3_000)
    values[::13] = np.nan
    whole = group_reduce(codes, values, 9, True, True, True)
    out = group_reduce(codes[:1_234], values[:1_234], 9, True, True, True)
    got = group_reduce(codes[1_234:], values[1_234:], 9, True, True, True, out=out)
    for a, b in zip(got, whole):
        assert a.tobytes() == b.tobytes()
    with pytest.raises(ValueError, match="out's sum must be a contiguous float64 array of 9 groups"):
        group_reduce(codes, values, 9, out=(np.zeros(9, np.int64), np.zeros(8), None, None))


def test_aggregations_are_looked_up_by_name():
    from l5dask.prediction.groupby import AGGREGATIONS, aggregation

    assert set(AGGREGATIONS) == {"count", "sum", "mean", "min", "max", "var", "std", "median"}
    assert aggregation("mean") is AGGREGATIONS["mean"] and aggregation("median").q == 0.5
    assert aggregation("q99.9").q == pytest.approx(0.999) and aggregation("q99.9").needs == ("sketch",)
    with pytest.raises(L5DaskError, match=r"unknown reduction 'mode' \(for speed\); they are: count, sum"):
        aggregation("mode", of="speed")
    with pytest.raises(L5DaskError, match=r"'q101': a quantile is between q0 and q100"):
        aggregation("q101")


def test_reduce_parts_is_the_engines_ordered_tree():
    """The partials of other collections' blocks are merged by the engine's tree: one level per
    ``split_every`` (fan-in), in order (a combine that is not commutative gives the blocks in
    order), lazily (nothing runs while it is built)."""
    import dask.array as da
    from dask.task_spec import Task

    from l5dask.core.engine import Reduction
    from l5dask.prediction.groupby import reduce_parts

    x = da.arange(20, chunks=2)
    red = Reduction("concat", lambda blocks, i, parent: [int(blocks[0][0])], lambda a, b: a + b, list, tuple)
    for fan_in, levels in ((2, 4), (4, 2), (16, 1)):  # 10 leaves: 5, 3, 2, 1 / 3, 1 / 1
        with dask.config.set(split_every=fan_in, scheduler=_refuse):
            root = reduce_parts([[k] for k in x.__dask_keys__()], red, f"t{fan_in}", [x])
        graph = dict(root.__dask_graph__())
        combines = {k[1] for k in graph if isinstance(k, tuple) and k[0] == f"t{fan_in}-combine"}
        assert len(combines) == levels and all(isinstance(graph[(f"t{fan_in}-chunk", i)], Task) for i in range(10))
        assert root.compute(scheduler="sync") == tuple(range(0, 20, 2))


def test_range_grouper_groups_as_xarrays_unique_grouper():
    """The grouper of integer labels (a value's code is itself minus the first label) against
    xarray's own ``UniqueGrouper`` with the same labels, on dask chunks holding values outside
    the labels (left out by both) and labels with no values (NaN sums in both)."""
    import dask.array as da
    import xarray as xr
    from xarray.groupers import UniqueGrouper

    from l5dask.prediction.accessor import RangeGrouper

    rng = np.random.default_rng(8)
    for dtype in (np.int8, np.int32, np.int64, np.uint16):
        key = rng.integers(0, 30, 10_000).astype(dtype)
        key[key == 7] = 0  # a label without values
        obj = xr.DataArray(
            da.from_array(rng.normal(size=10_000), chunks=1_500),
            dims="row",
            coords={"k": ("row", da.from_array(key, chunks=1_500))},
        )
        labels = np.arange(2, 26)
        want = obj.groupby(k=UniqueGrouper(labels=labels)).sum().compute()
        got = obj.groupby(k=RangeGrouper(labels=labels)).sum().compute()
        xr.testing.assert_allclose(got, want)
        np.testing.assert_allclose(got.sel(k=5).item(), obj.values[key == 5].sum())


def test_xarray_accessor_refuses_coordinates_without_known_values(edge_ds):
    view = l5dask.open_dataset(edge_ds).joined("agents")
    with pytest.raises(ValueError, match=r"'timestamp' does not know its values"):
        view.yaw.l5.groupby("timestamp")
    with pytest.raises(KeyError, match=r"no coordinate 'scene' to group by") as e:
        view.yaw.l5.groupby("scene")
    assert "join coordinate" not in str(e.value)


def test_xarray_accessor_on_stored_fields_says_where_the_join_coordinates_are(edge_ds):
    """The engine's view holds the stored fields only: grouping it by a join coordinate said that
    the coordinates were '' (none); the line says which view has it."""
    import xarray as xr

    stored = xr.open_dataset(edge_ds, engine="l5kit")
    with pytest.raises(KeyError) as e:
        stored.yaw.l5.groupby("scene_index")
    assert str(e.value).strip("'\"") == (
        "no coordinate 'scene_index' to group by; the coordinates are: none; 'scene_index' is a join "
        "coordinate: l5dask.open_dataset(path).joined('agents') adds it (xr.open_dataset(path, "
        'engine="l5kit") and ds.agents hold the stored fields only)'
    )
    faces = l5dask.open_dataset(edge_ds).tl_faces
    with pytest.raises(
        KeyError, match=r"the coordinates are: none; 'host' is a join coordinate: .*joined\('traffic_light_faces'\)"
    ):
        faces.face_id.l5.groupby("host")
    view = l5dask.open_dataset(edge_ds).joined("agents")
    np.testing.assert_array_equal(
        view.yaw.l5.groupby("scene_index").count().values,
        np.bincount(view.scene_index.values, minlength=view.scene_index.attrs["valid_range"][1] + 1),
    )


def test_columns_kernels_equal_numpy():
    from l5dask.prediction.kernels import argmax_rows, gather, group_reduce

    rng = np.random.default_rng(5)
    rec = np.zeros(1000, [("a", np.float64, (2,)), ("p", np.float32, (17,)), ("t", np.uint64), ("s", np.int16)])
    rec["a"], rec["p"], rec["t"], rec["s"] = (
        rng.normal(size=(1000, 2)),
        rng.integers(0, 3, (1000, 17)),
        rng.integers(0, 2**63, 1000, dtype=np.uint64),
        rng.integers(-99, 99, 1000),
    )
    rec["p"][::7, 5] = np.nan  # numpy's argmax takes the first NaN
    np.testing.assert_array_equal(argmax_rows(rec, "p"), rec["p"].argmax(1))
    for records in (rec, rec[::3], rec.astype(rec.dtype.newbyteorder(">"))):  # contiguous, strided, big-endian
        (a1, t, s), (m,) = gather(records, [("a", (1,)), ("t", ()), ("s", ())], ["p"])
        np.testing.assert_array_equal(a1, records["a"][:, 1])
        np.testing.assert_array_equal(t, records["t"])
        np.testing.assert_array_equal(s, records["s"])
        np.testing.assert_array_equal(m, records["p"].argmax(1))
    codes, values = rng.integers(0, 7, 5000), rng.normal(size=5000)
    values[::11] = np.nan
    n, total, lo, hi = group_reduce(codes, values, 8, True, True, True)
    s = pd.Series(values).groupby(codes)
    np.testing.assert_array_equal(n[:7], s.count())
    np.testing.assert_allclose(total[:7], s.sum())
    np.testing.assert_array_equal(lo[:7], s.min())
    np.testing.assert_array_equal(hi[:7], s.max())
    assert n[7] == 0 and lo[7] == np.inf and hi[7] == -np.inf
    with pytest.raises(ValueError, match=r"codes must lie in \[0, 3\)"):
        group_reduce(codes, values, 3)
    rows = np.full(8, 5, np.int64)  # each group's rows, NaN or not, added in the same pass
    assert group_reduce(codes, values, 8, rows=rows)[0].sum() == np.isfinite(values).sum()
    np.testing.assert_array_equal(rows, np.bincount(codes, minlength=8) + 5)
    for bad in (-1, 8):
        wrong = codes.copy()
        wrong[4321] = bad
        with pytest.raises(ValueError, match=rf"codes must lie in \[0, 8\) \(row 4321 has {bad}\)"):
            group_reduce(wrong, values, 8, rows=np.zeros(8, np.int64))
    with pytest.raises(ValueError, match="rows must be a contiguous int64 array of 8 groups"):
        group_reduce(codes, values, 8, rows=np.zeros(7, np.int64))


def test_sketch_table_of_the_exponents_that_occur_equals_numpy(monkeypatch):
    """``kernels.Sketch`` (the cells of the (group, exponent) pairs that occur, where the table of
    every bucket would be too large: 0 among speeds of 1 to 30) against numpy's buckets counted:
    ``_sketch`` of codes, and ``group_part``'s keyed pass (the sketch counted in the same pass as
    the count, sum and maximum); NaN, -0.0, infinities, negative values, groups without rows, 0 to
    16 bits; a table that fills up (past ``sketch_cells``) gives the same by the sort; the same
    partial as the codes' path, bit for bit."""
    from l5dask.prediction import groupby
    from l5dask.prediction.groupby import _sketch, buckets, group_part

    rng = np.random.default_rng(48)
    added = []
    original_add = groupby.sketch_add
    monkeypatch.setattr(groupby, "sketch_add", lambda *a: added.append(original_add(*a)) or added[-1])

    def numpy_sketch(codes, x, bits):
        wide = x.astype(np.float64)
        ok = ~np.isnan(wide)
        uniq, counts = np.unique(np.stack([codes[ok], buckets(wide[ok], bits)], 1), axis=0, return_counts=True)
        return uniq[:, 0].tolist(), uniq[:, 1].tolist(), counts.tolist()

    for case in range(24):
        n = [3, 200, 20_000][case % 3]
        ngroups = [1, 17, 5][case % 3]
        codes = rng.integers(0, ngroups, n).astype(np.int64)
        codes[codes == 2] = 3  # (a group without rows)
        x = np.where(rng.random(n) < 0.2, 0.0, rng.lognormal(1.0 + codes / 10, 0.1, n))
        if case % 2:
            x[rng.integers(0, n, max(1, n // 50))] = np.nan
        if case % 4 == 1:
            x[rng.integers(0, n, 3)] = [-0.0, -2.5, np.inf]
        x = x.astype(np.float32 if case % 5 == 0 else np.float64)
        for bits in (12, 0, 5, 16):
            full = case % 6 == 5  # (a table that fills up: the sort)
            with pytest.MonkeyPatch.context() as m:
                if full:
                    m.setattr(groupby, "sketch_cells", lambda n, bits: 2**bits)
                added.clear()
                rows = np.zeros(ngroups, np.int64)
                got = _sketch(codes, x, bits, ngroups, rows)
                assert [a.tolist() for a in got] == list(numpy_sketch(codes, x, bits)), (case, bits)
                np.testing.assert_array_equal(rows, np.bincount(codes, minlength=ngroups))
                if n == 20_000 and bits == 12:
                    assert added == [not full]  # (the table was used, or gave up)
                # group_part: the keyed pass, or the codes' path (keys spread apart)
                needs = {"v": {"n", "sum", "max", "sketch"}}
                part = group_part([codes], {"v": x}, needs, bits)
                other = group_part([codes * 10**6], {"v": x}, needs, bits)
            present = np.unique(codes)
            np.testing.assert_array_equal(part.keys[:, 0], present)
            np.testing.assert_array_equal(other.keys[:, 0], present * 10**6)
            remap = np.full(ngroups, -1)
            remap[present] = np.arange(len(present))
            g, b, c = numpy_sketch(codes, x, bits)
            want = [remap[g].tolist() if len(g) else [], b, c]
            assert [a.tolist() for a in part.sketches["v"]] == want, (case, bits)
            assert [a.tolist() for a in other.sketches["v"]] == want
            assert part.rows.tobytes() == other.rows.tobytes()
            for k, a in part.stats["v"].items():
                assert other.stats["v"][k].tobytes() == a.tobytes(), k
            wide = x.astype(np.float64)
            ok = ~np.isnan(wide)
            sums = np.bincount(remap[codes[ok]], wide[ok], minlength=len(present))
            assert part.stats["v"]["sum"].tobytes() == sums.tobytes()


def test_sketches_merge_in_one_pass():
    """``kernels.merge_sketches`` against the sort of the two sketches' cells, and
    ``combine_parts`` of two partials' sketches against the sketch of all their rows; an input
    not sorted by (group, bucket) is refused (``None``)."""
    from l5dask.prediction.groupby import _sketch, combine_parts, group_part
    from l5dask.prediction.kernels import merge_sketches

    rng = np.random.default_rng(3)
    for n in (0, 1, 50, 5_000):
        codes = rng.integers(0, 6, n).astype(np.int64)
        x = rng.normal(0, 3, n)
        a, b = _sketch(codes[: n // 3], x[: n // 3], 8, 6), _sketch(codes[n // 3 :], x[n // 3 :], 8, 6)
        got = merge_sketches(a, b)
        assert got is not None
        cells = {}
        for g, bk, c in (*zip(*a), *zip(*b)):
            cells[(int(g), int(bk))] = cells.get((int(g), int(bk)), 0) + int(c)
        assert list(zip(*(v.tolist() for v in got))) == sorted((g, bk, c) for (g, bk), c in cells.items())
        if n:
            whole = group_part([codes], {"v": x}, {"v": {"sketch"}}, 8)
            parts = [
                group_part([codes[s]], {"v": x[s]}, {"v": {"sketch"}}, 8) for s in (slice(0, n // 3), slice(n // 3, n))
            ]
            merged = combine_parts(*parts) if len(parts[0]) else parts[1]
            for u, v in zip(merged.sketches["v"], whole.sketches["v"]):
                assert u.tolist() == v.tolist()
    unsorted = (np.array([1, 0]), np.array([0, 0]), np.array([1, 1]))
    one = (np.array([0]), np.array([0]), np.array([1]))
    assert merge_sketches(unsorted, one) is None
    assert merge_sketches(one, (np.array([0, 0]), np.array([4, 4]), np.array([1, 1]))) is None  # (a repeat)


def test_keyed_reduce_puts_zeros_apart_bit_for_bit():
    """``keyed_reduce`` with a sketch counts each group's zeros apart from its other values (the
    sums and the sketch's cells made of those): against numpy's definitions of the same rows, bit
    for bit, over zeros of both signs (most of the rows: parked agents' speeds), NaN, rows left out
    by ``keep``, several slices of codes; sums that start at -0.0 (a +0.0 makes them +0.0, a -0.0
    leaves them: zeros then not put apart); a sketch whose exponents leave the zeros out (the first
    row out named, zero or not); a table that fills up at its zeros (full: ``False``)."""
    from l5dask.prediction.groupby import ALL_EXPONENTS, buckets
    from l5dask.prediction.kernels import Sketch, keyed_reduce

    rng = np.random.default_rng(21)
    for case in range(12):
        n = [5_000, 3, 40][case % 3]
        key = rng.integers(0, 5, n).astype(np.int8)
        x = np.where(rng.random(n) < 0.7, 0.0, rng.lognormal(0, 2, n))
        x[rng.random(n) < 0.2] *= -1  # (-0.0 among the zeros)
        x[rng.random(n) < 0.05] = np.nan
        keep = rng.random(n) < 0.9 if case % 2 else None
        start = np.zeros(5)
        if case % 4 == 3:
            start[[1, 2]] = -0.0
        count, total = np.zeros(5, np.int64), start.copy()
        lo, hi, rows = np.full(5, np.inf), np.full(5, -np.inf), np.zeros(5, np.int64)
        sketch = Sketch(5, 12, *ALL_EXPONENTS, 2**22)
        # (no minimum asked, every row kept: the loop written out for that case; else the other)
        assert keyed_reduce(
            [key], [0], [1], n, (count, total, None if case % 3 == 0 else lo, hi), x, rows, sketch, keep
        )
        if case % 3 == 0:
            lo = np.full(5, np.inf)
            keyed_reduce([key], [0], [1], n, (np.zeros(5, np.int64), None, lo, None), x, None, None, keep)
        ok = np.ones(n, bool) if keep is None else keep
        good = ok & ~np.isnan(x)
        c, v = key[good].astype(np.int64), x[good]
        want, lo_, hi_ = start.copy(), np.full(5, np.inf), np.full(5, -np.inf)
        for g, y in zip(c.tolist(), v.tolist()):  # (row order, from the sums' starts: -0.0 + 0.0 is 0.0)
            want[g] += y
            lo_[g] = y if y < lo_[g] else lo_[g]  # (of equal values, the first: a zero's sign)
            hi_[g] = y if y > hi_[g] else hi_[g]
        assert total.tobytes() == want.tobytes(), case
        assert count.tolist() == np.bincount(c, minlength=5).tolist()
        assert rows.tolist() == np.bincount(key[ok], minlength=5).tolist()
        assert lo.tobytes() == lo_.tobytes() and hi.tobytes() == hi_.tobytes()
        cells, counts = np.unique(np.stack([c, buckets(v, 12)], 1), axis=0, return_counts=True)
        g, b, k = sketch.result()
        assert list(zip(g.tolist(), b.tolist(), k.tolist())) == list(
            zip(cells[:, 0].tolist(), cells[:, 1].tolist(), counts.tolist())
        ), case
    # sums that start at -0.0: a +0.0 makes one +0.0, a -0.0 leaves the other -0.0
    total = np.array([-0.0, -0.0])
    out = (np.zeros(2, np.int64), total, None, None)
    keyed_reduce(
        [np.array([0, 1], np.int8)], [0], [1], 2, out, np.array([0.0, -0.0]), None, Sketch(2, 12, *ALL_EXPONENTS, 2**16)
    )
    assert np.signbit(total).tolist() == [False, True]
    # exponents that leave the zeros out: the first row out is named, a zero or not
    out = (np.zeros(1, np.int64), np.zeros(1), None, None)
    for x, first in (([1.0, 1.5, 0.0, 8.0], 2), ([1.0, 8.0, 0.0], 1), ([1.0] * 3000 + [0.0], 3000)):
        with pytest.raises(ValueError, match=f"row {first}'s group is not in"):
            keyed_reduce(
                [np.zeros(len(x), np.int8)], [0], [1], len(x), out, np.array(x), None, Sketch(1, 12, 1023, 1, 10**6)
            )
    # a table with room for one pair: the values' pair, then the zeros' at the end: full
    x = np.array([0.0, 1.0, 0.0])
    full = (np.zeros(1, np.int64), np.zeros(1), None, None)
    assert not keyed_reduce([np.zeros(3, np.int8)], [0], [1], 3, full, x, None, Sketch(1, 4, *ALL_EXPONENTS, 16))


def test_sketch_table_refuses_what_it_cannot_count():
    """The table's arguments and rows out of its groups or exponents are refused, never counted
    out of bounds."""
    from l5dask.prediction.kernels import Sketch, keyed_reduce, sketch_add

    with pytest.raises(ValueError, match="bits from 0 to 16"):
        Sketch(3, 17, 0, 1, 10**6)
    with pytest.raises(ValueError, match="bits from 0 to 16"):
        Sketch(3, 12, 0, 5000, 10**6)
    with pytest.raises(ValueError, match="row 1 \\(code 3"):
        sketch_add(np.array([0, 3]), np.array([1.0, 1.0]), Sketch(3, 12, 1023, 1, 10**6))
    with pytest.raises(ValueError, match="row 1 \\(code 0, value 4.0\\)"):
        sketch_add(np.array([0, 0]), np.array([1.0, 4.0]), Sketch(3, 12, 1023, 1, 10**6))  # (4.0: exponent 1025)
    out = (np.zeros(3, np.int64), None, None, None)
    with pytest.raises(ValueError, match="row 2's group is not in"):
        keyed_reduce(
            [np.array([0, 0, 0])], [0], [1], 3, out, np.array([1.0, 1.5, 8.0]), None, Sketch(3, 12, 1023, 1, 10**6)
        )
    assert (
        sketch_add(np.array([0, 1]), np.array([1.0, 1.0]), Sketch(3, 4, 1023, 1, 16)) is False
    )  # (a second pair: no room)


@pytest.mark.parametrize("array", ["agents", "tl_faces", "frames"])
def test_an_aggregation_reading_no_parent_refuses_rows_no_parent_points_to(edge_ds, tmp_path, array):
    """A dataset caught half-way through an append (the child array grown, its parent not yet):
    an aggregation of the child's own columns read no parent rows and counted the orphans (exit 0)
    where the report refuses the dataset; it is refused with the report's own message, and an
    intact dataset is counted as numpy counts it."""
    import json
    import os
    import shutil

    from l5dask.prediction.report import compute_report

    name = {"tl_faces": fmt.TL_FACES}.get(array, array)
    column = {"agents": "track_id", "tl_faces": "tl_face_index", "frames": "timestamp"}[array]
    assert aggregate(edge_ds, array, values={column: "count"})[f"{column}_count"].tolist() == [
        len(read_all(edge_ds)[name])
    ]
    for case in ("appended", "shape"):
        half = tmp_path / f"{case}.zarr"
        if case == "appended":  # (the dataset twice, then every array but the child put back)
            l5dask.concat([edge_ds, edge_ds], str(half))
            for other in fmt.ARRAY_NAMES:
                if other != name:
                    shutil.rmtree(half / other)
                    shutil.copytree(os.path.join(edge_ds, other), half / other)
        else:  # (one row more in its .zarray, within its last stored chunk: a zero row)
            shutil.copytree(edge_ds, half)
            zarray = half / name / ".zarray"
            meta = json.loads(zarray.read_text())
            assert meta["shape"][0] % meta["chunks"][0]
            meta["shape"][0] += 1
            zarray.write_text(json.dumps(meta))
        with pytest.raises(L5DaskError) as refused:
            compute_report(str(half))
        with pytest.raises(L5DaskError) as ours:
            aggregate(str(half), array, values={column: "count"})
        assert str(ours.value) == str(refused.value) and "but the child array has" in str(ours.value)
        r = subprocess.run(
            [sys.executable, "-m", "l5dask.cli", "agg", str(half), "--array", array, "--value", f"{column}:count"],
            capture_output=True,
            text=True,
        )
        assert (r.returncode, r.stderr) == (2, f"l5dask: error: {refused.value}\n")


def test_an_integer_columns_mean_is_correctly_rounded(edge_ds, ref):
    """A new user's trial: the mean of ``num_agents`` per scene came out a unit in the last place
    off in one group in 300 (the floor and the fraction of the exact sum added in float64: rounded
    twice); ``56.71084337349397`` for 14121/249, whose correctly rounded float64 ends in ``398``,
    numpy's and pandas' too. Every group's mean is now Python's ``int / int`` of its exact sum (the
    correctly rounded one), through the pass and through ``exact_mean`` on sums of every size."""
    from l5dask.prediction.groupby import exact_mean

    fr = ref["frames"]
    got = aggregate(edge_ds, "frames", by="scene_index", values={"num_agents": ["mean"], "timestamp": ["mean"]})
    for i, (_, group) in enumerate(fr.groupby("scene_index")):
        for col in ("num_agents", "timestamp"):
            x = group[col].to_numpy()
            assert got[f"{col}_mean"][i] == sum(int(v) for v in x) / len(x), (i, col)
    rng = np.random.default_rng(5)
    small = rng.integers(-(2**53), 2**53, 4000, dtype=np.int64)
    big = [int(a) * 2**40 + int(b) for a, b in zip(rng.integers(-(2**50), 2**50, 500), rng.integers(0, 2**40, 500))]
    sums = [int(v) for v in small] + big + [14121]
    n = np.concatenate([rng.integers(1, 2**40, len(sums) - 1), [249]])
    hi = np.array([v >> 32 for v in sums], np.int64)
    lo = np.array([v & (2**32 - 1) for v in sums], np.int64)
    want = [v / int(k) for v, k in zip(sums, n)]
    np.testing.assert_array_equal(exact_mean(hi, lo, n), want)
    assert repr(float(exact_mean(hi[-1:], lo[-1:], n[-1:])[0])) == "56.71084337349398"
    assert np.isnan(exact_mean(hi[:1], lo[:1], np.zeros(1, np.int64))).all()


def test_integer_quantiles_are_exact_or_refused(edge_ds, ref, tmp_path):
    """An integer column's quantiles at the default 12 bits: exact (numpy's) where each bucket they
    need holds one integer (a frame's agents: the median of integers was 105.0078 for 105); a
    nanosecond timestamp's, whose bucket holds a scene's 25 s and more (its median came out 12 h
    off, below the scene's first frame), refused in one line naming quantile_bits=52 by every
    path, nothing written; exact at 52 bits (numpy's quantile of the float64 values)."""
    fr = ref["frames"]
    got = aggregate(edge_ds, "frames", by="scene_index", values={"num_agents": ["median", "q37", "q90"]})
    for i, (scene, group) in enumerate(fr.groupby("scene_index")):
        x = group.num_agents.to_numpy()
        for name, q in (("median", 0.5), ("q37", 0.37), ("q90", 0.9)):
            assert got[f"num_agents_{name}"][i] == np.quantile(x, q), (scene, name)
    for q, name in ((0.5, "median"), (0.99, "q99")):
        with pytest.raises(L5DaskError, match=rf"the q{q * 100:g} of timestamp cannot be exact.*quantile_bits=52"):
            aggregate(edge_ds, "frames", by="scene_index", values={"timestamp": [name]})
    exact = aggregate(edge_ds, "frames", by="scene_index", values={"timestamp": ["median"]}, quantile_bits=52)
    want = [np.quantile(g.timestamp.to_numpy().astype(np.float64), 0.5) for _, g in fr.groupby("scene_index")]
    np.testing.assert_array_equal(exact.timestamp_median, want)
    # the command line: one line, exit 2, no output
    out = tmp_path / "t.parquet"
    p = _cli("agg", edge_ds, "-a", "frames", "-b", "scene_index", "--value", "timestamp:median,min", "-o", out)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--quantile-bits 52" in p.stderr, p.stderr
    assert not out.exists()
    # the xarray accessor and the dask dataframe's quantiles
    ds = l5dask.open_dataset(edge_ds)
    with pytest.raises(L5DaskError, match="the q50 of timestamp cannot be exact"):
        ds.joined("frames").timestamp.l5.groupby("scene_index").quantile(0.5).values
    from l5dask.prediction.dataframe import quantiles

    df = ds.to_dask_dataframe("frames", columns=["timestamp"], joins=["scene_index"])
    with pytest.raises(L5DaskError, match="the q50 of timestamp cannot be exact"):
        quantiles(df, "scene_index", "timestamp", 0.5)
    np.testing.assert_array_equal(quantiles(df, "scene_index", "timestamp", 0.5, quantile_bits=52).iloc[:, 0], want)
    small = ds.joined("frames")
    n = (small.agent_index_interval.isel(interval=1) - small.agent_index_interval.isel(interval=0)).astype("int64")
    med = n.l5.groupby("scene_index").quantile(0.5).values
    np.testing.assert_array_equal(
        med, [np.quantile(g.num_agents.to_numpy(), 0.5) for _, g in fr.groupby("scene_index")]
    )


def test_by_none_is_no_keys(edge_ds):
    """``by=None`` (a user's "no grouping") is the whole array, as ``by=()``: it was a TypeError."""
    want = aggregate(edge_ds, "agents", values={"speed": ["mean", "count"]})
    pd.testing.assert_frame_equal(aggregate(edge_ds, "agents", by=None, values={"speed": ["mean", "count"]}), want)


@pytest.mark.parametrize(
    "q,bits,message",
    [
        (1.5, None, r"quantiles are probabilities in \[0, 1\], not 1\.5$"),
        ([0.5, 2], None, r"quantiles are probabilities in \[0, 1\], not \[0\.5, 2\]$"),
        (-0.1, None, r"not -0\.1$"),
        (0.5, 60, r"quantile_bits must be an integer from 0 to 52, not 60$"),
        (0.5, True, r"quantile_bits must be an integer from 0 to 52, not True$"),
    ],
)
def test_xarray_quantile_refuses_what_the_other_routes_refuse(edge_ds, q, bits, message):
    """The accessor's quantile takes the probabilities and bits the aggregate and the dataframe
    take (q above 1 was an IndexError, below 0 answered numbers, 60 bits a kernel's error)."""
    from l5dask.prediction.dataframe import quantiles

    x = l5dask.open_dataset(edge_ds).joined("agents").extent.sel(lwh="length")
    with pytest.raises(L5DaskError, match=message):
        x.l5.groupby("label").quantile(q, quantile_bits=bits)
    df = l5dask.open_dataset(edge_ds).to_dask_dataframe("agents", columns=["label", "extent_length"])
    with pytest.raises(L5DaskError, match=message):
        quantiles(df, ["label"], "extent_length", q, quantile_bits=bits)


def test_in_compares_each_value_as_equality_does():
    """``in [...]`` keeps the rows ``==`` keeps for one of the values (numpy's isin of the list made
    float64 of [2**63 + 4, 2] and matched every id near 2**63; an integer outside the column's type
    matches nothing); ``not in`` the others."""
    from l5dask.prediction.where import evaluate_where

    class Chunk(dict):
        def __len__(self) -> int:
            return len(next(iter(self.values())))

    big = 2**63
    chunk = Chunk(
        t=np.array([1, 2, big + 4, big + 5, 2**64 - 1, big], np.uint64),
        ts=np.array([10**18, 10**18 + 1, 5, -7, 0, 2**62], np.int64),
        x=np.array([0.5, 1.0, np.nan, 2.0, -0.0, 3.0]),
        f=np.array(["a", "bb", "c", "", "a", "d"]),
    )
    for col, values in [
        ("t", [big + 4, 2]),
        ("t", [-1, big + 4]),
        ("t", [2**64 - 1, 0.5, big]),
        ("ts", [10**18 + 1, 0.5]),
        ("ts", [-7, 2**63]),
        ("x", [1, 0.5, 0]),
        ("f", ["a", "c"]),
    ]:
        want = np.zeros(6, bool)
        for v in values:
            want |= np.array([a == v for a in chunk[col].tolist()])  # (Python's own ==: exact)
        text = f"{col} in {values!r}"
        np.testing.assert_array_equal(evaluate_where(text, chunk, {}), want, err_msg=text)
        np.testing.assert_array_equal(evaluate_where(f"{col} not in {values!r}", chunk, {}), ~want, err_msg=text)


def test_xarray_median_is_the_quantile_of_one_half(edge_ds):
    """``.l5.groupby(...).median()`` of a dask-backed variable: numpy's median of each group
    (exact at ``quantile_bits=52``), where xarray's own went through flox and failed (TypeError)."""
    x = l5dask.open_dataset(edge_ds).joined("agents").extent.sel(lwh="length")
    got = x.l5.groupby("label").median(quantile_bits=52).compute()
    values, labels = x.values, np.asarray(x.label.values)
    names = [str(n) for n in got.label.values]
    for name, m in zip(names, got.values):
        rows = (
            values[np.asarray([fmt.LABELS[c] for c in labels]) == name]
            if labels.dtype.kind in "iu"
            else values[labels == name]
        )
        rows = rows[~np.isnan(rows)]
        assert (np.isnan(m) and not len(rows)) or m == np.median(rows), name
