"""Build the documentation: ``python docs/build.py [--out docs/_build/html] [--notebooks DIR]``.

The four notebooks are rendered with their outputs: from ``--notebooks`` (executed already, as
the test suite does with its S3 endpoint and cluster), else executed here first, on a generated
dataset, a local cluster and (for the S3 notebook, when ``L5DASK_S3_URL`` is not set) the
generated dataset's folder in place of a bucket. Then ``sphinx-build -W --keep-going -n``: every
warning and every broken reference is an error.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
NOTEBOOKS = ROOT / "notebooks"


def execute_notebooks(out: Path) -> None:
    """Run each notebook top to bottom (a real kernel) into ``out``, outputs kept."""
    import nbformat
    from nbclient import NotebookClient

    import l5dask

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        if "L5DASK_S3_URL" not in os.environ:
            data = os.path.join(work, "sample.zarr")
            l5dask.synthesize(data, num_scenes=4, seed=0)
            os.environ["L5DASK_S3_URL"] = data
        for path in sorted(NOTEBOOKS.glob("*.ipynb")):
            nb = nbformat.read(path, as_version=4)
            NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": work}}).execute()
            nbformat.write(nb, out / path.name)


def build(out: Path, notebooks: Path | None = None) -> subprocess.CompletedProcess:
    """Place the executed notebooks in ``docs/notebooks`` and build the site into ``out``."""
    target = DOCS / "notebooks"
    if notebooks is None:
        notebooks = Path(tempfile.mkdtemp())
        execute_notebooks(notebooks)
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir()
    for path in sorted(Path(notebooks).glob("*.ipynb")):
        shutil.copyfile(path, target / path.name)
    cmd = [sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-n", "-q", "-b", "html", str(DOCS), str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DOCS / "_build" / "html")
    parser.add_argument("--notebooks", type=Path, help="a folder of the notebooks, executed already")
    args = parser.parse_args()
    r = build(args.out, args.notebooks)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    if r.returncode == 0:
        print(f"built {args.out / 'index.html'}")
    sys.exit(r.returncode)


if __name__ == "__main__":
    main()
