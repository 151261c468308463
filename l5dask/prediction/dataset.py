"""An opened L5Kit dataset (:class:`~l5dask.prediction.dataset.L5Dataset`) and :func:`~l5dask.prediction.dataset.open_dataset`: the facade that gathers the
readers (:mod:`~l5dask.prediction.reading`), the zarr v3 export's reader
(:mod:`~l5dask.prediction.columnar`), the xarray views (:mod:`~l5dask.prediction.views`) and the
dataframes (:mod:`~l5dask.prediction.dataframe`); none of them imports it. The views and the
dataframes are imported when one is made: they bring xarray and pandas (half a second of every
command's start-up otherwise; ``tests/prediction/test_stats.py`` keeps the report's process free of them)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from contextlib import nullcontext
from functools import cached_property
from typing import Any

import numpy as np

from l5dask.core.cluster import warm_workers
from l5dask.core.diskread import memory_bytes
from l5dask.core.engine import Job
from l5dask.core.policy import local_malloc, resolve_scheduler, thread_pool, where_keywords
from l5dask.core.store import Store, open_store
from l5dask.errors import FormatError, NotADatasetError, UnknownNameError, UsageError
from l5dask.prediction import format as fmt
from l5dask.prediction.columnar import columnar_arrays, is_columnar
from l5dask.prediction.reading import L5Array, check_last_chunk, touch
from l5dask.prediction.scenes import query_indices, restriction, scene_indices


class L5Dataset:
    """An opened L5Kit dataset: metadata read once, data read lazily.

    Use :func:`~l5dask.prediction.dataset.open_dataset` to make one.
    """

    def __init__(
        self,
        store: Store,
        arrays: dict[str, L5Array],
        attrs: dict[str, Any],
        masks: dict[str, L5Array] | None = None,
        parent: L5Dataset | None = None,
        scene_indices: np.ndarray | None = None,
    ) -> None:
        self.store, self.arrays, self.attrs = store, arrays, attrs
        #: The stored dataset this one restricts to some scenes (``None``: it is stored), and the
        #: indices of those scenes there (:meth:`isel`, :meth:`query`).
        self.parent, self.scene_indices = parent, scene_indices
        if masks is not None:
            self.__dict__["masks"] = masks  # (the cached property's value)

    @property
    def url(self) -> str:
        return self.store.url

    @property
    def labels(self) -> tuple[str, ...]:
        labels = self.attrs.get("labels")  # checked when opened (format.parse_zattrs)
        return tuple(labels) if labels is not None else fmt.LABELS

    def has(self, name: str) -> bool:
        return name in self.arrays

    def __getitem__(self, name: str) -> L5Array:
        name = {v: k for k, v in fmt.SHORT_NAMES.items()}.get(name, name)
        try:
            return self.arrays[name]
        except KeyError:
            raise UnknownNameError(f"{self.url}: the dataset has no array {name!r}") from None

    @cached_property
    def masks(self) -> dict[str, L5Array]:
        """L5Kit's agent masks (``agents_mask/{threshold}``, written by ``select_agents``), by name
        (the threshold, e.g. ``"0.5"``): arrays of records of one field ``value``, ``uint32 (2,)``
        (past and future frames), one per agent. Empty when the dataset has none."""
        root = self.store.path(fmt.MASKS)
        try:  # (a local folder listed as it is: fsspec's import is a tenth of a filtered command's start)
            found = os.listdir(root) if self.store.local else self.store.fs.ls(root, detail=False)
            names = sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in found)
        except (FileNotFoundError, NotADirectoryError):
            return {}
        out = {}
        for name in (n for n in names if not n.startswith(".")):  # .zgroup, .zattrs
            raw = self.store.get_metadata(f"{fmt.MASKS}/{name}/.zarray")
            if raw is not None:
                key = f"{fmt.MASKS}/{name}"
                meta = fmt.parse_nd_zarray(key, raw, f"{self.url}: {key}/.zarray")
                out[name] = L5Array(self.store, meta, fmt.is_compressed(raw))
                check_last_chunk(self.store, meta, out[name].compressed)
        return out

    # scenes ------------------------------------------------------------------------------
    @where_keywords
    def isel(self, scene: Any = None, *, scheduler: Any = None, progress: bool = False) -> L5Dataset:
        """This dataset restricted to some scenes, as xarray's ``isel`` along ``scene``: ``scene``
        their indices in increasing order (negative ones count from the end; unsorted or repeated
        ones are refused: a restriction keeps the stored order), a slice, or a boolean per scene. The result is the dataset L5Kit's ``zarr_utils`` would write for those scenes
        (``l5dask subset``: intervals rebased, chunked as L5Kit writes), read in place: its arrays,
        views, joins, report, exports and commands see only those scenes' frames, agents, faces
        and agent masks, and the stored chunks that hold none of them are never read. Making it
        reads the scenes array and the frames at the chosen scenes' ends (one pass, run where
        ``scheduler`` says: a ``distributed.Client`` or its address, ``"threads"``...; ``client=``
        is its old name, until the next release); see :mod:`l5dask.prediction.scenes`."""
        if scene is None:
            raise UsageError("isel: say which scenes (scene=[indices] or a boolean per scene)")
        if not isinstance(scene, slice):
            given = np.asarray(scene)
            if given.dtype != bool and given.ndim == 1 and len(given) > 1 and given.dtype.kind in "iu":
                n = len(self[fmt.SCENES])
                steps = np.diff(np.where(given < 0, given + n, given))
                if (steps <= 0).any():
                    k = int(np.flatnonzero(steps <= 0)[0])
                    raise UsageError(
                        f"isel: scene {int(given[k + 1])} after {int(given[k])}: a restriction keeps the stored order "
                        "of its scenes, each once; give them in increasing order (sorted(set(...)))"
                    )
        root = self.parent or self
        job = Job(scheduler, progress=progress)
        if self.parent is not None and self.scene_indices is not None:  # (a restriction of a restriction)
            scene = self.scene_indices[scene_indices(self, scene)]
        arrays, masks, idx = restriction(root, scene, job=job)
        return L5Dataset(root.store, arrays, root.attrs, masks, root, idx)

    @where_keywords
    def query(
        self,
        scene: str | None = None,
        *,
        catalog: Any = None,
        storage_options: dict[str, Any] | None = None,
        scheduler: Any = None,
        progress: bool = False,
    ) -> L5Dataset:
        """This dataset restricted to the scenes where ``scene`` holds, as xarray's ``query``
        along ``scene``: an expression in the ``where`` language of ``l5dask agg`` over the scene
        catalog's columns (``"turn == 'left' and local_hour >= 19 and pedestrians_within_30m >= 5"``).
        ``catalog``: the catalog of this dataset, a DataFrame (``l5dask.catalog(ds)``) or the
        Parquet ``l5dask catalog`` writes (its fingerprint checked against this dataset): made
        once, reused by every query. Then as :meth:`isel`."""
        if scene is None:
            raise UsageError("query: give the expression that chooses the scenes (scene=\"turn == 'left'\")")
        if catalog is None:
            raise UsageError(
                "query: give the scene catalog of this dataset (catalog=l5dask.catalog(ds), or the Parquet "
                "l5dask catalog writes): it is made once and reused by every query"
            )
        return self.isel(query_indices(self, scene, catalog, storage_options), scheduler=scheduler, progress=progress)

    def counts(self) -> dict[str, int]:
        return {fmt.SHORT_NAMES[n]: (len(self.arrays[n]) if n in self.arrays else 0) for n in fmt.ARRAY_NAMES}

    # xarray views ------------------------------------------------------------------
    def _view(self, name: str):
        from l5dask.prediction.views import array_to_dataset  # (xarray: imported when a view is made)

        return array_to_dataset(self, name)

    @cached_property
    def scenes(self):
        return self._view(fmt.SCENES)

    @cached_property
    def frames(self):
        return self._view(fmt.FRAMES)

    @cached_property
    def agents(self):
        return self._view(fmt.AGENTS)

    @cached_property
    def tl_faces(self):
        return self._view(fmt.TL_FACES)

    def joined(self, name: str, chunks_per_task: int | None = None):
        """The xarray view of ``name`` with lazy join coordinates (``scene_index``, ``frame_index``,
        ``timestamp``, ``hour``, ``host``, ``ego_translation``, ``label``...) that know their
        values (``.l5.groupby(...)``); see :func:`l5dask.prediction.views.joined_dataset`. ``chunks_per_task``:
        stored chunks per dask chunk (default: about 100 MB, :func:`l5dask.core.policy.collection_chunks_per_task`)."""
        from l5dask.prediction.views import joined_dataset

        return joined_dataset(self, {v: k for k, v in fmt.SHORT_NAMES.items()}.get(name, name), chunks_per_task)

    def to_dask_dataframe(
        self,
        array: str = "agents",
        columns: Sequence[str] | None = None,
        joins: Sequence[str] = (),
        chunks_per_task: int | None = None,
    ):
        """One array as a dask DataFrame with named (and join) columns; see
        :func:`l5dask.prediction.dataframe.to_dask_dataframe`."""
        from l5dask.prediction.dataframe import (
            to_dask_dataframe,  # (pandas: imported when one is made)
        )

        return to_dask_dataframe(self, array, columns=columns, joins=joins, chunks_per_task=chunks_per_task)

    def to_datatree(self):
        """The whole dataset as one :class:`xarray.DataTree`, a node per array."""
        from l5dask.prediction.views import dataset_to_datatree

        return dataset_to_datatree(self)

    def __repr__(self) -> str:
        parts = ", ".join(f"{k}={v}" for k, v in self.counts().items())
        of = ""
        if self.parent is not None and self.scene_indices is not None:
            of = f" ({len(self.scene_indices):,} scenes of {len(self.parent[fmt.SCENES]):,})"
        return f"<L5Dataset {self.url!r} {parts}{of}>"


def open_dataset(url: Any, storage_options: dict[str, Any] | None = None) -> L5Dataset:
    """Open an L5Kit zarr dataset lazily.

    Parameters
    ----------
    url : str or path
        A local folder, ``file://`` URL, a ``.zip`` of the folder, ``s3://bucket/prefix``
        or any fsspec URL.
    storage_options : dict, optional
        Options of the fsspec filesystem (S3 credentials, ``client_kwargs`` with an
        ``endpoint_url``...). Without them s3fs uses the usual AWS environment.

    Returns
    -------
    L5Dataset
        Metadata is read here, once; chunks are read only when computed.
    """
    if isinstance(url, L5Dataset):
        return url
    local_malloc()  # (its chunks read and decoded in this process's threads when computed here)
    try:
        store = open_store(url, storage_options)
    except NotADatasetError:
        store = Store(os.fspath(url), storage_options)
        if is_columnar(store):  # a zarr v3 export of l5dask's (``l5dask export --format zarr3``)
            return L5Dataset(store, *columnar_arrays(store))
        raise
    # the metadata objects, then the last chunks' headers, each read at once (from S3 every read is
    # a round trip: one after the other, opening took 0.86 s at 50 ms); checked in the same order
    # (on a local disk one after the other: each read is microseconds, and the pool's threads were
    # 2 ms of CPU, a tenth of a cached rerun's)
    with thread_pool(len(fmt.ARRAY_NAMES) + 1, "l5dask-open") if not store.local else nullcontext() as pool:
        each = pool.map if pool is not None else map
        zattrs = pool.submit(store.get_metadata, ".zattrs") if pool is not None else None
        raws = each(store.get_metadata, [f"{name}/.zarray" for name in fmt.ARRAY_NAMES])
        attrs = fmt.parse_zattrs(zattrs.result() if zattrs is not None else store.get_metadata(".zattrs"), store.url)
        arrays = _arrays(store, dict(zip(fmt.ARRAY_NAMES, raws)))
        if store.local:  # (larger than memory: read around the page cache, l5dask.core.diskread)
            store.large = sum(_stored_bytes(store, a.meta) for a in arrays.values()) > memory_bytes()
        for _ in each(lambda a: check_last_chunk(store, a.meta, a.compressed), arrays.values()):
            pass
    return L5Dataset(store, arrays, attrs)


def warm_up(dataset: Any, storage_options: dict[str, Any] | None, scheduler: Any = None) -> list:
    """On a cluster (``scheduler``'s client, else the default one; none on another scheduler),
    start each worker's first read of ``dataset`` while this process opens it (``warm_workers`` of
    ``touch``): the futures, to hold until the job's tasks are submitted. Nothing for a dataset
    already open."""
    if isinstance(dataset, L5Dataset):
        return []
    client = scheduler.client if isinstance(scheduler, Job) else resolve_scheduler(scheduler)[0]
    return warm_workers(client, touch, dataset, storage_options)


def _stored_bytes(store: Store, meta: fmt.ArrayMeta) -> int:
    """About the bytes an array holds on a local disk: its chunks times its first chunk's size."""
    try:
        return meta.nchunks * os.path.getsize(store.path(meta.key(0))) if meta.nchunks else 0
    except OSError:
        return 0  # (a missing chunk is said when it is read)


def _arrays(store: Store, raws: dict[str, bytes | None]) -> dict[str, L5Array]:
    """The arrays of a dataset from their ``.zarray`` objects (``None``: missing)."""
    arrays: dict[str, L5Array] = {}
    for name, raw in raws.items():
        if raw is None:
            if name == fmt.TL_FACES:
                warnings.warn(
                    f"{store.url}: no traffic_light_faces array; this is an older dataset format "
                    "without traffic lights",
                    RuntimeWarning,
                    stacklevel=3,  # (open_dataset's caller)
                )
                continue
            raise FormatError(f"{store.url}: the dataset has no {name!r} array ({name}/.zarray is missing)")
        meta = fmt.parse_zarray(name, raw, f"{store.url}: {name}/.zarray")
        arrays[name] = L5Array(store, meta, fmt.is_compressed(raw))
    return arrays
