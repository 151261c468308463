"""The xarray face: variables, named extra dimensions and coordinates, the engine, the DataTree."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import l5dask
import l5dask.reading as reading
from l5dask import format as fmt

from .conftest import read_all


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
    import l5dask.xr as lx

    monkeypatch.setattr(lx, "_CACHE", lx.ChunkCache())
    calls = []
    original = reading.decode_chunk
    monkeypatch.setattr(reading, "decode_chunk", lambda *a, **kw: calls.append(a[3]) or original(*a, **kw))
    for chunks in (None, {}):
        lx._CACHE = lx.ChunkCache()
        calls.clear()
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
    faces = ds.joined("tl_faces")
    np.testing.assert_array_equal(faces.timestamp.values, fr["timestamp"][frame_of_face])
    np.testing.assert_array_equal(ds.joined("frames").scene_index.values, scene_of_frame)
    # a user's aggregation over join coordinates, with xarray: agents per scene
    per_scene = agents.yaw.groupby(agents.scene_index.compute()).count().values
    np.testing.assert_array_equal(per_scene, np.bincount(scene_of_frame[frame_of_agent]))
