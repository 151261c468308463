"""``l5dask run JOB``: the job file checked whole (one line naming the file and the line), the
analyses' outputs equal to what each one's own function computes, failures one line each with the
others written, the run record (inputs' fingerprints, outputs, bytes read) and its exit codes."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

import l5dask
from l5dask.core import cache as cachelib
from l5dask.core import jobfile
from l5dask.core.jobfile import JobError
from l5dask.jobs import load_job, run_job
from l5dask.prediction.catalog import fingerprint
from l5dask.prediction.report import compute_report
from tests import damage
from tests.conftest import read_all

DATE = "2026-01-02"

JOB = """\
[run]
name = "nightly"
record = "{out}/{{date}}/run.json"
date = "2026-01-02"

[datasets]
small = "{ds}"

[analyses.report]
kind = "report"
output = "{out}/{{date}}/{{dataset}}/report.json"
scenes-table = "{out}/{{date}}/{{dataset}}/scenes.parquet"

[analyses.catalog]
kind = "catalog"
output = "{out}/{{date}}/{{dataset}}/catalog.parquet"

[analyses.speeds]
kind = "aggregate"
by = ["label"]
values = {{ speed = ["mean", "max"], extent_length = "q99" }}
where = "distance_to_ego < 50"
output = "{out}/{{date}}/{{dataset}}/speeds.parquet"

[analyses.frames]
kind = "aggregate"
array = "frames"
by = "scene_index"
values = {{ num_agents = "sum" }}
output = "{out}/{{date}}/{{dataset}}/frames.csv"

