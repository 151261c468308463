"""The xarray face: variables, named extra dimensions and coordinates, the engine, the DataTree."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import xarray as xr

import l5dask
import l5dask.prediction.reading as reading
from l5dask.prediction import format as fmt
from tests.conftest import read_all


def test_views_have_named_dims_and_coords(small_ds):
    ds = l5dask.open_dataset(small_ds)
    agents = ds.agents
    assert agents.label_probabilities.dims == ("agent", "label")
    assert list(agents.label.values) == list(fmt.LABELS)
    assert list(agents.xy.values) == ["x", "y"]
    assert ds.frames.ego_rotation.dims == ("frame", "row", "col")
    assert list(ds.tl_faces.status.values) == ["ACTIVE", "INACTIVE", "UNKNOWN"]
    assert ds.scenes.frame_index_interval.dims == ("scene", "interval")
    ref = read_all(small_ds)["agents"]
    cars = agents.label_probabilities.sel(label="PERCEPTION_LABEL_CAR").values
    np.testing.assert_array_equal(cars, ref["label_probabilities"][:, 3])


def test_engine_matches_dask_view_and_decodes_once(small_ds, monkeypatch):
    calls = []
    original = reading.decode_chunk
    monkeypatch.setattr(reading, "decode_chunk", lambda *a, **kw: calls.append(a[3]) or original(*a, **kw))
    for chunks in (None, {}):
        calls.clear()  # (each opened dataset has its own cache of decoded chunks)
        x = xr.open_dataset(small_ds, engine="l5kit", group="agents", chunks=chunks)
        assert not calls  # lazy
        loaded = x.compute()
        assert sorted(calls, key=int) == [str(i) for i in range(l5dask.open_dataset(small_ds)["agents"].meta.nchunks)]
        xr.testing.assert_identical(loaded.drop_attrs(), l5dask.open_dataset(small_ds).agents.compute().drop_attrs())
    y = xr.open_dataset(small_ds, engine="l5kit", group="tl_faces", drop_variables=["traffic_light_id"])
    assert set(y.data_vars) == {"face_id", "traffic_light_face_status"}


def test_engine_chunks_are_stored_chunks(small_ds):
    x = xr.open_dataset(small_ds, engine="l5kit", group="frames", chunks={})
    assert set(x.timestamp.chunks[0][:-1]) == {300}


def test_engine_indexing(small_ds):
    x = xr.open_dataset(small_ds, engine="l5kit", group="agents")
    ref = read_all(small_ds)["agents"]
    np.testing.assert_array_equal(x.yaw[4_990:10_011:7].values, ref["yaw"][4_990:10_011:7])
    np.testing.assert_array_equal(x.centroid[12_345].values, ref["centroid"][12_345])
    np.testing.assert_array_equal(x.centroid[-1, 1].values, ref["centroid"][-1, 1])


def test_datatree(small_ds):
    tree = xr.open_datatree(small_ds, engine="l5kit")
    assert set(tree.children) == {"scenes", "frames", "agents", "tl_faces"}
    assert tree.attrs["format_version"] == 2
    ref = read_all(small_ds)
    np.testing.assert_array_equal(tree["scenes"]["host"].values, ref["scenes"]["host"])
    own = l5dask.open_dataset(small_ds).to_datatree()
    np.testing.assert_array_equal(own["frames"]["timestamp"].values, ref["frames"]["timestamp"])


def test_engine_group_unknown(small_ds):
    with pytest.raises(l5dask.L5DaskError, match="no array 'cars'"):
        xr.open_dataset(small_ds, engine="l5kit", group="cars")


def test_joined_views_have_join_coordinates(small_ds):
    ds = l5dask.open_dataset(small_ds)
    ref = read_all(small_ds)
    sc, fr = ref["scenes"], ref["frames"]
    scene_of_frame = np.repeat(np.arange(len(sc)), np.diff(sc["frame_index_interval"], axis=1).ravel())
    frame_of_agent = np.repeat(np.arange(len(fr)), np.diff(fr["agent_index_interval"], axis=1).ravel())
    frame_of_face = np.repeat(np.arange(len(fr)), np.diff(fr["traffic_light_faces_index_interval"], axis=1).ravel())
    agents = ds.joined("agents")
    assert agents.timestamp.chunks[0] == agents.yaw.chunks[0]  # aligned chunk for chunk, lazily
    np.testing.assert_array_equal(agents.frame_index.values, frame_of_agent)
    np.testing.assert_array_equal(agents.scene_index.values, scene_of_frame[frame_of_agent])
    np.testing.assert_array_equal(agents.timestamp.values, fr["timestamp"][frame_of_agent])
    np.testing.assert_array_equal(agents.ego_translation.sel(xyz="y").values, fr["ego_translation"][frame_of_agent, 1])
    # (each block column-major: a column of it, .sel(xyz="x"), is contiguous)
    ego = agents.ego_translation.data
    assert (
        ego.map_blocks(lambda b: np.full((len(b), 1), b.flags.f_contiguous), chunks=(ego.chunks[0], 1)).all().compute()
    )
    np.testing.assert_array_equal(agents.ego_translation.values, fr["ego_translation"][frame_of_agent])
    faces = ds.joined("tl_faces")
    np.testing.assert_array_equal(faces.timestamp.values, fr["timestamp"][frame_of_face])
    # the UTC hour of day of the row's frame (made per frame, then spread), int8
    hour = (fr["timestamp"] // 3_600_000_000_000) % 24
    assert agents.hour.dtype == faces.hour.dtype == np.int8
    np.testing.assert_array_equal(agents.hour.values, hour[frame_of_agent])
    np.testing.assert_array_equal(faces.hour.values, hour[frame_of_face])
    np.testing.assert_array_equal(ds.joined("frames").scene_index.values, scene_of_frame)
    # a user's aggregation over join coordinates, with xarray: agents per scene
    per_scene = agents.yaw.groupby(agents.scene_index.compute()).count().values
    np.testing.assert_array_equal(per_scene, np.bincount(scene_of_frame[frame_of_agent]))


def _unreadable(small_ds, tmp_path, keep=("scenes",)):
    """A copy whose every chunk raises if it is read (metadata and chunk headers intact), but those
    of ``keep``."""
    import shutil

    dest = tmp_path / "unreadable.zarr"
    shutil.copytree(small_ds, dest)
    for chunk in dest.glob("*/[0-9]*"):
        if chunk.parent.name not in keep:
            chunk.write_bytes(chunk.read_bytes()[:16] + b"not blosc")
    return str(dest)


def test_building_joins_and_joined_views_reads_nothing(small_ds, tmp_path):
    from l5dask.errors import ChunkError
    from l5dask.prediction.joins import Joins

    # the joined views read the scenes' host names (the categories of their host coordinate), no more
    ds = l5dask.open_dataset(_unreadable(small_ds, tmp_path))
    views = [ds.joined(n) for n in ("agents", "frames", "tl_faces")]  # nothing else is read: nothing raises
    j = Joins(ds)
    arrays = [j.agent_scene(), j.agent_frame(), j.frame_scene(), j.tl_face_scene(), j.agent_frame_field("timestamp")]
    assert views[0].scene_index.shape == (len(ds["agents"]),) and arrays[0].chunks == ds["agents"].to_dask().chunks
    with pytest.raises(ChunkError), dask.config.set(scheduler="sync"):  # ... until they are computed
        views[0].scene_index.values  # (sync: no task of it goes on reading in the background)


def test_join_coordinates_decode_each_parent_chunk_once(small_ds, monkeypatch):
    import dask

    calls = []
    original = reading.decode_chunk
    monkeypatch.setattr(reading, "decode_chunk", lambda *a, **kw: calls.append((a[1].name, a[3])) or original(*a, **kw))
    ds = l5dask.open_dataset(small_ds)
    view = ds.joined("agents", chunks_per_task=1)
    assert calls == [(fmt.SCENES, str(i)) for i in range(ds[fmt.SCENES].nchunks)]  # the host names
    calls.clear()
    got = dask.compute(view.scene_index.data, view.frame_index.data, view.timestamp.data, view.ego_translation.data)
    # scenes and frames, each chunk once; no agent chunk (the child rows come from the metadata)
    assert sorted(calls) == sorted((n, str(i)) for n in (fmt.SCENES, fmt.FRAMES) for i in range(ds[n].nchunks))
    ref = read_all(small_ds)
    siv, fiv = ref["scenes"]["frame_index_interval"], ref["frames"]["agent_index_interval"]
    frame_of_agent = np.repeat(np.arange(len(fiv)), fiv[:, 1] - fiv[:, 0])
    scene_of_frame = np.repeat(np.arange(len(siv)), siv[:, 1] - siv[:, 0])
    np.testing.assert_array_equal(got[0], scene_of_frame[frame_of_agent])
    np.testing.assert_array_equal(got[1], frame_of_agent)
    np.testing.assert_array_equal(got[2], ref["frames"]["timestamp"][frame_of_agent])
    np.testing.assert_array_equal(got[3], ref["frames"]["ego_translation"][frame_of_agent])


def test_the_backend_array_follows_xarrays_idiom(small_ds):
    """``_array`` in ``__slots__`` (callers evaluate anything with an ``array`` attribute), groups
    declared, and a cheap ``guess_can_open`` that reads nothing."""
    from l5dask.prediction.backend import L5BackendArray, L5KitBackendEntrypoint

    x = xr.open_dataset(small_ds, engine="l5kit", group="agents")
    backend = x.yaw.variable._data
    while not isinstance(backend, L5BackendArray):  # xarray's wrappers: memory cache, copy on write, lazy
        backend = backend.array
    assert isinstance(backend, L5BackendArray) and not hasattr(backend, "array") and not hasattr(backend, "__dict__")
    assert "_array" in L5BackendArray.__slots__
    entry = L5KitBackendEntrypoint()
    assert entry.supports_groups and entry.guess_can_open(small_ds)
    assert not entry.guess_can_open("s3://bucket/x.zarr") and not entry.guess_can_open(small_ds + "/agents")


def test_a_dataset_rewritten_in_place_reads_back_new_in_the_same_process(tmp_path):
    """The decoded-chunk cache belongs to the opened dataset: opening again after a rewrite in
    place reads the new chunks (a process-wide cache keyed by path returned the old ones)."""
    path = str(tmp_path / "d.zarr")
    l5dask.synthesize(path, num_scenes=2, seed=1)
    first = xr.open_dataset(path, engine="l5kit", group="agents").yaw.values.copy()
    l5dask.synthesize(path, num_scenes=2, seed=2, overwrite=True)
    again = xr.open_dataset(path, engine="l5kit", group="agents").yaw.values
    want = read_all(path)["agents"]["yaw"]
    np.testing.assert_array_equal(again, want)
    assert len(first) != len(want) or not np.array_equal(first, want)


def test_categories_compare_by_name_through_l5_and_cf_xarray(small_ds):
    """``joined.label == "PERCEPTION_LABEL_CAR"`` compares the integer codes with a string: False
    everywhere, and every per-scene mean of the cars' speed NaN, without a word (xarray cannot
    know). The coordinates of categories follow CF's flags, so cf_xarray compares them by name,
    and so does the ``.l5`` accessor, lazily; a name that is not a category is refused in one line."""
    import cf_xarray  # noqa: F401 - registers .cf

    from l5dask.errors import UsageError

    ds = l5dask.open_dataset(small_ds)
    agents, faces = ds.joined("agents"), ds.joined("tl_faces")
    ref = read_all(small_ds)
    label = ref["agents"]["label_probabilities"].argmax(1)
    car, ped = fmt.LABELS.index("PERCEPTION_LABEL_CAR"), fmt.LABELS.index("PERCEPTION_LABEL_PEDESTRIAN")
    assert 0 < (label == car).sum() < len(label)
    for cars in (agents.label.l5 == "PERCEPTION_LABEL_CAR", agents.label.cf == "PERCEPTION_LABEL_CAR"):
        assert isinstance(cars.data, dask.array.Array)
        np.testing.assert_array_equal(cars.values, label == car)
    np.testing.assert_array_equal((agents.label.l5 != "PERCEPTION_LABEL_CAR").values, label != car)
    both = agents.label.l5.isin(["PERCEPTION_LABEL_CAR", "PERCEPTION_LABEL_PEDESTRIAN"])
    np.testing.assert_array_equal(both.values, (label == car) | (label == ped))
    status = ref["traffic_light_faces"]["traffic_light_face_status"].argmax(1)
    np.testing.assert_array_equal((faces.status.l5 == "ACTIVE").values, status == 0)
    # the issue's computation: the cars' mean speed per scene, against numpy
    v = ref["agents"]["velocity"]
    speed = np.hypot(agents.velocity.sel(xy="x"), agents.velocity.sel(xy="y"))
    got = speed.where(agents.label.l5 == "PERCEPTION_LABEL_CAR").l5.groupby("scene_index").mean().values
    scene = agents.scene_index.values
    want = [
        np.hypot(v[:, 0], v[:, 1])[(scene == s) & (label == car)].astype(np.float64).mean() for s in range(len(got))
    ]
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert np.isnan(speed.where(agents.label == "PERCEPTION_LABEL_CAR").l5.groupby("scene_index").mean().values).all()
    for bad, message in (
        (lambda: agents.label.l5 == "CAR", r"^'CAR' is not a label; they are: PERCEPTION_LABEL_NOT_SET, "),
        (lambda: agents.label.l5.isin(["PERCEPTION_LABEL_CAR", "VAN"]), r"^'VAN' is not a label"),
        (lambda: agents.yaw.l5 == "PERCEPTION_LABEL_CAR", r"^'yaw' holds no categories"),
        (lambda: agents.label.l5 == 3, r"compare a category with its name"),
    ):
        with pytest.raises(UsageError, match=message) as info:
            bad()
        assert "\n" not in str(info.value)


def test_view_numbers_come_from_the_compressed_chunks(small_ds, monkeypatch):
    """The views' number variables and the label argmax are gathered straight from the stored
    chunks, in one pass a block, the records never decoded (they were: 3.5 GB for the speed per
    scene and label of the aggregation benchmark); a field that is not gathered (the label
    probabilities) comes from the records, decoded once; every value as zarr-python 2 reads it."""
    import pickle

    from l5dask.prediction.views import Block, blocks

    calls = []
    original = reading.decode_chunk
    monkeypatch.setattr(reading, "decode_chunk", lambda *a, **kw: calls.append((a[1].name, a[3])) or original(*a, **kw))
    ds = l5dask.open_dataset(small_ds)
    ref = read_all(small_ds)["agents"]
    view = ds.joined("agents", chunks_per_task=3)
    calls.clear()
    with dask.config.set(scheduler="threads"):
        velocity, label, centroid, track = dask.compute(
            view.velocity.data, view.label.data, view.centroid.data, view.track_id.data
        )
    assert not [c for c in calls if c[0] == fmt.AGENTS]
    np.testing.assert_array_equal(velocity, ref["velocity"])
    np.testing.assert_array_equal(centroid, ref["centroid"])
    np.testing.assert_array_equal(track, ref["track_id"])
    np.testing.assert_array_equal(label, ref["label_probabilities"].argmax(1))
    calls.clear()
    np.testing.assert_array_equal(view.label_probabilities.values, ref["label_probabilities"])
    assert sorted(c for c in calls if c[0] == fmt.AGENTS) == sorted(
        (fmt.AGENTS, str(i)) for i in range(ds["agents"].nchunks)
    )
    # a block travels to another worker as its stored bytes, and makes the same columns there
    chunked = blocks(ds["agents"], ["velocity", "extent"], 2, ["label_probabilities"])
    block = dask.compute(chunked.to_delayed()[1], scheduler="sync")[0]
    assert isinstance(block, Block)
    block.field("velocity")
    again = pickle.loads(pickle.dumps(block))
    np.testing.assert_array_equal(again.field("extent"), ref["extent"][len(block.data) : 2 * len(block.data)])
    np.testing.assert_array_equal(again.argmax_of("label_probabilities"), block.argmax_of("label_probabilities"))


def test_view_groupby_makes_a_block_in_one_task(small_ds, monkeypatch):
    """The declared groupby of a variable of the joined view runs each block's tasks as one task
    (:func:`l5dask.core.engine.fold_exclusive`): the velocity and the label of a block, gathered
    from its stored chunks in one pass, are made in one thread, one after the other (they were two
    tasks, one waiting under the block's lock while the other gathered both: 11% of the workers'
    time of the mean speed per scene and label over 30 M agents); the frames' join rows, which
    several blocks take, stay a task of their own. Lazy, and the values numpy's."""
    import threading

    from l5dask.prediction.reading import Encoded
    from l5dask.prediction.views import Block
    from tests.conftest import raise_if_dask_computes

    ds = l5dask.open_dataset(small_ds)
    with raise_if_dask_computes():
        view = ds.joined("agents", chunks_per_task=2)
        v = view.velocity.astype("float64")
        speed = np.sqrt(v.sel(xy="x") ** 2 + v.sel(xy="y") ** 2)
        mean = speed.l5.groupby("scene_index", "label").mean()
        graph = dict(mean.data.__dask_graph__())
    names = [k[0] if isinstance(k, tuple) else k for k in graph]
    assert not [n for n in names if n.startswith(("l5-chunks-", "l5-join-", "astype", "sqrt", "_argmax_of_block"))]
    assert len([n for n in names if n.endswith("-chunk")]) == speed.data.npartitions
    assert any("frames-join-held" in n for n in names)

    threads: dict[int, set] = {}
    original = Block._column
    monkeypatch.setattr(
        Block,
        "_column",
        lambda self, key: threads.setdefault(self.data.start, set()).add(threading.get_ident()) or original(self, key),
    )
    passes: dict[int, int] = {}
    gather = Encoded.gather
    monkeypatch.setattr(
        Encoded,
        "gather",
        lambda self, *a, **kw: passes.update({self.start: passes.get(self.start, 0) + 1}) or gather(self, *a, **kw),
    )
    with dask.config.set(scheduler="threads", num_workers=4):
        got = mean.to_series().dropna()
    assert len(threads) == speed.data.npartitions and all(len(t) == 1 for t in threads.values())
    # (the velocity asked before the label: one pass a block gathers both, each chunk decompressed once)
    assert len(passes) == speed.data.npartitions and set(passes.values()) == {1}
    ref = read_all(small_ds)
    fiv, siv = ref["frames"]["agent_index_interval"], ref["scenes"]["frame_index_interval"]
    scene = np.repeat(np.repeat(np.arange(len(siv)), siv[:, 1] - siv[:, 0]), fiv[:, 1] - fiv[:, 0])
    label = ref["agents"]["label_probabilities"].argmax(1)
    vel = ref["agents"]["velocity"].astype(np.float64)
    s = np.sqrt(vel[:, 0] ** 2 + vel[:, 1] ** 2)
    names = np.asarray(view.label.attrs["flag_meanings"].split(" "))
    want = {(int(k), names[lab]): s[(scene == k) & (label == lab)].mean() for k, lab in set(zip(scene, label))}
    assert dict(zip(got.index, got.to_numpy())) == pytest.approx(want, rel=1e-12)


