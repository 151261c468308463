"""A broken install (a compiled module missing) says in one line what is missing and how to
rebuild it, from Python and from the command line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import l5dask

PACKAGE = Path(l5dask.__file__).parent


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> Path:
    """A copy of the package without its compiled modules, first on ``PYTHONPATH``."""
    root = tmp_path_factory.mktemp("broken")
    shutil.copytree(PACKAGE, root / "l5dask", ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    return root


def run(args: list[str], root: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True, text=True)


@pytest.mark.parametrize(
    "module,missing",
    [
        ("l5dask.prediction.kernels", "l5dask.prediction._report"),
        ("l5dask.evaluation.csvfiles", "l5dask.evaluation._csvrows"),
        ("l5dask.perception.geometry", "l5dask.perception._geometry"),
    ],
)
def test_an_import_names_the_missing_module_and_the_rebuild(broken, module, missing):
    r = run(["-c", f"import {module}"], broken)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("l5dask.errors.InstallError: ") and missing in last
    assert "pip install -e ." in last and "pip install --force-reinstall l5dask" in last
    assert isinstance(l5dask.errors.InstallError("x"), ImportError)


def test_a_command_says_it_in_one_line(broken, small_ds, tmp_path):
    r = run(["-m", "l5dask.cli", "stats", small_ds, "--output", str(tmp_path / "r.json")], broken)
    assert r.returncode == 2, r.stderr
    # (the first compiled module the command needs: the reads of l5dask.core's or the report's kernels)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("l5dask: error: l5dask's compiled module l5dask.")
    assert "is missing or cannot be loaded" in r.stderr and "pip install -e ." in r.stderr
    assert not (tmp_path / "r.json").exists()
    assert run(["-m", "l5dask.cli", "--help"], broken).returncode == 0  # the rest of the install works
