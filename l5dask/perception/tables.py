"""The 13 JSON tables of a perception dataset, parsed into columnar (Arrow) tables.

Each table is one JSON array of objects. DuckDB's JSON reader parses it straight into Arrow
columns, reading only the fields l5dask uses (declared below with their types): 640 MB of
sample_annotation.json in 1.3 s on one thread, against 3.3 s for msgspec into typed structs
(plus 1.9 s to make columns of them), 5.5 s for orjson and 10 s for ``json`` (the SDK's), with
a third of the memory (``benchmarks/perception_benchmark.py``). A local file is read in place;
any other store (S3, a zip, a tar) is fetched whole with the store's retries, then parsed.
Malformed JSON is located again with ``json`` (line and column): the error path only.
"""

from __future__ import annotations

import io
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from l5dask.core.lazy import compiled
from l5dask.core.outputs import valid_rows
from l5dask.core.policy import thread_pool
from l5dask.errors import ChunkError, FormatError
from l5dask.perception.links import indices

_compiled = compiled("l5dask.perception._jsonscan")
json_types = _compiled.json_types

#: Column types of what l5dask reads of each table (DuckDB types); other fields are skipped.
VEC = "DOUBLE[]"
SCHEMA: dict[str, dict[str, str]] = {
    "attribute": {"token": "VARCHAR", "name": "VARCHAR"},
    "calibrated_sensor": {"token": "VARCHAR", "sensor_token": "VARCHAR", "translation": VEC, "rotation": VEC},
    "category": {"token": "VARCHAR", "name": "VARCHAR"},
    "ego_pose": {"token": "VARCHAR", "translation": VEC, "rotation": VEC, "timestamp": "DOUBLE"},
    "instance": {"token": "VARCHAR", "category_token": "VARCHAR"},
    "log": {"token": "VARCHAR", "vehicle": "VARCHAR", "location": "VARCHAR", "date_captured": "VARCHAR"},
    "map": {"token": "VARCHAR", "filename": "VARCHAR", "category": "VARCHAR", "log_tokens": "VARCHAR[]"},
    "sample": {
        "token": "VARCHAR",
        "timestamp": "DOUBLE",
        "scene_token": "VARCHAR",
        "prev": "VARCHAR",
        "next": "VARCHAR",
    },
    "sample_annotation": {
        "token": "VARCHAR",
        "sample_token": "VARCHAR",
        "instance_token": "VARCHAR",
        "attribute_tokens": "VARCHAR[]",
        "visibility_token": "VARCHAR",
        "translation": VEC,
        "size": VEC,
        "rotation": VEC,
        "prev": "VARCHAR",
        "next": "VARCHAR",
    },
    "sample_data": {
        "token": "VARCHAR",
        "sample_token": "VARCHAR",
        "ego_pose_token": "VARCHAR",
        "calibrated_sensor_token": "VARCHAR",
        "timestamp": "DOUBLE",
        "is_key_frame": "BOOLEAN",
        "filename": "VARCHAR",
        "fileformat": "VARCHAR",
        "prev": "VARCHAR",
        "next": "VARCHAR",
    },
    "scene": {
        "token": "VARCHAR",
        "log_token": "VARCHAR",
        "first_sample_token": "VARCHAR",
        "last_sample_token": "VARCHAR",
        "name": "VARCHAR",
        "description": "VARCHAR",
    },
    "sensor": {"token": "VARCHAR", "channel": "VARCHAR", "modality": "VARCHAR"},
    "visibility": {"token": "VARCHAR", "level": "VARCHAR"},
}
TABLES = tuple(SCHEMA)
#: Tables a test split lacks: absent, they are empty (as in the SDK).
OPTIONAL = ("instance", "sample_annotation")
#: Fixed-length number lists: their length.
VECTORS = {"translation": 3, "rotation": 4, "size": 3}


@dataclass
class RawTable:
    """One parsed table: its Arrow table (the declared columns, in file order) and where it came from."""

    name: str
    arrow: Any
    source: str = ""
    present: bool = True
    nbytes: int = 0
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return self.arrow.num_rows


def key(name: str) -> str:
    return f"data/{name}.json"


def empty(name: str) -> Any:
    import pyarrow as pa

    return pa.table({c: pa.array([], type=_arrow_type(t)) for c, t in SCHEMA[name].items()})


def _arrow_type(t: str) -> Any:
    import pyarrow as pa

    return {
        "VARCHAR": pa.string(),
        "DOUBLE": pa.float64(),
        "BOOLEAN": pa.bool_(),
        "VARCHAR[]": pa.list_(pa.string()),
        "DOUBLE[]": pa.list_(pa.float64()),
    }[t]