def test_view_join_coordinates_spread_only_the_overlapping_parent_rows(small_ds, monkeypatch):
    """A join coordinate of the joined view (``scene_index``, ``frame_index``, ``timestamp``) is
    made for each block from the parent rows that overlap it, a slice of the frames held whole
    (each block went through all the frames: 0.8 of q1's CPU-s over 30 M agents); numpy's values."""
    from l5dask.core.engine import Rows

    seen = []
    original = Rows.spread
    monkeypatch.setattr(
        Rows,
        "spread",
        lambda self, lo, hi, start, values, **kw: (
            seen.append((self[start].copy(), lo, hi)) or original(self, lo, hi, start, values, **kw)
        ),
    )
    ds = l5dask.open_dataset(small_ds)
    view = ds.joined("agents", chunks_per_task=2)
    with dask.config.set(scheduler="sync"):
        scene, frame, timestamp = dask.compute(view.scene_index.data, view.frame_index.data, view.timestamp.data)
    ref = read_all(small_ds)
    fiv, siv = ref["frames"]["agent_index_interval"], ref["scenes"]["frame_index_interval"]
    want_frame = np.repeat(np.arange(len(fiv)), fiv[:, 1] - fiv[:, 0])
    np.testing.assert_array_equal(frame, want_frame)
    np.testing.assert_array_equal(scene, np.repeat(np.arange(len(siv)), siv[:, 1] - siv[:, 0])[want_frame])
    np.testing.assert_array_equal(timestamp, ref["frames"]["timestamp"][want_frame])
    assert len(seen) >= 3 * view.scene_index.data.npartitions
    for starts, lo, hi in seen:  # (the rows overlapping [lo, hi) alone)
        assert starts[0] <= lo and (len(starts) == 1 or starts[1] > lo) and starts[-1] < hi