[analyses.mask]
kind = "select-agents"
output = "{out}/{{date}}/{{dataset}}/mask"
report = "{out}/{{date}}/{{dataset}}/mask.json"
"""


def cli(*args, **kw):
    return subprocess.run(
        [sys.executable, "-m", "l5dask.cli", "run", *map(str, args)], capture_output=True, text=True, **kw
    )


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def stored_bytes(ds_path: str, arrays=("scenes", "frames", "agents", "traffic_light_faces")) -> int:
    return sum(f.stat().st_size for a in arrays for f in (Path(ds_path) / a).iterdir() if not f.name.startswith("."))


def test_a_job_writes_each_analysis_as_its_own_function_computes_it(small_ds, tmp_path):
    out = tmp_path / "out"
    job = write(tmp_path / "job.toml", JOB.format(ds=small_ds, out=out))
    r = cli(job, "-q")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    day = out / DATE / "small"
    # the report, byte for byte as `l5dask stats -o` writes it
    ref = tmp_path / "ref.json"
    l5dask.prediction.report.write_json(compute_report(small_ds), str(ref))
    assert (day / "report.json").read_bytes() == ref.read_bytes()
    assert pq.read_table(day / "scenes.parquet").num_rows == json.loads(ref.read_text())["counts"]["scenes"]
    # the catalog, the aggregations
    pd.testing.assert_frame_equal(pd.read_parquet(day / "catalog.parquet"), l5dask.catalog(small_ds))
    want = l5dask.aggregate(
        small_ds, "agents", by="label", values={"speed": ["mean", "max"], "extent_length": ["q99"]},
        where="distance_to_ego < 50",
    )  # fmt: skip
    pd.testing.assert_frame_equal(
        pd.read_parquet(day / "speeds.parquet"), want, check_dtype=False, check_categorical=False
    )
    frames = pd.read_csv(day / "frames.csv")
    got = np.asarray(frames["num_agents_sum"])
    raw = read_all(small_ds)
    num = np.diff(raw["frames"]["agent_index_interval"], axis=1)[:, 0]
    np.testing.assert_array_equal(got, [num[a:b].sum() for a, b in raw["scenes"]["frame_index_interval"]])
    # the mask: L5Kit's report and the mask array as select-agents writes them elsewhere
    from l5dask.evaluation.agents import select_agents

    rep = select_agents(small_ds, output=str(tmp_path / "refmask"))
    assert json.loads((day / "mask.json").read_text()) == json.loads(l5dask.core.outputs.json_text(rep))
    for f in os.listdir(tmp_path / "refmask"):
        assert (day / "mask" / f).read_bytes() == (tmp_path / "refmask" / f).read_bytes(), f
    # the record
    record = json.loads((out / DATE / "run.json").read_text())
    assert record["status"] == "written" and record["job"]["name"] == "nightly" and record["job"]["date"] == DATE
    assert sorted(record["job"]) == ["date", "file", "name", "time"], record["job"]  # (its name once: a trial)
    assert record["inputs"] == [
        {
            "dataset": "small",
            "url": small_ds,
            "fingerprint": json.loads(json.dumps(fingerprint(l5dask.open_dataset(small_ds)))),
        }
    ]
    assert [(a["analysis"], a["status"]) for a in record["analyses"]] == [
        (n, "written") for n in ("report", "catalog", "speeds", "frames", "mask")
    ]
    assert record["analyses"][0]["outputs"] == {
        "output": str(day / "report.json"),
        "scenes-table": str(day / "scenes.parquet"),
    }
    # every stored chunk was read (at least once), the metadata apart
    assert record["reads"]["bytes"] >= stored_bytes(small_ds)
    assert record["reads"]["metadata_objects"] >= 5
    # the four of one pass say their time once, the pass's; the mask (run alone) its own
    lines = r.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        *(f"{n} on small" for n in ("report", "catalog", "speeds", "frames")),
        "4 analyses on small in one pass",
        "mask on small",
    ]
    assert all(line.endswith(".csv") or line.endswith(".parquet") for line in lines[:4]), lines
    assert lines[4].endswith(" s") and lines[5].endswith(" s)"), lines


def test_toml_and_yaml_say_the_same_job(small_ds, tmp_path):
    import tomllib

    import yaml

    text = JOB.format(ds=small_ds, out=tmp_path / "out")
    write(tmp_path / "job.yaml", yaml.safe_dump(tomllib.loads(text), sort_keys=False))
    a, b = jobfile.load(tmp_path / "job.yaml"), jobfile.parse_toml(text, "job.toml")
    assert a.data == b.data
    # every key has its line, in both
    assert a.line(("analyses", "speeds", "where")) == yaml_line(tmp_path / "job.yaml", "where:")
    assert b.line(("analyses", "speeds", "where")) == 1 + text.splitlines().index('where = "distance_to_ego < 50"')
    assert b.line(("analyses", "speeds", "values", "extent_length")) == b.line(("analyses", "speeds", "values"))


def yaml_line(path: Path, start: str) -> int:
    return 1 + [line.strip().startswith(start) for line in path.read_text().splitlines()].index(True)


BAD = [
    # (what, the job's text after [datasets], the line, the message)
    (
        "unknown-key-in-analysis",
        '[analyses.r]\nkind = "report"\noutput = "r.json"\noutptu = "x"\n',
        7,
        "unknown key 'outptu' in [analyses.r] (kind report); the keys are: datasets, html, kind, output, scene-catalog, "
        "scenes, scenes-table",
    ),
    (
        "record-with-a-dataset-field",  # (it said "one a run: ... have no value there")
        '[run]\nrecord = "recs/{dataset}.json"\n[analyses.r]\nkind = "report"\noutput = "r.json"\n',
        5,
        "[run] record: one record is written for the whole run, so {dataset} and {analysis} cannot be in its path",
    ),
    (
        "unknown-top-key",
        '[analysis.r]\nkind = "report"\n',
        4,
        "unknown key 'analysis'; the keys are: run, cluster, cache, storage-options, datasets, analyses",
    ),
    (
        "unknown-key-inline",
        '[analyses.r]\nkind = "report"\noutput = "r.json"\n[cluster]\nworkers = 2\nthreads = 1\n',
        9,
        "unknown key 'threads' in [cluster]; the keys are: chunks-per-task, memory-limit, scheduler, "
        "threads-per-worker, workers",
    ),
    (
        "unknown-kind",
        '[analyses.r]\nkind = "reprot"\n',
        5,
        "[analyses.r] kind: unknown kind 'reprot'; the kinds are: aggregate, catalog, export, report, select-agents",
    ),
    (
        "misspelt-kind",  # (said as the unknown key it is, not as "has no 'kind'")
        '[analyses.speeds]\nvalues = { speed = "mean" }\nkidn = "aggregate"\noutput = "a.csv"\n',
        6,
        "unknown key 'kidn' in [analyses.speeds] (it has no 'kind'); the keys are: array, by, ",
    ),
    (
        "wrong-type",
        '[analyses.a]\nkind = "aggregate"\nvalues = { speed = "mean" }\noutput = "a.csv"\nmax-groups = "10"\n',
        8,
        "[analyses.a] (kind aggregate) max-groups: expected an integer, not a string '10'",
    ),
    (
        "unknown-field",
        '[analyses.r]\nkind = "report"\noutput = "{day}/r.json"\n',
        6,
        "[analyses.r] (kind report) output: unknown field {day}; the fields are: date, time, job, dataset, analysis",
    ),
    (
        "run-date-a-date-time",  # (said as the file writes it, not as datetime.datetime(2026, 1, 2, 10, 0))
        '[run]\ndate = 2026-01-02T10:00:00\n[analyses.r]\nkind = "report"\noutput = "r.json"\n',
        5,
        "[run] date: expected a string, not a date-time 2026-01-02T10:00:00",
    ),
    (
        "field-with-a-format",  # (a trial's: a traceback from str.format, exit 1)
        '[analyses.r]\nkind = "report"\noutput = "{date:%Y}/r.json"\n',
        6,
        "[analyses.r] (kind report) output: {date:%Y} takes no format or conversion; write {date} ({date} is YYYY-MM-DD)",
    ),
    (
        "field-with-a-conversion",  # (it was taken: quotes in the file's name)
        '[run]\nrecord = "{date!r}.json"\n[analyses.r]\nkind = "report"\noutput = "r.json"\n',
        5,
        "[run] record: {date!r} takes no format or conversion; write {date} ({date} is YYYY-MM-DD)",
    ),
    (
        "unknown-column",
        '[analyses.a]\nkind = "aggregate"\nby = "lable"\nvalues = { speed = "mean" }\noutput = "a.csv"\n',
        6,  # (the line of by)
        "[analyses.a] on small: unknown group column 'lable' for agents; the columns are: ",
    ),
    (
        "unknown-scenes-column",
        '[analyses.a]\nkind = "aggregate"\nvalues = { speed = "mean" }\nscenes = "nosuch > 1"\noutput = "a.csv"\n',
        7,
        "[analyses.a] on small: scenes 'nosuch > 1' names unknown column 'nosuch'; the columns of the catalog are: "
        "scene_index, host, start_time, ",
    ),
    (
        "scenes-number-with-string",
        '[analyses.a]\nkind = "aggregate"\nvalues = { speed = "mean" }\nscenes = "num_frames == \'abc\'"\noutput = "a.csv"\n',
        7,
        "[analyses.a] on small: scenes \"num_frames == 'abc'\": num_frames is a number column (int64): compare it with "
        "a number, not 'abc'\n",
    ),
    (
        "where-number-with-string",
        '[analyses.a]\nkind = "aggregate"\nvalues = { speed = "mean" }\nwhere = "speed > \'x\'"\noutput = "a.csv"\n',
        7,
        "[analyses.a] on small: where \"speed > 'x'\": speed is a number column (float64): compare it with a number, "
        "not 'x'\n",
    ),
    (
        "where-not-a-condition",  # (passed --check, then failed the run: a new user's trial)
        '[analyses.a]\nkind = "aggregate"\nvalues = { speed = "mean" }\nwhere = "speed + 1"\noutput = "a.csv"\n',
        7,
        "[analyses.a] on small: where 'speed + 1' is not a condition (it gives float64 values)\n",
    ),
    (
        "where-in-a-scalar",  # (a TypeError traceback in the run)
        '[analyses.a]\nkind = "aggregate"\nvalues = { speed = "mean" }\nwhere = "speed in 3"\noutput = "a.csv"\n',
        7,
        "[analyses.a] on small: where 'speed in 3': in takes a list of numbers or names ([3, 4]), not 3\n",
    ),
    (
        "scenes-not-a-condition",
        '[analyses.r]\nkind = "report"\nscenes = "num_frames + 1"\noutput = "r.json"\n',
        6,
        "[analyses.r] on small: scenes 'num_frames + 1' is not a condition (it gives int64 values)\n",
    ),
    (
        "cache-url-http",
        '[cache]\nurl = "http://x/y"\n[analyses.r]\nkind = "report"\noutput = "r.json"\n',
        5,
        "[cache] url: http://x/y: l5dask cannot write a cache on http:// (a local folder, s3://, gs:// or abfs:// "
        "can hold one)\n",
    ),
    (
        "writes-nothing",
        '[analyses.r]\nkind = "report"\n',
        4,
        "[analyses.r] writes nothing: give output or html or scenes-table",
    ),
    (
        "not-a-day",  # (a date of the right shape that is no day: no folder of that name is made)
        '[run]\ndate = "2026-13-45"\n[analyses.r]\nkind = "report"\noutput = "{date}/r.json"\n',
        5,
        "[run] date: '2026-13-45' is not a date YYYY-MM-DD\n",
    ),
    (
        "no-such-dataset-named",
        '[analyses.r]\nkind = "report"\noutput = "r.json"\ndatasets = ["big"]\n',
        7,
        "[analyses.r] datasets: no dataset 'big'; the datasets are: small",
    ),
]


@pytest.mark.parametrize("what, text, line, message", BAD, ids=[b[0] for b in BAD])
def test_a_job_that_cannot_run_is_one_line_naming_the_file_and_the_line(small_ds, tmp_path, what, text, line, message):
    job = write(tmp_path / "job.toml", f'[datasets]\nsmall = "{small_ds}"\n\n{text}')
    r = cli(job, "-q", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"l5dask: error: {job}:{line}: {message}"), r.stderr
    assert sorted(os.listdir(tmp_path)) == ["job.toml"]  # nothing written


@pytest.mark.parametrize(
    "name, text", [("job.toml", "[run]\ndate = 2026-03-04\n"), ("job.yml", "run:\n  date: 2026-03-04\n")]
)
def test_a_date_written_unquoted_is_that_day(small_ds, tmp_path, name, text):
    """TOML and YAML read ``2026-03-04`` unquoted as a date: it is the run's date, as the string is
    (it was refused as "expected a string, not date datetime.date(2026, 3, 4)")."""
    if name.endswith(".toml"):
        body = f'[datasets]\nsmall = "{small_ds}"\n[analyses.c]\nkind = "catalog"\noutput = "{{date}}/c.parquet"\n'
    else:
        body = f'datasets:\n  small: {small_ds}\nanalyses:\n  c:\n    kind: catalog\n    output: "{{date}}/c.parquet"\n'
    job = write(tmp_path / name, text + body)
    r = cli(job, "-q", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path / "2026-03-04")) == ["c.parquet"]


@pytest.mark.parametrize(
    "text, line, message",
    [
        ('[datasets]\ns = ""\n', 2, "[datasets.s] path: is empty; give a folder"),
        ('[datasets.s]\npath = "  "\n', 2, "[datasets.s] path: is empty"),
        ('[cache]\nurl = ""\n[datasets]\ns = "DS"\n', 2, "[cache] url: is empty; give the cache"),
        (
            '[datasets]\ns = "DS"\n[analyses.a]\nkind = "aggregate"\nby = "label"\nvalues = { speed = ["mean"] }\nwhere = ""\n',
            7,
            "where: is empty",
        ),
    ],
)
def test_an_empty_string_is_refused_at_its_line(small_ds, tmp_path, text, line, message):
    """An empty path listed the current folder as the dataset's content; an empty cache URL ran
    without a cache, silently."""
    body = text.replace("DS", small_ds)
    if "[analyses" not in body:
        body += '[analyses.r]\nkind = "catalog"\noutput = "r.parquet"\n'
    else:
        body += 'output = "a.parquet"\n'
    job = write(tmp_path / "job.toml", body)
    for extra in (["--check"], []):
        r = cli(job, "-q", *extra, cwd=tmp_path)
        assert r.returncode == 2 and r.stderr.startswith(f"l5dask: error: {job}:{line}: "), r.stderr
        assert message in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["job.toml"]


def test_an_unknown_key_in_yaml_names_its_line(small_ds, tmp_path):
    job = write(
        tmp_path / "job.yml",
        f"""\
        datasets:
          small: {small_ds}
        analyses:
          r:
            kind: catalog
            output: r.parquet
            timezone: UTC
        """,
    )
    r = cli(job, "-q", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr == (
        f"l5dask: error: {job}:7: unknown key 'timezone' in [analyses.r] (kind catalog); "
        "the keys are: datasets, kind, output, tz\n"
    )


def test_a_dataset_that_does_not_exist_is_refused_before_anything_runs(small_ds, tmp_path):
    job = write(
        tmp_path / "job.toml",
        f"""\
        [datasets]
        small = "{small_ds}"
        gone = "{tmp_path}/gone.zarr"

        [analyses.r]
        kind = "report"
        output = "{{dataset}}/r.json"
        """,
    )
    r = cli(job, "-q", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr == (f"l5dask: error: {job}:3: dataset gone: {tmp_path}/gone.zarr: no such file, folder or bucket\n")
    assert sorted(os.listdir(tmp_path)) == ["job.toml"]
    # a glob that matches nothing
    write(job, f'[datasets]\nnightly = "{tmp_path}/drops/*.zarr"\n[analyses.r]\nkind = "report"\noutput = "r.json"\n')
    r = cli(job, "-q", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr == f"l5dask: error: {job}:2: [datasets.nightly] path: '{tmp_path}/drops/*.zarr' matches nothing\n"


def test_an_output_that_cannot_be_written_is_refused_before_anything_runs(small_ds, tmp_path):
    (tmp_path / "blocked").write_text("a file where a folder is needed")
    job = write(
        tmp_path / "job.toml",
        f"""\
        [datasets]
        small = "{small_ds}"

        [analyses.c]
        kind = "catalog"
        output = "{tmp_path}/ok/c.parquet"

        [analyses.r]
        kind = "report"
        output = "{tmp_path}/blocked/{{date}}/r.json"
        """,
    )
    r = cli(job, "-q", "--date", DATE)
    assert r.returncode == 2
    assert r.stderr.startswith(
        f"l5dask: error: {job}:10: [analyses.r] output on small: {tmp_path}/blocked/{DATE}/r.json: cannot make its folder"
    ), r.stderr
    assert not (tmp_path / "ok" / "c.parquet").exists()  # the catalog did not run
    # two analyses writing one file
    text = job.read_text().replace("blocked/{date}/r.json", "ok/c.parquet").replace('"report"', '"catalog"')
    write(job, text)
    r = cli(job, "-q")
    assert r.returncode == 2
    assert r.stderr == (
        f"l5dask: error: {job}:10: [analyses.r] output on small: {tmp_path}/ok/c.parquet is also written by "
        "[analyses.c] output on small: put {analysis} in the template, or give each its own path\n"
    )
    # one analysis on two datasets (a second one added), and the run record on an output
    two = text.replace("[analyses.c]", f'[datasets.other]\npath = "{small_ds}"\n\n[analyses.c]', 1)
    two = two.replace('[analyses.r]\nkind = "catalog"\noutput = "' + f"{tmp_path}/ok/c.parquet" + '"\n', "")
    write(job, two)
    r = cli(job, "-q")
    assert r.returncode == 2 and r.stderr.endswith(
        f"{tmp_path}/ok/c.parquet is also written by [analyses.c] output on small: put {{dataset}} in the template\n"
    ), r.stderr
    one = write(
        tmp_path / "one.toml",
        f'[datasets]\ns = "{small_ds}"\n[analyses.c]\nkind = "catalog"\noutput = "ok/c.parquet"\n',
    )
    r = cli(one, "-q", "--record", "ok/c.parquet", cwd=tmp_path)
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].endswith("ok/c.parquet is also written by --record: give the run record another path"), r.stderr
    # a folder as the record: said of --record, not of a line of the job file
    r = cli(one, "-q", "--record", tmp_path, cwd=tmp_path)
    assert (r.returncode, r.stderr) == (
        2,
        f"l5dask: error: --record {tmp_path}: {tmp_path}: is a folder; give a file name\n",
    )
    assert not (tmp_path / "ok" / "c.parquet").exists()
    # --record is a template as [run] record is (a trial's: it wrote a folder named "{date}"), with
    # its faults said of --record
    r = cli(one, "-q", "--record", "recs/{date}-{job}.json", "--date", "2026-01-02", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "recs" / "2026-01-02-job.json").read_text())["analyses"][0]["status"] == "written"
    assert not (tmp_path / "recs" / "{date}-{job}.json").exists()
    for given, said in (
        (
            "r/{dataset}.json",
            "one record is written for the whole run, so {dataset} and {analysis} cannot be in its path",
        ),
        ("r/{day}.json", "unknown field {day}; the fields are: date, time, job, dataset, analysis"),
        ("r/{date:%Y}.json", "{date:%Y} takes no format or conversion; write {date} ({date} is YYYY-MM-DD)"),
    ):
        for check in ((), ("--check",)):
            r = cli(one, "-q", "--record", given, *check, cwd=tmp_path)
            assert (r.returncode, r.stderr) == (2, f"l5dask: error: --record {given}: {said}\n"), (check, r.stderr)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "spelling",
    ["{tmp}/ok/c.parquet", "./ok/c.parquet", "ok/./c.parquet", "ok/x/../c.parquet", "alias/c.parquet", "ok//c.parquet"],
)
def test_two_spellings_of_one_output_are_refused_before_anything_runs(small_ds, tmp_path, spelling):
    """Two analyses writing one file named two ways (absolute and relative, ``.`` and ``..``, a
    link to its folder) are refused as the same path twice is: the second would silently replace
    the first (a new user's trial: the run said both were written)."""
    (tmp_path / "ok").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "ok")
    other = spelling.format(tmp=tmp_path)
    job = write(
        tmp_path / "job.toml",
        f"""\
        [datasets]
        small = "{small_ds}"

        [analyses.a]
        kind = "aggregate"
        by = "label"
        values = {{ speed = "mean" }}
        output = "ok/c.parquet"

        [analyses.b]
        kind = "aggregate"
        values = {{ speed = "max" }}
        output = "{other}"
        """,
    )
    for args in ((), ("--check",)):
        r = cli(job, "-q", *args, cwd=tmp_path)
        assert (r.returncode, r.stderr) == (
            2,
            f"l5dask: error: {job}:13: [analyses.b] output on small: {other} is also written by "
            "[analyses.a] output on small: put {analysis} in the template, or give each its own path\n",
        )
        assert not (tmp_path / "ok" / "c.parquet").exists()