#: The JSON type each declared column must hold (``null`` is allowed everywhere: the table checks
#: say where a value is needed), for the compiled type scan (``_jsontypes.h``).
KINDS = {"VARCHAR": 1, "DOUBLE": 2, "BOOLEAN": 3, "VARCHAR[]": 4, "DOUBLE[]": 5}
_EXPECTED = {1: "a string", 2: "a number", 3: "true or false", 4: "a list of strings", 5: "a list of numbers"}
_FOUND = {0: "null", 1: "a string", 2: "a number", 3: "a boolean", 4: "a list", 5: "an object", 6: "not JSON"}


_LOCAL = threading.local()


def _connection(threads: int) -> Any:
    """This thread's DuckDB connection of ``threads`` threads (opening one costs about 25 ms, more
    than parsing a small table; a connection is not shared between threads)."""
    import duckdb

    cons = _LOCAL.__dict__.setdefault("cons", {})
    if threads not in cons:
        con = duckdb.connect(config={"threads": threads})
        con.execute("SET enable_progress_bar = false")
        cons[threads] = con
    return cons[threads]


def parse(data: bytes | str, name: str, where: str, columns: dict[str, str] | None = None, threads: int = 1) -> Any:
    """The declared columns of table ``name`` from JSON ``data`` (bytes, or a local file's path),
    each value of the JSON type its column declares (DuckDB would cast the others: a list where a
    string belongs became the string '["lidar"]'): one ``FormatError`` line naming the row, its
    token, the field and what was found otherwise. ``columns``: another schema than the table's
    (the detection files of :mod:`l5dask.perception.detection`); ``threads``: DuckDB's (one: the
    tables are parsed in parallel tasks)."""
    import duckdb

    columns = columns or SCHEMA[name]
    scan = None
    if threads > 1:  # the type scan (compiled, without the GIL) beside DuckDB's parse
        pool = thread_pool(1, "l5dask-type-scan")
        scan = pool.submit(check_types, data, name, where, None, columns)
        pool.shutdown(wait=False)
    con = _connection(threads)
    try:
        source = data if isinstance(data, str) else io.BytesIO(data)
        table = con.read_json(source, format="array", columns=dict(columns)).to_arrow_table()
    except (duckdb.Error, UnicodeDecodeError) as exc:  # (DuckDB hands invalid UTF-8 on to Python's decoder)
        if scan is not None:
            scan.exception()  # (waited for: the message below says what is wrong)
        raise FormatError(_json_error(data, name, where, exc, columns)) from None
    if scan is not None:
        scan.result()
    else:
        check_types(data, name, where, table, columns)
    return table


def _bytes(data: bytes | str) -> Any:
    """The table's bytes: ``data``, or the local file mapped (not read) into memory."""
    import numpy as np

    if not isinstance(data, str):
        return np.frombuffer(data, np.uint8)
    import os

    return np.memmap(data, np.uint8, mode="r") if os.path.getsize(data) else np.zeros(0, np.uint8)


def check_types(
    data: bytes | str, name: str, where: str, table: Any = None, columns: dict[str, str] | None = None
) -> None:
    """Every declared column's values of their declared JSON type (the compiled scan; JSON it
    cannot vouch for, such as keys spelled with escapes, is checked by ``json`` instead)."""
    import numpy as np

    columns = columns or SCHEMA[name]
    keys = [c.encode() for c in columns]
    raw = _bytes(data)
    status, row, key, element, found, offset = json_types(
        raw, keys, np.array([KINDS[t] for t in columns.values()], np.int64)
    )
    if status == 0:
        return
    if status == 3:
        raise FormatError(f"{where}: row {row} nests JSON too deeply for a table")
    if status == 4:
        raise FormatError(f"{where}: row {row}: the key {list(columns)[key]!r} appears twice in one object")
    if status == 2:
        why = _python_types(bytes(raw), columns, where)
        if why is None:
            return
        row, key, element, found, value = why
    else:
        value = bytes(raw[offset : offset + 40]).decode("utf-8", "replace")
    field = list(columns)[key]
    token = ""
    if table is not None and field != "token" and "token" in table.column_names and row < table.num_rows:
        tok = table.column("token")[row].as_py()
        token = f" (token {tok})" if tok else ""
    what = f"{field}[{element}]" if element >= 0 else field
    expected = (
        _EXPECTED[KINDS[columns[field]]] if element < 0 else {4: "a string", 5: "a number"}[KINDS[columns[field]]]
    )
    shown = _value_text(value)
    raise FormatError(f"{where}: row {row}{token}: {what} is {_FOUND[found]} ({shown}), expected {expected}")


def _value_text(text: str) -> str:
    """The JSON value at the start of ``text``, for a message (cut at 30 characters)."""
    try:
        text = json.dumps(json.JSONDecoder().raw_decode(text)[0])
    except (ValueError, RecursionError):  # cut short: as it stands
        text = " ".join(text.split())
    return text if len(text) <= 30 else text[:27] + "..."


