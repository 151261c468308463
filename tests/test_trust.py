"""Never a plausible wrong answer: every class of damaged chunk and metadata (``tests/damage.py``)
is refused in one line by every command and every view that reads it, on a local folder, a zip
and S3, and nothing is written; the errors are also the builtins callers expect."""

from __future__ import annotations

import json
import locale
import math
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import l5dask
from l5dask import cli as l5cli
from l5dask.errors import (
    ChunkError,
    FormatError,
    L5DaskError,
    NotADatasetError,
    OutputError,
    StoreError,
    UnknownNameError,
    UsageError,
)
from l5dask.prediction.report import compute_report

from . import damage
from .conftest import SMALL_CHUNKS

ALL = damage.CHUNK + damage.METADATA
IDS = [name for name, _, _ in ALL]


@pytest.fixture(scope="module")
def damaged(tmp_path_factory) -> dict[str, Path]:
    """Every damage applied to its own copy of one generated dataset (read-only)."""
    root = tmp_path_factory.mktemp("damaged")
    base = root / "base.zarr"
    l5dask.synthesize(str(base), num_scenes=5, seed=7, chunk_rows=SMALL_CHUNKS)
    out = {"base": base}
    for name, edit, _ in ALL:
        shutil.copytree(base, root / name)
        edit(root / name)
        out[name] = root / name
    return out


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def _commands(data: str, out: Path, chunk_damage: bool) -> dict[str, list[str]]:
    cmds = {
        "stats": ["stats", data, "-q", "-o", str(out / "report.json"), "--scenes-table", str(out / "scenes.parquet")],
        "agg": [
            "agg",
            data,
            "-q",
            "-b",
            "scene_index,label",
            "--value",
            "speed:mean,q50",
            "-o",
            str(out / "agg.parquet"),
        ],
        "report": ["report", data, "-q", "-o", str(out / "report.html")],
        "export": ["export", data, "-o", str(out / "export"), "-q"],
        "subset": ["subset", data, "-o", str(out / "subset.zarr"), "--ranges", "0:2", "-q"],
        "concat": ["concat", data, data, "-o", str(out / "concat.zarr"), "-q"],
        "select-agents": ["select-agents", data, "-o", str(out / "mask.zarr"), "-q"],
        "gt": ["gt", data, "-o", str(out / "gt.csv"), "-q"],
    }
    if not chunk_damage:
        cmds["info"] = ["info", data]
    return cmds


def _run(args: list[str]):
    return CliRunner().invoke(l5cli.main, args)


def _assert_one_line(result, pattern: str) -> None:
    err = result.stderr.strip()
    assert result.exit_code == 2, (result.exit_code, result.output[-2000:], repr(result.exception))
    assert "\n" not in err and "Traceback" not in result.output, result.output
    assert err.startswith("l5dask: error: "), err
    assert re.search(pattern, err), (pattern, err)
    assert "np.float" not in err and "np.int" not in err, err


@pytest.mark.parametrize("name,edit,pattern", ALL, ids=IDS)
def test_every_command_refuses_it_in_one_line_and_writes_nothing(damaged, tmp_path, name, edit, pattern):
    chunk_damage = (name, edit, pattern) in damage.CHUNK
    for command, args in _commands(str(damaged[name]), tmp_path / "out", chunk_damage).items():
        (tmp_path / "out").mkdir()
        result = _run(args)
        _assert_one_line(result, pattern)
        if chunk_damage and command != "concat":  # (a command of one dataset names it, as for a missing chunk)
            assert result.stderr.startswith(f"l5dask: error: {damaged[name]}: array "), (command, result.stderr)
        assert _files(tmp_path / "out") == [], (command, _files(tmp_path / "out"))
        shutil.rmtree(tmp_path / "out")
    assert not (damaged[name] / "agents_mask").exists()


@pytest.mark.parametrize("name,edit,pattern", damage.CHUNK, ids=[n for n, _, _ in damage.CHUNK])
def test_every_view_refuses_a_damaged_chunk(damaged, name, edit, pattern):
    """The report's decode, the compressed gather (aggregate, dataframe), xarray and dask arrays:
    each raises the same ChunkError; none answers."""
    ds = l5dask.open_dataset(damaged[name])
    paths = {
        "report": lambda: compute_report(ds),
        "aggregate": lambda: l5dask.aggregate(ds, "agents", by=["label"], values={"speed": ["mean", "count"]}),
        "dataframe": lambda: ds.to_dask_dataframe("agents", columns=["speed", "label"]).compute(),
        "xarray": lambda: ds.agents.velocity.compute(),
        "joined": lambda: ds.joined("agents").centroid.compute(),
        "dask": lambda: ds["agents"].to_dask(fields=["track_id"]).compute(),
        "read_rows": lambda: ds["agents"].read_rows(0, 10, np.empty(10, ds["agents"].dtype)),
    }
    for what, run in paths.items():
        with pytest.raises(ChunkError, match=pattern):
            run()
        del what


