"""JSON text (``l5dask.core.outputs.json_text``): with ``indent`` alone, the text json's own encoder
makes of the value with its non-finite numbers as null, without json's pure-Python encoder for
lists of plain numbers (a report's per-scene lists)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from l5dask.core.outputs import finite, json_text

PLAIN = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
)
LEAVES = st.one_of(PLAIN, st.text(max_size=6))
VALUES = st.recursive(
    LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.lists(PLAIN, max_size=8),
        st.lists(PLAIN, max_size=5).map(tuple),
        st.dictionaries(st.text(max_size=5), inner, max_size=5),
    ),
    max_leaves=40,
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(VALUES, st.integers(0, 4))
def test_indented_text_is_json_dumps_of_the_finite_value(value, indent):
    expected = json.dumps(finite(value), allow_nan=False, indent=indent)
    assert json_text(value, indent=indent) == expected
    got = json.loads(json_text(value, indent=indent))
    assert json.dumps(got, indent=indent) == expected


def test_what_json_leaves_to_its_own_encoder_is_unchanged():
    class Label(str):
        pass

    for value in ({1: 2.5, "a": [float("nan")]}, {None: 1}, [Label("x"), 1.5], {"a": (1, [True, None])}):
        assert json_text(value, indent=1) == json.dumps(finite(value), allow_nan=False, indent=1)
    with pytest.raises(TypeError, match="set"):
        json_text({"a": {1, 2}}, indent=1)


def test_a_reports_lists_of_numbers_skip_jsons_python_encoder(monkeypatch):
    """A report of 1 G agents has three lists of 57,800 scenes: json's pure-Python encoder (the one
    it takes whenever it indents) spent 0.073 CPU-s on them, a sixth of a rerun from the cache."""
    import json.encoder

    report = {
        "per_scene": {
            "num_agents": list(range(2000)),
            "ego_distance_m": [i / 7 for i in range(1999)] + [math.nan],
        },
        "histogram": {"edges": [0.0, 0.5, math.inf], "counts": [3, 4]},
        "name": "synth",
    }
    expected = json.dumps(finite(report), allow_nan=False, indent=1)

    def refused(*args, **kw):
        raise AssertionError("json's pure-Python encoder was used")

    monkeypatch.setattr(json.encoder, "_make_iterencode", refused)
    assert json_text(report, indent=1) == expected


def test_atomic_outputs_never_change_the_umask(tmp_path, monkeypatch):
    """An output (a file, a folder) gets the usual mode, 0666 (0777) less the umask, without the
    process's umask being set (another thread making a file meanwhile would get the mode 0666:
    the cache's entries are written from the workers' threads); its temporary name is new each
    time, and nothing but the output is left."""
    import os

    from l5dask.core.outputs import atomic_output

    umask = os.umask(0o027)
    try:

        def refuse(mask):
            raise AssertionError("os.umask called")

        monkeypatch.setattr(os, "umask", refuse)
        temps = set()
        for i in range(3):
            with atomic_output(str(tmp_path / "out.bin")) as tmp:
                temps.add(tmp)
                with open(tmp, "wb") as f:
                    f.write(bytes([i]))
        with atomic_output(str(tmp_path / "folder"), folder=True) as tmp:
            with open(os.path.join(tmp, "x"), "w") as f:
                f.write("x")
        monkeypatch.undo()
    finally:
        os.umask(umask)
    assert len(temps) == 3 and (tmp_path / "out.bin").read_bytes() == b"\x02"
    assert (tmp_path / "out.bin").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "folder").stat().st_mode & 0o777 == 0o750
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "out.bin"]


def _read_fifo(path, got):
    with open(path, "rb") as f:
        got.append(f.read())


def test_an_output_on_a_named_pipe_is_written_through_not_replaced(tmp_path):
    """A device or a pipe (``-o /dev/null``, ``-o /dev/stdout``) takes the bytes, once whole, and
    stays what it is: a rename onto it would put a regular file in its place (as root, /dev/null)."""
    import os
    import stat
    import threading

    from l5dask.core.outputs import atomic_write, check_writable

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert check_writable(str(fifo)) == str(fifo)
    got: list = []
    reader = threading.Thread(target=_read_fifo, args=(fifo, got), daemon=True)
    reader.start()
    atomic_write(str(fifo), lambda tmp: open(tmp, "w").write('{"a": 1}'))
    reader.join(10)
    assert got == [b'{"a": 1}']
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still the pipe
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]  # no temporary left beside it


def test_an_output_through_a_link_replaces_the_file_and_keeps_the_link(tmp_path):
    import os

    from l5dask.core.outputs import atomic_write

    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "report.json"
    target.write_text("old")
    link = tmp_path / "report.json"
    os.symlink(target, link)
    atomic_write(str(link), lambda tmp: open(tmp, "w").write("new"))
    assert os.path.islink(link) and os.readlink(link) == str(target)
    assert target.read_text() == "new"
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["report.json"]


def test_the_cli_writes_a_report_into_a_named_pipe(tmp_path, small_ds):
    """``l5dask stats DS -o PIPE``: the report's JSON comes out of the pipe, which stays a pipe."""
    import json
    import os
    import stat
    import subprocess
    import sys
    import threading

    fifo = tmp_path / "report-pipe"
    os.mkfifo(fifo)
    got: list = []
    reader = threading.Thread(target=_read_fifo, args=(fifo, got), daemon=True)
    reader.start()
    proc = subprocess.run(
        [sys.executable, "-m", "l5dask.cli", "stats", small_ds, "-o", str(fifo), "-q"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    reader.join(30)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(got[0])["counts"]["scenes"] == 5
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_killed_writers_temporary_folder_is_removed_by_the_next_write(tmp_path):
    """A folder output's temporary folder (``.NAME.PID@HOST.<random>.partial``) left by a process
    killed with SIGKILL is removed when the output is next written; a live process's and another
    machine's are kept."""
    from l5dask.core import outputs

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(gone.stdout)
    host = outputs._HOST
    left = {
        f".out.{dead}@{host}.0a1b2c.partial": False,  # (its process is gone: removed)
        f".out.{os.getpid()}@{host}.3d4e5f.partial": True,  # (alive: kept)
        f".out.{dead}@another-machine.6a7b8c.partial": True,  # (not ours to judge: kept)
        f".other.{dead}@{host}.9d0e1f.partial": True,  # (another output's)
    }
    for name in left:
        (tmp_path / name).mkdir()
        (tmp_path / name / "part-0.parquet").write_bytes(b"x" * 100)
    with outputs.atomic_output(str(tmp_path / "out"), folder=True) as tmp:
        assert os.path.basename(tmp).startswith(f".out.{os.getpid()}@{host}.")
        (Path(tmp) / "done").write_text("1")
    kept = {n for n, keep in left.items() if keep}
    assert set(os.listdir(tmp_path)) == {"out", *kept}
    assert os.listdir(tmp_path / "out") == ["done"]


@settings(max_examples=80, deadline=None)
@given(
    values=st.lists(
        st.one_of(st.none(), st.text(st.characters(blacklist_categories=("Cs",)), max_size=6)), max_size=30
    ),
    ns=st.lists(st.integers(-(2**63) + 1, 2**63 - 1), max_size=30),
)
def test_arrow_arrays_made_from_buffers_are_pyarrows(values, ns):
    """Strings with nulls, and int64 nanoseconds as UTC timestamps, made from their buffers (no
    pandas, no pyarrow.compute), equal pyarrow's own arrays of the same values; a type of another
    width is refused."""
    import numpy as np
    import pyarrow as pa

    from l5dask.core.outputs import arrow_array, arrow_strings

    valid = np.array([v is not None for v in values], bool)
    got = arrow_strings([v or "" for v in values], valid)
    got.validate(full=True)
    assert got.equals(pa.array(values, pa.string()))
    utc = pa.timestamp("ns", tz="UTC")
    stamps = arrow_array(np.array(ns, np.int64), utc)
    assert stamps.type == utc and stamps.equals(pa.array(ns, pa.int64()).cast(utc))
    with pytest.raises(ValueError, match="int32 values cannot be timestamp"):
        arrow_array(np.zeros(len(ns), np.int32), utc)


def test_an_output_whose_folder_is_missing_or_a_file_is_one_line(tmp_path):
    """An output under a folder that is not there, or under a file, is refused in one line that
    says which (the same words a job's check uses: ``is a file, not a folder``)."""
    from l5dask.core.outputs import check_writable
    from l5dask.errors import OutputError

    (tmp_path / "afile").write_text("x")
    with pytest.raises(OutputError, match=r"afile/o\.json: the folder .*afile is a file, not a folder$"):
        check_writable(str(tmp_path / "afile" / "o.json"))
    with pytest.raises(OutputError, match=r"none/o\.json: the folder .*none does not exist$"):
        check_writable(str(tmp_path / "none" / "o.json"))
