"""Bad input gets a clear error naming what is wrong; the CLI prints one line, exit 2."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import l5dask
from l5dask.errors import ChunkError, FormatError, NotADatasetError


@pytest.fixture
def copy(small_ds, tmp_path) -> Path:
    dest = tmp_path / "copy.zarr"
    shutil.copytree(small_ds, dest)
    return dest


def _edit_zarray(path: Path, name: str, **changes) -> None:
    meta = json.loads((path / name / ".zarray").read_text())
    meta.update(changes)
    (path / name / ".zarray").write_text(json.dumps(meta))


def cli(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "l5dask.cli", *args], capture_output=True, text=True, env=env)


def test_path_that_is_not_a_dataset(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(NotADatasetError, match="not an L5Kit dataset"):
        l5dask.open_dataset(tmp_path / "empty")
    with pytest.raises(NotADatasetError, match="no such file"):
        l5dask.open_dataset(tmp_path / "nowhere")


def test_missing_array(copy):
    shutil.rmtree(copy / "frames")
    with pytest.raises(FormatError, match="no 'frames' array"):
        l5dask.open_dataset(copy)


def test_dtype_lacking_a_needed_field(copy):
    meta = json.loads((copy / "agents" / ".zarray").read_text())
    _edit_zarray(copy, "agents", dtype=[f for f in meta["dtype"] if f[0] != "track_id"])
    with pytest.raises(FormatError, match="agents.*lacks the field.*track_id"):
        l5dask.open_dataset(copy)


def test_dtype_not_structured(copy):
    _edit_zarray(copy, "scenes", dtype="<f8")
    with pytest.raises(FormatError, match="not a structured dtype"):
        l5dask.open_dataset(copy)


def test_field_of_wrong_shape(copy):
    meta = json.loads((copy / "frames" / ".zarray").read_text())
    _edit_zarray(copy, "frames", dtype=[["timestamp", "<i8"] if f[0] == "timestamp" else f for f in meta["dtype"]]
                 + [])
    meta = json.loads((copy / "frames" / ".zarray").read_text())
    meta["dtype"] = [[f[0], f[1], [4]] if f[0] == "agent_index_interval" else f for f in meta["dtype"]]
    (copy / "frames" / ".zarray").write_text(json.dumps(meta))
    with pytest.raises(FormatError, match=r"frames.agent_index_interval has dtype <i8\[4\]"):
        l5dask.open_dataset(copy)


def test_object_dtype_refused(copy):
    meta = json.loads((copy / "scenes" / ".zarray").read_text())
    meta["dtype"] = [["host", "|O"] if f[0] == "host" else f for f in meta["dtype"]]
    (copy / "scenes" / ".zarray").write_text(json.dumps(meta))
    with pytest.raises(FormatError, match="host.*object/pickle decoding; refusing"):
        l5dask.open_dataset(copy)


def test_pickle_codec_refused(copy):
    _edit_zarray(copy, "agents", compressor={"id": "pickle", "protocol": 5})
    with pytest.raises(FormatError, match="compressor.*pickle.*not supported"):
        l5dask.open_dataset(copy)
    _edit_zarray(copy, "agents", compressor={"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1},
                 filters=[{"id": "pickle"}])
    with pytest.raises(FormatError, match="filters.*not supported"):
        l5dask.open_dataset(copy)


def test_truncated_chunk_names_array_and_key(copy):
    chunk = copy / "agents" / "2"
    chunk.write_bytes(chunk.read_bytes()[:1000])
    ds = l5dask.open_dataset(copy)
    with pytest.raises(ChunkError, match=r"array 'agents', chunk '2': truncated or corrupt"):
        ds["agents"].to_dask().compute()


def test_corrupt_chunk_names_array_and_key(copy):
    chunk = copy / "frames" / "1"
    data = bytearray(chunk.read_bytes())
    data[16:] = bytes(len(data) - 16)
    chunk.write_bytes(bytes(data))
    ds = l5dask.open_dataset(copy)
    with pytest.raises(ChunkError, match=r"array 'frames', chunk '1'"):
        _ = ds.frames.timestamp.values


def test_missing_chunk_object(copy):
    (copy / "agents" / "3").unlink()
    ds = l5dask.open_dataset(copy)
    with pytest.raises(ChunkError, match=r"array 'agents', chunk '3'.*'agents/3' is missing"):
        ds["agents"].to_dask().compute()
    # a range that does not touch the missing chunk still reads
    assert len(ds["agents"].to_dask()[:100].compute()) == 100


def test_cli_bad_input_is_one_line_exit_2(copy, tmp_path):
    (tmp_path / "empty").mkdir()
    r = cli("info", str(tmp_path / "empty"))
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "not an L5Kit dataset" in r.stderr
    assert "Traceback" not in r.stderr
    _edit_zarray(copy, "scenes", dtype="<f8")
    r = cli("info", str(copy))
    assert r.returncode == 2 and "not a structured dtype" in r.stderr and "Traceback" not in r.stderr
    r = cli("info", str(copy), "--storage-option", "novalue")
    assert r.returncode == 2 and "expected KEY=VALUE" in r.stderr