@pytest.mark.parametrize("name,edit,pattern", damage.METADATA, ids=[n for n, _, _ in damage.METADATA])
def test_damaged_metadata_is_refused_when_opened(damaged, name, edit, pattern):
    with pytest.raises(FormatError, match=pattern) as info:
        l5dask.open_dataset(damaged[name])
    assert isinstance(info.value, ValueError)


def test_the_xarray_engine_refuses_damaged_metadata_and_chunks(damaged):
    import xarray as xr

    with pytest.raises(FormatError, match=dict((n, p) for n, _, p in ALL)["labels-all-equal"]):
        xr.open_datatree(damaged["labels-all-equal"], engine="l5kit")
    ds = xr.open_dataset(damaged["type-size-0"], engine="l5kit", group="agents", chunks={})
    with pytest.raises(ChunkError, match="type size 0"):
        ds.yaw.compute()


def test_a_faces_array_of_2_32_rows_is_refused_before_any_graph(damaged):
    """It took a minute and 2 GB to say no: the graph of 2 million tasks was built first."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(FormatError, match="is not stored"):
        l5dask.open_dataset(damaged["faces-4294967296-rows"])
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000  # KB: nothing built


def _s3_flags(s3) -> list[str]:
    """The command line's storage options for the moto server."""
    opts = s3.storage_options()
    pairs = (
        f"key={opts['key']}",
        f"secret={opts['secret']}",
        f"client_kwargs.endpoint_url={s3.endpoint}",
        "client_kwargs.region_name=us-east-1",
    )
    return [arg for pair in pairs for arg in ("-s", pair)]


# --- the same through a zip and S3 -----------------------------------------------------------------------
def _zip(folder: Path, dest: Path) -> Path:
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as z:
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                z.write(p, p.relative_to(folder).as_posix())
    return dest


@pytest.mark.parametrize("name,edit,pattern", ALL, ids=IDS)
def test_zip_and_s3_refuse_it_the_same_through_every_command(damaged, tmp_path, s3, name, edit, pattern):
    s3.make_bucket("l5-damaged")
    fs = s3.s3fs()
    remote = f"l5-damaged/{name}.zarr"
    if not fs.exists(remote):
        fs.put(str(damaged[name]), remote, recursive=True)
    flags = _s3_flags(s3)
    archive = str(_zip(damaged[name], tmp_path / f"{name}.zip"))
    chunk_damage = (name, edit, pattern) in damage.CHUNK
    for data, extra in ((archive, []), (f"s3://{remote}", flags)):
        for command, args in _commands(data, tmp_path / "out", chunk_damage).items():
            out = tmp_path / "out"
            out.mkdir()
            _assert_one_line(_run(args + extra), pattern)
            assert _files(out) == [], (command, _files(out))
            shutil.rmtree(out)


# --- validate: every chunk's header and size, every chunk decoded with --full ---------------------------
#: chunk damages whose header and size are sound: found by decoding the chunk (--full) only
DECODE_ONLY = {"stream-zeroed"}


def _validate(data: str, full: bool, extra: tuple[str, ...] = ()) -> tuple[int, list[str], str]:
    result = _run(["validate", data, *(["--full", "-q"] if full else []), *extra])
    assert "Traceback" not in result.output, result.output
    return result.exit_code, result.stdout.splitlines(), result.stderr


@pytest.mark.parametrize("name,edit,pattern", damage.CHUNK, ids=[n for n, _, _ in damage.CHUNK])
def test_validate_lists_the_damaged_chunk_that_stats_refuses(damaged, tmp_path, s3, name, edit, pattern):
    """``l5dask validate`` said "no problems" (exit 0) on a truncated agents chunk that ``stats``
    refuses: it checked only the intervals. Each chunk's size and header are checked now (a 16-byte
    read each), every chunk decoded with ``--full``: the fault on one line, exit 1; locally and on S3."""
    s3.make_bucket("l5-damaged")
    fs = s3.s3fs()
    remote = f"l5-damaged/{name}.zarr"
    if not fs.exists(remote):
        fs.put(str(damaged[name]), remote, recursive=True)
    for data, extra in ((str(damaged[name]), ()), (f"s3://{remote}", tuple(_s3_flags(s3)))):
        for full in (False, True):
            code, lines, err = _validate(data, full, extra)
            if name in DECODE_ONLY and not full:
                assert code == 0 and lines[-1].endswith("no faults (chunk headers and sizes, intervals)"), lines
                continue
            assert code == 1 and len(lines) == 1 and re.fullmatch(pattern + ".*", lines[0]), (data, full, lines, err)
            assert err.strip() == "1 fault(s)"