def test_integer_min_max_sum_through_the_view_say_they_are_float64(small_ds):
    """The max timestamp per scene through ``.l5.groupby`` is xarray's, in float64 (NaN for empty
    groups), rounded past 2**53 (a new user's finding): one warning says so and names the exact
    route; the float64 declared reductions say nothing; ``l5dask.aggregate`` keeps int64, exact."""
    import warnings

    ds = l5dask.open_dataset(small_ds)
    view = ds.joined("frames")
    with pytest.warns(RuntimeWarning, match=r"exact to 2\*\*53 only.*l5dask.aggregate and l5dask agg keep int64"):
        got = view.timestamp.l5.groupby("scene_index").max().compute()
    frames, scenes = read_all(small_ds)[fmt.FRAMES], read_all(small_ds)[fmt.SCENES]
    want = np.array([frames["timestamp"][a:b].max() for a, b in scenes["frame_index_interval"]])
    assert got.dtype == np.float64 and np.array_equal(got.values, want.astype(np.float64))
    exact = l5dask.aggregate(small_ds, "frames", by=["scene_index"], values={"timestamp": ["max"]})
    assert exact["timestamp_max"].dtype == np.int64 and np.array_equal(exact["timestamp_max"].to_numpy(), want)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        declared = view.ego_translation.sel(xyz="x").l5.groupby("scene_index").max()  # (float64: declared, exact)
    # named as xarray's groupby names them: after the variable, and none for an unnamed one (the
    # declared route gave the dask graph's key, "from-value-<token>")
    unnamed = (view.ego_translation.sel(xyz="x") * 1.0).rename(None)
    assert (declared.name, unnamed.l5.groupby("scene_index").max().name) == ("ego_translation", None)
    assert unnamed.groupby(view.scene_index.compute()).max().name is None