@pytest.mark.parametrize(
    "by, most, refused",
    [('"track_id"', 5, True), ('["label", "host"]', 3, True), ('"host"', 1, False), ('"hour"', 24, False)],
)
def test_a_grouping_over_max_groups_is_refused_before_anything_runs(small_ds, tmp_path, by, most, refused):
    """A job's ``max-groups`` is checked with ``--check`` and before the run (exit 2, nothing
    written: a new user's trial found it said only at run time, exit 1): the groups the metadata
    says; a ``host``'s groups are the scenes' hosts, read by the run (exit 1 there, the others
    written)."""
    import l5dask
    from l5dask.prediction.aggregation import group_bound
    from l5dask.prediction.columns import Table

    job = write(
        tmp_path / "job.toml",
        f"""\
        [datasets]
        small = "{small_ds}"

        [analyses.c]
        kind = "catalog"
        output = "{tmp_path}/c.parquet"

        [analyses.a]
        kind = "aggregate"
        by = {by}
        values = {{ speed = "mean" }}
        max-groups = {most}
        output = "{tmp_path}/a.parquet"
        """,
    )
    names = [by.strip('"')] if by.startswith('"') else [n.strip(' "') for n in by.strip("[]").split(",")]
    table = Table(l5dask.open_dataset(small_ds), "agents")
    bound = group_bound(table, names)
    for args in (("--check",), ()):
        r = cli(job, "-q", *args)
        if refused:
            assert group_bound(table, names, read=False) > most  # (known without the scenes)
            assert (r.returncode, r.stderr) == (
                2,
                f"l5dask: error: {job}:10: [analyses.a] on small: grouping agents by {', '.join(names)} may make up "
                f"to {group_bound(table, names, read=False):,} groups, more than the limit of {most:,}; raise "
                "max_groups (--max-groups) or group by fewer columns\n",
            )
            assert not (tmp_path / "c.parquet").exists()
        elif bound > most:  # (a host's groups: the run reads them, and says so)
            assert r.returncode == (0 if args else 1), r.stderr
            assert args or "more than the limit of 1" in r.stderr
        else:
            assert r.returncode == 0, r.stderr
    if not refused:
        assert (tmp_path / "c.parquet").exists()


def test_each_pass_s_analyses_are_said_together(small_ds, tmp_path):
    """Analyses of one pass are said one after the other, then the pass's time, whatever their
    order in the job (a new user's trial: a catalog said first belonged to the last pass)."""
    job = write(
        tmp_path / "job.toml",
        f"""\
        [datasets]
        small = "{small_ds}"

        [analyses.cat]
        kind = "catalog"
        output = "{tmp_path}/cat.parquet"

        [analyses.some]
        kind = "aggregate"
        values = {{ speed = "mean" }}
        scenes = "scene_index < 2"
        output = "{tmp_path}/some.parquet"

        [analyses.rep]
        kind = "report"
        scenes = "scene_index < 2"
        output = "{tmp_path}/rep.json"

        [analyses.whole]
        kind = "aggregate"
        values = {{ speed = "max" }}
        output = "{tmp_path}/whole.parquet"
        """,
    )
    r = cli(job, "--record", str(tmp_path / "run.json"))
    assert r.returncode == 0, r.stderr
    assert [line.split(":")[0] for line in r.stdout.splitlines()] == [
        "cat on small",
        "whole on small",
        "2 analyses on small in one pass",
        "some on small",
        "rep on small",
        "2 analyses on small in one pass",
    ], r.stdout
    record = json.loads((tmp_path / "run.json").read_text())  # (the record keeps the job's order)
    assert [a["analysis"] for a in record["analyses"]] == ["cat", "some", "rep", "whole"]


def test_a_location_is_one_string_however_spelled(tmp_path):
    """``store.location``: spellings of one place agree, other places differ; a URL's path is
    resolved as a path, its protocol in any case."""
    from l5dask.core.store import location

    (tmp_path / "d").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "d")
    same = [
        f"{tmp_path}/d/f",
        f"{tmp_path}/d/./f",
        f"{tmp_path}/d/x/../f",
        f"{tmp_path}/link/f",
        f"file://{tmp_path}/d/f",
    ]
    assert len({location(p) for p in same}) == 1
    assert location(f"{tmp_path}/d/g") != location(same[0])
    urls = [
        "s3://bucket/a/b.parquet",
        "S3://bucket/a/./b.parquet",
        "s3://bucket/a/x/../b.parquet",
        "s3://bucket//a/b.parquet",
    ]
    assert {location(u) for u in urls} == {"s3://bucket/a/b.parquet"}
    assert location("s3://bucket/a/c.parquet") != location(urls[0])
    assert location("gs://bucket/a/b.parquet") != location(urls[0])


def test_an_analysis_that_fails_is_one_line_and_the_others_are_written(small_ds, tmp_path):
    bad = tmp_path / "bad.zarr"
    shutil.copytree(small_ds, bad)
    name, damage_fn, pattern = damage.CHUNK[-2]  # a truncated agents chunk
    damage_fn(bad)
    out = tmp_path / "out"
    job = write(
        tmp_path / "job.toml",
        f"""\
        [run]
        record = "{out}/run.json"

        [datasets]
        bad = "{bad}"

        [analyses.frames]
        kind = "aggregate"
        array = "frames"
        values = {{ num_agents = "sum" }}
        output = "{out}/frames.parquet"

        [analyses.agents]
        kind = "aggregate"
        values = {{ speed = "mean" }}
        output = "{out}/agents.parquet"
        """,
    )
    r = cli(job, "-q")
    assert r.returncode == 1, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 2 and lines[1] == "l5dask: 1 of 2 analyses failed"
    assert lines[0].startswith("l5dask: failed: agents on bad: ") and "array 'agents', chunk '0'" in lines[0], lines
    assert (out / "frames.parquet").exists() and not (out / "agents.parquet").exists()
    assert [p for p in os.listdir(out) if p.startswith(".")] == []  # no partial file left
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "failed"
    assert [(a["analysis"], a["status"]) for a in record["analyses"]] == [("frames", "written"), ("agents", "failed")]
    assert record["analyses"][1]["error"] == lines[0].removeprefix("l5dask: failed: agents on bad: ")


def test_a_glob_makes_a_dataset_of_each_match_named_by_its_file(small_ds, default_ds, tmp_path):
    drops = tmp_path / "drops"
    drops.mkdir()
    shutil.copytree(small_ds, drops / "2026-01-01.zarr")
    shutil.copytree(default_ds, drops / "2026-01-02.zarr")
    zipped = shutil.make_archive(str(tmp_path / "zipped"), "zip", root_dir=small_ds)
    job = write(
        tmp_path / "job.toml",
        f"""\
        [datasets]
        drops = "{drops}/*.zarr"
        zipped = "{zipped}"

        [analyses.count]
        kind = "aggregate"
        array = "scenes"
        values = {{ scene_index = "count" }}
        output = "{tmp_path}/out/{{dataset}}-{{analysis}}.csv"
        """,
    )
    record = run_job(job)
    assert [i["dataset"] for i in record["inputs"]] == ["2026-01-01", "2026-01-02", "zipped"]
    for name, src in (("2026-01-01", small_ds), ("2026-01-02", default_ds), ("zipped", small_ds)):
        got = pd.read_csv(tmp_path / "out" / f"{name}-count.csv")
        assert got["scene_index_count"].tolist() == [len(l5dask.open_dataset(src)["scenes"])]


def test_check_lists_the_plan_and_runs_nothing(small_ds, tmp_path):
    out = tmp_path / "out"
    job = write(tmp_path / "job.toml", JOB.format(ds=small_ds, out=out))
    r = cli(job, "--check")
    assert r.returncode == 0, r.stderr
    assert (
        r.stdout.splitlines()[0]
        == f"report on small: {out}/{DATE}/small/report.json, {out}/{DATE}/small/scenes.parquet"
    )
    assert r.stdout.splitlines()[-1] == f"{job}: 5 analyses on 1 dataset: the job can run"
    assert not out.exists()  # it runs nothing and makes nothing: not even the outputs' folders
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.toml"]
    one = write(
        tmp_path / "one.toml", f'[datasets]\ns = "{small_ds}"\n[analyses.r]\nkind = "report"\noutput = "{out}/r.json"\n'
    )
    assert cli(one, "--check").stdout.splitlines()[-1] == f"{one}: 1 analysis on 1 dataset: the job can run"
    assert not out.exists()