def test_validate_lists_every_fault_a_line_each_and_finds_none_in_a_sound_dataset(damaged, tmp_path):
    base = tmp_path / "several.zarr"
    shutil.copytree(damaged["base"], base)
    assert _validate(str(base), False)[:2] == (0, [f"{base}: no faults (chunk headers and sizes, intervals)"])
    assert _validate(str(base), True)[:2] == (0, [f"{base}: no faults (every chunk decoded, intervals)"])
    raw = (base / "agents" / "1").read_bytes()
    (base / "agents" / "1").write_bytes(raw[:100])
    (base / "frames" / "0").unlink()
    (base / "agents" / "3").write_bytes(damage.with_header((base / "agents" / "3").read_bytes(), version=3))
    code, lines, err = _validate(str(base), False)
    assert code == 1 and err.strip() == "3 fault(s)", (lines, err)
    assert lines == [
        "array 'frames', chunk '0': object 'frames/0' is missing",
        f"array 'agents', chunk '1': truncated or corrupt chunk (it holds 100 bytes, its header says {len(raw)})",
        "array 'agents', chunk '3': truncated or corrupt chunk (blosc format version 3 in its header, not 2)",
    ]
    assert (base / "agents" / "1").read_bytes() == raw[:100]  # reported, never repaired


def test_validate_reports_damaged_metadata_as_a_fault(damaged):
    code, lines, err = _validate(str(damaged["big-endian-velocity"]), False)
    assert code == 1 and len(lines) == 1 and "field 'velocity' has dtype '>f4', big-endian" in lines[0]


@pytest.mark.parametrize("name,edit", damage.VALID, ids=[n for n, _ in damage.VALID])
def test_valid_encodings_zarr_python_2_decodes_are_read_as_it_reads_them(damaged, tmp_path, name, edit):
    """Bytes after the compressed size, a blosc type size that is not the record size: valid
    chunks that zarr-python 2 decodes, once refused. Every reader answers as on the chunk they
    replace, which zarr-python 2 reads the same; validate finds no fault."""
    import json

    import pandas as pd

    from l5dask.core.outputs import public

    from .conftest import read_all

    data = tmp_path / name
    shutil.copytree(damaged["base"], data)
    edit(data)
    base = damaged["base"]
    assert (data / "agents" / "0").read_bytes() != (base / "agents" / "0").read_bytes()
    want = read_all(str(base))["agents"]
    assert read_all(str(data))["agents"].tobytes() == want.tobytes()  # zarr-python 2 decodes it
    ds, ref = l5dask.open_dataset(data), l5dask.open_dataset(base)
    report, reference = (dict(public(compute_report(d)), dataset=None) for d in (ds, ref))
    assert json.dumps(report, sort_keys=True) == json.dumps(reference, sort_keys=True)
    agg = {"by": ["scene_index", "label"], "values": {"speed": ["mean", "count"], "extent_length": ["q50"]}}
    pd.testing.assert_frame_equal(l5dask.aggregate(ds, "agents", **agg), l5dask.aggregate(ref, "agents", **agg))
    cols = ["speed", "label", "track_id"]
    pd.testing.assert_frame_equal(
        ds.to_dask_dataframe("agents", columns=cols).compute(), ref.to_dask_dataframe("agents", columns=cols).compute()
    )
    assert ds.agents.velocity.values.tobytes() == want["velocity"].tobytes()
    np.testing.assert_array_equal(ds.joined("agents").label.values, ref.joined("agents").label.values)
    assert ds["agents"].read_rows(0, 10, np.empty(10, want.dtype)).tobytes() == want[:10].tobytes()
    for full in (False, True):
        assert _validate(str(data), full)[0] == 0


