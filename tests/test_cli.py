"""The command line's one convention (issue 49, item 9): every command reads ``-o/--output``,
``-q/--quiet``, ``--overwrite`` and ``-s/--storage-option`` the same way, as most tools do."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner

from l5dask.cli import main
from l5dask.core.commands import CONVENTION, friendly


def commands() -> list[tuple[str, click.Command]]:
    """Every command of ``l5dask`` (the groups' commands too), by its path."""
    found = []

    def walk(group: click.Group, path: str) -> None:
        ctx = click.Context(group)
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            assert command is not None, name
            if isinstance(command, click.Group):
                walk(command, f"{path} {name}")
            else:
                found.append((f"{path} {name}", command))

    walk(main, "l5dask")
    return found


COMMANDS = commands()
#: the commands that write something: each names it -o/--output (never an argument)
WRITERS = {
    "agg", "chop", "concat", "demo", "evaluate", "export", "gt", "report", "select-agents", "split", "stats",
    "subset", "synth", "perception evaluate", "perception report", "perception stats", "perception synth",
    "perception to-l5kit",
}  # fmt: skip


def test_every_command_is_walked():
    names = {path.removeprefix("l5dask ") for path, _ in COMMANDS}
    assert WRITERS <= names and {"info", "validate"} <= names and len(names) >= 20


@pytest.mark.parametrize("path, command", COMMANDS, ids=[p for p, _ in COMMANDS])
def test_every_command_follows_the_convention(path, command):
    options = {p.name: p for p in command.params if isinstance(p, click.Option) and not p.hidden}
    flags = {flag: p.name for p in options.values() for flag in [*p.opts, *p.secondary_opts]}
    # a hidden option is an old spelling, kept for one release (its name says so)
    hidden = [p.name for p in command.params if isinstance(p, click.Option) and p.hidden]
    assert all(name.startswith("old_") for name in hidden), (path, hidden)
    # -q everywhere; each shared option with its flags and no other
    assert "quiet" in options, f"{path}: no -q/--quiet"
    assert getattr(options["quiet"].callback, "__module__", None) == "l5dask.core.commands", path  # (the store's too)
    for name, declared in CONVENTION.items():
        if name in options:
            assert sorted(options[name].opts + options[name].secondary_opts) == sorted(declared), (path, name)
        for flag in declared:
            assert flags.get(flag, name) == name, f"{path}: {flag} is {flags[flag]}, not {name}"
    # one name, one meaning: --scenes is the scene filter (an expression) wherever it is, never a count
    # (synth, demo and perception synth said --scenes N for the scenes to generate: -n/--num-scenes)
    if "scenes" in options:
        assert options["scenes"].metavar == "EXPR" and options["scenes"].type is click.STRING, path
    assert "num_scenes" not in options or options["num_scenes"].opts == ["--num-scenes", "-n"], path
    # the usual letters keep their usual meaning: no -O, no -v that is not verbose
    assert "-O" not in flags and flags.get("-v", "verbose") == "verbose", path
    # the output is an option (-o), the inputs are the arguments
    arguments = [p.name for p in command.params if isinstance(p, click.Argument)]
    assert not {"out", "output", "outdir"} & set(arguments), f"{path}: an output as an argument"
    if path.removeprefix("l5dask ") in WRITERS:
        assert "output" in options, f"{path}: no -o/--output"
    if "overwrite" in options:
        assert "output" in options, path
    # one error path: the callback is the convention's (friendly) wrapper
    assert command.callback is not None and command.callback.__code__ is friendly(lambda: None).__code__, path


def cli(*args):
    return subprocess.run([sys.executable, "-m", "l5dask.cli", *map(str, args)], capture_output=True, text=True)


def test_o_is_the_output_and_s_a_storage_option(small_ds, tmp_path):
    out = tmp_path / "r.json"
    r = cli("stats", small_ds, "-o", out, "-s", "anon=false")
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["counts"]["agents"] > 0
    assert "Distinct tracks" in r.stdout  # (the table, printed with -o too)
    r = cli("stats", small_ds, "-q")
    assert "Distinct tracks" in r.stdout and r.stderr == ""  # (-q silences the progress, not the answer)


def test_q_with_an_output_prints_one_line_saying_where(small_ds, tmp_path):
    """``-q -o FILE`` printed the whole table of ``stats`` (and of ``perception stats``,
    ``perception evaluate``, ``demo``) although the answer was in FILE: one line saying where now,
    as ``agg -q -o`` always did; without -q, or without -o, the answer is printed."""
    from .detection_data import generate, write_json

    gt, pred = generate(4, seed=2)
    write_json(gt, tmp_path / "gt.json")
    write_json(pred, tmp_path / "pred.json")
    root = tmp_path / "perception"
    assert cli("perception", "synth", "-o", root, "--num-scenes", "1", "--no-images", "-q").returncode == 0
    cases = [
        (["stats", small_ds], "Distinct tracks", "wrote {out}", "r.json"),
        (["perception", "stats", root, "--no-lidar"], "samples", "wrote {out}", "p.json"),
        (
            ["perception", "evaluate", tmp_path / "pred.json", "--gt", tmp_path / "gt.json"],
            "mAP",
            "wrote {out}",
            "m.json",
        ),
        (["agg", small_ds, "--by", "label", "--value", "speed:mean"], "speed_mean", "wrote {out}: ", "a.csv"),
        (["demo", "--num-scenes", "2"], "Distinct tracks", "report of ", "demo"),  # (and its page's time: below)
    ]
    # the 14 commands are independent processes (loud writes an output of its own): run two at a
    # time (the test waits on interpreter starts; the checks are the same)
    runs = {}
    for args, _, _, name in cases:
        runs[name, "loud"] = (*args, "-o", tmp_path / f"loud-{name}")
        runs[name, "quiet"] = (*args, "-q", "-o", tmp_path / name)
        if name != "demo":  # (no -o: the answer is printed, -q or not; demo always writes its folder)
            runs[name, "printed"] = (*args, "-q")
    with ThreadPoolExecutor(2) as pool:
        done = dict(zip(runs, pool.map(lambda argv: cli(*argv), runs.values())))
    for args, table, line, name in cases:
        out = tmp_path / name
        loud, quiet = done[name, "loud"], done[name, "quiet"]
        assert loud.returncode == quiet.returncode == 0, (args, loud.stderr, quiet.stderr)
        assert quiet.stderr == "" and len(quiet.stdout.splitlines()) == 1, (args, quiet.stdout, quiet.stderr)
        assert quiet.stdout.startswith(line.format(out=out)) and table not in quiet.stdout, (args, quiet.stdout)
        if name != "demo":
            printed = done[name, "printed"]
            assert table in printed.stdout, (args, printed.stdout)
        if name != "a.csv":  # (agg -o never printed its table)
            assert table in loud.stdout, (args, loud.stdout)
        # without -q, the answer then where it went, said once (a trial's: stats -o did not say it)
        loud_line = line.format(out=tmp_path / f"loud-{name}")
        assert loud.stdout.splitlines()[-1].startswith(loud_line), (args, loud.stdout)
        assert loud.stdout.count(loud_line) == 1, (args, loud.stdout)
        if name == "demo":  # (the pass's time, and the page's apart: a user saw 0.4 s for a 7 s command)
            assert re.search(r"in \d+\.\d s \(its page's figures drawn in \d+\.\d s\): ", quiet.stdout), quiet.stdout


@pytest.mark.parametrize("value", ["anon=true", "client_kwargs.endpoint_url=http://127.0.0.1:5000"])
def test_a_storage_option_given_as_the_output_is_refused(small_ds, tmp_path, value):
    """What an old command line gives with -o (a storage option) is refused in one line naming
    -s, not written to a file named after it."""
    r = subprocess.run(
        [sys.executable, "-m", "l5dask.cli", "stats", str(small_ds), "-o", value, "-q"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "-s/--storage-option" in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []


REQUIRED_OUTPUT = [path for path, c in COMMANDS if any(p.name == "output" and p.required for p in c.params)]


@pytest.mark.parametrize("path", REQUIRED_OUTPUT)
def test_a_missing_required_output_is_one_line_and_nothing_is_written(path, small_ds, tmp_path):
    """click 8.5 ran a command whose required -o was not given with None (a traceback, or chop's
    output written to a folder named None): refused in one line, exit 2, nothing written."""
    from click.testing import CliRunner

    command = dict(COMMANDS)[path]
    # the command's arguments given (any values: the missing -o is refused before they are read)
    args = [
        small_ds if p.name in ("dataset", "datasets", "gt", "pred", "predictions") else "x"
        for p in command.params
        if isinstance(p, click.Argument)
        for _ in range(1 if p.nargs == 1 else 2)
    ]
    with CliRunner().isolated_filesystem(temp_dir=tmp_path) as here:
        r = CliRunner().invoke(main, [*path.split()[1:], *map(str, args)])
        assert r.exit_code == 2, (path, r.output)
        assert "Missing option '" in r.output, (path, r.output)  # (-o, or another required option before it)
        assert "Traceback" not in r.output and not any(Path(here).iterdir()), path
    assert len(REQUIRED_OUTPUT) >= 10


def test_chop_without_output_writes_no_folder_named_none(small_ds, tmp_path):
    r = subprocess.run([sys.executable, "-m", "l5dask.cli", "chop", small_ds, "--frames", "100", "-q"],
                       capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert r.returncode == 2 and "Missing option '--output' / '-o'" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr and not any(tmp_path.iterdir())


def test_agg_value_has_no_v_and_info_has_q(small_ds):
    r = cli("agg", small_ds, "-v", "speed:mean")
    assert r.returncode == 2 and "No such option '-v'" in r.stderr and "a value is --value" in r.stderr
    r = cli("info", small_ds, "-q")
    assert r.returncode == 0 and "agents" in r.stdout


def test_agg_of_no_group_says_so_not_pandas_repr(small_ds, tmp_path):
    """``agg --by`` where no row is kept printed pandas' ``Empty DataFrame / Columns: [...] /
    Index: []`` (a new user's trial); it says that no row is kept and names the columns. With
    ``-o`` the file holds no row, those columns; without ``by``, one row (count 0)."""
    import pyarrow.parquet as pq

    none = ["agg", small_ds, "--by", "label", "--value", "speed:mean", "--where", "speed > 1e9"]
    r = cli(*none, "-q")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout == "no group: no row is kept (the columns: label, speed_mean)\n"
    r = cli(*none, "-o", tmp_path / "g.parquet")
    assert r.returncode == 0 and "0 groups" in r.stdout, r.stdout + r.stderr
    table = pq.read_table(tmp_path / "g.parquet")
    assert table.num_rows == 0 and table.column_names == ["label", "speed_mean"]
    r = cli("agg", small_ds, "--value", "speed:count", "--where", "speed > 1e9", "-q")
    assert r.returncode == 0 and r.stdout.split() == ["speed_count", "0"], r.stdout


def test_outputs_are_options_everywhere(small_ds, tmp_path):
    """synth, subset, split, export and demo take their output as -o/--output, as the others."""
    ds = tmp_path / "s.zarr"
    assert cli("synth", "-o", ds, "--num-scenes", "3", "-q").returncode == 0
    r = cli("subset", ds, "--output", tmp_path / "sub.zarr", "--ranges", "0:2", "-q")
    assert r.returncode == 0, r.stderr
    r = cli("split", ds, "-o", tmp_path / "parts", "--part", "a=1", "--part", "b=rest", "-q")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "parts").iterdir()) == ["a", "b"]
    r = cli("synth", ds)  # (the old positional form)
    assert r.returncode == 2 and "the output is given as -o/--output" in r.stderr


def test_perception_evaluate_quiet_still_prints_the_map(tmp_path):
    """``perception evaluate -q`` printed nothing, not even the mAP: -q silences progress only."""
    from .detection_data import generate, write_json

    gt, pred = generate(6, seed=1)
    write_json(gt, tmp_path / "gt.json")
    write_json(pred, tmp_path / "pred.json")
    r = cli("perception", "evaluate", tmp_path / "pred.json", "--gt", tmp_path / "gt.json", "-q")
    assert r.returncode == 0, r.stderr
    r2 = cli("perception", "evaluate", tmp_path / "pred.json", "--gt", tmp_path / "gt.json", "-o", tmp_path / "m.json")
    mean_map = json.loads((tmp_path / "m.json").read_text())["mean_map"]
    # (with -o, the answer then the line saying where it went)
    assert r.stdout.startswith(f"mAP {mean_map:.4f}") and r2.stdout == r.stdout + f"wrote {tmp_path / 'm.json'}\n"
    assert r.stderr == "" and np.isfinite(mean_map)


@pytest.mark.parametrize("command", [["synth"], ["perception", "synth"], ["demo"]], ids=" ".join)
def test_the_generators_count_is_num_scenes_and_the_old_spelling_still_works(command, tmp_path):
    """``--scenes`` was a count of scenes to generate in synth, demo and perception synth and a
    scene filter everywhere else: the count is -n/--num-scenes; ``--scenes N`` still works until
    the next release, with one warning line on stderr; both at once are refused."""
    out = tmp_path / "out"
    new = cli(*command, "-n", "1", "-o", out, "-q")
    assert new.returncode == 0 and new.stderr == "", new.stderr
    if command == ["synth"]:
        assert json.loads((out / "scenes" / ".zarray").read_text())["shape"] == [1]
    old = cli(
        *command, "--scenes", "1", "-o", tmp_path / "old", "-q", *(["--overwrite"] if command != ["demo"] else [])
    )
    assert old.returncode == 0, old.stderr
    assert old.stderr == (
        "l5dask: warning: --scenes 1 is -n/--num-scenes 1 since l5dask 0.1.0 (--scenes is the scene filter of the "
        "commands that read a dataset): the old spelling goes in the next release\n"
    )
    assert (
        old.stdout.replace(str(tmp_path / "old"), "X").split(" in ")[0]
        == new.stdout.replace(str(out), "X").split(" in ")[0]
    )
    both = cli(*command, "-n", "1", "--scenes", "2", "-o", tmp_path / "both", "-q")
    assert (
        both.returncode == 2
        and both.stderr == ("l5dask: error: give -n/--num-scenes only (--scenes N is its old spelling)\n")
        and not (tmp_path / "both").exists()
    )


def test_a_cached_command_and_run_say_what_the_cache_did(small_ds, tmp_path):
    """A command given --cache, and a run with a cache, say on stderr how many tasks were read from
    it (none the first time, all the second over unchanged data); -q says nothing."""
    import re

    def said(stderr: str) -> list[tuple[int, int]]:
        return [
            (int(h), int(t))
            for h, t in re.findall(r"^l5dask: cache: (\d+) of (\d+) tasks read from the cache$", stderr, re.M)
        ]

    cache = tmp_path / "cache"
    first = cli("stats", small_ds, "--cache", cache, "-o", tmp_path / "a.json")
    second = cli("stats", small_ds, "--cache", cache, "-o", tmp_path / "b.json")
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    ((h1, n1),) = said(first.stderr)
    ((h2, n2),) = said(second.stderr)
    assert (h1, h2) == (0, n2) and n1 == n2 > 0, (first.stderr, second.stderr)
    quiet = cli("stats", small_ds, "--cache", cache, "-q", "-o", tmp_path / "c.json")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    job = tmp_path / "job.toml"
    job.write_text(
        f'[cache]\nurl = "{tmp_path / "jobcache"}"\n[datasets]\nsmall = "{small_ds}"\n'
        f'[analyses.r]\nkind = "report"\noutput = "{tmp_path}/r.json"\n'
    )
    runs = [cli("run", job) for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr
    ((h1, n1),), ((h2, n2),) = (said(r.stderr) for r in runs)
    assert h1 < n1 and h2 == n2 > 0, (runs[0].stderr, runs[1].stderr)  # (the run's scenes: read once, kept)
    assert cli("run", job, "-q").stderr == ""


def test_a_run_says_how_many_damaged_cache_entries_it_found(small_ds, tmp_path):
    """Two damaged entries (a task's and a pass's) were ``damaged: 2`` in the record but one warning
    on stderr, with nothing saying there were two: the closing line counts them, as the record."""
    from l5dask.core import cache as cachelib

    cache = tmp_path / "cache"
    job = tmp_path / "job.toml"
    job.write_text(
        f'[cache]\nurl = "{cache}"\n[datasets]\nsmall = "{small_ds}"\n'
        f'[analyses.r]\nkind = "report"\noutput = "{tmp_path}/r.json"\n'
    )
    assert cli("run", job, "-q").returncode == 0
    paths = [e["path"] for e in cachelib.Cache(str(cache)).entries()]
    whole = [p for p in paths if "/pass-" in p]
    prefixes = [p for p in paths if "/prefix-" in p]  # (a pass's first tasks combined: gone too)
    tasks = sorted(p for p in paths if "/pass-" not in p and "/prefix-" not in p and p.endswith(".l5c"))
    assert whole and len(tasks) > 1
    for p in whole[1:] + prefixes:  # (one pass's entry damaged, the others gone: their tasks' entries read)
        (cache / p).unlink()
    with open(cache / whole[0], "r+b") as f:
        f.seek(40)
        f.write(b"\xff")
    data = (cache / tasks[0]).read_bytes()
    (cache / tasks[0]).write_bytes(data[: len(data) // 2])
    r = cli("run", job, "--record", tmp_path / "rec.json")
    assert r.returncode == 0, r.stderr
    damaged = json.loads((tmp_path / "rec.json").read_text())["cache"]["damaged"]
    assert damaged == 2
    warned = [line for line in r.stderr.splitlines() if "ignoring a damaged entry" in line]
    assert len(warned) == 1 and "(the first of this process; all are counted)" in warned[0], r.stderr
    assert r.stderr.splitlines()[-1].endswith("; 2 damaged entries ignored and computed again"), r.stderr


def test_warnings_of_l5dask_are_one_line(small_ds, tmp_path):
    """A warning raised in l5dask's code (an older dataset without traffic lights; numpy's in a
    user's ``where``: a division by 0) is one line on stderr, as the commands' other lines (it was
    Python's two, the second a line of l5dask's source)."""
    old = tmp_path / "old.zarr"
    shutil.copytree(small_ds, old)
    shutil.rmtree(old / "traffic_light_faces")
    r = cli("stats", old, "-q", "-o", tmp_path / "r.json")
    assert r.returncode == 0, r.stderr
    assert (
        r.stderr
        == f"l5dask: warning: {old}: no traffic_light_faces array; this is an older dataset format without traffic lights\n"
    )
    r = cli(
        "agg",
        small_ds,
        "--by",
        "label",
        "--value",
        "speed:mean",
        "--where",
        "speed / 0 > 1",
        "-q",
        "-o",
        tmp_path / "a.csv",
    )
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert lines and all(line.startswith("l5dask: warning: ") and "encountered in divide" in line for line in lines), (
        r.stderr
    )


def test_an_answer_whose_reader_closed_the_pipe_is_no_error(small_ds, tmp_path):
    """``l5dask cache info DIR | head -1``: the reader gone, the command stops without an error
    line (it was "l5dask: error: [Errno 32] Broken pipe", exit 2), non-zero as when the last flush
    meets a closed pipe; the pipe here is closed before the command writes (no race with head)."""
    import os

    cache = tmp_path / "cache"
    assert cli("stats", small_ds, "--cache", cache, "-q", "-o", tmp_path / "s.json").returncode == 0
    for args in (["cache", "info", cache], ["info", small_ds], ["agg", small_ds, "--value", "speed:mean", "-q"]):
        read, write = os.pipe()
        os.close(read)
        try:
            r = subprocess.run(
                [sys.executable, "-m", "l5dask.cli", *map(str, args)], stdout=write, stderr=subprocess.PIPE, text=True
            )
        finally:
            os.close(write)
        assert r.returncode == 1 and r.stderr == "", (args, r.returncode, r.stderr)


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["stats", "{ds}", "--scenes", "scene_index >= 0", "--scenes", "scene_index < 2"],
            "--scenes is given more than once: join the conditions with and",
        ),
        (
            ["agg", "{ds}", "--by", "label", "-b", "host", "--value", "speed:mean"],
            "--by is given more than once: give the keys comma-separated",
        ),
        (["stats", "{ds}", "-o", "{out}/a.json", "--output", "{out}/b.json"], "--output is given more than once"),
    ],
)
def test_an_option_of_one_value_given_twice_is_refused(small_ds, tmp_path, args, message):
    """A new user's finding: click keeps the last of a repeated option, so ``--scenes A --scenes B``
    filtered by B alone and ``--by label --by host`` grouped by host alone, silently."""
    r = cli(*[a.format(ds=small_ds, out=tmp_path) for a in args])
    assert r.returncode == 2 and r.stdout == "" and list(tmp_path.iterdir()) == []
    assert r.stderr.startswith(f"l5dask: error: {message}") and len(r.stderr.splitlines()) == 1, r.stderr


@pytest.mark.parametrize(
    "setting, message",
    [
        (
            "CHUNKS_PER_TASK=abc",
            "the setting l5dask.chunks-per-task (DASK_L5DASK__CHUNKS_PER_TASK) is 'abc': it takes integer",
        ),
        (
            "CHUNKS_PER_TASK=0",
            "the setting l5dask.chunks-per-task (DASK_L5DASK__CHUNKS_PER_TASK) is 0: it takes at least 1",
        ),
        ("READ_TIMEOUT=-1", "the setting l5dask.read-timeout (DASK_L5DASK__READ_TIMEOUT) is -1: it takes more than 0"),
        (
            "DIRECT_READS=maybe",
            "the setting l5dask.direct-reads (DASK_L5DASK__DIRECT_READS) is 'maybe': it takes one of",
        ),
        ("CHUNKS_PER_TAKS=4", "the setting l5dask.chunks-per-taks is not one of l5dask's (cache, chunks-per-task,"),
        (
            "DETECTION__BLOCK_BYTES=12",
            "the setting l5dask.detection.block-bytes (DASK_L5DASK__DETECTION__BLOCK_BYTES) is 12",
        ),
    ],
)
def test_a_setting_out_of_its_schema_is_one_line_before_anything_runs(small_ds, tmp_path, setting, message):
    """A new user's finding: ``DASK_L5DASK__CHUNKS_PER_TASK=abc`` was a traceback from inside the pass,
    ``0`` and ``-1`` were taken, a misspelt setting ignored. Each is checked against the settings'
    schema (l5dask-schema.yaml) first; nothing is written."""
    import os

    name, value = setting.split("=")
    env = {**os.environ, f"DASK_L5DASK__{name}": value}
    out = tmp_path / "r.json"
    r = subprocess.run(
        [sys.executable, "-m", "l5dask.cli", "stats", small_ds, "-o", str(out), "-q"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert (r.returncode, r.stdout, out.exists()) == (2, "", False)
    assert r.stderr.startswith(f"l5dask: error: {message}") and len(r.stderr.splitlines()) == 1, r.stderr


def test_a_setting_within_its_schema_is_taken(small_ds, tmp_path):
    import os

    env = {**os.environ, "DASK_L5DASK__DIRECT_READS": "Auto", "DASK_L5DASK__CHUNKS_PER_TASK": "3"}
    r = subprocess.run(
        [sys.executable, "-m", "l5dask.cli", "stats", small_ds, "-o", str(tmp_path / "r.json"), "-q"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    "where, hint",
    [
        ("speed = 1", "compare with == (x == 1), not ="),
        ("speed > 1 && label == 'PERCEPTION_LABEL_CAR'", "join conditions with and, or, not (lower case)"),
        ("speed > 1 AND speed < 2", "join conditions with and, or, not (lower case)"),
        ("speed >= (1", ""),
    ],
)
def test_a_where_in_sql_says_how_it_is_written(small_ds, where, hint):
    """A new user's finding: ``local_hour = 19``, ``&&`` and ``AND`` said "invalid syntax" alone."""
    r = cli("agg", small_ds, "--by", "label", "--value", "speed:mean", "--where", where, "-q")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert f"where {where!r} does not parse: " in r.stderr
    assert r.stderr.rstrip("\n").endswith(f"; {hint}") if hint else ";" not in r.stderr.split("parse: ")[1], r.stderr


def test_a_run_date_of_the_form_that_is_no_day_says_so(small_ds, tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(
        f'[datasets]\ns = "{small_ds}"\n[analyses.r]\nkind = "report"\noutput = "{tmp_path}/{{date}}/r.json"\n'
    )
    for date, said in (("2026-13-45", "no such day (month must be in 1..12)"), ("2026-1-4", "expected YYYY-MM-DD")):
        r = cli("run", job, "--check", "--date", date)
        assert (r.returncode, r.stderr) == (2, f"l5dask: error: --date {date!r}: {said}\n")


@pytest.mark.parametrize(
    "args",
    [
        ["stats", "-o", "{ds}/agents/.zarray"],
        ["stats", "-o", "{ds}/.zattrs"],
        ["report", "-o", "{ds}/scenes/.zarray"],
        ["agg", "--by", "label", "--value", "speed:count", "-o", "{ds}/agents/.zarray.csv"],
        ["catalog", "-o", "{ds}/c.parquet"],
        ["stats", "--scenes-table", "{ds}/frames/t.parquet"],
    ],
    ids=lambda a: a[0] + ":" + a[-1].rsplit("/", 1)[-1],
)
def test_a_result_inside_its_input_dataset_is_refused_and_nothing_is_written(small_ds, tmp_path, args):
    """``stats d.zarr -o d.zarr/.zattrs`` replaced the dataset's metadata (exit 0): refused in one
    line, the dataset left byte for byte."""
    ds = tmp_path / "d.zarr"
    shutil.copytree(small_ds, ds)
    before = {p: p.read_bytes() for p in ds.rglob("*") if p.is_file()}
    r = CliRunner().invoke(main, [args[0], str(ds), *[a.format(ds=ds) for a in args[1:]], "-q"])
    lines = [ln for ln in r.output.strip().splitlines() if ln]
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert (
        lines[0] == f"l5dask: error: {args[-1].format(ds=ds)}: the output is inside the input ({ds}); write elsewhere"
    )
    assert {p: p.read_bytes() for p in ds.rglob("*") if p.is_file()} == before


def test_an_output_over_the_file_a_scene_filter_reads_is_refused(small_ds, tmp_path):
    """A new user's trial: ``agg --catalog cat.parquet ... -o cat.parquet`` replaced the catalog it
    read (exit 0), ``stats --scenes-from pick.txt -o pick.txt`` the scene list, ``--scenes-table``
    the catalog: each refused in one line, every file left byte for byte."""
    ds = tmp_path / "d.zarr"
    shutil.copytree(small_ds, ds)
    cat, pick = tmp_path / "cat.parquet", tmp_path / "pick.txt"
    assert CliRunner().invoke(main, ["catalog", str(ds), "-o", str(cat), "-q"]).exit_code == 0
    pick.write_text("0\n1\n")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    scenes = ["--catalog", str(cat), "--scenes", "num_frames > 0"]
    for args, output in (
        (["agg", str(ds), *scenes, "--value", "speed:mean", "-o", str(cat)], cat),
        (["stats", str(ds), "--scenes-from", str(pick), "-o", str(pick)], pick),
        (["stats", str(ds), *scenes, "--scenes-table", str(cat), "-o", str(tmp_path / "s.json")], cat),
        (["report", str(ds), "--scenes-from", str(pick), "-o", str(pick)], pick),
        (["catalog", str(ds), *scenes, "-o", str(cat), "--overwrite"], cat),
        (["gt", str(ds), "--scenes-from", str(pick), "-o", str(pick)], pick),
    ):
        r = CliRunner().invoke(main, [*args, "-q"])
        lines = [ln for ln in r.output.strip().splitlines() if ln]
        assert r.exit_code == 2 and lines == [
            f"l5dask: error: {output}: the output is the input ({output}); write elsewhere"
        ], (args, r.output)
        assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_an_evaluation_or_perception_output_over_its_input_is_refused(small_ds, tmp_path):
    """``perception stats DATA -o DATA/data/scene.json`` replaced a table of the dataset, ``gt DS -o
    DS/gt.csv`` put a file among the dataset's own, ``evaluate GT PRED -o GT`` replaced the ground
    truth with its metrics: each refused in one line, every input left byte for byte."""
    from l5dask.perception.synth import generate

    data = tmp_path / "perception"
    generate(data, num_scenes=1, lidar_points=20, images=False)
    ds = tmp_path / "d.zarr"
    shutil.copytree(small_ds, ds)
    gt, pred = tmp_path / "gt.csv", tmp_path / "pred.csv"
    gt.write_text("kept\n")
    pred.write_text("kept too\n")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    for args, output, inp in (
        (["perception", "stats", str(data)], data / "data" / "scene.json", data),
        (["perception", "report", str(data)], data / "r.html", data),
        (["gt", str(ds)], ds / "gt.csv", ds),
        (["evaluate", str(gt), str(pred)], gt, gt),
        (["evaluate", str(gt), str(pred)], pred, pred),
    ):
        r = CliRunner().invoke(main, [*args, "-o", str(output), "-q"])
        lines = [ln for ln in r.output.strip().splitlines() if ln]
        how = "is" if output == inp else "is inside"
        assert r.exit_code == 2 and lines == [
            f"l5dask: error: {output}: the output {how} the input ({inp}); write elsewhere"
        ], (args, r.output)
        assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize(
    "where, message",
    [
        ("track_id % 0 == 0", "where: 'track_id % 0' divides by an integer zero; refused"),
        ("track_id // 0 == 0", "where: 'track_id // 0' divides by an integer zero; refused"),
        ("timestamp * 1000 > 0", "where: 'timestamp * 1000' overflows int64 (e.g. "),
    ],
)
def test_integer_arithmetic_that_numpy_would_wrap_is_one_line(small_ds, where, message):
    """``track_id % 0 == 0`` kept every row (numpy makes x % 0 zero), exit 0; ``timestamp * 1000``
    wrapped: each refused in one line, exit 2."""
    r = CliRunner().invoke(main, ["agg", small_ds, "--value", "track_id:count", "--where", where, "-q"])
    lines = [ln for ln in r.output.strip().splitlines() if ln]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"l5dask: error: {message}"), r.output


def test_report_with_more_outputs_says_each_it_wrote(small_ds, tmp_path):
    """``report -o page.html --json r.json --scenes-table t.parquet``: its line named the page
    alone, though it wrote the three."""
    html, js, table = tmp_path / "r.html", tmp_path / "r.json", tmp_path / "t.parquet"
    r = cli("report", small_ds, "-o", html, "--json", js, "--scenes-table", table, "-q")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"wrote {html}, {js}, {table}\n" and r.stderr == ""
    assert html.exists() and js.exists() and table.exists()
