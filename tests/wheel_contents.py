"""The built artefacts hold what users need: ``python tests/wheel_contents.py WHEEL SDIST``.

The wheel: every module of the package (as tracked by git) and its settings' defaults and schema
(``l5dask/core/l5dask.yaml``), the compiled modules, both
licences, the console script and the xarray backend's entry point, and no sources or tests. The
sdist: everything the wheel is built from (the ``.pyx``, ``.pxd`` and headers, the vendored LZ4
and its licence, ``setup.py``, ``pyproject.toml``, ``MANIFEST.in``) and no generated C or binary.
Prints one line per problem; exit code 1 if there is any.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMPILED = (
    "l5dask/core/_pread",
    "l5dask/core/_stat",
    "l5dask/prediction/_report",
    "l5dask/prediction/_gather",
    "l5dask/prediction/_columns",
    "l5dask/prediction/_catalog",
    "l5dask/evaluation/_mask",
    "l5dask/evaluation/_csvrows",
    "l5dask/evaluation/_metrics",
    "l5dask/perception/_links",
    "l5dask/perception/_lidar",
    "l5dask/perception/_jsonscan",
    "l5dask/perception/_matching",
    "l5dask/perception/_geometry",
)
BUILD_SOURCES = ("setup.py", "pyproject.toml", "MANIFEST.in", "LICENSE", "README.md")


def tracked(pattern: str) -> set[str]:
    out = subprocess.run(["git", "ls-files", pattern], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def check_wheel(path: str) -> list[str]:
    names = set(zipfile.ZipFile(path).namelist())
    problems = [f"wheel: {m} is missing" for m in sorted((tracked("l5dask/*.py") | tracked("l5dask/*.yaml")) - names)]
    for stem in COMPILED:
        if not any(n.startswith(stem + ".") and n.endswith((".so", ".pyd")) for n in names):
            problems.append(f"wheel: the compiled module {stem} is missing")
    info = next((n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA")), None)
    if info is None:
        return problems + ["wheel: no METADATA"]
    for lic in ("LICENSE", "l5dask/prediction/_vendor/lz4/LICENSE"):
        if f"{info}/licenses/{lic}" not in names:
            problems.append(f"wheel: the licence {lic} is missing")
    entry = zipfile.ZipFile(path).read(f"{info}/entry_points.txt").decode()
    for want in ("l5dask = l5dask.cli:run", "l5kit = l5dask.prediction.backend:L5KitBackendEntrypoint"):
        if want not in entry:
            problems.append(f"wheel: entry point {want!r} is missing")
    for n in sorted(names):
        if n.startswith("tests/") or n.endswith((".c", ".pyx", ".pxd", ".h")):
            problems.append(f"wheel: {n} does not belong in it")
    return problems


def check_sdist(path: str) -> list[str]:
    with tarfile.open(path) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    wanted = tracked("l5dask") | set(BUILD_SOURCES)
    problems = [f"sdist: {m} is missing" for m in sorted(wanted - names)]
    for n in sorted(names):
        if n.endswith((".so", ".pyd")) or (n.endswith(".c") and "_vendor" not in n):
            problems.append(f"sdist: {n} is generated, it does not belong in it")
    return problems


def main(argv: list[str]) -> int:
    problems: list[str] = []
    for path in argv:
        problems += check_wheel(path) if path.endswith(".whl") else check_sdist(path)
    for p in problems:
        print(p)
    if not problems:
        print(f"complete: {', '.join(Path(p).name for p in argv)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
