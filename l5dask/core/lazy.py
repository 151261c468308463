"""A package's public names imported on first use (PEP 562's module ``__getattr__``): the command
line lists every system's commands, and ``import l5dask`` costs a few milliseconds, without
importing dask, xarray or pandas until a name that needs them is used."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def attach(package: str, table: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package`` whose public names are ``table``'s keys,
    each found in the module ``package.<table[name]>``."""

    def __getattr__(name: str) -> Any:
        if name in table:
            return getattr(importlib.import_module(f"{package}.{table[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*importlib.import_module(package).__dict__, *table})

    return __getattr__, __dir__, sorted(table)