def _python_types(text: bytes, columns: dict[str, str], where: str) -> tuple[int, int, int, int, str] | None:
    """``(row, key index, element, found type, value)`` of the first value of another type than
    its column's, by ``json`` (the slow path: for JSON the compiled scan does not vouch for).
    JSON that ``json`` refuses is refused (DuckDB reads an array cut after a comma, ``[{...},``,
    as if it were closed: found by fuzzing)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise FormatError(
            f"{where}: not valid JSON at line {err.lineno}, column {err.colno} (byte {err.pos}): {err.msg}"
        ) from None
    except UnicodeDecodeError as err:
        raise FormatError(f"{where}: a string is not valid UTF-8 ({err.reason})") from None
    except (ValueError, RecursionError):
        return None  # (nested deeper than json goes: the compiled scan says so, as status 3)
    if not isinstance(doc, list):
        return None

    def kind(v: Any) -> int:
        if v is None:
            return 0
        if isinstance(v, bool):
            return 3
        if isinstance(v, str):
            return 1
        if isinstance(v, (int, float)):
            return 2
        return 4 if isinstance(v, list) else 5

    fits = {1: {1}, 2: {2}, 3: {3}, 4: {4}, 5: {4}}
    for r, row in enumerate(doc):
        if not isinstance(row, dict):
            return None
        for k, (col, t) in enumerate(columns.items()):
            v = row.get(col)
            want = KINDS[t]
            if kind(v) not in fits[want] | {0}:
                return r, k, -1, kind(v), json.dumps(v)[:30]
            if want in (4, 5) and isinstance(v, list):
                for e, x in enumerate(v):
                    if kind(x) not in ({1} if want == 4 else {2}) | {0}:
                        return r, k, e, kind(x), json.dumps(x)[:30]
    return None


def _json_error(data: bytes | str, name: str, where: str, exc: Exception, columns: dict[str, str]) -> str:
    """Say where a table's JSON is wrong: line and column from ``json``, a value of another type
    than its column's, else DuckDB's message."""
    try:
        text = open(data, "rb").read() if isinstance(data, str) else data
        doc = json.loads(text)
    except RecursionError:
        return f"{where}: JSON nested too deeply for a table"
    except json.JSONDecodeError as err:
        return f"{where}: not valid JSON at line {err.lineno}, column {err.colno} (byte {err.pos}): {err.msg}"
    except (OSError, UnicodeDecodeError) as err:
        return f"{where}: cannot be read as JSON: {err}"
    if not isinstance(doc, list):
        return f"{where}: not a JSON array of objects (a table is one array; found {type(doc).__name__})"
    for i, row in enumerate(doc):
        if not isinstance(row, dict):
            return f"{where}: row {i} is not a JSON object ({type(row).__name__})"
    try:
        check_types(data, name, where, None, columns)
    except FormatError as err:
        return str(err)
    if isinstance(exc, UnicodeDecodeError):
        return f"{where}: a string is not valid UTF-8 ({exc.reason})"
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"{where}: cannot be read as a table: {msg[:300]}"


def check(table: Any, name: str, where: str) -> None:
    """Every row has a token; number lists have their length (a clear error names the row)."""
    import numpy as np
    import pyarrow.compute as pc

    tokens = table.column("token")
    if tokens.null_count:
        row = int(np.flatnonzero(~valid_rows(tokens))[0])
        raise FormatError(f"{where}: row {row} has no token (every row of a table needs one)")
    for col, n in VECTORS.items():
        if col not in table.column_names:
            continue
        values = table.column(col)

        lengths = indices(pc.list_value_length(values))
        bad = np.flatnonzero(lengths != n)
        if len(bad):
            row = int(bad[0])
            got = "none" if lengths[row] < 0 else f"{lengths[row]} values"
            raise FormatError(
                f"{where}: row {row} (token {tokens[row].as_py()}): {col} has {got}, expected {n} numbers"
            )
        flat = pc.list_flatten(values)
        if flat.null_count:
            nulls = np.flatnonzero(~valid_rows(flat))
            row = int(nulls[0] // n)
            raise FormatError(f"{where}: row {row} (token {tokens[row].as_py()}): {col} holds a null")


def read(store: Any, name: str) -> RawTable:
    """Read and check table ``name`` of a store (an absent optional table is empty)."""

    where = f"{store.url.rstrip('/')}/{key(name)}" if store.url else key(name)
    if store.local:
        import os

        path = store.path(key(name))
        if not os.path.exists(path):
            if name in OPTIONAL:
                return RawTable(name, empty(name), where, present=False)
            raise FormatError(f"{where}: the table {name}.json is missing")
        table = parse(path, name, where)
        nbytes = os.path.getsize(path)
    else:
        try:
            data = store.get(key(name), what=f"the table {name}.json")
        except ChunkError:
            if name in OPTIONAL:
                return RawTable(name, empty(name), where, present=False)
            raise FormatError(f"{where}: the table {name}.json is missing") from None
        table = parse(data, name, where)
        nbytes = len(data)
    check(table, name, where)
    return RawTable(name, table, where, nbytes=nbytes)
