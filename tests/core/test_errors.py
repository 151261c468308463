"""Bad input gets a clear error naming what is wrong; the CLI prints one line, exit 2."""

from __future__ import annotations

import json
import os
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
    _edit_zarray(copy, "frames", dtype=[["timestamp", "<i8"] if f[0] == "timestamp" else f for f in meta["dtype"]] + [])
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
    _edit_zarray(
        copy,
        "agents",
        compressor={"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1},
        filters=[{"id": "pickle"}],
    )
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


def test_no_credentials_is_said_so_not_access_denied():
    """A new user's trial: with no credentials at all, obstore asked the instance metadata service
    (refused outside EC2) and the line said "access denied", quoting the metadata request. The
    line now says that no credentials were found and where to give them; a refusal with
    credentials is still "access denied"."""
    from l5dask.core.store import _denied

    imds = PermissionError(
        13,
        "Generic S3 error: Error performing PUT http://169.254.169.254/latest/api/token - 403 Forbidden: resolve_deny",
    )
    err = _denied("s3://bkt1/s20.zarr", imds, ".zgroup")
    assert str(err).startswith("s3://bkt1/s20.zarr: no credentials found reading '.zgroup': give them in the storage")
    assert "169.254" not in str(err) and "\n" not in str(err)
    refused = PermissionError(13, "Forbidden: AccessDenied")
    assert str(_denied("s3://b/x.zarr", refused)) == "s3://b/x.zarr: access denied ([Errno 13] Forbidden: AccessDenied)"


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


@pytest.mark.parametrize("value", ["{bad", "[1, 2", ' {"key": }'])
def test_a_storage_option_that_starts_as_json_but_does_not_parse_is_refused(small_ds, tmp_path, value):
    """``-s 'client_kwargs={bad'`` was taken as the string ``{bad`` (and a local dataset's run
    went on without a word): a value that starts as JSON is JSON or a one-line error."""
    from l5dask.core.commands import parse_storage_options

    r = cli("stats", small_ds, "-s", f"client_kwargs={value}", "-q", "-o", tmp_path / "r.json")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"--storage-option 'client_kwargs={value}'" in r.stderr and "does not parse" in r.stderr
    assert not (tmp_path / "r.json").exists()
    # what parses is taken as JSON, and other values as strings
    assert parse_storage_options(('a.b={"c": 1}', "d=[1]", "e=anon", 'f="{x"')) == {
        "a": {"b": {"c": 1}},
        "d": [1],
        "e": "anon",
        "f": "{x",
    }


# --- outputs: checked before any work, written atomically, failures named ------------------------
@pytest.fixture
def unreadable(small_ds, tmp_path) -> Path:
    """A dataset whose every chunk raises if it is read (metadata intact)."""
    dest = tmp_path / "unreadable.zarr"
    shutil.copytree(small_ds, dest)
    for chunk in dest.glob("*/[0-9]*"):
        chunk.write_bytes(b"not blosc")
    return dest


def test_write_that_fails_midway_keeps_the_previous_file(tmp_path):
    from l5dask.core.outputs import atomic_write

    out = tmp_path / "r.json"
    out.write_text("previous")

    def write(tmp):
        with open(tmp, "w") as f:
            f.write("half of a report")
            f.flush()
            raise OSError(28, "No space left on device")

    with pytest.raises(l5dask.L5DaskError, match=rf"{out}: writing failed.*No space left on device"):
        atomic_write(str(out), write)
    assert out.read_text() == "previous" and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_a_folder_written_whole_or_not_at_all(tmp_path):
    """``atomic_output(folder=True)``: a folder that fails midway leaves the previous one as it was
    and nothing beside it; one written whole replaces it (its old files gone), with the usual mode."""
    from l5dask.core.outputs import atomic_output

    out = tmp_path / "out"
    out.mkdir()
    (out / "old").write_text("previous")
    with pytest.raises(l5dask.L5DaskError, match=rf"{out}: writing failed, the previous folder.*No space left"):
        with atomic_output(str(out), folder=True) as tmp:
            (Path(tmp) / "part").write_text("half")
            raise OSError(28, "No space left on device")
    assert [p.name for p in out.iterdir()] == ["old"] and [p.name for p in tmp_path.iterdir()] == ["out"]
    with pytest.raises(KeyboardInterrupt):
        with atomic_output(str(out), folder=True) as tmp:
            raise KeyboardInterrupt
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    with atomic_output(str(out), folder=True) as tmp:
        os.makedirs(os.path.join(tmp, "sub"))
        (Path(tmp) / "sub" / "new").write_text("whole")
    assert [p.name for p in out.iterdir()] == ["sub"] and (out / "sub" / "new").read_text() == "whole"
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask and [p.name for p in tmp_path.iterdir()] == ["out"]


@pytest.mark.parametrize("command", ["stats", "report"])
def test_cli_output_on_a_full_disk_keeps_the_previous_file(small_ds, tmp_path, command):
    """A real file-size limit (RLIMIT_FSIZE) fills the 'disk' midway through the output."""
    import resource
    import signal

    out = tmp_path / ("r.json" if command == "stats" else "r.html")
    out.write_text("previous")

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))

    # matplotlib builds its font cache on first use; on a fresh machine that write would hit the
    # limit too (its own one-line warning): build it first, as any earlier run would have
    subprocess.run([sys.executable, "-c", "import matplotlib.font_manager"], check=True)
    r = subprocess.run(
        [sys.executable, "-m", "l5dask.cli", command, small_ds, "--output", str(out), "--quiet"],
        capture_output=True,
        text=True,
        preexec_fn=limit,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and f"{out}: writing failed" in r.stderr and "Traceback" not in r.stderr
    assert out.read_text() == "previous" and sorted(p.name for p in tmp_path.iterdir()) == [out.name]


@pytest.mark.parametrize(
    "args",
    [
        ["stats", "{ds}", "--output", "{tmp}/missing/r.json"],
        ["stats", "{ds}", "--output", "{tmp}/ok.json", "--scenes-table", "{tmp}/missing/s.parquet"],
        ["report", "{ds}", "--output", "{tmp}/missing/r.html"],
        ["report", "{ds}", "--output", "{tmp}/r.html", "--json", "{tmp}/missing/r.json"],
        ["stats", "{ds}", "--output", "{tmp}"],
    ],
)
def test_outputs_are_checked_before_any_chunk_is_read(unreadable, tmp_path, args):
    r = cli(*[a.format(ds=unreadable, tmp=tmp_path) for a in args], "--quiet")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    # the output's problem, not the dataset's: nothing was read
    assert any(w in r.stderr for w in ("does not exist", "is a folder", "is a directory")) and "chunk" not in r.stderr


def test_a_damaged_archive_is_one_line(small_ds, tmp_path):
    """A file named .zip or .tar that is not one, or is cut short (a partial download), was a
    traceback of zipfile's or tarfile's (a new user's trial): one line, exit 2, for the prediction
    commands, the perception ones and ``open_dataset``; an intact archive of the same dataset reads."""
    import tarfile
    import zipfile

    good_zip, good_tar = tmp_path / "good.zip", tmp_path / "good.tar"
    with zipfile.ZipFile(good_zip, "w") as z:
        for f in Path(small_ds).rglob("*"):
            z.write(f, f.relative_to(small_ds))
    with tarfile.open(good_tar, "w") as t:
        t.add(small_ds, arcname=".")
    (tmp_path / "fake.zip").write_text("notzip\n")
    (tmp_path / "cut.zip").write_bytes(good_zip.read_bytes()[:10_000])
    (tmp_path / "cut.tar").write_bytes(good_tar.read_bytes()[:20_000])
    (tmp_path / "fake.tar").write_text("notzip\n")
    for name, kind in (("fake.zip", "zip"), ("cut.zip", "zip"), ("cut.tar", "tar"), ("fake.tar", "tar")):
        path = tmp_path / name
        for args in (["info", path], ["stats", path, "-q"], ["perception", "stats", path, "-q"]):
            r = cli(*args)
            assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, (args, r.stderr)
            assert r.stderr.startswith(f"l5dask: error: {path}: not a {kind} that can be read ("), r.stderr
        with pytest.raises(NotADatasetError, match=f"not a {kind} that can be read"):
            l5dask.open_dataset(str(path))
    # a zip whose entries need a version of the format zipfile does not implement (a fuzzer's
    # finding: zipfile's NotImplementedError, "zip file version 9.0", was a traceback)
    data = bytearray(good_zip.read_bytes())
    at = data.find(b"PK\x01\x02")
    data[at + 6 : at + 8] = (90).to_bytes(2, "little")  # (the first entry's "version needed to extract")
    (tmp_path / "v9.zip").write_bytes(bytes(data))
    path = tmp_path / "v9.zip"
    for args in (["info", path], ["stats", path, "-q"], ["perception", "stats", path, "-q"]):
        r = cli(*args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, (args, r.stderr)
        assert r.stderr == f"l5dask: error: {path}: a zip that Python's zipfile cannot read (zip file version 9.0)\n"
    with pytest.raises(NotADatasetError, match="a zip that Python's zipfile cannot read"):
        l5dask.open_dataset(str(path))
    for good in (good_zip, good_tar):
        assert l5dask.open_dataset(str(good)).counts() == l5dask.open_dataset(small_ds).counts()


def test_usage_errors_are_one_line(small_ds):
    for args in (["stats"], ["stats", small_ds, "--chunks-per-task", "0"], ["nosuchcommand"], ["stats", "--bogus"]):
        r = cli(*args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, (args, r.stderr)
        assert r.stderr.startswith("l5dask: error: ") and "Usage" not in r.stderr, r.stderr


def test_what_a_location_is_when_it_is_not_a_dataset(tmp_path):
    (tmp_path / "file.txt").write_text("hello")
    (tmp_path / "v3").mkdir()
    (tmp_path / "v3" / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group"}')
    (tmp_path / "perception" / "train_data").mkdir(parents=True)
    for t in ("scene.json", "sample.json"):
        (tmp_path / "perception" / "train_data" / t).write_text("[]")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "a.csv").write_text("x")
    for where, says in [
        ("file.txt", "it is a file"),
        ("v3", "a zarr v3 store"),
        ("perception", "a Lyft perception dataset"),
        ("other", "it holds a.csv"),
    ]:
        with pytest.raises(NotADatasetError, match=f"not an L5Kit dataset: {says}|not an L5Kit dataset .*{says}"):
            l5dask.open_dataset(tmp_path / where)
        r = cli("stats", str(tmp_path / where), "--quiet")
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and says in r.stderr, r.stderr
    r = cli("info", "/etc/hostname")
    assert r.returncode == 2 and "it is a file" in r.stderr and "Not a directory" not in r.stderr


def test_every_system_command_is_listed_and_runs_from_its_subpackage():
    """The systems' commands are imported only when used: each one its module declares is named
    in the CLI's table (else it could not be found), and each name there is a command."""
    import importlib

    import click

    from l5dask import cli

    declared = {
        c.name: m for m in set(cli.SYSTEMS.values()) for c in importlib.import_module(f"l5dask.{m}.cli").COMMANDS
    }
    assert declared == cli.SYSTEMS
    ctx = click.Context(cli.main)
    assert set(cli.SYSTEMS) <= set(cli.main.list_commands(ctx))
    for name in cli.SYSTEMS:
        assert cli.main.get_command(ctx, name).name == name
