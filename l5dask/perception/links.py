"""Tokens become row indices: link columns as integer indices, lists of links as CSR, chains as
positions. All vectorized or compiled (a hash table of the tokens, one walk along each chain): no
loop over rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from l5dask.core.lazy import compiled
from l5dask.core.outputs import numpy_array, valid_rows
from l5dask.errors import FormatError

_compiled = compiled("l5dask.perception._links")
StringIndex = _compiled.StringIndex
walk_chains = _compiled.walk_chains

#: Per table, the link fields: field -> (target table, required). A required link may not be "".
LINKS: dict[str, dict[str, tuple[str, bool]]] = {
    "calibrated_sensor": {"sensor_token": ("sensor", True)},
    "instance": {"category_token": ("category", True)},
    "map": {"log_tokens": ("log", True)},
    "sample": {"scene_token": ("scene", True), "prev": ("sample", False), "next": ("sample", False)},
    "sample_annotation": {
        "sample_token": ("sample", True),
        "instance_token": ("instance", True),
        "attribute_tokens": ("attribute", True),
        "visibility_token": ("visibility", False),
        "prev": ("sample_annotation", False),
        "next": ("sample_annotation", False),
    },
    "sample_data": {
        "sample_token": ("sample", True),
        "ego_pose_token": ("ego_pose", True),
        "calibrated_sensor_token": ("calibrated_sensor", True),
        "prev": ("sample_data", False),
        "next": ("sample_data", False),
    },
    "scene": {
        "log_token": ("log", True),
        "first_sample_token": ("sample", True),
        "last_sample_token": ("sample", True),
    },
}
LIST_LINKS = {"attribute_tokens", "log_tokens"}
EMPTY = -2  # a lookup's mark for a null or "" link, before it becomes -1


def indices(values: Any, missing: int = -1) -> np.ndarray:
    """An Arrow integer array as int64 numpy, nulls as ``missing``."""
    return numpy_array(values, missing).astype(np.int64)


def _flat(values: Any) -> Any:
    import pyarrow as pa

    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def _buffers(values: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A string column's Arrow buffers, in place: (int32 offsets, bytes, validity bytes, empty
    when there is no null)."""
    import pyarrow as pa

    values = _flat(values)
    if values.type != pa.string():
        values = values.cast(pa.string())
    n = len(values)
    bufs = values.buffers()
    if n == 0 or bufs[1] is None:
        return np.zeros(n + 1, np.int32), np.zeros(1, np.uint8), np.zeros(0, np.uint8)
    offsets = np.frombuffer(bufs[1], np.int32, count=n + 1, offset=values.offset * 4)
    data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None and bufs[2].size else np.zeros(1, np.uint8)
    valid = np.zeros(0, np.uint8) if values.null_count == 0 else valid_rows(values).view(np.uint8)
    return offsets, data, valid


def token_index(tokens: Any) -> Any:
    """A hash table of a table's tokens -> row (the first row holding each)."""
    import pyarrow as pa

    chunks = tokens.chunks if isinstance(tokens, pa.ChunkedArray) else [tokens]
    return StringIndex([_buffers(c)[:2] for c in chunks])


def lookup(values: Any, index: Any, empty: int = -1) -> np.ndarray:
    """Row indices in the table of ``index`` (:func:`token_index`) of string ``values``: -1 for a
    value that is not a token there, ``empty`` for a null or ``""``. Chunk by chunk, in place."""
    import pyarrow as pa

    if isinstance(values, pa.ChunkedArray) and values.num_chunks != 1:
        parts = [index.lookup(*_buffers(c), empty) for c in values.chunks]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return index.lookup(*_buffers(values), empty)


def self_index(tokens: Any, where: str, *links: Any) -> list[np.ndarray]:
    """Raise on duplicate tokens (the SDK would silently keep the last); return the lookups of the
    table's own links (``prev``, ``next``) in the same hash table."""
    index = token_index(tokens)
    if index.dup_row >= 0:
        row = int(index.dup_row)
        raise FormatError(f"{where}: duplicate token {tokens[row].as_py()!r} (rows {int(index.dup_first)} and {row})")
    return [lookup(v, index, EMPTY) for v in links]


