"""The settings in one place: ``l5dask/core/l5dask.yaml`` holds every key's default, its schema
describes each and the defaults follow it, dask's configuration holds them once loaded (and a
setting given by environment or ``dask.config.set`` wins), the code reads no ``l5dask.*`` key but
through :func:`l5dask.core.config.get` and only keys of the file, the reference page lists each
with its default; and :func:`l5dask.core.config.reset` empties the modules' process-wide caches."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import dask
import jsonschema
import numpy as np
import yaml

import l5dask
from l5dask.core import config

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(l5dask.__file__).parent


def _keys(tree: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_keys(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


DEFAULTS = _keys(yaml.safe_load(open(config.DEFAULTS_FILE))["l5dask"])


def test_the_defaults_follow_their_schema_which_describes_every_key():
    loaded = yaml.safe_load(open(config.DEFAULTS_FILE))
    schema = yaml.safe_load(open(config.SCHEMA_FILE))
    jsonschema.validate(loaded, schema)

    def described(node: dict, prefix: str = "") -> set[str]:
        out = set()
        for k, v in node.get("properties", {}).items():
            out |= described(v, f"{prefix}{k}.") if v.get("type") == "object" else {f"{prefix}{k}"}
            assert v.get("type") == "object" or v.get("description"), k
        return out

    assert described(schema["properties"]["l5dask"]) == set(DEFAULTS)
    with __import__("pytest").raises(jsonschema.ValidationError):
        jsonschema.validate({"l5dask": {"part-bytes": 0}}, schema)
    with __import__("pytest").raises(jsonschema.ValidationError):
        jsonschema.validate({"l5dask": {"no-such-key": 1}}, schema)


def test_the_defaults_loaded_are_the_file_as_pyyamls_safe_loader_reads_it():
    """``defaults()`` reads the file with libyaml's safe loader where PyYAML has it (faster): the
    same keys, values and types (their ``repr``) as PyYAML's own pure-Python safe loader gives (a
    fresh process: the defaults are loaded once a process)."""
    code = "from l5dask.core import config; print(repr(config.defaults()))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    with open(config.DEFAULTS_FILE) as f:
        want = yaml.load(f, Loader=yaml.SafeLoader)
    assert r.stdout.strip() == repr(want)


def test_dask_holds_the_defaults_and_a_setting_given_wins():
    for key, value in DEFAULTS.items():
        assert config.get(key) == value
        assert dask.config.get(f"l5dask.{key}") == value  # (loaded by the first get)
    with dask.config.set({"l5dask.read-timeout": 7.5, "l5dask.detection.block-bytes": 4096}):
        assert config.get("read-timeout") == 7.5 and config.get("detection.block-bytes") == 4096
    with dask.config.set({"l5dask.requests-in-flight": None}):
        assert config.get("requests-in-flight") == DEFAULTS["requests-in-flight"]
    dask.config.refresh()  # (dask's files and environment read again: the defaults stay)
    assert dask.config.get("l5dask.part-bytes") == DEFAULTS["part-bytes"]
    code = "from l5dask.core import config; print(config.get('part-bytes'), config.get('secede-on-wait'))"
    env = dict(os.environ, DASK_L5DASK__PART_BYTES="1234", DASK_L5DASK__SECEDE_ON_WAIT="false")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1234", "False"]


def _reads() -> tuple[list[str], list[str]]:
    """The keys read through ``config.get`` in the package, and every inline ``dask.config.get``
    of an ``l5dask.*`` key."""
    got, inline = [], []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
                continue
            arg, f = node.args[0], node.func
            if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                continue
            owner = ast.unparse(f.value)
            if f.attr == "get" and owner in ("config", "settings") and len(node.args) == 1:  # (not a dict's get)
                got.append(arg.value)
            if f.attr == "get" and owner == "dask.config" and arg.value.startswith("l5dask."):
                inline.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {arg.value}")
    return got, inline


def test_the_code_reads_only_keys_of_the_file_and_only_through_config_get():
    got, inline = _reads()
    assert inline == []
    assert set(got) == set(DEFAULTS)  # every key is read somewhere, and none is missing its default


def test_the_reference_page_lists_every_key_with_its_default():
    page = (ROOT / "docs" / "configuration.md").read_text()
    for key, value in DEFAULTS.items():
        shown = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        assert f"| `l5dask.{key}` | `{shown}` |" in page, key


def test_reset_empties_the_process_wide_caches(tmp_path):
    from l5dask.core import diskread, objects, policy
    from l5dask.prediction import kernels, where

    kernels._plan(np.dtype([("a", "<i4")]), (), (), None)
    where._parse("a > 1")
    objects._STORES["bucket"] = object()
    diskread._REFUSED.add(12345)
    policy._WAITING = (1, 1, None)  # type: ignore[assignment]
    assert kernels._plan.cache_info().currsize and where._parsed.cache_info().currsize
    config.reset()
    assert kernels._plan.cache_info().currsize == 0 and where._parsed.cache_info().currsize == 0
    assert where._named.cache_info().currsize == 0 and objects._bucket_region.cache_info().currsize == 0
    assert not objects._STORES and not diskread._REFUSED and policy._WAITING is None