# --- the same answer from every reader --------------------------------------------------------------------
def _padded(tmp_path: Path, corrupt_padding: bool) -> Path:
    """A dataset whose last agents chunk is mostly padding rows (the array cut short, the frames
    with it), the padding's last block corrupt or not."""
    path = tmp_path / ("cut.zarr" if corrupt_padding else "whole.zarr")
    l5dask.synthesize(str(path), num_scenes=2, seed=5, chunk_rows={"agents": 60_000})
    ds = l5dask.open_dataset(path)
    agents = ds["agents"].read(0, ds["agents"].meta.nchunks)
    assert len(agents) < 40_000, "the generated scenes must leave a padded last chunk"
    last = path / "agents" / str(ds["agents"].meta.nchunks - 1)
    raw = bytearray(last.read_bytes())
    h = damage.header(bytes(raw))
    nblocks = -(-h[4] // h[5])
    assert nblocks >= 2 and (nblocks - 1) * h[5] >= len(agents) * 116, "a block of padding only"
    if corrupt_padding:
        start = int.from_bytes(raw[16 + 4 * (nblocks - 1) : 20 + 4 * (nblocks - 1)], "little")
        raw[start + 4 :] = bytes(len(raw) - start - 4)  # the last block's LZ4 stream zeroed: offset 0
        last.write_bytes(bytes(raw))
    return path


def test_a_corrupt_padding_block_is_refused_by_every_reader(tmp_path):
    """The report (numcodecs' decode) refused it and aggregate (the compressed gather, which
    skipped padding blocks) answered: now both refuse, as c-blosc does."""
    ok = l5dask.open_dataset(_padded(tmp_path, False))
    assert l5dask.aggregate(ok, "agents", by=["label"], values={"speed": ["count"]})["speed_count"].sum() > 0
    ds = l5dask.open_dataset(_padded(tmp_path, True))
    with pytest.raises(ChunkError, match="truncated or corrupt"):
        compute_report(ds)
    with pytest.raises(ChunkError, match="truncated or corrupt"):
        l5dask.aggregate(ds, "agents", by=["label"], values={"speed": ["count"]})
    with pytest.raises(ChunkError, match="truncated or corrupt"):
        ds.to_dask_dataframe("agents", columns=["speed"]).compute()


# --- one error story --------------------------------------------------------------------------------------
def test_errors_are_also_the_builtins_callers_expect(small_ds, tmp_path):
    ds = l5dask.open_dataset(small_ds)
    with pytest.raises(ValueError, match="is out of range: the dataset has 5 scenes"):
        l5dask.subset(ds, str(tmp_path / "s.zarr"), scenes="3:9")  # L5Kit raises ValueError too
    with pytest.raises(UsageError):
        l5dask.subset(ds, str(tmp_path / "s.zarr"), scenes="nonsense")
    with pytest.raises(FileNotFoundError):
        l5dask.open_dataset(tmp_path / "nowhere.zarr")
    for cls, builtin in (
        (UsageError, ValueError),
        (FormatError, ValueError),
        (ChunkError, ValueError),
        (NotADatasetError, FileNotFoundError),
        (StoreError, OSError),
        (OutputError, OSError),
        (UnknownNameError, KeyError),
    ):
        assert issubclass(cls, L5DaskError) and issubclass(cls, builtin)
    assert str(UnknownNameError("plain words")) == "plain words"


def test_no_bare_l5dask_error_is_raised():
    """Each raise names the class a caller can catch as a builtin (errors.py's table)."""
    package = Path(l5dask.__file__).parent
    bare = [
        f"{p.relative_to(package)}:{i + 1}"
        for p in package.rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines())
        if "raise L5DaskError(" in line
    ]
    assert bare == []


def _comma_locale(tmp_path: Path) -> dict | None:
    """An environment whose LC_ALL is a comma-decimal locale (compiled here with localedef)."""
    target = tmp_path / "locales"
    target.mkdir()
    made = subprocess.run(["localedef", "-i", "de_DE", "-f", "UTF-8", str(target / "de_DE.UTF-8")], capture_output=True)
    if made.returncode not in (0, 1) or not (target / "de_DE.UTF-8").exists():
        return None
    return dict(os.environ, LOCPATH=str(target), LC_ALL="de_DE.UTF-8")


