"""A command's progress on stderr (issue 49, item 2): each stage named; in a log, one line a stage;
on a terminal, a bar a stage; and a stage ends when its last task does, not at the bar's next tick.
(What progress costs is measured by benchmarks/progress_benchmark.py, not here.)"""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import threading

import dask
import pytest

import l5dask
from l5dask.core import progress

#: every stage shown, however short (the tests' datasets are small)
ENV = {**os.environ, "DASK_L5DASK__PROGRESS_MINIMUM": "0"}
LOG_LINE = re.compile(r"l5dask: (pass|passes) [\w, -]+: \d+ tasks in \d+\.\d s")


def log_of(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "l5dask.cli", *args], capture_output=True, text=True, env=ENV)
    assert r.returncode == 0, r.stderr
    return r.stderr


def terminal_of(*args: str) -> str:
    """What the command writes on stderr when stderr is a terminal (a pseudo-terminal, read as it comes)."""
    master, slave = pty.openpty()
    got: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return
            if not chunk:
                return
            got.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    r = subprocess.run(
        [sys.executable, "-m", "l5dask.cli", *args], stdout=subprocess.DEVNULL, stderr=slave, env=ENV, timeout=300
    )
    os.close(slave)
    reader.join(10)
    os.close(master)
    text = b"".join(got).decode()
    assert r.returncode == 0, text
    return text


def test_a_log_gets_one_line_a_stage_named(small_ds, tmp_path):
    """No terminal: each stage one line, its name and figures (dask's bars ran together, unnamed)."""
    text = log_of("stats", small_ds, "-o", str(tmp_path / "r.json"))
    lines = text.splitlines()
    assert "\r" not in text and len(lines) >= 2
    assert all(LOG_LINE.fullmatch(line) for line in lines), lines
    assert any("agents" in line for line in lines) and any("frames" in line for line in lines)
    lines = log_of("agg", small_ds, "--by", "label", "--value", "speed:mean").splitlines()
    assert lines and all(LOG_LINE.fullmatch(line) for line in lines), lines


def test_quiet_shows_no_progress(small_ds):
    args = ["agg", small_ds, "--by", "label", "--value", "speed:mean", "-q"]
    r = subprocess.run([sys.executable, "-m", "l5dask.cli", *args], capture_output=True, text=True, env=ENV)
    assert r.returncode == 0 and r.stderr == "" and "speed_mean" in r.stdout


def test_a_terminal_gets_a_bar_a_stage_named(small_ds, tmp_path):
    text = terminal_of("stats", small_ds, "-o", str(tmp_path / "r.json"))
    # each stage's last drawing is left on its own line: "\r...100% n/n tasks ...\r\n"
    finals = [line.rsplit("\r", 1)[-1] for line in text.replace("\r\n", "\n").split("\n") if line]
    assert len(finals) >= 2
    for line in finals:
        m = re.fullmatch(r"l5dask: (pass|passes) ([\w, -]+) \[#+ *\] 100% (\d+)/(\d+) tasks \d+\.\d s", line)
        assert m and m[3] == m[4], finals


def test_a_stage_ends_with_its_last_task_not_at_the_next_tick(small_ds, monkeypatch):
    """dask's bar joined a timer that sleeps its tick: every compute waited up to 0.5 s at its end.
    With a tick of an hour, a stage still ends when its work does."""
    monkeypatch.setattr(progress, "TICK", 3600.0)
    monkeypatch.setattr(progress, "is_terminal", lambda out: True)  # (the bar's timer runs)
    done = threading.Event()

    def work() -> None:
        with dask.config.set({"l5dask.progress-minimum": 0}):
            l5dask.aggregate(small_ds, "agents", by=["label"], values={"speed": ["mean"]}, progress=True)
        done.set()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    assert done.wait(120), "the stage waited for its bar's next tick"


def test_a_cluster_log_gets_one_line_a_stage(small_ds, dask_cluster):
    text = log_of("agg", small_ds, "--by", "label", "--value", "speed:mean", "--scheduler", dask_cluster.address)
    lines = text.splitlines()
    assert lines and "\r" not in text
    assert all(re.fullmatch(LOG_LINE.pattern + " on the cluster", line) for line in lines), lines


@pytest.mark.parametrize(
    "labels, name", [(["agents"], "pass agents"), (["agents", "tl_faces", "agents"], "passes agents, tl_faces")]
)
def test_stage_names(labels, name):
    assert progress.passes_label(labels) == name and progress.stage_name("l5-mask-at") == "mask-at"


def test_perception_commands_log_one_named_line_a_stage(tmp_path):
    """perception stats and evaluate said 'parsing the 13 tables of ...' then 'done in 0.7 s' (a new
    user's trial): one named line a stage, as every other command; nothing under -q."""
    data = tmp_path / "lyft"
    r = subprocess.run([sys.executable, "-m", "l5dask.cli", "perception", "synth", "-o", str(data), "--num-scenes", "1",
                        "--no-images", "-q"], capture_output=True, text=True, env=ENV)  # fmt: skip
    assert r.returncode == 0, r.stderr
    args = ["perception", "stats", str(data), "-o", str(tmp_path / "p.json")]
    r = subprocess.run([sys.executable, "-m", "l5dask.cli", *args], capture_output=True, text=True, env=ENV)
    assert r.returncode == 0 and re.fullmatch(r"l5dask: tables: the 13 tables of \S+ in \d+\.\d s\n", r.stderr), (
        r.stderr
    )
    r = subprocess.run([sys.executable, "-m", "l5dask.cli", *args, "-q"], capture_output=True, text=True, env=ENV)
    assert r.returncode == 0 and r.stderr == "", r.stderr