def test_an_output_no_file_can_be_made_at_is_refused_before_anything_runs(small_ds, tmp_path):
    # /proc: writable by its permissions (for root), yet no file can be made there
    out = tmp_path / "out"
    text = JOB.format(ds=small_ds, out=out).replace(
        f'"{out}/{{date}}/{{dataset}}/speeds.parquet"', '"/proc/speeds.parquet"'
    )
    job = write(tmp_path / "job.toml", text)
    line = text.splitlines().index('output = "/proc/speeds.parquet"') + 1
    for args in ((), ("--check",)):
        r = cli(job, *args)
        assert (r.returncode, r.stdout) == (2, "")
        assert r.stderr == (
            f"l5dask: error: {job}:{line}: [analyses.speeds] output on small: /proc/speeds.parquet: "
            "the folder /proc takes no new files (a virtual filesystem such as /proc or /sys)\n"
        )
        # nothing ran, nothing was written, no folder was made
        assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["job.toml"]


def test_an_output_that_fails_at_write_time_is_said_without_its_temporary_name(tmp_path):
    from l5dask.core.outputs import atomic_output
    from l5dask.errors import OutputError

    with pytest.raises(OutputError) as got, atomic_output("/proc/x.json", checked=True):
        pass
    assert (
        str(got.value)
        == "/proc/x.json: the folder /proc takes no new files (a virtual filesystem such as /proc or /sys)"
    )


@pytest.mark.parametrize("command", [["synth", "-o", "{ro}/s.zarr"], ["synth", "-o", "{ro}/a/s.zarr"]])
def test_a_dataset_output_in_a_folder_no_file_can_be_made_in_is_one_line(tmp_path, command):
    """``synth -o`` into such a folder printed a raw "[Errno 1] Operation not permitted" (an
    immutable folder) or "[Errno 2] No such file or directory" (/proc): now the outputs' one line."""
    ro = tmp_path / "ro"
    ro.mkdir()
    cases = [("/proc", "the folder /proc takes no new files (a virtual filesystem such as /proc or /sys)")]
    if subprocess.run(["chattr", "+i", str(ro)], capture_output=True).returncode == 0:
        cases.append((str(ro), f"the folder {ro} is not writable"))
    try:
        for folder, message in cases:
            args = [a.format(ro=folder) for a in command]
            r = subprocess.run([sys.executable, "-m", "l5dask.cli", *args], capture_output=True, text=True)
            assert r.returncode != 0 and r.stderr == f"l5dask: error: {args[-1]}: {message}\n", r.stderr
    finally:
        subprocess.run(["chattr", "-i", str(ro)], capture_output=True)
    assert list(ro.iterdir()) == []


def test_a_job_on_a_local_cluster_counts_the_workers_reads(small_ds, tmp_path):
    job = write(
        tmp_path / "job.toml",
        f"""\
        [cluster]
        workers = 2

        [datasets]
        small = "{small_ds}"

        [analyses.speeds]
        kind = "aggregate"
        values = {{ speed = ["mean"] }}
        output = "{tmp_path}/speeds.parquet"
        """,
    )
    record = run_job(job)
    assert record["status"] == "written"
    # the agents' chunks were read by the workers, and counted there
    assert record["reads"]["bytes"] >= stored_bytes(small_ds, ("agents",))
    want = l5dask.aggregate(small_ds, values={"speed": ["mean"]})
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "speeds.parquet"), want, check_dtype=False)


def test_load_job_refuses_what_is_not_a_job(tmp_path):
    with pytest.raises(JobError, match=r"job.json: a job file is TOML \(.toml\) or YAML"):
        load_job(write(tmp_path / "job.json", "{}"))
    with pytest.raises(JobError, match=r"job.toml:2: not valid TOML: "):
        load_job(write(tmp_path / "job.toml", "[datasets]\nx = \n"))
    with pytest.raises(JobError, match=r"job.yaml:2: not valid YAML: found character"):
        load_job(write(tmp_path / "job.yaml", "datasets:\n\tx: 1\n"))
    with pytest.raises(JobError, match=r"no-such.toml: no such job file"):
        load_job(tmp_path / "no-such.toml")


def test_the_reference_page_documents_every_key_of_the_schema():
    """docs/jobs.md has a table of each table of the schema, listing each of its keys."""
    import re

    page = (Path(__file__).parent.parent / "docs" / "jobs.md").read_text()
    sections = re.split(r"^#{2,4} ", page, flags=re.M)
    titles = {s.splitlines()[0].strip(): s for s in sections[1:]}

    def keys_of(title: str) -> set[str]:
        return set(re.findall(r"^\| `([a-z-]+)` \|", titles[title], flags=re.M))

    common = keys_of("`[analyses]`")
    for section, keys in jobfile.schema_keys().items():
        if section.startswith("[analyses.NAME]"):
            kind = section.split("'")[1]
            documented = keys_of(f'`kind = "{kind}"`') | common
        else:
            documented = keys_of(f"`{section.replace('.NAME', '')}`")
        assert {k.name for k in keys} == documented, section
    assert set(re.findall(r"^\| `([a-z]+)` \|", titles["Templates"], flags=re.M)) == set(jobfile.FIELDS)


def four_analyses(path: Path, ds: str, out: Path) -> Path:
    """A job of the report, the catalog and two aggregations (agents by scene and label, frames) of
    ``ds``, their outputs in ``out``."""
    return write(
        path,
        f"""\
        [datasets]
        small = "{ds}"

        [analyses.report]
        kind = "report"
        output = "{out}/report.json"

        [analyses.catalog]
        kind = "catalog"
        output = "{out}/catalog.parquet"

        [analyses.speeds]
        kind = "aggregate"
        by = ["scene_index", "label"]
        values = {{ speed = ["mean", "max"] }}
        output = "{out}/speeds.parquet"

        [analyses.frames]
        kind = "aggregate"
        array = "frames"
        values = {{ num_agents = "sum" }}
        output = "{out}/frames.parquet"
        """,
    )


def test_the_analyses_of_a_dataset_run_in_one_pass(small_ds, tmp_path):
    """The report, the catalog and two aggregations of one dataset read its chunks once (the
    frames, whose rows the others join, a few times): four separate passes would read every
    agent chunk three times."""
    job = four_analyses(tmp_path / "job.toml", small_ds, tmp_path)
    record = run_job(job)
    assert record["status"] == "written"
    every, frames, agents = (
        stored_bytes(small_ds),
        stored_bytes(small_ds, ("frames",)),
        stored_bytes(small_ds, ("agents",)),
    )
    assert every <= record["reads"]["bytes"] <= every + 3 * frames < 2 * agents + every
    # the same results as each one's own function
    ref = tmp_path / "ref.json"
    l5dask.prediction.report.write_json(compute_report(small_ds), str(ref))
    assert (tmp_path / "report.json").read_bytes() == ref.read_bytes()
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "catalog.parquet"), l5dask.catalog(small_ds))
    want = l5dask.aggregate(small_ds, by=["scene_index", "label"], values={"speed": ["mean", "max"]})
    pd.testing.assert_frame_equal(
        pd.read_parquet(tmp_path / "speeds.parquet"), want, check_dtype=False, check_categorical=False
    )


def test_a_run_of_the_report_the_catalog_and_an_aggregation_imports_no_pandas(small_ds, tmp_path):
    """``l5dask run`` writes the catalog and the aggregations as the commands do, from their Arrow
    tables: pandas (0.45 s of CPU, a quarter of a report's process on 30 M agents) is not
    imported; the files are those of the functions."""
    job = write(
        tmp_path / "job.toml",
        f"""\
        [datasets]
        small = "{small_ds}"

        [analyses.report]
        kind = "report"
        output = "{tmp_path}/report.json"

        [analyses.catalog]
        kind = "catalog"
        output = "{tmp_path}/catalog.parquet"

        [analyses.near]
        kind = "aggregate"
        by = ["host", "hour", "label"]
        values = {{ extent_length = ["q50", "mean"] }}
        where = "distance_to_ego < 20"
        output = "{tmp_path}/near.parquet"
        """,
    )
    code = (
        "import sys; from l5dask.cli import main; "
        f"main(['run', {str(job)!r}, '-q'], standalone_mode=False); "
        "print(sorted(m for m in ('pandas', 'distributed', 'xarray') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "catalog.parquet"), l5dask.catalog(small_ds))
    want = l5dask.aggregate(
        small_ds, by=["host", "hour", "label"], values={"extent_length": ["q50", "mean"]}, where="distance_to_ego < 20"
    )
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "near.parquet"), want, check_exact=True)


def s3_options_toml(s3) -> str:
    """The S3 options of a job file: s3fs's filesystems shared (a new one each time, as the suite's
    ``skip_instance_cache``, built a botocore session, ~0.5 s, for each output or cache entry
    written), no listing kept between calls (the tests change objects behind l5dask's back)."""
    o = s3.storage_options()
    return (
        f'[storage-options]\nkey = "{o["key"]}"\nsecret = "{o["secret"]}"\nuse_listings_cache = false\n'
        f'client_kwargs = {{ endpoint_url = "{s3.endpoint}", region_name = "us-east-1" }}\n'
    )


def test_on_s3_a_missing_dataset_or_bucket_is_refused_before_anything_runs(s3, s3_small, tmp_path):
    s3.make_bucket("l5-out")
    job = write(
        tmp_path / "job.toml",
        f"""\
        [datasets]
        small = "{s3_small}"

        [analyses.c]
        kind = "catalog"
        output = "s3://l5-out/{{date}}/c.parquet"

        [analyses.r]
        kind = "report"
        output = "s3://no-such-bucket/{{date}}/r.json"
        """
        + s3_options_toml(s3),
    )
    r = cli(job, "-q", "--date", DATE)
    assert r.returncode == 2
    assert r.stderr == (
        f"l5dask: error: {job}:10: [analyses.r] output on small: s3://no-such-bucket/{DATE}/r.json: the bucket "
        "'no-such-bucket' does not exist (or is not visible with these credentials)\n"
    )
    assert not s3.s3fs().exists(f"l5-out/{DATE}")  # the catalog did not run
    write(job, job.read_text().replace(s3_small, "s3://l5-test/gone.zarr").replace("no-such-bucket", "l5-out"))
    r = cli(job, "-q")
    assert r.returncode == 2
    assert r.stderr.startswith(f"l5dask: error: {job}:2: dataset small: s3://l5-test/gone.zarr: "), r.stderr
    assert len(r.stderr.splitlines()) == 1
    # and a job whose dataset and outputs are there runs (its outputs objects of the bucket)
    write(job, job.read_text().replace("s3://l5-test/gone.zarr", s3_small))
    r = cli(job, "-q", "--date", DATE)
    assert r.returncode == 0, r.stderr
    got = pd.read_parquet(io.BytesIO(s3.s3fs().cat(f"l5-out/{DATE}/c.parquet")))
    pd.testing.assert_frame_equal(got, l5dask.catalog(s3_small, storage_options=s3.storage_options()))