def test_view_field_of_several_elements_is_its_gathered_columns(small_ds):
    """A field of several numbers per row (``velocity``, ``ego_rotation``) is made of its elements'
    columns, gathered as the rows of one array: their transpose, no copy (a stack copied it for
    every block); the values numpy's, and a field of columns gathered apart is stacked."""
    from l5dask.prediction.kernels import field_of_columns
    from l5dask.prediction.views import blocks

    ds = l5dask.open_dataset(small_ds)
    ref = read_all(small_ds)
    for name, fields in ((fmt.AGENTS, ["velocity", "extent", "yaw"]), (fmt.FRAMES, ["ego_rotation", "timestamp"])):
        chunked = blocks(ds[name], fields, 2)
        block = dask.compute(chunked.to_delayed()[1], scheduler="sync")[0]
        lo = block.data.start
        for f in fields:
            got = block.field(f)
            np.testing.assert_array_equal(got, ref[name][f][lo : lo + len(block.data)])
            parts = block._column(f)
            assert all(np.shares_memory(got, p) for p in parts)
    xs = [np.arange(5.0), np.arange(5.0, 10.0), np.arange(10.0, 15.0), np.arange(15.0, 20.0)]
    apart = field_of_columns(xs, (2, 2))
    np.testing.assert_array_equal(apart, np.stack(xs, axis=1).reshape(-1, 2, 2))
    assert not any(np.shares_memory(apart, x) for x in xs)
    rows = np.arange(20.0).reshape(4, 5)
    np.testing.assert_array_equal(field_of_columns(list(rows), (4,)), rows.T)
    # (rows of one array out of order, or not all of them: stacked)
    np.testing.assert_array_equal(field_of_columns([rows[1], rows[0]], (2,)), np.stack([rows[1], rows[0]], axis=1))
    np.testing.assert_array_equal(field_of_columns(list(rows[:2]), (2,)), rows[:2].T)