def test_the_csv_number_parser_ignores_the_process_locale(tmp_path):
    """glibc's strtod follows LC_NUMERIC: under a comma-decimal locale it read "1.2345678901234567"
    as 1.0. Numbers that take strtod (more than 2**53 in the mantissa, exponents past 22) are
    parsed in a process whose locale was set from such an environment, and equal ``float()``."""
    env = _comma_locale(tmp_path)
    from .conftest import require

    require(env is not None, "localedef and Debian's locales (de_DE)")
    rng = np.random.default_rng(3)
    n, T = 40, 2
    values = [repr(float(v)) for v in rng.normal(0, 1e3, n * T * 2)]
    values[:6] = ["1.2345678901234567", "-98765.43210987654321", "1e-300", "2.5e+30", "0.1", "123456789012345678901"]
    from l5dask.evaluation.csvfiles import gt_header

    header = ",".join(gt_header(T))
    lines = [header] + [f"{i},{i},1.0,1.0," + ",".join(values[i * 4 : (i + 1) * 4]) for i in range(n)]
    (tmp_path / "gt.csv").write_text("\n".join(lines) + "\n")
    script = (
        "import locale, sys, numpy as np\n"
        "locale.setlocale(locale.LC_ALL, '')\n"
        "assert locale.localeconv()['decimal_point'] == ','\n"
        "from l5dask.evaluation.csvfiles import read_gt_csv\n"
        "f = read_gt_csv(sys.argv[1])\n"
        "np.save(sys.argv[2], np.asarray(f.coords.compute(), dtype=np.float64))\n"
    )
    subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "gt.csv"), str(tmp_path / "out.npy")], env=env, check=True
    )
    got = np.load(tmp_path / "out.npy").reshape(-1)
    want = np.array([float(v) for v in values], np.float64)
    np.testing.assert_array_equal(got.view(np.uint64), want.view(np.uint64))  # bit for bit
    assert locale.localeconv()["decimal_point"] == "."  # this process untouched


# --- perception tables: typed, on a folder, a zip and S3 -------------------------------------------------
def test_perception_tables_are_typed_on_every_store(tmp_path, s3):
    """A list where a string belongs: DuckDB cast it to the text '["lidar"]' and the report said 0
    lidar sweeps, exit 0. Refused in one line, the same from a folder, a zip and S3."""
    from l5dask.perception.synth import generate

    from .perception_data import load, save

    root = tmp_path / "perception"
    generate(str(root), num_scenes=1, seed=3, samples_per_scene=6, lidar_points=20, images=False)  # (60 objects)
    rows = load(str(root), "sensor")
    i = next(k for k, r in enumerate(rows) if r["modality"] == "lidar")
    rows[i]["modality"] = ["lidar"]
    save(str(root), "sensor", rows)
    pattern = (
        rf"sensor\.json: row {i} \(token {rows[i]['token']}\): modality is a list \(\[\"lidar\"\]\), expected a string"
    )
    s3.make_bucket("l5-perception")
    s3.s3fs().put(str(root), "l5-perception/bad", recursive=True)
    flags = _s3_flags(s3)
    archive = _zip(root, tmp_path / "perception.zip")
    for data, extra in ((str(root), []), (str(archive), []), ("s3://l5-perception/bad", flags)):
        out = tmp_path / "out"
        out.mkdir()
        _assert_one_line(_run(["perception", "stats", data, "-o", str(out / "p.json"), "-q", *extra]), pattern)
        assert _files(out) == []
        shutil.rmtree(out)


