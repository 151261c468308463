"""Building views, dataframes and groupings computes nothing, as xarray's ``raise_if_dask_computes``
checks: a scheduler that raises is in force while they are built; they compute when asked."""

from __future__ import annotations

import dask
import numpy as np
import pytest

import l5dask
from tests.conftest import raise_if_dask_computes


def test_views_dataframes_and_groupings_are_lazy(small_ds):
    ds = l5dask.open_dataset(small_ds)
    with raise_if_dask_computes():
        view = ds.joined("agents")  # (reads the scenes' host names, in this thread: no computation)
        agents = ds.agents
        tree = ds.to_datatree()
        speed = np.hypot(view.velocity.sel(xy="x"), view.velocity.sel(xy="y"))
        mean = speed.l5.groupby("scene_index", "label").mean()
        q = speed.l5.groupby("label").quantile([0.5, 0.9])  # computed at once before: now lazy, as .sum()
        df = ds.to_dask_dataframe("agents", columns=["speed", "label"])
        grouped = df.groupby("label", observed=True).speed.mean()
        x = ds["agents"].to_dask(fields=["yaw"])
        assert len(dict(x.__dask_graph__())) == ds["agents"].meta.nchunks
        dask.optimize(x, q.data)
        # the joins' and the dataframes' graphs: looked at, counted and optimised, nothing runs
        joined = ds.to_dask_dataframe("agents", columns=["speed"], joins=["timestamp", "host"])
        frames = ds.to_dask_dataframe("frames", joins=["scene_index"])
        for collection in (view.timestamp.data, view.scene_index.data, view.ego_translation.data, joined, frames):
            graph = dict(collection.__dask_graph__())
            assert len(graph) > collection.npartitions if hasattr(collection, "npartitions") else len(graph) > 1
            dask.optimize(collection)
    assert agents.yaw.chunks and tree.children and q.chunks is not None and mean.chunks is not None
    with dask.config.set(scheduler="sync"):
        got = q.compute()
        values, codes = speed.values, view.label.values
    names = view.label.attrs["flag_meanings"].split(" ")
    for code in np.unique(codes):  # numpy's quantiles, within the sketch's bound
        want = np.quantile(values[codes == code], [0.5, 0.9])
        np.testing.assert_allclose(got.sel(label=names[code]).values, want, rtol=1.3e-4)
    assert len(grouped.compute()) > 0


def test_the_raising_scheduler_catches_a_computation(small_ds):
    ds = l5dask.open_dataset(small_ds)
    with pytest.raises(RuntimeError, match="a dask computation"):
        with raise_if_dask_computes():
            ds.agents.yaw.values  # noqa: B018
