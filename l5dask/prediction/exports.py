"""Columnar exports of an L5Kit dataset: Parquet (for DuckDB, Polars, Spark, pandas...) and the
zarr v3 layout of :mod:`l5dask.prediction.columnar` (for zarr-python 3 and xarray's own zarr engine).

Both are one pass per array, a task per group of stored chunks (each decoded once), the join
columns made from the frames pass as the dataframes make them (:func:`l5dask.prediction.joins.chunk_tasks`).

**Parquet**: ``OUT/{scenes,frames,agents,traffic_light_faces}/part-NNNNNN.parquet`` (L5Kit's names). Every table has its own
row index (``agent_index``, ``frame_index``, ``scene_index``, ``tl_face_index``) and the join
columns (``scene_index``, ``frame_index``, ``timestamp`` on agents and faces; ``scene_index`` on
frames), so that SQL engines join the tables on them. One row group per stored chunk, with
statistics (engines prune row groups by ``scene_index`` or ``timestamp``); zstd. Subarray fields
are **flat columns**, named as :mod:`l5dask.prediction.columns` names them (``centroid_x``, ``extent_length``,
``ego_rotation_xy``, one ``float32`` column per label name, ``agent_index_start``/``_end``): every
engine reads, filters and keeps statistics on plain columns, while list columns have no per-element
statistics and each engine spells their elements differently. ``host`` is a dictionary-encoded
string.

The output folder appears whole: a local export is written beside it and renamed into place; on
an object store a failed export removes what it wrote.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
from dask.base import tokenize
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph
from dask.task_spec import Task, TaskRef

from l5dask.core.engine import Combine, Job, Pass, tree_reduce
from l5dask.core.outputs import arrow_array, arrow_strings, atomic_output, json_text
from l5dask.core.policy import compute, where_keywords
from l5dask.core.store import Store, nesting, output_folder, some_names
from l5dask.errors import OutputError, UsageError
from l5dask.prediction import format as fmt
from l5dask.prediction.columnar import (
    CHUNKS_PER_SHARD,
    JOINS,
    LAYOUT,
    LAYOUT_VERSION,
    FieldMeta,
    array_json,
    encode_shard,
    group_json,
)
from l5dask.prediction.columns import INDEX, Selection, Table
from l5dask.prediction.dataset import L5Dataset, open_dataset
from l5dask.prediction.joins import chunk_tasks
from l5dask.prediction.writing import put

FORMATS = ("parquet", "zarr3")


def export_columns(table: Table) -> list[str]:
    """The Parquet columns of a table: its row index, its stored fields, its join columns."""
    stored = [n for n, c in table.columns.items() if c.kind == "stored"]
    return [INDEX[table.array], *stored, *JOINS[table.array]]


def arrow_table(selection: Selection, cols: dict[str, np.ndarray]):
    """The columns of one block as an Arrow table (categoricals dictionary-encoded), no pandas."""
    import pyarrow as pa

    arrays = []
    for name in selection.names:
        col = selection.columns[name]
        if col.categorical:
            arrays.append(pa.DictionaryArray.from_arrays(arrow_array(cols[name]), arrow_strings(col.categories)))
        else:
            arrays.append(arrow_array(cols[name]))
    return pa.Table.from_arrays(arrays, names=list(selection.names))


def _write_parquet(out: Store, folder: str, selection: Selection, first: int, n: int, rows, *blocks) -> int:
    import pyarrow.parquet as pq

    _, data, cols = selection.block(first, n, rows, blocks)
    table = arrow_table(selection, cols)
    key = f"{folder}/part-{first:06d}.parquet"
    if out.local:
        os.makedirs(os.path.dirname(out.path(key)), exist_ok=True)
    with out.fs.open(out.path(key), "wb") as f:
        pq.write_table(
            table, f, row_group_size=selection.source.meta.chunk_rows, compression="zstd", write_statistics=True
        )
    return len(data)


def _write_shards(
    out: Store, metas: dict[str, FieldMeta], selection: Selection, first: int, n: int, rows, *blocks
) -> int:
    _, data, cols = selection.block(first, n, rows, blocks)
    shard = first // CHUNKS_PER_SHARD
    for name, m in metas.items():
        values = data[name] if name in fmt.names_of(data.dtype) else cols[name]
        put(out, m.shard_key(shard), encode_shard(values, m))
    return len(data)


def _add_rows(a: int, b: int) -> int:
    return int(a) + int(b)


def _no_rows() -> int:
    return 0


#: The rows written by an array's tasks, summed in the engine's one tree.
ROWS_WRITTEN = Combine("l5-export-rows", _add_rows, _no_rows)


def _named(names: list[str], *counts: int) -> dict[str, int]:
    return dict(zip(names, counts))


def _field_metas(ds: L5Dataset, name: str) -> dict[str, FieldMeta]:
    arr = ds[name]
    metas = {}
    for f in fmt.names_of(arr.dtype):
        sub = fmt.fields_of(arr.dtype)[f][0]
        metas[f] = FieldMeta(f"{name}/{f}", sub.base, sub.shape, len(arr), arr.meta.chunk_rows, CHUNKS_PER_SHARD)
    for j in JOINS[name]:
        metas[j] = FieldMeta(f"{name}/{j}", np.dtype(np.int64), (), len(arr), arr.meta.chunk_rows, CHUNKS_PER_SHARD)
    return metas


def check_output(url: Any, storage_options: dict | None = None, overwrite: bool = False) -> tuple[Store, bool]:
    """Refuse (one line) an export's output folder that is a file, holds anything an export does
    not (:func:`~l5dask.prediction.format.export_key`: a user's files at any depth, a dataset), or
    holds an export unless ``overwrite``; return its store and whether something is there."""
    final = Store(output_folder(url, "an export"), storage_options)
    if final.local and os.path.exists(final.root) and not os.path.isdir(final.root):
        raise OutputError(f"{final.url}: is a file, not a folder")
    try:
        files = final.files()
    except OSError as exc:
        raise OutputError(f"{final.url}: cannot write there: {exc}") from None
    other = [k for k in files if not fmt.export_key(k)]
    if other:  # (--overwrite replaced the whole folder or prefix: `export DS -o ~/work --overwrite`)
        if ".zgroup" in files:  # (`export small.zarr -o train.zarr --overwrite`, arguments swapped)
            raise OutputError(f"{final.url}: is a dataset, not an export; write elsewhere (only an export is replaced)")
        raise OutputError(
            f"{final.url}: it holds {some_names(other)}, which is not an export's; write to a new or empty folder "
            "(only an export is replaced)"
        )
    exists = bool(files)
    if exists and not overwrite:
        raise OutputError(f"{final.url}: already exists (pass overwrite=True / --overwrite)")
    return final, exists


def _target(url: str, ds: L5Dataset, storage_options: dict | None, overwrite: bool) -> Store:
    """The output folder, checked (an object store's that exists removed, when ``overwrite``)."""
    probe = Store(output_folder(url, "an export"), storage_options)
    how = nesting(probe, ds.store)
    if how is not None:  # (replacing a folder that holds the input deleted it)
        raise OutputError(f"{probe.url}: the output {how} the input ({ds.url}); write elsewhere")
    final, exists = check_output(url, storage_options, overwrite)
    if final.local:
        parent = os.path.dirname(os.path.abspath(final.root))
        if not os.path.isdir(parent):
            raise OutputError(f"{final.url}: the folder {parent} does not exist")
        return final
    if exists:
        final.fs.rm(final.root, recursive=True)
    return final


@contextlib.contextmanager
def _output_folder(final: Store) -> Iterator[Store]:
    """Where the tasks write: on a local disk a folder beside ``final`` that replaces it whole once
    written (:func:`~l5dask.core.outputs.atomic_output`); on an object store ``final`` itself,
    removed if the export fails (an object store renames no folder)."""
    if final.local:
        with atomic_output(final.root, folder=True) as tmp:
            yield Store(tmp)
        return
    try:
        yield final
    except BaseException:
        try:
            final.fs.rm(final.root, recursive=True)
        except OSError:
            pass
        raise


@where_keywords
def export(
    dataset: Any,
    output: Any,
    format: str = "parquet",
    *,
    storage_options: dict | None = None,
    overwrite: bool = False,
    scheduler: Any = None,
    chunks_per_task: int | None = None,
    progress: bool = False,
) -> dict[str, int]:
    """Export every array of a dataset as Parquet (``format="parquet"``) or as the zarr v3
    columnar layout (``"zarr3"``, see :mod:`l5dask.prediction.columnar`); returns the rows written by array.

    Parameters
    ----------
    dataset : path, URL or L5Dataset
    output : path or URL
        A folder (refused if it exists, unless ``overwrite``).
    scheduler : optional
        Where to run (a ``distributed.Client`` or its address, ``"threads"``...; default: the
        active client, else local threads), as :class:`l5dask.core.engine.Job`; ``client=`` is its
        old name (until the next release, with a ``FutureWarning``).
    """
    fmt_name = str(format).lower()
    if fmt_name not in FORMATS:
        raise UsageError(f"unknown export format {format!r}; the formats are {', '.join(FORMATS)}")
    ds = open_dataset(dataset, storage_options)
    final = _target(os.fspath(output), ds, storage_options, overwrite)
    with _output_folder(final) as out:
        job = Job(scheduler, chunks_per_task=chunks_per_task, progress=progress)
        graph: dict = {}
        roots: dict[str, list] = {}
        metas_of: dict[str, dict[str, FieldMeta]] = {}
        for name in ds.arrays:
            table = Table(ds, name)
            short = fmt.SHORT_NAMES[name]
            if fmt_name == "parquet":
                selection = table.select(export_columns(table))
                groups = job.groups(Pass(selection.source), guided=False)
                func = functools.partial(_write_parquet, out, name)
            else:
                selection = table.select(JOINS[name])
                n = selection.source.nchunks
                groups = [(f, min(CHUNKS_PER_SHARD, n - f)) for f in range(0, n, CHUNKS_PER_SHARD)]
                metas_of[name] = _field_metas(ds, name)
                func = functools.partial(_write_shards, out, metas_of[name])
            key = f"l5-export-{short}-{tokenize(ds.url, fmt_name, groups, str(out.url))}"
            keys = [(key, i) for i in range(len(groups))]
            graph.update(chunk_tasks(ds, selection, groups, keys, func, job))
            roots[name] = keys
        top = f"l5-export-{tokenize(sorted(graph, key=str))}"
        sums = [tree_reduce(graph, f"{top}-{fmt.SHORT_NAMES[n]}", ks, ROWS_WRITTEN) for n, ks in roots.items()]
        graph[top] = Task(top, _named, list(fmt.SHORT_NAMES[n] for n in roots), *[TaskRef(k) for k in sums])
        rows = compute(
            Delayed(top, HighLevelGraph.from_collections(top, graph, dependencies=[])),
            client=job.client,
            progress=job.progress,
            label=f"export {fmt_name}",
            **job.kw,
        )
        if fmt_name == "zarr3":
            _zarr3_metadata(out, ds, metas_of)
    return rows


def _zarr3_metadata(out: Store, ds: L5Dataset, metas_of: dict[str, dict[str, FieldMeta]]) -> None:
    """Every array's and group's ``zarr.json``, the root's last, holding them all (zarr-python's
    consolidated metadata: xarray opens the tree with one read)."""
    import json

    nodes: dict[str, dict] = {}

    def put_json(key: str, raw: bytes) -> None:
        put(out, f"{key}/zarr.json", raw)
        nodes[key] = json.loads(raw)

    for name, metas in metas_of.items():
        arr = ds[name]
        for f, m in metas.items():
            attrs: dict[str, Any] = {}
            if f == "label_probabilities":
                attrs["labels"] = list(ds.labels)
            elif f == "traffic_light_face_status":
                attrs["statuses"] = list(fmt.TL_FACE_STATUSES)
            elif f in JOINS[name]:
                attrs["description"] = f"join column: the {f} of each row (l5dask)"
            put_json(m.key, array_json(name, f, m, attrs))
        put_json(
            name,
            group_json(
                {"l5kit_dtype": fmt.descr_from_dtype(arr.dtype), "length": len(arr), "chunk_rows": arr.meta.chunk_rows}
            ),
        )
    root = json.loads(
        group_json(
            {
                "l5dask": {"layout": LAYOUT, "version": LAYOUT_VERSION, "source": ds.url},
                "format_version": fmt.FORMAT_VERSION,
                "labels": list(ds.labels),
            }
        )
    )
    root["consolidated_metadata"] = {"kind": "inline", "must_understand": False, "metadata": nodes}
    put(out, "zarr.json", json_text(root, indent=1).encode())