def _strict(text: str, where: str):
    """``text`` parsed by a JSON parser that refuses NaN and Infinity (not JSON, RFC 8259)."""

    def refuse(name: str):
        raise AssertionError(f"{where}: {name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_the_json_writer_writes_strict_json(tmp_path):
    from l5dask.core.outputs import json_text, write_json

    report = {"a": math.nan, "b": [1.5, -math.inf, {"c": math.inf}], "d": (2, "x"), "_private": math.nan}
    write_json(report, str(tmp_path / "r.json"))
    assert _strict((tmp_path / "r.json").read_text(), "r.json") == {
        "a": None,
        "b": [1.5, None, {"c": None}],
        "d": [2, "x"],
    }
    assert json_text({"x": [math.nan]}) == '{"x": [null]}'


def test_every_json_output_of_every_command_is_strict_json(tmp_path):
    """Each command that writes JSON (reports, metrics, dataset metadata, printed JSON) run on
    generated data, and every JSON file it leaves parsed by a parser that refuses NaN and Infinity."""
    from l5dask.evaluation import read_gt_csv, write_pred_csv

    data, pdata, out = str(tmp_path / "d.zarr"), str(tmp_path / "lyft"), tmp_path / "out"
    out.mkdir()
    assert _run(["synth", "-o", data, "--num-scenes", "3", "--seed", "5"]).exit_code == 0
    assert (
        _run(
            ["perception", "synth", "-o", pdata, "--num-scenes", "1", "--lidar-points", "300", "--no-images"]
        ).exit_code
        == 0
    )
    printed = {}
    cmds = {
        "stats": ["stats", data, "-q", "-o", str(out / "stats.json")],
        "report": ["report", data, "-q", "-o", str(out / "report.html"), "--json", str(out / "report.json")],
        "export": ["export", data, "-o", str(out / "export"), "-f", "zarr3", "-q"],
        "subset": ["subset", data, "-o", str(out / "subset.zarr"), "--ranges", "0:2", "-q"],
        "split": ["split", data, "-o", str(out / "split"), "--part", "a=1", "--part", "b=rest", "-q"],
        "concat": ["concat", data, data, "-o", str(out / "concat.zarr"), "-q"],
        "chop": ["chop", data, "--frames", "60", "-o", str(out / "chop"), "-q"],
        "select-agents": ["select-agents", data, "-o", str(out / "mask.zarr"), "-q"],
        "gt": ["gt", data, "-o", str(out / "gt.csv"), "-q"],
        "perception stats": ["perception", "stats", pdata, "-o", str(out / "pstats.json"), "-q"],
        "perception report": [
            *("perception", "report", pdata, "-o", str(out / "preport.html")),
            *("--json", str(out / "preport.json"), "--points-in-boxes", "-q"),
        ],
        "perception to-l5kit": ["perception", "to-l5kit", pdata, "-o", str(out / "from-perception.zarr")],
    }
    for name, args in cmds.items():
        r = _run(args)
        assert r.exit_code == 0, (name, r.output[-2000:], repr(r.exception))
        printed[name] = r.stdout
    # L5Kit's metrics of predictions made from the ground truth (a zero-confidence mode among them)
    g = read_gt_csv(str(out / "gt.csv"))
    coords = g.coords.compute()
    pred = np.stack([coords, coords + 1.0, coords - 1.0], axis=1)
    conf = np.tile([0.7, 0.3, 0.0], (len(coords), 1))
    write_pred_csv(str(out / "pred.csv"), g.timestamps.compute(), g.track_ids.compute(), pred, conf)
    r = _run(["evaluate", str(out / "gt.csv"), str(out / "pred.csv"), "-o", str(out / "metrics.json"), "-q"])
    assert r.exit_code == 0, (r.output[-2000:], repr(r.exception))
    r = _run(
        ["evaluate", str(out / "gt.csv"), str(out / "pred.csv"), "--dataset", data, "-o", str(out / "m2.json"), "-q"]
    )
    assert r.exit_code == 0, (r.output[-2000:], repr(r.exception))
    # the Lyft SDK's mAP of a dataset's ground truth given back as predictions (with its distance bands)
    load = lambda n: json.loads((Path(pdata) / "data" / f"{n}.json").read_text())  # noqa: E731
    cat = {c["token"]: c["name"] for c in load("category")}
    inst = {i["token"]: cat[i["category_token"]] for i in load("instance")}
    boxes = [
        {k: a[k] for k in ("sample_token", "translation", "size", "rotation")}
        | {"name": inst[a["instance_token"]], "score": 0.5}
        for a in load("sample_annotation")
    ]
    (out / "boxes.json").write_text(json.dumps(boxes))
    r = _run(["perception", "evaluate", str(out / "boxes.json"), "--dataset", pdata, "-o", str(out / "det.json"), "-q"])
    assert r.exit_code == 0, (r.output[-2000:], repr(r.exception))
    assert _strict((out / "det.json").read_text(), "det.json")["by_distance"][-1]["band"] == [50.0, None]
    # demo: a dataset and its report
    r = _run(["demo", "--num-scenes", "1", "--output", str(out / "demo")])
    assert r.exit_code == 0, (r.output[-2000:], repr(r.exception))
    # every JSON file written (reports, metrics, zarr metadata, the perception tables) and the printed JSON
    names = {".zarray", ".zattrs", ".zgroup", ".zmetadata"}
    files = [p for p in [*out.rglob("*"), *Path(pdata).rglob("*")] if p.suffix == ".json" or p.name in names]
    kinds = {p.name for p in files}
    assert {"stats.json", "report.json", "pstats.json", "preport.json", "metrics.json", "m2.json", "det.json"} <= kinds
    assert {".zarray", ".zattrs", "zarr.json", "sample_annotation.json"} <= kinds
    for p in files:
        _strict(p.read_text(), str(p))
    text = printed["select-agents"]
    _strict(text[: text.index("\n}\n") + 2], "select-agents' printed report")
