"""l5dask's settings, in one place: their defaults in ``l5dask.yaml`` (beside this module, with
its schema ``l5dask-schema.yaml``), loaded into dask's configuration with
``dask.config.update_defaults`` as dask loads its own ``dask.yaml``; and the one
:func:`~l5dask.core.config.reset` of
the package's process-wide caches.

A setting is read with :func:`get` (``get("read-timeout")`` is dask's ``l5dask.read-timeout``):
set it as any of dask's (a YAML file in ``~/.config/dask``, ``DASK_L5DASK__READ_TIMEOUT=10``,
``dask.config.set({"l5dask.read-timeout": 10})``); a ``null`` is the default. The defaults are
loaded on the first :func:`get` (importing dask and PyYAML then: ``l5dask --help`` imports
neither); ``defaults()`` loads them without reading one. docs/reference/configuration.md lists
every key.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

#: The defaults file and its schema (package data).
DEFAULTS_FILE = os.path.join(os.path.dirname(__file__), "l5dask.yaml")
SCHEMA_FILE = os.path.join(os.path.dirname(__file__), "l5dask-schema.yaml")

_DEFAULTS: dict[str, Any] | None = None
_LOCK = threading.Lock()


def defaults() -> dict[str, Any]:
    """``l5dask.yaml`` as loaded (``{"l5dask": {...}}``), given to dask's configuration the first
    time (``dask.config.update_defaults``: a ``dask.config.refresh()`` keeps them)."""
    global _DEFAULTS
    if _DEFAULTS is None:
        with _LOCK:
            if _DEFAULTS is None:
                import dask
                import yaml

                # (libyaml's safe loader where PyYAML has it: the same mapping, 0.1-0.5 ms of CPU
                # instead of 1.2-1.9 of every command's start)
                with open(DEFAULTS_FILE) as f:
                    loaded = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
                dask.config.update_defaults(loaded)
                _DEFAULTS = loaded
    return _DEFAULTS


def default(key: str) -> Any:
    """The default of ``l5dask.<key>`` (dots for nested keys: ``"detection.block-bytes"``)."""
    value: Any = defaults()["l5dask"]
    for part in key.split("."):
        value = value[part]
    return value


def get(key: str) -> Any:
    """The setting ``l5dask.<key>`` from dask's configuration; its default when unset or null. A key
    that ``l5dask.yaml`` does not hold is a ``KeyError``: every setting has its default there."""
    import dask

    fallback = default(key)
    value = dask.config.get(f"l5dask.{key}", None)
    return fallback if value is None else value


# --- the caches ----------------------------------------------------------------------------
_RESETS: list[Callable[[], Any]] = []


def on_reset(clear: Callable[[], Any]) -> Callable[[], Any]:
    """Register ``clear`` (a cache's ``clear`` or ``cache_clear``, or a function) with :func:`reset`;
    returns it. Each module that keeps a process-wide cache registers it where it is defined."""
    _RESETS.append(clear)
    return clear


def reset() -> None:
    """Forget what the modules imported so far keep process-wide (parsed expressions and compiled
    kernels' tables, the S3 buckets' obstore clients and regions, files refused by ``O_DIRECT``, reads
    hinted ahead, a worker's slots for waiting tasks): what a long-lived process or a test calls
    after changing the settings, the endpoints or the files those were learnt from."""
    for clear in list(_RESETS):
        clear()