def resolve(
    values: Any,
    tokens: Any,
    where: str,
    field: str,
    target: str,
    required: bool,
    row_tokens: Any = None,
    found: Any = None,
) -> np.ndarray:
    """Row indices in the target table of ``values`` (strings): -1 for ``""``; a required empty
    link or a token the target lacks raises, naming the table, row, field and token. ``found``:
    the lookup, when already made (:func:`self_index`)."""
    out = lookup(values, token_index(tokens), EMPTY) if found is None else found
    empty = out == EMPTY
    out[empty] = -1
    bad = np.flatnonzero((out < 0) & ~empty if not required else out < 0)
    if len(bad):
        row = int(bad[0])
        value = values[row].as_py()
        who = f" (token {row_tokens[row].as_py()})" if row_tokens is not None else ""
        if value in (None, ""):
            raise FormatError(f"{where}: row {row}{who}: {field} is empty (every row needs a {target})")
        raise FormatError(
            f"{where}: row {row}{who}: {field} {value!r} is not a token of {target}.json (a dangling link)"
        )
    return out


def resolve_list(
    values: Any, tokens: Any, where: str, field: str, target: str, row_tokens: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    """A list-of-tokens column as CSR: (offsets, target row indices)."""
    import pyarrow.compute as pc

    lengths = indices(pc.list_value_length(values), 0)
    offsets = np.zeros(len(values) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = pc.list_flatten(values)
    idx = lookup(flat, token_index(tokens))
    bad = np.flatnonzero(idx < 0)
    if len(bad):
        row = int(np.searchsorted(offsets, bad[0], side="right") - 1)
        who = f" (token {row_tokens[row].as_py()})" if row_tokens is not None else ""
        raise FormatError(
            f"{where}: row {row}{who}: {field} lists {flat[int(bad[0])].as_py()!r}, "
            f"not a token of {target}.json (a dangling link)"
        )
    return offsets, idx


def chain(
    prev: np.ndarray, nxt: np.ndarray, group: np.ndarray | None, where: str, tokens: Any, what: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """Head row and position of every row along its ``prev``/``next`` chain (one compiled walk from
    each head). A chain must be consistent (``next`` of ``a`` is ``b`` exactly
    when ``prev`` of ``b`` is ``a``), stay in one ``group`` (scene, instance) and not loop."""
    n = len(prev)
    rows = np.arange(n)
    has_next, has_prev = nxt >= 0, prev >= 0
    # consistency, both ways: a's next is b exactly when b's prev is a
    for field, link, back, has in (("next", nxt, prev, has_next), ("prev", prev, nxt, has_prev)):
        bad = rows[has][back[link[has]] != rows[has]]
        if len(bad):
            a = int(bad[0])
            other = "prev" if field == "next" else "next"
            raise FormatError(
                f"{where}: the prev/next chain breaks at row {a} (token {tokens[a].as_py()}): its "
                f"{field} is row {int(link[a])}, whose {other} is not row {a}"
            )
    if group is not None:
        cross = rows[has_next][group[nxt[has_next]] != group[rows[has_next]]]
        if len(cross):
            a = int(cross[0])
            raise FormatError(
                f"{where}: the prev/next chain breaks at row {a} (token {tokens[a].as_py()}): its next "
                f"(row {int(nxt[a])}) belongs to another {what or 'group'}"
            )

    head, position = np.empty(n, np.int64), np.zeros(n, np.int64)
    walk_chains(np.ascontiguousarray(prev, np.int64), np.ascontiguousarray(nxt, np.int64), head, position)
    looped = np.flatnonzero(head < 0)
    if len(looped):
        r = int(looped[0])
        raise FormatError(f"{where}: the prev/next chain loops (through row {r}, token {tokens[r].as_py()})")
    return head, position


def group_starts(
    group: np.ndarray, ngroups: int, head: np.ndarray, where: str, tokens: Any, what: str, group_tokens: Any = None
) -> None:
    """Each group (scene, instance) with rows holds one chain: one head."""
    heads = np.flatnonzero(head == np.arange(len(head)))
    counts = np.bincount(group[heads], minlength=ngroups)
    many = np.flatnonzero(counts > 1)
    if len(many):
        g = int(many[0])
        rows = heads[group[heads] == g][:2]
        name = f" {group_tokens[g].as_py()}" if group_tokens is not None else f" {g}"
        raise FormatError(
            f"{where}: the prev/next chain of {what}{name} breaks: rows {int(rows[0])} and "
            f"{int(rows[1])} both start it (no prev)"
        )
