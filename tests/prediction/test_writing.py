"""The writer: exact L5Kit format, parallel chunks, round trips, L5Kit's own reader."""

from __future__ import annotations

import json
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import l5dask
from l5dask.errors import L5DaskError, NotADatasetError
from l5dask.prediction import format as fmt
from tests.conftest import l5kit_data, read_all


def _l5kit_chunked_dataset():
    l5kit_data()
    from l5kit.data.zarr_dataset import ChunkedDataset  # noqa: E402

    return ChunkedDataset


def test_written_dataset_opens_in_l5kit_chunked_dataset(default_ds):
    ChunkedDataset = _l5kit_chunked_dataset()
    zd = ChunkedDataset(default_ds).open()
    ours = l5dask.open_dataset(default_ds)
    assert len(zd.agents) == len(ours["agents"]) and len(zd.tl_faces) == len(ours["tl_faces"])
    np.testing.assert_array_equal(zd.frames[:], ours["frames"].to_dask().compute())
    np.testing.assert_array_equal(zd.agents[:], ours["agents"].to_dask().compute())
    np.testing.assert_array_equal(zd.scenes[:], ours["scenes"].to_dask().compute())
    np.testing.assert_array_equal(zd.tl_faces[:], ours["tl_faces"].to_dask().compute())
    assert "Num Scenes" in str(zd)  # L5Kit's own summary table runs on it


