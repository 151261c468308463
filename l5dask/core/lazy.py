"""Imports that say what they need: a package's public names imported on first use (PEP 562's
module ``__getattr__``: the command line lists every system's commands, and ``import l5dask``
costs a few milliseconds, without importing dask, xarray or pandas until a name that needs them is
used), and the compiled modules, whose absence is one line saying how to rebuild them."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from l5dask.errors import InstallError


def attach(package: str, table: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package`` whose public names are ``table``'s keys,
    each found in the module ``package.<table[name]>`` (a name mapped to itself: that module)."""

    def __getattr__(name: str) -> Any:
        if name in table:
            module = importlib.import_module(f"{package}.{table[name]}")
            return module if table[name] == name else getattr(module, name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*importlib.import_module(package).__dict__, *table})

    return __getattr__, __dir__, sorted(table)


def import_paused(name: str) -> ModuleType:
    """``importlib.import_module(name)`` with the garbage collector paused (and left as it was
    found): a large import makes tens of thousands of objects, none of them garbage, and the
    collections they set off walk them all. pandas (3.1, with pyarrow) after numpy and dask: 0.18-0.20 s
    of CPU instead of 0.25 s (70,000 objects; 200 young and 20 middle collections and a full one
    during the import), the share of the cost of ``l5dask.aggregate``'s DataFrame in a whole
    process (``benchmarks/aggregate_benchmark.py``)."""
    import gc

    if name in sys.modules:
        return sys.modules[name]
    enabled = gc.isenabled()
    gc.disable()
    try:
        return importlib.import_module(name)
    finally:
        if enabled:
            gc.enable()


def compiled(name: str) -> ModuleType:
    """The compiled module ``name`` (built from its ``.pyx`` when l5dask is installed), or an
    :class:`~l5dask.errors.InstallError` in one line: which module is missing and how to rebuild it."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise InstallError(
            f"l5dask's compiled module {name} is missing or cannot be loaded ({exc}): the install is "
            "incomplete; reinstall l5dask (pip install --force-reinstall l5dask), or rebuild it from a clone "
            "with pip install -e . (a C compiler and Python's headers are needed)"
        ) from None
