"""l5dask's settings, in one place: their defaults in ``l5dask.yaml`` (beside this module, with
its schema ``l5dask-schema.yaml``), loaded into dask's configuration with
``dask.config.update_defaults`` as dask loads its own ``dask.yaml``; and the one
:func:`~l5dask.core.config.reset` of
the package's process-wide caches.

A setting is read with :func:`get` (``get("read-timeout")`` is dask's ``l5dask.read-timeout``):
set it as any of dask's (a YAML file in ``~/.config/dask``, ``DASK_L5DASK__READ_TIMEOUT=10``,
``dask.config.set({"l5dask.read-timeout": 10})``); a ``null`` is the default. The defaults are
loaded on the first :func:`get` (importing dask and PyYAML then: ``l5dask --help`` imports
neither); ``defaults()`` loads them without reading one. docs/configuration.md lists
every key.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from l5dask.errors import UsageError

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
    if value is None:
        return fallback
    if _CHECKED.get(key, _UNSET) != value:  # (each value checked once: get is on hot paths)
        _check(key, value)
        _CHECKED[key] = value
    return value


def check_all() -> None:
    """Every ``l5dask.*`` setting of dask's configuration against the schema (:func:`_check`), and
    none that l5dask does not have: what a command does first when one is set (a typo's setting
    was ignored, a wrong value met deep inside a pass)."""
    import dask

    defaults()
    _schema()

    def walk(prefix: str, node: Any, spec: Any) -> None:
        for k, v in node.items():
            name = str(k).replace("_", "-")  # (dask's names: DASK_L5DASK__DIRECT_READS is direct_reads)
            key, sub = f"{prefix}{name}", (spec.get("properties") or {}).get(name)
            if sub is None:
                raise UsageError(
                    f"the setting l5dask.{key} is not one of l5dask's ({', '.join(sorted(spec.get('properties', {})))})"
                )
            if isinstance(v, dict) and sub.get("type") == "object":
                walk(f"{key}.", v, sub)
            elif v is not None:
                _check(key, v)

    walk("", dask.config.get("l5dask", {}) or {}, _schema())


def _schema() -> dict[str, Any]:
    global _SCHEMA
    if _SCHEMA is None:
        import yaml

        with open(SCHEMA_FILE) as f:
            _SCHEMA = yaml.safe_load(f)["properties"]["l5dask"]
    return _SCHEMA


_UNSET = object()
_CHECKED: dict[str, Any] = {}
_SCHEMA: dict[str, Any] | None = None
_TYPES: dict[str, Callable[[Any], bool]] = {
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}


def _check(key: str, value: Any) -> None:
    """A setting's value against ``l5dask-schema.yaml`` (its type, minimum, choices): a
    :class:`~l5dask.errors.UsageError` in one line, where it was set (``DASK_L5DASK__CHUNKS_PER_TASK=abc``
    was a traceback from deep inside a pass; ``0`` and ``-1`` were taken)."""
    spec: Any = _schema()
    for part in key.split("."):
        spec = (spec.get("properties") or {}).get(part)
        if spec is None:
            return
    where = f"the setting l5dask.{key} (DASK_L5DASK__{key.upper().replace('-', '_').replace('.', '__')})"
    types = spec.get("type", [])
    types = [types] if isinstance(types, str) else types
    if types and not any(_TYPES[t](value) for t in types if t in _TYPES):
        raise UsageError(f"{where} is {value!r}: it takes {' or '.join(t for t in types if t != 'null')}")
    if "enum" in spec and (value.strip().lower() if isinstance(value, str) else value) not in spec["enum"]:
        raise UsageError(f"{where} is {value!r}: it takes one of {', '.join(map(repr, spec['enum']))}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in spec and value < spec["minimum"]:
            raise UsageError(f"{where} is {value!r}: it takes at least {spec['minimum']}")
        if "exclusiveMinimum" in spec and value <= spec["exclusiveMinimum"]:
            raise UsageError(f"{where} is {value!r}: it takes more than {spec['exclusiveMinimum']}")


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
    _CHECKED.clear()
    for clear in list(_RESETS):
        clear()