def test_metadata_is_exactly_l5kits(default_ds):
    root = Path(default_ds)
    assert json.loads((root / ".zgroup").read_text()) == {"zarr_format": 2}
    attrs = json.loads((root / ".zattrs").read_text())
    assert attrs == {"format_version": 2, "labels": list(fmt.LABELS)}
    for name, dtype in fmt.DTYPES.items():
        meta = json.loads((root / name / ".zarray").read_text())
        assert meta["compressor"] == {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1, "blocksize": 0}
        assert meta["chunks"] == [fmt.CHUNK_ROWS[name]] and meta["filters"] is None and meta["order"] == "C"
        assert np.dtype([tuple(f) if len(f) == 2 else (f[0], f[1], tuple(f[2])) for f in meta["dtype"]]) == dtype
        import base64

        assert base64.b64decode(meta["fill_value"]) == bytes(dtype.itemsize)
        # the last chunk is stored full size (padded with the fill value), byte-shuffled by record
        raw = (root / name / str(-(-meta["shape"][0] // meta["chunks"][0]) - 1)).read_bytes()
        assert raw[3] == dtype.itemsize % 256  # blosc header: typesize = record size
        from numcodecs import Blosc

        assert len(Blosc().decode(raw)) == fmt.CHUNK_ROWS[name] * dtype.itemsize


def test_write_from_dask_round_trips(small_ds, tmp_path):
    src = l5dask.open_dataset(small_ds)
    arrays = {name: src[name].to_dask() for name in src.arrays}
    out = tmp_path / "copy.zarr"
    l5dask.write_dataset(out, arrays)
    ref, got = read_all(small_ds), read_all(str(out))
    for name in ref:
        np.testing.assert_array_equal(got[name], ref[name])
    assert json.loads((out / "agents" / ".zarray").read_text())["chunks"] == [20_000]


def test_failed_write_leaves_no_complete_looking_dataset(small_ds, tmp_path):
    src = l5dask.open_dataset(small_ds)
    agents = src["agents"].to_dask()

    def explode(block, block_info=None):
        if block_info[0]["chunk-location"][0] == 1:
            raise RuntimeError("disk full")
        return block

    arrays = {n: src[n].to_dask() for n in src.arrays} | {"agents": agents.map_blocks(explode, dtype=agents.dtype)}
    out = tmp_path / "broken.zarr"
    with pytest.raises(RuntimeError, match="disk full"):
        l5dask.write_dataset(out, arrays, chunk_rows={"agents": 5_000})
    assert not (out / ".zgroup").exists()
    with pytest.raises(NotADatasetError, match="not an L5Kit dataset"):
        l5dask.open_dataset(out)


def test_refuses_to_overwrite_unless_asked(small_ds, tmp_path):
    out = tmp_path / "x.zarr"
    l5dask.synthesize(out, num_scenes=1, seed=1)
    before = read_all(str(out))
    with pytest.raises(L5DaskError, match="already exists"):
        l5dask.synthesize(out, num_scenes=2, seed=2)
    np.testing.assert_array_equal(read_all(str(out))["agents"], before["agents"])  # nothing lost
    l5dask.synthesize(out, num_scenes=2, seed=2, overwrite=True)
    assert len(read_all(str(out))["scenes"]) == 2


def test_writer_rejects_wrong_dtype(tmp_path):
    bad = np.zeros(3, dtype=[("timestamp", "<i8")])
    with pytest.raises(L5DaskError, match="lacks the field"):
        l5dask.write_dataset(
            tmp_path / "bad.zarr",
            {"scenes": np.zeros(1, fmt.SCENE_DTYPE), "frames": bad, "agents": np.zeros(0, fmt.AGENT_DTYPE)},
        )
    assert not (tmp_path / "bad.zarr").exists()


def _random_records(draw, dtype: np.dtype, n: int) -> np.ndarray:
    seed = draw(st.integers(0, 2**32 - 1))
    raw = np.random.default_rng(seed).integers(0, 256, size=n * dtype.itemsize, dtype=np.uint8)
    out = raw.view(dtype).copy()
    for f in dtype.names:  # keep strings decodable, floats finite and comparable
        kind = dtype.fields[f][0].base.kind
        if kind == "U":
            out[f] = np.char.mod("s%d", np.arange(n)).astype(dtype.fields[f][0].base) if n else out[f]
        elif kind == "f":  # random bit patterns, made finite (the cast of huge values is expected)
            with np.errstate(invalid="ignore", over="ignore"):
                out[f] = np.nan_to_num(out[f].astype(np.float64), nan=0.0, posinf=1.0, neginf=-1.0).clip(-1e30, 1e30)
    return out


@st.composite
def datasets(draw):
    sizes = {name: draw(st.integers(0, 60)) for name in fmt.ARRAY_NAMES}
    rows = {name: draw(st.integers(1, 25)) for name in fmt.ARRAY_NAMES}
    arrays = {name: _random_records(draw, fmt.DTYPES[name], sizes[name]) for name in fmt.ARRAY_NAMES}
    fields = {
        name: draw(st.lists(st.sampled_from(fmt.DTYPES[name].names), min_size=1, unique=True))
        for name in fmt.ARRAY_NAMES
    }
    per_task = draw(st.integers(1, 4))
    dask_input = draw(st.booleans())
    return arrays, rows, fields, per_task, dask_input


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(datasets())
def test_round_trip_property(tmp_path_factory, case):
    arrays, rows, fields, per_task, dask_input = case
    out = tmp_path_factory.mktemp("rt") / "d.zarr"
    inputs = {n: (da.from_array(a, chunks=7) if dask_input and len(a) else a) for n, a in arrays.items()}
    l5dask.write_dataset(out, inputs, chunk_rows=rows)
    ds = l5dask.open_dataset(out)
    for name, expected in arrays.items():
        got = ds[name].to_dask(fields=fields[name], chunks_per_task=per_task).compute()
        assert got.dtype.names == tuple(fields[name])
        for f in fields[name]:
            assert got[f].tobytes() == expected[f].tobytes()  # bit-exact
        assert read_all(str(out))[name].tobytes() == expected.tobytes()  # and zarr-python 2 agrees


def test_local_writes_overwrite_in_place_to_the_new_length(tmp_path):
    """A rewritten file (a mask recomputed with --overwrite) is written over in place and cut to
    its new length: shorter, longer and empty contents read back exactly, the folder made when
    missing."""
    from l5dask.core.store import Store
    from l5dask.prediction.writing import put

    store = Store(str(tmp_path / "out.zarr"))
    path = tmp_path / "out.zarr" / "agents_mask" / "0.5" / "0.0"
    for data in (b"x" * 5000, b"short", np.arange(3000, dtype=np.uint32).tobytes(), b"", b"y" * 70):
        put(store, "agents_mask/0.5/0.0", data)
        assert path.read_bytes() == bytes(data)
