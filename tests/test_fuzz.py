"""The fuzz harness (``tests/fuzz``): every input that once broke a parser is replayed, each in a
worker subprocess (a crash is a finding), and the harness itself sees crashes, hangs and errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.fuzz.__main__ import CORPUS, Worker
from tests.fuzz.targets import TARGETS

ROOT = Path(__file__).resolve().parent.parent


def test_the_corpus_replays_without_a_finding():
    assert all((CORPUS / t).is_dir() and any((CORPUS / t).iterdir()) for t in TARGETS)
    r = subprocess.run(
        [sys.executable, "-m", "tests.fuzz", "replay"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert all(f"{t}: " in r.stdout for t in TARGETS)


def test_the_harness_sees_crashes_hangs_and_unpromised_errors():
    worker = Worker("selftest")
    try:
        assert worker.run(b"fine", 30) == ("ok", "")
        kind, details = worker.run(b"raise", 30)
        assert kind == "finding" and "RecursionError: planted" in details
        assert worker.run(b"fine", 30)[0] == "ok"  # the worker lives on after an exception
        kind, details = worker.run(b"fpe", 30)
        assert kind == "crash" and "exit -8" in details  # SIGFPE, as _blosc.h's division by a type size of 0
    finally:
        worker.close()
    worker = Worker("selftest")
    try:
        assert worker.run(b"hang", 2)[0] == "hang"
    finally:
        worker.close()


def test_a_short_run_of_every_target(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "tests.fuzz", "run", "--seconds", "6", "--seed", "7"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert all(f"{t}: " in r.stdout for t in TARGETS)