def test_a_host_filter_of_a_job_keeps_that_hosts_scenes(small_ds, tmp_path):
    """``scenes`` comparing host with a host of the dataset runs, with scene-catalog and without (the
    names compared with a text column are checked over the catalog read, not over a catalog of no
    row); a host that is not there: one line listing the hosts."""
    ds = l5dask.open_dataset(small_ds)
    table = l5dask.catalog(ds)
    table.to_parquet(tmp_path / "catalog.parquet")
    host = sorted(table["host"])[0]
    expr = f"host == '{host}'"
    chosen = ds.query(expr, catalog=table)
    assert 0 < len(chosen["scenes"]) < len(ds["scenes"])
    want = l5dask.aggregate(chosen, by="label", values={"speed": ["mean", "count"]})
    job = write(
        tmp_path / "job.toml",
        f"""\
        [datasets]
        small = "{small_ds}"

        [analyses.given]
        kind = "aggregate"
        by = "label"
        values = {{ speed = ["mean", "count"] }}
        scenes = "{expr}"
        scene-catalog = "{tmp_path}/catalog.parquet"
        output = "{tmp_path}/given.parquet"

        [analyses.computed]
        kind = "aggregate"
        by = "label"
        values = {{ speed = ["mean", "count"] }}
        scenes = "{expr}"
        output = "{tmp_path}/computed.parquet"

        [analyses.report]
        kind = "report"
        scenes = "{expr}"
        output = "{tmp_path}/report.json"
        """,
    )
    record = run_job(job)
    assert record["status"] == "written", record["analyses"]
    for name in ("given", "computed"):
        pd.testing.assert_frame_equal(
            pd.read_parquet(tmp_path / f"{name}.parquet"), want, check_dtype=False, check_categorical=False
        )
    counts = json.loads((tmp_path / "report.json").read_text())["counts"]
    assert counts["scenes"] == len(chosen["scenes"])
    write(job, job.read_text().replace(expr, "host == 'host-zzz'"))
    r = cli(job, "-q")
    hosts = ", ".join(sorted(set(table["host"])))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"scenes \"host == 'host-zzz'\": 'host-zzz' is not a host; they are: {hosts}\n" in r.stderr


def test_a_job_grouping_some_scenes_by_scene_index_says_they_are_renumbered(small_ds, tmp_path):
    """A job's aggregation of some scenes by scene_index writes the subset's indices (0, 1, ...), as
    ``l5dask agg --scenes`` does; the command line says so, the run said nothing (a nightly file of
    plausible, wrong scene numbers): it says so in a line and in the record. Without ``scenes``, or
    grouped by another column, nothing is said."""
    ds = l5dask.open_dataset(small_ds)
    table = l5dask.catalog(ds)
    stored = table["scene_index"].to_numpy()[1::2]  # (every other scene)
    expr = f"scene_index in {[int(i) for i in stored]}"
    job = write(
        tmp_path / "job.toml",
        f"""\
        [datasets]
        small = "{small_ds}"

        [analyses.some]
        kind = "aggregate"
        by = "scene_index"
        values = {{ speed = "count" }}
        scenes = "{expr}"
        output = "{tmp_path}/some.csv"

        [analyses.labels]
        kind = "aggregate"
        by = "label"
        values = {{ speed = "count" }}
        scenes = "{expr}"
        output = "{tmp_path}/labels.csv"

        [analyses.all]
        kind = "aggregate"
        by = "scene_index"
        values = {{ speed = "count" }}
        output = "{tmp_path}/all.csv"
        """,
    )
    r = cli(job, "--record", tmp_path / "run.json")
    assert r.returncode == 0, r.stderr
    some = pd.read_csv(tmp_path / "some.csv")
    every = pd.read_csv(tmp_path / "all.csv").set_index("scene_index")["speed_count"]
    # the subset's indices, each the count of the stored scene it stands for
    assert some["scene_index"].tolist() == list(range(len(stored)))
    assert some["speed_count"].tolist() == every.loc[stored].tolist()
    said = [line for line in r.stdout.splitlines() if "chosen scenes" in line]
    assert said == [
        "some on small: its scene_index are those of the chosen scenes (counted from 0, as in the subset "
        "l5dask subset writes), not the stored ones: the catalog of the same scenes maps each scene to its "
        "stored_scene_index"
    ], r.stdout
    notes = {
        a["analysis"]: a["result"].get("note") for a in json.loads((tmp_path / "run.json").read_text())["analyses"]
    }
    assert notes["some"] == said[0].removeprefix("some on small: ") and notes["labels"] is None and notes["all"] is None


def test_an_analysis_of_some_scenes_reads_the_catalog_the_run_writes(small_ds, tmp_path):
    """``scenes`` restricts an aggregation (or a report) to the scenes its expression chooses over
    the scene catalog: the one the run writes of the dataset, else one computed for the run."""
    ds = l5dask.open_dataset(small_ds)
    table = l5dask.catalog(ds)
    expr = f"mean_speed_mps >= {float(table['mean_speed_mps'].median())!r}"
    chosen = ds.query(expr, catalog=table)
    assert 0 < len(chosen["scenes"]) < len(ds["scenes"])
    job = write(
        tmp_path / "job.toml",
        f"""\
        [datasets]
        small = "{small_ds}"

        [analyses.catalog]
        kind = "catalog"
        output = "{tmp_path}/catalog.parquet"

        [analyses.long]
        kind = "aggregate"
        by = "label"
        values = {{ speed = ["mean", "count"] }}
        scenes = "{expr}"
        output = "{tmp_path}/long.parquet"

        [analyses.long-report]
        kind = "report"
        scenes = "{expr}"
        output = "{tmp_path}/long-report.json"
        """,
    )
    record = run_job(job)
    assert record["status"] == "written", record["analyses"]
    want = l5dask.aggregate(chosen, by="label", values={"speed": ["mean", "count"]})
    pd.testing.assert_frame_equal(
        pd.read_parquet(tmp_path / "long.parquet"), want, check_dtype=False, check_categorical=False
    )
    ref = tmp_path / "ref.json"
    l5dask.prediction.report.write_json(compute_report(chosen), str(ref))
    assert json.loads((tmp_path / "long-report.json").read_text())["counts"] == json.loads(ref.read_text())["counts"]
    # without a catalog analysis in the job, one is computed for the run; a bad expression is
    # refused before anything runs
    catalog_block = f'[analyses.catalog]\nkind = "catalog"\noutput = "{tmp_path}/catalog.parquet"\n'
    assert catalog_block in job.read_text()
    write(job, job.read_text().replace(catalog_block, ""))
    (tmp_path / "long.parquet").unlink()
    assert run_job(job)["status"] == "written"
    pd.testing.assert_frame_equal(
        pd.read_parquet(tmp_path / "long.parquet"), want, check_dtype=False, check_categorical=False
    )
    # a condition no scene meets: said at run time with the job's key (not the command line's --scenes)
    write(job, job.read_text().replace(expr, "stops > 99999"))
    r = cli(job, "-q")
    assert r.returncode == 1
    n = len(l5dask.open_dataset(small_ds)["scenes"])
    assert f"l5dask: failed: long on small: scenes 'stops > 99999' selects no scene (of {n:,})\n" in r.stderr
    write(job, job.read_text().replace("stops > 99999", "frames >="))
    r = cli(job, "-q")
    assert r.returncode == 2 and "[analyses.long] on small: " in r.stderr and len(r.stderr.splitlines()) == 1


CACHED_JOB = """\
[run]
record = "{out}/run.json"

[cache]
url = "{cache}"

[datasets]
small = "{ds}"

[analyses.report]
kind = "report"
output = "{out}/report.json"

[analyses.speeds]
kind = "aggregate"
by = "label"
values = {{ speed = ["mean", "q99"] }}
output = "{out}/speeds.parquet"
"""