@pytest.mark.parametrize("case", ["inside", "outside", "not zero-based", "uint64"])
def test_view_group_part_of_keys_that_are_their_codes(case):
    """A block's partial of the declared groupby where the labels are ``0 .. n - 1`` and every key
    is one of them takes the keys as their codes (none made); keys outside the labels are left out,
    other labels coded: the same partial as numpy's per group of the labels' positions."""
    import dask.array as da

    from l5dask.prediction.accessor import group_reduce_lazily
    from l5dask.prediction.groupby import AGGREGATIONS

    rng = np.random.default_rng(7)
    n = 50_000
    scene = rng.integers(0, 40, n).astype(np.int64)
    label = rng.integers(0, 17, n).astype(np.int8)
    values = rng.normal(size=n)
    values[::97] = np.nan
    scene_labels, label_labels = np.arange(40), np.arange(17)
    if case == "outside":
        scene[::13] = 40  # (not a label: left out)
        label[::31] = -1
    elif case == "not zero-based":
        scene_labels = np.arange(3, 43)
    elif case == "uint64":
        scene = scene.astype(np.uint64)
    obj = xr.DataArray(
        da.from_array(values, chunks=7_000),
        dims="agent",
        coords={"scene_index": ("agent", scene), "label": ("agent", label)},
    )
    labels = {"scene_index": scene_labels, "label": label_labels}
    got = group_reduce_lazily(obj, ["scene_index", "label"], labels, [AGGREGATIONS["sum"], AGGREGATIONS["count"]])
    got = got.compute(scheduler="sync").values
    sp = np.searchsorted(scene_labels, scene.astype(np.int64))
    ok = (sp < len(scene_labels)) & (scene_labels[np.minimum(sp, len(scene_labels) - 1)] == scene) & (label >= 0)
    ok &= ~np.isnan(values)
    key = sp[ok] * 17 + label[ok]
    want_sum = np.bincount(key, weights=values[ok], minlength=40 * 17).reshape(40, 17)
    want_n = np.bincount(key, minlength=40 * 17).reshape(40, 17).astype(np.float64)
    want_n[want_n == 0] = np.nan  # (a group without values: xarray's NaN; its sum 0)
    np.testing.assert_array_equal(got[..., 1], want_n)
    np.testing.assert_allclose(got[..., 0], want_sum, rtol=1e-12, atol=1e-12)