def test_a_cache_that_cannot_be_written_is_one_warning_and_the_run_goes_on(small_ds, tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    out = tmp_path / "out"
    job = write(tmp_path / "job.toml", CACHED_JOB.format(ds=small_ds, out=out, cache=tmp_path / "a-file" / "cache"))
    r = cli(job, "-q")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("l5dask: cache: "), lines
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "written" and record["cache"]["hits"] == 0 and record["cache"]["written"] == 0
    ref = tmp_path / "ref.json"
    l5dask.prediction.report.write_json(compute_report(small_ds), str(ref))
    assert (out / "report.json").read_bytes() == ref.read_bytes()


def test_a_cache_url_l5dask_cannot_write_is_refused_before_anything_runs(small_ds, tmp_path):
    out = tmp_path / "out"
    job = write(tmp_path / "job.toml", CACHED_JOB.format(ds=small_ds, out=out, cache="http://127.0.0.1:9/cache"))
    r = cli(job, "-q")
    assert r.returncode == 2
    assert r.stderr.startswith(f"l5dask: error: {job}:5: [cache] url: "), r.stderr
    assert "cannot write a cache on http://" in r.stderr and len(r.stderr.splitlines()) == 1
    assert not out.exists()
    # refused by the check too (it checks what the run would)
    r = cli(job, "--check")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == (
        f"l5dask: error: {job}:5: [cache] url: http://127.0.0.1:9/cache: l5dask cannot write a cache on http:// "
        "(a local folder, s3://, gs:// or abfs:// can hold one)\n"
    )
    assert not out.exists()
    r = cli(write(tmp_path / "plain.toml", job.read_text().replace("[cache]\n", "").replace(
        'url = "http://127.0.0.1:9/cache"\n', "")), "-q", "--cache", "http://127.0.0.1:9/cache")  # fmt: skip
    assert r.returncode == 2 and "cannot write a cache on http://" in r.stderr and len(r.stderr.splitlines()) == 1
    # --check refuses the --cache of its command line as the run does (it listed the plan and said
    # "the job can run", exit 0)
    plain = tmp_path / "plain.toml"
    for where, why in (("http://127.0.0.1:9/cache", "l5dask cannot write a cache on http://"), (plain, "is a file")):
        r = cli(plain, "--check", "--cache", where)
        assert (r.returncode, r.stdout) == (2, ""), (r.returncode, r.stdout)
        assert r.stderr.startswith(f"l5dask: error: --cache {where}: {why}") and r.stderr.count("\n") == 1, r.stderr
    assert not out.exists()
    r = cli(plain, "--check", "--cache", tmp_path / "a-cache")
    assert r.returncode == 0 and r.stdout.endswith("the job can run\n") and not (tmp_path / "a-cache").exists()
    assert r.stderr == ""
    # a cache under a file: the run warns and goes on uncached, and the check says so (a trial's: it
    # said nothing), making nothing; the job's [cache] url alike
    (tmp_path / "a-file").write_text("x")
    said = (
        f"l5dask: cache: {tmp_path}/a-file/c: cannot write to the cache (cannot make its folder: {tmp_path}/a-file is a file); "
        "the run will go on without it\n"
    )
    r = cli(plain, "--check", "--cache", tmp_path / "a-file" / "c")
    assert (r.returncode, r.stderr) == (0, said) and r.stdout.endswith("the job can run\n"), r.stderr
    in_job = write(tmp_path / "in-job.toml", plain.read_text() + f'\n[cache]\nurl = "{tmp_path}/a-file/c"\n')
    r = cli(in_job, "--check")
    assert (r.returncode, r.stderr) == (0, said), r.stderr
    assert (tmp_path / "a-file").read_text() == "x" and not list(tmp_path.glob(".l5dask-probe*"))


def test_damaged_cache_entries_are_recomputed_and_counted_in_the_record(small_ds, tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    job = write(tmp_path / "job.toml", CACHED_JOB.format(ds=small_ds, out=out, cache=cache))
    r = cli(job, "-q")
    assert r.returncode == 0, r.stderr
    first = json.loads((out / "run.json").read_text())
    # (no hit on an empty cache: the record's fingerprint, which takes the scenes from the entry the
    # pass just wrote, is not counted among the passes' tasks; a trial's: "1 of 28 tasks read")
    assert first["cache"]["written"] > 0 and first["cache"]["hits"] == 0
    report, speeds = (out / "report.json").read_bytes(), (out / "speeds.parquet").read_bytes()
    whole = [e for e in cache.rglob("*.l5c") if e.name.startswith("pass-")]  # (each pass whole)
    prefixes = [e for e in cache.rglob("*.l5c") if e.name.startswith("prefix-")]  # (a pass's first tasks)
    for e in whole + prefixes:  # (gone: the tasks' own entries are read, two of them damaged)
        e.unlink()
    # (a task's alias, its second key by its frame rows: not read when its own key is found)
    aliases = [e for e in cache.rglob("*.l5c") if cachelib.key_of(e.name).startswith("r")]
    entries = sorted(e for e in cache.rglob("*.l5c") if e not in aliases)
    entries[0].write_bytes(entries[0].read_bytes()[:-7])  # truncated
    entries[1].write_bytes(b"\0" * entries[1].stat().st_size)  # zeroed
    r = cli(job, "-q")
    assert r.returncode == 0, r.stderr
    assert all(line.startswith("l5dask: cache: ") for line in r.stderr.splitlines()) and r.stderr
    second = json.loads((out / "run.json").read_text())
    assert (
        second["cache"]["damaged"] == 2
        and second["cache"]["hits"] == first["cache"]["written"] - len(whole) - len(prefixes) - len(aliases) - 2
    )
    assert whole and prefixes and second["cache"]["written"] == 2 + len(whole) + len(prefixes)
    assert (out / "report.json").read_bytes() == report
    pd.testing.assert_frame_equal(pd.read_parquet(out / "speeds.parquet"), pd.read_parquet(io.BytesIO(speeds)))
    assert second["reads"]["bytes"] < first["reads"]["bytes"]


def test_the_nightly_job_twice_on_a_cluster_over_s3_reads_no_chunk_the_second_time(s3, s3_small, dask_cluster):
    """The CronJob's own job file (cluster/k8s), its buckets the test's, run twice on a real
    cluster over a real S3 endpoint: the second run reads the cache's entries and no chunk, and
    writes the same outputs."""
    import datetime

    from tests.test_deploy import nightly

    for bucket in ("l5-reports", "l5-cache"):
        s3.make_bucket(bucket)
    _, text, _ = nightly()
    text = (
        text.replace("s3://lyft-l5/train_full.zarr", s3_small)
        .replace("lyft-l5-reports", "l5-reports")
        .replace("lyft-l5-cache", "l5-cache/" + os.urandom(4).hex())
    )
    options = s3.storage_options()
    text += (
        f'\n[storage-options]\nkey = "{options["key"]}"\nsecret = "{options["secret"]}"\n'
        f'use_listings_cache = false\nclient_kwargs = {{ endpoint_url = "{s3.endpoint}", region_name = "us-east-1" }}\n'
    )
    src = jobfile.parse_toml(text, "nightly.toml")
    job = jobfile.check(src)
    day = datetime.datetime(2026, 1, 2, 3, tzinfo=datetime.timezone.utc)
    fs = s3.s3fs()
    first = run_job(job, scheduler=dask_cluster.address, now=day)
    assert first["status"] == "written", first["analyses"]
    outputs = {p: fs.cat(p) for a in first["analyses"] for p in a["outputs"].values()}
    assert first["reads"]["bytes"] >= sum(
        fs.size(f) for a in ("agents", "frames", "scenes", "traffic_light_faces")
        for f in fs.ls(f"{s3_small}/{a}") if not f.rsplit("/", 1)[1].startswith(".")
    )  # fmt: skip
    second = run_job(job, scheduler=dask_cluster.address, now=day)
    assert second["status"] == "written", second["analyses"]
    # no data chunk read, the scenes' neither (the passes' and the record's fingerprint's whole
    # read comes from the cache): only the 16 bytes of each array's last chunk's header that
    # opening a dataset checks, and the cache's entries
    folders = second["reads"]["by_folder"]
    for array in ("frames", "agents", "traffic_light_faces", "scenes"):
        assert folders[array] == {"objects": 1, "bytes": 16}, folders
    assert set(folders) == {"frames", "agents", "traffic_light_faces", "scenes", cachelib.FOLDER}, folders
    assert second["inputs"] == first["inputs"]  # (the fingerprint, its scenes' digest from the cache)
    assert second["cache"]["hits"] > 0 and second["cache"]["misses"] == 0, second["cache"]
    for p, data in outputs.items():
        if p.endswith((".json", ".csv")) and not p.endswith("run.json"):
            assert fs.cat(p) == data, p
        elif p.endswith(".parquet"):
            pd.testing.assert_frame_equal(pd.read_parquet(io.BytesIO(fs.cat(p))), pd.read_parquet(io.BytesIO(data)))
    record = json.loads(fs.cat("l5-reports/2026-01-02/run.json"))
    assert record["reads"] == second["reads"] and record["inputs"][0]["url"] == s3_small


#: For every kind of analysis, keys that are wrong (a value its check refuses, a value of the wrong
#: type or choice, an unknown key): (kind, keys given before the bad one, the bad key, its value,
#: what the line says). Each fault is said at the bad key's own line, never at its table's.
TABLE = object()  # (a value given as a table: values = { speed = "mean" })
NAN = object()  # (a float NaN: nan in TOML, .nan in YAML)
KEY_FAULTS = [
    ("report", {"output": "r.json"}, "html", "r.json", "html 'r.json': name the file *.html or *.htm"),
    ("report", {"html": "r.html"}, "output", "r.txt", "output 'r.txt': name the file *.json"),
    ("report", {"output": "r.json"}, "scenes-table", "s.csv", "scenes-table 's.csv': name the file *.parquet"),
    ("report", {"output": "r.json"}, "scene-catalog", "c.parquet", "scene-catalog is read by scenes"),
    ("report", {"output": "r.json"}, "scenes", "nosuch > 1", "scenes 'nosuch > 1' names unknown column 'nosuch'"),
    ("catalog", {"output": "c.parquet"}, "tz", "Nowhere/Else", "unknown time zone 'Nowhere/Else'"),
    ("catalog", {"tz": "UTC"}, "output", "c.csv", "output 'c.csv': name the file *.parquet"),
    ("catalog", {"output": "c.parquet"}, "timezone", "UTC", "unknown key 'timezone' in [analyses.x] (kind catalog); "
     "the keys are: datasets, kind, output, tz"),
    ("aggregate", {"values": TABLE, "output": "a.csv"}, "quantile-bits", 60, "quantile-bits must be from 0 to 52"),
    ("aggregate", {"values": TABLE}, "output", "a.txt", "unknown table format '.txt'"),
    ("aggregate", {"values": TABLE, "output": "a.csv"}, "array", "agent", "array: 'agent' is not one of scenes, frames, agents"),
    ("aggregate", {"values": TABLE, "output": "a.csv"}, "where", "nosuch < 1", "nosuch"),
    ("aggregate", {"values": TABLE, "output": "a.csv"}, "by", ["speed"], "cannot group by 'speed' (float64)"),
    ("aggregate", {"values": TABLE, "output": "a.csv"}, "by", ["label", "label"], "a column is named twice in by"),
    ("export", {"output": "ex"}, "format", "csv", "format: 'csv' is not one of parquet, zarr3"),
    ("export", {"format": "zarr3"}, "output", "{day}/ex", "output: unknown field {day}; the fields are: date, "),
    ("export", {"output": "ex"}, "formt", "zarr3", "unknown key 'formt' in [analyses.x] (kind export); the keys are: "
     "datasets, format, kind, output"),
    ("export", {"output": "ex"}, "datasets", ["big"], "datasets: no dataset 'big'; the datasets are: small"),
    ("select-agents", {"output": "mask"}, "threshold", 2.0, "threshold must be from 0 to 1, not 2.0"),
    ("select-agents", {"output": "mask"}, "threshold", "high", "threshold: expected a number, not a string 'high'"),
    ("select-agents", {"output": "mask"}, "yaw-degrees", NAN, "yaw-degrees is NaN: give a number"),
    ("select-agents", {"output": "mask"}, "report", "mask.txt", "report 'mask.txt': name the file *.json"),
    ("select-agents", {"output": "mask"}, "yaw_degrees", 20.0, "unknown key 'yaw_degrees' in [analyses.x] (kind "
     "select-agents); the keys are: datasets, distance-m, extent-ratio, kind, output, report, threshold, yaw-degrees"),
]  # fmt: skip


def _job_text(small_ds: str, kind: str, before: dict, key: str, value, yaml: bool) -> str:
    def show(v) -> str:
        if v is TABLE:
            return "{speed: mean}" if yaml else '{ speed = "mean" }'
        if v is NAN:
            return ".nan" if yaml else "nan"
        return json.dumps(v)  # (a JSON scalar or list: TOML's and YAML's both)

    items = [("kind", kind), *before.items(), (key, value)]
    if yaml:
        return f"datasets:\n  small: {json.dumps(small_ds)}\nanalyses:\n  x:\n" + "".join(
            f"    {k}: {show(v)}\n" for k, v in items
        )
    return f'[datasets]\nsmall = "{small_ds}"\n\n[analyses.x]\n' + "".join(f"{k} = {show(v)}\n" for k, v in items)


@pytest.mark.parametrize("yaml", [False, True], ids=["toml", "yaml"])
@pytest.mark.parametrize("kind, before, key, value, message", KEY_FAULTS, ids=[f"{f[0]}-{f[2]}" for f in KEY_FAULTS])
def test_a_bad_key_is_said_at_its_own_line_for_every_kind(small_ds, tmp_path, yaml, kind, before, key, value, message):
    """Issue 48's "bad input": the file, the key's own line (the last of its table here, never the
    table's: select-agents, the outputs' suffixes, tz, quantile-bits and scene-catalog said the
    table's line before), what is wrong, and for an unknown key the keys that exist."""
    from l5dask.core import runs

    job = tmp_path / ("job.yaml" if yaml else "job.toml")
    job.write_text(_job_text(small_ds, kind, before, key, value, yaml))
    line = len(job.read_text().splitlines())  # (the bad key is the last line)
    with pytest.raises(JobError) as err:
        runs.plan(load_job(job))
    text = str(err.value)
    assert text.startswith(f"{job}:{line}: "), text
    assert message in text and "\n" not in text, text
    assert sorted(os.listdir(tmp_path)) == [job.name]  # nothing made


def test_every_kind_has_its_bad_keys_tested():
    assert {f[0] for f in KEY_FAULTS} == set(jobfile.ANALYSES)


def test_a_cached_rerun_of_a_restricted_analysis_reads_what_the_docs_say(small_ds, tmp_path):
    """docs/jobs.md and docs/guide/caching.md: a rerun over unchanged data reads the metadata, the
    cache's entries and each array's 16-byte header; an analysis restricted by ``scenes =`` reads
    besides the scenes array and frames chunks (the chosen scenes' rows), no agents' or faces' chunk."""
    job = write(
        tmp_path / "job.toml",
        f"""\
        [cache]
        url = "{tmp_path / "cache"}"
        [datasets]
        small = "{small_ds}"
        [analyses.a]
        kind = "aggregate"
        values = {{ speed = "mean" }}
        scenes = "scene_index >= 2"
        output = "{tmp_path / "a.csv"}"
        """,
    )
    first = run_job(job)
    second = run_job(job)
    assert first["status"] == second["status"] == "written"
    assert second["cache"]["misses"] == 0 and second["cache"]["hits"] > 0, second["cache"]
    folders = second["reads"]["by_folder"]
    for array in ("agents", "traffic_light_faces"):
        assert folders[array] == {"objects": 1, "bytes": 16}, folders
    for array in ("frames", "scenes"):  # (read to restrict the dataset: what the docs say besides)
        assert folders[array]["objects"] > 1 and folders[array]["bytes"] > 16, folders
    assert set(folders) <= {"frames", "agents", "traffic_light_faces", "scenes", cachelib.FOLDER}, folders


def test_an_output_over_the_job_file_or_a_scene_catalog_it_reads_is_refused(small_ds, tmp_path):
    """A new user's trial: ``run nightly.toml --record nightly.toml`` (or ``[run] record`` naming the
    job file) replaced the job with its run record, exit 0, and every later run failed; an output
    over another analysis' ``scene-catalog`` replaced the catalog it reads. Refused before anything
    runs (``--check`` too), at the line that names the output; every file left byte for byte."""
    ds = tmp_path / "d.zarr"
    shutil.copytree(small_ds, ds)
    cat = tmp_path / "cat.parquet"
    l5dask.catalog(str(ds)).to_parquet(cat)
    agg = 'kind = "aggregate"\nvalues = { speed = "mean" }\n'
    base = f'[datasets]\nd = "{ds}"\n[analyses.a]\n{agg}output = "{tmp_path}/a.csv"\n'
    job = write(tmp_path / "job.toml", f'[run]\nrecord = "{tmp_path}/job.toml"\n' + base)
    plain = write(tmp_path / "plain.toml", base)
    reads = write(
        tmp_path / "reads.toml",
        base.replace("[analyses.a]\n", f'[analyses.a]\nscenes = "num_frames > 0"\nscene-catalog = "{cat}"\n')
        + f'[analyses.b]\n{agg}output = "{cat}"\n',
    )
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    for args, message in (
        ((job,), f"{job}:2: the run record: {job}: the output is the job file ({job}), which the run reads"),
        (
            (plain, "--record", plain),
            f"--record {plain}: {plain}: the output is the job file ({plain}), which the run reads",
        ),
        (
            (reads,),
            f"{reads}:12: [analyses.b] output on d: {cat}: the output is [analyses.a] scene-catalog ({cat}), "
            "which the run reads",
        ),
    ):
        for check in ((), ("--check",)):
            r = cli(*args, *check)
            assert (r.returncode, r.stdout) == (2, ""), r.stderr
            assert r.stderr == f"l5dask: error: {message}; write elsewhere\n"
            assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_an_export_that_would_hold_its_dataset_is_refused_before_anything_runs(small_ds, tmp_path):
    """A new user's finding: a job's export into the folder that holds its dataset passed
    ``--check``, and the run replaced the folder (the dataset deleted). Refused at the output's
    line, with ``--check`` and without; the dataset untouched."""
    data = tmp_path / "data"
    data.mkdir()
    shutil.copytree(small_ds, data / "sample.zarr")
    text = f'[datasets]\nsample = "{data}/sample.zarr"\n\n[analyses.ex]\nkind = "export"\noutput = "{data}"\n'
    job = write(tmp_path / "job.toml", text)
    for args in ((), ("--check",)):
        r = cli(job, *args)
        assert (r.returncode, r.stdout) == (2, ""), r.stderr
        assert r.stderr == (
            f"l5dask: error: {job}:6: [analyses.ex] output on sample: {data}: the output holds the dataset "
            f"sample ({data}/sample.zarr); write elsewhere\n"
        )
        assert sorted(os.listdir(data)) == ["sample.zarr"]
        assert l5dask.open_dataset(str(data / "sample.zarr")).counts() == l5dask.open_dataset(small_ds).counts()


@pytest.mark.parametrize(
    "name, text, message",
    [
        (
            "job.yaml",
            "run:\n  date: 2026-02-30\ndatasets:\n  s: {ds}\nanalyses:\n  r:\n    kind: report\n    output: {out}/r.json\n",
            "job.yaml:2: '2026-02-30' is not a value YAML can read (day is out of range for month)",
        ),
        (
            "job.yaml",
            "datasets:\n  s: {ds}\nanalyses:\n  r:\n    kind: report\n    output: {out}/r.json\n"
            "  r:\n    kind: report\n    output: {out}/r2.json\n",
            "job.yaml:7: analyses.r is given twice (first at line 4)",
        ),
        (
            "job.toml",
            '[cluster]\nworkers = 1\nmemory-limit = "lots"\n[datasets]\ns = "{ds}"\n'
            '[analyses.r]\nkind = "report"\noutput = "{out}/r.json"\n',
            "job.toml:3: [cluster] memory-limit: 'lots' is not an amount of memory (4GB, 512 MiB)",
        ),
    ],
)
def test_a_new_users_job_mistakes_are_one_line_at_their_line(small_ds, tmp_path, name, text, message):
    """A new user's findings: an unquoted YAML date that is no day (2026-02-30) was a traceback; a
    YAML job's two analyses of one name kept the last silently (TOML refuses them); a memory limit
    that is no amount passed ``--check`` and the run died in a traceback. One line each, at its
    line, with ``--check`` and without; nothing written."""
    out = tmp_path / "out"
    job = write(tmp_path / name, text.format(ds=small_ds, out=out))
    for args in ((), ("--check",)):
        r = cli(job, *args)
        assert (r.returncode, r.stdout) == (2, ""), r.stderr
        assert r.stderr == f"l5dask: error: {tmp_path}/{message}\n"
        assert not out.exists()


def test_a_tag_that_is_none_of_its_names_is_refused_by_check(small_ds, tmp_path):
    """A new user's finding: ``scenes = "turn == 'lft'"`` passed ``--check`` and failed the run (the
    command line refuses it up front): a category column whose names are known before the catalog
    is made (a turn's) is checked there; one whose names come with the data (hosts) at run time."""
    out = tmp_path / "out"
    for expr, refused in (("turn == 'lft'", True), ("turn == 'left'", False), ("host == 'no-such-host'", False)):
        job = write(
            tmp_path / "job.toml",
            f'[datasets]\ns = "{small_ds}"\n[analyses.r]\nkind = "report"\noutput = "{out}/r.json"\nscenes = "{expr}"\n',
        )
        r = cli(job, "--check")
        if refused:
            assert (r.returncode, r.stdout) == (2, "")
            assert r.stderr == (
                f'l5dask: error: {job}:6: [analyses.r] on s: scenes "{expr}": ' + "'lft' is not a turn; "
                "they are: left, right, straight\n"
            )
        else:
            assert r.returncode == 0, r.stderr
    assert not out.exists()


def test_an_interrupted_run_writes_its_record_saying_so(small_ds, default_ds, tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM part way (here in the second dataset's pass): the record is written, its
    status ``interrupted``, the first dataset's analyses ``written``, the rest ``interrupted``;
    the interruption goes on (the CLI says it and exits 130 or 143)."""
    from l5dask.core import runs

    job = write(
        tmp_path / "job.toml",
        f"""\
        [run]
        record = "{tmp_path}/run.json"
        [datasets]
        a = "{small_ds}"
        b = "{default_ds}"
        [analyses.count]
        kind = "aggregate"
        array = "scenes"
        values = {{ scene_index = "count" }}
        output = "{tmp_path}/out/{{dataset}}.csv"
        """,
    )
    real = runs._run_dataset

    def interrupted_at_b(inp, tasks, ctx):
        if inp.name == "b":
            raise KeyboardInterrupt
        return real(inp, tasks, ctx)

    monkeypatch.setattr(runs, "_run_dataset", interrupted_at_b)
    with pytest.raises(KeyboardInterrupt):
        run_job(job)
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["status"] == "interrupted"
    assert [(a["dataset"], a["status"]) for a in record["analyses"]] == [("a", "written"), ("b", "interrupted")]
    assert sorted(os.listdir(tmp_path / "out")) == ["a.csv"]
    monkeypatch.setattr(runs, "_run_dataset", real)
    assert run_job(job)["status"] == "written"
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "written"


@pytest.mark.parametrize("signame, code, said", [("SIGTERM", 143, "terminated"), ("SIGINT", 130, "interrupted")])
def test_sigterm_unwinds_a_command_as_ctrl_c_does(tmp_path, signame, code, said):
    """SIGTERM (Kubernetes stopping a pod) ended the process at once: a folder written in place
    stayed half-written. Now it unwinds as Ctrl-C: the temporary output is removed, one line."""
    script = textwrap.dedent(
        f"""\
        import os, signal, sys, time
        import click
        from l5dask.core.commands import friendly, stop_on_sigterm
        from l5dask.core.outputs import atomic_output

        @click.command()
        @friendly
        def cmd():
            with atomic_output({str(tmp_path / "out")!r}, folder=True) as tmp:
                open(os.path.join(tmp, "part"), "w").write("x")
                os.kill(os.getpid(), signal.{signame})
                time.sleep(30)

        signal.signal(signal.SIGINT, signal.default_int_handler)  # (a background job's shell ignores SIGINT)
        stop_on_sigterm()
        cmd()
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stderr) == (code, f"l5dask: {said}\n"), r.stderr
    assert os.listdir(tmp_path) == []


def test_an_output_inside_a_dataset_or_over_a_users_files_is_refused_by_check(small_ds, tmp_path):
    """A job's file inside its dataset (``ds.zarr/agents/c.parquet``: a stray file among the
    dataset's own, or its ``.zattrs`` replaced) is refused; an export folder holding a user's file
    at any depth is refused by ``--check`` as by the run, which deletes nothing."""
    ds = tmp_path / "ds.zarr"
    shutil.copytree(small_ds, ds)
    before = {p: p.read_bytes() for p in ds.rglob("*") if p.is_file()}
    # (its folders untouched: refused before a file is made and removed in them to test them, a
    # trial's finding: the dataset folder's modification time moved)
    times = {p: p.stat().st_mtime_ns for p in (ds, ds / "agents")}
    for kind, inside in (("catalog", "agents/c.parquet"), ("report", "r.json")):
        job = write(
            tmp_path / "in.toml",
            f'[datasets]\nv = "{ds}"\n[analyses.c]\nkind = "{kind}"\noutput = "{ds}/{inside}"\n',
        )
        for extra in (["--check"], ["-q"]):
            r = cli(job, *extra)
            assert r.returncode == 2 and r.stderr == (
                f"l5dask: error: {job}:5: [analyses.c] output on v: {ds}/{inside}: the output is inside the "
                f"dataset v ({ds}); write elsewhere\n"
            ), r.stderr
    assert {p: p.stat().st_mtime_ns for p in times} == times
    out = tmp_path / "exj"
    job = write(tmp_path / "ex.toml", f'[datasets]\ns = "{ds}"\n[analyses.e]\nkind = "export"\noutput = "{out}"\n')
    assert cli(job, "-q").returncode == 0
    for mine in ("notes.txt", "agents/notes.txt"):
        (out / mine).write_text("mine")
        for extra in (["--check"], ["-q"]):
            r = cli(job, *extra)
            assert r.returncode == 2 and f"{out}: it holds {mine}, which is not an export's" in r.stderr, r.stderr
            assert "--overwrite" not in r.stderr and len(r.stderr.splitlines()) == 1
            assert (out / mine).read_text() == "mine"
        (out / mine).unlink()
    assert cli(job, "--check").returncode == 0
    assert {p: p.read_bytes() for p in ds.rglob("*") if p.is_file()} == before


def test_a_pass_writes_its_outputs_at_once_and_one_that_fails_leaves_the_others(small_ds, tmp_path):
    """The analyses of one pass write their outputs in threads: an output that fails at write time
    (checked writable, then a folder no file can be made in) is its member's exception, in the
    members' order, and the others are written whole (each equal to its own function's)."""
    from l5dask import jobs
    from l5dask.core import runs
    from l5dask.errors import OutputError
    from l5dask.prediction.jobs import run_together

    out = tmp_path / "out"
    out.mkdir()
    plan = runs.plan(jobs.load_job(four_analyses(tmp_path / "job.toml", small_ds, out)))
    members = [(t.analysis.kind, t.analysis.params, t.outputs) for t in plan.tasks]
    members[1] = (members[1][0], members[1][1], {"output": "/proc/broken.parquet"})  # (the catalog's)
    got = run_together(plan.inputs["small"].ds, members, runs.Context())
    assert [type(g).__name__ for g in got] == ["dict", "OutputError", "dict", "dict"]
    assert isinstance(got[1], OutputError) and "/proc/broken.parquet" in str(got[1])
    assert sorted(os.listdir(out)) == ["frames.parquet", "report.json", "speeds.parquet"]
    ref = tmp_path / "ref.json"
    l5dask.prediction.report.write_json(compute_report(small_ds), str(ref))
    assert (out / "report.json").read_bytes() == ref.read_bytes()
    for name, values, by in (
        ("speeds", {"speed": ["mean", "max"]}, ["scene_index", "label"]),
        ("frames", {"num_agents": "sum"}, None),
    ):
        want = l5dask.aggregate(small_ds, "frames" if by is None else "agents", by=by, values=values)
        got_frame = pd.read_parquet(out / f"{name}.parquet")
        pd.testing.assert_frame_equal(got_frame, want, check_dtype=False, check_categorical=False)


def test_relative_outputs_that_are_refused_are_one_line_a_trials_finding(small_ds, tmp_path):
    """A new user's finding: an output written relative to the folder the run starts in
    (``p.zarr/x.parquet``, inside the dataset; ``out/s.parquet/`` a folder; ``j.toml/x.parquet``
    under a file) and ``--record`` given so, were a KeyError with two tracebacks, exit 1: now each
    is the one line an absolute path gets, exit 2, from ``--check`` and from the run."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(small_ds, work / "p.zarr")
    (work / "out" / "s.parquet").mkdir(parents=True)
    (work / "j.toml").write_text("")
    cases = [
        ("p.zarr/x.parquet", [], "the output is inside the dataset p (p.zarr); write elsewhere"),
        ("out/s.parquet", [], "is a folder; give a file name"),
        ("j.toml/x.parquet", [], ""),
        ("ok.parquet", ["--record", "p.zarr/r.json"], "the output is inside the dataset p (p.zarr); write elsewhere"),
    ]
    for output, extra, message in cases:
        job = write(work / "b.toml", f'[datasets]\np = "p.zarr"\n[analyses.b]\nkind = "catalog"\noutput = "{output}"\n')
        for how in (["--check"], ["-q"]):
            r = cli("b.toml", *how, *extra, cwd=work)
            assert r.returncode == 2, (output, extra, r.stderr)
            assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
            assert r.stderr.startswith("l5dask: error: ") and message in r.stderr, r.stderr
        assert not (work / "ok.parquet").exists() and job.exists()


def test_date_sets_the_templates_day_not_the_records_start(small_ds, tmp_path):
    """A new user's finding: ``--date 2020-02-29`` made the record's ``started`` that day (with
    ``finished`` today): ``--date`` is the templates' ``{date}``; ``started`` is when the run ran."""
    import datetime

    out = tmp_path / "out"
    job = write(
        tmp_path / "job.toml",
        f'[run]\nrecord = "{out}/{{date}}/run.json"\n[datasets]\ns = "{small_ds}"\n'
        f'[analyses.f]\nkind = "aggregate"\narray = "frames"\nvalues = {{ num_agents = "sum" }}\n'
        f'output = "{out}/{{date}}/f.parquet"\n',
    )
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    r = cli(job, "-q", "--date", "2020-02-29")
    assert r.returncode == 0, r.stderr
    record = json.loads((out / "2020-02-29" / "run.json").read_text())
    assert (out / "2020-02-29" / "f.parquet").exists()
    started = datetime.datetime.fromisoformat(record["started"])
    finished = datetime.datetime.fromisoformat(record["finished"])
    assert before <= started <= finished and (finished - started).total_seconds() < 600


def test_analyses_of_chosen_scenes_whose_catalog_fails_say_so(small_ds, tmp_path):
    """A trial's finding: with a damaged agents chunk, an analysis of some scenes (``scenes =``)
    failed with that chunk's message alone, though its own scenes' rows were sound: it fails
    because the catalog its scenes are chosen over could not be made, and now says so (each such
    analysis; the others are written)."""
    bad = tmp_path / "bad.zarr"
    shutil.copytree(small_ds, bad)
    name, damage_fn, pattern = damage.CHUNK[-2]  # a truncated agents chunk
    damage_fn(bad)
    out = tmp_path / "out"
    job = write(
        tmp_path / "job.toml",
        f"""\
        [datasets]
        bad = "{bad}"

        [analyses.all_frames]
        kind = "aggregate"
        array = "frames"
        values = {{ num_agents = "sum" }}
        output = "{out}/all.parquet"

        [analyses.some]
        kind = "aggregate"
        array = "frames"
        values = {{ num_agents = "sum" }}
        scenes = "scene_index < 2"
        output = "{out}/some.parquet"

        [analyses.more]
        kind = "aggregate"
        array = "frames"
        by = "scene_index"
        values = {{ num_agents = "max" }}
        scenes = "scene_index >= 2"
        output = "{out}/more.parquet"
        """,
    )
    r = cli(job, "-q")
    assert r.returncode == 1, r.stderr
    lines = r.stderr.splitlines()
    assert lines[-1] == "l5dask: 2 of 3 analyses failed", lines
    said = "its scenes are chosen over the dataset's scene catalog, which failed: "
    for analysis in ("some", "more"):
        line = next(x for x in lines if x.startswith(f"l5dask: failed: {analysis} on bad: "))
        assert said in line and "array 'agents', chunk '0'" in line, line
    assert (out / "all.parquet").exists() and not (out / "some.parquet").exists()
